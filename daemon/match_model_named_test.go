package daemon

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/ipc"
)

// The model test of named calls (docs/MATCHING.md, "Named calls"): N
// nodes of L trainers, as in match_model_test.go, but each training step
// is a plan shared by every trainer: stretches of named calls, each closed
// by an ordered call (a fence). Every trainer makes a stretch's named calls
// in an order of its own, several in flight, one call of a name at a time.
// Each node drives its matcher as the engine does (waitLocal, runNamed,
// runTaken, fail, form): an ordered collective when every local rank is at
// an ordered call, else the named-call faults (namedFaultLocked), else a
// negotiation round of the names ready here, encoded, decoded and
// intersected with the real encodeRound, decodeRound and intersect against
// the node's real nameCache, then the names ready everywhere, each a ring
// operation. Rounds and named calls are ring operations like ordered
// collectives: every node must enter the same one, and the ring compares
// the nodes' descriptions.
//
// Faults: a trainer (or every trainer of a node) calling a name with
// another description, calling another name in its place, or going on to
// its ordered call without a name (a fence mismatch); an ordered call
// that differs; late starts, trainer and node kills, timeouts and the
// ring down. After every event it checks:
//
//	(a) a named call's result comes only from the calls of its place in
//	    the plan (the same step, stretch and name, and incarnation) on
//	    every trainer, an ordered call's only from the same ordered call;
//	    the nodes' response caches stay equal (so every node, decoding
//	    a round's blocks against its own, finds the same names to run);
//	(b) every trainer's call of one place in the plan gets the same
//	    outcome: all succeed, or all fail with the same code;
//	(c) once the faults stop, every trainer's last step completes.
//
// -match.named.seed=S replays one seed with its event log;
// -match.named.seeds=N runs N seeds.
var (
	namedSeeds = flag.Int("match.named.seeds", 1000, "named model test: seeds to run")
	namedSeed  = flag.Uint64("match.named.seed", 0, "named model test: run this seed only, logging its events")
)

func TestMatchModelNamed(t *testing.T) {
	if *namedSeed != 0 {
		if err := runNamedModel(*namedSeed, t.Logf); err != nil {
			t.Fatal(err)
		}
		return
	}
	n := *namedSeeds
	if testing.Short() {
		n = min(n, 100)
	}
	failures := 0
	for seed := uint64(1); seed <= uint64(n); seed++ {
		if err := runNamedModel(seed, nil); err != nil {
			t.Errorf("seed %d: %v (replay: go test ./daemon -run TestMatchModelNamed -match.named.seed=%d -v)", seed, err, seed)
			if failures++; failures == 5 {
				t.Fatal("stopping after 5 failing seeds")
			}
		}
	}
}

// ncall is one call of a model trainer: its place in the plan (epoch,
// step, idx) and what it called.
type ncall struct {
	rank, epoch, step, idx int
	desc                   collective.Desc
}

func (c *ncall) String() string {
	return fmt.Sprintf("rank %d's step %d #%d (epoch %d) %s", c.rank, c.step, c.idx, c.epoch, c.desc)
}

// A trainer's planned deviation from the plan at one call.
const (
	fOdd    = iota // the call differs in its description
	fRename        // a named call with another name
	fSkip          // a named call left out: the trainer goes on without it
)

type nfault struct {
	kind int
	idx  int
	desc collective.Desc
}

type ntrainer struct {
	rank, node, l int
	epoch         int
	owner         *int
	attachAt      time.Time
	step, pos     int      // its next call: order[pos] of step
	order         []int    // step's plan entries in the order it calls them; nil: not drawn yet
	dev           []nfault // its deviations in step
	inflight      int
	maxInflight   int
	names         map[string]bool // named calls in flight
	results       map[[3]int]outcome
}

// The ring operations a node can be in.
const (
	opOrdered = iota
	opRound
	opNamed
)

type nnode struct {
	m     *matcher[*ncall]
	cache nameCache
	in    bool            // inside the ring's current operation
	kind  int             // which
	desc  collective.Desc // its description, as the ring compares it
	heads []queued[*ncall]
	// A round's offer, as runNamed keeps it.
	ready []string
	block []byte
	// The calls of the names the last round found ready everywhere, run
	// one ring operation each (runTaken); answered: those done.
	taken    []queued[*ncall]
	answered int
	// readySince: when names became ready here without a round since;
	// a round is due a fusion cycle later (roundDueLocked).
	readySince time.Time
}

func (nd *nnode) pending() bool { return nd.answered < len(nd.taken) }

