package ring

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/collectived/collectived/collective"
)

// fusionInput is a member's buffer: floats of mixed magnitudes (2^-6 to
// 2^10), whose sums lose different low bits in different orders, so that
// a member folded from another rank than alone shows; integers are
// random bytes (sums wrap). No NaN: which NaN a max of two NaNs gives is
// not fixed.
func fusionInput(dt collective.DType, rng *rand.Rand, count int) []byte {
	es := dt.Size()
	b := make([]byte, count*es)
	for e := 0; e < count; e++ {
		if dt.Float() {
			dt.Put(b[e*es:], math.Ldexp(rng.Float64()*2-1, rng.IntN(17)-6))
			continue
		}
		for k := 0; k < es; k++ {
			b[e*es+k] = byte(rng.Uint32())
		}
	}
	return b
}

// fuseAndCompare runs every member (d with counts[m] elements) alone
// through AllReduceLocal with L local buffers per rank, then all of them
// fused through AllReduceChunks as plan lays them out, and returns the
// first member whose bytes differ on some rank and buffer ("" if none).
func fuseAndCompare(t *testing.T, rings []*Ring, d collective.Desc, plan *Fusion, counts []int, L int, seed uint64) string {
	t.Helper()
	n, es := len(rings), d.DType.Size()
	rng := rand.New(rand.NewPCG(seed, uint64(d.DType)<<8|uint64(d.Reduce)))
	// in[i][l][m]: rank i's local buffer l of member m.
	in := make([][][][]byte, n)
	alone := make([][][][]byte, n)
	for i := range in {
		in[i], alone[i] = make([][][]byte, L), make([][][]byte, L)
		for l := range in[i] {
			for _, count := range counts {
				b := fusionInput(d.DType, rng, count)
				in[i][l] = append(in[i][l], b)
				alone[i][l] = append(alone[i][l], bytes.Clone(b))
			}
		}
	}
	for m, count := range counts {
		dm := d
		dm.Count = uint64(count)
		noErrors(t, fmt.Sprintf("member %d alone", m), onAll(t, rings, func(i int, r *Ring) error {
			bufs := make([][]byte, L)
			for l := range bufs {
				bufs[l] = alone[i][l][m]
			}
			return r.AllReduceLocal(dm, bufs)
		}))
	}
	fused := make([][][]byte, n)
	for i := range fused {
		for l := 0; l < L; l++ {
			f := make([]byte, plan.Count*es)
			for m := range counts {
				if err := plan.Gather(f, m, in[i][l][m]); err != nil {
					t.Fatal(err)
				}
			}
			fused[i] = append(fused[i], f)
		}
	}
	fd := d
	fd.Count = uint64(plan.Count)
	noErrors(t, "fused", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduceChunks(fd, fused[i], plan.Chunks) }))
	for i := range fused {
		for l, f := range fused[i] {
			for m, count := range counts {
				got := make([]byte, count*es)
				if err := plan.Scatter(got, m, f); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, alone[i][l][m]) {
					return fmt.Sprintf("member %d (%d elements) on rank %d buffer %d differs at element %d", m, count, i, l, byteDiff(got, alone[i][l][m])/es)
				}
			}
		}
	}
	return ""
}

type fusionOp struct {
	op        collective.ReduceOp
	pre, post float64
}

var (
	fusionDTypes = []collective.DType{collective.Float32, collective.Float64, collective.Float16, collective.BFloat16,
		collective.Int32, collective.Int64, collective.Int8, collective.Uint8}
	fusionFloatOps = []fusionOp{{collective.Sum, 0, 0}, {collective.Avg, 0, 0}, {collective.Max, 0, 0},
		{collective.Sum, 1.1, 0.3}, {collective.Avg, 1.1, 0}, {collective.Sum, 0, 0.3}}
	fusionIntOps = []fusionOp{{collective.Sum, 0, 0}, {collective.Max, 0, 0}}
)

// fusionSets are member counts for a ring of n whose SmallBytes holds s
// elements: a mix of every kind (empty, tiny, just under, at and over
// the small limit, not divisible by n, and one whose chunks are longer
// than a segment, so that it pipelines alone); large members only;
// small members only, more than the small limit in all (the fused
// buffer takes the large path, all in chunk 0, the other chunks empty);
// small members only, within it.
func fusionSets(s, n int) [][]int {
	big := 9*s + 7
	return [][]int{
		{1, 0, s - 1, s + 1, big, 3, s, s + 2},
		{s + 1, big, s + n + 1},
		{s, s - 1, 3},
		{1, 3, s / 4},
	}
}

