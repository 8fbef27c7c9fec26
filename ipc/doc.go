// Package ipc owns the Unix-socket protocol between collectived and its
// clients (docs/PROTOCOL.md): frame headers and the codec for every message,
// file-descriptor passing with SCM_RIGHTS, peer credentials, the socket
// file, and one session per connection.
//
// # Codec
//
// Header, Hello ... CallOK and Error, with their Append/Encode methods and
// Decode functions, are side-neutral: the daemon and the Go client both use
// them. Every decoder checks every field against the document and reports a
// fault as an *Error whose Code is what goes on the wire (BAD_FRAME, fatal,
// for a malformed frame) and whose message names the frame type and field.
// A Code is itself an error, so errors.Is(err, ipc.ErrMismatch) matches any
// *Error with code MISMATCH. Lengths are bounded before anything is
// allocated; encoding and decoding CALL and CALL_OK into caller-supplied
// buffers does not allocate.
//
// # Conn
//
// Conn frames a *net.UnixConn for either side. Reads go through recvmsg(2)
// with MSG_CMSG_CLOEXEC into a reusable buffer; received fds are queued
// with the stream range of the read that brought them and handed to the
// frame types that carry an fd on that side (REGISTER on the daemon,
// ALLOC_OK and LANE_OK on a client) only if they arrived with its first
// byte. Any
// other fd, a surplus one, or a truncated control message (MSG_CTRUNC)
// closes every fd received and fails with a fatal BAD_FD, except that a
// daemon that could not receive a REGISTER's fd itself (out of fds) reads
// that frame with Frame.FDLost, and the REGISTER alone fails. Writes are
// serialized; an fd goes with the sendmsg that begins with its frame, and
// WriteFinal makes a fatal ERROR the last frame a peer ever sees.
//
// # Server and Session
//
// Listen creates the socket file (replacing a stale one, never a live
// one: for a live one it waits up to ServerConfig.BindTimeout, then names
// the process answering on it), Serve accepts connections, checks SO_PEERCRED, and runs one Session
// per connection. A session answers HELLO (with the Handler's consent),
// ALLOC, FREE, REGISTER and STATUS itself, keeping segments in a shm.Table
// under the connection's quota; it validates each CALL (description, inline
// size, segment range and alignment, calls in flight) and hands it to the
// Handler as a Request. The Handler, the daemon core, answers with
// Request.Reply or Request.Fail from any goroutine; answers are queued to
// the session's writer and never block the core. Operations the daemon
// does not implement (allgather, in versions 1 and 2) are the Handler's
// to refuse.
//
// # Lane
//
// A client of version 2 or later may ask for a lane (LANE): a sealed
// memfd the session makes and polls beside the socket, where a CALL and
// its answer meet without a system call (lane.go has the layout and the handshake that
// keeps a sleeping side from being missed). Conn.SetLane makes a read look
// at it between frames; a frame waiting there ends the read with ErrRung,
// and Lane.Take copies it out and checks it as Conn checks the socket's.
//
// The package knows nothing of rings, TCP or how collectives are computed.
package ipc