type nmodel struct {
	rng        *rand.Rand
	logf       func(string, ...any)
	now        time.Time
	n, l       int
	steps      int
	quietAt    int
	bound      time.Duration
	stretches  int           // at most this many stretches a step
	width      int           // at most this many names a stretch
	full       bool          // every stretch calls width names
	mirror     bool          // trainers of even nodes call in the plan's order, of odd nodes in reverse
	cycle      time.Duration // fusion.cycle
	pool       []collective.Desc
	plan       [][]collective.Desc // each step's calls: stretches of named calls, each closed by an ordered call
	nodes      []*nnode
	trainers   []*ntrainer
	ringUp     bool
	gen        int
	firstIn    time.Time
	epoch      int
	deviate    map[[3]int][]nfault // (epoch, rank, step)
	faults     bool
	restarting bool
	err        error
	first      map[[3]int]ranked // (epoch, step, idx)
	acts       []nact
	scratch    []string
}

func runNamedModel(seed uint64, logf func(string, ...any)) error {
	rng := rand.New(rand.NewPCG(seed, seed^0x6a09e667f3bcc908))
	md := &nmodel{rng: rng, logf: logf, now: time.Unix(1e9, 0), n: 1 + rng.IntN(4), l: 1 + rng.IntN(3),
		steps: 6 + rng.IntN(8), bound: time.Duration(1+rng.IntN(5)) * time.Second, faults: true,
		stretches: 1 + rng.IntN(3), width: 1 + rng.IntN(5), deviate: map[[3]int][]nfault{}, first: map[[3]int]ranked{}}
	if rng.IntN(40) == 0 {
		// Wide: every stretch calls more names than two rounds' entries
		// hold (roundEntries), so that a generation's first rounds
		// leave some for the next (with mirrored orders, nodes whose
		// trainers call in opposite orders must still offer names in
		// common), and the cache then carries them all as bits. A long
		// fusion cycle lets whole stretches become ready before a round.
		md.n, md.l, md.stretches, md.width, md.steps = 1+rng.IntN(2), 1, 1, 2*roundEntries+rng.IntN(16), 4+rng.IntN(3)
		md.full, md.cycle = true, []time.Duration{50 * time.Millisecond, 200 * time.Millisecond}[rng.IntN(2)]
	}
	md.mirror = rng.IntN(5) == 0
	switch rng.IntN(4) {
	case 0:
	case 1:
		md.cycle = max(md.cycle, 20*time.Millisecond)
	default:
		md.cycle = max(md.cycle, time.Millisecond)
	}
	md.quietAt = md.steps - 3
	long := rng.IntN(4) == 0 // names longer than a round's entry shows
	for i := 0; i < md.width+rng.IntN(4); i++ {
		name := fmt.Sprintf("w%d", i)
		if long {
			name = strings.Repeat("layer.", 20) + name
		}
		md.pool = append(md.pool, md.poolDesc(name))
	}
	md.logEvent("world %d x %d, %d steps, bound %v, fusion cycle %v, %d names, stretches <= %d of <= %d names, mirrored orders %v",
		md.n, md.l, md.steps, md.bound, md.cycle, len(md.pool), md.stretches, md.width, md.mirror)
	for i := 0; i < md.n; i++ {
		md.nodes = append(md.nodes, &nnode{m: newMatcher[*ncall](md.l)})
	}
	for r := 0; r < md.n*md.l; r++ {
		// In flight: a whole stretch and the fence before it, so that
		// trainers calling in different orders never wait on each other
		// (fewer would be the application's deadlock, not the daemon's).
		md.trainers = append(md.trainers, &ntrainer{rank: r, node: r / md.l, l: r % md.l,
			maxInflight: md.width + 2 + rng.IntN(3), names: map[string]bool{}, results: map[[3]int]outcome{}})
	}
	md.newEpoch()
	for i := 0; i < 1500 && md.err == nil; i++ {
		md.step()
	}
	md.quiet()
	for i := 0; i < 400000 && md.err == nil && !md.allDone(); i++ {
		md.step()
	}
	if md.err == nil && !md.allDone() {
		md.err = fmt.Errorf("(c): the trainers never all finished once the faults stopped: %s", md.progress())
	}
	if md.err == nil {
		md.checkLastSteps()
	}
	return md.err
}

// quiet stops the faults: no kill, no new deviation; those planned for
// steps no trainer has begun are dropped. The clock still moves (a name
// only some trainers call is found by a timeout). A failure can then still
// come from a deviation a trainer has begun, and a node times out at once
// the calls its trainers made while the world waited (a call waits its
// bound from its arrival): a run of failures no longer than a trainer's
// calls in flight. So the steps go on past all of that, and the last must
// complete.
func (md *nmodel) quiet() {
	md.faults = false
	most, begun, depth := 0, 0, 0
	for _, t := range md.trainers {
		t.attachAt = md.now
		most = max(most, t.step+md.nodes[t.node].m.owes(t.l))
		begun = max(begun, t.step)
		depth = max(depth, t.maxInflight)
	}
	last := 0
	for key := range md.deviate {
		switch {
		case key[0] != md.epoch:
		case key[2] > begun:
			delete(md.deviate, key)
		default:
			last = max(last, key[2]+1)
		}
	}
	perStep := 1 // the fewest calls a step makes
	if md.full {
		perStep = md.width + 1
	}
	md.steps = max(md.steps, most, last) + depth/perStep + 4
	md.logEvent("faults stop; %d steps", md.steps)
}

