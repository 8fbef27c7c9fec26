// Package ring runs collectives (allreduce, broadcast, allgather,
// barrier) for one rank of a ring of daemons over links that are already
// established. It owns the algorithms, the pipeline, the reduce kernels,
// the frame format and its checks, heartbeats and the abort protocol. It
// knows nothing of where the connections come from (rendezvous/), of
// clients (ipc/) or of config files: any net.Conn works, TCP in
// production and net.Pipe in tests.
//
// # Use
//
//	r, err := ring.New(cfg, links) // starts the goroutines that own the links
//	gen, err := r.Start()          // all ranks agree on a generation
//	err = r.AllReduce(desc, buf)   // ... ops, one at a time, same order on every rank
//	r.Close()
//
// Ops are called by one goroutine at a time; a concurrent call returns
// ErrBusy. Abort, Err, Status, Generation and Close may be called from
// any goroutine. Every rank must call the same ops in the same order with equal
// descriptions (collective.Desc); the k-th op after Start is collective
// seq k. After the first failure the ring is dead: every later call
// returns that failure, wrapped with the call's own op and seq. The owner
// builds a new Ring (a new generation) over new links.
//
// Buffers hold native little-endian elements (the package assumes, and
// documents, little-endian data; on a big-endian host a portable path
// still reads them as little-endian). A buffer that is not aligned to its
// element size takes the same portable path, more slowly.
//
// # Goroutines
//
// New starts, per connection, a reader that owns its read side; per
// outgoing data stream, a writer that owns data writes; and one heartbeat
// loop. Close stops them all and waits. The calling goroutine runs the
// algorithm: it queues frames to the writers, takes received frames from
// the readers and reduces. Received payloads land in buffers allocated at
// New (rxBuffers per stream, each SegmentBytes or the small-message
// limit; at most 4 KiB at rank 0's end of a ring of two's duplex
// stream) or, in the allgather half of a large allreduce, straight in the
// caller's buffer at the segment the op expects there (inplace.go); never
// in memory sized by a peer. The writers send straight from the caller's
// buffer. An op returns only when no writer reads its buffer and no
// reader writes it any more. Steady-state ops allocate nothing
// (TestZeroAllocs).
//
// A reader of data polls its socket for Config.Spin before it parks in
// the netpoller (spin.go). A TCP link's reader reads through a duplicate
// of its fd (pollconn.go), and while it is parked it is on the process's
// set of parked readers (internal/parked), which every poller looks at:
// a reader whose data has come is woken without waiting for the
// scheduler to look at the netpoller, and without allocating.
//
// # Frames
//
// Every frame is a 68-byte header, a payload of Length bytes and, when
// Length > 0, a 4-byte trailer. All integers are little-endian.
//
//	 0               4       5       6       7       8       9      12
//	+---------------+-------+-------+-------+-------+-------+-------+
//	| magic "CRNG"  | vers 2| kind  | op    | dtype | reduce| 0 0 0 |
//	+---------------+-------+-------+-------+-------+-------+-------+
//	12              16                              24
//	+---------------+-------------------------------+
//	| root (u32)    | count (u64)                   |
//	+---------------+-------------------------------+
//	24                              32                              40
//	+-------------------------------+-------------------------------+
//	| name fingerprint (u64)        | collective seq (u64)          |
//	+-------------------------------+-------------------------------+
//	40              44              48              52              56
//	+---------------+---------------+---------------+---------------+
//	| generation    | sender rank   | step          | payload length|
//	+---------------+---------------+---------------+---------------+
//	56                              64              68
//	+-------------------------------+---------------+------------------------+
//	| aux (u64)                     | header CRC32C | payload ... (Length)   |
//	+-------------------------------+---------------+------------------------+
//	+---------------+
//	| payload CRC32C|  trailer, only when Length > 0
//	+---------------+
//
// op, dtype, reduce, count and root are the call's collective.Desc in
// its wire codes (the root a world rank, as the trainers named it: two
// world ranks of one ring rank differ on the wire); the name travels only
// inside the fingerprint
// (collective.Desc.Fingerprint, over all fields and the name). Kinds:
//
//	1 data       forward only (to next), but both ways on a ring of two's
//	             duplex stream; payload <= max(SegmentBytes, small limit),
//	             <= 4 KiB from rank 1 on the duplex stream
//	2 abort      both ways; payload = reason text <= 1024 bytes;
//	             aux = origin rank | original failure's code << 32
//	                   | (culprit rank + 1, 0: none) << 40
//	3 heartbeat  both ways; no payload
//	4 start      as data; generation = the sender's running maximum proposal;
//	             aux = its running maximum finished count (Config.Finished);
//	             count bit 0 / bit 1 = some rank it heard from (itself too)
//	             is / is not fresh (Config.Fresh); bit 2 = some rank's
//	             trainers have left (Config.Vacated)
//
// aux of an allgather data frame is the length of the block it belongs
// to.
//
// Checksums (version 2; version 1 had a 64-byte header and none): bytes
// 64-67 of the header are the CRC32C (Castagnoli, hash/crc32, which uses
// the CPU's CRC32 instruction) of bytes 0-63; the trailer is the CRC32C
// of the payload. Always on, on every kind of frame. The payload's sum
// is a trailer, as NVMe/TCP's data digest is, so that a sender sums a
// long payload right after writing it, from the cache, rather than
// before, from memory (measured: half the cost). A reader checks the
// header's checksum before it uses any field of it, sums the payload
// chunk by chunk as it arrives and compares with the trailer; a mismatch
// is ErrCorrupt, naming the link (sender and receiver ranks), with the
// sender as the culprit, and fails the ring like any bad frame (the
// abort carries the cause to every rank). Bytes that are not a header of
// this protocol at all (a bad magic or version that the checksum does
// not explain) are ErrBadFrame. No payload byte is used before its
// frame's checksum matched: the reader hands a buffer to the op only
// after the check, and the op reduces, copies, forwards or returns
// nothing of a frame it has not taken. A frame received in place
// (inplace.go) is written into the caller's buffer before the check; a
// mismatch then fails the op, which returns that error and no result. A
// rank whose op does not wait on anything the receiver sends after the
// corrupted frame (a small allreduce, whose buffers all set out at once;
// a broadcast's root; the last frames of an op) may have returned first,
// with a right result, since nothing corrupted reached it; the abort
// then fails its ring, and its next op reports the corruption. CRC32C
// detects every error of up to 3 bits in a frame (up to 256 MiB; a
// segment is at most 64 MiB), every burst of up to 32 bits, and all but
// 1 in 2^32 of the rest; it authenticates nothing (a man in the middle
// recomputes it): docs/SECURITY.md.
//
// A reader checks magic, version, kind, reserved bytes, the sender
// rank (the neighbour it must be) and the payload length against the
// bound for the kind before reading a payload; any violation is
// ErrBadFrame. The op then checks that a data frame belongs to it:
// generation (ErrGeneration), seq and description (ErrMismatch, showing
// both descriptions), step and segment length (ErrBadFrame). A reader
// also compares every data frame's description with the op under way
// (or, when it comes first, with the op that begins at its seq), so that
// an op waiting on another stream learns of a diverged peer at once: in
// a ring of two a short op waits on the duplex stream while a broadcast's
// frame from rank 1 arrives on the other link. Heartbeats announce the
// op under way the same way, for diverged calls that send no data.
//
// # Protocol flow
//
// Start: N-1 steps; in each, every rank sends a start frame with the
// largest generation and finished count it knows and takes the maximum
// with what it receives. All ranks end with the maximum proposal and
// count; seq restarts at 0.
//
// AllReduce, large (len > SmallBytes and count >= N): reduce-scatter
// then allgather, 2(N-1) steps. The count is cut into N chunks (the first
// count%N one element longer, or as AllReduceChunks' caller says) and
// every chunk into the same number of segments (at most SegmentBytes
// each, the longest chunk's count; AllReduceList cuts each chunk at its
// members' pieces too, segment j of every chunk one member's, list.go).
// In reduce-scatter step s, rank r sends chunk r-s and receives chunk
// r-s-1, folding it into its own buffer; in allgather step t it sends
// chunk r+1-t and receives chunk r-t. Within a step, segment j is queued
// for sending and then segment j is received and reduced, so sending,
// receiving (reader goroutines) and reducing overlap, and no size can
// deadlock: receivers always drain into their buffers while every rank
// alternates sends and receives. Segment g of an op goes on stream g mod
// S of the link.
//
// A ring of two: Start, Barrier and allreduces on the small path of at
// most 4 KiB send and receive on one duplex stream, stream 0 of the link rank 0 dialled
// (rank 0's next, rank 1's prev), so that each frame carries the
// acknowledgement of the last one received instead of the kernel sending
// bare ACKs (duplex.go). Every other op uses the links as above.
//
// AllReduce, small: every rank's whole buffer circulates once (N-1
// steps, one frame each), then every rank folds the N buffers itself.
//
// Broadcast: first the description check of a barrier (N-1 steps of an
// empty frame, agree in ops.go), so that no rank, the root least of all,
// returns before every rank's call was found equal; then, as step N-1,
// the root's ring rank R (root / Config.Local) sends its buffer in
// segments; rank R+k receives each segment and relays it to next, except
// rank R-1, which ends the chain.
//
// AllGather: N-1 steps; in step s rank r sends block r-s and receives
// block r-s-1, segment by segment; each frame carries the block length, so
// blocks may differ in length (zero included) and grow only as bytes
// arrive, up to MaxGatherBytes. As sends and receives of a step need not
// pair up, a rank sends while its writer has room and otherwise receives.
//
// Barrier: N-1 steps of an empty data frame each way round; after them
// every rank has heard, indirectly, from every other.
//
// # Reduction order
//
// The order is fixed, so every rank ends with bit-identical bytes and a
// given world and size gives the same bits run after run. With x_i rank
// i's buffer and (op) the reduce op:
//
//   - small path: every element is ((x_0 op x_1) op x_2) ... op x_{N-1},
//     computed by every rank alike;
//
//   - large path: an element in chunk c is ((x_c op x_{c+1}) op ...) op
//     x_{c-1} (indices mod N), computed once by rank c-1 and copied to the
//     others.
//
//   - reduce runs the allreduce's path and order (every rank computes the
//     result; the caller keeps the root's);
//
//   - reduce_scatter (ReduceScatterLocal): an element in ring rank c's
//     block is ((x_{c+1} op x_{c+2}) op ...) op x_c, computed by rank c
//     alone, the received partial always on the left.
//
// x_i is rank i's local fold: its local inputs in order, each multiplied
// by the prescale first. The rank that completes a value finishes it:
// divided by the world size for avg, then multiplied by the postscale.
// Float32 and float64 round every operation in their own type. Float16
// and bfloat16 (arith.go) compute in float32 and round to their type
// exactly where a value is written: the partial a rank sends (the small
// path's x_i; the large path's partial of every hop), and the final
// value, once, after finishing. No other rounding happens in between, and
// a value no arithmetic touched (one local input, no prescale) is passed
// on as it came.
//
// Integer sums and products wrap (two's complement). Max and min
// propagate NaN: if either operand is NaN the result is NaN. Which NaN,
// when both operands are NaNs, is the CPU's and the kernel's choice: the
// same on every rank whose CPU runs the same kernels (the vector kernels
// of kernel_amd64.go where the CPU has AVX2, the Go kernels elsewhere).
//
// Fused allreduces (fusion.go) keep each member's order: an element's
// result depends only on the rank its fold starts at, so PlanFusion puts
// a member's own chunk c in the fused buffer's chunk c, and a member
// that alone takes the small path wholly in chunk 0 (rank order, which
// is chunk 0's); AllReduceChunks runs the fused buffer with those
// chunks. Every member then gets the bits it gets alone, except a 16-bit
// float member of the small path beside large-path ones, where the two
// paths round differently: FusibleSmall tells when they still agree (a
// world of one, max and min, or a ring of two with one local buffer and
// no prescale), and Fusion.Exact applies it to a plan. AllReduceList
// (list.go) runs the same layout without the fused buffer: a plan
// (PlanList) cuts every member's piece of each chunk into segments of
// that member alone, the same number in every chunk, so that the ring's
// frames are sent from and received into the members' own buffers; the
// bits are the fused buffer's, and a plan that is not Exact is refused.
//
// # Failures
//
// A socket error, a peer closing, a bad, corrupted or diverged frame, no
// progress for OpTimeout, or a peer silent for HeartbeatTimeout
// (heartbeats flow on every idle connection, both ways, every
// HeartbeatInterval; silence while our own op is not consuming is not
// counted) fails the ring. The
// rank that finds it keeps the error (*Error: op, seq, step, generation,
// peer rank and address, origin rank, cause), sends an abort frame with
// its rank and the reason to both neighbours, and shuts its links within
// 3 x AbortWait (half-closing first, so that the abort is read before the
// connection ends). A rank receiving an abort fails with ErrAborted
// (and the original failure's sentinel, and the original origin and
// reason text) and forwards the abort to both neighbours, so the cause
// travels round the ring both ways and every rank reports the origin and
// the cause, not "connection closed". Abort frames flowing backwards
// never wait behind data, so they arrive even when the forward direction
// is stuck. The abort frame also names the culprit when the origin knows
// it (the peer it found closed, hung or sending bad frames: Error.Culprit).
//
// # Lending the link (AllReduceLent)
//
// A caller making small allreduces in a row from one goroutine can have
// the reader of the stream they receive on (stream 0 from the previous
// rank, or a ring of two's duplex stream) lend it that connection
// at a frame boundary: the op goroutine then reads its own frames, through
// the same step as the reader (heartbeats, aborts and checks included),
// with no goroutine hand-off. It keeps the link between such calls (silence
// on it is not counted against the peer then) and GiveBack, or any other
// op, returns it; lend.go says why, and what keeps the process's other P
// busy meanwhile. A borrower parks in its read for at most lentPark
// (5 ms) at a time, then looks at its op timeout, its stop check and the
// other readers' notes, so a quiet peer cannot keep it past any of them.
// A lent op keeps rank 0's other lent link in a ring of two; a lent link
// nobody is reading goes back to its reader once something waits on it
// (checked every heartbeat tick and every lentPark). A write failing on
// a lent link (the duplex stream) gives it back to its reader, which
// finds what the peer sent before it went.
package ring
