package daemon

import (
	"time"

	"github.com/collectived/collectived/ipc"
	"github.com/collectived/collectived/ring"
)

// handler is the daemon as the Unix-socket server sees it. Its methods run
// on the sessions' goroutines and never block on the ring.
type handler struct{ d *Daemon }

// noRank marks an observer's ranks in HELLO_OK.
const noRank = ^uint32(0)

func (h handler) Hello(s *ipc.Session, hello ipc.Hello) (ipc.HelloOK, error) {
	d := h.d
	if hello.Job != d.cfg.Job {
		return ipc.HelloOK{}, ipc.Errorf(ipc.CodeJob, "hello from pid %d names job %q, this daemon serves job %q", hello.PID, hello.Job, d.cfg.Job)
	}
	L := d.cfg.LocalSize
	ok := ipc.HelloOK{
		NodeRank:  uint32(d.cfg.Rank),
		NodeCount: uint32(len(d.cfg.Peers)),
		LocalSize: uint32(L),
		WorldSize: uint32(len(d.cfg.Peers) * L),
		TimeoutMS: uint64(d.cfg.CollectiveTimeout / time.Millisecond),
		// Sent only to clients of version 3 on (ipc encodes by version).
		FirstCallTimeoutMS: uint64(d.cfg.FirstCallTimeout / time.Millisecond),
	}
	// A trainer that reconnects right after closing may find its rank still
	// held by its own old connection, whose end the daemon is about to
	// notice: give the holder a moment to detach before refusing.
	deadline := time.Now().Add(min(time.Second, d.cfg.HelloTimeout/2))
	for d.rankBusy(int(hello.LocalRank), hello.Observer) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	ok.Generation = d.gen
	if d.closed {
		return ipc.HelloOK{}, ipc.Errorf(ipc.CodeShutdown, "collectived node %d is shutting down", d.cfg.Rank)
	}
	if hello.Observer {
		ok.WorldRank, ok.LocalRank = noRank, noRank
		return ok, nil
	}
	l := int(hello.LocalRank)
	switch {
	case l == -1:
		l = -1
		for i := range d.slots {
			if d.slots[i].session == nil {
				l = i
				break
			}
		}
		if l < 0 {
			return ipc.HelloOK{}, ipc.Errorf(ipc.CodeFull, "all %d local ranks of node %d are taken", L, d.cfg.Rank)
		}
	case l < 0 || l >= L:
		return ipc.HelloOK{}, ipc.Errorf(ipc.CodeRankRange, "local rank %d outside [0, %d) on node %d", l, L, d.cfg.Rank)
	case d.slots[l].session != nil:
		return ipc.HelloOK{}, ipc.Errorf(ipc.CodeRankTaken, "local rank %d of node %d is held by pid %d (%q)", l, d.cfg.Rank, d.slots[l].pid, d.slots[l].label)
	}
	sl := &d.slots[l]
	sl.session, sl.pid, sl.label = s, int32(hello.PID), hello.Label
	d.match.attach(l, s)
	s.SetValue(l)
	if L == 1 {
		s.SetOnPark(func() { d.parked(s) })
		sl.gone = func() error { return d.trainerGone(s, l) }
	}
	ok.LocalRank = uint32(l)
	ok.WorldRank = uint32(d.worldRank(l))
	d.log.Info("trainer attached", "local_rank", l, "world_rank", d.worldRank(l), "pid", hello.PID, "label", hello.Label)
	return ok, nil
}

func (h handler) Call(s *ipc.Session, r *ipc.Request) {
	d := h.d
	l, ok := s.Value().(int)
	if !ok {
		r.Fail(ipc.Errorf(ipc.CodePermission, "an observer connection cannot make collective calls"))
		return
	}
	desc := r.Desc
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		r.Fail(ipc.Errorf(ipc.CodeShutdown, "collectived node %d is shutting down", d.cfg.Rank))
		return
	}
	sl := &d.slots[l]
	if desc.Named {
		d.callNamed(sl, l, r) // releases d.mu
		return
	}
	sl.calls++
	sl.last = desc
	if owed := d.match.payDebt(l); owed != nil {
		d.mu.Unlock()
		r.Fail(owed)
		return
	}
	at := time.Now()
	if d.canInlineLocked(l, desc) {
		d.runInline(s, sl, r, at) // releases d.mu
		return
	}
	d.match.enqueue(l, r, at)
	d.mu.Unlock()
	d.wake()
}

func (h handler) Status() ([]byte, error) { return h.d.statusJSON() }

func (h handler) Disconnected(s *ipc.Session, cause error) {
	d := h.d
	l, ok := s.Value().(int)
	if !ok {
		return
	}
	d.mu.Lock()
	sl := &d.slots[l]
	if sl.session != s {
		d.mu.Unlock()
		return
	}
	inRing := d.inflight.active && d.inflight.phase == phaseRing
	var lost error
	if d.match.detach(l, s, inRing) {
		lost = failKind(ring.ErrCallerLost, "world rank %d (node %d, local rank %d, pid %d) disconnected mid-collective: %v",
			d.worldRank(l), d.cfg.Rank, l, sl.pid, cause)
		if d.lost == nil {
			d.lost = lost
		}
	}
	sl.session = nil
	pid := sl.pid
	r := d.ring
	lent := d.lender == s
	if lent {
		d.lender = nil
	}
	d.mu.Unlock()
	if lent && r != nil {
		r.GiveBack()
	}
	d.log.Info("trainer detached", "local_rank", l, "world_rank", d.worldRank(l), "pid", pid, "cause", cause, "mid_collective", lost != nil)
	if lost != nil && inRing && r != nil {
		// The engine is inside the ring with this trainer's buffer; the
		// abort makes that op fail on every node.
		r.Abort(lost)
	}
	d.wake()
}

// rankBusy reports whether a HELLO for local rank l (-1: any) would find
// it taken.
func (d *Daemon) rankBusy(l int, observer bool) bool {
	if observer {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if l >= 0 {
		return l < len(d.slots) && d.slots[l].session != nil
	}
	for i := range d.slots {
		if d.slots[i].session == nil {
			return false
		}
	}
	return true
}

// callNamed queues a named call (named.go); ipc has refused a second
// call of a name in flight. While the rank owes failed collectives, its
// named calls fail with the oldest error, which its next ordered call
// pays (docs/MATCHING.md). d.mu is held on entry and released.
func (d *Daemon) callNamed(sl *slot, l int, r *ipc.Request) {
	name := r.Desc.Name
	sl.calls++
	sl.last = r.Desc
	if owed := d.match.peekDebt(l); owed != nil {
		d.mu.Unlock()
		r.Fail(ipc.Errorf(owed.Code, "named call %q of world rank %d: this rank owes failed collectives, and its named calls fail until its next ordered call: %s",
			name, d.worldRank(l), owed.Message))
		return
	}
	d.match.enqueueNamed(l, name, r, time.Now())
	d.mu.Unlock()
	d.wake()
}