func (md *nmodel) logEvent(format string, args ...any) {
	if md.logf != nil {
		md.logf("%s "+format, append([]any{md.now.Sub(time.Unix(1e9, 0))}, args...)...)
	}
}

func (md *nmodel) failf(format string, args ...any) {
	if md.err == nil {
		md.err = fmt.Errorf(format, args...)
	}
}

// poolDesc is name's usual call.
func (md *nmodel) poolDesc(name string) collective.Desc {
	d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: uint64(1 + md.rng.IntN(8))}
	switch md.rng.IntN(5) {
	case 1:
		d = collective.Desc{Op: collective.OpBroadcast, DType: collective.Bytes, Count: 4, Root: uint32(md.rng.IntN(md.n * md.l))}
	case 2:
		d = collective.Desc{Op: collective.OpAllGather, DType: collective.Int32, Count: 2}
	case 3:
		d = collective.Desc{Op: collective.OpBarrier}
	case 4:
		d = collective.Desc{Op: collective.OpAllReduce, DType: collective.Int64, Reduce: collective.Max, Count: 3}
	}
	d.Named, d.Name = true, name
	return d
}

// planStep is step s's plan, drawn when first needed.
func (md *nmodel) planStep(s int) []collective.Desc {
	for len(md.plan) <= s {
		var st []collective.Desc
		for range 1 + md.rng.IntN(md.stretches) {
			k := md.rng.IntN(min(md.width, len(md.pool)) + 1)
			if md.full {
				k = md.width
			}
			for _, p := range md.rng.Perm(len(md.pool))[:k] {
				d := md.pool[p]
				if d.Op != collective.OpBarrier && md.rng.IntN(10) == 0 {
					d.Count++ // the name called with another description this step: the cache's entry is replaced
				}
				st = append(st, d)
			}
			fence := baseDesc
			if md.rng.IntN(3) == 0 {
				fence = collective.Desc{Op: collective.OpBarrier}
			}
			st = append(st, fence)
		}
		md.plan = append(md.plan, st)
	}
	return md.plan[s]
}

// newEpoch (re)starts every trainer, as in the ordered model, and plans a
// few deviations of this incarnation's calls.
func (md *nmodel) newEpoch() {
	md.epoch++
	for _, t := range md.trainers {
		t.epoch, t.step, t.pos, t.order, t.inflight, t.owner = md.epoch, 0, 0, nil, 0, nil
		clear(t.names)
		late := time.Duration(md.rng.IntN(300)) * time.Millisecond
		if md.rng.IntN(4) == 0 {
			late += time.Duration(md.rng.IntN(4)) * md.bound
		}
		t.attachAt = md.now.Add(late)
	}
	if md.faults {
		for _, t := range md.trainers {
			if md.rng.IntN(3) != 0 {
				continue
			}
			step := md.rng.IntN(md.quietAt)
			st := md.planStep(step)
			idx := md.rng.IntN(len(st))
			f := nfault{kind: fOdd, idx: idx, desc: md.oddOf(st[idx])}
			if st[idx].Named {
				switch md.rng.IntN(3) {
				case 1:
					f.kind, f.desc = fRename, st[idx]
					f.desc.Name = fmt.Sprintf("stray.%d.%d", t.rank, step)
				case 2:
					f.kind = fSkip
				}
			}
			ranks := []int{t.rank}
			if md.rng.IntN(4) == 0 {
				// Every trainer of the node: its calls agree, and the
				// nodes' differ (intersect, the ring).
				ranks = ranks[:0]
				for l := range md.l {
					ranks = append(ranks, t.node*md.l+l)
				}
			}
			for _, r := range ranks {
				key := [3]int{md.epoch, r, step}
				md.deviate[key] = append(md.deviate[key], f)
			}
		}
	}
	md.logEvent("epoch %d", md.epoch)
}

