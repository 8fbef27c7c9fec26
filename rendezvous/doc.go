// Package rendezvous owns how the daemons of a job find each other: it
// listens, connects to the next node with retries, runs the peer
// handshake, and produces each rank's two ring links (Next: streams to rank
// r+1; Prev: streams from rank r-1). It knows nothing of collectives or
// clients; the ring package runs over the connections it returns.
//
// A Listener lives as long as the daemon. Form is called once per ring
// generation: it dials next and, at the same time, accepts prev, until both
// links have Config.Streams authenticated TCP streams or ConnectTimeout
// passes. Between formations the listener keeps refusing whoever connects.
// A world of one opens no sockets.
//
// Listen retries a port in use (EADDRINUSE) for up to BindTimeout, with
// backoff, logging each retry with who holds the port: on a node that
// starts and restarts daemons the holder is usually passing (a dial's
// source port, a killed daemon's socket). After the timeout the error
// wraps syscall.EADDRINUSE and names the address and the holder, as far
// as /proc tells (internal/sockowner). Other bind failures return at once.
//
// # Protocol flow
//
// Rank r dials rank r+1 once per stream. Each side checks everything the
// other sends: magic, version, byte order, job, world size, shape digest,
// streams per link, rank and stream index. Both then prove knowledge of the
// job token with HMAC-SHA256 over both hellos (hence both fresh nonces and
// every field); the token itself never crosses the wire and MACs are
// compared in constant time.
//
//	dialer (rank r)                              listener (rank r+1)
//	  |-- hello{rank r, stream i, nonce Nd} -------->|  check magic, version, prev IP,
//	  |                                              |  fields, nonce not seen before
//	  |<------------- status{code, reason} ----------|  refused: reason, then close
//	  |<-- hello{rank r+1, stream i, nonce Nl} ------|
//	  |<-- auth{HMAC(token, "listener" | Hd | Hl)} --|
//	  |  check fields, rank == r+1, stream i, MAC    |
//	  |-- status{code, reason} --------------------->|  (dialer refuses: then close)
//	  |-- auth{HMAC(token, "dialer" | Hd | Hl)} ---->|  check MAC, place stream i
//	  |<------------- status{OK or code, reason} ----|
//	  |========== ring traffic (TCP_NODELAY) ========|
//
// Hd and Hl are the two hello frames exactly as sent. The role label in each
// MAC means a listener's proof can never be replayed as a dialer's, so a
// listener is no signing oracle for strangers. A recorded handshake played
// back is refused as ErrReplay by its nonce; were the nonce forgotten, it
// would still fail ErrAuth, because the listener's nonce is fresh.
//
// # Frames
//
// Every frame starts with the same 8-byte header, the same in all protocol
// versions, so peers of different versions can name each other's version.
// Integers are big-endian; lengths are checked before anything is read or
// allocated, and no frame exceeds 512 bytes of payload.
//
//	header (8 bytes)
//	 0     1     2     3     4         5      6             8
//	+-----+-----+-----+-----+---------+------+-------------+
//	| 'C' | 'L' | 'V' | 'D' | version | type |  length u16 |  type: 1 hello, 2 auth, 3 status
//	+-----+-----+-----+-----+---------+------+-------------+
//
//	hello payload (101 + job length bytes)
//	 0               4               8              12      14      16
//	+---------------+---------------+---------------+-------+-------+
//	| byte order    | rank u32      | world u32     |streams|stream |
//	| 01020304 in   |               |               |  u16  |  u16  |
//	| sender's order|               |               |       |       |
//	+---------------+---------------+---------------+-------+-------+
//	16              20                              36
//	+---------------+-------------------------------+
//	| generation u32| attempt: epoch u64, seq u64   |
//	+---------------+-------------------------------+
//	36                              68                              100  101
//	+-------------------------------+-------------------------------+----+-----------+
//	| shape digest [32]             | nonce [32]                    |len | job [len] |
//	+-------------------------------+-------------------------------+----+-----------+
//
//	auth payload:   HMAC-SHA256 [32]
//	status payload: code u8 (0 OK), reason [up to 200 bytes of text]
//
// The byte order marker is 0x01020304 stored in the sender's native order:
// ring frames carry numbers in native order, so both ends must agree.
// The generation is the sender's proposal, returned to the caller, who
// decides the ring's generation; it plays no part in accepting a stream.
//
// # Formations and attempts
//
// A stream counts only if its handshake completes while a Form is running
// and that same Form greeted it; otherwise the dialer is told ErrNotForming
// or ErrStale and retries. The attempt number (epoch = process start,
// seq = per-process counter) orders one dialer's attempts: a newer attempt
// replaces the streams of an older one, an older one is refused. So a
// node that restarted (a later epoch) displaces whatever its predecessor
// had connected, and a dialer that saw its next re-form half way starts a
// new attempt. This relies on a node's clock not going back across a
// restart; if it does, the stale streams go when the listener's Form ends.
//
// Form returns when its two links are complete. It cannot know whether the
// neighbours' Forms succeeded too; a link whose far end gave up fails on
// first use, and the caller forms the next generation.
//
// # Rejections
//
// Each refused connection is reported to Config.OnReject with its remote
// address and an error wrapping one sentinel: ErrBadMagic, ErrMalformed,
// ErrVersion, ErrByteOrder, ErrJob, ErrWorldSize, ErrDigest, ErrStreams,
// ErrAuth, ErrUnexpectedRank, ErrAddrNotInPeers (an address in no peer's
// entry), ErrNotPrev (a listed peer that is not our prev), ErrReplay,
// ErrHandshakeTimeout, ErrBusy, ErrNotForming or ErrStale. The dialer gets
// the same sentinel from the status frame. Configuration mismatches end
// Form at once; not-ready answers and network errors are retried until the
// deadline, after which the error wraps ErrTimeout and names the silent
// neighbour.
//
// Refusals are logged with the remote address and reason, rate-limited
// per reason and source address (internal/logthrottle): the first few of
// a quiet spell in full, then one summary line per 10 s with the count, so
// that a flood cannot grow the log without bound. Refusals counts them
// all, by reason and source, for status.
//
// Strangers cannot keep prev out. Each handshake has a deadline
// (HandshakeTimeout). Connections from prev's address get MaxPending
// slots for their unauthenticated handshakes; when all are taken, a new
// one evicts the oldest (told ErrBusy and closed), so holding slots, even
// from prev's own host, keeps nobody out: an unauthenticated handshake
// lasts only until MaxPending newer ones have come. A handshake whose
// proof checks out frees its slot at once, so a proven stream never waits
// behind unproven ones. Other addresses get MaxPending/8 slots of their
// own, and are refused ErrBusy beyond them. Nothing is allocated from a
// length the peer sent. Links already formed are not the listener's any
// more: nothing it accepts touches them.
package rendezvous
