package ring

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/collectived/collectived/collective"
)

func randBytes(seed uint64, n int) []byte {
	rng := rand.New(rand.NewPCG(seed, 99))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

func TestBroadcastEveryRoot(t *testing.T) {
	for _, w := range []worldOpts{{n: 1}, {n: 2}, {n: 3, streams: 3}, {n: 4}, {n: 7}, {n: 4, pipe: true, streams: 3}} {
		t.Run(fmt.Sprintf("n%d_s%d_pipe%v", w.n, max(w.streams, 1), w.pipe), func(t *testing.T) {
			rings := newWorld(t, w)
			sizes := []int{0, 1, 4095, 4096, 4097, 1<<20 + 3}
			for root := 0; root < w.n; root++ {
				for _, size := range sizes {
					if size > 1<<20 && root > 1 {
						continue
					}
					src := randBytes(uint64(root*1000+size), size)
					bufs := make([][]byte, w.n)
					for i := range bufs {
						bufs[i] = make([]byte, size)
						if i == root {
							copy(bufs[i], src)
						}
					}
					d := collective.Desc{Op: collective.OpBroadcast, DType: collective.Bytes, Count: uint64(size), Root: uint32(root)}
					noErrors(t, d.String(), onAll(t, rings, func(i int, r *Ring) error { return r.Broadcast(d, bufs[i]) }))
					for i := range bufs {
						if !bytes.Equal(bufs[i], src) {
							t.Fatalf("%v: rank %d did not get the root's bytes", d, i)
						}
					}
				}
			}
			// A typed broadcast too.
			d := collective.Desc{Op: collective.OpBroadcast, DType: collective.Float64, Count: 1000, Root: uint32(w.n - 1)}
			src := randBytes(5, 8000)
			bufs := make([][]byte, w.n)
			for i := range bufs {
				bufs[i] = make([]byte, 8000)
			}
			copy(bufs[w.n-1], src)
			noErrors(t, d.String(), onAll(t, rings, func(i int, r *Ring) error { return r.Broadcast(d, bufs[i]) }))
			for i := range bufs {
				if !bytes.Equal(bufs[i], src) {
					t.Fatalf("%v: rank %d wrong", d, i)
				}
			}
		})
	}
}

func TestAllGatherVariableLengths(t *testing.T) {
	for _, w := range []worldOpts{{n: 1}, {n: 2}, {n: 3, streams: 3}, {n: 4}, {n: 7}, {n: 3, pipe: true}} {
		t.Run(fmt.Sprintf("n%d_s%d_pipe%v", w.n, max(w.streams, 1), w.pipe), func(t *testing.T) {
			rings := newWorld(t, w)
			patterns := [][]int{
				{0},            // all empty
				{5},            // all the same
				{0, 1, 4097},   // mixed, zero-length included
				{1<<20 + 3, 0}, // one big, one empty
				{70000, 3, 0, 65536},
			}
			outs := make([][][]byte, w.n)
			for _, p := range patterns {
				ins := make([][]byte, w.n)
				for i := range ins {
					ins[i] = randBytes(uint64(i*7+len(p)), p[i%len(p)])
				}
				d := collective.Desc{Op: collective.OpAllGather, DType: collective.Bytes, Name: "var"}
				noErrors(t, "allgather", onAll(t, rings, func(i int, r *Ring) (err error) {
					outs[i], err = r.AllGather(d, ins[i], outs[i])
					return err
				}))
				for i := range outs {
					if len(outs[i]) != w.n {
						t.Fatalf("rank %d got %d blocks, want %d", i, len(outs[i]), w.n)
					}
					for j := range ins {
						if !bytes.Equal(outs[i][j], ins[j]) {
							t.Fatalf("pattern %v: rank %d's block %d is %d bytes, want rank %d's %d bytes", p, i, j, len(outs[i][j]), j, len(ins[j]))
						}
					}
				}
			}
			// Fixed-size typed allgather: Count states each rank's count.
			d := collective.Desc{Op: collective.OpAllGather, DType: collective.Int32, Count: 3}
			noErrors(t, "typed allgather", onAll(t, rings, func(i int, r *Ring) (err error) {
				in := []byte{byte(i), 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0}
				outs[i], err = r.AllGather(d, in, outs[i])
				if err == nil && outs[i][w.n-1][0] != byte(w.n-1) {
					err = fmt.Errorf("rank %d: block %d starts with %d", i, w.n-1, outs[i][w.n-1][0])
				}
				return err
			}))
		})
	}
}

func TestBarrier(t *testing.T) {
	for _, w := range []worldOpts{{n: 1}, {n: 2}, {n: 4, streams: 3}, {n: 7}, {n: 3, pipe: true}} {
		rings := newWorld(t, w)
		d := collective.Desc{Op: collective.OpBarrier}
		// No rank may leave a barrier before the last one entered it.
		var mu sync.Mutex
		entered := 0
		errs := onAll(t, rings, func(i int, r *Ring) error {
			if i == w.n-1 {
				time.Sleep(100 * time.Millisecond)
			}
			mu.Lock()
			entered++
			mu.Unlock()
			if err := r.Barrier(d); err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			if entered != w.n {
				return fmt.Errorf("rank %d left the barrier after only %d of %d ranks entered", i, entered, w.n)
			}
			return nil
		})
		noErrors(t, fmt.Sprintf("barrier n=%d", w.n), errs)
	}
}

// TestMixedOps interleaves every op on one ring: seq numbers and frame
// accounting per stream must stay in step across ops.
func TestMixedOps(t *testing.T) {
	rings := newWorld(t, worldOpts{n: 3, streams: 3, tweak: func(c *Config) { c.SegmentBytes = 4096 }})
	outs := make([][][]byte, 3)
	for round := 0; round < 5; round++ {
		noErrors(t, "mixed", onAll(t, rings, func(i int, r *Ring) error {
			buf := input(collective.Float32, collective.Sum, i, 9000)
			if err := r.AllReduce(collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 9000}, buf); err != nil {
				return err
			}
			if err := r.Barrier(collective.Desc{Op: collective.OpBarrier}); err != nil {
				return err
			}
			b := make([]byte, 10000)
			if err := r.Broadcast(collective.Desc{Op: collective.OpBroadcast, DType: collective.Bytes, Count: 10000, Root: uint32(round % 3)}, b); err != nil {
				return err
			}
			var err error
			outs[i], err = r.AllGather(collective.Desc{Op: collective.OpAllGather, DType: collective.Bytes}, make([]byte, 5000*i), outs[i])
			return err
		}))
	}
}

