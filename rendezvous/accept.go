package rendezvous

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"time"
)

// acceptHandshake runs the listener's side of the exchange on c (see
// doc.go) and, on success, hands c to the formation in progress. Every
// refusal after the dialer's hello is answered with a status frame naming
// the reason, so the dialer can report it too.
func (l *Listener) acceptHandshake(h *handshake) error {
	c := h.c
	cfg := &l.cfg
	c.SetDeadline(time.Now().Add(cfg.HandshakeTimeout))
	var buf frameBuf
	f, err := readFrame(c, &buf)
	if err != nil {
		return l.ioError("reading hello", err)
	}
	if f.version != ProtocolVersion {
		return refuse(c, fmt.Errorf("%w: peer %d, ours %d", ErrVersion, f.version, ProtocolVersion))
	}
	if f.typ != frameHello {
		return refuse(c, fmt.Errorf("%w: first frame is %v, want hello", ErrMalformed, f.typ))
	}
	if err := l.checkPrevAddr(c.RemoteAddr()); err != nil {
		// The peer learns only that its address is wrong; where the prev
		// peer lives is for our log.
		return refuseSaying(c, err, fmt.Sprintf("connection from %s is not from our prev peer", c.RemoteAddr()))
	}
	dh, err := decodeHello(f.payload)
	if err != nil {
		return refuse(c, err)
	}
	if err := checkHello(cfg, &dh, "prev", cfg.prev()); err != nil {
		return refuse(c, err)
	}
	if !l.seen.add(dh.Nonce) {
		return refuse(c, fmt.Errorf("%w: dialer nonce %x… was seen before", ErrReplay, dh.Nonce[:6]))
	}
	l.mu.Lock()
	form := l.form
	l.mu.Unlock()
	if form == nil {
		return refuse(c, fmt.Errorf("%w: rank %d is not in Form; retry", ErrNotForming, cfg.Rank))
	}
	dialerRaw := append([]byte(nil), f.raw...)

	lh := hello{
		ByteOrder:  nativeBOM,
		Rank:       uint32(cfg.Rank),
		World:      uint32(len(cfg.Peers)),
		Streams:    uint16(cfg.Streams),
		Stream:     dh.Stream,
		Generation: form.gen,
		Session:    form.session,
		Digest:     cfg.Digest,
		Job:        cfg.Job,
	}
	rand.Read(lh.Nonce[:])
	out := appendHello(make([]byte, 0, 2*headerLen+helloFixedLen+len(cfg.Job)+macLen), &lh)
	listenerRaw := out[:len(out):len(out)]
	out = appendAuth(out, proof(cfg.Token, labelListener, dialerRaw, listenerRaw))
	if _, err := c.Write(out); err != nil {
		return l.ioError("sending hello", err)
	}

	f, err = readFrame(c, &buf)
	if err != nil {
		return l.ioError("reading the dialer's proof", err)
	}
	if f.version != ProtocolVersion {
		return fmt.Errorf("%w: peer switched to version %d mid-handshake, ours %d", ErrVersion, f.version, ProtocolVersion)
	}
	switch f.typ {
	case frameStatus:
		if err := decodeStatus(f.payload); err != nil {
			return fmt.Errorf("dialer %w", err)
		}
		return fmt.Errorf("%w: status OK where the dialer's proof belongs", ErrMalformed)
	case frameAuth:
	default:
		return refuse(c, fmt.Errorf("%w: %v frame where the dialer's proof belongs", ErrMalformed, f.typ))
	}
	if !hmac.Equal(f.payload, proof(cfg.Token, labelDialer, dialerRaw, listenerRaw)) {
		return refuse(c, fmt.Errorf("%w: the dialer's proof does not match (other job token?)", ErrAuth))
	}
	if err := l.proven(h); err != nil {
		return err
	}
	return l.deliver(c, form, &dh)
}

// deliver places an authenticated stream into the formation it was
// greeted under. A newer attempt of the prev peer replaces an older one's
// streams; an older one is refused, as is a duplicate of the same attempt.
func (l *Listener) deliver(c net.Conn, f *formation, h *hello) error {
	i := int(h.Stream)
	l.mu.Lock()
	err := f.reserve(l.form, c, h)
	l.mu.Unlock()
	if err != nil {
		return refuse(c, err)
	}
	if _, err := c.Write(appendStatus(nil, codeOK, "")); err != nil {
		l.mu.Lock()
		if f.reserved[i] == c {
			f.reserved[i] = nil
		}
		l.mu.Unlock()
		return l.ioError("confirming", err)
	}
	c.SetDeadline(time.Time{})
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true) // Go's default, stated: ring frames must not wait for Nagle
	}
	l.mu.Lock()
	err = f.commit(c, h)
	if err == nil {
		delete(l.pending, c) // the formation owns it now; Close must not touch it
	}
	l.mu.Unlock()
	if err != nil {
		return err
	}
	l.log.Debug("rendezvous accepted prev stream", "remote", c.RemoteAddr().String(),
		"stream", i, "generation", h.Generation)
	return nil
}

// checkPrevAddr accepts only the prev peer's host, comparing IPs; on a miss
// it resolves the host again once, in case its address changed.
func (l *Listener) checkPrevAddr(a net.Addr) error {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return fmt.Errorf("%w: %v is not a TCP address", ErrAddrNotInPeers, a)
	}
	l.mu.Lock()
	ips := l.prevIPs
	l.mu.Unlock()
	if ipIn(ta.IP, ips) {
		return nil
	}
	if ips = l.resolvePrev(context.Background()); ipIn(ta.IP, ips) {
		return nil
	}
	if a, ok := netip.AddrFromSlice(ta.IP); ok {
		if r, ok := l.peerIPs[a.Unmap()]; ok {
			return fmt.Errorf("%w: connection from %s, the address of rank %d (%s), but our prev is rank %d (%s, resolved %v)",
				ErrNotPrev, ta.IP, r, l.cfg.Peers[r], l.cfg.prev(), l.cfg.Peers[l.cfg.prev()], ips)
		}
	}
	return fmt.Errorf("%w: connection from %s, but our prev is rank %d (%s, resolved %v)",
		ErrAddrNotInPeers, ta.IP, l.cfg.prev(), l.cfg.Peers[l.cfg.prev()], ips)
}

// refuse tells the dialer why in a status frame (best effort: the
// deadline of the handshake bounds the write) and returns err.
func refuse(c net.Conn, err error) error {
	return refuseSaying(c, err, err.Error())
}

func refuseSaying(c net.Conn, err error, reason string) error {
	c.Write(appendStatus(nil, codeOf(err), reason))
	return err
}

// ioError names what the handshake was doing when the connection failed,
// and turns a deadline into ErrHandshakeTimeout.
func (l *Listener) ioError(doing string, err error) error {
	return handshakeIOError(doing, l.cfg.HandshakeTimeout, err)
}

func handshakeIOError(doing string, limit time.Duration, err error) error {
	switch {
	case errors.Is(err, ErrBadMagic), errors.Is(err, ErrMalformed):
		return err
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("%w: nothing complete within %v while %s: %w", ErrHandshakeTimeout, limit, doing, err)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("peer closed the connection while %s: %w", doing, err)
	}
	return fmt.Errorf("%s: %w", doing, err)
}
