package ipc

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/collectived/collectived/internal/parked"
)

// Side says which end of the protocol a Conn is: it decides which frame
// types may arrive and which one arrives with an fd.
type Side uint8

const (
	// DaemonSide receives requests; REGISTER arrives with an fd.
	DaemonSide Side = iota
	// ClientSide receives replies and ERROR; ALLOC_OK arrives with an fd.
	ClientSide
)

// maxFDsPerMsg sizes the control buffer: a well-behaved peer sends one fd
// per sendmsg; a few more let us see (and close) what a careless one sent
// before we refuse it. More than this sets MSG_CTRUNC.
const maxFDsPerMsg = 4

// minReadBuf is the read buffer a Conn starts with; it grows, up to the
// frame bound plus a header, only once a header announcing a longer frame
// has passed DecodeHeader.
const minReadBuf = HeaderSize + MaxHelloFrame

// Frame is one frame read from a Conn.
type Frame struct {
	Header
	// Payload aliases the Conn's read buffer: it is valid until the next
	// ReadFrame.
	Payload []byte
	// FD is the fd that arrived with the frame, or -1. Only ALLOC_OK and
	// LANE_OK (on a client) and REGISTER (on the daemon) have one; the
	// caller owns it.
	FD int
	// FDLost is set on a REGISTER read by the daemon whose fd was sent
	// but could not be received here (the process is out of file
	// descriptors): FD is -1, and the request fails without the sender
	// being at fault.
	FDLost bool
}

// inFD is a received fd and the stream bytes [start, end) of the recvmsg
// that delivered it. The kernel delivers an fd with the recvmsg that
// returns the first byte of the sendmsg it was attached to, so the frame
// it belongs to starts inside that range.
type inFD struct {
	fd         int
	start, end uint64
}

// span is the stream bytes [start, end) of one recvmsg.
type span struct{ start, end uint64 }

// Conn frames a Unix stream socket: one goroutine reads frames (ReadFrame),
// any number write them (WriteFrame, serialized).
type Conn struct {
	uc       *net.UnixConn
	side     Side
	fdTypes  string // the frame types that arrive with an fd, for errors
	maxFrame atomic.Uint32

	// Reader state, owned by the goroutine calling ReadFrame.
	buf     []byte
	r, w    int    // unread bytes are buf[r:w]
	off     uint64 // stream offset of buf[r]
	oob     []byte
	fds     []inFD
	lost    []span // recvmsgs whose fds the kernel could not install here
	readErr error  // sticky: after a protocol error the stream is not trusted

	// recvmsg state (recvmsg.go), kept here so that reading allocates
	// nothing. After EnableRearm, reads go through rf, a duplicate of the
	// socket's fd opened as a pollable *os.File (readfile.go).
	rf                *os.File
	raw               syscall.RawConn
	rawErr            error
	rearmMu           sync.Mutex  // orders Rearm's signal against the reader taking it
	rearm             bool        // Rearm asked the parked reader to poll again
	closed            atomic.Bool // CloseSocket has run
	recvFn            func(uintptr) bool
	pollUntil         int64         // unix nanoseconds; 0: do not poll
	yieldP            bool          // Gosched between polls (ReadFrame; not ReadFrameBy)
	parkDeadline      time.Time     // ReadFrameBy: set as the read deadline when polling ends
	deadlineSet       bool          // the read deadline must be cleared after the read
	spin              atomic.Int64  // nanoseconds to poll a quiet socket (SetSpin)
	readSpin          int64         // this read's polling budget
	onPark            func()        // SetOnPark
	lane              *Lane         // SetLane: polled beside the socket
	park              parked.Reader // Rearm, as a parked reader other polls wake
	laneParked        bool          // the lane says this reader sleeps on the socket
	socketAt          int64         // unix nanoseconds: when a lane's poller next reads the socket
	goschedAt         int64         // unix nanoseconds: when a poll last yielded its P
	hupFn             func(fd uintptr)
	hup               bool
	msg               unix.Msghdr
	iov               unix.Iovec
	rp                []byte
	rn, roobn, rflags int
	rerr              error

	wmu          sync.Mutex
	writeTimeout time.Duration
	wclosed      bool // WriteFinal has run

	closeOnce sync.Once
	closeErr  error
}

