package daemon

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/ipc"
	"github.com/collectived/collectived/ring"
)

const (
	phaseLocal = "waiting for local calls"
	phaseRing  = "in ring"
)

// Pauses between failed ring formations: short at first (a neighbour that
// is restarting comes back quickly), growing to a few seconds so that a
// lasting fault, such as a node with another config, is not retried (and
// logged) many times a second.
const (
	retryFormMin = 200 * time.Millisecond
	retryFormMax = 5 * time.Second
)

// engine is the daemon's main loop: form the ring, then run collectives
// one after another until the ring fails, then form the next generation.
func (d *Daemon) engine() {
	var heads []call
	var failed []failed[*ipc.Request]
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	pause := retryFormMin
	for {
		r, err := d.form()
		if err != nil {
			if d.ctx.Err() != nil {
				d.failAll(ipc.Errorf(ipc.CodeShutdown, "collectived node %d is shutting down", d.cfg.Rank))
				return
			}
			if r != nil {
				// A peer failed collective 0 of the generation this node
				// was still starting (a mismatch among its trainers, say):
				// that collective failed here too, with its cause.
				failed = d.fail(r, 0, nil, failed, err)
				continue
			}
			// Calls that have waited their bound while the ring could not
			// form fail now, each a collective of its own; the rest wait
			// for the next attempt.
			failed = d.expire(failed, err)
			wait := min(pause, d.untilExpiry())
			select {
			case <-d.ctx.Done():
			case <-time.After(max(wait, time.Millisecond)):
			}
			pause = min(2*pause, retryFormMax)
			continue
		}
		pause = retryFormMin
		for seq := uint64(0); ; seq++ {
			var named bool
			heads, seq, named, err = d.waitLocal(r, seq, heads, timer)
			switch {
			case err == nil && named:
				seq, err = d.runNamed(r, seq)
			case err == nil:
				err = d.execute(r, seq, heads)
			}
			if err != nil {
				failed = d.fail(r, seq, heads, failed, err)
				heads = heads[:0]
				break
			}
			clear(heads)
			heads = heads[:0]
		}
		if d.ctx.Err() != nil {
			d.failAll(ipc.Errorf(ipc.CodeShutdown, "collectived node %d is shutting down", d.cfg.Rank))
			return
		}
	}
}

// nextGen is the generation this node proposes for its next ring: one
// past the last it formed. Ring.Start makes every node adopt the largest
// proposal, so a restarted daemon (proposing 0) joins the survivors' count.
func (d *Daemon) nextGen() uint32 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.proposal
}

