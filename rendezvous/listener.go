package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/collectived/collectived/internal/logthrottle"
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
	seen  *nonceCache
	done  chan struct{} // closed by Close

	// refusals logs refused connections, rate-limited by reason and
	// source address, and counts them for status; acceptLog the accept
	// loop's own failures.
	refusals  *logthrottle.Throttle
	acceptLog *logthrottle.Throttle
	// peerIPs maps the IP literals of the peer list to their ranks, to
	// name a listed peer that dials us without being our prev.
	peerIPs map[netip.Addr]int

	mu         sync.Mutex
	closed     bool
	forming    bool       // a Form call is running
	form       *formation // the prev side of that Form, once ready to accept
	prevIPs    []net.IP   // resolved host of Peers[prev]
	lastReject string     // last refusal, quoted in a prev timeout
	pending    map[net.Conn]struct{}
	// waiting holds the unauthenticated handshakes from prev's address,
	// oldest first, at most MaxPending: a newer one evicts the oldest, so
	// that nobody can keep the genuine prev out by holding slots.
	waiting []*handshake
	// strangers counts the handshakes from other addresses, at most
	// strangerSlots; more are refused at once.
	strangers int

	wg        sync.WaitGroup // accept loop and handshakes
	closeOnce sync.Once
	closeErr  error
}

// handshake is one accepted connection until the dialer's proof checks
// out (or the handshake fails). Its fields are guarded by Listener.mu.
type handshake struct {
	c        net.Conn
	stranger bool // not from prev's address (as resolved at accept)
	evicted  bool // closed to make room for a newer one: the evictor logged it
	freed    bool // its slot is free again
}

// strangerSlots is how many handshakes addresses other than prev's may
// have in progress at once.
func (c *Config) strangerSlots() int { return max(1, c.MaxPending/8) }

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
	log := cfg.Logger.With("component", "rendezvous", "job", cfg.Job, "rank", cfg.Rank)
	l := &Listener{
		cfg:     cfg,
		log:     log,
		ln:      ln,
		epoch:   uint64(time.Now().UnixNano()),
		seen:    newNonceCache(),
		done:    make(chan struct{}),
		pending: make(map[net.Conn]struct{}),
		refusals: logthrottle.New(logthrottle.Config{Logger: log, Prefix: "rendezvous",
			Msg: "rendezvous refused connection", Noun: "connections refused"}),
		acceptLog: logthrottle.New(logthrottle.Config{Logger: log, Prefix: "rendezvous",
			Msg: "rendezvous accept failed, retrying", Noun: "accepts failed"}),
		peerIPs: make(map[netip.Addr]int),
	}
	for i, p := range cfg.Peers {
		host, _, _ := net.SplitHostPort(p)
		if a, err := netip.ParseAddr(host); err == nil {
			if _, seen := l.peerIPs[a.Unmap()]; !seen {
				l.peerIPs[a.Unmap()] = i
			}
		}
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
		l.refusals.Close()
		l.acceptLog.Close()
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
			l.acceptLog.Log(slog.LevelWarn, "accept failed", "", err.Error(), "err", err, "in", delay)
			select {
			case <-l.done:
				return
			case <-time.After(delay):
			}
			continue
		}
		delay = 0
		h, victim, err := l.admit(c)
		if victim != nil {
			l.evict(victim)
		}
		if err != nil {
			l.refuseBusy(c, err)
			continue
		}
		if h == nil { // closed
			c.Close()
			return
		}
		l.wg.Add(1)
		go l.serve(h)
	}
}

// fromPrevLocked is the accept-time guess of whether a connection from a
// comes from the prev peer, by the addresses last resolved; the handshake
// checks for certain. The caller holds l.mu.
func (l *Listener) fromPrevLocked(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ipIn(ta.IP, l.prevIPs)
}

