package parked

import (
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// OpenReadFile duplicates a socket's fd (close-on-exec) as an *os.File to
// read it through. The runtime polls the duplicate as it polls the
// socket, but the duplicate's RawConn returns errors as they are, where
// net's wraps each one in a new *net.OpError: a read woken by a past
// deadline (a Reader's wake) then allocates nothing. The duplicate shares
// the socket's open file description, so it is already non-blocking,
// which is what makes os.NewFile register it with the netpoller; it also
// keeps the socket open, so whoever closes the socket must close it too.
// fd is the duplicate's, for Reader.Init (f.Fd would make it blocking).
func OpenReadFile(c syscall.Conn, name string) (f *os.File, raw syscall.RawConn, fd int, err error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, nil, -1, err
	}
	nfd, dupErr := -1, error(nil)
	if err := rc.Control(func(fd uintptr) {
		nfd, dupErr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return nil, nil, -1, err
	}
	if dupErr != nil {
		return nil, nil, -1, fmt.Errorf("duplicate the %s's fd for reading: %w", name, dupErr)
	}
	f = os.NewFile(uintptr(nfd), name)
	raw, err = f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, nil, -1, err
	}
	return f, raw, nfd, nil
}
