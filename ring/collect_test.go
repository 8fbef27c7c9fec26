package ring

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/collectived/collectived/collective"
)

// The reference below computes, element by element, what docs/PROTOCOL.md
// ("Reductions") and ring/doc.go ("Reduction order") say a reduction of
// float32, float16 or bfloat16 gives, with its own scalar arithmetic.

type refType struct {
	dt collective.DType
}

func (t refType) load(b []byte, i int) float32 {
	switch t.dt {
	case collective.Float16:
		return collective.Float16ToFloat32(binary.LittleEndian.Uint16(b[2*i:]))
	case collective.BFloat16:
		return collective.BFloat16ToFloat32(binary.LittleEndian.Uint16(b[2*i:]))
	}
	return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
}

// round is the rounding where a value is written: to the 16-bit type, or
// none for float32 (every float32 operation rounds by itself).
func (t refType) round(v float32) float32 {
	switch t.dt {
	case collective.Float16:
		return collective.Float16ToFloat32(collective.Float32ToFloat16(v))
	case collective.BFloat16:
		return collective.BFloat16ToFloat32(collective.Float32ToBFloat16(v))
	}
	return v
}

func (t refType) store(b []byte, i int, v float32) {
	switch t.dt {
	case collective.Float16:
		binary.LittleEndian.PutUint16(b[2*i:], collective.Float32ToFloat16(v))
	case collective.BFloat16:
		binary.LittleEndian.PutUint16(b[2*i:], collective.Float32ToBFloat16(v))
	default:
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
}

type refCall struct {
	t              refType
	op             collective.ReduceOp
	pre, div, post float32
}

func (c refCall) apply(a, b float32) float32 {
	switch c.op {
	case collective.Prod:
		return a * b
	case collective.Max:
		return max(a, b)
	case collective.Min:
		return min(a, b)
	}
	return a + b
}

// local folds node i's inputs at element e: for the 16-bit types in
// float32, unrounded; for float32 each operation rounded.
func (c refCall) local(ins [][]byte, e int) float32 {
	v := c.t.load(ins[0], e)
	if c.pre != 0 {
		v *= c.pre
	}
	for _, in := range ins[1:] {
		x := c.t.load(in, e)
		if c.pre != 0 {
			x *= c.pre
		}
		v = c.apply(v, x)
	}
	return v
}

func (c refCall) finish(v float32) float32 {
	if c.div != 0 {
		v /= c.div
	}
	if c.post != 0 {
		v *= c.post
	}
	return v
}

// chain folds element e around the ring starting at node start: the
// partial written to the ring is rounded at every hop, and the last node
// finishes the value before its one rounding.
func (c refCall) chain(nodes [][][]byte, e, start int) float32 {
	n := len(nodes)
	acc := c.t.round(c.local(nodes[start], e))
	if n == 1 {
		return c.t.round(c.finish(c.local(nodes[start], e)))
	}
	for k := 1; k < n; k++ {
		v := c.apply(acc, c.local(nodes[(start+k)%n], e))
		if k == n-1 {
			v = c.finish(v)
		}
		acc = c.t.round(v)
	}
	return acc
}

// small is the small path: every node's rounded partial, folded in node
// order in float32, finished, rounded once.
func (c refCall) small(nodes [][][]byte, e int) float32 {
	acc := c.t.round(c.local(nodes[0], e))
	for i := 1; i < len(nodes); i++ {
		acc = c.apply(acc, c.t.round(c.local(nodes[i], e)))
	}
	if len(nodes) == 1 {
		acc = c.local(nodes[0], e)
	}
	return c.t.round(c.finish(acc))
}

func randFloats(t refType, seed uint64, n int) []byte {
	rng := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n*t.dt.Size())
	for i := 0; i < n; i++ {
		t.store(b, i, float32(rng.NormFloat64()*3))
	}
	return b
}

