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

	"github.com/collectived/collectived/internal/parked"
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

	// A reader that parks in the netpoller (not a borrower's) is on the
	// set of parked readers, which other goroutines' polls look at
	// (internal/parked): they end its parked read with kickSignal, and it
	// polls again. Only on a pollConn, whose reads that deadline ends
	// without allocating.
	park   parked.Reader
	kicked atomic.Bool // a poller ended its parked read
	pc     *pollConn   // the link, when it is one
}

// kickSignal is the past read deadline a poller wakes a parked reader
// with.
var kickSignal = time.Unix(1, 0)

// kick ends the reader's parked read; parked.Poll calls it.
func (s *spinReader) kick() {
	s.kicked.Store(true)
	_ = s.pc.SetReadDeadline(kickSignal)
}

// newSpinReader wraps c if it is a socket and spin > 0; otherwise c itself
// is the reader. On a pollConn it reads the duplicate fd and goes on the
// set of parked readers when it parks.
func newSpinReader(c net.Conn, spin time.Duration) io.Reader {
	rc := rawConn(c)
	if rc == nil || spin <= 0 {
		return c
	}
	s := &spinReader{rc: rc, spin: int64(spin), dl: c}
	if pc, ok := c.(*pollConn); ok {
		s.rc, s.pc = pc.raw, pc
		s.park.Init(pc.fd, s.kick)
	}
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
		s.park.Awake() // from here on no kick comes
		if s.kicked.Load() {
			s.kicked.Store(false)
			_ = s.pc.SetReadDeadline(time.Time{})
			s.armed = false // a park deadline of its own went with the signal
			if errors.Is(err, os.ErrDeadlineExceeded) {
				// Woken by a poller (its data has come) or by a borrower
				// asking for the link: poll again.
				s.deadline = time.Now().UnixNano() + s.spin
				continue
			}
		}
		if !s.armed {
			if err != nil {
				return 0, s.linkError(err)
			}
			break
		}
		s.armed = false
		_ = s.dl.SetReadDeadline(time.Time{}) // the reader, given the link back, must not find it
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return 0, s.linkError(err)
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

// linkError names a failed read of a pollConn as net names its own.
func (s *spinReader) linkError(err error) error {
	if s.pc == nil {
		return err
	}
	return s.pc.readError(err)
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
			now := time.Now().UnixNano()
			if now >= s.deadline {
				if s.borrowed && !s.armed {
					s.armed = true
					_ = s.dl.SetReadDeadline(time.Now().Add(lentPark))
				}
				if s.pc != nil && !s.borrowed {
					s.park.Sleep()
				}
				return false
			}
			// Wake readers parked beside this poll whose data has come;
			// let this process's other goroutines (the op, writers) have
			// the P, and other processes the CPU, between polls.
			parked.Poll(now)
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
