package e2e

import (
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/collectived/collectived/ipc"
	"math"
	"math/rand"
	"os"
	"strings"
	"testing"
	"time"

	cvd "github.com/collectived/collectived/clients/go"
	"github.com/collectived/collectived/collective"
)

// Named calls (docs/MATCHING.md, "Named calls") through daemon processes
// and the Go client: every trainer calls the same names in its own random
// order, and every result is exact.

// namedStatus is the part of the status document these tests read.
type namedStatus struct {
	Trainers []struct {
		Owes int `json:"owes"`
	} `json:"trainers"`
	Named struct {
		Pending []struct {
			Name    string `json:"name"`
			Called  []int  `json:"called"`
			Missing []struct {
				WorldRank int   `json:"world_rank"`
				PID       int32 `json:"pid"`
			} `json:"missing"`
			Nodes []int `json:"waiting_for_nodes"`
		} `json:"pending"`
		Rounds   uint64 `json:"rounds"`
		Executed uint64 `json:"executed"`
		FusedOps uint64 `json:"fused_ops"`
		Cache    struct {
			Entries       int    `json:"entries"`
			Hits          uint64 `json:"hits"`
			Misses        uint64 `json:"misses"`
			Invalidations uint64 `json:"invalidations"`
		} `json:"cache"`
	} `json:"named"`
}

func readNamedStatus(t *testing.T, socket string) namedStatus {
	t.Helper()
	var st namedStatus
	statusInto(t, socket, &st)
	return st
}

// namedSet is a step's names: sizes from one element to past the ring's
// small-path bound and its segment size, float32 and int32.
type namedSet struct {
	names  []string
	counts []int
	dtypes []collective.DType
}

func newNamedSet(n int) namedSet {
	var s namedSet
	sizes := []int{1, 3, 17, 1000, 4096, 16<<10 + 1, 40_003, 100_001}
	for i := 0; i < n; i++ {
		s.names = append(s.names, fmt.Sprintf("layer%02d.weight.grad", i))
		s.counts = append(s.counts, sizes[i%len(sizes)])
		dt := collective.Float32
		if i%5 == 4 {
			dt = collective.Int32
		}
		s.dtypes = append(s.dtypes, dt)
	}
	return s
}

// value is what world rank r puts at element k of name i in a step:
// small integers, so that float sums are exact in any order.
func namedValue(r, i, k, step int) int { return (r+1)*(k%13) + i + step%7 }

func TestNamedCallsAnyOrder(t *testing.T) {
	w := startWorld(t, 2, 2, "")
	cs := everyTrainer(t, w)
	W := len(cs)
	set := newNamedSet(50)
	steps := 100
	if testing.Short() {
		steps = 10
	}
	// 100 steps of 50 calls each: under -race on a loaded machine that is
	// minutes of work, each call bounded by its own timeout.
	errs := onEveryWithin(t, 10*time.Minute, cs, func(r int, c *cvd.Client) error {
		rng := rand.New(rand.NewSource(int64(r)))
		bufs := make([][]byte, len(set.names))
		for i := range set.names {
			bufs[i] = make([]byte, set.counts[i]*4)
		}
		hs := make([]*cvd.Handle, len(set.names))
		for step := 0; step < steps; step++ {
			for i := range set.names {
				fill(bufs[i], set.dtypes[i], func(k int) int { return namedValue(r, i, k, step) })
			}
			for _, i := range rng.Perm(len(set.names)) {
				d := collective.Desc{Op: collective.OpAllReduce, DType: set.dtypes[i], Reduce: collective.Sum,
					Count: uint64(set.counts[i]), Name: set.names[i], Named: true}
				h, err := c.Start(d, bufs[i])
				if err != nil {
					return fmt.Errorf("step %d: start %s: %w", step, set.names[i], err)
				}
				hs[i] = h
			}
			for i, h := range hs {
				if err := h.Wait(); err != nil {
					return fmt.Errorf("step %d: %s: %w", step, set.names[i], err)
				}
			}
			for i := range set.names {
				want := func(k int) int {
					s := 0
					for q := 0; q < W; q++ {
						s += namedValue(q, i, k, step)
					}
					return s
				}
				if err := check(bufs[i], set.dtypes[i], want); err != nil {
					return fmt.Errorf("step %d: %s: %v", step, set.names[i], err)
				}
			}
		}
		return nil
	})
	noErrs(t, "named calls", errs)

	for n := 0; n < w.nodes; n++ {
		st := readNamedStatus(t, w.sockets[n]).Named
		t.Logf("node %d: rounds %d, executed %d, fused ops %d, cache %+v", n, st.Rounds, st.Executed, st.FusedOps, st.Cache)
		if st.Executed != uint64(steps*len(set.names)) {
			t.Errorf("node %d executed %d names, want %d", n, st.Executed, steps*len(set.names))
		}
		// The first step's names travel in full; from the second step on,
		// the set repeats and every name goes as a cache bit.
		if st.Cache.Misses != uint64(len(set.names)) || st.Cache.Hits != uint64((steps-1)*len(set.names)) {
			t.Errorf("node %d: cache misses %d, hits %d; want %d and %d", n, st.Cache.Misses, st.Cache.Hits, len(set.names), (steps-1)*len(set.names))
		}
		if len(st.Pending) != 0 {
			t.Errorf("node %d: names still pending after every call returned: %+v", n, st.Pending)
		}
	}
}