// oddOf is d differing in one field.
func (md *nmodel) oddOf(d collective.Desc) collective.Desc {
	switch md.rng.IntN(4) {
	case 0:
		d.Count += 1 + uint64(md.rng.IntN(3))
	case 1:
		d.Op, d.DType, d.Reduce, d.Count, d.Root = collective.OpAllReduce, collective.Float64, collective.Sum, 1, 0
	case 2:
		d.Op, d.DType, d.Reduce, d.Count, d.Root = collective.OpBroadcast, collective.Bytes, collective.ReduceNone, 4, 1
	default:
		if d.Op == collective.OpBarrier {
			d.Op, d.DType, d.Reduce, d.Count = collective.OpAllGather, collective.Int32, collective.ReduceNone, 2
		} else {
			d.DType = collective.Int8
		}
	}
	return d
}

// drawOrder draws the order in which t makes its current step's calls:
// each stretch's named calls shuffled, then its fence.
func (md *nmodel) drawOrder(t *ntrainer) {
	st := md.planStep(t.step)
	t.dev = md.deviate[[3]int{t.epoch, t.rank, t.step}]
	skip := func(idx int) bool {
		for _, f := range t.dev {
			if f.kind == fSkip && f.idx == idx {
				return true
			}
		}
		return false
	}
	t.order = t.order[:0]
	for i := 0; i < len(st); {
		j := i
		for st[j].Named {
			j++
		}
		perm := md.rng.Perm(j - i)
		if md.mirror {
			for k := range perm {
				perm[k] = k
				if t.node%2 == 1 {
					perm[k] = j - i - 1 - k
				}
			}
		}
		for _, p := range perm {
			if !skip(i + p) {
				t.order = append(t.order, i+p)
			}
		}
		t.order = append(t.order, j)
		i = j + 1
	}
	t.pos = 0
}

// descOf is what t calls at entry idx of its current step.
func (md *nmodel) descOf(t *ntrainer, idx int) collective.Desc {
	d := md.planStep(t.step)[idx]
	for _, f := range t.dev {
		if f.idx == idx && f.kind != fSkip {
			d = f.desc
		}
	}
	return d
}

// next is t's next call, if it may make it now.
func (md *nmodel) next(t *ntrainer) (idx int, d collective.Desc, ok bool) {
	if t.owner == nil || t.step >= md.steps || t.inflight >= t.maxInflight {
		return 0, d, false
	}
	if t.order == nil {
		md.drawOrder(t)
	}
	idx = t.order[t.pos]
	d = md.descOf(t, idx)
	if d.Named && t.names[d.Name] {
		return 0, d, false // its earlier call of the name is still in flight
	}
	return idx, d, true
}

// The model's actions, as step draws them.
const (
	aAttach = iota
	aCall
	aEngine
	aForm
	aTick
	aKillJob
	aKillNode
)

type nact struct{ kind, i int }

func (md *nmodel) step() {
	acts := md.acts[:0]
	for r, t := range md.trainers {
		if t.owner == nil && !md.now.Before(t.attachAt) && !md.restarting {
			acts = append(acts, nact{aAttach, r})
		}
		if _, _, ok := md.next(t); ok {
			acts = append(acts, nact{aCall, r})
		}
	}
	if md.ringUp {
		for i := range md.nodes {
			if md.canRun(i) {
				acts = append(acts, nact{aEngine, i})
			}
		}
	} else {
		acts = append(acts, nact{aForm, 0})
	}
	acts = append(acts, nact{aTick, 0})
	if md.faults {
		if md.rng.IntN(60) == 0 && md.allAttachedOnce() {
			acts = append(acts, nact{aKillJob, 0})
		}
		if md.rng.IntN(120) == 0 {
			acts = append(acts, nact{aKillNode, md.rng.IntN(md.n)})
		}
	}
	md.acts = acts
	switch a := acts[md.rng.IntN(len(acts))]; a.kind {
	case aAttach:
		md.attach(md.trainers[a.i])
	case aCall:
		md.call(md.trainers[a.i])
	case aEngine:
		md.engine(a.i)
	case aForm:
		md.form()
	case aTick:
		md.tick()
	case aKillJob:
		md.killJob()
	case aKillNode:
		md.killNode(a.i)
	}
}

func (md *nmodel) attach(t *ntrainer) {
	t.owner = new(int)
	md.nodes[t.node].m.attach(t.l, t.owner)
	md.logEvent("rank %d attaches (epoch %d)", t.rank, t.epoch)
}