// TestFusionMatchesAlone: for worlds of one to four ranks with one and
// two local buffers, every dtype, sum, avg and max with and without
// scales, and member sets mixing every size, the members fused by
// PlanFusion and run through AllReduceChunks get byte for byte what
// each gets alone from AllReduceLocal, whenever Exact says so; when it
// says not, fusing really does change some member's bits (so the
// predicate is needed, not just careful).
func TestFusionMatchesAlone(t *testing.T) {
	const small = 4096
	for _, n := range []int{1, 2, 3, 4} {
		for _, L := range []int{1, 2} {
			t.Run(fmt.Sprintf("n%d_L%d", n, L), func(t *testing.T) {
				rings := newWorld(t, worldOpts{n: n, tweak: func(c *Config) {
					c.Local, c.SmallBytes, c.SegmentBytes = L, small, 4096
				}})
				var exacts, inexacts int
				defer func() {
					t.Logf("%d member sets fused bit-identically, %d refused by Exact and seen to differ", exacts, inexacts)
				}()
				for _, dt := range fusionDTypes {
					ops := fusionIntOps
					if dt.Float() {
						ops = fusionFloatOps
					}
					es := dt.Size()
					for _, op := range ops {
						d := collective.Desc{Op: collective.OpAllReduce, DType: dt, Reduce: op.op, PreScale: op.pre, PostScale: op.post}
						for k, counts := range fusionSets(small/es, n) {
							name := fmt.Sprintf("%s/%s_pre%v_post%v/set%d", dt, op.op, op.pre, op.post, k)
							plan, err := PlanFusion(counts, n, es, small)
							if err != nil {
								t.Fatal(err)
							}
							exact := plan.Exact(d, L)
							if !dt.Half() && !exact {
								t.Fatalf("%s: Exact false for a dtype that always fuses", name)
							}
							diff := fuseAndCompare(t, rings, d, plan, counts, L, uint64(1000*n+100*L+k))
							switch {
							case exact && diff != "":
								t.Fatalf("%s: fused result differs from alone: %s", name, diff)
							case !exact && diff == "":
								t.Fatalf("%s: Exact says no, yet fusing changed nothing", name)
							case exact:
								exacts++
							default:
								inexacts++
							}
						}
					}
				}
			})
		}
	}
}

// TestFusionDefaultSizes: the same comparison with the default segment
// and small-message sizes, a member of several segments per chunk and
// three streams, for the float types.
func TestFusionDefaultSizes(t *testing.T) {
	for _, n := range []int{2, 3} {
		rings := newWorld(t, worldOpts{n: n, streams: 3})
		small := rings[0].cfg.SmallBytes
		for _, dt := range []collective.DType{collective.Float32, collective.BFloat16} {
			s := small / dt.Size()
			counts := []int{s + 1, 7, 3*rings[0].cfg.SegmentBytes/dt.Size()*n + 5, s - 1}
			plan, err := PlanFusion(counts, n, dt.Size(), small)
			if err != nil {
				t.Fatal(err)
			}
			d := collective.Desc{Op: collective.OpAllReduce, DType: dt, Reduce: collective.Sum}
			if !plan.Exact(d, 1) {
				// 16-bit small members do not fuse with large ones here:
				// fuse the large ones, as a daemon would.
				counts = []int{counts[0], counts[2]}
				if plan, err = PlanFusion(counts, n, dt.Size(), small); err != nil || !plan.Exact(d, 1) {
					t.Fatalf("%s n=%d: large members alone: %v, exact %v", dt, n, err, plan.Exact(d, 1))
				}
			}
			if diff := fuseAndCompare(t, rings, d, plan, counts, 1, 7); diff != "" {
				t.Fatalf("%s n=%d: %s", dt, n, diff)
			}
		}
	}
}

