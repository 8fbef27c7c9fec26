package ring

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/collectived/collectived/collective"
)

// listInputs makes every rank's members: in[i][m][l] is rank i's local
// buffer l of member m (fusionInput's values), and alone a copy of it.
func listInputs(d collective.Desc, n, L int, counts []int, seed uint64) (in, alone [][][][]byte) {
	rng := rand.New(rand.NewPCG(seed, uint64(d.DType)<<8|uint64(d.Reduce)))
	in, alone = make([][][][]byte, n), make([][][][]byte, n)
	for i := range in {
		for _, count := range counts {
			var ms, as [][]byte
			for l := 0; l < L; l++ {
				b := fusionInput(d.DType, rng, count)
				ms, as = append(ms, b), append(as, bytes.Clone(b))
			}
			in[i], alone[i] = append(in[i], ms), append(alone[i], as)
		}
	}
	return in, alone
}

// runAlone runs every member (d with counts[m] elements) on its own
// through AllReduceLocal, in member order.
func runAlone(t *testing.T, rings []*Ring, d collective.Desc, counts []int, bufs [][][][]byte) {
	t.Helper()
	for m, count := range counts {
		dm := d
		dm.Count = uint64(count)
		noErrors(t, fmt.Sprintf("member %d alone", m), onAll(t, rings, func(i int, r *Ring) error {
			return r.AllReduceLocal(dm, bufs[i][m])
		}))
	}
}

// listDiff is the first member whose bytes differ between got and want
// on some rank and local buffer ("" if none).
func listDiff(got, want [][][][]byte, es int) string {
	for i := range got {
		for m := range got[i] {
			for l := range got[i][m] {
				if g, w := got[i][m][l], want[i][m][l]; !bytes.Equal(g, w) {
					return fmt.Sprintf("member %d (%d elements) on rank %d buffer %d differs at element %d", m, len(g)/es, i, l, byteDiff(g, w)/es)
				}
			}
		}
	}
	return ""
}

// listAndCompare runs the members alone and then as one AllReduceList
// on their own buffers, and returns listDiff of the two.
func listAndCompare(t *testing.T, rings []*Ring, d collective.Desc, plan *List, counts []int, L int, seed uint64) string {
	t.Helper()
	in, alone := listInputs(d, len(rings), L, counts, seed)
	runAlone(t, rings, d, counts, alone)
	ld := d
	ld.Count = uint64(plan.Count)
	noErrors(t, "list", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduceList(ld, plan, in[i]) }))
	return listDiff(in, alone, d.DType.Size())
}

// listSets are fusionSets plus large members only, of mixed sizes (one
// just over the small limit, several longer than a segment per chunk,
// none divisible by n), with empty members between them.
func listSets(s, n int) [][]int {
	return append(fusionSets(s, n), []int{s + 1, 0, 5*s + 3, 0, 2*s + n + 1, 17 * s})
}