// form builds the next generation's ring. A world of one forms at once.
// It gives up when a waiting call's bound passes first, so that the call
// is failed on time. When Start fails because a peer failed collective 0
// of the new generation, it returns the ring with the error: the caller
// fails that collective.
func (d *Daemon) form() (*ring.Ring, error) {
	proposal := d.nextGen()
	d.setState("forming", nil)
	ctx, cancel := context.WithTimeout(d.ctx, min(d.cfg.ConnectTimeout, max(d.untilExpiry(), 100*time.Millisecond)))
	defer cancel()
	links, err := d.rv.Form(ctx, proposal)
	if err != nil {
		d.setState("forming", err)
		d.log.Warn("ring formation failed", "generation", proposal, "err", err)
		return nil, err
	}
	rc := d.cfg.RingConfig(proposal, d.log)
	d.mu.Lock()
	rc.Finished, rc.Fresh, rc.Vacated = d.match.finished, d.match.fresh, d.match.vacated
	d.mu.Unlock()
	r, err := ring.New(rc, ring.Links{Next: links.Next, Prev: links.Prev, NextAddr: links.NextAddr, PrevAddr: links.PrevAddr})
	if err != nil {
		closeLinks(links.Next, links.Prev)
		return nil, err
	}
	gen, err := r.Start()
	if err != nil {
		d.setState("forming", err)
		// A peer that has started aborts it only for collective 0's
		// failure (its own op, or its kind: a mismatch or timeout found
		// before its ring op began, a trainer lost).
		if errors.Is(err, ring.ErrAborted) && startedElsewhere(err) && d.ctx.Err() == nil {
			return r, err
		}
		r.Close()
		return nil, err
	}
	d.mu.Lock()
	if n := d.match.behind(r.Finished(), r.Restarted(), r.AnyVacated()); n > maxBehind {
		// Only collectives failed while a node was out of the ring make
		// a node fall behind, a few at a time; a count this far ahead is
		// a peer's bug or a bad start frame, and owing it would take
		// memory and time without bound. The formation fails instead.
		had := d.match.finished
		d.mu.Unlock()
		r.Close()
		err := fmt.Errorf("node %d: ring generation %d: the ring's finished count %d is %d collectives past this node's %d, over the %d a node may fall behind: %w",
			d.cfg.Rank, gen, r.Finished(), n, had, maxBehind, ring.ErrBadFrame)
		d.setState("forming", err)
		d.log.Error("ring formation refused", "err", err)
		return nil, err
	}
	d.ring, d.gen, d.proposal = r, gen, gen+1
	d.nm.cache.reset() // every node empties its cache as a generation forms
	clear(d.nm.res.waiting)
	d.lender = nil // a link lent by the last ring went with it
	closed := d.closed
	behind, missed := d.match.finished, d.missed
	if missed != "" {
		missed = "; the failure this node saw: " + missed
	}
	owed := d.match.formed(r.Finished(), r.Restarted(), r.AnyVacated(), func(l int, k uint64) *ipc.Error {
		return ipc.Errorf(ipc.CodePeerLost, "this call is world rank %d's call of collective number %d, which failed on another node while this node was out of the ring or between collectives (it had finished %d collectives, the ring %d)%s",
			d.worldRank(l), k, behind, r.Finished(), missed)
	}, nil)
	d.missed = ""
	d.mu.Unlock()
	for _, f := range owed {
		f.c.Fail(f.err)
	}
	if closed {
		r.Close()
		return nil, ErrShutdown
	}
	d.setState("up", nil)
	d.log.Info("ring formed", "generation", gen, "next", links.NextAddr, "prev", links.PrevAddr, "finished", r.Finished())
	if len(owed) > 0 || behind < r.Finished() {
		d.log.Warn("this node was behind the ring: its trainers owe the collectives it missed", "had_finished", behind, "ring_finished", r.Finished())
	}
	return r, nil
}

// maxBehind bounds the collectives a node may owe when a generation
// forms (matcher.behind).
const maxBehind = 1 << 16

// bound is how long a collective may wait for its calls: the collective
// timeout, or the first-call timeout for a generation's first.
func (d *Daemon) bound(seq uint64) time.Duration {
	if seq == 0 {
		return max(d.cfg.CollectiveTimeout, d.cfg.FirstCallTimeout)
	}
	return d.cfg.CollectiveTimeout
}

// untilExpiry is how long until the oldest waiting call has waited the
// bound of a generation's first collective (which the next collective
// is, while the ring is down); the connect timeout when none waits.
func (d *Daemon) untilExpiry() time.Duration {
	d.mu.Lock()
	_, oldest, any := d.match.heads()
	d.mu.Unlock()
	if !any {
		return d.cfg.ConnectTimeout
	}
	return time.Until(oldest.Add(d.bound(0)))
}

// expire fails, while the ring cannot form, the collectives whose first
// call has waited its bound, one after another, with PEER_LOST: each is
// a collective this node has finished, failed, and the ring's next
// generation tells the other nodes so (matcher.formed).
func (d *Daemon) expire(scratch []failed[*ipc.Request], cause error) []failed[*ipc.Request] {
	bound := d.bound(0)
	for {
		d.mu.Lock()
		_, oldest, any := d.match.heads()
		if !any || time.Since(oldest) < bound {
			d.mu.Unlock()
			return scratch[:0]
		}
		missing := d.missingLocked()
		if missing == "" {
			missing = "none here"
		}
		// PEER_LOST, as the other nodes' trainers are told when the next
		// generation forms (matcher.formed): one code for one collective.
		e := ipc.Errorf(ipc.CodePeerLost, "collective number %d failed after waiting %v on node %d for the ring, which could not form (not called here: %s): %v",
			d.match.finished, bound, d.cfg.Rank, missing, cause)
		scratch = d.match.fail(nil, failure{at: time.Now(), begun: true,
			err: func(int) *ipc.Error { return e },
			owed: func(l int) *ipc.Error {
				return ipc.Errorf(e.Code, "this call is world rank %d's call of a collective which failed before it arrived: %s", d.worldRank(l), e.Message)
			}}, scratch[:0])
		d.mu.Unlock()
		d.log.Error("collective timed out while the ring could not form", "err", e.Message)
		for _, f := range scratch {
			f.c.Fail(f.err)
		}
		clear(scratch)
	}
}

