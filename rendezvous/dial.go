package rendezvous

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"syscall"
	"time"
)

// Backoff between attempts to reach next: quick at first, because a
// re-forming ring wants to be back fast, capped so a peer that comes up late
// is found within half a second.
const (
	backoffMin = 10 * time.Millisecond
	backoffMax = 500 * time.Millisecond
)

// aLongTimeAgo is a deadline that has passed: setting it aborts blocked I/O.
var aLongTimeAgo = time.Unix(1, 0)

// dialParams is the dialer's side of one handshake.
type dialParams struct {
	cfg      *Config
	hello    hello        // ours; the nonce is filled by dialHandshake
	wantRank int          // the rank that must answer
	local    *net.TCPAddr // source address; nil lets the kernel choose

	// skipListenerProof sends our proof without checking the listener's:
	// only tests use it, to reach the listener's MAC check with a wrong key.
	skipListenerProof bool
}

// dialNext connects every stream of the link to next, retrying with backoff
// until ctx ends. A rejection that cannot heal by waiting (another job,
// config or token) ends it at once.
func (l *Listener) dialNext(ctx context.Context, gen uint32, limit time.Duration) ([]net.Conn, uint32, error) {
	cfg := &l.cfg
	addr := cfg.Peers[cfg.next()]
	perr := func(err error) error {
		return &PeerError{Rank: cfg.Rank, Link: "next", Peer: cfg.next(), Addr: addr, Err: err}
	}
	backoff := backoffMin
	var last error
	lastLogged := ""
	local := l.advertisedAddr(ctx)
	for attempt := 1; ; attempt++ {
		s := session{Epoch: l.epoch, Seq: l.seq.Add(1)}
		conns, ngen, err := l.dialRound(ctx, addr, local, s, gen)
		if local != nil && errors.Is(err, syscall.EADDRNOTAVAIL) {
			l.log.Warn("rendezvous cannot dial from our advertised address; letting the kernel choose, next may refuse us",
				"advertised", local.IP.String(), "err", err)
			local = nil
			continue
		}
		if err == nil {
			l.log.Info("rendezvous connected next", "next", cfg.next(), "addr", addr,
				"streams", len(conns), "attempts", attempt, "next_generation", ngen)
			return conns, ngen, nil
		}
		if expired(ctx) {
			// The attempt cut short by the deadline says less than the
			// one before it ("connection refused").
			if last == nil || !isContextErr(err) {
				last = err
			}
			return nil, 0, perr(l.expired(ctx, "never answered", limit, last))
		}
		if fatal(err) {
			return nil, 0, perr(err) // Form logs it
		}
		last = err
		// One line per kind of failure, not per retry: a peer that is
		// still booting would otherwise flood the log.
		if msg := err.Error(); msg != lastLogged {
			lastLogged = msg
			if errors.Is(err, syscall.EPERM) {
				// What connect says when a cgroup firewall (systemd's
				// IPAddressDeny=) drops the address.
				l.log.Warn("rendezvous next not reachable: a firewall refuses its address; under the systemd unit, the drop-in of `collectived ipallow` may not list it",
					"next", cfg.next(), "addr", addr, "err", err)
			} else {
				l.log.Info("rendezvous next not ready, retrying", "next", cfg.next(), "addr", addr, "err", err)
			}
		}
		t := time.NewTimer(backoff/2 + mrand.N(backoff))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, 0, perr(l.expired(ctx, "never answered", limit, last))
		case <-t.C:
		}
		backoff = min(2*backoff, backoffMax)
	}
}

// advertisedAddr is the source address for dials: the IP of our own entry
// in the peer list, because that is the address next checks us against
// (ErrAddrNotInPeers). On a host with several interfaces the kernel might
// otherwise pick another. Nil if the entry does not resolve.
func (l *Listener) advertisedAddr(ctx context.Context) *net.TCPAddr {
	host, _, _ := net.SplitHostPort(l.cfg.Peers[l.cfg.Rank])
	ip := net.ParseIP(host)
	if ip == nil {
		ctx, cancel := context.WithTimeout(ctx, l.cfg.HandshakeTimeout)
		ips, err := net.DefaultResolver.LookupIP(ctx, "ip", host)
		cancel()
		if err != nil || len(ips) == 0 {
			l.log.Warn("rendezvous cannot resolve our advertised address; letting the kernel choose", "advertised", host, "err", err)
			return nil
		}
		ip = ips[0]
	}
	if ip.IsUnspecified() {
		return nil
	}
	return &net.TCPAddr{IP: ip}
}

// expired is the error for ctx ending: a timeout naming the last cause, or
// the caller's cancellation.
func (l *Listener) expired(ctx context.Context, what string, limit time.Duration, last error) error {
	if err := ctx.Err(); err == nil || errors.Is(err, context.DeadlineExceeded) {
		return &timeoutError{what: what, after: limit, last: last}
	}
	select {
	case <-l.done:
		return ErrClosed
	default:
	}
	return fmt.Errorf("gave up: %w", ctx.Err())
}