func fill(b []byte, dt collective.DType, v func(k int) int) {
	for k := 0; k < len(b)/4; k++ {
		x := uint32(int32(v(k)))
		if dt == collective.Float32 {
			x = math.Float32bits(float32(v(k)))
		}
		b[4*k], b[4*k+1], b[4*k+2], b[4*k+3] = byte(x), byte(x>>8), byte(x>>16), byte(x>>24)
	}
}

func check(b []byte, dt collective.DType, want func(k int) int) error {
	for k := 0; k < len(b)/4; k++ {
		x := uint32(b[4*k]) | uint32(b[4*k+1])<<8 | uint32(b[4*k+2])<<16 | uint32(b[4*k+3])<<24
		w := uint32(int32(want(k)))
		if dt == collective.Float32 {
			w = math.Float32bits(float32(want(k)))
		}
		if x != w {
			return fmt.Errorf("element %d is 0x%08x, want 0x%08x (%d)", k, x, w, want(k))
		}
	}
	return nil
}

// TestNamedMismatch: one name called with different counts fails with
// MISMATCH on every trainer, naming both calls; the trainers' next calls
// meet.
func TestNamedMismatch(t *testing.T) {
	w := startWorld(t, 2, 2, "")
	cs := everyTrainer(t, w)
	for _, bad := range []int{1, 3} { // the same node as rank 0, another node
		errs := onEvery(t, cs, func(r int, c *cvd.Client) error {
			n := 8
			if r == bad {
				n = 9
			}
			d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: uint64(n), Name: "g", Named: true}
			return c.Do(d, make([]byte, 4*n))
		})
		for r, err := range errs {
			if !errors.Is(err, cvd.ErrMismatch) {
				t.Errorf("bad rank %d: rank %d: %v, want MISMATCH", bad, r, err)
				continue
			}
			if !strings.Contains(err.Error(), `"g"`) || !strings.Contains(err.Error(), "count=8") && !strings.Contains(err.Error(), "count 8") {
				t.Errorf("bad rank %d: rank %d: %v, want it to name the call", bad, r, err)
			}
		}
		// The failure made every trainer owe: named calls fail until an
		// ordered call, which pays; then they meet again.
		errs = onEvery(t, cs, func(r int, c *cvd.Client) error { return c.Barrier() })
		for r, err := range errs {
			if !errors.Is(err, cvd.ErrMismatch) {
				t.Errorf("bad rank %d: rank %d: barrier after the failure: %v, want the failure's MISMATCH", bad, r, err)
			}
		}
		sumStep(t, cs, 1)
		namedSum(t, cs, "after")
	}
}

// namedSum has every trainer make a named allreduce and checks it.
func namedSum(t *testing.T, cs []*cvd.Client, name string) {
	t.Helper()
	errs := onEvery(t, cs, func(r int, c *cvd.Client) error {
		b := make([]byte, 4)
		fill(b, collective.Int32, func(int) int { return r + 1 })
		d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Int32, Reduce: collective.Sum, Count: 1, Name: name, Named: true}
		if err := c.Do(d, b); err != nil {
			return err
		}
		W := len(cs)
		return check(b, collective.Int32, func(int) int { return W * (W + 1) / 2 })
	})
	noErrs(t, "named "+name, errs)
}