func TestSizeOne(t *testing.T) {
	r, err := New(testConfig(0, 1), Links{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Start(); err != nil {
		t.Fatal(err)
	}
	buf := []byte{1, 2, 3, 4}
	if err := r.AllReduce(collective.Desc{Op: collective.OpAllReduce, DType: collective.Int32, Reduce: collective.Sum, Count: 1}, buf); err != nil || !bytes.Equal(buf, []byte{1, 2, 3, 4}) {
		t.Fatalf("allreduce of one: %v %v", err, buf)
	}
	out, err := r.AllGather(collective.Desc{Op: collective.OpAllGather, DType: collective.Bytes}, buf, nil)
	if err != nil || len(out) != 1 || !bytes.Equal(out[0], buf) || &out[0][0] == &buf[0] {
		t.Fatalf("allgather of one must copy: %v %v", err, out)
	}
	if err := r.Barrier(collective.Desc{Op: collective.OpBarrier}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(testConfig(0, 1), Links{Next: []net.Conn{nil}}); err == nil {
		t.Fatal("a world of one accepted links")
	}
	r.Close()
	err = r.Barrier(collective.Desc{Op: collective.OpBarrier})
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v, want ErrClosed", err)
	}
}

var (
	barrierDesc = collective.Desc{Op: collective.OpBarrier}
	arDesc1     = collective.Desc{Op: collective.OpAllReduce, DType: collective.Int32, Reduce: collective.Sum, Count: 1}
)

func bcastDesc(n int) collective.Desc {
	return collective.Desc{Op: collective.OpBroadcast, DType: collective.Bytes, Count: uint64(n)}
}

// TestAllGatherImbalanced: blocks of very different lengths in tiny
// segments, so that ranks push far more frames than they receive in a
// step; nothing may deadlock.
func TestAllGatherImbalanced(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		rings := newWorld(t, worldOpts{n: n, streams: 2, tweak: func(c *Config) { c.SegmentBytes = 64 }})
		for _, p := range [][]int{{100000, 0}, {0, 100000, 100000}, {100000, 1, 100000, 0}} {
			ins := make([][]byte, n)
			for i := range ins {
				ins[i] = randBytes(uint64(i), p[i%len(p)])
			}
			outs := make([][][]byte, n)
			d := collective.Desc{Op: collective.OpAllGather, DType: collective.Bytes}
			noErrors(t, fmt.Sprintf("n=%d %v", n, p), onAll(t, rings, func(i int, r *Ring) (err error) {
				outs[i], err = r.AllGather(d, ins[i], nil)
				return err
			}))
			for i := range outs {
				for j := range ins {
					if !bytes.Equal(outs[i][j], ins[j]) {
						t.Fatalf("n=%d %v: rank %d block %d wrong", n, p, i, j)
					}
				}
			}
		}
	}
}

func TestStatus(t *testing.T) {
	rings := newWorld(t, worldOpts{n: 2})
	st := rings[0].Status()
	if st.Rank != 0 || st.Size != 2 || !st.Started || st.Generation != 11 || st.Seq != 0 || st.Op != collective.OpInvalid || st.Err != nil {
		t.Fatalf("fresh status: %+v", st)
	}
	if st.NextAddr == "" || st.PrevAddr == "" {
		t.Errorf("status names no peers: %+v", st)
	}
	noErrors(t, "barrier", onAll(t, rings, func(i int, r *Ring) error { return r.Barrier(barrierDesc) }))
	if st := rings[1].Status(); st.Seq != 1 || time.Since(st.LastFromPrev) > time.Minute || time.Since(st.LastFromNext) > time.Minute {
		t.Errorf("after one op: %+v", st)
	}
	// While rank 0 waits inside a barrier, its status shows it.
	done := make(chan error, 1)
	go func() { done <- rings[0].Barrier(barrierDesc) }()
	deadline := time.Now().Add(10 * time.Second)
	for rings[0].Status().Op != collective.OpBarrier && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if st := rings[0].Status(); st.Op != collective.OpBarrier || st.Seq != 1 || st.Step != 0 {
		t.Errorf("waiting in barrier: %+v", st)
	}
	if err := rings[1].Barrier(barrierDesc); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	rings[0].Abort(errors.New("test over"))
	if st := rings[0].Status(); !errors.Is(st.Err, ErrAborted) {
		t.Errorf("after abort: %+v", st)
	}
}

// Start agrees on the largest finished count as it does on the
// generation: a rank that failed collectives its peers never learnt of
// tells them how many.
func TestStartAgreesOnFinished(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			rings, _ := faultWorldOver(t, n, true, nil, func(c *Config) { c.Finished = uint64(c.Rank*7 + 3) })
			want := uint64((n-1)*7 + 3)
			for i, r := range rings {
				if got := r.Finished(); got != uint64(i*7+3) {
					t.Errorf("rank %d before Start: Finished %d, want its own %d", i, got, i*7+3)
				}
			}
			startAll(t, rings)
			for i, r := range rings {
				if got := r.Finished(); got != want {
					t.Errorf("rank %d: Finished %d after Start, want the largest, %d", i, got, want)
				}
			}
		})
	}
}

// Start tells every rank whether fresh ranks meet ranks that are not
// (Restarted) and whether any rank's trainers left (AnyVacated).
func TestStartAgreesOnRestart(t *testing.T) {
	for _, c := range []struct {
		name              string
		fresh, vacated    []bool
		restarted, anyVac bool
	}{
		{"all fresh: a job starting", []bool{true, true, true}, []bool{false, false, false}, false, false},
		{"none fresh", []bool{false, false, false}, []bool{false, false, false}, false, false},
		{"one fresh among others", []bool{false, true, false}, []bool{false, false, false}, true, false},
		{"one vacated", []bool{true, true, true}, []bool{false, false, true}, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			rings, _ := faultWorldOver(t, 3, true, nil, func(cfg *Config) {
				cfg.Fresh, cfg.Vacated = c.fresh[cfg.Rank], c.vacated[cfg.Rank]
			})
			startAll(t, rings)
			for i, r := range rings {
				if r.Restarted() != c.restarted || r.AnyVacated() != c.anyVac {
					t.Errorf("rank %d: Restarted %v AnyVacated %v, want %v %v", i, r.Restarted(), r.AnyVacated(), c.restarted, c.anyVac)
				}
			}
		})
	}
}
