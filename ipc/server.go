package ipc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/collectived/collectived/internal/logthrottle"
)

// Handler is the daemon core as the server sees it. Its methods are called
// from session goroutines, concurrently for different sessions.
type Handler interface {
	// Hello admits a connection. Return an *Error to refuse it (it is sent
	// FATAL whatever its Fatal field says); any other error is sent as
	// INTERNAL. The handler fills world_rank, world_size, node_rank,
	// node_count, local_rank, local_size, generation, timeout_ms and
	// first_call_timeout_ms (sent only in version 3 and later); the
	// server fills version, inline_limit, max_frame, max_in_flight and
	// shm_quota, and sets both ranks to NoRank for an observer.
	Hello(s *Session, h Hello) (HelloOK, error)
	// Call receives a validated call. It must not block. The core answers
	// later with r.Reply or r.Fail, exactly once, from any goroutine.
	Call(s *Session, r *Request)
	// Status returns the JSON document for STATUS_OK.
	Status() ([]byte, error)
	// Disconnected is called once for every session whose Hello the
	// handler accepted, after the session's reader has stopped. Requests
	// in flight stay valid until answered; their answers are dropped.
	Disconnected(s *Session, cause error)
}

// Server accepts client connections on a Unix socket and runs a Session
// for each.
type Server struct {
	cfg      ServerConfig
	log      *slog.Logger
	l        *net.UnixListener
	sockInfo os.FileInfo
	self     uint32
	maxFrame uint32
	// refusals logs connections refused before they were admitted,
	// rate-limited by reason and uid, and counts them for status;
	// acceptLog the accept loop's own failures.
	refusals  *logthrottle.Throttle
	acceptLog *logthrottle.Throttle

	mu       sync.Mutex
	sessions map[*Session]struct{}
	nextID   uint64
	closed   bool
	wg       sync.WaitGroup

	closeOnce sync.Once
	closeErr  error
}

// ErrServerClosed is the cause sessions see when the server closes.
var ErrServerClosed = &Error{Code: CodeShutdown, Message: "the daemon is stopping", Fatal: true}

// Listen verifies cfg and creates the socket (see ServerConfig.Path), for
// up to cfg.BindTimeout while a live daemon still answers on it.
func Listen(cfg ServerConfig) (*Server, error) {
	if err := cfg.Verify(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l, fi, err := listenSocketRetry(cfg.Path, cfg.Mode, cfg.BindTimeout, log)
	if err != nil {
		return nil, err
	}
	return &Server{
		cfg:      cfg,
		log:      log.With("socket", cfg.Path),
		l:        l,
		sockInfo: fi,
		self:     uint32(os.Getuid()),
		maxFrame: cfg.maxFrame(),
		sessions: make(map[*Session]struct{}),
		refusals: logthrottle.New(logthrottle.Config{Logger: log.With("socket", cfg.Path), Prefix: "socket",
			Msg: "connection refused", Noun: "connections refused"}),
		acceptLog: logthrottle.New(logthrottle.Config{Logger: log.With("socket", cfg.Path), Prefix: "socket",
			Msg: "accept failed; retrying", Noun: "accepts failed"}),
	}, nil
}

// Refusals counts the connections refused before they were admitted
// (peer credentials not allowed, no HELLO in time, a HELLO refused, the
// connection limit), by reason (the error code) and uid.
func (s *Server) Refusals() logthrottle.Counts { return s.refusals.Snapshot() }

// Path is the socket file's path.
func (s *Server) Path() string { return s.cfg.Path }

// Serve accepts connections until Close and returns nil then; it returns
// an error only if accepting fails for good.
func (s *Server) Serve(h Handler) error {
	var backoff time.Duration
	for {
		c, err := s.l.AcceptUnix()
		if err != nil {
			if s.isClosed() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && !errors.Is(err, net.ErrClosed) {
				// EMFILE and friends: wait for fds to come back.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.acceptLog.Log(slog.LevelWarn, "accept failed", "", err.Error(), "err", err, "retry_in", backoff)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("ipc: accept on %s: %w", s.cfg.Path, err)
		}
		backoff = 0
		s.start(c, h)
	}
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *Server) start(c *net.UnixConn, h Handler) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		c.Close()
		return
	}
	if len(s.sessions) >= s.cfg.MaxClients {
		s.mu.Unlock()
		e := Fatalf(CodeFull, "the daemon serves at most %d connections", s.cfg.MaxClients)
		source := "unknown peer"
		cred, err := PeerCred(c)
		if err == nil {
			source = fmt.Sprintf("uid %d", cred.UID)
		}
		s.refusals.Log(slog.LevelWarn, CodeFull.String(), source, e.Message,
			"pid", cred.PID, "uid", cred.UID, "code", CodeFull.String(), "err", e.Message, "max_clients", s.cfg.MaxClients)
		refuse(c, e)
		return
	}
	s.nextID++
	sess := newSession(s, s.nextID, c, h)
	s.sessions[sess] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		sess.run()
		s.mu.Lock()
		delete(s.sessions, sess)
		s.mu.Unlock()
	}()
}

// refuse sends one fatal ERROR on a connection no session owns and closes
// it. A fresh socket's send buffer is empty, so the write does not wait;
// the deadline is a guard.
func refuse(c *net.UnixConn, e *Error) {
	c.SetWriteDeadline(time.Now().Add(time.Second))
	c.Write(e.Encode(0))
	c.Close()
}

// Close stops accepting, closes every session (each is sent a fatal
// SHUTDOWN and its handler is told), waits for their goroutines and removes
// the socket file. Idempotent; returns the first error.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		sessions := make([]*Session, 0, len(s.sessions))
		for sess := range s.sessions {
			sessions = append(sessions, sess)
		}
		s.mu.Unlock()
		err := s.l.Close()
		if err != nil && !errors.Is(err, net.ErrClosed) {
			s.closeErr = fmt.Errorf("ipc: close listener %s: %w", s.cfg.Path, err)
		}
		var wg sync.WaitGroup
		for _, sess := range sessions {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sess.Close(ErrServerClosed)
			}()
		}
		wg.Wait()
		s.wg.Wait()
		if err := removeSocket(s.cfg.Path, s.sockInfo); err != nil && s.closeErr == nil {
			s.closeErr = err
		}
		s.refusals.Close()
		s.acceptLog.Close()
	})
	return s.closeErr
}

// Shutdown is Close bounded by ctx: it returns ctx's error if the sessions
// have not all stopped in time (Close goes on in the background).
func (s *Server) Shutdown(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
