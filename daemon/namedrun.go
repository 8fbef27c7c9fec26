package daemon

import (
	"fmt"
	"strings"
	"time"

	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/ring"
)

// namedEngine is the engine's state for named calls. The scratch is the
// engine goroutine's; the counters and waiting are read by status under
// d.mu.
type namedEngine struct {
	cache    nameCache
	res      roundResult
	block    []byte
	gathered [][]byte
	offers   [][]offer
	ready    []call                     // rank 0's calls of the names ready here, in its order
	descs    []collective.Desc          // their descriptions, offered this round
	firsts   map[string]collective.Desc // the same by name
	byHash   map[uint64]string          // ready names by hash
	// taken are the calls of the names a round runs, taken from the
	// queues, L per name in the round's order; a call answered is
	// cleared, and a failure fails those left with the collective's
	// error.
	taken  []call
	groups []group // the round's ring operations (fusion.go)
	// readySince is when names became ready here without a round since:
	// they wait up to FusionCycle for company.
	readySince time.Time

	// Status, under d.mu.
	rounds, executed, fusedOps uint64
}

// namedFaultLocked finds a name one rank called that another cannot
// call any more (it went on to an ordered call): the node's named calls
// fail before a round. d.mu is held.
func (d *Daemon) namedFaultLocked(r *ring.Ring, seq uint64) error {
	if name, has, lacks, ok := d.match.doomed(); ok {
		c, _ := d.match.namedCall(has, name)
		next := d.match.slots[lacks].queue[d.match.activeLen(lacks)].c.Desc
		return failKind(ring.ErrMismatch, "collective %d of generation %d: %s called %s, but %s made its ordered call %s without calling %q first (an ordered call is a fence for named calls)",
			seq, r.Generation(), d.describeWorldRank(d.worldRank(has)), c.c.Desc, d.describeWorldRank(d.worldRank(lacks)), next, name)
	}
	return nil
}

// checkReadyLocked compares the local ranks' calls of the names about to
// be offered: one node's trainers calling a name differently is a
// mismatch, found before the round. d.mu is held.
func (d *Daemon) checkReadyLocked(r *ring.Ring, seq uint64) error {
	for l := 1; l < len(d.slots); l++ {
		q := d.match.slots[l].queue
		for i := 0; i < len(q) && q[i].name != ""; i++ {
			if first, ok := d.nm.firsts[q[i].name]; ok && !q[i].c.Desc.Equal(first) {
				return failKind(ring.ErrMismatch, "collective %d of generation %d: named call %q: %s called %s but %s called %s",
					seq, r.Generation(), q[i].name, d.describeWorldRank(d.worldRank(0)), first, d.describeWorldRank(d.worldRank(l)), q[i].c.Desc)
			}
		}
	}
	return nil
}

// roundDueLocked tells whether the node should offer its ready names now,
// and if not, how long until it should (0: nothing ready). A name ready
// here waits up to FusionCycle for others to fuse with, unless the ready
// allreduces already fill FusionThreshold. d.mu is held; on true,
// d.nm.ready and d.nm.descs hold the offer, and local ranks' calls of
// them have been compared.
func (d *Daemon) roundDueLocked(r *ring.Ring, seq uint64, now time.Time) (bool, time.Duration, error) {
	nm := &d.nm
	nm.ready = d.match.readyCalls(nm.ready[:0])
	if len(nm.ready) == 0 {
		nm.readySince = time.Time{}
		return false, 0, nil
	}
	if nm.readySince.IsZero() {
		nm.readySince = now
	}
	var bytes uint64
	for _, c := range nm.ready {
		if c.c.Desc.Op == collective.OpAllReduce {
			bytes += c.c.Desc.Bytes()
		}
	}
	waited := now.Sub(nm.readySince)
	if waited < d.cfg.FusionCycle && bytes < uint64(d.cfg.FusionThreshold) {
		return false, d.cfg.FusionCycle - waited, nil
	}
	nm.descs = nm.descs[:0]
	if nm.firsts == nil {
		nm.firsts = make(map[string]collective.Desc)
	}
	clear(nm.firsts)
	for _, c := range nm.ready {
		nm.descs = append(nm.descs, c.c.Desc)
		nm.firsts[c.name] = c.c.Desc
	}
	return true, 0, d.checkReadyLocked(r, seq)
}