// TestAllReduceListMatchesAlone: for worlds of one to four ranks with one
// and two local buffers, every dtype, sum, avg and max with and without
// scales, and member sets mixing every size, AllReduceList gives every
// member on every rank and local buffer byte for byte what it gets alone
// from AllReduceLocal, whenever the plan is Exact; when it is not, the
// call is refused and the ring goes on.
func TestAllReduceListMatchesAlone(t *testing.T) {
	const small, seg = 4096, 4096
	for _, n := range []int{1, 2, 3, 4} {
		for _, L := range []int{1, 2} {
			t.Run(fmt.Sprintf("n%d_L%d", n, L), func(t *testing.T) {
				rings := newWorld(t, worldOpts{n: n, tweak: func(c *Config) {
					c.Local, c.SmallBytes, c.SegmentBytes = L, small, seg
				}})
				var exacts, refused int
				defer func() { t.Logf("%d member sets bit-identical, %d refused as not exact", exacts, refused) }()
				for _, dt := range fusionDTypes {
					ops := fusionIntOps
					if dt.Float() {
						ops = fusionFloatOps
					}
					es := dt.Size()
					for _, op := range ops {
						d := collective.Desc{Op: collective.OpAllReduce, DType: dt, Reduce: op.op, PreScale: op.pre, PostScale: op.post, Name: "list"}
						for k, counts := range listSets(small/es, n) {
							name := fmt.Sprintf("%s/%s_pre%v_post%v/set%d", dt, op.op, op.pre, op.post, k)
							plan, err := PlanList(counts, n, es, small, seg)
							if err != nil {
								t.Fatal(err)
							}
							if !plan.Exact(d, L) {
								in, _ := listInputs(d, n, L, counts, 1)
								ld := d
								ld.Count = uint64(plan.Count)
								errs := onAll(t, rings, func(i int, r *Ring) error { return r.AllReduceList(ld, plan, in[i]) })
								for i, err := range errs {
									if !errors.Is(err, collective.ErrInvalid) || !strings.Contains(err.Error(), "FusibleSmall") {
										t.Fatalf("%s: rank %d: a plan that is not exact gave %v, want ErrInvalid naming FusibleSmall", name, i, err)
									}
								}
								refused++
								continue
							}
							if diff := listAndCompare(t, rings, d, plan, counts, L, uint64(1000*n+100*L+k)); diff != "" {
								t.Fatalf("%s: list result differs from alone: %s", name, diff)
							}
							exacts++
						}
					}
				}
			})
		}
	}
}

// TestAllReduceListDefaultSizes: the default segment and small-message
// sizes, three streams (frames striped over them, the allgather received
// in place into the members' buffers), members of several segments per
// chunk: AllReduceList gives every member what it gets alone and what
// Gather, AllReduceChunks and Scatter of the same plan give it.
func TestAllReduceListDefaultSizes(t *testing.T) {
	for _, n := range []int{2, 3} {
		rings := newWorld(t, worldOpts{n: n, streams: 3})
		cfg := rings[0].cfg
		for _, dt := range []collective.DType{collective.Float32, collective.BFloat16} {
			es := dt.Size()
			s, seg := cfg.SmallBytes/es, cfg.SegmentBytes/es
			counts := []int{s + 1, 16*seg*n + 5, 0, seg*n - 1, 2*s + 3}
			plan, err := PlanList(counts, n, es, cfg.SmallBytes, cfg.SegmentBytes)
			if err != nil {
				t.Fatal(err)
			}
			d := collective.Desc{Op: collective.OpAllReduce, DType: dt, Reduce: collective.Avg, PostScale: 0.5}
			if !plan.Exact(d, 1) {
				t.Fatalf("%s: large members only, yet not exact", dt)
			}
			in, alone := listInputs(d, n, 1, counts, 11)
			fusedIn, _ := listInputs(d, n, 1, counts, 11)
			runAlone(t, rings, d, counts, alone)
			placed := rings[0].inPlace
			ld := d
			ld.Count = uint64(plan.Count)
			noErrors(t, "list", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduceList(ld, plan, in[i]) }))
			// As TestReceiveInPlace: all but the frames of the first
			// receive buffers' turns of each stream land in place.
			gathered, least := (n-1)*plan.Segments(), (n-1)*plan.Segments()-2*rxBuffers*3
			if got := int(rings[0].inPlace - placed); got < least || got == 0 {
				t.Errorf("%s n=%d: %d of %d allgather frames received in place, want at least %d", dt, n, got, gathered, max(least, 1))
			}
			if diff := listDiff(in, alone, es); diff != "" {
				t.Fatalf("%s n=%d: list against alone: %s", dt, n, diff)
			}
			// The copying fused path, of the same plan.
			noErrors(t, "fused", onAll(t, rings, func(i int, r *Ring) error {
				fused := make([]byte, plan.Count*es)
				for m := range counts {
					if err := plan.Gather(fused, m, fusedIn[i][m][0]); err != nil {
						return err
					}
				}
				if err := r.AllReduceChunks(ld, [][]byte{fused}, plan.Chunks); err != nil {
					return err
				}
				for m := range counts {
					if err := plan.Scatter(fusedIn[i][m][0], m, fused); err != nil {
						return err
					}
				}
				return nil
			}))
			if diff := listDiff(in, fusedIn, es); diff != "" {
				t.Fatalf("%s n=%d: list against Gather, AllReduceChunks, Scatter: %s", dt, n, diff)
			}
		}
	}
}