// call makes t's next call as the socket handler takes it (Call,
// callNamed).
func (md *nmodel) call(t *ntrainer) {
	idx, d, _ := md.next(t)
	c := &ncall{rank: t.rank, epoch: t.epoch, step: t.step, idx: idx, desc: d}
	t.inflight++
	if t.pos++; t.pos == len(t.order) {
		t.step, t.order = t.step+1, nil
	}
	nd := md.nodes[t.node]
	if !d.Named {
		if e := nd.m.payDebt(t.l); e != nil {
			md.logEvent("%s pays a debt: %s", c, e.Code)
			md.deliver(c, outcome{code: e.Code, from: "debt: " + e.Message})
			return
		}
		nd.m.enqueue(t.l, c, md.now)
		md.logEvent("%s", c)
		return
	}
	t.names[d.Name] = true
	if nd.m.inFlight(t.l, d.Name) {
		md.failf("model: %s while its call of the name is queued", c)
		return
	}
	if e := nd.m.peekDebt(t.l); e != nil {
		md.logEvent("%s fails: the rank owes %s", c, e.Code)
		md.deliver(c, outcome{code: e.Code, from: "owes: " + e.Message})
		return
	}
	nd.m.enqueueNamed(t.l, d.Name, c, md.now)
	md.logEvent("%s", c)
}

func (md *nmodel) deliver(c *ncall, o outcome) {
	t := md.trainers[c.rank]
	if t.epoch != c.epoch || t.owner == nil {
		return
	}
	t.inflight--
	if c.desc.Named {
		delete(t.names, c.desc.Name)
	}
	key := [3]int{c.epoch, c.step, c.idx}
	if _, dup := t.results[key]; dup {
		md.failf("%s got two outcomes", c)
	}
	t.results[key] = o
	md.checkB(key, c.rank, o)
}

// checkB: every trainer's outcome of one place in the plan agrees.
func (md *nmodel) checkB(key [3]int, rank int, o outcome) {
	first, ok := md.first[key]
	if !ok {
		md.first[key] = ranked{o, rank}
		return
	}
	if o.ok != first.ok || o.code != first.code {
		md.failf("(b): step %d #%d (%s) of epoch %d: rank %d got ok=%v %s (%s), rank %d got ok=%v %s (%s)",
			key[1], key[2], md.planStep(key[1])[key[2]], key[0], first.rank, first.ok, first.code, first.from, rank, o.ok, o.code, o.from)
	}
}

// ranked is the first outcome of a place in the plan, and its trainer.
type ranked struct {
	outcome
	rank int
}

// canRun tells whether node i's engine has a ring operation to enter, or
// a fault to fail on (waitLocal's decisions).
func (md *nmodel) canRun(i int) bool {
	nd := md.nodes[i]
	if nd.in {
		return false
	}
	if nd.pending() {
		return true
	}
	if ready, _, _ := nd.m.heads(); ready {
		return true
	}
	if nd.m.named == 0 {
		return false
	}
	if _, _, _, doomed := nd.m.doomed(); doomed {
		return true
	}
	md.scratch = nd.m.readyNames(md.scratch[:0])
	if len(md.scratch) == 0 {
		nd.readySince = time.Time{}
		return false
	}
	if nd.readySince.IsZero() {
		nd.readySince = md.now
	}
	return md.now.Sub(nd.readySince) >= md.cycle
}

// namedFault is namedFaultLocked's verdict.
func namedFault(m *matcher[*ncall]) (string, bool) {
	if name, has, lacks, ok := m.doomed(); ok {
		return fmt.Sprintf("local rank %d called %q, local rank %d made its ordered call without it", has, name, lacks), true
	}
	for _, name := range m.readyNames(nil) {
		first, _ := m.namedCall(0, name)
		for l := 1; l < len(m.slots); l++ {
			if c, _ := m.namedCall(l, name); !c.c.desc.Equal(first.c.desc) {
				return fmt.Sprintf("named call %q differs: %s, %s", name, first.c, c.c), true
			}
		}
	}
	return "", false
}

// engine is one turn of node i's engine loop: it enters the next ring
// operation (a named call a round took, an ordered collective, a round),
// or fails on a fault found among its trainers' calls.
func (md *nmodel) engine(i int) {
	nd := md.nodes[i]
	L := md.l
	switch ready, _, _ := nd.m.heads(); {
	case nd.pending():
		calls := nd.taken[nd.answered : nd.answered+L]
		for _, c := range calls[1:] {
			if !c.c.desc.Equal(calls[0].c.desc) {
				md.logEvent("node %d: local mismatch in a named call it took", i)
				md.abort(kMismatch)
				return
			}
		}
		nd.enter(opNamed, calls[0].c.desc)
		md.logEvent("node %d enters named call %q", i, calls[0].c.desc.Name)
	case ready:
		nd.heads = nd.m.popHeads(nd.heads)
		for _, h := range nd.heads[1:] {
			if !h.c.desc.Equal(nd.heads[0].c.desc) {
				md.logEvent("node %d: local mismatch: %s, %s", i, nd.heads[0].c, h.c)
				md.abort(kMismatch)
				return
			}
		}
		nd.enter(opOrdered, nd.heads[0].c.desc)
		md.logEvent("node %d enters ordered %s", i, nd.heads[0].c.desc)
	default:
		if why, bad := namedFault(nd.m); bad {
			md.logEvent("node %d: named calls fail: %s", i, why)
			md.abort(kMismatch)
			return
		}
		nd.ready = nd.m.readyNames(nd.ready[:0])
		descs := make([]collective.Desc, len(nd.ready))
		for k, name := range nd.ready {
			c, _ := nd.m.namedCall(0, name)
			descs[k] = c.c.desc
		}
		if cap(nd.block) < roundBlock {
			nd.block = make([]byte, roundBlock)
		}
		nd.block = nd.block[:roundBlock]
		offered := encodeRound(nd.block, &nd.cache, descs)
		nd.enter(opRound, negotiateDesc)
		nd.readySince = time.Time{}
		md.logEvent("node %d enters a round offering %d of %v", i, offered, nd.ready)
	}
	if !md.anyOtherIn(i) {
		md.firstIn = md.now
	}
	for _, o := range md.nodes {
		if !o.in {
			return
		}
	}
	md.complete()
}