// NewConn wraps uc. The frame bound starts at MaxHelloFrame; raise it with
// SetMaxFrame once HELLO_OK has been sent or received.
func NewConn(uc *net.UnixConn, side Side) *Conn {
	c := &Conn{
		uc:   uc,
		side: side,
		oob:  make([]byte, unix.CmsgSpace(4*maxFDsPerMsg)),
		buf:  make([]byte, minReadBuf),
	}
	c.fdTypes = "REGISTER"
	if side == ClientSide {
		c.fdTypes = "ALLOC_OK and LANE_OK"
	}
	c.maxFrame.Store(MaxHelloFrame)
	c.raw, c.rawErr = uc.SyscallConn()
	c.recvFn = c.recvOnce
	c.hupFn = c.pollHup
	return c
}

// SetSpin makes reads poll a quiet socket for up to d before parking in
// the netpoller (0, the default, never polls). Polling yields the CPU to
// other processes (sched_yield); it saves a small request the thread
// wake-up that parking costs, tens of microseconds on virtual machines.
func (c *Conn) SetSpin(d time.Duration) { c.spin.Store(int64(max(d, 0))) }

// PeerClosed reports, without reading, whether the other end has closed
// the connection or shut down its writing side, or the socket failed
// (poll(2) for POLLRDHUP): for a goroutine that owns the reading but is
// busy elsewhere. It does not allocate.
func (c *Conn) PeerClosed() bool {
	if c.raw == nil {
		return true
	}
	c.hup = false
	if err := c.raw.Control(c.hupFn); err != nil {
		return true
	}
	return c.hup
}

func (c *Conn) pollHup(fd uintptr) {
	fds := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
	n, err := unix.Poll(fds[:], 0)
	c.hup = err == nil && n > 0 && fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
}

// SetOnPark has f called when a read's polling ends without data and the
// reader is about to park in the netpoller. f runs on the reading
// goroutine, inside the read, and must not block. Set it before reading.
func (c *Conn) SetOnPark(f func()) { c.onPark = f }

// SetLane makes reads look at l between polls of the socket, at frame
// boundaries: a frame waiting there ends the read with ErrRung. A read
// about to sleep on the socket marks the lane parked first, so that the
// other side rings (a WAKE frame). Set it from the reading goroutine.
func (c *Conn) SetLane(l *Lane) { c.lane = l }

// SetMaxFrame sets the largest payload accepted from now on.
func (c *Conn) SetMaxFrame(n uint32) { c.maxFrame.Store(n) }

// MaxFrame is the current payload bound.
func (c *Conn) MaxFrame() uint32 { return c.maxFrame.Load() }

// SetWriteTimeout bounds each WriteFrame; 0 means no bound.
func (c *Conn) SetWriteTimeout(d time.Duration) {
	c.wmu.Lock()
	c.writeTimeout = d
	if d <= 0 {
		// Writes stop setting deadlines: clear the one the last write left,
		// or every write after it would fail once it passed.
		_ = c.uc.SetWriteDeadline(time.Time{})
	}
	c.wmu.Unlock()
}

// SetReadDeadline bounds ReadFrame calls, as net.Conn's does.
func (c *Conn) SetReadDeadline(t time.Time) error {
	if c.rf != nil {
		return c.rf.SetReadDeadline(t)
	}
	return c.uc.SetReadDeadline(t)
}

// Rearm makes a reader that stopped polling (its spin ran out and it is
// parked in the netpoller) poll again for up to its spin, as when a frame
// has just been read. A daemon calls it as it answers a long call: the
// client's next request is likely to follow at once, and a parked reader
// would cost that request a thread wake-up, which on a busy machine waits
// for the netpoller to be looked at (docs/TUNING.md, section 11). It
// signals with a read deadline in the past, which the reader takes as the
// signal and not as an error; use it only on connections whose reads have
// no deadline of their own. It needs EnableRearm, and does nothing on a
// Conn that does not poll. It allocates nothing.
func (c *Conn) Rearm() {
	if c.spin.Load() == 0 || c.rf == nil {
		return
	}
	c.rearmMu.Lock()
	c.rearm = true
	_ = c.rf.SetReadDeadline(rearmSignal)
	c.rearmMu.Unlock()
}