// waitLocal waits until every local trainer has made call seq, warning
// about stalls, and returns the calls. It fails on the collective timeout
// (counted from the first local call), on a trainer lost, on a ring that
// failed while idle, and on shutdown. Collectives that a session ran
// meanwhile on its own goroutine (hotlane.go) advance seq, which it
// returns; one of them that failed is returned as its own failure.
func (d *Daemon) waitLocal(r *ring.Ring, seq uint64, heads []call, timer *time.Timer) ([]call, uint64, bool, error) {
	timeout := d.bound(seq)
	started := false
	for {
		// A neighbour already inside collective seq means the world has
		// begun it while no local trainer has called: this node's missing
		// trainers are the stall, and only this daemon can name their pids.
		peer, peerIn := r.PeerInOp()
		d.mu.Lock()
		d.idle = false
		if d.inline {
			// A session goroutine runs collective seq on the ring: keep
			// off it until that ends (a failure wakes us; a success needs
			// nothing from us).
			d.mu.Unlock()
			resetTimer(timer, max(d.cfg.StallWarning/4, 10*time.Millisecond))
			select {
			case <-d.notify:
			case <-timer.C:
			case <-d.ctx.Done():
				return heads, seq, false, ErrShutdown
			}
			continue
		}
		seq += d.inlineDone
		if d.inlineDone > 0 {
			d.inlineDone = 0
			started = false
		}
		if f := d.inlineFail; f != nil {
			d.inlineFail = nil
			d.mu.Unlock()
			return append(heads, f.c), seq, false, f.err
		}
		peerIn = peerIn && peer.Seq == seq
		if d.lost != nil {
			err := d.lost
			d.lost = nil
			d.mu.Unlock()
			return heads, seq, false, err
		}
		ready, oldest, any := d.match.heads()
		if ready {
			// Every rank is at an ordered call: no named call is before
			// one, so none can run first.
			heads = d.match.popHeads(heads)
			d.inflight = inflight{active: true, seq: seq, phase: phaseRing, desc: heads[0].c.Desc, since: oldest}
			d.mu.Unlock()
			return heads, seq, false, nil
		}
		var roundIn time.Duration // > 0: named calls are ready, a round is due then
		if d.match.named > 0 {
			if err := d.namedFaultLocked(r, seq); err != nil {
				d.mu.Unlock()
				return heads, seq, false, err
			}
			due, in, err := d.roundDueLocked(r, seq, time.Now())
			if err != nil {
				d.mu.Unlock()
				return heads, seq, false, err
			}
			if due {
				d.inflight = inflight{active: true, seq: seq, phase: phaseRing, desc: negotiateDesc, since: oldest}
				d.mu.Unlock()
				return heads, seq, true, nil
			}
			roundIn = in
		}
		begun := any || peerIn
		if !any && peerIn {
			oldest = peer.Since
		}
		// The next stall warning is due StallWarning after the oldest
		// call, then every StallWarning; it is kept across the ring
		// operations that named calls run meanwhile, which leave the
		// oldest call waiting.
		if !oldest.Equal(d.stallOf) {
			d.stallOf, d.nextWarn = oldest, d.cfg.StallWarning
		}
		nextWarn := d.nextWarn
		if begun && !started {
			started = true
			d.inflight = inflight{active: true, seq: seq, phase: phaseLocal, since: oldest}
		}
		missing := ""
		waited := time.Duration(0)
		if begun {
			waited = time.Since(oldest)
			if waited >= nextWarn || waited >= timeout {
				missing = d.missingLocked()
				if d.match.named > 0 {
					if missing != "" {
						missing += "; "
					}
					missing += "named calls: " + d.namedStallLocked()
				}
			}
		}
		if !any && r.Err() == nil {
			// Nothing queued: a session may run collective seq itself.
			d.idle, d.idleSeq, d.idleRing = true, seq, r
		}
		d.mu.Unlock()

		// The timeout counts from the first call of the collective this
		// node knows of: a local one, or a neighbour's announcement that
		// it is inside the collective. So the node whose trainers are late
		// times out itself, naming them, even when none of its trainers
		// has called, and the callers elsewhere hear that within their
		// bound (docs/MATCHING.md, timeouts).
		if begun && waited >= timeout {
			return heads, seq, false, failKind(ring.ErrTimeout, "collective %d of generation %d timed out after %v on node %d: not called by %s",
				seq, r.Generation(), timeout, d.cfg.Rank, missing)
		}
		if begun && waited >= nextWarn {
			if any {
				d.log.Warn("collective stalled", "seq", seq, "generation", r.Generation(), "waited", waited.Round(time.Millisecond), "not_called", missing)
			} else {
				d.log.Warn("collective stalled", "seq", seq, "generation", r.Generation(), "waited", waited.Round(time.Millisecond), "not_called", missing,
					"begun_by", fmt.Sprintf("ring rank %d (%s), in %s", peer.Rank, peer.Addr, peer.Desc))
			}
			for nextWarn <= waited {
				nextWarn += d.cfg.StallWarning
			}
			d.mu.Lock()
			d.nextWarn = nextWarn
			d.mu.Unlock()
		}
		if err := r.Err(); err != nil {
			d.mu.Lock()
			d.idle = false
			pending := d.inline || d.inlineFail != nil
			d.mu.Unlock()
			if pending {
				continue // a collective run inline ends first; its failure is this one
			}
			return heads, seq, false, err
		}

		// Sleep until a call arrives, the ring fails, or the next warning
		// or timeout is due; with no local call, look again for a
		// neighbour's announcement a few times per warning interval.
		wait := max(d.cfg.StallWarning/4, 10*time.Millisecond)
		if begun {
			wait = min(nextWarn, timeout) - waited
			if !any {
				// A neighbour's announcement may end (it failed or went
				// on): look again a few times per warning interval.
				wait = min(wait, max(d.cfg.StallWarning/4, 10*time.Millisecond))
			}
		}
		wait = max(wait, time.Millisecond)
		if roundIn > 0 {
			wait = min(wait, roundIn)
		}
		resetTimer(timer, wait)
		select {
		case <-d.notify:
		case <-timer.C:
		case <-r.Done():
		case <-d.ctx.Done():
			d.clearIdle()
			return heads, seq, false, ErrShutdown
		}
	}
}

