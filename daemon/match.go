package daemon

import (
	"time"

	"github.com/collectived/collectived/ipc"
)

// matcher holds one node's half of the rules in docs/MATCHING.md: which
// call of a local trainer joins which collective, what a failed
// collective fails, what a trainer that had not called yet owes, and
// how a new generation lines the nodes' counts up again. It is pure: no
// goroutines, locks or clock of its own (the daemon holds d.mu and
// passes times in), so that the model test (match_model_test.go) drives
// it exactly as the engine, the hot lane and the socket handlers do.
//
// C is what a queued call is to the caller (the daemon's call, a model
// trainer's in the test).
type matcher[C any] struct {
	slots []matchSlot[C]
	// finished counts the collectives this node has finished, completed
	// or failed: the world's number of its next one (formed keeps it
	// equal to the other nodes').
	finished uint64
	// fresh: the daemon has formed no generation yet.
	fresh bool
	// vacated: since this node last finished a collective, its last
	// trainer left or a failure restarted the job: the trainers it has
	// now are a new incarnation of the job's, not behind the world's
	// count whatever it is.
	vacated bool
	// named counts the named calls queued; active, per name, the ranks
	// that have it at the head of their queue (named.go).
	named  int
	active map[string]int
}

// queued is one call waiting for its collective, and when it came. A
// named call (name not empty) matches the calls of its name in any order
// (named.go); the others match by their place among the ordered calls.
type queued[C any] struct {
	c    C
	at   time.Time
	name string
}

// matchSlot is one local rank.
type matchSlot[C any] struct {
	owner any // the attached trainer (its session); nil when none
	queue []queued[C]
	// debts are the errors owed by this rank's calls of collectives that
	// failed before it made them, oldest first: its next calls get them
	// at once, one each, so that every trainer's k-th call is still
	// its call of collective k.
	debts []debt
	// afresh: the rank's trainer left mid-collective, so causing the
	// failure: what it queued goes with it.
	afresh bool
	// ever: a trainer has held the rank since the node last had none. A
	// rank whose trainer left starts afresh: its replacement's first
	// call joins the world's next collective. A rank never held owes,
	// since its trainer is late, not replaced.
	ever bool
}

// debt is an error owed, and the trainer that owes it (nil: whichever
// attaches next). A trainer's debts leave with it: its replacement
// starts afresh.
type debt struct {
	err *ipc.Error
	by  any
}

// failed is a call to fail, with its error.
type failed[C any] struct {
	c   C
	err *ipc.Error
}

func newMatcher[C any](localSize int) *matcher[C] {
	return &matcher[C]{slots: make([]matchSlot[C], localSize), fresh: true}
}

// attach gives local rank l to a trainer.
func (m *matcher[C]) attach(l int, owner any) { m.slots[l].owner, m.slots[l].ever = owner, true }

// empty reports whether no rank has a trainer.
func (m *matcher[C]) empty() bool {
	for l := range m.slots {
		if m.slots[l].owner != nil {
			return false
		}
	}
	return true
}

// attached reports whether local rank l has a trainer.
func (m *matcher[C]) attached(l int) bool { return m.slots[l].owner != nil }

// detach takes local rank l from owner. A trainer leaving while a
// collective is under way (running, or any rank has a call queued)
// causes its failure: it reports lost, its rank starts afresh, and its
// queued calls, which nobody will read the answers of, are dropped
// when that failure comes.
func (m *matcher[C]) detach(l int, owner any, running bool) (lost bool) {
	sl := &m.slots[l]
	if sl.owner != owner {
		return false
	}
	lost = running || m.anyQueued()
	if lost {
		sl.afresh = true
		sl.debts = nil
	}
	sl.debts = dropDebtsOf(sl.debts, owner)
	sl.owner = nil
	if m.empty() {
		// The node's last trainer left: the job is restarting its
		// trainers (or ending). What was owed is forgotten, and the
		// ranks' next trainers are its new ones, late if they come late.
		for l := range m.slots {
			m.slots[l].debts, m.slots[l].ever = nil, false
		}
		m.vacated = true
	}
	return lost
}

func dropDebtsOf(ds []debt, owner any) []debt {
	out := ds[:0]
	for _, d := range ds {
		if d.by != owner {
			out = append(out, d)
		}
	}
	clear(ds[len(out):])
	return out
}

func (m *matcher[C]) anyQueued() bool {
	for l := range m.slots {
		if len(m.slots[l].queue) > 0 {
			return true
		}
	}
	return false
}

// payDebt takes the oldest error local rank l owes, if any: its new call
// is that of a collective that failed before it came.
func (m *matcher[C]) payDebt(l int) *ipc.Error {
	sl := &m.slots[l]
	if len(sl.debts) == 0 {
		return nil
	}
	e := sl.debts[0].err
	sl.debts[0] = debt{}
	sl.debts = sl.debts[1:]
	if len(sl.debts) == 0 {
		sl.debts = nil
	}
	return e
}

// owes reports how many errors local rank l owes.
func (m *matcher[C]) owes(l int) int { return len(m.slots[l].debts) }