// runNamed runs a negotiation round as ring operation seq, then the
// names it found ready everywhere, each a ring operation of its own or
// fused with others (fusion.go). It returns the seq of the last ring
// operation it ran.
func (d *Daemon) runNamed(r *ring.Ring, seq uint64) (uint64, error) {
	nm := &d.nm
	n := len(d.cfg.Peers)
	if cap(nm.block) < roundBlock {
		nm.block = make([]byte, roundBlock)
	}
	block := nm.block[:roundBlock]
	encodeRound(block, &nm.cache, nm.descs)
	if nm.byHash == nil {
		nm.byHash = make(map[uint64]string)
	}
	clear(nm.byHash)
	for _, c := range nm.ready {
		nm.byHash[nameHash(c.name)] = c.name
	}

	var err error
	nm.gathered, err = r.AllGather(negotiateDesc, block, nm.gathered)
	if err != nil {
		return seq, err
	}
	if len(nm.offers) < n {
		nm.offers = make([][]offer, n)
	}
	for j := 0; j < n; j++ {
		if nm.offers[j], err = decodeRound(nm.gathered[j], j, &nm.cache, nm.offers[j][:0]); err != nil {
			return seq, failKind(errInternal, "collective %d of generation %d: %v", seq, r.Generation(), err)
		}
	}
	d.mu.Lock() // status reads nm.res.waiting
	err = intersect(nm.offers[:n], &nm.res)
	d.mu.Unlock()
	if err != nil {
		return seq, failKind(ring.ErrMismatch, "collective %d of generation %d: %v", seq, r.Generation(), err)
	}
	mine := make(map[uint64]bool, len(nm.offers[d.cfg.Rank]))
	for _, o := range nm.offers[d.cfg.Rank] {
		mine[o.hash] = o.cached
	}

	// Take the calls of the names to run, and record them in the cache
	// in the order every node records them.
	d.mu.Lock()
	nm.taken = nm.taken[:0]
	for _, h := range nm.res.run {
		name, ok := nm.byHash[h]
		if !ok {
			d.mu.Unlock()
			return seq, failKind(errInternal, "collective %d of generation %d: a name ready everywhere is not ready here", seq, r.Generation())
		}
		before := len(nm.taken)
		nm.taken = d.match.takeNamed(name, nm.taken)
		nm.cache.record(nm.taken[before].c.Desc, mine[h])
	}
	nm.rounds++
	nm.executed += uint64(len(nm.res.run))
	nm.readySince = time.Time{}
	d.mu.Unlock()

	return d.runTaken(r, seq)
}

// runTaken runs the calls a round took, in the ring operations
// planGroups cuts them into, as ring operations seq+1, seq+2, ...
func (d *Daemon) runTaken(r *ring.Ring, seq uint64) (uint64, error) {
	nm := &d.nm
	L := len(d.slots)
	gen := r.Generation()
	nm.groups = d.planGroups(nm.groups[:0])
	for _, g := range nm.groups {
		seq++
		var err error
		if g.fuse {
			err = d.runFused(r, seq, g)
		} else {
			calls := nm.taken[g.members[0]*L : g.members[0]*L+L]
			d.mu.Lock()
			d.inflight = inflight{active: true, seq: seq, phase: phaseRing, desc: calls[0].c.Desc, since: time.Now()}
			d.mu.Unlock()
			err = d.runOp(r, seq, calls)
		}
		if err != nil {
			return seq, err
		}
		for _, m := range g.members {
			calls := nm.taken[m*L : m*L+L]
			for _, c := range calls {
				c.c.Reply(gen, seq)
			}
			clear(calls)
		}
		if g.fuse {
			d.mu.Lock()
			nm.fusedOps++
			d.mu.Unlock()
		}
	}
	clear(nm.groups)
	nm.taken = nm.taken[:0]
	d.mu.Lock()
	d.inflight = inflight{}
	d.afterLarge = true
	d.mu.Unlock()
	return seq, nil
}

