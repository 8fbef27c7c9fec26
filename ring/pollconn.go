package ring

import (
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/collectived/collectived/internal/parked"
)

// pollConn is a TCP link whose reads go through a duplicate of its fd
// (parked.OpenReadFile): ending a parked read with a past deadline (a
// poller waking it, internal/parked; a borrower's lentPark) then
// allocates nothing. Writes, the socket options and shutdown stay on the
// *net.TCPConn. Close closes both fds: closing the *net.TCPConn alone
// would leave the socket open through the duplicate, and a read parked
// on it asleep.
type pollConn struct {
	*net.TCPConn
	rf     *os.File
	raw    syscall.RawConn // rf's
	fd     int             // rf's
	closed atomic.Bool
}

// newPollConn opens c's duplicate fd for reading.
func newPollConn(c *net.TCPConn) (*pollConn, error) {
	f, raw, fd, err := parked.OpenReadFile(c, "ring link")
	if err != nil {
		return nil, err
	}
	return &pollConn{TCPConn: c, rf: f, raw: raw, fd: fd}, nil
}

// Read reads through the duplicate, where the read deadline is.
func (c *pollConn) Read(p []byte) (int, error) {
	n, err := c.rf.Read(p)
	if err != nil && err != io.EOF {
		err = c.readError(err)
	}
	return n, err
}

// SetReadDeadline bounds reads, which go through the duplicate.
func (c *pollConn) SetReadDeadline(t time.Time) error { return c.rf.SetReadDeadline(t) }

// SetDeadline bounds reads and writes.
func (c *pollConn) SetDeadline(t time.Time) error {
	if err := c.rf.SetReadDeadline(t); err != nil {
		return err
	}
	return c.TCPConn.SetWriteDeadline(t)
}

// Close closes the duplicate, which wakes a read parked on it, and the
// socket. Later calls return an error, as net's do.
func (c *pollConn) Close() error {
	if c.closed.Swap(true) {
		return &net.OpError{Op: "close", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: net.ErrClosed}
	}
	_ = c.rf.Close()
	return c.TCPConn.Close()
}

// readError names a failed read as net's would (op, addresses, cause),
// and reports a read ended by Close as net.ErrClosed, which is how the
// ring tells a link it closed itself from a peer's doing.
func (c *pollConn) readError(err error) error {
	if c.closed.Load() {
		err = net.ErrClosed
	}
	return &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}
