package daemon

import (
	"time"

	"github.com/collectived/collectived/ipc"
)

// Named calls (docs/MATCHING.md, "Named calls"): a call marked named
// matches the calls of the same name on every trainer, in whatever order
// the trainers make them. A rank's queue holds its named and ordered
// calls in the order they came; the named calls before its first ordered
// call are *active*: they are what the node can offer to the world now.
// An ordered call is a fence: it runs only once every named call before
// it has run, so that every node runs the same ring operations in the
// same order without a round trip for ordered calls.
//
// The matcher keeps, for each name, how many ranks have it active; a
// name active on every rank is ready on this node (the engine then
// negotiates it with the other nodes: negotiate.go).

// enqueueNamed adds rank l's named call of name (which it has not in
// flight: handler refuses that).
func (m *matcher[C]) enqueueNamed(l int, name string, c C, at time.Time) {
	sl := &m.slots[l]
	active := true
	for i := range sl.queue {
		if sl.queue[i].name == "" {
			active = false
			break
		}
	}
	sl.queue = append(sl.queue, queued[C]{c: c, at: at, name: name})
	m.named++
	if active {
		if m.active == nil {
			m.active = make(map[string]int)
		}
		m.active[name]++
	}
}

// peekDebt is the oldest error local rank l owes, left owed: a named
// call fails with it, the rank's next ordered call pays it.
func (m *matcher[C]) peekDebt(l int) *ipc.Error {
	if ds := m.slots[l].debts; len(ds) > 0 {
		return ds[0].err
	}
	return nil
}

// activeLen is the number of named calls at the head of rank l's queue.
func (m *matcher[C]) activeLen(l int) int {
	q := m.slots[l].queue
	n := 0
	for n < len(q) && q[n].name != "" {
		n++
	}
	return n
}

// recount recomputes the active counts after calls left the queues
// other than by takeNamed (an ordered call run or failed activates the
// named calls behind it).
func (m *matcher[C]) recount() {
	if m.named == 0 && len(m.active) == 0 {
		return
	}
	clear(m.active)
	n := 0
	for l := range m.slots {
		q := m.slots[l].queue
		for i := range q {
			if q[i].name != "" {
				n++
			}
		}
		for i := 0; i < len(q) && q[i].name != ""; i++ {
			if m.active == nil {
				m.active = make(map[string]int)
			}
			m.active[q[i].name]++
		}
	}
	m.named = n
}

// readyCalls appends rank 0's calls of the names active on every rank,
// in the order rank 0 made them.
func (m *matcher[C]) readyCalls(dst []queued[C]) []queued[C] {
	if len(m.active) == 0 {
		return dst
	}
	L := len(m.slots)
	q := m.slots[0].queue
	for i := 0; i < len(q) && q[i].name != ""; i++ {
		if m.active[q[i].name] == L {
			dst = append(dst, q[i])
		}
	}
	return dst
}

// stretchClosed reports whether some rank has an ordered call queued:
// its named calls before it are all it will make before the fence.
func (m *matcher[C]) stretchClosed() bool {
	for l := range m.slots {
		if m.activeLen(l) < len(m.slots[l].queue) {
			return true
		}
	}
	return false
}

// namedCall is rank l's active call of name.
func (m *matcher[C]) namedCall(l int, name string) (queued[C], bool) {
	q := m.slots[l].queue
	for i := 0; i < len(q) && q[i].name != ""; i++ {
		if q[i].name == name {
			return q[i], true
		}
	}
	return queued[C]{}, false
}

// takeNamed moves every rank's active call of name (ready: every rank
// has one) into dst, in local-rank order.
func (m *matcher[C]) takeNamed(name string, dst []queued[C]) []queued[C] {
	for l := range m.slots {
		sl := &m.slots[l]
		for i := 0; i < len(sl.queue) && sl.queue[i].name != ""; i++ {
			if sl.queue[i].name == name {
				dst = append(dst, sl.queue[i])
				sl.queue = removeAt(sl.queue, i)
				m.named--
				break
			}
		}
	}
	delete(m.active, name)
	return dst
}

// doomed finds an active name that cannot become ready: rank has it,
// but rank lacks has closed its stretch of named calls without it (an
// ordered call of its waits in its queue).
func (m *matcher[C]) doomed() (name string, has, lacks int, ok bool) {
	if !m.stretchClosed() {
		return "", 0, 0, false
	}
	for name, n := range m.active {
		if n == len(m.slots) {
			continue
		}
		has, lacks = -1, -1
		for l := range m.slots {
			_, in := m.namedCall(l, name)
			switch {
			case in && has < 0:
				has = l
			case !in && lacks < 0 && m.activeLen(l) < len(m.slots[l].queue):
				lacks = l
			}
		}
		if has >= 0 && lacks >= 0 {
			return name, has, lacks, true
		}
	}
	return "", 0, 0, false
}

// failNamed fails the named calls at the head of rank l's queue: with
// err(l) those that came before at, with owed(l) the others (err nil:
// all with owed).
func (m *matcher[C]) failNamed(l int, at time.Time, err, owed func(int) *ipc.Error, dst []failed[C]) []failed[C] {
	sl := &m.slots[l]
	n := m.activeLen(l)
	if n == 0 {
		return dst
	}
	for _, q := range sl.queue[:n] {
		e := owed
		if err != nil && q.at.Before(at) {
			e = err
		}
		dst = append(dst, failed[C]{c: q.c, err: e(l)})
	}
	copy(sl.queue, sl.queue[n:])
	clear(sl.queue[len(sl.queue)-n:])
	sl.queue = sl.queue[:len(sl.queue)-n]
	m.recount()
	return dst
}

func removeAt[T any](q []T, i int) []T {
	var zero T
	copy(q[i:], q[i+1:])
	q[len(q)-1] = zero
	return q[:len(q)-1]
}
