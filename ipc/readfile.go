package ipc

import (
	"fmt"
	"net"
	"time"

	"github.com/collectived/collectived/internal/parked"
)

// EnableRearm makes the Conn read its socket through a second fd, a
// duplicate opened as an *os.File. The runtime polls it as it polls the
// *net.UnixConn, but its RawConn returns errors as they are, where net's
// wraps each one in a new *net.OpError: waking a parked read with a
// deadline (Rearm) then costs no allocation, and a daemon's data path
// allocates nothing. Writes, credentials and shutdown stay on the
// *net.UnixConn. From then on the Conn owns the socket in earnest: closing
// the *net.UnixConn alone no longer closes it; Close or CloseSocket does.
// Call it between reads, with no read deadline set (a daemon's session
// does, once the handshake is over): the frame buffer carries over, a
// deadline on the old fd would not.
func (c *Conn) EnableRearm() error {
	if c.rawErr != nil {
		return c.rawErr
	}
	f, raw, fd, err := parked.OpenReadFile(c.uc, "socket")
	if err != nil {
		return fmt.Errorf("ipc: %w", err)
	}
	c.rf, c.raw = f, raw
	c.park.Init(fd, c.Rearm)
	return nil
}

// rearmSignal is the past deadline Rearm wakes a parked read with.
var rearmSignal = time.Unix(1, 0)

// readError names a failed read through the duplicate fd as net's would
// (op, addresses, cause), and reports a read ended by Close as
// net.ErrClosed; net's own reads come named already.
func (c *Conn) readError(err error) error {
	if c.rf == nil {
		return err
	}
	if c.closed.Load() {
		err = net.ErrClosed
	}
	return &net.OpError{Op: "read", Net: "unix", Source: c.uc.LocalAddr(), Addr: c.uc.RemoteAddr(), Err: err}
}
