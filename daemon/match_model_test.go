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

// The model test: N nodes of L trainers each drive one matcher per node,
// as the daemon does, over a simulated ring and a simulated clock, with
// random interleavings, delays, late starts, mismatches in every field,
// trainer and node kills, timeouts and re-formed generations. After
// every step it checks docs/MATCHING.md's invariants:
//
//	(a) a result is computed only from the k-th calls of every trainer:
//	    all calls of a completed collective are the same step of the
//	    same incarnation of the job;
//	(b) the calls of a failed collective fail on every trainer, with
//	    the same code;
//	(c) after any failure the next calls of all trainers meet: once the
//	    faults stop, every trainer's last steps complete.
//
// Every failure names its seed; -match.seed=S replays one seed with its
// event log, -match.seeds=N runs N seeds (make test runs a bounded
// number).
var (
	matchSeeds = flag.Int("match.seeds", 3000, "model test: seeds to run")
	matchSeed  = flag.Uint64("match.seed", 0, "model test: run this seed only, logging its events")
)

func TestMatchModel(t *testing.T) {
	if *matchSeed != 0 {
		if err := runModel(*matchSeed, t.Logf); err != nil {
			t.Fatal(err)
		}
		return
	}
	n := *matchSeeds
	if testing.Short() {
		n = min(n, 300)
	}
	failures := 0
	for seed := uint64(1); seed <= uint64(n); seed++ {
		if err := runModel(seed, nil); err != nil {
			t.Errorf("seed %d: %v (replay: go test ./daemon -run TestMatchModel -match.seed=%d -v)", seed, err, seed)
			if failures++; failures == 5 {
				t.Fatal("stopping after 5 failing seeds")
			}
		}
	}
}

// The model's fault kinds, as the daemon's causes.
const (
	kMismatch = iota
	kTimeout
	kTrainerLost
	kPeerLost
)

var kindCodes = [...]ipc.Code{kMismatch: ipc.CodeMismatch, kTimeout: ipc.CodeTimeout, kTrainerLost: ipc.CodeTrainerLost, kPeerLost: ipc.CodePeerLost}

// mcall is one call of a model trainer.
type mcall struct {
	rank, epoch, step int
	desc              collective.Desc
}

// outcome is what a trainer got for one step.
type outcome struct {
	ok    bool
	code  ipc.Code
	from  string // the event that decided it
	value int    // a success's: the step every call of it made
}

type mtrainer struct {
	rank, node, l int
	epoch         int
	owner         *int // the session token; nil when detached
	attachAt      time.Time
	next          int // its next step
	inflight      int
	maxInflight   int
	results       map[[2]int]outcome // (epoch, step)
}

type mnode struct {
	m         *matcher[*mcall]
	heads     []queued[*mcall]
	submitted bool
	desc      collective.Desc
}

type model struct {
	rng      *rand.Rand
	logf     func(string, ...any)
	now      time.Time
	n, l     int
	steps    int // each trainer calls steps 0..steps-1 per incarnation
	quietAt  int // steps from here on have no mismatch
	bound    time.Duration
	nodes    []*mnode
	trainers []*mtrainer
	ringUp   bool
	gen      int
	firstIn  time.Time // when a node first entered the ring's current op
	epoch    int
	odd      map[[3]int]collective.Desc // (epoch, rank, step) calls that differ
	faults   bool
	// restarting: the job's trainers were killed and come back once the
	// ring has formed again (docs/MATCHING.md: a job restart).
	restarting bool
	err        error
}