// TestReductionsFollowTheDocumentedOrder checks allreduce, reduce and
// reduce_scatter of float32 and the 16-bit floats, with avg and scales,
// bit for bit against the reference, on rings of one to four ranks with
// one or two local inputs, in the small and the large path.
func TestReductionsFollowTheDocumentedOrder(t *testing.T) {
	for _, w := range []struct{ n, local int }{{1, 2}, {2, 1}, {3, 2}, {4, 1}} {
		rings := newWorld(t, worldOpts{n: w.n, tweak: func(c *Config) { c.Local = w.local; c.SmallBytes = 4096 }})
		world := w.n * w.local
		for _, dt := range []collective.DType{collective.Float32, collective.Float16, collective.BFloat16} {
			ty := refType{dt}
			for _, sc := range []struct {
				op        collective.ReduceOp
				pre, post float64
			}{{collective.Sum, 0, 0}, {collective.Avg, 0, 0}, {collective.Sum, 0.5, 3}, {collective.Avg, 1.5, 0.25}, {collective.Max, 0, 0}, {collective.Prod, 0, 0}} {
				for _, count := range []int{0, 1, 3, 5000, 70001} {
					name := fmt.Sprintf("n%d_l%d_%s_%s_pre%v_post%v_%d", w.n, w.local, dt, sc.op, sc.pre, sc.post, count)
					ref := refCall{t: ty, op: sc.op, pre: float32(sc.pre), post: float32(sc.post)}
					if sc.op == collective.Avg {
						ref.div = float32(world)
					}
					nodes := make([][][]byte, w.n)
					for i := range nodes {
						for l := 0; l < w.local; l++ {
							nodes[i] = append(nodes[i], randFloats(ty, uint64(i*10+l+count), count))
						}
					}
					d := collective.Desc{Op: collective.OpAllReduce, DType: dt, Reduce: sc.op, Count: uint64(count), PreScale: sc.pre, PostScale: sc.post}
					es := dt.Size()
					smallPath := count*es <= 4096 || count < w.n
					want := make([]byte, count*es)
					p := newPartition(count, w.n, es, 1<<30, nil)
					for e := 0; e < count; e++ {
						var v float32
						if smallPath {
							v = ref.small(nodes, e)
						} else {
							chunk := 0
							for c := 0; c < w.n; c++ {
								if _, o, l := p.segment(c, 0); e*es >= o && e*es < o+l {
									chunk = c
								}
							}
							v = ref.chain(nodes, e, chunk)
						}
						ty.store(want, e, v)
					}
					// allreduce: every local buffer ends with the result.
					bufs := make([][][]byte, w.n)
					for i := range bufs {
						for _, in := range nodes[i] {
							bufs[i] = append(bufs[i], bytes.Clone(in))
						}
					}
					noErrors(t, name, onAll(t, rings, func(i int, r *Ring) error { return r.AllReduceLocal(d, bufs[i]) }))
					for i := range bufs {
						for l, b := range bufs[i] {
							if !bytes.Equal(b, want) {
								t.Fatalf("%s: allreduce on node %d buffer %d differs from the reference at element %d", name, i, l, byteDiff(b, want)/es)
							}
						}
					}
					// reduce: work gets the result, inputs stay.
					rd := d
					rd.Op, rd.Root = collective.OpReduce, uint32(w.n-1)
					works := make([][]byte, w.n)
					noErrors(t, name, onAll(t, rings, func(i int, r *Ring) error {
						works[i] = make([]byte, count*es)
						return r.ReduceLocal(rd, works[i], nodes[i])
					}))
					for i := range works {
						if !bytes.Equal(works[i], want) {
							t.Fatalf("%s: reduce on node %d differs from the reference at element %d", name, i, byteDiff(works[i], want)/es)
						}
					}
					if count%world != 0 {
						continue
					}
					// reduce_scatter: block c of the vector, folded from node c+1 on.
					sd := d
					sd.Op = collective.OpReduceScatter
					noErrors(t, name, onAll(t, rings, func(i int, r *Ring) error {
						works[i] = make([]byte, count*es)
						return r.ReduceScatterLocal(sd, works[i], nodes[i])
					}))
					for i := range works {
						off, l := rings[i].BlockSpan(&sd, i)
						for e := off / es; e < (off+l)/es; e++ {
							var v float32
							if w.n == 1 {
								v = ref.t.round(ref.finish(ref.local(nodes[0], e)))
							} else {
								v = ref.chain(nodes, e, (i+1)%w.n)
							}
							if got := ty.load(works[i], e); math.Float32bits(got) != math.Float32bits(ty.round(v)) && !(got != got && v != v) {
								t.Fatalf("%s: reduce_scatter on node %d element %d = %v, want %v", name, i, e, got, v)
							}
						}
					}
				}
			}
		}
	}
}

func byteDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

// TestAllGatherIntoEveryLayout gathers equal and per-rank blocks, zero
// lengths included, on rings with one and three local ranks.
func TestAllGatherIntoEveryLayout(t *testing.T) {
	for _, w := range []struct{ n, local int }{{1, 3}, {2, 1}, {3, 3}, {4, 2}} {
		rings := newWorld(t, worldOpts{n: w.n, tweak: func(c *Config) { c.Local = w.local }})
		world := w.n * w.local
		rng := rand.New(rand.NewPCG(uint64(world), 1))
		layouts := [][]uint64{nil}
		for _, big := range []uint64{3, 200000} {
			counts := make([]uint64, world)
			for i := range counts {
				if rng.IntN(3) > 0 {
					counts[i] = uint64(rng.IntN(int(big)))
				}
			}
			layouts = append(layouts, counts)
		}
		for _, counts := range layouts {
			for _, count := range []uint64{0, 1, 70001} {
				if counts != nil && count > 0 {
					continue
				}
				d := collective.Desc{Op: collective.OpAllGather, DType: collective.Int32, Count: count, Counts: counts}
				total := d.Result(0, world)
				want := randBytes(total+uint64(world), int(total)*4)
				outs := make([][]byte, w.n)
				noErrors(t, d.String(), onAll(t, rings, func(i int, r *Ring) error {
					outs[i] = make([]byte, len(want))
					off, l := r.BlockSpan(&d, i)
					copy(outs[i][off:off+l], want[off:off+l])
					dd := d
					if counts != nil {
						dd.Count = counts[i*w.local] // any of its world ranks' own
					}
					return r.AllGatherInto(dd, outs[i])
				}))
				for i := range outs {
					if !bytes.Equal(outs[i], want) {
						t.Fatalf("%v: node %d's result differs at byte %d", d, i, byteDiff(outs[i], want))
					}
				}
			}
		}
	}
}

// TestCollectMismatchFailsEveryRank: per-rank counts that differ on one
// rank fail every rank's call, with no result reported.
func TestCollectMismatchFailsEveryRank(t *testing.T) {
	rings := newWorld(t, worldOpts{n: 3})
	d := collective.Desc{Op: collective.OpAllGather, DType: collective.Float32, Counts: []uint64{1, 2, 3}}
	errs := onAll(t, rings, func(i int, r *Ring) error {
		dd := d
		if i == 2 {
			dd.Counts = []uint64{2, 1, 3}
		}
		dd.Count = dd.Counts[i]
		out := make([]byte, 24)
		return r.AllGatherInto(dd, out)
	})
	for i, err := range errs {
		if err == nil || !errors.Is(err, ErrMismatch) {
			t.Errorf("rank %d: %v, want a mismatch", i, err)
		}
	}
}