// admit gives c a handshake slot. From prev's address there is always
// one: when all MaxPending are taken, the oldest unauthenticated
// handshake is evicted (returned as victim, for the caller to close). From
// any other address c gets one of the stranger slots or ErrBusy. A nil
// handshake and error mean the listener is closed.
func (l *Listener) admit(c net.Conn) (h, victim *handshake, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, nil, nil
	}
	h = &handshake{c: c, stranger: !l.fromPrevLocked(c.RemoteAddr())}
	if h.stranger {
		if n := l.cfg.strangerSlots(); l.strangers >= n {
			return nil, nil, fmt.Errorf("%w: %d in progress from addresses other than our prev peer's, limit %d; connection closed",
				ErrBusy, l.strangers, n)
		}
		l.strangers++
	} else {
		if len(l.waiting) >= l.cfg.MaxPending {
			victim = l.waiting[0]
			l.waiting = l.waiting[1:]
			victim.evicted, victim.freed = true, true
		}
		l.waiting = append(l.waiting, h)
	}
	l.pending[c] = struct{}{}
	return h, victim, nil
}

// free returns h's slot, once. A handshake proven or failed frees it; an
// evicted one had it taken. The caller holds l.mu.
func (l *Listener) freeLocked(h *handshake) {
	if h.freed {
		return
	}
	h.freed = true
	if h.stranger {
		l.strangers--
		return
	}
	for i, w := range l.waiting {
		if w == h {
			l.waiting = append(l.waiting[:i], l.waiting[i+1:]...)
			break
		}
	}
}

// proven frees h's slot as soon as the dialer's proof checks out, so that
// an authenticated stream never waits on, or for, unproven ones. It fails
// if h was evicted meanwhile (its connection is closed).
func (l *Listener) proven(h *handshake) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h.evicted {
		return errEvicted
	}
	l.freeLocked(h)
	return nil
}

// errEvicted ends the goroutine of a handshake evicted under it; the
// evictor has logged it.
var errEvicted = errors.New("evicted")

// evict closes the oldest unauthenticated handshake from prev's address
// to make room for a newer one, telling it why (best effort, a few bytes
// into a socket whose handshake has not sent more than ours).
func (l *Listener) evict(h *handshake) {
	err := fmt.Errorf("%w: evicted, the oldest of %d unauthenticated handshakes from our prev peer's address, to make room for a newer one",
		ErrBusy, l.cfg.MaxPending)
	l.refuseBusy(h.c, err)
}

// refuseBusy answers a connection beyond the limits with a status frame (a
// few bytes into a fresh socket buffer, so it cannot block) and closes it.
func (l *Listener) refuseBusy(c net.Conn, err error) {
	c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	c.Write(appendStatus(nil, codeBusy, err.Error()))
	c.Close()
	l.reject(c.RemoteAddr().String(), err)
}

func (l *Listener) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.pending, c)
	l.mu.Unlock()
}

// serve runs one incoming handshake; it owns h.c until it hands it to a
// formation or closes it.
func (l *Listener) serve(h *handshake) {
	defer l.wg.Done()
	c := h.c
	addr := c.RemoteAddr().String()
	err := l.acceptHandshake(h)
	l.mu.Lock()
	evicted := h.evicted
	l.freeLocked(h)
	l.mu.Unlock()
	if err != nil {
		c.Close()
		if !evicted {
			l.reject(addr, err)
		}
	}
	l.untrack(c)
}

// reject logs a refused connection, rate-limited by reason and source
// address (a flood costs a few lines and then one summary per window),
// and tells the OnReject hook.
func (l *Listener) reject(addr string, err error) {
	lvl := slog.LevelInfo
	if fatal(err) || errors.Is(err, ErrReplay) || errors.Is(err, ErrBusy) || errors.Is(err, ErrHandshakeTimeout) {
		lvl = slog.LevelWarn
	}
	source := addr
	if host, _, err := net.SplitHostPort(addr); err == nil {
		source = host
	}
	l.refusals.Log(lvl, reasonOf(err), source, err.Error(), "remote", addr, "err", err)
	l.mu.Lock()
	l.lastReject = addr + ": " + err.Error()
	l.mu.Unlock()
	if l.cfg.OnReject != nil {
		l.cfg.OnReject(addr, err)
	}
}

// Refusals counts the connections refused since Listen, by reason and by
// reason and source address (docs/SECURITY.md).
func (l *Listener) Refusals() logthrottle.Counts { return l.refusals.Snapshot() }

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
