package ring

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/collectived/collectived/collective"
)

var (
	numDTypes = []collective.DType{collective.Float32, collective.Float64, collective.Int32, collective.Int64}
	reduceOps = []collective.ReduceOp{collective.Sum, collective.Prod, collective.Max, collective.Min}
)

// input makes rank's buffer: random values, with NaN, signed zeros and
// wrapping integer products mixed in where they test something.
func input(dt collective.DType, op collective.ReduceOp, rank, count int) []byte {
	rng := rand.New(rand.NewPCG(uint64(rank)+1, uint64(count)*31+uint64(dt)*7+uint64(op)))
	es := dt.Size()
	b := make([]byte, count*es)
	for e := 0; e < count; e++ {
		p := b[e*es:]
		f := rng.Float64()*200 - 100
		if op == collective.Prod {
			f = 0.5 + rng.Float64()
		}
		switch {
		case e == 1 && rank == 1 && (op == collective.Max || op == collective.Min):
			f = math.NaN()
		case e == 2 && op == collective.Sum:
			f = math.Copysign(0, float64(rank%2)-0.5)
		}
		switch dt {
		case collective.Float32:
			binary.LittleEndian.PutUint32(p, math.Float32bits(float32(f)))
		case collective.Float64:
			binary.LittleEndian.PutUint64(p, math.Float64bits(f))
		case collective.Int32:
			v := rng.Uint32()
			if op == collective.Prod && e%2 == 0 {
				v = uint32(rng.IntN(7)) - 3
			}
			binary.LittleEndian.PutUint32(p, v)
		case collective.Int64:
			v := rng.Uint64()
			if op == collective.Prod && e%2 == 0 {
				v = uint64(rng.IntN(7)) - 3
			}
			binary.LittleEndian.PutUint64(p, v)
		}
	}
	return b
}

func fold[T int32 | int64 | float32 | float64](op collective.ReduceOp, a, b T) T {
	switch op {
	case collective.Sum:
		return a + b
	case collective.Prod:
		return a * b
	case collective.Max:
		if a != a || b != b {
			return T(math.NaN())
		}
		if a > b {
			return a
		}
		return b
	default:
		if a != a || b != b {
			return T(math.NaN())
		}
		if a < b {
			return a
		}
		return b
	}
}

// reference computes allreduce the way doc.go documents it, one element
// at a time: up to SmallBytes (or fewer elements than ranks) a left fold
// over ranks 0..N-1, which is chunk 0's order; otherwise element e lies
// in chunk c (count split in N parts, the first count%N one longer) and
// is folded left starting at rank c: ((x_c op x_c+1) op ...) op x_c-1.
func reference(dt collective.DType, op collective.ReduceOp, ins [][]byte, count, smallBytes int) []byte {
	n := len(ins)
	chunks := make([]int, n)
	if count*dt.Size() <= smallBytes || count < n {
		chunks[0] = count
	} else {
		for c := range chunks {
			chunks[c] = count / n
			if c < count%n {
				chunks[c]++
			}
		}
	}
	return referenceChunks(dt, op, ins, chunks)
}

// referenceChunks is reference for the large path with the given chunks
// (AllReduceChunks): chunk c's elements are folded starting at rank c.
func referenceChunks(dt collective.DType, op collective.ReduceOp, ins [][]byte, chunks []int) []byte {
	n, es := len(ins), dt.Size()
	out := make([]byte, len(ins[0]))
	e := 0
	for start, cn := range chunks {
		for end := e + cn; e < end; e++ {
			o := e * es
			switch dt {
			case collective.Float32:
				acc := math.Float32frombits(binary.LittleEndian.Uint32(ins[start][o:]))
				for k := 1; k < n; k++ {
					acc = fold(op, acc, math.Float32frombits(binary.LittleEndian.Uint32(ins[(start+k)%n][o:])))
				}
				binary.LittleEndian.PutUint32(out[o:], math.Float32bits(acc))
			case collective.Float64:
				acc := math.Float64frombits(binary.LittleEndian.Uint64(ins[start][o:]))
				for k := 1; k < n; k++ {
					acc = fold(op, acc, math.Float64frombits(binary.LittleEndian.Uint64(ins[(start+k)%n][o:])))
				}
				binary.LittleEndian.PutUint64(out[o:], math.Float64bits(acc))
			case collective.Int32:
				acc := int32(binary.LittleEndian.Uint32(ins[start][o:]))
				for k := 1; k < n; k++ {
					acc = fold(op, acc, int32(binary.LittleEndian.Uint32(ins[(start+k)%n][o:])))
				}
				binary.LittleEndian.PutUint32(out[o:], uint32(acc))
			case collective.Int64:
				acc := int64(binary.LittleEndian.Uint64(ins[start][o:]))
				for k := 1; k < n; k++ {
					acc = fold(op, acc, int64(binary.LittleEndian.Uint64(ins[(start+k)%n][o:])))
				}
				binary.LittleEndian.PutUint64(out[o:], uint64(acc))
			}
		}
	}
	return out
}