// PlanFusion's layout, worked by hand: n=3, 4-byte elements, small_bytes
// 8. Member 0 (1 element) takes the small path alone, so all of it is in
// chunk 0; member 1 (7) is cut 3+2+2 and member 2 (10) 4+3+3, as the
// ring cuts them.
func TestPlanFusionLayout(t *testing.T) {
	plan, err := PlanFusion([]int{1, 7, 10}, 3, 4, 8)
	if err != nil {
		t.Fatal(err)
	}
	if plan.Count != 18 || fmt.Sprint(plan.Chunks) != "[8 5 5]" {
		t.Fatalf("count %d chunks %v, want 18 [8 5 5]", plan.Count, plan.Chunks)
	}
	want := map[[2]int][3]int{ // {member, chunk}: {at, off, count}
		{0, 0}: {0, 0, 1}, {0, 1}: {8, 1, 0}, {0, 2}: {13, 1, 0},
		{1, 0}: {1, 0, 3}, {1, 1}: {8, 3, 2}, {1, 2}: {13, 5, 2},
		{2, 0}: {4, 0, 4}, {2, 1}: {10, 4, 3}, {2, 2}: {15, 7, 3},
	}
	for k, w := range want {
		if at, off, count := plan.Piece(k[0], k[1]); [3]int{at, off, count} != w {
			t.Errorf("Piece(%d, %d) = %d, %d, %d; want %v", k[0], k[1], at, off, count, w)
		}
	}
	// Gather then Scatter gives every member back; the fused buffer is
	// filled whole.
	fused := bytes.Repeat([]byte{0xee}, plan.Count*4)
	members := [][]byte{}
	for m, count := range []int{1, 7, 10} {
		b := make([]byte, count*4)
		for i := range b {
			b[i] = byte(m*40 + i)
		}
		members = append(members, b)
		if err := plan.Gather(fused, m, b); err != nil {
			t.Fatal(err)
		}
	}
	if bytes.Contains(fused, []byte{0xee}) {
		t.Fatalf("fused buffer has bytes no member filled: %x", fused)
	}
	for m, b := range members {
		got := make([]byte, len(b))
		if err := plan.Scatter(got, m, fused); err != nil || !bytes.Equal(got, b) {
			t.Fatalf("member %d: scatter gave %x (%v), want %x", m, got, err, b)
		}
	}
	for _, err := range []error{
		plan.Gather(fused, 3, nil),
		plan.Gather(fused, 1, make([]byte, 4)),
		plan.Scatter(make([]byte, 4), 0, fused[4:]),
		func() error { _, err := PlanFusion([]int{1, -1}, 2, 4, 8); return err }(),
		func() error { _, err := PlanFusion([]int{1}, 0, 4, 8); return err }(),
	} {
		if !errors.Is(err, collective.ErrInvalid) {
			t.Errorf("got %v, want ErrInvalid", err)
		}
	}
}

// In a world of one every member fuses: nothing goes on a ring.
func TestFusibleSmall(t *testing.T) {
	for _, c := range []struct {
		dt        collective.DType
		op        collective.ReduceOp
		pre, post float64
		n, locals int
		want      bool
	}{
		{collective.Float32, collective.Sum, 2, 3, 4, 2, true},
		{collective.Int8, collective.Sum, 0, 0, 4, 2, true},
		{collective.Float16, collective.Sum, 2, 3, 1, 2, true},
		{collective.Float16, collective.Sum, 0, 3, 2, 1, true},
		{collective.Float16, collective.Sum, 1, 0, 2, 1, true}, // a prescale of 1 is none
		{collective.BFloat16, collective.Sum, 2, 0, 2, 1, false},
		{collective.BFloat16, collective.Avg, 0, 0, 2, 2, false},
		{collective.BFloat16, collective.Sum, 0, 0, 3, 1, false},
		{collective.Float16, collective.Max, 0, 0, 4, 2, true},
		{collective.BFloat16, collective.Min, 0, 0, 3, 1, true},
		{collective.Float16, collective.Prod, 0, 0, 3, 1, false},
	} {
		d := collective.Desc{Op: collective.OpAllReduce, DType: c.dt, Reduce: c.op, PreScale: c.pre, PostScale: c.post}
		if got := FusibleSmall(d, c.n, c.locals); got != c.want {
			t.Errorf("FusibleSmall(%v, n=%d, locals=%d) = %v, want %v", d, c.n, c.locals, got, c.want)
		}
	}
}
