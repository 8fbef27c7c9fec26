package ipc

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/collectived/collectived/shm"
)

// Session is one client connection on the daemon side. It owns two
// goroutines: the reader, which handles every request in order, and the
// writer, which sends call replies queued by Request.Reply and Fail, so
// that the core never waits on a client's socket.
type Session struct {
	srv   *Server
	h     Handler
	id    uint64
	conn  *Conn
	log   *slog.Logger
	table *shm.Table

	cred     Cred
	hello    Hello
	helloOK  HelloOK
	admitted bool // the handler accepted Hello: Disconnected is owed

	// Reader-owned.
	writing  bool // the writer goroutine was started
	wbuf     []byte
	call     Call
	names    Names
	lane     *Lane        // LANE: small calls and answers in shared memory
	laneSeg  *shm.Segment // the lane's memfd
	laneBuf  []byte       // the frame taken from the lane
	fromLane bool         // the frame being dispatched came on the lane

	// Shared with the goroutines that answer calls and report status.
	laneBusy atomic.Bool // a call that came on the lane is not answered yet
	hasLane  atomic.Bool // the lane is open

	mu       sync.Mutex
	closed   bool
	cause    error
	value    any
	inflight map[uint64]*Request
	free     []*Request
	outq     chan *Request
	quit     chan struct{}
	wdone    chan struct{}
}

func newSession(srv *Server, id uint64, c *net.UnixConn, h Handler) *Session {
	s := &Session{
		srv:      srv,
		h:        h,
		id:       id,
		conn:     NewConn(c, DaemonSide),
		log:      srv.log.With("session", id),
		table:    shm.NewTable(srv.cfg.ShmQuota, srv.cfg.MaxSegments),
		inflight: make(map[uint64]*Request),
		outq:     make(chan *Request, srv.cfg.MaxInFlight),
		quit:     make(chan struct{}),
		wdone:    make(chan struct{}),
	}
	s.conn.SetWriteTimeout(srv.cfg.WriteTimeout)
	s.conn.SetSpin(srv.cfg.Spin)
	return s
}

// ID is unique among the server's sessions.
func (s *Session) ID() uint64 { return s.id }

// PID is the peer's process id as the kernel reported it at connect time.
func (s *Session) PID() int32 { return s.cred.PID }

// UID is the peer's user id (SO_PEERCRED).
func (s *Session) UID() uint32 { return s.cred.UID }

// GID is the peer's primary group id (SO_PEERCRED).
func (s *Session) GID() uint32 { return s.cred.GID }

// Label is the free text the client sent in HELLO.
func (s *Session) Label() string { return s.hello.Label }

// Observer reports whether the connection is an observer (STATUS only).
func (s *Session) Observer() bool { return s.hello.Observer }

// Hello is the client's HELLO.
func (s *Session) Hello() Hello { return s.hello }

// HelloOK is what the session answered to HELLO (zero until then).
func (s *Session) HelloOK() HelloOK {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.helloOK
}

// SetValue stores the core's per-session state.
func (s *Session) SetValue(v any) {
	s.mu.Lock()
	s.value = v
	s.mu.Unlock()
}

// SetOnPark has f called on the session's reader goroutine each time its
// poll for the next request ends and it parks (Conn.SetOnPark). Call it
// from Handler.Hello, before the session reads requests.
func (s *Session) SetOnPark(f func()) { s.conn.SetOnPark(f) }

// PeerClosed reports whether the client has closed its end (Conn.PeerClosed),
// for the session's own goroutine while it runs a call instead of reading.
func (s *Session) PeerClosed() bool { return s.conn.PeerClosed() }

// Value returns what SetValue stored.
func (s *Session) Value() any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.value
}

// String names the session in logs and errors.
func (s *Session) String() string {
	return fmt.Sprintf("session %d (pid %d, uid %d)", s.id, s.cred.PID, s.cred.UID)
}

// Close ends the session. If cause is an *Error it is sent first (as
// FATAL, connection-level, within the write timeout). The reader then
// stops and the handler is told. Safe from any goroutine; only the first
// cause is kept.
func (s *Session) Close(cause error) {
	if !s.setCause(cause) {
		return
	}
	var e *Error
	if errors.As(cause, &e) {
		fatal := *e
		fatal.Fatal = true
		s.conn.WriteFinal(fatal.Encode(0))
	}
	s.conn.CloseSocket()
}

// setCause records the first cause; it reports whether this call was it.
func (s *Session) setCause(cause error) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cause != nil {
		return false
	}
	if cause == nil {
		cause = errors.New("session closed")
	}
	s.cause = cause
	return true
}