// sameResult compares bit for bit, except that any NaN matches any NaN
// (the payload of a NaN produced from two NaNs is the CPU's choice).
func sameResult(dt collective.DType, got, want []byte) (int, bool) {
	if bytes.Equal(got, want) {
		return 0, true
	}
	es := dt.Size()
	for o := 0; o < len(want); o += es {
		if bytes.Equal(got[o:o+es], want[o:o+es]) {
			continue
		}
		switch dt {
		case collective.Float32:
			if math.IsNaN(float64(math.Float32frombits(binary.LittleEndian.Uint32(got[o:])))) &&
				math.IsNaN(float64(math.Float32frombits(binary.LittleEndian.Uint32(want[o:])))) {
				continue
			}
		case collective.Float64:
			if math.IsNaN(math.Float64frombits(binary.LittleEndian.Uint64(got[o:]))) &&
				math.IsNaN(math.Float64frombits(binary.LittleEndian.Uint64(want[o:]))) {
				continue
			}
		}
		return o / es, false
	}
	return 0, true
}

type arCase struct {
	dt    collective.DType
	op    collective.ReduceOp
	count int
}

// checkAllReduce runs one allreduce on every rank and checks every rank's
// bytes against the reference and against rank 0's (bit identity).
func checkAllReduce(t *testing.T, rings []*Ring, c arCase) {
	t.Helper()
	n := len(rings)
	ins := make([][]byte, n)
	bufs := make([][]byte, n)
	for i := range ins {
		ins[i] = input(c.dt, c.op, i, c.count)
		bufs[i] = append([]byte(nil), ins[i]...)
	}
	d := collective.Desc{Op: collective.OpAllReduce, DType: c.dt, Reduce: c.op, Count: uint64(c.count), Name: "t"}
	noErrors(t, fmt.Sprintf("%v n=%d", d, n), onAll(t, rings, func(i int, r *Ring) error { return r.AllReduce(d, bufs[i]) }))
	want := reference(c.dt, c.op, ins, c.count, rings[0].cfg.SmallBytes)
	for i := range bufs {
		if !bytes.Equal(bufs[i], bufs[0]) {
			t.Fatalf("%v n=%d: rank %d's result differs from rank 0's", d, n, i)
		}
		if e, ok := sameResult(c.dt, bufs[i], want); !ok {
			es := c.dt.Size()
			t.Fatalf("%v n=%d: rank %d element %d = %x, want %x", d, n, i, e, bufs[i][e*es:e*es+es], want[e*es:e*es+es])
		}
	}
	if c.count > 2 && (c.op == collective.Max || c.op == collective.Min) && n > 1 && (c.dt == collective.Float32 || c.dt == collective.Float64) {
		// NaN propagation: rank 1 put a NaN at element 1.
		var nan bool
		if c.dt == collective.Float32 {
			nan = math.IsNaN(float64(math.Float32frombits(binary.LittleEndian.Uint32(bufs[0][4:]))))
		} else {
			nan = math.IsNaN(math.Float64frombits(binary.LittleEndian.Uint64(bufs[0][8:])))
		}
		if !nan {
			t.Fatalf("%v n=%d: NaN did not propagate through %s", d, n, c.op)
		}
	}
}