// NamedWaiting is a name some trainers have called and others not, as
// the status document and stall reports show it.
type NamedWaiting struct {
	Name    string       `json:"name"`
	Desc    string       `json:"desc"`
	Called  []int        `json:"called"`            // world ranks that called it
	Missing []MissingOne `json:"missing,omitempty"` // world ranks of this node that have not
	// Nodes: the other nodes that had not offered it in the last round.
	Nodes    []int   `json:"waiting_for_nodes,omitempty"`
	WaitedMS float64 `json:"waited_ms,omitempty"`
}

// MissingOne is a world rank of this node that has not called a name.
type MissingOne struct {
	WorldRank int   `json:"world_rank"`
	PID       int32 `json:"pid,omitempty"`
}

// waitingLocked lists the names waiting on this node or known from the
// last round's offers to wait elsewhere. d.mu is held.
func (d *Daemon) waitingLocked(dst []NamedWaiting) []NamedWaiting {
	L := len(d.slots)
	seen := map[string]bool{}
	now := time.Now()
	add := func(name, desc string, since time.Time, nodes []int) {
		if seen[name] {
			return
		}
		seen[name] = true
		w := NamedWaiting{Name: name, Desc: desc, Nodes: nodes}
		for l := 0; l < L; l++ {
			if _, ok := d.match.namedCall(l, name); ok {
				w.Called = append(w.Called, d.worldRank(l))
			} else {
				w.Missing = append(w.Missing, MissingOne{WorldRank: d.worldRank(l), PID: d.slots[l].pid})
			}
		}
		if !since.IsZero() {
			w.WaitedMS = float64(now.Sub(since).Microseconds()) / 1000
		}
		dst = append(dst, w)
	}
	for l := 0; l < L; l++ {
		q := d.match.slots[l].queue
		for i := 0; i < len(q) && q[i].name != ""; i++ {
			var nodes []int
			if w, ok := d.nm.res.waiting[nameHash(q[i].name)]; ok {
				for j, off := range w.offers {
					if !off && j != d.cfg.Rank {
						nodes = append(nodes, j)
					}
				}
			}
			add(q[i].name, q[i].c.Desc.String(), q[i].at, nodes)
		}
	}
	// Names other nodes offered that no trainer here has called.
	for _, w := range d.nm.res.waiting {
		if w.offers[d.cfg.Rank] || seen[w.o.name] {
			continue
		}
		var nodes []int
		for j, off := range w.offers {
			if !off && j != d.cfg.Rank {
				nodes = append(nodes, j)
			}
		}
		add(w.o.name, w.o.describe(), time.Time{}, nodes)
	}
	return dst
}

// namedStallLocked is the stall report of named calls: which names wait,
// and for whom. d.mu is held.
func (d *Daemon) namedStallLocked() string {
	var b strings.Builder
	for i, w := range d.waitingLocked(nil) {
		if i == 8 {
			b.WriteString("; ...")
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%q waits for", w.Name)
		sep := " "
		for _, m := range w.Missing {
			fmt.Fprintf(&b, "%sworld rank %d (node %d, pid %d)", sep, m.WorldRank, d.cfg.Rank, m.PID)
			sep = ", "
		}
		for _, n := range w.Nodes {
			fmt.Fprintf(&b, "%s%s", sep, d.describeNode(n))
			sep = ", "
		}
		if sep == " " {
			b.WriteString(" the other nodes' next round")
		}
	}
	return b.String()
}
