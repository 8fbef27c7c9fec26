package ring

import (
	"fmt"
	"testing"

	"github.com/collectived/collectived/collective"
)

// driver runs an op on ranks 1..N-1 in goroutines each time rank 0 runs
// it, without allocating itself, so that AllocsPerRun and benchmarks see
// only the ring's allocations (all ranks' included).
type driver struct {
	start []chan struct{}
	done  chan error
}

func newDriver(rings []*Ring, op func(i int, r *Ring) error) *driver {
	d := &driver{done: make(chan error, len(rings))}
	for i := 1; i < len(rings); i++ {
		c := make(chan struct{})
		d.start = append(d.start, c)
		go func() {
			for range c {
				d.done <- op(i, rings[i])
			}
		}()
	}
	return d
}

func (d *driver) run(op0 func() error) error {
	for _, c := range d.start {
		c <- struct{}{}
	}
	err := op0()
	for range d.start {
		if e := <-d.done; e != nil && err == nil {
			err = e
		}
	}
	return err
}

func (d *driver) stop() {
	for _, c := range d.start {
		close(c)
	}
}

// TestZeroAllocs: on a warmed ring every op allocates nothing, on any rank.
func TestZeroAllocs(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("coverage counters distort allocation counts")
	}
	for _, w := range []worldOpts{{n: 3}, {n: 2, streams: 3}} {
		rings := newWorld(t, w)
		n := w.n
		for _, size := range []int{4, 1000, 64 << 10, 1 << 20} {
			bufs := make([][]byte, n)
			for i := range bufs {
				bufs[i] = make([]byte, size)
			}
			chunks := unevenChunks(size/4, n)
			outs := make([][][]byte, n)
			locals := make([][][]byte, n)
			for i := range locals {
				locals[i] = [][]byte{bufs[i], make([]byte, size), make([]byte, size)}
			}
			ops := map[string]func(i int, r *Ring) error{
				"allreduce-local": func(i int, r *Ring) error {
					return r.AllReduceLocal(collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: uint64(size / 4)}, locals[i])
				},
				"allreduce-chunks": func(i int, r *Ring) error {
					return r.AllReduceChunks(collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: uint64(size / 4)}, locals[i], chunks)
				},
				"allreduce": func(i int, r *Ring) error {
					return r.AllReduce(collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: uint64(size / 4)}, bufs[i])
				},
				"broadcast": func(i int, r *Ring) error {
					return r.Broadcast(collective.Desc{Op: collective.OpBroadcast, DType: collective.Bytes, Count: uint64(size), Root: 1}, bufs[i])
				},
				"allgather": func(i int, r *Ring) (err error) {
					outs[i], err = r.AllGather(collective.Desc{Op: collective.OpAllGather, DType: collective.Bytes}, bufs[i][:size/(i+1)], outs[i])
					return err
				},
				"barrier": func(i int, r *Ring) error { return r.Barrier(collective.Desc{Op: collective.OpBarrier}) },
			}
			for name, op := range ops {
				d := newDriver(rings, op)
				var err error
				allocs := testing.AllocsPerRun(20, func() {
					if e := d.run(func() error { return op(0, rings[0]) }); e != nil {
						err = e
					}
				})
				d.stop()
				if err != nil {
					t.Fatalf("n=%d %s %d B: %v", n, name, size, err)
				}
				if allocs != 0 {
					t.Errorf("n=%d streams=%d %s of %d bytes: %v allocations per call, want 0", n, w.streams, name, size, allocs)
				}
			}
		}
	}
}

// unevenChunks cuts count elements into n chunks for AllReduceChunks:
// half in chunk 0 (a fused buffer's small members go there), the rest
// even, the last chunk taking the remainder.
func unevenChunks(count, n int) []int {
	chunks := make([]int, n)
	rest := count - count/2
	for c := 1; c < n; c++ {
		chunks[c] = rest / (n - 1)
	}
	chunks[0] = count/2 + rest%(n-1)
	return chunks
}