// enqueue adds a call of local rank l (which owes nothing) at time at.
func (m *matcher[C]) enqueue(l int, c C, at time.Time) {
	m.slots[l].queue = append(m.slots[l].queue, queued[C]{c: c, at: at})
}

// queueLen is the number of calls local rank l has waiting.
func (m *matcher[C]) queueLen(l int) int { return len(m.slots[l].queue) }

// heads reports whether every rank has an ordered call first in its
// queue (ready), whether any rank has a call waiting, and the oldest
// arrival among the first calls, named or not.
func (m *matcher[C]) heads() (ready bool, oldest time.Time, any bool) {
	ready = true
	for l := range m.slots {
		q := m.slots[l].queue
		if len(q) == 0 {
			ready = false
			continue
		}
		if q[0].name != "" {
			// Named calls before an ordered one are a fence: they run
			// first (named.go).
			ready = false
		}
		if !any || q[0].at.Before(oldest) {
			oldest = q[0].at
		}
		any = true
	}
	return ready, oldest, any
}

// popHeads moves every rank's first call into dst, in local-rank order:
// the calls of the node's next collective. Every rank must have one.
func (m *matcher[C]) popHeads(dst []queued[C]) []queued[C] {
	dst = dst[:0]
	for l := range m.slots {
		sl := &m.slots[l]
		dst = append(dst, sl.queue[0])
		sl.queue = popFront(sl.queue)
	}
	if m.named > 0 {
		m.recount() // named calls behind the ordered ones are active now
	}
	return dst
}

func popFront[T any](q []T) []T {
	var zero T
	copy(q, q[1:])
	q[len(q)-1] = zero
	return q[:len(q)-1]
}

// firstBefore is the first waiting call, in local-rank order, that came
// before t.
func (m *matcher[C]) firstBefore(t time.Time) (C, bool) {
	for l := range m.slots {
		if q := m.slots[l].queue; len(q) > 0 && q[0].at.Before(t) {
			return q[0].c, true
		}
	}
	var zero C
	return zero, false
}

// completed records that the node's next collective succeeded: its
// count is the world's, and its trainers are in step with it.
func (m *matcher[C]) completed() { m.finished, m.vacated = m.finished+1, false }

// failure describes a collective that failed, for matcher.fail.
type failure struct {
	// at is when the failure was found: a rank's first call that came
	// before it was part of the collective, one that came after it was
	// made after the collective had already failed.
	at time.Time
	// begun: some trainer anywhere had called the collective. When
	// nobody had (a node died between collectives), nothing is owed.
	begun bool
	// restart: a trainer left mid-collective, or a node was lost (its
	// trainers with it): the job restarts its trainers, so ranks without
	// one start afresh.
	restart bool
	// err is what the collective's calls get; owed, what a rank that had
	// not called it gets (or its call that came after the failure).
	err, owed func(l int) *ipc.Error
}

// fail fails the node's next collective. heads are its calls if the
// engine had taken them (popHeads), nil if it was still waiting. It
// returns the calls to fail now. The calls a trainer queued behind its
// call of the failed collective are not failed: they are its calls of
// the next collectives, which the next generation runs (a trainer's k-th
// call is always its call of collective k; docs/MATCHING.md).
func (m *matcher[C]) fail(heads []queued[C], f failure, dst []failed[C]) []failed[C] {
	called := make([]bool, len(m.slots))
	for l, h := range heads {
		dst = append(dst, failed[C]{c: h.c, err: f.err(l)})
		called[l] = true
	}
	// A node with a trainer attached cannot always tell whether the
	// collective had begun elsewhere (it saw a neighbour die while idle):
	// it takes it as begun. A spurious error is loud; a trainer left to
	// wait for a ring that may not form again, or whose late call meets
	// the others' next calls, is not.
	begun := f.begun || len(heads) > 0 || !m.empty()
	if !begun {
		for l := range m.slots {
			if q := m.slots[l].queue; len(q) > 0 && q[0].at.Before(f.at) {
				begun = true
			}
		}
	}
	for l := range m.slots {
		sl := &m.slots[l]
		if !sl.afresh && !called[l] {
			// Named calls ahead of the rank's next ordered call are of
			// the failed stretch: they fail, and so do its later named
			// calls while it owes (named.go). A rank whose ordered call
			// of the collective is among heads ran its stretch's named
			// calls before it (a fence): those active now came after
			// that call, and are of the next stretch.
			dst = m.failNamed(l, f.at, f.err, f.owed, dst)
		}
		switch {
		case sl.afresh:
			// Its trainer left, causing the failure: what it queued
			// goes with it, and its replacement owes nothing.
			for _, q := range sl.queue {
				dst = append(dst, failed[C]{c: q.c, err: f.err(l)})
			}
			clear(sl.queue)
			sl.queue = sl.queue[:0]
			sl.afresh = false
		case sl.owner == nil && (f.restart || sl.ever):
			// Nothing owed: its trainer left, or one was lost somewhere
			// and the job restarts its trainers; the rank starts afresh,
			// forgiven what it owed before.
			sl.debts = nil
		case !begun || called[l]:
		case len(sl.queue) > 0 && sl.queue[0].at.Before(f.at):
			dst = append(dst, failed[C]{c: sl.queue[0].c, err: f.err(l)})
			sl.queue = popFront(sl.queue)
		case len(sl.queue) > 0:
			// Its call of the failed collective came after the failure.
			dst = append(dst, failed[C]{c: sl.queue[0].c, err: f.owed(l)})
			sl.queue = popFront(sl.queue)
		default:
			// A trainer attached, or still to come, owes its call: a
			// spurious error is loud, but letting its late call meet the
			// other trainers' next calls would combine different steps.
			sl.debts = append(sl.debts, debt{err: f.owed(l), by: sl.owner})
		}
	}
	if begun {
		m.finished++
		m.vacated = false
	}
	if f.restart && m.empty() {
		// The job restarts its trainers: those the node has next are a
		// new incarnation, whatever this node could tell of the failure.
		// A node whose trainers are still attached is not vacated: they
		// go on calling, and must stay in step with the world's count.
		m.vacated = true
	}
	m.recount()
	return dst
}