// run is the reader goroutine: credentials, HELLO, then requests until the
// connection ends; then it cleans up.
func (s *Session) run() {
	defer s.cleanup()
	cred, err := PeerCred(s.conn.UnixConn())
	if err != nil {
		s.srv.refusals.Log(slog.LevelWarn, "credentials unreadable", "unknown peer", err.Error(),
			"session", s.id, "err", err)
		s.setCause(err)
		return
	}
	s.cred = cred
	s.log = s.log.With("pid", cred.PID, "uid", cred.UID)
	if !allowed(cred, s.srv.self, s.srv.cfg.AllowedUIDs, s.srv.cfg.AllowedGIDs) {
		s.fatal(Fatalf(CodePermission, "uid %d / gid %d may not use this daemon (allowed: uids %v, gids %v, root and uid %d)",
			cred.UID, cred.GID, s.srv.cfg.AllowedUIDs, s.srv.cfg.AllowedGIDs, s.srv.self))
		return
	}
	if err := s.handshake(); err != nil {
		s.fatal(err)
		return
	}
	// Only an admitted trainer makes long calls, and Rearm only sends a
	// polling reader back to polling: a connection still in its handshake,
	// an observer, or one on a daemon that does not poll keeps to one fd.
	// Without it the session works as well; only Rearm is off.
	if s.srv.cfg.Spin > 0 && !s.hello.Observer {
		if err := s.conn.EnableRearm(); err != nil {
			s.log.Debug("no re-armed polls on this connection", "err", err)
		}
	}
	s.writing = true
	go s.writeLoop()
	for {
		f, err := s.conn.ReadFrame()
		s.fromLane = err == ErrRung
		if s.fromLane {
			f, err = s.lane.Take(s.laneBuf, s.conn.MaxFrame())
		}
		if err != nil {
			s.fatal(err)
			return
		}
		if err := s.dispatch(f); err != nil {
			var e *Error
			if errors.As(err, &e) && !e.Fatal {
				if werr := s.send(e.Append(s.wbuf[:0], f.ID), -1); werr != nil {
					s.fatal(werr)
					return
				}
				continue
			}
			s.fatal(faultOf(f.ID, err))
			return
		}
	}
}

// fatal ends the session for err: a protocol fault is sent to the client
// first, with the id of the frame that caused it (faultOf), a transport
// error just recorded.
func (s *Session) fatal(err error) {
	if !s.setCause(err) {
		return
	}
	var e *Error
	if errors.As(err, &e) {
		fatal := *e
		fatal.Fatal = true
		if s.admitted {
			s.log.Warn("closing connection", "code", e.Code.String(), "err", e.Message)
		} else {
			// Refused before it was admitted: whoever it is, a flood of
			// them costs a few lines per reason and uid, then summaries.
			s.srv.refusals.Log(slog.LevelWarn, e.Code.String(), fmt.Sprintf("uid %d", s.cred.UID), e.Message,
				"session", s.id, "pid", s.cred.PID, "uid", s.cred.UID, "gid", s.cred.GID, "code", e.Code.String(), "err", e.Message)
		}
		s.conn.WriteFinal(fatal.Append(s.wbuf[:0], faultID(err)))
	} else {
		s.log.Debug("connection ended", "err", err)
	}
}

// send writes one frame from the reader, keeping the buffer for reuse.
func (s *Session) send(b []byte, fd int) error {
	s.wbuf = b[:0]
	return s.conn.WriteFrame(b, fd)
}

