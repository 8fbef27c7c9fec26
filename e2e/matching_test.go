package e2e

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	cvd "github.com/collectived/collectived/clients/go"
	"github.com/collectived/collectived/collective"
)

// The desyncs of issue 24, each found from outside as a new user would
// (a world of daemon processes, trainers attached through the Go client)
// and each giving a silent wrong answer or the wrong error before its
// fix. docs/MATCHING.md has the rules they check.

// rankTrainer attaches a trainer to node's daemon at local rank l.
func rankTrainer(t *testing.T, w *world, node, l int) *cvd.Client {
	t.Helper()
	c, err := cvd.Dial(cvd.Options{Socket: w.sockets[node], Job: "e2e", LocalRank: l,
		Label: fmt.Sprintf("matching_test n%d l%d", node, l), Timeout: 60 * time.Second})
	if err != nil {
		t.Fatalf("node %d local rank %d: %v", node, l, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// everyTrainer attaches one trainer to every rank of the world, in world
// rank order.
func everyTrainer(t *testing.T, w *world) []*cvd.Client {
	t.Helper()
	var cs []*cvd.Client
	for n := 0; n < w.nodes; n++ {
		for l := 0; l < w.local; l++ {
			cs = append(cs, rankTrainer(t, w, n, l))
		}
	}
	return cs
}

// onEvery runs f for every trainer at once and returns their errors.
func onEvery(t *testing.T, cs []*cvd.Client, f func(i int, c *cvd.Client) error) []error {
	t.Helper()
	return onEveryWithin(t, 90*time.Second, cs, f)
}

// onEveryWithin is onEvery for work that may take longer than one call
// (many calls in a row), given its own bound.
func onEveryWithin(t *testing.T, bound time.Duration, cs []*cvd.Client, f func(i int, c *cvd.Client) error) []error {
	t.Helper()
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = f(i, c) }()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(bound):
		t.Fatalf("calls still waiting after %v (every call's own timeout is 60 s)", bound)
	}
	return errs
}

// sumStep has every trainer allreduce int32 [step*(rank+1)] and checks
// the sum the world must give.
func sumStep(t *testing.T, cs []*cvd.Client, step int) {
	t.Helper()
	want := int32(0)
	for i := range cs {
		want += int32(step * (i + 1))
	}
	errs := onEvery(t, cs, func(i int, c *cvd.Client) error {
		x := []int32{int32(step * (i + 1))}
		if err := cvd.AllReduce(c, x, cvd.Sum); err != nil {
			return err
		}
		if x[0] != want {
			return fmt.Errorf("step %d: got %d, want %d: a result from other calls than every trainer's step %d", step, x[0], want, step)
		}
		return nil
	})
	for i, err := range errs {
		if err != nil {
			t.Errorf("trainer %d: %v", i, err)
		}
	}
}

// expectCode checks that every error is code, naming each of words.
func expectCode(t *testing.T, what string, errs []error, code error, words ...string) {
	t.Helper()
	for i, err := range errs {
		if !errors.Is(err, code) {
			t.Errorf("%s: trainer %d got %v, want %v", what, i, err, code)
			continue
		}
		for _, w := range words {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: trainer %d: %q does not name %q", what, i, err, w)
			}
		}
	}
}

// Broadcasts that differ in root, count or name, or a broadcast against
// an allreduce, fail on every trainer with MISMATCH, the root's included,
// and the next calls meet: no trainer's call k+1 is summed with another's
// call k (issue 24, cases 1 and 2).
func TestBroadcastMismatchEveryTrainer(t *testing.T) {
	f32 := collective.Float32
	bc := func(root uint32, count uint64, name string) collective.Desc {
		return collective.Desc{Op: collective.OpBroadcast, DType: f32, Count: count, Root: root, Name: name}
	}
	ar := collective.Desc{Op: collective.OpAllReduce, DType: f32, Reduce: collective.Sum, Count: 4}
	for _, c := range []struct {
		name  string
		calls [2]collective.Desc
		words []string
	}{
		{"roots differ", [2]collective.Desc{bc(0, 4, ""), bc(1, 4, "")}, []string{"root=0", "root=1"}},
		{"root against allreduce", [2]collective.Desc{bc(0, 4, ""), ar}, []string{"broadcast(", "allreduce("}},
		{"counts differ", [2]collective.Desc{bc(0, 4, ""), bc(0, 3, "")}, []string{"count=4", "count=3"}},
		{"names differ", [2]collective.Desc{bc(0, 4, "a"), bc(0, 4, "b")}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := startWorld(t, 2, 1, "")
			cs := everyTrainer(t, w)
			sumStep(t, cs, 1) // warm-up
			bufs := [2][]byte{}
			errs := onEvery(t, cs, func(i int, cl *cvd.Client) error {
				d := c.calls[i]
				bufs[i] = make([]byte, d.Bytes())
				for j := range bufs[i] {
					bufs[i][j] = byte(i + 1)
				}
				return cl.Do(d, bufs[i])
			})
			expectCode(t, "the differing call", errs, cvd.ErrMismatch, c.words...)
			if t.Failed() {
				return
			}
			if c.name == "names differ" {
				// Each trainer reads its own node's call; a trainer whose
				// node learnt of the mismatch from the other's abort reads
				// both names. (In a ring of two both nodes may find it at
				// once, each showing "name differs" for the other: then the
				// two trainers' errors name both between them.)
				both, all := false, ""
				for i, err := range errs {
					own := fmt.Sprintf("name=%q", c.calls[i].Name)
					if !strings.Contains(err.Error(), own) {
						t.Errorf("trainer %d: %v does not name its own call's %s", i, err, own)
					}
					both = both || strings.Contains(err.Error(), `name="a"`) && strings.Contains(err.Error(), `name="b"`)
					all += err.Error()
				}
				if !both && !(strings.Contains(all, "origin rank 0") && strings.Contains(all, "origin rank 1")) {
					t.Errorf("no trainer's error names both names: %v", errs)
				}
				t.Logf("names differ: %v", errs)
			}
			for step := 2; step <= 4; step++ {
				sumStep(t, cs, step)
			}
		})
	}
}