// takeRearm reports whether a read that failed with err was woken by
// Rearm, and if so clears the signal. Taking the flag and clearing the
// deadline under the lock Rearm holds means a Rearm is never half taken:
// a later one always leaves both its flag and its deadline behind.
func (c *Conn) takeRearm(err error) bool {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return false
	}
	c.rearmMu.Lock()
	defer c.rearmMu.Unlock()
	if !c.rearm {
		return false
	}
	c.rearm = false
	_ = c.rf.SetReadDeadline(time.Time{})
	return true
}

// UnixConn is the wrapped socket.
func (c *Conn) UnixConn() *net.UnixConn { return c.uc }

// ReadFrame reads the next frame. Protocol faults are fatal *Errors
// (BAD_FRAME, BAD_FD) after which every fd received and not yet handed out
// has been closed and ReadFrame keeps failing; transport errors (io.EOF,
// deadlines) are returned as they are, wrapped.
func (c *Conn) ReadFrame() (Frame, error) {
	spin := c.spin.Load()
	c.yieldP = true
	return c.read(spin)
}

// ReadFrameBy reads the next frame for a caller that waits for it itself:
// it polls the socket for up to spin without arming a timer or yielding
// its P (a caller polling for its own reply has nothing to yield to, and
// every Gosched with an idle P wakes another thread), then parks until
// deadline. A deadline that passes returns an error matching
// os.ErrDeadlineExceeded and leaves the stream intact: a frame half read
// is completed by the next read.
func (c *Conn) ReadFrameBy(spin time.Duration, deadline time.Time) (Frame, error) {
	c.yieldP = false
	c.parkDeadline = deadline
	f, err := c.read(int64(max(spin, 0)))
	c.parkDeadline = time.Time{}
	if c.deadlineSet {
		c.deadlineSet = false
		_ = c.SetReadDeadline(time.Time{})
	}
	return f, err
}

func (c *Conn) read(spin int64) (Frame, error) {
	if c.readErr != nil {
		return Frame{}, c.readErr
	}
	c.readSpin = spin
	f, err := c.readFrame()
	if err == ErrRung {
		// Nothing was read: the frame on the lane comes first. (Compared,
		// not matched: a lane's every call ends a read this way, and
		// errors.As would allocate.)
		return f, err
	}
	if err != nil {
		var e *Error
		switch {
		case errors.As(err, &e):
			c.closeFDs()
			c.readErr = err
		case !c.parkDeadline.IsZero() && errors.Is(err, os.ErrDeadlineExceeded):
			// The stream is intact: fds of a frame half read stay queued.
		default:
			c.closeFDs()
		}
	}
	return f, err
}

