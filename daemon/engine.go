package daemon

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
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
	var failed []call
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	pause := retryFormMin
	for {
		r, err := d.form()
		if err != nil {
			if d.ctx.Err() != nil {
				d.failAll(failed[:0], ipc.Errorf(ipc.CodeShutdown, "collectived node %d is shutting down", d.cfg.Rank))
				return
			}
			// Calls that arrived while the ring could not form learn why
			// now rather than at their timeout.
			failed = d.failAll(failed[:0], ipc.Errorf(ipc.CodePeerLost, "node %d: ring generation %d could not form: %v", d.cfg.Rank, d.nextGen(), err))
			select {
			case <-d.ctx.Done():
			case <-time.After(pause):
			}
			pause = min(2*pause, retryFormMax)
			continue
		}
		pause = retryFormMin
		for seq := uint64(0); ; seq++ {
			heads, seq, err = d.waitLocal(r, seq, heads, timer)
			if err == nil {
				err = d.execute(r, seq, heads)
			}
			if err != nil {
				failed = d.fail(r, seq, heads, failed, err)
				heads = heads[:0]
				break
			}
			heads = heads[:0]
		}
		if d.ctx.Err() != nil {
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
func (d *Daemon) form() (*ring.Ring, error) {
	proposal := d.nextGen()
	d.setState("forming", nil)
	ctx, cancel := context.WithTimeout(d.ctx, d.cfg.ConnectTimeout)
	defer cancel()
	links, err := d.rv.Form(ctx, proposal)
	if err != nil {
		d.setState("forming", err)
		d.log.Warn("ring formation failed", "generation", proposal, "err", err)
		return nil, err
	}
	rc := d.cfg.RingConfig(proposal, d.log)
	r, err := ring.New(rc, ring.Links{Next: links.Next, Prev: links.Prev, NextAddr: links.NextAddr, PrevAddr: links.PrevAddr})
	if err != nil {
		closeLinks(links.Next, links.Prev)
		return nil, err
	}
	gen, err := r.Start()
	if err != nil {
		r.Close()
		d.setState("forming", err)
		return nil, err
	}
	d.mu.Lock()
	d.ring, d.gen, d.proposal = r, gen, gen+1
	d.lender = nil // a link lent by the last ring went with it
	closed := d.closed
	d.mu.Unlock()
	if closed {
		r.Close()
		return nil, ErrShutdown
	}
	d.setState("up", nil)
	d.log.Info("ring formed", "generation", gen, "next", links.NextAddr, "prev", links.PrevAddr)
	return r, nil
}

// waitLocal waits until every local trainer has made call seq, warning
// about stalls, and returns the calls. It fails on the collective timeout
// (counted from the first local call), on a trainer lost, on a ring that
// failed while idle, and on shutdown. Collectives that a session ran
// meanwhile on its own goroutine (hotlane.go) advance seq, which it
// returns; one of them that failed is returned as its own failure.
func (d *Daemon) waitLocal(r *ring.Ring, seq uint64, heads []call, timer *time.Timer) ([]call, uint64, error) {
	timeout := d.cfg.CollectiveTimeout
	if seq == 0 {
		timeout = max(timeout, d.cfg.FirstCallTimeout)
	}
	nextWarn := d.cfg.StallWarning
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
				return heads, seq, ErrShutdown
			}
			continue
		}
		seq += d.inlineDone
		if d.inlineDone > 0 {
			d.inlineDone = 0
			started, nextWarn = false, d.cfg.StallWarning
		}
		if f := d.inlineFail; f != nil {
			d.inlineFail = nil
			d.mu.Unlock()
			return append(heads, f.c), seq, f.err
		}
		peerIn = peerIn && peer.Seq == seq
		if d.lost != nil {
			err := d.lost
			d.lost = nil
			d.mu.Unlock()
			return heads, seq, err
		}
		ready, oldest, any := d.headsLocked()
		if ready {
			heads = d.popHeadsLocked(heads)
			d.inflight = inflight{active: true, seq: seq, phase: phaseRing, desc: heads[0].req.Desc, since: oldest}
			d.mu.Unlock()
			return heads, seq, nil
		}
		begun := any || peerIn
		if !any && peerIn {
			oldest = peer.Since
		}
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
			}
		}
		if !any && r.Err() == nil {
			// Nothing queued: a session may run collective seq itself.
			d.idle, d.idleSeq, d.idleRing = true, seq, r
		}
		d.mu.Unlock()

		// The timeout counts from the first local call only: a node whose
		// trainers never call is failed by the nodes that did, whose
		// collective times out inside the ring.
		if any && waited >= timeout {
			return heads, seq, fmt.Errorf("[timeout] collective %d of generation %d timed out after %v on node %d: not called by %s",
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
		}
		if err := r.Err(); err != nil {
			d.mu.Lock()
			d.idle = false
			pending := d.inline || d.inlineFail != nil
			d.mu.Unlock()
			if pending {
				continue // a collective run inline ends first; its failure is this one
			}
			return heads, seq, err
		}

		// Sleep until a call arrives, the ring fails, or the next warning
		// or timeout is due; with no local call, look again for a
		// neighbour's announcement a few times per warning interval.
		wait := max(d.cfg.StallWarning/4, 10*time.Millisecond)
		if begun {
			wait = nextWarn - waited
			if any {
				wait = min(wait, timeout-waited)
			}
		}
		resetTimer(timer, max(wait, time.Millisecond))
		select {
		case <-d.notify:
		case <-timer.C:
		case <-r.Done():
		case <-d.ctx.Done():
			d.clearIdle()
			return heads, seq, ErrShutdown
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
	desc := calls[0].req.Desc
	for l := 1; l < len(calls); l++ {
		if other := calls[l].req.Desc; !other.Equal(desc) {
			return fmt.Errorf("[mismatch] collective %d of generation %d: %s called %s but %s called %s",
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
			d.localBufs = append(d.localBufs, c.req.Buf)
		}
		err = r.AllReduceLocal(desc, d.localBufs)
		clear(d.localBufs) // do not keep trainers' buffers reachable
	case collective.OpBroadcast:
		L := d.cfg.LocalSize
		rootNode, rootLocal := int(desc.Root)/L, int(desc.Root)%L
		rd := desc
		rd.Root = uint32(rootNode)
		src := 0
		if rootNode == d.cfg.Rank {
			src = rootLocal
		}
		buf := calls[src].req.Buf
		if err = r.Broadcast(rd, buf); err == nil {
			for l := range calls {
				if l != src {
					copy(calls[l].req.Buf, buf)
				}
			}
		}
	case collective.OpBarrier:
		err = r.Barrier(desc)
	default:
		err = fmt.Errorf("[internal] collective %d: op %s reached the engine", seq, desc.Op)
	}
	if err != nil {
		return err
	}
	gen := r.Generation()
	for _, c := range calls {
		c.req.Reply(gen, seq)
	}
	d.mu.Lock()
	d.inflight = inflight{}
	// Before the engine goes idle again, so before any hot lane call.
	d.afterLarge = !(desc.Op == collective.OpAllReduce && r.Small(desc))
	d.mu.Unlock()
	return nil
}

// fail ends a generation: the calls of collective seq get cause, the calls
// queued behind it fail as aborted with the same cause, and the ring is
// aborted (so that the other nodes learn of a cause found here) and closed.
func (d *Daemon) fail(r *ring.Ring, seq uint64, heads, scratch []call, cause error) []call {
	gen := r.Generation()
	if r.Err() == nil {
		r.Abort(cause)
	}
	// Close waits for the abort to reach the neighbours (up to AbortWait);
	// the trainers hear of the failure first.
	defer r.Close()
	d.mu.Lock()
	d.ring = nil
	d.inflight = inflight{}
	d.lost = nil
	// A slot made its call of collective seq if that call is in heads, or,
	// when the failure came while waiting for local calls, if it arrived
	// before the failure. Calls that arrived later were made after it and
	// are not this collective's (they wait for the next generation, or take
	// the owed failure below).
	failedAt := r.FailedAt()
	if failedAt.IsZero() {
		failedAt = time.Now() // the core's own failure, found just now
	}
	called := make([]bool, len(d.slots))
	for _, c := range heads {
		if l, ok := c.req.Session().Value().(int); ok {
			called[l] = true
		}
	}
	if len(heads) == 0 {
		for l := range d.slots {
			if q := d.slots[l].queue; len(q) > 0 && q[0].at.Before(failedAt) {
				heads = append(heads, q[0])
				d.slots[l].queue = append(q[:0], q[1:]...)
				called[l] = true
			}
		}
	}
	closed := d.closed
	e := d.callError(seq, gen, cause, closed)
	// After a trainer was lost (here or on another node) the job restarts
	// trainers, so slots left empty start afresh; after any other failure
	// a trainer still to attach will make its call of collective seq.
	msg := cause.Error()
	lostTrainer := hasTag(msg, "[trainer-lost]")
	// Only a collective that some trainer somewhere had called can be owed:
	// a failure while the whole ring was idle (a node died between
	// collectives) fails nobody's call.
	started := len(heads) > 0 || startedElsewhere(cause)
	scratch = scratch[:0]
	for l := range d.slots {
		sl := &d.slots[l]
		switch {
		case called[l]:
			// Everything this trainer queued behind its failed call was
			// sent before it could learn of the failure: it fails too.
			scratch = append(scratch, sl.queue...)
			clear(sl.queue)
			sl.queue = sl.queue[:0]
		case sl.lostMid || (sl.session == nil && (!started || lostTrainer)):
			// Nothing owed: calls made after the failure stay queued for
			// the next generation. A trainer attached when the ring failed
			// always owes its call, even when this node cannot tell whether
			// the collective had begun elsewhere (it saw its neighbour die
			// while idle): a spurious error is loud, but letting its late
			// call meet other trainers' next calls would silently combine
			// different steps.
		case len(sl.queue) > 0:
			// Its call of collective seq arrived after the failure.
			owed := sl.queue[0]
			sl.queue = append(sl.queue[:0], sl.queue[1:]...)
			owed.req.Fail(ipc.Errorf(e.Code, "this call is world rank %d's call of collective %d of generation %d, which failed before it arrived: %s",
				d.worldRank(l), seq, gen, e.Message))
		default:
			sl.owed = ipc.Errorf(e.Code, "this call is world rank %d's call of collective %d of generation %d, which failed before it arrived: %s",
				d.worldRank(l), seq, gen, e.Message)
			sl.owedBy = sl.session
		}
		sl.lostMid = false
	}
	d.mu.Unlock()

	for _, c := range heads {
		c.req.Fail(e)
	}
	if len(scratch) > 0 {
		ab := ipc.Errorf(ipc.CodeAborted, "call queued behind collective %d of generation %d, which failed: %s", seq, gen, e.Message)
		for _, c := range scratch {
			c.req.Fail(ab)
		}
	}
	if !closed {
		d.log.Error("collective failed; re-forming the ring", "seq", seq, "generation", gen, "err", cause)
		d.setState("failed", cause)
	}
	for i := range scratch {
		scratch[i] = call{}
	}
	return scratch[:0]
}

// failAll fails every queued call with e.
func (d *Daemon) failAll(scratch []call, e *ipc.Error) []call {
	d.mu.Lock()
	scratch = d.drainLocked(scratch[:0])
	d.mu.Unlock()
	for _, c := range scratch {
		c.req.Fail(e)
	}
	for i := range scratch {
		scratch[i] = call{}
	}
	return scratch[:0]
}

// callError turns a failure into the error a trainer sees: the code chosen
// by the cause's kind, the message naming the collective and the cause.
func (d *Daemon) callError(seq uint64, gen uint32, cause error, closed bool) *ipc.Error {
	code := ipc.CodePeerLost
	msg := cause.Error()
	switch {
	case closed || errors.Is(cause, ErrShutdown) || hasTag(msg, "[shutdown]"):
		code = ipc.CodeShutdown
	case hasTag(msg, "[mismatch]") || errors.Is(cause, ring.ErrMismatch):
		code = ipc.CodeMismatch
	case hasTag(msg, "[trainer-lost]"):
		code = ipc.CodeTrainerLost
	case hasTag(msg, "[timeout]") || errors.Is(cause, ring.ErrTimeout):
		code = ipc.CodeTimeout
	case hasTag(msg, "[internal]"):
		code = ipc.CodeInternal
	}
	return ipc.Errorf(code, "collective %d of generation %d failed on node %d: %s%s", seq, gen, d.cfg.Rank, untag(msg), d.explainRing(cause))
}

// tags are the kinds the core writes into its failures' text (see doc.go);
// they choose the error code and are dropped from what trainers read.
var tags = strings.NewReplacer("[shutdown] ", "", "[mismatch] ", "", "[trainer-lost] ", "", "[timeout] ", "", "[internal] ", "")

func untag(msg string) string { return tags.Replace(msg) }

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
		}
		s += fmt.Sprintf(" [%s %s]", d.describeNode(c), what)
	}
	if re.PeerRank >= 0 && re.PeerRank != d.cfg.Rank && errors.Is(cause, ring.ErrTimeout) && !errors.Is(cause, ring.ErrAborted) {
		s += fmt.Sprintf(" [%s sent nothing for this collective: its trainers may not have called it; see its status or log]", d.describeNode(re.PeerRank))
	}
	return s + d.ringRankLegend(cause.Error())
}

// ringRankRe finds the ring ranks in a ring error's text.
var ringRankRe = regexp.MustCompile(`(world |local )?rank (\d+)`)

// ringRankLegend names every ring rank msg mentions: " [ring rank 0 is
// node 0 ADDR (world ranks 0-1), this node; ring rank 1 is ...]".
func (d *Daemon) ringRankLegend(msg string) string {
	var seen []int
	for _, m := range ringRankRe.FindAllStringSubmatch(msg, -1) {
		if m[1] != "" {
			continue
		}
		n, err := strconv.Atoi(m[2])
		if err != nil || n < 0 || n >= len(d.cfg.Peers) || slices.Contains(seen, n) {
			continue
		}
		seen = append(seen, n)
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
// node: the ring knows whether a rank was inside an op when it failed, and
// the core's own tags (a mismatch, a local timeout, a trainer lost
// mid-collective), which travel in abort reasons, are raised only once
// calls were made.
func startedElsewhere(cause error) bool {
	var re *ring.Error
	if errors.As(cause, &re) && re.InOp() {
		return true
	}
	msg := cause.Error()
	return hasTag(msg, "[mismatch]") || hasTag(msg, "[timeout]") || hasTag(msg, "[trainer-lost]")
}