func (s *Session) handshake() error {
	cfg := &s.srv.cfg
	s.conn.SetReadDeadline(time.Now().Add(cfg.HelloTimeout))
	f, err := s.conn.ReadFrame()
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return Fatalf(CodeTimeout, "no HELLO within %v", cfg.HelloTimeout)
		}
		return err
	}
	if f.FD >= 0 {
		closeFD(f.FD)
	}
	if f.Type != TypeHello {
		return faultOf(f.ID, Fatalf(CodeBadFrame, "the first frame must be HELLO, got %s (id %d)", f.Type, f.ID))
	}
	hello, err := DecodeHello(f.Payload)
	if err != nil {
		return faultOf(f.ID, err)
	}
	s.hello = hello
	ok, err := s.h.Hello(s, hello)
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			return faultOf(f.ID, err)
		}
		return faultOf(f.ID, Fatalf(CodeInternal, "hello: %v", err))
	}
	s.admitted = true
	ok.Version = hello.Version // the client's: the daemon speaks every version from MinVersion
	ok.InlineLimit = uint32(cfg.InlineLimit)
	ok.MaxFrame = s.srv.maxFrame
	ok.MaxInFlight = uint32(cfg.MaxInFlight)
	ok.ShmQuota = uint64(cfg.ShmQuota)
	if hello.Observer {
		ok.WorldRank, ok.LocalRank = NoRank, NoRank
	}
	s.mu.Lock()
	s.helloOK = ok // the reader reads it without the lock: it is the only writer
	s.mu.Unlock()
	s.conn.SetReadDeadline(time.Time{})
	if err := s.send(ok.Append(s.wbuf[:0], f.ID), -1); err != nil {
		return err
	}
	s.conn.SetMaxFrame(ok.MaxFrame)
	s.log.Info("client attached", "label", hello.Label, "observer", hello.Observer,
		"local_rank", int64(int32(ok.LocalRank)), "world_rank", int64(int32(ok.WorldRank)))
	return nil
}

func closeFD(fd int) { unix.Close(fd) }

// dispatch handles one request. A returned *Error that is not Fatal is
// sent as the request's ERROR and the session goes on; anything else ends
// the session.
func (s *Session) dispatch(f Frame) error {
	if v := f.Type.Since(); v > s.hello.Version {
		if f.FD >= 0 {
			closeFD(f.FD)
		}
		return Fatalf(CodeBadFrame, "%s (id %d) needs protocol version %d; this connection speaks %d", f.Type, f.ID, v, s.hello.Version)
	}
	if f.Type == TypeWake {
		// Only a ring: the lane is looked at on the next read.
		if f.ID != 0 {
			return Fatalf(CodeBadFrame, "WAKE has id %d, want 0", f.ID)
		}
		return DecodeEmpty(f.Type, f.Payload)
	}
	if f.ID == 0 {
		if f.FD >= 0 {
			closeFD(f.FD)
		}
		return Fatalf(CodeBadFrame, "%s uses id 0, which is reserved", f.Type)
	}
	switch f.Type {
	case TypeLane:
		return s.handleLane(f)
	case TypeCall:
		return s.handleCall(f)
	case TypeAlloc:
		return s.handleAlloc(f)
	case TypeFree:
		return s.handleFree(f)
	case TypeRegister:
		return s.handleRegister(f)
	case TypeStatus:
		return s.handleStatus(f)
	case TypeHello:
		return Fatalf(CodeBadFrame, "second HELLO (id %d)", f.ID)
	}
	return Fatalf(CodeBadFrame, "%s (id %d) is not a request", f.Type, f.ID)
}

func (s *Session) observerRefused(t Type) error {
	if s.hello.Observer {
		return Errorf(CodePermission, "an observer may only ask STATUS, not %s", t)
	}
	return nil
}

func (s *Session) handleAlloc(f Frame) error {
	if err := s.observerRefused(f.Type); err != nil {
		return err
	}
	m, err := DecodeAlloc(f.Payload)
	if err != nil {
		return err
	}
	rounded, ok := shm.PageRound(int64(min(m.Size, 1<<63-1)))
	if !ok {
		rounded = 1<<63 - 1
	}
	if err := s.table.Reserve(rounded); err != nil {
		return Errorf(CodeQuota, "ALLOC of %d bytes: %v", m.Size, err)
	}
	seg, err := shm.Create(rounded)
	if err != nil {
		return Errorf(CodeInternal, "ALLOC of %d bytes%s: %v", m.Size, s.ownShortage(err), err)
	}
	id, err := s.table.Add(seg)
	if err != nil {
		seg.Close()
		return Errorf(CodeQuota, "ALLOC of %d bytes: %v", m.Size, err)
	}
	return s.send(AllocOK{Segment: id, Size: uint64(seg.Size())}.Append(s.wbuf[:0], f.ID), seg.Fd())
}

// handleLane makes the connection's lane: a sealed memfd the daemon maps
// and sends, which the reader polls from now on beside the socket.
func (s *Session) handleLane(f Frame) error {
	if err := s.observerRefused(f.Type); err != nil {
		return err
	}
	if err := DecodeEmpty(f.Type, f.Payload); err != nil {
		return err
	}
	if s.lane != nil {
		return Errorf(CodeBadRequest, "LANE: this connection has its lane already")
	}
	seg, err := shm.Create(LaneSize)
	if err != nil {
		return Errorf(CodeInternal, "LANE%s: %v", s.ownShortage(err), err)
	}
	if err := s.send(LaneOK{Size: LaneSize}.Append(s.wbuf[:0], f.ID), seg.Fd()); err != nil {
		seg.Close()
		return err
	}
	s.laneSeg, s.lane, s.laneBuf = seg, newLane(seg.Bytes(), DaemonSide), make([]byte, LaneFrameMax)
	s.conn.SetLane(s.lane)
	s.hasLane.Store(true)
	return nil
}