// clearIdle withdraws the engine's offer to let a session run the next
// collective (one that has taken it already finishes on its own).
func (d *Daemon) clearIdle() {
	d.mu.Lock()
	d.idle = false
	d.mu.Unlock()
}

func resetTimer(t *time.Timer, d time.Duration) {
	t.Stop()
	select {
	case <-t.C:
	default:
	}
	t.Reset(d)
}

// execute runs collective seq on the given calls, one per local rank in
// local-rank order, and replies to them.
func (d *Daemon) execute(r *ring.Ring, seq uint64, calls []call) error {
	if err := d.runOp(r, seq, calls); err != nil {
		return err
	}
	desc := calls[0].c.Desc
	gen := r.Generation()
	for _, c := range calls {
		c.c.Reply(gen, seq)
	}
	d.mu.Lock()
	d.match.completed()
	d.inflight = inflight{}
	// Before the engine goes idle again, so before any hot lane call.
	d.afterLarge = !(desc.Op == collective.OpAllReduce && r.Small(desc))
	d.mu.Unlock()
	return nil
}

// runOp runs ring operation seq on the given calls, one per local rank in
// local-rank order, after checking they agree.
func (d *Daemon) runOp(r *ring.Ring, seq uint64, calls []call) error {
	desc := calls[0].c.Desc
	for l := 1; l < len(calls); l++ {
		if other := calls[l].c.Desc; !other.Equal(desc) {
			return failKind(ring.ErrMismatch, "collective %d of generation %d: %s called %s but %s called %s",
				seq, r.Generation(), d.describeWorldRank(d.worldRank(0)), desc, d.describeWorldRank(d.worldRank(l)), other)
		}
	}
	var err error
	switch desc.Op {
	case collective.OpAllReduce:
		// The ring folds the local buffers in local-rank order and writes
		// the result back into each, segment by segment as it goes.
		d.localBufs = d.localBufs[:0]
		for _, c := range calls {
			d.localBufs = append(d.localBufs, c.c.Buf)
		}
		err = r.AllReduceLocal(desc, d.localBufs)
		clear(d.localBufs) // do not keep trainers' buffers reachable
	case collective.OpBroadcast:
		// The ring takes world ranks as roots (ring frames carry the
		// trainers' own root); the local copies are this node's.
		L := d.cfg.LocalSize
		src := 0
		if int(desc.Root)/L == d.cfg.Rank {
			src = int(desc.Root) % L
		}
		buf := calls[src].c.Buf
		if err = r.Broadcast(desc, buf); err == nil {
			for l := range calls {
				if l != src {
					copy(calls[l].c.Buf, buf)
				}
			}
		}
	case collective.OpReduce:
		err = d.reduce(r, desc, calls)
	case collective.OpAllGather:
		err = d.allGather(r, desc, calls)
	case collective.OpReduceScatter:
		err = d.reduceScatter(r, desc, calls)
	case collective.OpBarrier:
		err = r.Barrier(desc)
	default:
		err = failKind(errInternal, "collective %d: op %s reached the engine", seq, desc.Op)
	}
	return err
}

