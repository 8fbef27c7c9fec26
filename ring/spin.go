package ring

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// spinReader reads a TCP link, polling the socket without blocking for up
// to spin before parking in the netpoller. On machines where an idle CPU is
// slow to wake (virtual machines above all), parking costs every hop of a
// small collective a wake-up of tens of microseconds; the fastest MPI
// transports poll for the same reason. Between polls it yields the CPU to
// other processes (sched_yield), so a busy machine loses little.
type spinReader struct {
	rc   syscall.RawConn
	spin int64 // nanoseconds
	// lend, when set, is checked while a read polls at a frame boundary:
	// a borrower asking for the link ends the read with errLend (lend.go).
	lend     *atomic.Int32
	boundary bool // nothing of the next frame has been read yet
	// borrowed: the op goroutine reads, alone in its process's hot path:
	// no Gosched between polls (see lend.go).
	borrowed bool
	// A borrower parks for at most lentPark at a frame boundary, then its
	// read ends with errLend, so that it looks at what else it waits for
	// (lend.go, recvLent); quiet (a wait already that long) skips the
	// poll before parking again.
	dl       interface{ SetReadDeadline(time.Time) error }
	armed    bool // a park deadline is set on the connection
	quiet    bool
	p        []byte
	n        int
	err      error
	deadline int64
	fn       func(fd uintptr) bool
}

// newSpinReader wraps c if it is a socket and spin > 0; otherwise c itself
// is the reader.
func newSpinReader(c net.Conn, spin time.Duration) io.Reader {
	rc := rawConn(c)
	if rc == nil || spin <= 0 {
		return c
	}
	s := &spinReader{rc: rc, spin: int64(spin), dl: c}
	s.fn = s.try
	return s
}

func (s *spinReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	// The goroutine this reader just handed a frame to is queued on this
	// reader's P: let it run before polling, or it would wait for the poll
	// to end (or for another thread to be woken).
	if !s.borrowed {
		runtime.Gosched()
	}
	s.p, s.n, s.err = p, 0, nil
	s.deadline = time.Now().UnixNano() + s.spin
	if s.borrowed && s.quiet {
		s.deadline = 0
	}
	for {
		err := s.rc.Read(s.fn)
		if !s.armed {
			if err != nil {
				return 0, err
			}
			break
		}
		s.armed = false
		_ = s.dl.SetReadDeadline(time.Time{}) // the reader, given the link back, must not find it
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return 0, err
		}
		if s.boundary {
			return 0, errLend
		}
		// Inside a frame: wait on for the rest of it.
	}
	s.p = nil
	if s.err == nil && s.n == 0 {
		return 0, io.EOF
	}
	if s.n > 0 {
		s.boundary = false
	}
	return s.n, s.err
}

// try is the RawConn.Read callback: false means "park until readable".
func (s *spinReader) try(fd uintptr) bool {
	for {
		n, err := unix.Read(int(fd), s.p)
		switch err {
		case nil:
			s.n = n
			return true
		case unix.EINTR:
		case unix.EAGAIN:
			if s.boundary && s.lend != nil && s.lend.Load() == lendAsked {
				s.err = errLend
				return true
			}
			if time.Now().UnixNano() >= s.deadline {
				if s.borrowed && !s.armed {
					s.armed = true
					_ = s.dl.SetReadDeadline(time.Now().Add(lentPark))
				}
				return false
			}
			// Let this process's other goroutines (the op, writers) have the
			// P, and other processes the CPU, between polls.
			if !s.borrowed {
				runtime.Gosched()
			}
			_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
		default:
			s.err = err
			return true
		}
	}
}