func (nd *nnode) enter(kind int, d collective.Desc) { nd.in, nd.kind, nd.desc = true, kind, d }

func (md *nmodel) anyOtherIn(i int) bool {
	for j, o := range md.nodes {
		if j != i && o.in {
			return true
		}
	}
	return false
}

// complete ends the ring operation every node has entered.
func (md *nmodel) complete() {
	d0 := md.nodes[0].desc
	for _, o := range md.nodes {
		if !o.desc.Equal(d0) {
			md.logEvent("the ring finds a mismatch: %s, %s", d0, o.desc)
			md.abort(kMismatch)
			return
		}
		if o.kind != md.nodes[0].kind {
			md.failf("model: nodes in ring operations of different kinds with one description %s", d0)
			return
		}
	}
	switch md.nodes[0].kind {
	case opOrdered:
		var calls []*ncall
		for _, o := range md.nodes {
			for _, h := range o.heads {
				calls = append(calls, h.c)
			}
		}
		if !md.checkA(calls, false) {
			return
		}
		md.logEvent("ordered collective completes: %s", calls[0])
		for _, o := range md.nodes {
			clear(o.heads)
			o.heads, o.in = o.heads[:0], false
			o.m.completed()
		}
		for _, c := range calls {
			md.deliver(c, outcome{ok: true, from: "completed"})
		}
	case opNamed:
		var calls []*ncall
		for _, o := range md.nodes {
			for _, h := range o.taken[o.answered : o.answered+md.l] {
				calls = append(calls, h.c)
			}
		}
		if !md.checkA(calls, true) {
			return
		}
		md.logEvent("named call completes: %s", calls[0])
		for _, o := range md.nodes {
			o.answered += md.l
			if !o.pending() {
				clear(o.taken)
				o.taken, o.answered = o.taken[:0], 0
			}
			o.in = false
		}
		for _, c := range calls {
			md.deliver(c, outcome{ok: true, from: "completed"})
		}
	case opRound:
		md.round()
	}
}

// checkA: (a), the calls one ring operation combined are one place in
// the plan.
func (md *nmodel) checkA(calls []*ncall, named bool) bool {
	c0 := calls[0]
	for _, c := range calls {
		if c.epoch != c0.epoch || c.step != c0.step || c.idx != c0.idx || c.desc.Named != named || c.desc.Name != c0.desc.Name {
			md.failf("(a): one ring operation combined %s and %s", c0, c)
			return false
		}
	}
	if len(calls) != md.n*md.l {
		md.failf("model: a ring operation of %d calls in a world of %d", len(calls), md.n*md.l)
		return false
	}
	return true
}