// TestAllReduceMatrix: every world, dtype and op over the sizes that
// cross each path boundary; the large sizes for a subset to keep -race
// time sane.
func TestAllReduceMatrix(t *testing.T) {
	for _, w := range []worldOpts{{n: 1}, {n: 2}, {n: 3, streams: 3}, {n: 4}, {n: 7, streams: 3}, {n: 3, pipe: true}} {
		name := fmt.Sprintf("n%d_s%d_pipe%v", w.n, max(w.streams, 1), w.pipe)
		t.Run(name, func(t *testing.T) {
			rings := newWorld(t, w)
			for _, dt := range numDTypes {
				es := dt.Size()
				counts := []int{0, 1, max(w.n-1, 1), 7, 1001, 4096/es - 1, 4096 / es, 4096/es + 1}
				for _, op := range reduceOps {
					for _, count := range counts {
						checkAllReduce(t, rings, arCase{dt, op, count})
					}
				}
			}
			// 1 MiB + 3 elements: every dtype, sum and max.
			for _, dt := range numDTypes {
				for _, op := range []collective.ReduceOp{collective.Sum, collective.Max} {
					if w.n == 7 && dt != collective.Float32 {
						continue
					}
					checkAllReduce(t, rings, arCase{dt, op, 1<<20/dt.Size() + 3})
				}
			}
		})
	}
}

// TestAllReduceManySegments uses a tiny segment so that chunks are cut
// into many uneven segments striped over three streams.
func TestAllReduceManySegments(t *testing.T) {
	rings := newWorld(t, worldOpts{n: 3, streams: 3, tweak: func(c *Config) { c.SegmentBytes = 64; c.SmallBytes = 64 }})
	for _, count := range []int{3, 16, 17, 100, 1001, 4099} {
		for _, op := range reduceOps {
			checkAllReduce(t, rings, arCase{collective.Int64, op, count})
			checkAllReduce(t, rings, arCase{collective.Float32, op, count})
		}
	}
}

// TestAllReduce64MiB: the largest size, for two worlds.
func TestAllReduce64MiB(t *testing.T) {
	if testing.Short() {
		t.Skip("64 MiB allreduce skipped in -short")
	}
	for _, c := range []struct {
		n  int
		dt collective.DType
	}{{2, collective.Float32}, {3, collective.Int64}} {
		rings := newWorld(t, worldOpts{n: c.n, tweak: func(cfg *Config) { cfg.SegmentBytes = 1 << 20 }})
		count := 64 << 20 / c.dt.Size()
		bufs := make([][]byte, c.n)
		for i := range bufs {
			bufs[i] = make([]byte, count*c.dt.Size())
		}
		// Rank i holds i+1 in every element, so the sum is n(n+1)/2
		// exactly; rank 0 adds e%1000 to element e, to catch misplaced
		// chunks. The patterns are tiled with copy, which the race
		// detector checks per range rather than per element.
		want := make([]byte, len(bufs[0]))
		tot := c.n * (c.n + 1) / 2
		for e := 0; e < 1000; e++ {
			for i := range bufs {
				v := i + 1
				if i == 0 {
					v += e
				}
				put(c.dt, bufs[i], e, v)
			}
			put(c.dt, want, e, tot+e)
		}
		for _, b := range append(bufs, want) {
			tile(b, 1000*c.dt.Size())
		}
		d := collective.Desc{Op: collective.OpAllReduce, DType: c.dt, Reduce: collective.Sum, Count: uint64(count)}
		noErrors(t, "64MiB", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduce(d, bufs[i]) }))
		for i := range bufs {
			if !bytes.Equal(bufs[i], want) {
				t.Fatalf("n=%d %s: rank %d's 64 MiB result is wrong", c.n, c.dt, i)
			}
		}
	}
}

// tile repeats b[:period] over all of b.
func tile(b []byte, period int) {
	for n := period; n < len(b); n *= 2 {
		copy(b[n:], b[:n])
	}
}

func put(dt collective.DType, b []byte, e, v int) {
	switch dt {
	case collective.Float32:
		binary.LittleEndian.PutUint32(b[e*4:], math.Float32bits(float32(v)))
	case collective.Int64:
		binary.LittleEndian.PutUint64(b[e*8:], uint64(v))
	}
}