// Trainers that start long after the first has called: the first gets
// TIMEOUT on the collectives that failed meanwhile, each late trainer
// the same collectives' failures on its first calls, and every result
// that comes is the sum of one step (issue 24, case 3: sums of mixed
// steps, 9, 13, 17, 21 instead of 12, 16, 20, 24).
func TestLateStartersMixNoSteps(t *testing.T) {
	cfg := strings.NewReplacer("collective: 20s", "collective: 2s", "first_call: 20s", "first_call: 2s",
		"stall_warning: 2s", "stall_warning: 1s").Replace(fastTimeouts)
	w := startWorld(t, 2, 2, cfg)
	const steps = 6
	type outcome struct {
		ok  bool
		sum int32
		err error
	}
	results := make([][steps]outcome, 4)
	var wg sync.WaitGroup
	for rank := 0; rank < 4; rank++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if rank > 0 {
				time.Sleep(5 * time.Second)
			}
			c, err := cvd.Dial(cvd.Options{Socket: w.sockets[rank/2], Job: "e2e", LocalRank: rank % 2, Timeout: 60 * time.Second})
			if err != nil {
				t.Errorf("rank %d: %v", rank, err)
				return
			}
			defer c.Close()
			for s := 1; s <= steps; s++ {
				x := []int32{int32(s)}
				err := cvd.AllReduce(c, x, cvd.Sum)
				results[rank][s-1] = outcome{ok: err == nil, sum: x[0], err: err}
			}
		}()
	}
	wg.Wait()
	okSteps := 0
	for s := 0; s < steps; s++ {
		for rank := 0; rank < 4; rank++ {
			o := results[rank][s]
			if o.ok != results[0][s].ok {
				t.Errorf("step %d: trainer 0 ok=%v (%v), trainer %d ok=%v (%v): a failed collective must fail every trainer's call",
					s+1, results[0][s].ok, results[0][s].err, rank, o.ok, o.err)
			}
			if o.ok && o.sum != int32(4*(s+1)) {
				t.Errorf("step %d: trainer %d got %d, want %d: a sum of other steps", s+1, rank, o.sum, 4*(s+1))
			}
			if !o.ok && !errors.Is(o.err, cvd.ErrTimeout) {
				t.Errorf("step %d: trainer %d: %v, want TIMEOUT", s+1, rank, o.err)
			}
		}
		if results[0][s].ok {
			okSteps++
		}
	}
	if results[0][0].ok {
		t.Errorf("step 1 succeeded, but trainers 1-3 started 5 s after trainer 0 called, past the 2 s bound")
	}
	if okSteps == 0 {
		t.Errorf("no step succeeded: the late trainers never met trainer 0")
	}
	for rank := range results {
		for s, o := range results[rank] {
			t.Logf("trainer %d step %d: ok=%v sum=%d err=%v", rank, s+1, o.ok, o.sum, o.err)
		}
	}
}

