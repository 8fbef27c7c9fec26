package ring

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/collectived/collectived/collective"
)

// TestAllReduceLargeEveryOp completes TestAllReduceMatrix at 1 MiB + 3
// elements, where it checks only sum and max (and only float32 in a
// world of seven): here prod and min for every dtype, and every dtype in
// the world of seven, against the same independent reference, bit for bit
// on every rank.
func TestAllReduceLargeEveryOp(t *testing.T) {
	for _, w := range []worldOpts{{n: 2}, {n: 4}, {n: 7, streams: 3}} {
		t.Run(fmt.Sprintf("n%d", w.n), func(t *testing.T) {
			rings := newWorld(t, w)
			for _, dt := range numDTypes {
				for _, op := range reduceOps {
					inMatrix := op == collective.Sum || op == collective.Max
					if inMatrix && (w.n != 7 || dt == collective.Float32) {
						continue
					}
					checkAllReduce(t, rings, arCase{dt, op, 1<<20/dt.Size() + 3})
				}
			}
		})
	}
}

// TestAllReduce64MiBWorld4: 64 MiB in the world of four the benchmarks
// use, with another op and dtype than TestAllReduce64MiB's sums: rank i
// holds 1000(i+1) - e%1000 at element e, so the minimum, rank 0's, tells
// the elements of a period apart and a misplaced chunk shows.
func TestAllReduce64MiBWorld4(t *testing.T) {
	if testing.Short() {
		t.Skip("64 MiB allreduce skipped in -short")
	}
	const n = 4
	dt := collective.Int64
	rings := newWorld(t, worldOpts{n: n, tweak: func(cfg *Config) { cfg.SegmentBytes = 1 << 20 }})
	count := 64 << 20 / dt.Size()
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, count*dt.Size())
	}
	want := make([]byte, count*dt.Size())
	for e := 0; e < 1000; e++ {
		for i := range bufs {
			put(dt, bufs[i], e, 1000*(i+1)-e)
		}
		put(dt, want, e, 1000-e)
	}
	for _, b := range append(bufs, want) {
		tile(b, 1000*dt.Size())
	}
	d := collective.Desc{Op: collective.OpAllReduce, DType: dt, Reduce: collective.Min, Count: uint64(count)}
	noErrors(t, "64MiB min", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduce(d, bufs[i]) }))
	for i := range bufs {
		if !bytes.Equal(bufs[i], want) {
			t.Fatalf("n=%d %s min: rank %d's 64 MiB result is wrong", n, dt, i)
		}
	}
}