// TestNamedFence: an ordered call is a fence. A trainer that goes on to
// its ordered call without a name another trainer called fails, and so
// does the other.
func TestNamedFence(t *testing.T) {
	w := startWorld(t, 2, 1, "")
	cs := everyTrainer(t, w)
	errs := onEvery(t, cs, func(r int, c *cvd.Client) error {
		if r == 0 {
			d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Int32, Reduce: collective.Sum, Count: 1, Name: "only-rank-0", Named: true}
			h, err := c.Start(d, make([]byte, 4))
			if err != nil {
				return err
			}
			errB := c.Barrier()
			return errors.Join(h.Wait(), errB)
		}
		return c.Barrier()
	})
	for r, err := range errs {
		if !errors.Is(err, cvd.ErrMismatch) {
			t.Errorf("rank %d: %v, want MISMATCH", r, err)
		}
	}
	sumStep(t, cs, 2)
	namedSum(t, cs, "again")
}

// TestNamedStallReport: a name one trainer never calls shows in status
// with the world rank and pid missing it, is logged after the stall
// warning, and fails at the collective timeout naming it.
func TestNamedStallReport(t *testing.T) {
	w := startWorld(t, 2, 1, strings.Replace(fastTimeouts, "collective: 20s", "collective: 6s", 1))
	cs := everyTrainer(t, w)
	d := func(name string) collective.Desc {
		return collective.Desc{Op: collective.OpAllReduce, DType: collective.Int32, Reduce: collective.Sum, Count: 1, Name: name, Named: true}
	}
	h0, err := cs[0].Start(d("late.grad"), make([]byte, 4))
	if err != nil {
		t.Fatal(err)
	}
	// Rank 1 calls another name, so a round tells node 1 of "late.grad".
	h1, err := cs[1].Start(d("other.grad"), make([]byte, 4))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := readNamedStatus(t, w.sockets[1]).Named
		found := false
		for _, p := range st.Pending {
			if p.Name == "late.grad" && len(p.Missing) == 1 && p.Missing[0].WorldRank == 1 && p.Missing[0].PID > 0 {
				found = true
			}
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node 1's status does not show late.grad missing on world rank 1: %+v", st.Pending)
		}
		time.Sleep(50 * time.Millisecond)
	}
	st0 := readNamedStatus(t, w.sockets[0]).Named
	ok := false
	for _, p := range st0.Pending {
		if p.Name == "late.grad" && len(p.Nodes) == 1 && p.Nodes[0] == 1 {
			ok = true
		}
	}
	if !ok {
		t.Errorf("node 0's status does not show late.grad waiting for node 1: %+v", st0.Pending)
	}
	for i, h := range []*cvd.Handle{h0, h1} {
		err := h.Wait()
		if !errors.Is(err, cvd.ErrTimeout) || !strings.Contains(err.Error(), "late.grad") {
			t.Errorf("rank %d: %v, want TIMEOUT naming late.grad", i, err)
		}
	}
	if log := w.log(0) + w.log(1); !strings.Contains(log, "late.grad") || !strings.Contains(log, "stalled") {
		t.Errorf("the logs do not report the stalled name:\n%s", log)
	}
}

// TestNamedFusedBitIdentical: named allreduces fused by the daemon give
// the bytes the same calls give one by one, on 3 nodes (where a float
// sum's bits depend on the order the ring folds in) for every float
// dtype, with values of mixed magnitudes so that another order shows.
func TestNamedFusedBitIdentical(t *testing.T) {
	w := startWorld(t, 3, 1, "")
	cs := everyTrainer(t, w)
	sizes := []int{1, 2, 5, 1000, 16<<10 + 3, 40_001, 150_001}
	dtypes := []collective.DType{collective.Float32, collective.BFloat16, collective.Float16, collective.Float64}
	type named struct {
		d   collective.Desc
		buf []byte
	}
	errs := onEvery(t, cs, func(r int, c *cvd.Client) error {
		rng := rand.New(rand.NewSource(int64(7 + r)))
		var calls []named
		for _, dt := range dtypes {
			for i, n := range sizes {
				for _, red := range []collective.ReduceOp{collective.Sum, collective.Avg} {
					d := collective.Desc{Op: collective.OpAllReduce, DType: dt, Reduce: red, Count: uint64(n),
						Name: fmt.Sprintf("%s.%s.%d", dt, red, i), Named: true}
					b := make([]byte, n*dt.Size())
					randomFloats(rng, dt, b)
					calls = append(calls, named{d, b})
				}
			}
		}
		// Unfused: the same calls ordered, one by one, on copies.
		want := make([][]byte, len(calls))
		for i, nc := range calls {
			want[i] = append([]byte(nil), nc.buf...)
			d := nc.d
			d.Named, d.Name = false, ""
			if err := c.Do(d, want[i]); err != nil {
				return fmt.Errorf("ordered %s: %w", nc.d.Name, err)
			}
		}
		hs := make([]*cvd.Handle, len(calls))
		for _, i := range rng.Perm(len(calls)) {
			h, err := c.Start(calls[i].d, calls[i].buf)
			if err != nil {
				return err
			}
			hs[i] = h
		}
		for i, h := range hs {
			if err := h.Wait(); err != nil {
				return fmt.Errorf("named %s: %w", calls[i].d.Name, err)
			}
			if string(calls[i].buf) != string(want[i]) {
				return fmt.Errorf("named %s: the fused result differs from the call made alone", calls[i].d.Name)
			}
		}
		return nil
	})
	noErrs(t, "fused against one by one", errs)
	if st := readNamedStatus(t, w.sockets[0]).Named; st.FusedOps == 0 {
		t.Errorf("no ring operation was fused (status %+v): the test did not test fusion", st)
	}
}