// TestAllReduceListOrderMatters: the inputs are such that a member
// folded from other ranks than alone gets other bits, so the comparisons
// above would see a list that laid a member's chunks anywhere but where
// they go alone: each member run with all its elements in chunk 1
// (folded from rank 1, as a wrong layout might) differs from the list's
// result.
func TestAllReduceListOrderMatters(t *testing.T) {
	const small, seg = 4096, 4096
	n := 3
	rings := newWorld(t, worldOpts{n: n, tweak: func(c *Config) { c.SmallBytes, c.SegmentBytes = small, seg }})
	d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum}
	counts := []int{small/4 + 1, 9*small/4 + 7}
	plan, err := PlanList(counts, n, 4, small, seg)
	if err != nil {
		t.Fatal(err)
	}
	in, wrong := listInputs(d, n, 1, counts, 5)
	ld := d
	ld.Count = uint64(plan.Count)
	noErrors(t, "list", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduceList(ld, plan, in[i]) }))
	for m, count := range counts {
		dm := d
		dm.Count = uint64(count)
		chunks := []int{0, count, 0}
		noErrors(t, "wrong chunks", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduceChunks(dm, wrong[i][m], chunks) }))
		for i := range in {
			if bytes.Equal(in[i][m][0], wrong[i][m][0]) {
				t.Errorf("member %d on rank %d: folding it from rank 1 gave the same bits; the inputs cannot tell a wrong layout", m, i)
			}
		}
	}
}

// TestAllReduceListErrors: arguments that do not fit the plan or the
// ring are refused with ErrInvalid before the ring is touched: every
// rank's next op runs at the same seq.
func TestAllReduceListErrors(t *testing.T) {
	const small, seg = 4096, 4096
	n := 3
	rings := newWorld(t, worldOpts{n: n, tweak: func(c *Config) { c.SmallBytes, c.SegmentBytes = small, seg }})
	counts := []int{2000, 7, 3000}
	plan, err := PlanList(counts, n, 4, small, seg)
	if err != nil {
		t.Fatal(err)
	}
	d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: uint64(plan.Count)}
	good := func(L int) [][][]byte {
		ms := make([][][]byte, len(counts))
		for m, c := range counts {
			for l := 0; l < L; l++ {
				ms[m] = append(ms[m], make([]byte, 4*c))
			}
		}
		return ms
	}
	other := func(counts []int, n, es, small, seg int) *List {
		p, err := PlanList(counts, n, es, small, seg)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	half := d
	half.DType = collective.BFloat16
	halfSmall := other([]int{10, 5000}, n, 2, small, seg)
	half.Count = uint64(halfSmall.Count)
	for _, c := range []struct {
		name    string
		d       collective.Desc
		plan    *List
		members [][][]byte
		want    string
	}{
		{"no plan", d, nil, good(1), "without a plan"},
		{"dtype", func() collective.Desc { x := d; x.DType = collective.Float64; return x }(), plan, good(1), "4-byte elements"},
		{"world", d, other(counts, 2, 4, small, seg), good(1), "plan for 2 ranks"},
		{"small_bytes", d, other(counts, n, 4, 2*small, seg), good(1), "small_bytes 8192"},
		{"segment_bytes", d, other(counts, n, 4, small, 2*seg), good(1), "segment_bytes 8192"},
		{"members", d, plan, good(1)[:2], "2 members for a plan of 3"},
		{"count", func() collective.Desc { x := d; x.Count++; return x }(), plan, good(1), "needs"},
		{"no buffers", d, plan, [][][]byte{nil, nil, nil}, "member 0 has no buffers"},
		{"local buffers", d, plan, func() [][][]byte { ms := good(2); ms[1] = ms[1][:1]; return ms }(), "member 1 has 1 local buffers, member 0 has 2"},
		{"size", d, plan, func() [][][]byte { ms := good(2); ms[2][1] = ms[2][1][:4]; return ms }(), "member 2's local buffer 1 is 4 bytes"},
		{"not exact", half, halfSmall, [][][]byte{{make([]byte, 20)}, {make([]byte, 10000)}}, "FusibleSmall"},
		{"op", func() collective.Desc { x := d; x.Op = collective.OpBroadcast; return x }(), plan, good(1), "called with a broadcast"},
	} {
		err := rings[0].AllReduceList(c.d, c.plan, c.members)
		if !errors.Is(err, collective.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want ErrInvalid saying %q", c.name, err, c.want)
		}
	}
	for _, err := range []error{
		func() error { _, err := PlanList(counts, n, 4, small, 2); return err }(),
		func() error { _, err := PlanList([]int{-1}, n, 4, small, seg); return err }(),
	} {
		if !errors.Is(err, collective.ErrInvalid) {
			t.Errorf("PlanList: got %v, want ErrInvalid", err)
		}
	}
	// Nothing was sent: the ranks still agree on the next op.
	noErrors(t, "list after refusals", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduceList(d, plan, good(2)) }))
}

