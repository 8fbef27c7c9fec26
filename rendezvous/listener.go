package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Listener owns the TCP listener and its accept goroutine. It lives as long
// as the daemon: Form is called on it once per ring generation, and between
// formations it keeps answering (and refusing) whoever connects.
type Listener struct {
	cfg   Config
	log   *slog.Logger
	ln    net.Listener // nil in a world of one
	epoch uint64       // process start, orders our attempts after a restart
	seq   atomic.Uint64
	sem   chan struct{} // one token per handshake in progress
	// strangers holds a second token for each handshake from an address
	// that is not our prev peer's, so that they can never take every slot
	// and keep prev out.
	strangers chan struct{}
	seen      *nonceCache
	done      chan struct{} // closed by Close

	mu         sync.Mutex
	closed     bool
	forming    bool       // a Form call is running
	form       *formation // the prev side of that Form, once ready to accept
	prevIPs    []net.IP   // resolved host of Peers[prev]
	lastReject string     // last refusal, quoted in a prev timeout
	pending    map[net.Conn]struct{}

	wg        sync.WaitGroup // accept loop and handshakes
	closeOnce sync.Once
	closeErr  error
}

// Listen binds cfg.Listen (or Peers[Rank]) and starts accepting. A port in
// use is retried for up to cfg.BindTimeout (bind.go). A world of one binds
// nothing.
func Listen(cfg Config) (*Listener, error) {
	if err := cfg.Verify(); err != nil {
		return nil, err
	}
	if len(cfg.Peers) == 1 {
		return newListener(cfg, nil), nil
	}
	addr := cfg.Listen
	if addr == "" {
		addr = cfg.Peers[cfg.Rank]
	}
	wd := cfg.withDefaults()
	ln, err := bind(addr, wd.BindTimeout, wd.Logger.With("component", "rendezvous", "job", cfg.Job, "rank", cfg.Rank))
	if err != nil {
		return nil, fmt.Errorf("rendezvous rank %d: %w", cfg.Rank, err)
	}
	return newListener(cfg, ln), nil
}

// NewListener is Listen over a TCP listener the caller already holds (socket
// activation, or tests that must learn ports before building the peer
// list). The Listener takes ownership of ln. In a world of one ln is closed.
func NewListener(cfg Config, ln net.Listener) (*Listener, error) {
	if err := cfg.Verify(); err != nil {
		ln.Close()
		return nil, err
	}
	if len(cfg.Peers) == 1 {
		ln.Close()
		ln = nil
	}
	return newListener(cfg, ln), nil
}

func newListener(cfg Config, ln net.Listener) *Listener {
	cfg = cfg.withDefaults()
	l := &Listener{
		cfg:       cfg,
		log:       cfg.Logger.With("component", "rendezvous", "job", cfg.Job, "rank", cfg.Rank),
		ln:        ln,
		epoch:     uint64(time.Now().UnixNano()),
		sem:       make(chan struct{}, cfg.MaxPending),
		strangers: make(chan struct{}, max(1, cfg.MaxPending/2)),
		seen:      newNonceCache(),
		done:      make(chan struct{}),
		pending:   make(map[net.Conn]struct{}),
	}
	if ln == nil {
		return l
	}
	l.resolvePrev(context.Background())
	l.log.Info("rendezvous listening", "addr", ln.Addr().String(), "advertised", cfg.Peers[cfg.Rank],
		"next", cfg.Peers[cfg.next()], "prev", cfg.Peers[cfg.prev()], "streams", cfg.Streams)
	l.wg.Add(1)
	go l.acceptLoop()
	return l
}

// Addr is the bound address, nil in a world of one.
func (l *Listener) Addr() net.Addr {
	if l.ln == nil {
		return nil
	}
	return l.ln.Addr()
}