func runModel(seed uint64, logf func(string, ...any)) error {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	md := &model{rng: rng, logf: logf, now: time.Unix(1e9, 0), n: 1 + rng.IntN(5), l: 1 + rng.IntN(3),
		steps: 12 + rng.IntN(12), bound: time.Duration(1+rng.IntN(5)) * time.Second, faults: true,
		odd: map[[3]int]collective.Desc{}}
	md.quietAt = md.steps - 3
	md.logEvent("world %d x %d, %d steps, bound %v", md.n, md.l, md.steps, md.bound)
	for i := 0; i < md.n; i++ {
		md.nodes = append(md.nodes, &mnode{m: newMatcher[*mcall](md.l)})
	}
	for r := 0; r < md.n*md.l; r++ {
		md.trainers = append(md.trainers, &mtrainer{rank: r, node: r / md.l, l: r % md.l, maxInflight: 1 + rng.IntN(3),
			results: map[[2]int]outcome{}})
	}
	md.newEpoch()
	// The faulty phase, then a quiet one in which every trainer must get
	// to its last step.
	for i := 0; i < 600 && md.err == nil; i++ {
		md.step()
	}
	// Quiet: no fault, every trainer attaches now, the clock creeps.
	// Every trainer gets calls enough to pay what it owes and then
	// meet the others in a few collectives.
	md.faults = false
	most := 0
	for _, t := range md.trainers {
		t.attachAt = md.now
		most = max(most, t.next+md.nodes[t.node].m.owes(t.l))
	}
	md.steps = max(md.steps, most+3)
	md.logEvent("faults stop")
	for i := 0; i < 20000 && md.err == nil && !md.allDone(); i++ {
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

func (md *model) logEvent(format string, args ...any) {
	if md.logf != nil {
		md.logf("%s "+format, append([]any{md.now.Sub(time.Unix(1e9, 0))}, args...)...)
	}
}

func (md *model) failf(format string, args ...any) {
	if md.err == nil {
		md.err = fmt.Errorf(format, args...)
	}
}

// newEpoch (re)starts every trainer, each attaching at a random time
// soon, some much later (a late start).
func (md *model) newEpoch() {
	md.epoch++
	for _, t := range md.trainers {
		t.epoch, t.next, t.inflight, t.owner = md.epoch, 0, 0, nil
		late := time.Duration(md.rng.IntN(300)) * time.Millisecond
		if md.rng.IntN(4) == 0 {
			late += time.Duration(md.rng.IntN(4)) * md.bound
		}
		t.attachAt = md.now.Add(late)
		// A few calls of this incarnation differ from the others'.
		if md.faults && md.rng.IntN(3) == 0 {
			step := md.rng.IntN(md.quietAt)
			md.odd[[3]int{md.epoch, t.rank, step}] = md.oddDesc()
		}
	}
	md.logEvent("epoch %d", md.epoch)
}

// baseDesc is every trainer's call; oddDesc one differing in one field.
var baseDesc = collective.Desc{Op: collective.OpAllReduce, DType: collective.Int32, Reduce: collective.Sum, Count: 1}

func (md *model) oddDesc() collective.Desc {
	d := baseDesc
	switch md.rng.IntN(6) {
	case 0:
		d.Op, d.Reduce = collective.OpBroadcast, collective.ReduceNone
	case 1:
		d.DType = collective.Float32
	case 2:
		d.Count = 2
	case 3:
		d.Reduce = collective.Max
	case 4:
		d.Op, d.Reduce, d.Root = collective.OpBroadcast, collective.ReduceNone, 1
	default:
		d.Name = "other"
	}
	return d
}

// step takes one random action among those possible.
func (md *model) step() {
	var acts []func()
	for _, t := range md.trainers {
		if t.owner == nil && !md.now.Before(t.attachAt) && !md.restarting {
			acts = append(acts, func() { md.attach(t) })
		}
		if t.owner != nil && t.next < md.steps && t.inflight < t.maxInflight {
			acts = append(acts, func() { md.call(t) })
		}
	}
	for i, nd := range md.nodes {
		if ready, _, _ := nd.m.heads(); md.ringUp && !nd.submitted && ready {
			acts = append(acts, func() { md.submit(i) })
		}
	}
	if !md.ringUp {
		acts = append(acts, md.form)
	}
	acts = append(acts, md.tick)
	if md.faults {
		// A job restarts when a trainer of it fails: one that has
		// attached. (A rank that never attached in an incarnation that
		// ends with no call in flight keeps what it owes into the next:
		// docs/MATCHING.md, limits.)
		if md.rng.IntN(40) == 0 && md.allAttachedOnce() {
			acts = append(acts, md.killJob)
		}
		if md.rng.IntN(80) == 0 {
			acts = append(acts, func() { md.killNode(md.rng.IntN(md.n)) })
		}
	}
	acts[md.rng.IntN(len(acts))]()
}

func (md *model) attach(t *mtrainer) {
	t.owner = new(int)
	md.nodes[t.node].m.attach(t.l, t.owner)
	md.logEvent("rank %d attaches (epoch %d)", t.rank, t.epoch)
}

func (md *model) call(t *mtrainer) {
	c := &mcall{rank: t.rank, epoch: t.epoch, step: t.next, desc: baseDesc}
	if d, ok := md.odd[[3]int{t.epoch, t.rank, t.next}]; ok {
		c.desc = d
	}
	t.next++
	t.inflight++
	nd := md.nodes[t.node]
	if e := nd.m.payDebt(t.l); e != nil {
		md.logEvent("rank %d step %d pays a debt: %s", t.rank, c.step, e.Code)
		md.deliver(c, outcome{code: e.Code, from: "debt: " + e.Message})
		return
	}
	nd.m.enqueue(t.l, c, md.now)
	md.logEvent("rank %d calls step %d %s", t.rank, c.step, c.desc)
}

// deliver records an outcome for its trainer, if that incarnation still
// runs.
func (md *model) deliver(c *mcall, o outcome) {
	t := md.trainers[c.rank]
	if t.epoch != c.epoch || t.owner == nil {
		return // its trainer is gone: nobody reads the answer
	}
	t.inflight--
	key := [2]int{c.epoch, c.step}
	if _, dup := t.results[key]; dup {
		md.failf("rank %d got two outcomes for step %d of epoch %d", c.rank, c.step, c.epoch)
	}
	t.results[key] = o
	md.checkB(c.epoch, c.step)
}

// checkB: every trainer's outcome of one step agrees, in success and in
// code.
func (md *model) checkB(epoch, step int) {
	var first *outcome
	var firstRank int
	for _, t := range md.trainers {
		o, ok := t.results[[2]int{epoch, step}]
		if !ok {
			continue
		}
		if first == nil {
			first, firstRank = &o, t.rank
			continue
		}
		if o.ok != first.ok || o.code != first.code {
			md.failf("(b): step %d of epoch %d: rank %d got ok=%v %s (%s), rank %d got ok=%v %s (%s)",
				step, epoch, firstRank, first.ok, first.code, first.from, t.rank, o.ok, o.code, o.from)
		}
	}
}

func (md *model) submit(i int) {
	nd := md.nodes[i]
	nd.heads = nd.m.popHeads(nd.heads)
	for _, h := range nd.heads[1:] {
		if !h.c.desc.Equal(nd.heads[0].c.desc) {
			md.logEvent("node %d: local mismatch", i)
			md.abort(kMismatch, i)
			return
		}
	}
	nd.submitted, nd.desc = true, nd.heads[0].c.desc
	if !md.anyOtherSubmitted(i) {
		md.firstIn = md.now
	}
	md.logEvent("node %d enters the ring's op", i)
	for _, o := range md.nodes {
		if !o.submitted {
			return
		}
	}
	// Every node is in: the ring compares the calls, then reduces.
	for _, o := range md.nodes {
		if !o.desc.Equal(nd.desc) {
			md.logEvent("the ring finds a mismatch")
			md.abort(kMismatch, -1)
			return
		}
	}
	c0 := md.nodes[0].heads[0].c
	for _, o := range md.nodes {
		for _, h := range o.heads {
			if h.c.epoch != c0.epoch || h.c.step != c0.step {
				md.failf("(a): a collective of rank %d's step %d (epoch %d) and rank %d's step %d (epoch %d)",
					c0.rank, c0.step, c0.epoch, h.c.rank, h.c.step, h.c.epoch)
				return
			}
		}
	}
	md.logEvent("collective completes: step %d of epoch %d", c0.step, c0.epoch)
	for _, o := range md.nodes {
		for _, h := range o.heads {
			md.deliver(h.c, outcome{ok: true, value: c0.step, from: "completed"})
		}
		clear(o.heads)
		o.heads, o.submitted = o.heads[:0], false
		o.m.completed()
	}
}

func (md *model) anyOtherSubmitted(i int) bool {
	for j, o := range md.nodes {
		if j != i && o.submitted {
			return true
		}
	}
	return false
}

// abort fails the ring's current collective on every node, as the abort
// frame does. origin is the node that found it (-1: the ring).
func (md *model) abort(kind int, origin int) {
	inOp := false
	for _, o := range md.nodes {
		inOp = inOp || o.submitted
	}
	code := kindCodes[kind]
	for i, nd := range md.nodes {
		var heads []queued[*mcall]
		if nd.submitted || i == origin {
			heads = nd.heads
		}
		// A node that did not see that the collective had begun (an
		// abort from an idle origin, with the kind lost): the count
		// agreement of the next generation must mend it.
		begun := inOp || kind != kPeerLost
		if kind == kPeerLost && md.rng.IntN(3) == 0 {
			begun = false
		}
		msg := fmt.Sprintf("collective failed (%s) seen by node %d", code, i)
		fs := nd.m.fail(heads, failure{at: md.now, begun: begun, restart: kind == kTrainerLost || kind == kPeerLost,
			err:  func(int) *ipc.Error { return ipc.Errorf(code, "%s", msg) },
			owed: func(int) *ipc.Error { return ipc.Errorf(code, "owed: %s", msg) }}, nil)
		for _, f := range fs {
			md.deliver(f.c, outcome{code: f.err.Code, from: f.err.Message})
		}
		clear(nd.heads)
		nd.heads, nd.submitted = nd.heads[:0], false
	}
	md.ringUp = false
	md.logEvent("ring aborted: %s", code)
}

func (md *model) form() {
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
		fs := nd.m.formed(agreed, fresh && stale, vacated, func(int, uint64) *ipc.Error {
			return ipc.Errorf(ipc.CodePeerLost, "node %d was behind (%d of %d)", i, behind, agreed)
		}, nil)
		for _, f := range fs {
			md.deliver(f.c, outcome{code: f.err.Code, from: f.err.Message})
		}
	}
	md.ringUp = true
	md.restarting = false
	md.gen++
	md.logEvent("generation %d forms at %d", md.gen, agreed)
}

// tick moves the clock and fires the timeouts that are due.
func (md *model) tick() {
	d := time.Duration(1+md.rng.IntN(20)) * time.Millisecond
	if !md.faults {
		d = time.Microsecond
	} else if md.rng.IntN(10) == 0 {
		d = time.Duration(md.rng.Int64N(int64(2 * md.bound)))
	}
	md.now = md.now.Add(d)
	if !md.ringUp {
		// While the ring is down, each node fails on its own the calls
		// that have waited their bound (Daemon.expire).
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
		if nd.submitted {
			continue
		}
		_, oldest, any := nd.m.heads()
		peerIn := md.anyOtherSubmitted(i)
		if (any && md.now.Sub(oldest) >= md.bound) || (!any && peerIn && md.now.Sub(md.firstIn) >= md.bound) {
			md.logEvent("node %d times out", i)
			md.abort(kTimeout, i)
			return
		}
	}
}

// killJob ends every trainer (one was lost, and the job restarts them
// all), as torchrun does.
func (md *model) killJob() {
	lost := false
	for _, t := range md.trainers {
		if t.owner == nil {
			continue
		}
		nd := md.nodes[t.node]
		lost = nd.m.detach(t.l, t.owner, nd.submitted) || lost
		t.owner = nil
	}
	md.logEvent("the job's trainers are killed (lost mid-collective: %v)", lost)
	if lost && md.ringUp {
		md.abort(kTrainerLost, -1)
	} else if lost {
		// The ring is down: the next failure, or the formation, sees it.
		for _, nd := range md.nodes {
			nd.m.fail(nil, failure{at: md.now, restart: true,
				err:  func(int) *ipc.Error { return ipc.Errorf(ipc.CodeTrainerLost, "lost") },
				owed: func(int) *ipc.Error { return ipc.Errorf(ipc.CodeTrainerLost, "owed: lost") }}, nil)
		}
	}
	md.restarting = !md.ringUp
	md.newEpoch()
}

// killNode restarts node i's daemon (its trainers die with it, and the
// job restarts all of them).
func (md *model) killNode(i int) {
	md.logEvent("node %d is killed", i)
	if md.ringUp {
		md.nodes[i].submitted = false
		md.nodes[i].heads = md.nodes[i].heads[:0]
		md.abort(kPeerLost, -1)
	}
	for _, t := range md.trainers {
		if t.node == i {
			t.owner = nil
		}
	}
	md.nodes[i] = &mnode{m: newMatcher[*mcall](md.l)}
	md.killJob()
}

func (md *model) allAttachedOnce() bool {
	for _, t := range md.trainers {
		if t.owner == nil && t.next == 0 {
			return false
		}
	}
	return true
}

func (md *model) allDone() bool {
	for _, t := range md.trainers {
		if t.next < md.steps || t.inflight > 0 || t.owner == nil {
			return false
		}
	}
	return true
}

func (md *model) progress() string {
	var b strings.Builder
	for _, t := range md.trainers {
		fmt.Fprintf(&b, "[rank %d epoch %d next %d inflight %d attached %v owes %d] ", t.rank, t.epoch, t.next, t.inflight,
			t.owner != nil, md.nodes[t.node].m.owes(t.l))
	}
	return b.String()
}

// checkLastSteps: (c), once the faults stopped the trainers met again:
// every trainer's last step completed.
func (md *model) checkLastSteps() {
	for _, t := range md.trainers {
		o := t.results[[2]int{t.epoch, md.steps - 1}]
		if !o.ok {
			md.failf("(c): rank %d's last step (epoch %d) failed after the faults stopped: %s %s", t.rank, t.epoch, o.code, o.from)
		}
	}
}