func (c *Conn) readFrame() (Frame, error) {
	for c.w-c.r < HeaderSize {
		if err := c.fill(HeaderSize); err != nil {
			return Frame{}, err
		}
	}
	limit := c.maxFrame.Load()
	if c.side == ClientSide && Type(c.buf[c.r+4]) == TypeStatusOK {
		// The one frame allowed past max_frame (MaxStatusFrame).
		limit = max(limit, MaxStatusFrame)
	}
	h, err := DecodeHeader(c.buf[c.r:c.w], limit)
	if err != nil {
		return Frame{}, err
	}
	if c.side == DaemonSide && !h.Type.IsRequest() {
		return Frame{}, Fatalf(CodeBadFrame, "%s (id %d) is a daemon frame, not a request", h.Type, h.ID)
	}
	if c.side == ClientSide && h.Type.IsRequest() {
		return Frame{}, Fatalf(CodeBadFrame, "%s (id %d) is a request, not a daemon frame", h.Type, h.ID)
	}
	f := Frame{Header: h, FD: -1}
	claimed, has := inFD{}, false
	if h.Type.CarriesFD() {
		// The fd came with the frame's first byte, which we hold.
		if len(c.fds) == 0 || c.fds[0].start > c.off || c.fds[0].end <= c.off {
			if !c.fdLost() {
				return Frame{}, &frameFault{h.ID, Fatalf(CodeBadFD, "%s (id %d) arrived without an fd", h.Type, h.ID)}
			}
			if c.side == ClientSide {
				// The segment it names is the daemon's, and is left
				// behind: the connection cannot go on in step.
				return Frame{}, &frameFault{h.ID, Fatalf(CodeBadFD, "%s (id %d): its fd could not be received: this process is out of file descriptors (MSG_CTRUNC)", h.Type, h.ID)}
			}
			f.FDLost = true
		} else {
			claimed, has = c.fds[0], true
			f.FD = claimed.fd
			c.fds = c.fds[1:]
		}
	}
	total := HeaderSize + int(h.Length)
	for c.w-c.r < total {
		if err := c.fill(total); err != nil {
			if f.FD >= 0 {
				unix.Close(f.FD)
			}
			return Frame{}, err
		}
	}
	f.Payload = c.buf[c.r+HeaderSize : c.r+total : c.r+total]
	c.r += total
	c.off += uint64(total)
	if err := c.checkStray(h, claimed, has); err != nil {
		if f.FD >= 0 {
			unix.Close(f.FD)
		}
		return Frame{}, err
	}
	return f, nil
}

// checkStray fails the frame h, just read, if fds came with it that it
// does not carry: fds of the recvmsg that gave it its own (one sendmsg
// sent them all, and a frame carries at most one), or fds whose recvmsg
// returned only bytes of the frames read so far, which no later frame can
// claim. Checking before the frame is handed out means a frame with a
// stray fd fails itself, and nothing of it is done.
func (c *Conn) checkStray(h Header, claimed inFD, has bool) error {
	n := 0
	for _, fd := range c.fds {
		if fd.end <= c.off || (has && fd.start == claimed.start && fd.end == claimed.end) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	if h.Type.CarriesFD() {
		return &frameFault{h.ID, Fatalf(CodeBadFD, "%s (id %d) arrived with %d fds; it carries exactly one", h.Type, h.ID, n+1)}
	}
	return &frameFault{h.ID, Fatalf(CodeBadFD, "%s (id %d) arrived with %d fd(s) and carries none: only %s carry one, attached to the sendmsg that begins with the frame's first byte", h.Type, h.ID, n, c.fdTypes)}
}

// fill reads once from the socket, making room for need bytes from c.r.
func (c *Conn) fill(need int) error {
	if len(c.buf)-c.r < need || c.r == c.w {
		if len(c.buf) < need {
			nb := make([]byte, max(need, 2*len(c.buf)))
			c.w = copy(nb, c.buf[c.r:c.w])
			c.buf = nb
		} else {
			c.w = copy(c.buf, c.buf[c.r:c.w])
		}
		c.r = 0
	}
	start := c.off + uint64(c.w-c.r)
	n, oobn, flags, err := c.recvmsg(c.buf[c.w:])
	got := 0
	if oobn > 0 {
		got = c.takeFDs(c.oob[:oobn], start, start+uint64(n))
	}
	c.w += n
	if flags&unix.MSG_CTRUNC != 0 {
		if got >= maxFDsPerMsg {
			return Fatalf(CodeBadFD, "control message truncated (MSG_CTRUNC): more than %d fds in one message", maxFDsPerMsg)
		}
		// Room was left in the control buffer, so the kernel truncated
		// because it could not install an fd in this process (EMFILE,
		// ENFILE): the fd is gone, and the sender did nothing wrong.
		// Losses behind the frame being read are dropped first, so the
		// list stays as short as the bytes not yet read.
		c.forgetLost()
		c.lost = append(c.lost, span{start, start + uint64(n)})
	}
	if err == ErrRung {
		return err
	}
	if err != nil {
		if errors.Is(err, io.EOF) && c.w > c.r {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("ipc: read: %w", err)
	}
	if n == 0 && oobn == 0 {
		if c.w > c.r {
			return fmt.Errorf("ipc: read: %w after %d bytes of a frame", io.ErrUnexpectedEOF, c.w-c.r)
		}
		return fmt.Errorf("ipc: read: %w", io.EOF)
	}
	return nil
}

// fdLost reports whether an fd sent with the byte at c.off (the next
// frame's first) could not be received, forgetting losses behind it.
func (c *Conn) fdLost() bool {
	c.forgetLost()
	return len(c.lost) > 0 && c.lost[0].start <= c.off
}

// forgetLost drops the losses of bytes already read.
func (c *Conn) forgetLost() {
	for len(c.lost) > 0 && c.lost[0].end <= c.off {
		c.lost = c.lost[1:]
	}
}

// takeFDs queues every fd in a control buffer, in arrival order, and
// returns how many there were.
func (c *Conn) takeFDs(oob []byte, start, end uint64) int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0
	}
	n := 0
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_RIGHTS {
			continue
		}
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			c.fds = append(c.fds, inFD{fd: fd, start: start, end: end})
		}
		n += len(fds)
	}
	return n
}