// fail ends a generation: the calls of collective seq get cause, those
// not yet made are owed (matcher.fail), and the ring is aborted (so that
// the other nodes learn of a cause found here) and closed. Calls queued
// behind collective seq are left queued: they are their trainers' calls
// of the next collectives, which the next generation runs.
func (d *Daemon) fail(r *ring.Ring, seq uint64, heads []call, scratch []failed[*ipc.Request], cause error) []failed[*ipc.Request] {
	gen := r.Generation()
	if r.Err() == nil {
		r.Abort(cause)
	}
	// Close waits for the abort to reach the neighbours (up to AbortWait);
	// the trainers hear of the failure first.
	defer r.Close()
	failedAt := r.FailedAt()
	if failedAt.IsZero() {
		failedAt = time.Now() // the core's own failure, found just now
	}
	d.mu.Lock()
	d.ring = nil
	d.inflight = inflight{}
	d.lost = nil
	closed := d.closed
	e := d.callError(seq, gen, cause, closed)
	if mine, ok := d.ownCallLocked(heads, failedAt); ok && e.Code == ipc.CodeMismatch {
		// Ring frames carry a call's name only as a fingerprint, so the
		// node that found a mismatch in the name alone shows "name
		// differs" for the other's: each node adds its own call, so that
		// the trainers of the node whose name differs read both names.
		e = ipc.Errorf(e.Code, "%s [node %d called %s]", e.Message, d.cfg.Rank, mine)
	}
	before := d.match.finished
	// Named calls a round had taken and not answered fail with the
	// collective's error, and the failure counts as begun: calls were made.
	nm := &d.nm
	scratch = scratch[:0]
	inNamed := false
	for _, c := range nm.taken {
		if c.c != nil {
			scratch = append(scratch, failed[*ipc.Request]{c: c.c, err: e})
			inNamed = true
		}
	}
	clear(nm.taken)
	nm.taken = nm.taken[:0]
	nm.readySince = time.Time{}
	scratch = d.match.fail(heads, failure{
		at:      failedAt,
		begun:   startedElsewhere(cause) || inNamed,
		restart: errors.Is(cause, ring.ErrCallerLost) || errors.Is(cause, ring.ErrPeerClosed) || errors.Is(cause, ring.ErrPeerHung),
		err:     func(int) *ipc.Error { return e },
		owed: func(l int) *ipc.Error {
			return ipc.Errorf(e.Code, "this call is world rank %d's call of collective %d of generation %d, which failed before it arrived: %s",
				d.worldRank(l), seq, gen, e.Message)
		},
	}, scratch)
	if d.match.finished == before {
		// Judged a failure between collectives here; if another node
		// judged it the failure of one, the next generation says so
		// (matcher.formed), and its error quotes this cause.
		d.missed = e.Message
	}
	d.mu.Unlock()

	for _, f := range scratch {
		f.c.Fail(f.err)
	}
	if !closed {
		d.log.Error("collective failed; re-forming the ring", "seq", seq, "generation", gen, "err", cause)
		d.setState("failed", cause)
	}
	clear(scratch)
	return scratch[:0]
}

// ownCallLocked is this node's call of the failing collective: its
// calls taken by the engine, else a first call that came before the
// failure. d.mu is held.
func (d *Daemon) ownCallLocked(heads []call, failedAt time.Time) (collective.Desc, bool) {
	if len(heads) > 0 {
		return heads[0].c.Desc, true
	}
	if c, ok := d.match.firstBefore(failedAt); ok {
		return c.Desc, true
	}
	return collective.Desc{}, false
}

// failAll fails every queued call with e: the daemon is stopping.
func (d *Daemon) failAll(e *ipc.Error) {
	d.mu.Lock()
	calls := d.match.drain(nil)
	d.mu.Unlock()
	for _, c := range calls {
		c.c.Fail(e)
	}
}