// randomFloats fills b with values of dt spread over many magnitudes,
// of both signs.
func randomFloats(rng *rand.Rand, dt collective.DType, b []byte) {
	es := dt.Size()
	for k := 0; k < len(b)/es; k++ {
		v := (rng.Float64()*2 - 1) * math.Pow(2, float64(rng.Intn(24)-12))
		switch dt {
		case collective.Float64:
			binary.LittleEndian.PutUint64(b[8*k:], math.Float64bits(v))
		case collective.Float32:
			binary.LittleEndian.PutUint32(b[4*k:], math.Float32bits(float32(v)))
		case collective.BFloat16:
			binary.LittleEndian.PutUint16(b[2*k:], uint16(cvd.ToBFloat16(float32(v))))
		case collective.Float16:
			binary.LittleEndian.PutUint16(b[2*k:], uint16(cvd.ToFloat16(float32(v))))
		}
	}
}

// TestNamedRefusals: what the daemon refuses of named calls, each with
// an error naming the fault, and the connection (or the call) goes on.
func TestNamedRefusals(t *testing.T) {
	w := startWorld(t, 2, 1, "")
	named := func(name string, count uint64) []byte {
		c := ipc.Call{Desc: collective.Desc{Op: collective.OpAllReduce, DType: collective.Int32, Reduce: collective.Sum,
			Count: count, Name: name, Named: true}, Data: make([]byte, 4*count)}
		return c.Encode(uint64(10 + count))
	}

	// A name in flight twice on one trainer: the second call is refused
	// (BAD_REQUEST, not fatal) and the first still meets the other
	// trainer's call.
	raw := dialRaw(t, w.sockets[0])
	raw.hello()
	raw.send(named("twice", 1), -1)
	raw.send(named("twice", 2), -1)
	raw.expectError(ipc.CodeBadRequest, `already has a call named "twice" in flight`, false)
	other := rankTrainer(t, w, 1, 0)
	d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Int32, Reduce: collective.Sum, Count: 1, Name: "twice", Named: true}
	if err := other.Do(d, make([]byte, 4)); err != nil {
		t.Fatalf("the other trainer's call of the name: %v", err)
	}
	if typ, _, _ := raw.read(); typ != ipc.TypeCallOK {
		t.Fatalf("the first call of the name was answered with %s, want CALL_OK", typ)
	}

	// NAMED on a version-3 connection is an undefined flag: fatal.
	raw.uc.Close()
	old := dialRaw(t, w.sockets[0])
	old.send(ipc.Hello{Version: 3, LocalRank: -1, PID: uint32(os.Getpid()), Job: "e2e", Label: "v3"}.Encode(1), -1)
	if typ, _, _ := old.read(); typ != ipc.TypeHelloOK {
		t.Fatalf("HELLO in 3 answered with %s", typ)
	}
	old.send(named("v3", 1), -1)
	old.expectError(ipc.CodeBadFrame, "NAMED needs 4", true)

	// A named call without a name.
	nameless := dialRaw(t, w.sockets[1])
	other.Close()
	nameless.hello()
	nameless.send(named("", 1), -1)
	nameless.expectError(ipc.CodeBadRequest, "a named call needs a name", false)
}