// HasLane reports whether the client opened the connection's lane (LANE).
func (s *Session) HasLane() bool { return s.hasLane.Load() }

func (s *Session) handleFree(f Frame) error {
	if err := s.observerRefused(f.Type); err != nil {
		return err
	}
	m, err := DecodeFree(f.Payload)
	if err != nil {
		return err
	}
	if err := s.table.Free(m.Segment); err != nil {
		if errors.Is(err, shm.ErrBusy) {
			return Errorf(CodeBusy, "FREE: %v", err)
		}
		return Errorf(CodeBadSegment, "FREE: %v", err)
	}
	return s.send(AppendEmpty(s.wbuf[:0], TypeFreeOK, f.ID), -1)
}

func (s *Session) handleRegister(f Frame) error {
	fd := f.FD // Conn guarantees one, unless FDLost
	if err := s.observerRefused(f.Type); err != nil {
		closeFD(fd)
		return err
	}
	if f.FDLost {
		// The kernel does not say why it could not install the fd; a
		// full table (EMFILE) is what a daemon meets.
		return Errorf(CodeBadFD, "REGISTER: the daemon could not receive the segment's fd%s; REGISTER again later", s.ownShortage(unix.EMFILE))
	}
	m, err := DecodeRegister(f.Payload)
	if err != nil {
		closeFD(fd)
		return err
	}
	if m.Size > 1<<63-1 {
		closeFD(fd)
		return Errorf(CodeQuota, "REGISTER of %d bytes: over any quota (%d)", m.Size, s.srv.cfg.ShmQuota)
	}
	if err := s.table.Reserve(int64(m.Size)); err != nil {
		closeFD(fd)
		return Errorf(CodeQuota, "REGISTER of %d bytes: %v", m.Size, err)
	}
	seg, err := shm.Import(fd, int64(m.Size))
	if err != nil {
		return Errorf(CodeBadFD, "REGISTER: %v", err)
	}
	id, err := s.table.Add(seg)
	if err != nil {
		seg.Close()
		return Errorf(CodeQuota, "REGISTER of %d bytes: %v", m.Size, err)
	}
	return s.send(RegisterOK{Segment: id, Size: m.Size}.Append(s.wbuf[:0], f.ID), -1)
}

func (s *Session) handleStatus(f Frame) error {
	if err := DecodeEmpty(f.Type, f.Payload); err != nil {
		return err
	}
	doc, err := s.h.Status()
	if err != nil {
		return Errorf(CodeInternal, "STATUS: %v", err)
	}
	if len(doc) > MaxStatusFrame {
		return Errorf(CodeInternal, "STATUS: the document is %d bytes, over the STATUS_OK bound of %d", len(doc), MaxStatusFrame)
	}
	if len(doc) > int(s.srv.maxFrame) {
		// A document past max_frame (large worlds) goes out from a buffer
		// of its own, which the session does not keep.
		return s.conn.WriteFrame(StatusOK{JSON: doc}.Encode(f.ID), -1)
	}
	return s.send(StatusOK{JSON: doc}.Append(s.wbuf[:0], f.ID), -1)
}

// cleanup runs when the reader stops: no more replies are written, the
// handler is told, segments are released (those in use by calls in flight
// when those calls are answered).
func (s *Session) cleanup() {
	s.mu.Lock()
	s.closed = true
	cause := s.cause
	s.mu.Unlock()
	close(s.quit)
	// Tell the handler before the socket closes: a client that half-closed
	// and waits for our end of the connection (a graceful Close) may then
	// rely on its rank being free again.
	if s.admitted {
		s.h.Disconnected(s, cause)
	}
	s.conn.CloseSocket() // also unblocks a writer stuck on a client that stopped reading
	if s.writing {
		<-s.wdone
	}
	s.table.Close()
	if s.laneSeg != nil {
		s.laneSeg.Close()
	}
	s.conn.Close()
	if s.admitted {
		s.log.Info("client detached", "cause", cause)
	} else {
		s.log.Debug("connection closed before it was admitted", "cause", cause)
	}
}