// callError turns a failure into the error a trainer sees: the code
// chosen by the cause's kind (errors.Is on the sentinels the core and
// the ring wrap, which abort frames carry between nodes as codes), the
// message naming the collective and the cause.
func (d *Daemon) callError(seq uint64, gen uint32, cause error, closed bool) *ipc.Error {
	code := ipc.CodePeerLost
	switch {
	case closed || errors.Is(cause, ErrShutdown) || errors.Is(cause, ring.ErrShutdown):
		code = ipc.CodeShutdown
	case errors.Is(cause, ring.ErrMismatch):
		code = ipc.CodeMismatch
	case errors.Is(cause, ring.ErrCorrupt):
		code = ipc.CodeCorrupt
	case errors.Is(cause, ring.ErrCallerLost):
		code = ipc.CodeTrainerLost
	case errors.Is(cause, ring.ErrTimeout):
		code = ipc.CodeTimeout
	case errors.Is(cause, errInternal):
		code = ipc.CodeInternal
	}
	return ipc.Errorf(code, "collective %d of generation %d failed on node %d: %s%s", seq, gen, d.cfg.Rank, cause.Error(), d.explainRing(cause))
}

// explainRing adds what trainers need to read a ring error: which node
// was at fault when the ring knows (the culprit the failure's origin found
// closed, hung or sending garbage), and each ring rank the text mentions
// as its node, address and world ranks, which is what trainers know each
// other by. A ring error's text names ring ranks as "rank N" (and "origin
// rank N", "from rank N"); world and local ranks are always so prefixed.
func (d *Daemon) explainRing(cause error) string {
	var re *ring.Error
	if !errors.As(cause, &re) {
		return ""
	}
	s := ""
	if c := re.Culprit; c >= 0 && c < len(d.cfg.Peers) {
		what := "failed"
		switch {
		case errors.Is(cause, ring.ErrPeerClosed):
			what = "closed its connections (its daemon exited or was killed)"
		case errors.Is(cause, ring.ErrPeerHung):
			what = "stopped answering (no heartbeat within the timeout: stopped, partitioned or overloaded)"
		case errors.Is(cause, ring.ErrBadFrame), errors.Is(cause, ring.ErrGeneration):
			what = "sent frames this ring cannot accept"
		case errors.Is(cause, ring.ErrCorrupt):
			// The culprit sent the frame; the origin found it corrupted.
			what = "sent a frame that reached " + d.describeNode(re.Origin) +
				" corrupted (checksum mismatch): the link between them, or something on its path, changed its bytes"
		}
		s += fmt.Sprintf(" [%s %s]", d.describeNode(c), what)
	}
	if re.PeerRank >= 0 && re.PeerRank != d.cfg.Rank && errors.Is(cause, ring.ErrTimeout) && !errors.Is(cause, ring.ErrAborted) {
		s += fmt.Sprintf(" [%s sent nothing for this collective: its trainers may not have called it; see its status or log]", d.describeNode(re.PeerRank))
	}
	return s + d.ringRankLegend(re)
}

// ringRankLegend names every ring rank the ring error names (the
// reporting rank, its peer, the failure's origin and culprit, and those
// of an earlier failure it wraps), read from the error's fields: " [ring
// rank 0 is node 0 ADDR (world ranks 0-1), this node; ring rank 1 is
// ...]".
func (d *Daemon) ringRankLegend(re *ring.Error) string {
	var seen []int
	for e := re; e != nil; {
		for _, n := range [...]int{e.Rank, e.PeerRank, e.Origin, e.Culprit} {
			if n >= 0 && n < len(d.cfg.Peers) && !slices.Contains(seen, n) {
				seen = append(seen, n)
			}
		}
		inner, ok := e.Err.(*ring.Error)
		if !ok {
			break
		}
		e = inner
	}
	if len(seen) == 0 {
		return ""
	}
	slices.Sort(seen)
	var b strings.Builder
	b.WriteString(" [")
	for i, n := range seen {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "ring rank %d is %s", n, d.describeNode(n))
		if n == d.cfg.Rank {
			b.WriteString(", this node")
		}
	}
	b.WriteString("]")
	return b.String()
}

// startedElsewhere tells whether the failed collective had begun on some
// node: the ring knows whether a rank was inside an op when it failed,
// and the core's own kinds (a mismatch, a timeout, a trainer lost
// mid-collective), which abort frames carry as codes, arise only once
// calls were made.
func startedElsewhere(cause error) bool {
	var re *ring.Error
	if errors.As(cause, &re) && re.InOp() {
		return true
	}
	return errors.Is(cause, ring.ErrMismatch) || errors.Is(cause, ring.ErrTimeout) || errors.Is(cause, ring.ErrCallerLost)
}