func (c *Conn) closeFDs() {
	for _, f := range c.fds {
		unix.Close(f.fd)
	}
	c.fds = c.fds[:0]
}

// WriteFrame writes one complete frame; fd >= 0 travels with it, attached
// to the sendmsg that begins with the frame's first byte. The caller keeps
// ownership of fd. Writes from several goroutines are serialized.
func (c *Conn) WriteFrame(b []byte, fd int) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writeLocked(b, fd)
}

// ErrWriteClosed is returned by writes after WriteFinal.
var ErrWriteClosed = errors.New("ipc: connection closed for writing after a fatal frame")

// WriteFinal writes b (a FATAL ERROR frame) as the connection's last frame
// and closes the socket: writes racing with it either precede it or fail
// with ErrWriteClosed, so a client never sees a frame after a fatal one.
// On a Unix socket the frame is in the peer's queue once written, so
// closing at once loses nothing.
func (c *Conn) WriteFinal(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.wclosed {
		return ErrWriteClosed
	}
	err := c.writeLocked(b, -1)
	c.wclosed = true
	c.CloseSocket()
	return err
}

func (c *Conn) writeLocked(b []byte, fd int) error {
	if c.wclosed {
		return ErrWriteClosed
	}
	if c.writeTimeout > 0 {
		if err := c.uc.SetWriteDeadline(time.Now().Add(c.writeTimeout)); err != nil {
			return fmt.Errorf("ipc: write: %w", err)
		}
	}
	if fd >= 0 {
		n, _, err := c.uc.WriteMsgUnix(b, unix.UnixRights(fd), nil)
		if err != nil {
			return fmt.Errorf("ipc: write %s with fd: %w", frameType(b), err)
		}
		b = b[n:]
	}
	for len(b) > 0 {
		n, err := c.uc.Write(b)
		if err != nil {
			return fmt.Errorf("ipc: write %s: %w", frameType(b), err)
		}
		b = b[n:]
	}
	return nil
}

func frameType(b []byte) Type {
	if len(b) > 4 {
		return Type(b[4])
	}
	return 0
}

// Close closes the socket and every received fd not handed out. Only the
// reading goroutine's fds are touched after it has stopped, so call Close
// from it or after it returned; CloseSocket unblocks it from elsewhere.
func (c *Conn) Close() error {
	c.closeFDs()
	return c.CloseSocket()
}

// CloseSocket closes the socket only, unblocking a ReadFrame in progress.
// Idempotent.
func (c *Conn) CloseSocket() error {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		c.closeErr = c.uc.Close()
		if c.rf != nil {
			// The socket ends with its last fd; closing this one also wakes
			// a read parked on it.
			_ = c.rf.Close()
		}
	})
	return c.closeErr
}