// formed lines this node up with the world as a generation forms:
// agreed is the largest finished count of all nodes (ring.Finished).
// The collectives a node is behind by failed on another node without
// this one learning of it (it was not in a ring then): its ranks owe
// them as they would had it learnt (see fail), oldest first, waiting
// calls first. A node vacated since the last generation formed (a
// daemon started, or restarted, into a running job; a job restarting its
// trainers, whose last left this node) joins the world's count instead:
// its trainers are new, and start afresh.
// A generation in which fresh daemons meet others (restarted: a node
// restarted, so the job restarts its trainers), or in which a fresh
// daemon meets a node whose trainers left (anyVacated), vacates every node: ranks
// without a trainer are forgiven what they owed, and the count is the
// world's. The first generation of a job (every daemon fresh) vacates
// none: its trainers are one incarnation, and those whose calls failed
// while the ring could not form are ahead of the others.
// owed(l, k) is rank l's error for the k-th collective it is behind by.
func (m *matcher[C]) formed(agreed uint64, restarted, anyVacated bool, owed func(l int, k uint64) *ipc.Error, dst []failed[C]) []failed[C] {
	restarted = m.restart(restarted, anyVacated)
	fresh := m.fresh
	m.fresh = false
	if restarted {
		for l := range m.slots {
			if m.slots[l].owner == nil {
				m.slots[l].debts, m.slots[l].ever = nil, false
			}
		}
	}
	if m.joins(restarted, fresh) {
		m.vacated = false
		m.finished = max(m.finished, agreed)
		return dst
	}
	for k := m.finished; k < agreed; k++ {
		for l := range m.slots {
			sl := &m.slots[l]
			// The named calls ahead of the rank's next ordered call are
			// of collective k's stretch; those behind it, of the next.
			dst = m.failNamed(l, time.Time{}, nil, func(l int) *ipc.Error { return owed(l, k) }, dst)
			switch {
			case len(sl.queue) > 0:
				dst = append(dst, failed[C]{c: sl.queue[0].c, err: owed(l, k)})
				sl.queue = popFront(sl.queue)
			case sl.owner == nil && sl.ever:
			default:
				sl.debts = append(sl.debts, debt{err: owed(l, k), by: sl.owner})
			}
		}
	}
	m.finished = max(m.finished, agreed)
	m.recount()
	return dst
}

// restart tells whether a forming generation restarts the job's trainers
// on this node: fresh daemons among others (restarted), or this daemon
// fresh while the job restarts its trainers elsewhere (anyVacated).
func (m *matcher[C]) restart(restarted, anyVacated bool) bool {
	return restarted || (m.fresh && anyVacated)
}

// joins tells whether the node takes the world's count without owing
// what it is behind by: its trainers are a new incarnation. Attached
// trainers of a daemon that was in the job are not: such a node owes,
// restart or not. A fresh daemon's trainers are: it never matched a call
// of theirs, and a trainer whose daemon died lost its connection with it
// (the clients do not reconnect by themselves).
func (m *matcher[C]) joins(restarted, fresh bool) bool {
	return m.vacated || restarted && (fresh || m.empty() && !m.anyQueued())
}

// behind reports, before formed, how many collectives each rank of this
// node would owe in a generation that agrees on agreed: 0 when it joins.
func (m *matcher[C]) behind(agreed uint64, restarted, anyVacated bool) uint64 {
	if agreed <= m.finished || m.joins(m.restart(restarted, anyVacated), m.fresh) {
		return 0
	}
	return agreed - m.finished
}

// drain removes every queued call (the daemon is stopping).
func (m *matcher[C]) drain(dst []queued[C]) []queued[C] {
	for l := range m.slots {
		sl := &m.slots[l]
		dst = append(dst, sl.queue...)
		clear(sl.queue)
		sl.queue = sl.queue[:0]
	}
	m.recount()
	return dst
}
