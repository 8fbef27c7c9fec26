package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"
)

// Links are a rank's two ring links, as Form returns them. The caller owns
// the connections and closes them (Close) when the ring generation ends.
type Links struct {
	Next, Prev         []net.Conn // Streams each, by stream index; nil in a world of one
	NextAddr, PrevAddr string     // the neighbours' addresses from the peer list
	// The neighbours' generation proposals from the handshake. In a world
	// of one both are the caller's own proposal.
	NextGeneration, PrevGeneration uint32
}

// Close closes every stream of both links and returns the first error.
func (k *Links) Close() error {
	var first error
	for _, cs := range [][]net.Conn{k.Next, k.Prev} {
		for _, c := range cs {
			if c == nil {
				continue
			}
			if err := c.Close(); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// Form connects to next (retrying with backoff) and accepts the matching
// streams from prev, concurrently, until both links are complete or
// ConnectTimeout passes. generation is this node's proposal, carried in the
// handshake (0 means Config.Generation); the neighbours' proposals come back
// in Links. Call Form again on the same Listener after a ring failure:
// streams greeted by an earlier Form are never taken into a later one.
//
// Only one Form runs at a time on a Listener. Between calls, connections
// from prev have their hello checked and are then refused as
// ErrNotForming, which the dialer takes as "retry"; configuration
// mismatches are still refused by name.
//
// Form returns at once, without waiting for the deadline, when next is
// configured differently (ErrJob, ErrDigest, ErrVersion, ErrAuth, ...):
// a caller that loops on Form should pause between calls.
func (l *Listener) Form(ctx context.Context, generation uint32) (*Links, error) {
	cfg := &l.cfg
	if generation == 0 {
		generation = cfg.Generation
	}
	if l.ln == nil {
		select {
		case <-l.done:
			return nil, fmt.Errorf("rendezvous rank %d: form: %w", cfg.Rank, ErrClosed)
		default:
		}
		return &Links{NextGeneration: generation, PrevGeneration: generation}, nil
	}
	start := time.Now()
	limit := cfg.ConnectTimeout
	if d, ok := ctx.Deadline(); ok && d.Sub(start) < limit {
		limit = d.Sub(start).Round(10 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer cancel()
	l.resolvePrev(ctx)

	f := newFormation(generation, session{Epoch: l.epoch, Seq: l.seq.Add(1)}, cfg.Streams)
	l.mu.Lock()
	switch {
	case l.closed:
		l.mu.Unlock()
		return nil, fmt.Errorf("rendezvous rank %d: form: %w", cfg.Rank, ErrClosed)
	case l.form != nil:
		l.mu.Unlock()
		return nil, fmt.Errorf("rendezvous rank %d: form generation %d: %w", cfg.Rank, generation, ErrFormInProgress)
	}
	l.form = f
	l.lastReject = ""
	l.mu.Unlock()
	l.log.Info("rendezvous forming", "generation", generation,
		"next", cfg.Peers[cfg.next()], "prev", cfg.Peers[cfg.prev()], "timeout", limit)

	type dialed struct {
		conns []net.Conn
		gen   uint32
		err   error
	}
	nextc := make(chan dialed, 1)
	go func() {
		conns, gen, err := l.dialNext(ctx, generation, limit)
		nextc <- dialed{conns, gen, err}
	}()

	var next *dialed
	prevDone := f.complete
	var fail error
	for fail == nil && (next == nil || prevDone != nil) {
		select {
		case r := <-nextc:
			next = &r
			fail = r.err
		case <-prevDone:
			prevDone = nil
		case <-ctx.Done():
			fail = ctx.Err()
		case <-l.done:
			fail = ErrClosed
		}
	}

	cancel()
	if next == nil {
		r := <-nextc // the dialer notices the cancel within one I/O call
		next = &r
	}
	l.mu.Lock()
	prev := f.finish()
	n := f.n
	if l.form == f {
		l.form = nil
	}
	lastReject := l.lastReject
	l.mu.Unlock()

	if fail == nil {
		links := &Links{
			Next: next.conns, Prev: prev,
			NextAddr: cfg.Peers[cfg.next()], PrevAddr: cfg.Peers[cfg.prev()],
			NextGeneration: next.gen, PrevGeneration: f.gens[0],
		}
		// Which interfaces the links really use: the first thing to look at
		// when traffic takes a path nobody expected.
		l.log.Info("rendezvous formed", "generation", generation, "next_generation", links.NextGeneration,
			"prev_generation", links.PrevGeneration, "streams", cfg.Streams,
			"next", links.Next[0].LocalAddr().String()+"->"+links.Next[0].RemoteAddr().String(),
			"prev", links.Prev[0].RemoteAddr().String()+"->"+links.Prev[0].LocalAddr().String(),
			"took", time.Since(start).Round(time.Millisecond))
		return links, nil
	}

	for _, c := range next.conns {
		c.Close()
	}
	for _, c := range prev {
		if c != nil {
			c.Close()
		}
	}
	err := l.formError(fail, next.err, n, limit, lastReject)
	l.log.Error("rendezvous form failed", "generation", generation, "err", err)
	return nil, err
}

// formError names every link that was not ready when Form gave up.
func (l *Listener) formError(fail, nextErr error, prevN int, limit time.Duration, lastReject string) error {
	cfg := &l.cfg
	if errors.Is(fail, ErrClosed) {
		return fmt.Errorf("rendezvous rank %d: form: %w", cfg.Rank, ErrClosed)
	}
	if fail == nextErr && !errors.Is(fail, ErrTimeout) {
		return nextErr // refused for good, already a PeerError
	}
	if !errors.Is(fail, context.DeadlineExceeded) && !errors.Is(fail, ErrTimeout) {
		return fmt.Errorf("rendezvous rank %d: form: %w", cfg.Rank, fail)
	}
	var errs []error
	if nextErr != nil {
		errs = append(errs, nextErr)
	}
	if prevN < cfg.Streams {
		what := "never connected"
		if prevN > 0 {
			what = fmt.Sprintf("connected only %d of %d streams", prevN, cfg.Streams)
		}
		var last error
		if lastReject != "" {
			last = errors.New("last refused connection " + lastReject)
		}
		errs = append(errs, &PeerError{Rank: cfg.Rank, Link: "prev", Peer: cfg.prev(),
			Addr: cfg.Peers[cfg.prev()], Err: &timeoutError{what: what, after: limit, last: last}})
	}
	return errors.Join(errs...)
}
