// Package ipc owns the Unix-socket protocol between collectived and its
// clients (docs/PROTOCOL.md): frame headers and the codec for every message,
// file-descriptor passing with SCM_RIGHTS, peer credentials, the socket
// file, and one session per connection.
//
// The codec (Header, Hello ... CallOK, Error, the Decode functions) is
// side-neutral: the daemon and the Go client both use it. Every decoder
// checks every field against the document and reports a fault as an *Error
// whose Code is what goes on the wire (BAD_FRAME for malformed frames) and
// whose message names the frame type and field. Lengths are bounded before
// anything is allocated, and encoding or decoding CALL and CALL_OK into
// caller-supplied buffers does not allocate.
//
// Conn frames a *net.UnixConn: buffered reads with the frame bound, fds
// paired with the frames that carry them, serialized writes.
//
// Server and Session run the daemon side: Listen creates the socket file,
// Serve accepts connections, checks SO_PEERCRED, and runs one Session per
// connection, which handles HELLO, ALLOC, FREE, REGISTER and STATUS itself
// (segments through package shm) and validates each CALL before handing it
// to the Handler as a Request. The Handler (the daemon core) matches calls
// and answers them with Request.Reply or Request.Fail.
//
// The package knows nothing of rings, TCP or how collectives are computed.
package ipc