// TestAllGatherIntoPlacesAndDoesNotAllocate: a large allgather's
// segments land in the result itself, and the steady state allocates
// nothing.
func TestAllGatherIntoPlacesAndDoesNotAllocate(t *testing.T) {
	rings := newWorld(t, worldOpts{n: 2, tweak: func(c *Config) { c.Local = 2 }})
	d := collective.Desc{Op: collective.OpAllGather, DType: collective.Float32, Count: 1 << 18}
	outs := [][]byte{make([]byte, 4<<20), make([]byte, 4<<20)}
	op := func(i int, r *Ring) error { return r.AllGatherInto(d, outs[i]) }
	noErrors(t, "allgather", onAll(t, rings, op))
	before := rings[0].inPlace
	noErrors(t, "allgather", onAll(t, rings, op))
	if rings[0].inPlace == before {
		t.Errorf("no segment of a 4 MiB allgather was received in place")
	}
	if n := allocsPerOp(t, rings, 20, op); n != 0 {
		t.Errorf("AllGatherInto allocates %v times per op", n)
	}
}

// TestReduceScatterAndReduceDoNotAllocate, bfloat16 and float32 alike.
func TestReduceScatterAndReduceDoNotAllocate(t *testing.T) {
	rings := newWorld(t, worldOpts{n: 2, tweak: func(c *Config) { c.Local = 2 }})
	for _, dt := range []collective.DType{collective.Float32, collective.BFloat16} {
		n := 1 << 18
		ins := [][][]byte{{make([]byte, n*dt.Size()), make([]byte, n*dt.Size())}, {make([]byte, n*dt.Size()), make([]byte, n*dt.Size())}}
		works := [][]byte{make([]byte, n*dt.Size()), make([]byte, n*dt.Size())}
		for _, op := range []collective.Op{collective.OpReduceScatter, collective.OpReduce} {
			d := collective.Desc{Op: op, DType: dt, Reduce: collective.Avg, Count: uint64(n), PreScale: 0.5}
			f := func(i int, r *Ring) error {
				if op == collective.OpReduce {
					return r.ReduceLocal(d, works[i], ins[i])
				}
				return r.ReduceScatterLocal(d, works[i], ins[i])
			}
			noErrors(t, d.String(), onAll(t, rings, f))
			if a := allocsPerOp(t, rings, 10, f); a != 0 {
				t.Errorf("%s allocates %v times per op", d, a)
			}
		}
	}
}

// TestCollectArgumentErrors: bad buffers are refused without touching
// the ring, naming what is wrong; the ring goes on.
func TestCollectArgumentErrors(t *testing.T) {
	rings := newWorld(t, worldOpts{n: 2, tweak: func(c *Config) { c.Local = 2 }})
	r := rings[0]
	g := collective.Desc{Op: collective.OpAllGather, DType: collective.Int32, Count: 2}
	rs := collective.Desc{Op: collective.OpReduceScatter, DType: collective.Int32, Reduce: collective.Sum, Count: 8}
	rd := collective.Desc{Op: collective.OpReduce, DType: collective.Int32, Reduce: collective.Sum, Count: 8, Root: 4}
	for _, c := range []struct {
		err  error
		want string
	}{
		{r.AllGatherInto(g, make([]byte, 30)), "result buffer is 30 bytes"},
		{r.ReduceScatterLocal(rs, make([]byte, 32), nil), "of no buffers"},
		{r.ReduceScatterLocal(rs, make([]byte, 32), [][]byte{make([]byte, 32), make([]byte, 28)}), "local buffer 1 is 28 bytes, want 32"},
		{r.ReduceLocal(rd, make([]byte, 32), [][]byte{make([]byte, 32)}), "root 4 outside world of 4"},
	} {
		if !errors.Is(c.err, collective.ErrInvalid) || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%v, want an invalid-argument error saying %q", c.err, c.want)
		}
	}
	outs := [][]byte{make([]byte, 32), make([]byte, 32)}
	noErrors(t, "allgather after the refusals", onAll(t, rings, func(i int, r *Ring) error { return r.AllGatherInto(g, outs[i]) }))
}
