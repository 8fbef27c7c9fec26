package ring

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

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

// BenchmarkAllReduceList: a ResNet-50 training step's gradients, the 161
// float32 tensors of bench/resnet50_shapes.txt (102 MB), in world 2 over
// loopback TCP with the daemon's default ring (two streams, 512 KiB
// segments, small_bytes 64 KiB, striped from 2 MiB, 200 us spin), one
// step a b.Loop iteration, copies timed:
//
//   - concat: one AllReduceLocal of all the bytes in one buffer (issue
//     27's reference);
//   - list: one AllReduceList of all 161 on their own buffers;
//   - list+small: AllReduceList of the members that alone take the large
//     path, then the small-path ones fused into buffers of at most
//     small_bytes (Gather, AllReduceChunks, Scatter), as a daemon would;
//   - fused: Gather of all 161 into one buffer, AllReduceChunks, Scatter;
//   - today: daemon/fusion.go's planGroups before AllReduceList: members
//     of a segment or more alone, small-path ones fused among themselves,
//     the rest fused together.
//
// frames/step counts rank 0's data frames sent. On a shared machine the
// variants' times drift apart run to run; "interleaved" runs one step of
// every variant per iteration, in rotating order, and reports each
// variant's median step (ms) and the median of its per-iteration ratio
// to concat: the figures to quote.
func BenchmarkAllReduceList(b *testing.B) {
	st := newResnetStep(b)
	for _, v := range st.variants {
		b.Run(v, func(b *testing.B) {
			drv := newDriver(st.rings, st.ops[v])
			defer drv.stop()
			op0 := func() error { return st.ops[v](0, st.rings[0]) }
			st.frames = 0
			if err := drv.run(op0); err != nil { // warm up
				b.Fatal(err)
			}
			frames := st.frames
			b.SetBytes(int64(4 * st.total))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := drv.run(op0); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(st.nops[v]), "ops/step")
			b.ReportMetric(float64(frames), "frames/step")
		})
	}
	b.Run("interleaved", func(b *testing.B) {
		var cur string
		drv := newDriver(st.rings, func(i int, r *Ring) error { return st.ops[cur](i, r) })
		defer drv.stop()
		times := map[string][]float64{}
		one := func(v string) error {
			cur = v
			t0 := time.Now()
			err := drv.run(func() error { return st.ops[v](0, st.rings[0]) })
			times[v] = append(times[v], float64(time.Since(t0))/1e6)
			return err
		}
		for _, v := range st.variants { // warm up
			if err := one(v); err != nil {
				b.Fatal(err)
			}
		}
		clear(times)
		b.ResetTimer()
		for k := 0; b.Loop(); k++ {
			for j := range st.variants {
				if err := one(st.variants[(k+j)%len(st.variants)]); err != nil {
					b.Fatal(err)
				}
			}
		}
		for _, v := range st.variants {
			b.ReportMetric(median(times[v]), v+"_ms")
			if v != "concat" {
				ratios := make([]float64, len(times[v]))
				for k := range ratios {
					ratios[k] = times[v][k] / times["concat"][k]
				}
				b.ReportMetric(median(ratios), v+"/concat")
			}
		}
	})
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return (s[(len(s)-1)/2] + s[len(s)/2]) / 2
}

// resnetStep is BenchmarkAllReduceList's world and its variants' steps,
// over shared buffers.
type resnetStep struct {
	rings    []*Ring
	total    int
	variants []string
	ops      map[string]func(i int, r *Ring) error
	nops     map[string]int
	frames   uint64 // rank 0's data frames sent, summed over ops
}

