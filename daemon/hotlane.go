package daemon

import (
	"time"

	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/ipc"
	"github.com/collectived/collectived/ring"
)

// The hot lane: on a node with one trainer, a small allreduce runs on the
// trainer's session goroutine, from reading the request to writing the
// answer, with no hand-off to the engine, the ring's writer or reader, or
// the session's writer (ring.AllReduceLent: the session goroutine also
// reads the ring link the call receives on). On a machine with few
// CPUs every hand-off waits for a thread to get a CPU; docs/TUNING.md
// (section 10) has the measurements.
//
// The engine stays the owner of the sequence of collectives: it publishes
// when it is idle (waiting for local calls, none queued) and at which seq;
// a session takes that collective, runs it, and reports back. Success
// advances the engine's seq (inlineDone); a failure goes to the engine as
// if its own execute had failed (inlineFail), so that every failure path
// (owed calls, re-forming the ring) stays the engine's. The session gives
// the ring link back when its poll for the next request ends (parked) or
// it detaches.

// inlineFailure is a collective that failed on a session goroutine.
type inlineFailure struct {
	c   call
	err error
}

// canInlineLocked reports whether the call can run on its session's
// goroutine now. d.mu is held. Not right after a larger collective
// (afterLarge): the hot lane takes the ring's links from their readers
// (and stops the world to run the process on one P), which a stretch of
// small calls repays but a small call between large ones does not: 4 B
// after 256 KiB took 0.68 of the time through the engine instead
// (docs/TUNING.md, section 28).
func (d *Daemon) canInlineLocked(l int, desc collective.Desc) bool {
	return d.cfg.LocalSize == 1 && d.cfg.Spin > 0 && !d.afterLarge && !desc.Named &&
		d.idle && d.ring != nil && d.ring.Small(desc) && d.idleRing == d.ring && d.lost == nil &&
		d.match.queueLen(l) == 0 && d.ring.Err() == nil
}

// runInline runs collective d.idleSeq for req on the calling (session)
// goroutine. d.mu is held on entry and released.
func (d *Daemon) runInline(s *ipc.Session, sl *slot, req *ipc.Request, at time.Time) {
	r, seq := d.idleRing, d.idleSeq
	d.idle, d.inline, d.lender = false, true, s
	d.inflight = inflight{active: true, seq: seq, phase: phaseRing, desc: req.Desc, since: at}
	sl.one[0] = req.Buf
	d.mu.Unlock()

	err := r.AllReduceLent(req.Desc, sl.one[:], sl.gone)

	d.mu.Lock()
	sl.one[0] = nil
	d.inline = false
	if err != nil {
		if d.closed {
			// The engine has stopped: answer here.
			d.mu.Unlock()
			req.Fail(ipc.Errorf(ipc.CodeShutdown, "collectived node %d is shutting down", d.cfg.Rank))
			return
		}
		d.inlineFail = &inlineFailure{c: call{c: req, at: at}, err: err}
		d.mu.Unlock()
		d.wake()
		return
	}
	d.inlineDone++
	d.hotRuns++
	d.match.completed()
	d.inflight = inflight{}
	// The engine is still asleep, idle: the next collective is ours to
	// take too.
	d.idle, d.idleSeq = true, seq+1
	gen := r.Generation()
	d.mu.Unlock()
	req.ReplyNow(gen, seq)
}

// trainerGone is the stop check of a call run inline: the session
// goroutine waits in the ring instead of reading its socket, so it asks
// the socket whether the trainer has gone, which Disconnected would
// otherwise have learnt by reading.
func (d *Daemon) trainerGone(s *ipc.Session, l int) error {
	if !s.PeerClosed() {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	sl := &d.slots[l]
	d.match.detach(l, s, true)
	return failKind(ring.ErrCallerLost, "world rank %d (node %d, local rank %d, pid %d) disconnected mid-collective: its connection closed while its call was in the ring",
		d.worldRank(l), d.cfg.Rank, l, sl.pid)
}

// parked is a trainer session's reader going to sleep: its calls have
// paused, so the ring link goes back to the ring's reader.
func (d *Daemon) parked(s *ipc.Session) {
	d.mu.Lock()
	if d.lender != s || d.inline {
		d.mu.Unlock()
		return
	}
	d.lender = nil
	r := d.ring
	d.mu.Unlock()
	if r != nil {
		r.GiveBack()
	}
}