// Close stops accepting, ends handshakes in progress and makes a running
// Form return ErrClosed. Links already returned by Form are the caller's
// and stay open. Close is idempotent and returns the first error.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		l.mu.Lock()
		l.closed = true
		for c := range l.pending {
			c.Close()
		}
		l.mu.Unlock()
		close(l.done)
		if l.ln != nil {
			l.closeErr = l.ln.Close()
		}
		l.wg.Wait()
	})
	return l.closeErr
}

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	var delay time.Duration
	for {
		c, err := l.ln.Accept()
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				l.log.Error("rendezvous listener closed under us; no more prev connections", "err", err)
				return
			}
			// Like net/http: transient failures (EMFILE, ECONNABORTED)
			// must not end the listener that outlives every ring.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			l.log.Warn("rendezvous accept failed, retrying", "err", err, "in", delay)
			select {
			case <-l.done:
				return
			case <-time.After(delay):
			}
			continue
		}
		delay = 0
		stranger := !l.fromPrev(c.RemoteAddr())
		if err := l.acquire(stranger); err != nil {
			l.refuseBusy(c, err)
			continue
		}
		if !l.track(c) {
			l.release(stranger)
			c.Close()
			return
		}
		l.wg.Add(1)
		go l.serve(c, stranger)
	}
}

// fromPrev is the accept-time guess of whether c comes from the prev peer,
// by the addresses last resolved; the handshake checks for certain.
func (l *Listener) fromPrev(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return ipIn(ta.IP, l.prevIPs)
}

// acquire takes a handshake slot, and a stranger slot for a connection not
// from prev's address. Half the slots stay free for prev whatever strangers do.
func (l *Listener) acquire(stranger bool) error {
	select {
	case l.sem <- struct{}{}:
	default:
		return fmt.Errorf("%w: %d in progress, limit %d; connection closed", ErrBusy, cap(l.sem), cap(l.sem))
	}
	if !stranger {
		return nil
	}
	select {
	case l.strangers <- struct{}{}:
		return nil
	default:
		<-l.sem
		return fmt.Errorf("%w: %d in progress from addresses other than our prev peer's, limit %d; connection closed",
			ErrBusy, cap(l.strangers), cap(l.strangers))
	}
}

func (l *Listener) release(stranger bool) {
	if stranger {
		<-l.strangers
	}
	<-l.sem
}

// refuseBusy answers a connection beyond the limits with a status frame (a
// few bytes into a fresh socket buffer, so it cannot block) and closes it.
func (l *Listener) refuseBusy(c net.Conn, err error) {
	c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	c.Write(appendStatus(nil, codeBusy, err.Error()))
	c.Close()
	l.reject(c.RemoteAddr().String(), err)
}

func (l *Listener) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.pending[c] = struct{}{}
	return true
}

func (l *Listener) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.pending, c)
	l.mu.Unlock()
}

// serve runs one incoming handshake; it owns c until it hands it to a
// formation or closes it.
func (l *Listener) serve(c net.Conn, stranger bool) {
	defer l.wg.Done()
	defer l.release(stranger)
	defer l.untrack(c)
	addr := c.RemoteAddr().String()
	if err := l.acceptHandshake(c); err != nil {
		c.Close()
		l.reject(addr, err)
	}
}

// reject logs a refused connection and tells the OnReject hook.
func (l *Listener) reject(addr string, err error) {
	lvl := slog.LevelInfo
	if fatal(err) || errors.Is(err, ErrReplay) || errors.Is(err, ErrBusy) || errors.Is(err, ErrHandshakeTimeout) {
		lvl = slog.LevelWarn
	}
	l.log.Log(context.Background(), lvl, "rendezvous refused connection", "remote", addr, "err", err)
	l.mu.Lock()
	l.lastReject = addr + ": " + err.Error()
	l.mu.Unlock()
	if l.cfg.OnReject != nil {
		l.cfg.OnReject(addr, err)
	}
}

// resolvePrev refreshes the addresses the prev peer may connect from. A
// failure keeps the old set: DNS trouble must not lock out a known peer.
func (l *Listener) resolvePrev(ctx context.Context) []net.IP {
	host, _, _ := net.SplitHostPort(l.cfg.Peers[l.cfg.prev()])
	var ips []net.IP
	if ip := net.ParseIP(host); ip != nil {
		ips = []net.IP{ip}
	} else {
		ctx, cancel := context.WithTimeout(ctx, l.cfg.HandshakeTimeout)
		addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
		cancel()
		if err != nil {
			l.log.Warn("rendezvous cannot resolve prev peer", "prev", l.cfg.Peers[l.cfg.prev()], "err", err)
		}
		for _, a := range addrs {
			ips = append(ips, a.IP)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(ips) > 0 {
		l.prevIPs = ips
	}
	return l.prevIPs
}