func newResnetStep(b *testing.B) *resnetStep {
	counts := resnet50Counts(b)
	const n, seg, small = 2, 512 << 10, 64 << 10
	st := &resnetStep{
		rings: newWorld(b, worldOpts{n: n, streams: 2, tweak: func(c *Config) {
			c.SegmentBytes, c.SmallBytes = seg, small
			c.StripeBytes = StripeSegments * seg
			c.Spin = 200 * time.Microsecond
		}}),
		variants: []string{"concat", "list", "list+small", "fused", "today"},
		ops:      map[string]func(i int, r *Ring) error{},
		nops:     map[string]int{},
	}
	isSmall := func(c int) bool { return 4*c <= small || c < n }
	var large, smalls, middle, alone []int // member indices
	for m, c := range counts {
		st.total += c
		switch {
		case isSmall(c):
			smalls = append(smalls, m)
		default:
			large = append(large, m)
			if 4*c >= seg {
				alone = append(alone, m)
			} else {
				middle = append(middle, m)
			}
		}
	}
	// bufs[i][m]: rank i's buffer of member m (one local buffer).
	bufs := make([][][][]byte, n)
	concat := make([][][]byte, n)
	for i := range bufs {
		for _, c := range counts {
			bufs[i] = append(bufs[i], [][]byte{make([]byte, 4*c)})
		}
		concat[i] = [][]byte{make([]byte, 4*st.total)}
	}
	for _, v := range st.variants {
		var ops []func(i int, r *Ring) error
		switch v {
		case "concat":
			d := sumF32Desc(st.total)
			ops = append(ops, func(i int, r *Ring) error { return r.AllReduceLocal(d, concat[i]) })
		case "list":
			ops = append(ops, listStep(b, counts, nil, n, small, seg, bufs))
		case "list+small":
			ops = append(ops, listStep(b, counts, large, n, small, seg, bufs))
			ops = append(ops, fusedSteps(b, counts, smalls, small, n, small, bufs)...)
		case "fused":
			ops = append(ops, fusedSteps(b, counts, nil, 0, n, small, bufs)...)
		case "today":
			for _, m := range alone {
				d := sumF32Desc(counts[m])
				ops = append(ops, func(i int, r *Ring) error { return r.AllReduceLocal(d, bufs[i][m]) })
			}
			ops = append(ops, fusedSteps(b, counts, smalls, small, n, small, bufs)...)
			ops = append(ops, fusedSteps(b, counts, middle, 64<<20, n, small, bufs)...)
		}
		st.nops[v] = len(ops)
		st.ops[v] = func(i int, r *Ring) error {
			for _, op := range ops {
				if err := op(i, r); err != nil {
					return err
				}
				if i == 0 {
					st.frames += r.sendCount
				}
			}
			return nil
		}
	}
	return st
}

func sumF32Desc(count int) collective.Desc {
	return collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: uint64(count)}
}

// listStep is AllReduceList of the members listed (all if nil) of bufs.
func listStep(b *testing.B, counts, members []int, n, small, seg int, bufs [][][][]byte) func(i int, r *Ring) error {
	if members == nil {
		for m := range counts {
			members = append(members, m)
		}
	}
	sub := make([]int, len(members))
	lists := make([][][][]byte, n)
	for k, m := range members {
		sub[k] = counts[m]
		for i := range lists {
			lists[i] = append(lists[i], bufs[i][m])
		}
	}
	plan, err := PlanList(sub, n, 4, small, seg)
	if err != nil {
		b.Fatal(err)
	}
	d := sumF32Desc(plan.Count)
	return func(i int, r *Ring) error { return r.AllReduceList(d, plan, lists[i]) }
}

// fusedSteps fuses the members listed (all if nil) of bufs, in order,
// into groups of at most limit bytes (0: one group), each a Gather,
// AllReduceChunks and Scatter.
func fusedSteps(b *testing.B, counts, members []int, limit, n, small int, bufs [][][][]byte) []func(i int, r *Ring) error {
	if members == nil {
		for m := range counts {
			members = append(members, m)
		}
	}
	var groups [][]int
	bytes := 0
	for _, m := range members {
		if len(groups) == 0 || limit > 0 && bytes+4*counts[m] > limit {
			groups, bytes = append(groups, nil), 0
		}
		groups[len(groups)-1] = append(groups[len(groups)-1], m)
		bytes += 4 * counts[m]
	}
	var ops []func(i int, r *Ring) error
	for _, g := range groups {
		sub := make([]int, len(g))
		for k, m := range g {
			sub[k] = counts[m]
		}
		plan, err := PlanFusion(sub, n, 4, small)
		if err != nil {
			b.Fatal(err)
		}
		d := sumF32Desc(plan.Count)
		fused := make([][][]byte, n)
		for i := range fused {
			fused[i] = [][]byte{make([]byte, 4*plan.Count)}
		}
		ops = append(ops, func(i int, r *Ring) error {
			for k, m := range g {
				if err := plan.Gather(fused[i][0], k, bufs[i][m][0]); err != nil {
					return err
				}
			}
			if err := r.AllReduceChunks(d, fused[i], plan.Chunks); err != nil {
				return err
			}
			for k, m := range g {
				if err := plan.Scatter(bufs[i][m][0], k, fused[i][0]); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return ops
}

// resnet50Counts reads the element counts of bench/resnet50_shapes.txt.
func resnet50Counts(b *testing.B) []int {
	data, err := os.ReadFile("../bench/resnet50_shapes.txt")
	if err != nil {
		b.Fatal(err)
	}
	var counts []int
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 || strings.HasPrefix(f[0], "#") {
			continue
		}
		c := 1
		for _, d := range strings.Split(f[1], "x") {
			k, err := strconv.Atoi(d)
			if err != nil {
				b.Fatalf("%s: %v", line, err)
			}
			c *= k
		}
		counts = append(counts, c)
	}
	if len(counts) != 161 {
		b.Fatalf("%d tensors in bench/resnet50_shapes.txt, want 161", len(counts))
	}
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