// round ends a negotiation round as runNamed does on every node: decode
// every node's block, intersect, take the names ready everywhere and
// record them in the cache. Every node decodes the blocks against its own
// cache; the model checks after every round that the caches are equal
// (equalCaches), so it decodes once, against node 0's.
func (md *nmodel) round() {
	n := len(md.nodes)
	offers := make([][]offer, n)
	for j, o := range md.nodes {
		var err error
		if offers[j], err = decodeRound(o.block, j, &md.nodes[0].cache, nil); err != nil {
			md.failf("decoding node %d's block: %v", j, err)
			return
		}
	}
	var res roundResult
	if err := intersect(offers, &res); err != nil {
		md.logEvent("the round finds a mismatch: %v", err)
		md.abort(kMismatch)
		return
	}
	byHash := map[uint64]string{}
	for i, nd := range md.nodes {
		mine := map[uint64]bool{}
		for _, o := range offers[i] {
			mine[o.hash] = o.cached
		}
		clear(byHash)
		for _, name := range nd.ready {
			byHash[nameHash(name)] = name
		}
		nd.taken, nd.answered = nd.taken[:0], 0
		for _, h := range res.run {
			name, ok := byHash[h]
			if !ok {
				md.failf("node %d: a name the round runs is not ready there", i)
				return
			}
			before := len(nd.taken)
			nd.taken = nd.m.takeNamed(name, nd.taken)
			if len(nd.taken)-before != md.l {
				md.failf("node %d: took %d calls of %q, %d ranks", i, len(nd.taken)-before, name, md.l)
				return
			}
			nd.cache.record(nd.taken[before].c.desc, mine[h])
		}
		nd.in = false
	}
	for i, nd := range md.nodes {
		if !equalCaches(&nd.cache, &md.nodes[0].cache) {
			md.failf("(a): the caches of nodes 0 and %d differ after a round", i)
			return
		}
	}
	var names []string
	for k := 0; k < len(md.nodes[0].taken); k += md.l {
		names = append(names, md.nodes[0].taken[k].c.desc.Name)
	}
	c := &md.nodes[0].cache
	md.logEvent("round: run %v (cache: %d names, %d hits, %d misses, %d invalidations)", names, len(c.entries), c.hits, c.misses, c.invalidations)
}

// equalCaches: two nodes' caches give every name the same bit and
// description, and agree in generation.
func equalCaches(a, b *nameCache) bool {
	if a.assigned != b.assigned || len(a.entries) != len(b.entries) || len(a.index) != len(b.index) {
		return false
	}
	for k := range a.entries {
		x, y := &a.entries[k], &b.entries[k]
		if x.fp != y.fp || x.hash != y.hash || !x.desc.Equal(y.desc) || a.index[x.desc.Name] != k || b.index[y.desc.Name] != k {
			return false
		}
	}
	return true
}

// abort fails the ring's current operation on every node, as the engine's
// fail does after the abort frame: calls a round took and had not run get
// the error, then the matcher fails the rest.
func (md *nmodel) abort(kind int) {
	inOp := false
	for _, o := range md.nodes {
		inOp = inOp || o.in
	}
	code := kindCodes[kind]
	for i, nd := range md.nodes {
		msg := fmt.Sprintf("collective failed (%s) seen by node %d", code, i)
		inNamed := nd.pending()
		if inNamed {
			md.logEvent("node %d: %d calls a round took fail", i, len(nd.taken)-nd.answered)
		}
		for _, c := range nd.taken[nd.answered:] {
			md.deliver(c.c, outcome{code: code, from: msg + " (taken)"})
		}
		clear(nd.taken)
		nd.taken, nd.answered = nd.taken[:0], 0
		begun := inOp || kind != kPeerLost
		if kind == kPeerLost && md.rng.IntN(3) == 0 {
			begun = false
		}
		fs := nd.m.fail(nd.heads, failure{at: md.now, begun: begun || inNamed, restart: kind == kTrainerLost || kind == kPeerLost,
			err:  func(int) *ipc.Error { return ipc.Errorf(code, "%s", msg) },
			owed: func(int) *ipc.Error { return ipc.Errorf(code, "owed: %s", msg) }}, nil)
		for _, f := range fs {
			md.deliver(f.c, outcome{code: f.err.Code, from: f.err.Message})
		}
		clear(nd.heads)
		nd.heads, nd.in, nd.readySince = nd.heads[:0], false, time.Time{}
	}
	md.ringUp = false
	md.logEvent("ring aborted: %s", code)
}

func (md *nmodel) form() {
	agreed, fresh, stale, vacated := uint64(0), false, false, false
	for _, nd := range md.nodes {
		agreed = max(agreed, nd.m.finished)
		fresh = fresh || nd.m.fresh
		stale = stale || !nd.m.fresh
		vacated = vacated || nd.m.vacated
	}
	for i, nd := range md.nodes {
		behind := nd.m.finished
		md.logEvent("node %d at %d (vacated %v, queued %v)", i, behind, nd.m.vacated, nd.m.anyQueued())
		nd.cache.reset()
		fs := nd.m.formed(agreed, fresh && stale, vacated, func(int, uint64) *ipc.Error {
			return ipc.Errorf(ipc.CodePeerLost, "node %d was behind (%d of %d)", i, behind, agreed)
		}, nil)
		if len(fs) > 0 {
			md.logEvent("node %d was behind: %d queued calls fail", i, len(fs))
		}
		for _, f := range fs {
			md.deliver(f.c, outcome{code: f.err.Code, from: f.err.Message})
		}
	}
	md.ringUp = true
	md.restarting = false
	md.gen++
	md.logEvent("generation %d forms at %d", md.gen, agreed)
}