// TestNamedCacheInvalidation: the response cache follows a name whose
// description changes, and a new generation (a trainer lost mid-call)
// empties it on every node; results stay exact throughout.
func TestNamedCacheInvalidation(t *testing.T) {
	w := startWorld(t, 2, 1, "")
	cs := everyTrainer(t, w)
	step := func(cs []*cvd.Client, counts map[string]int) {
		t.Helper()
		errs := onEvery(t, cs, func(r int, c *cvd.Client) error {
			var hs []*cvd.Handle
			bufs := map[string][]byte{}
			for name, n := range counts {
				b := make([]byte, 4*n)
				fill(b, collective.Int32, func(k int) int { return r + k })
				bufs[name] = b
				d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Int32, Reduce: collective.Sum, Count: uint64(n), Name: name, Named: true}
				h, err := c.Start(d, b)
				if err != nil {
					return err
				}
				hs = append(hs, h)
			}
			for _, h := range hs {
				if err := h.Wait(); err != nil {
					return err
				}
			}
			for name, b := range bufs {
				if err := check(b, collective.Int32, func(k int) int { return 1 + 2*k }); err != nil {
					return fmt.Errorf("%s: %v", name, err)
				}
			}
			return nil
		})
		noErrs(t, fmt.Sprint(counts), errs)
	}
	cache := func(node int) string {
		c := readNamedStatus(t, w.sockets[node]).Named.Cache
		return fmt.Sprintf("entries %d, hits %d, misses %d, invalidations %d", c.Entries, c.Hits, c.Misses, c.Invalidations)
	}
	expect := func(want string) {
		t.Helper()
		for n := 0; n < w.nodes; n++ {
			if got := cache(n); got != want {
				t.Errorf("node %d cache: %s, want %s", n, got, want)
			}
		}
	}
	step(cs, map[string]int{"a": 4, "b": 4})
	expect("entries 2, hits 0, misses 2, invalidations 0")
	step(cs, map[string]int{"a": 4, "b": 4})
	expect("entries 2, hits 2, misses 2, invalidations 0")
	step(cs, map[string]int{"a": 8, "b": 4}) // a's description changes
	expect("entries 2, hits 3, misses 3, invalidations 1")
	step(cs, map[string]int{"a": 8, "b": 4})
	expect("entries 2, hits 5, misses 3, invalidations 1")

	// A trainer lost mid-call: the generation ends, every cache empties.
	d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Int32, Reduce: collective.Sum, Count: 1, Name: "a", Named: true}
	if _, err := cs[1].Start(d, make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	cs[1].Close()
	// Once node 0 has failed the collective, rank 0 owes it.
	for deadline := time.Now().Add(10 * time.Second); readNamedStatus(t, w.sockets[0]).Trainers[0].Owes != 1; {
		if time.Now().After(deadline) {
			t.Fatal("node 0 did not fail the collective the lost trainer left")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := cs[0].Do(d, make([]byte, 4)); !errors.Is(err, cvd.ErrTrainerLost) {
		t.Fatalf("rank 0's named call after the failure: %v, want the TRAINER_LOST it owes", err)
	}
	cs[1] = rankTrainer(t, w, 1, 0)
	// Rank 0's named call came after the failure, which it owes: the
	// call failed without paying, and its next ordered call pays. Rank 1
	// is a new trainer and owes nothing. The cache starts again.
	if err := cs[0].Barrier(); !errors.Is(err, cvd.ErrTrainerLost) {
		t.Fatalf("rank 0's ordered call after the failure: %v, want the TRAINER_LOST it owes", err)
	}
	step(cs, map[string]int{"a": 8, "b": 4})
	expect("entries 2, hits 5, misses 5, invalidations 1")
}

// TestNamedRoundsMatchNoOrderedCall: the daemons' own ring operations
// (a negotiation round here) are named, so an ordered call made to look
// exactly like one meets a mismatch instead of being answered with the
// nodes' blocks.
func TestNamedRoundsMatchNoOrderedCall(t *testing.T) {
	w := startWorld(t, 2, 1, "")
	cs := everyTrainer(t, w)
	const block = 16 + 1024/8 + 64*128 // the daemon's round block (daemon/negotiate.go)
	errs := onEvery(t, cs, func(r int, c *cvd.Client) error {
		if r == 0 {
			d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Int32, Reduce: collective.Sum, Count: 1, Name: "x", Named: true}
			return c.Do(d, make([]byte, 4))
		}
		d := collective.Desc{Op: collective.OpAllGather, DType: collective.Bytes, Count: block, Name: "collectived: named calls ready"}
		return c.DoInto(d, make([]byte, block), make([]byte, 2*block))
	})
	for r, err := range errs {
		if !errors.Is(err, cvd.ErrMismatch) {
			t.Errorf("rank %d: %v, want MISMATCH", r, err)
		}
	}
}