// TestPlanListSegments: segments never cross a member, every member's
// piece of every chunk is cut into the same parts (its longest chunk's
// segments), an empty member takes none, and the segments of a chunk,
// in order, cover each member's piece exactly.
func TestPlanListSegments(t *testing.T) {
	// n=3, 4-byte elements, small_bytes 8, segments of 3 elements: member
	// 0 (1 element) takes the small path (chunk 0 only, one part); member
	// 1 (7: 3+2+2) one part; member 2 empty; member 3 (20: 7+7+6) three.
	plan, err := PlanList([]int{1, 7, 0, 20}, 3, 4, 8, 12)
	if err != nil {
		t.Fatal(err)
	}
	if plan.Segments() != 5 || fmt.Sprint(plan.parts) != "[1 1 0 3]" {
		t.Fatalf("%d segments, parts %v; want 5, [1 1 0 3]", plan.Segments(), plan.parts)
	}
	want := [3][5][3]int{ // [chunk][segment]: member, byte offset, bytes
		{{0, 0, 4}, {1, 0, 12}, {3, 0, 12}, {3, 12, 8}, {3, 20, 8}},
		{{0, 4, 0}, {1, 12, 8}, {3, 28, 12}, {3, 40, 8}, {3, 48, 8}},
		{{0, 4, 0}, {1, 20, 8}, {3, 56, 8}, {3, 64, 8}, {3, 72, 8}},
	}
	for c := range want {
		for j, w := range want[c] {
			if m, off, l := plan.segment(c, j); [3]int{m, off, l} != w {
				t.Errorf("segment %d of chunk %d = %d, %d, %d; want %v", j, c, m, off, l, w)
			}
		}
	}
}

// TestAllReduceListZeroAllocs: a reused plan allocates nothing per call,
// on the small path and the large, with one and two local buffers.
func TestAllReduceListZeroAllocs(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("coverage counters distort allocation counts")
	}
	for _, w := range []worldOpts{{n: 3}, {n: 2, streams: 3}} {
		rings := newWorld(t, w)
		cfg := rings[0].cfg
		for _, counts := range [][]int{{3, 100, 0, 9}, {5000, 0, 70000, 300000, 17}} {
			plan, err := PlanList(counts, w.n, 4, cfg.SmallBytes, cfg.SegmentBytes)
			if err != nil {
				t.Fatal(err)
			}
			d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Avg, Count: uint64(plan.Count)}
			for _, L := range []int{1, 2} {
				members := make([][][][]byte, w.n)
				for i := range members {
					for _, c := range counts {
						var bufs [][]byte
						for l := 0; l < L; l++ {
							bufs = append(bufs, make([]byte, 4*c))
						}
						members[i] = append(members[i], bufs)
					}
				}
				op := func(i int, r *Ring) error { return r.AllReduceList(d, plan, members[i]) }
				noErrors(t, "warm-up", onAll(t, rings, op))
				if allocs := allocsPerOp(t, rings, 20, op); allocs != 0 {
					t.Errorf("n=%d streams=%d counts %v L=%d: %v allocations per call, want 0", w.n, w.streams, counts, L, allocs)
				}
			}
		}
	}
}