// tick moves the clock and fires the timeouts that are due, as in the
// ordered model; a node inside a ring operation, or running the names a
// round took, waits for the ring, not for its trainers.
func (md *nmodel) tick() {
	d := time.Duration(1+md.rng.IntN(20)) * time.Millisecond
	if !md.faults {
		// Slow enough that a fault planned before the faults stopped
		// and found only by a timeout (a name nobody else calls) is,
		// fast enough that no call waits its bound for a trainer's turn.
		d = time.Millisecond
	} else if md.rng.IntN(10) == 0 {
		d = time.Duration(md.rng.Int64N(int64(2 * md.bound)))
	}
	md.now = md.now.Add(d)
	if !md.ringUp {
		for i, nd := range md.nodes {
			for {
				_, oldest, any := nd.m.heads()
				if !any || md.now.Sub(oldest) < md.bound {
					break
				}
				fs := nd.m.fail(nil, failure{at: md.now, begun: true,
					err:  func(int) *ipc.Error { return ipc.Errorf(ipc.CodePeerLost, "node %d: ring down", i) },
					owed: func(int) *ipc.Error { return ipc.Errorf(ipc.CodePeerLost, "owed: node %d: ring down", i) }}, nil)
				for _, f := range fs {
					md.deliver(f.c, outcome{code: f.err.Code, from: f.err.Message})
				}
				md.logEvent("node %d expires a collective while the ring is down", i)
			}
		}
		return
	}
	for i, nd := range md.nodes {
		if nd.in || nd.pending() {
			continue
		}
		_, oldest, any := nd.m.heads()
		peerIn := md.anyOtherIn(i)
		if (any && md.now.Sub(oldest) >= md.bound) || (!any && peerIn && md.now.Sub(md.firstIn) >= md.bound) {
			md.logEvent("node %d times out", i)
			md.abort(kTimeout)
			return
		}
	}
}

func (md *nmodel) killJob() {
	lost := false
	for _, t := range md.trainers {
		if t.owner == nil {
			continue
		}
		nd := md.nodes[t.node]
		lost = nd.m.detach(t.l, t.owner, nd.in || nd.pending()) || lost
		t.owner = nil
	}
	md.logEvent("the job's trainers are killed (lost mid-collective: %v)", lost)
	if lost && md.ringUp {
		md.abort(kTrainerLost)
	} else if lost {
		for _, nd := range md.nodes {
			nd.m.fail(nil, failure{at: md.now, restart: true,
				err:  func(int) *ipc.Error { return ipc.Errorf(ipc.CodeTrainerLost, "lost") },
				owed: func(int) *ipc.Error { return ipc.Errorf(ipc.CodeTrainerLost, "owed: lost") }}, nil)
		}
	}
	md.restarting = !md.ringUp
	md.newEpoch()
}

func (md *nmodel) killNode(i int) {
	md.logEvent("node %d is killed", i)
	if md.ringUp {
		nd := md.nodes[i]
		nd.in, nd.heads, nd.taken, nd.answered = false, nil, nil, 0
		md.abort(kPeerLost)
	}
	for _, t := range md.trainers {
		if t.node == i {
			t.owner = nil
		}
	}
	md.nodes[i] = &nnode{m: newMatcher[*ncall](md.l)}
	md.killJob()
}

func (md *nmodel) allAttachedOnce() bool {
	for _, t := range md.trainers {
		if t.owner == nil && t.step == 0 && t.pos == 0 {
			return false
		}
	}
	return true
}

func (md *nmodel) allDone() bool {
	for _, t := range md.trainers {
		if t.step < md.steps || t.inflight > 0 || t.owner == nil {
			return false
		}
	}
	return true
}

func (md *nmodel) progress() string {
	var b strings.Builder
	for _, t := range md.trainers {
		nd := md.nodes[t.node]
		fmt.Fprintf(&b, "[rank %d epoch %d step %d pos %d inflight %d attached %v owes %d queued %d] ", t.rank, t.epoch, t.step, t.pos,
			t.inflight, t.owner != nil, nd.m.owes(t.l), nd.m.queueLen(t.l))
	}
	for i, nd := range md.nodes {
		fmt.Fprintf(&b, "[node %d in %v kind %d pending %v ready %v] ", i, nd.in, nd.kind, nd.pending(), nd.m.readyNames(nil))
	}
	return b.String()
}

// checkLastSteps: (c), every call of every trainer's last step succeeded.
func (md *nmodel) checkLastSteps() {
	last := md.steps - 1
	for _, t := range md.trainers {
		for idx := range md.planStep(last) {
			if o := t.results[[3]int{t.epoch, last, idx}]; !o.ok {
				md.failf("(c): rank %d's last step's call #%d (epoch %d) failed after the faults stopped: %s %s", t.rank, idx, t.epoch, o.code, o.from)
			}
		}
	}
}