// BenchmarkAllReduce: float32 sum over loopback TCP, all ranks in this
// process. busbw_GB/s is algbw x 2(N-1)/N, as NCCL reports it.
func BenchmarkAllReduce(b *testing.B) {
	for _, n := range []int{2, 4} {
		for _, size := range []int{4, 64 << 10, 1 << 20, 64 << 20} {
			b.Run(fmt.Sprintf("world%d/%s", n, sizeName(size)), func(b *testing.B) {
				benchAllReduce(b, n, 1, size, nil)
			})
		}
	}
}

func benchAllReduce(b *testing.B, n, streams, size int, tweak func(*Config)) {
	benchAllReduceOf(b, collective.Float32, n, streams, size, tweak)
}

// BenchmarkAllReduceElements: 16 Mi elements in world 2, float32 against
// the 16-bit floats (half the bytes, computed in float32).
func BenchmarkAllReduceElements(b *testing.B) {
	for _, dt := range []collective.DType{collective.Float32, collective.BFloat16, collective.Float16} {
		b.Run(dt.String(), func(b *testing.B) { benchAllReduceOf(b, dt, 2, 1, 16<<20*dt.Size(), nil) })
	}
}

func benchAllReduceOf(b *testing.B, dt collective.DType, n, streams, size int, tweak func(*Config)) {
	benchAllReduceChunks(b, dt, n, streams, size, tweak, nil)
}

// benchAllReduceChunks is benchAllReduceOf through AllReduceChunks with
// chunks, or through AllReduce if chunks is nil.
func benchAllReduceChunks(b *testing.B, dt collective.DType, n, streams, size int, tweak func(*Config), chunks []int) {
	rings := newWorld(b, worldOpts{n: n, streams: streams, tweak: tweak})
	d := collective.Desc{Op: collective.OpAllReduce, DType: dt, Reduce: collective.Sum, Count: uint64(size / dt.Size())}
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	op := func(i int, r *Ring) error {
		if chunks == nil {
			return r.AllReduce(d, bufs[i])
		}
		return r.AllReduceChunks(d, bufs[i:i+1], chunks)
	}
	drv := newDriver(rings, op)
	defer drv.stop()
	op0 := func() error { return op(0, rings[0]) }
	if err := drv.run(op0); err != nil { // warm up
		b.Fatal(err)
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := drv.run(op0); err != nil {
			b.Fatal(err)
		}
	}
	algbw := float64(size) * float64(b.N) / b.Elapsed().Seconds() / 1e9
	b.ReportMetric(algbw*2*float64(n-1)/float64(n), "busbw_GB/s")
}

// BenchmarkAllReduceChunks: a fused float32 sum through AllReduceChunks
// against AllReduce of the same bytes (even). "large" fuses eight
// members that each take the large path, so the fused chunks are nearly
// even; "mixed" also fuses eight 16 KiB members that take the small
// path, all in chunk 0, which makes it the longest chunk and sets every
// chunk's segment count. The copies in and out are not timed.
func BenchmarkAllReduceChunks(b *testing.B) {
	const small = 8 * 4096 // eight 16 KiB members, in elements
	for _, n := range []int{2, 4} {
		for _, size := range []int{1 << 20, 16 << 20} {
			count := size / 4
			for _, set := range []struct {
				name   string
				counts []int
			}{
				{"even", nil},
				{"large", evenCounts(count, 8)},
				{"mixed", append(evenCounts(small, 8), evenCounts(count-small, 8)...)},
			} {
				var chunks []int
				if set.counts != nil {
					plan, err := PlanFusion(set.counts, n, 4, DefaultConfig().SmallBytes)
					if err != nil {
						b.Fatal(err)
					}
					chunks = plan.Chunks
				}
				b.Run(fmt.Sprintf("world%d/%s/%s", n, sizeName(size), set.name), func(b *testing.B) {
					benchAllReduceChunks(b, collective.Float32, n, 1, size, nil, chunks)
				})
			}
		}
	}
}

// evenCounts cuts count into k members, the last taking the remainder.
func evenCounts(count, k int) []int {
	counts := make([]int, k)
	for m := range counts {
		counts[m] = count / k
	}
	counts[k-1] += count % k
	return counts
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