// expired reports whether ctx has ended or is about to: its deadline can
// pass, and fail a dial, a moment before ctx.Err is set.
func expired(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

func isContextErr(err error) bool {
	var ne net.Error
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// dialRound connects all streams as one attempt. The listener must answer
// every stream from the same Form; if it re-formed meanwhile, the round
// starts over under a new attempt number, which supersedes this one there.
func (l *Listener) dialRound(ctx context.Context, addr string, local *net.TCPAddr, s session, gen uint32) ([]net.Conn, uint32, error) {
	cfg := &l.cfg
	conns := make([]net.Conn, 0, cfg.Streams)
	var first *hello
	for i := 0; i < cfg.Streams; i++ {
		p := &dialParams{cfg: cfg, wantRank: cfg.next(), local: local, hello: hello{
			ByteOrder:  nativeBOM,
			Rank:       uint32(cfg.Rank),
			World:      uint32(len(cfg.Peers)),
			Streams:    uint16(cfg.Streams),
			Stream:     uint16(i),
			Generation: gen,
			Session:    s,
			Digest:     cfg.Digest,
			Job:        cfg.Job,
		}}
		c, h, err := dialStream(ctx, addr, p)
		if err == nil && first != nil && h.Session != first.Session {
			c.Close()
			err = errSessionMismatch
		}
		if err != nil {
			for _, c := range conns {
				c.Close()
			}
			return nil, 0, err
		}
		if first == nil {
			first = h
		}
		conns = append(conns, c)
	}
	return conns, first.Generation, nil
}

// dialStream dials addr and runs the handshake under the per-handshake
// deadline, aborting if ctx ends.
func dialStream(ctx context.Context, addr string, p *dialParams) (net.Conn, *hello, error) {
	limit := p.cfg.HandshakeTimeout
	d := net.Dialer{Timeout: limit}
	if p.local != nil {
		d.LocalAddr = p.local
	}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		// Ring frames are latency bound; never let Nagle hold one back.
		tc.SetNoDelay(true)
	}
	dl := time.Now().Add(limit)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	c.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(aLongTimeAgo) })
	h, err := dialHandshake(c, p)
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	c.SetDeadline(time.Time{})
	return c, h, nil
}

// dialHandshake runs the dialer's side of the exchange (see doc.go). Errors
// found here read "failed handshake: ..."; the listener's refusals read
// "refused us: ...".
func dialHandshake(c net.Conn, p *dialParams) (*hello, error) {
	cfg := p.cfg
	limit := cfg.HandshakeTimeout
	failed := func(err error) error { return fmt.Errorf("failed handshake: %w", err) }
	rand.Read(p.hello.Nonce[:])
	dialerRaw := appendHello(nil, &p.hello)
	if _, err := c.Write(dialerRaw); err != nil {
		return nil, handshakeIOError("sending hello", limit, err)
	}
	var buf frameBuf
	f, err := readFrame(c, &buf)
	if err != nil {
		return nil, failed(handshakeIOError("reading hello", limit, err))
	}
	if f.version != ProtocolVersion {
		return nil, failed(fmt.Errorf("%w: peer %d, ours %d", ErrVersion, f.version, ProtocolVersion))
	}
	switch f.typ {
	case frameStatus:
		if err := decodeStatus(f.payload); err != nil {
			return nil, err
		}
		return nil, failed(fmt.Errorf("%w: status OK where hello belongs", ErrMalformed))
	case frameHello:
	default:
		return nil, failed(fmt.Errorf("%w: %v frame where hello belongs", ErrMalformed, f.typ))
	}
	h, err := decodeHello(f.payload)
	if err != nil {
		return nil, failed(err)
	}
	listenerRaw := append([]byte(nil), f.raw...)
	if err := checkHello(cfg, &h, "next", p.wantRank); err != nil {
		return nil, failed(refuse(c, err))
	}
	if h.Stream != p.hello.Stream {
		return nil, failed(refuse(c, fmt.Errorf("%w: answered for stream %d, we dialled stream %d",
			ErrUnexpectedRank, h.Stream, p.hello.Stream)))
	}
	f, err = readFrame(c, &buf)
	if err != nil {
		return nil, failed(handshakeIOError("reading the listener's proof", limit, err))
	}
	if f.typ != frameAuth {
		return nil, failed(fmt.Errorf("%w: %v frame where the listener's proof belongs", ErrMalformed, f.typ))
	}
	token := cfg.Token
	if !p.skipListenerProof && !hmac.Equal(f.payload, proof(token, labelListener, dialerRaw, listenerRaw)) {
		return nil, failed(refuse(c, fmt.Errorf("%w: the listener's proof does not match (other job token?)", ErrAuth)))
	}
	if _, err := c.Write(appendAuth(nil, proof(token, labelDialer, dialerRaw, listenerRaw))); err != nil {
		return nil, handshakeIOError("sending our proof", limit, err)
	}
	f, err = readFrame(c, &buf)
	if err != nil {
		return nil, failed(handshakeIOError("waiting for the listener's verdict", limit, err))
	}
	if f.typ != frameStatus {
		return nil, failed(fmt.Errorf("%w: %v frame where the verdict belongs", ErrMalformed, f.typ))
	}
	if err := decodeStatus(f.payload); err != nil {
		return nil, err
	}
	return &h, nil
}