// The two trainers of node 0 disagree on the first collective of a new
// generation, called before it formed: node 1's trainers get MISMATCH
// too, not PEER_LOST ("ring generation 2 could not form"), and a call
// they queued behind it is their next call, which meets the others'
// next calls (issue 24, case 4).
func TestLocalMismatchFirstOfGeneration(t *testing.T) {
	w := startWorld(t, 2, 2, "")
	cs := everyTrainer(t, w)
	sumStep(t, cs, 1)
	for round := 0; round < 3; round++ {
		// A mismatch ends the generation; every trainer's next call is
		// made at once, while the next generation forms.
		errs := onEvery(t, cs, func(i int, c *cvd.Client) error {
			n := 4
			if i == 3 {
				n = 5
			}
			return cvd.AllReduce(c, make([]float32, n), cvd.Sum)
		})
		expectCode(t, "the generation-ending mismatch", errs, cvd.ErrMismatch, "count=5")
		queued := make([]*cvd.Handle, 4)
		vals := make([][]int32, 4)
		errs = onEvery(t, cs, func(i int, c *cvd.Client) error {
			n := 4
			if i == 1 {
				n = 8 // node 0's trainers disagree
			}
			h, err := cvd.AllReduceAsync(c, make([]float32, n), cvd.Sum)
			if err != nil {
				return err
			}
			vals[i] = []int32{int32(10 * (i + 1))}
			if queued[i], err = cvd.AllReduceAsync(c, vals[i], cvd.Sum); err != nil {
				return err
			}
			return h.Wait()
		})
		expectCode(t, fmt.Sprintf("round %d: node 0's mismatch on the generation's first collective", round), errs, cvd.ErrMismatch, "count=8")
		for i, h := range queued {
			if h == nil {
				continue
			}
			if err := h.Wait(); err != nil {
				t.Errorf("round %d: trainer %d's call queued behind the mismatch: %v, want it to run as its next collective", round, i, err)
			} else if vals[i][0] != 100 {
				t.Errorf("round %d: trainer %d's queued call summed to %d, want 100", round, i, vals[i][0])
			}
		}
		if t.Failed() {
			return
		}
	}
	sumStep(t, cs, 2)
}

// A trainer waiting on a collective that a trainer of another node has
// not called gets the daemon's TIMEOUT naming that trainer within its
// bound (the collective timeout, or first_call for a generation's first
// collective) plus the 5 s margin PROTOCOL.md states, and not before the
// bound (issue 24, case 5: with first_call 6 s it came at 8.5 s, and
// once at 38.5 s).
func TestCrossNodeTimeoutWithinBound(t *testing.T) {
	const margin = 5 * time.Second
	for _, c := range []struct {
		name      string
		warm      bool
		bound     time.Duration
		collFirst string
	}{
		{"first call of a generation", false, 4 * time.Second, "collective: 2s\n  first_call: 4s"},
		{"later call", true, 2 * time.Second, "collective: 2s\n  first_call: 4s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := strings.NewReplacer("collective: 20s\n  first_call: 20s", c.collFirst, "stall_warning: 2s", "stall_warning: 1s").Replace(fastTimeouts)
			w := startWorld(t, 2, 1, cfg)
			cs := everyTrainer(t, w)
			if c.warm {
				sumStep(t, cs, 1)
			}
			late := make(chan error, 1)
			go func() {
				time.Sleep(c.bound + margin + 3*time.Second)
				late <- cvd.AllReduce(cs[1], []int32{1}, cvd.Sum)
			}()
			t0 := time.Now()
			err := cvd.AllReduce(cs[0], []int32{1}, cvd.Sum)
			took := time.Since(t0)
			if !errors.Is(err, cvd.ErrTimeout) || !strings.Contains(err.Error(), "not called by world rank 1 (node 1, local rank 0, pid") {
				t.Fatalf("got %v after %v, want TIMEOUT naming world rank 1 and its pid", err, took)
			}
			if took < c.bound-100*time.Millisecond || took > c.bound+margin {
				t.Errorf("TIMEOUT after %v, want within [%v, %v]", took, c.bound, c.bound+margin)
			}
			t.Logf("TIMEOUT after %v: %v", took, err)
			// The late trainer owes the failed collective: status says so
			// before its call comes.
			waitFor(t, 5*time.Second, "node 1's status to show world rank 1 owing one collective", func() bool {
				trs, _ := statusJSON(t, w.sockets[1])["trainers"].([]any)
				return len(trs) == 1 && trs[0].(map[string]any)["owes"] == float64(1)
			})
			if err := <-late; !errors.Is(err, cvd.ErrTimeout) {
				t.Errorf("the late trainer's call: %v, want the TIMEOUT of the collective it was late for", err)
			}
			sumStep(t, cs, 2)
			// Both nodes count the same collectives finished.
			f0 := statusJSON(t, w.sockets[0])["ring"].(map[string]any)["finished"]
			f1 := statusJSON(t, w.sockets[1])["ring"].(map[string]any)["finished"]
			if f0 != f1 || f0 == nil {
				t.Errorf("finished collectives: node 0 %v, node 1 %v, want equal", f0, f1)
			}
		})
	}
}
