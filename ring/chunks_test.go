package ring

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/collectived/collectived/collective"
)

// TestAllReduceChunks: chunk c of the caller's chunks is folded starting
// at rank c, whatever their sizes (empty ones included, one chunk
// holding everything, chunks of many uneven segments over three
// streams), bit for bit against the reference, on every rank; a buffer
// on the small path ignores them and folds in rank order.
func TestAllReduceChunks(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		rings := newWorld(t, worldOpts{n: n, streams: 3, tweak: func(c *Config) { c.SegmentBytes, c.SmallBytes = 64, 64 }})
		for _, count := range []int{17, 1001} {
			patterns := [][]int{make([]int, n), make([]int, n), make([]int, n)}
			patterns[0][n-1] = count // all folded from the last rank
			patterns[1][0], patterns[1][1] = count-1, 1
			k := count / (n * (n - 1) / 2) // growing, the first one empty
			for c := range patterns[2] {
				patterns[2][c] = c * k
			}
			patterns[2][n-1] += count - sum(patterns[2])
			for _, chunks := range patterns {
				for _, dt := range numDTypes {
					for _, op := range reduceOps {
						checkChunks(t, rings, dt, op, count, chunks)
					}
				}
			}
		}
		// Small path (64 bytes): chunks ignored, rank order.
		checkChunks(t, rings, collective.Float32, collective.Sum, 16, append(make([]int, n-1), 16))
	}
}

func sum(xs []int) (s int) {
	for _, x := range xs {
		s += x
	}
	return s
}

func checkChunks(t *testing.T, rings []*Ring, dt collective.DType, op collective.ReduceOp, count int, chunks []int) {
	t.Helper()
	n := len(rings)
	ins := make([][]byte, n)
	bufs := make([][]byte, n)
	for i := range ins {
		ins[i] = input(dt, op, i, count)
		bufs[i] = bytes.Clone(ins[i])
	}
	d := collective.Desc{Op: collective.OpAllReduce, DType: dt, Reduce: op, Count: uint64(count)}
	name := fmt.Sprintf("%v n=%d chunks %v", d, n, chunks)
	noErrors(t, name, onAll(t, rings, func(i int, r *Ring) error { return r.AllReduceChunks(d, bufs[i:i+1], chunks) }))
	want := referenceChunks(dt, op, ins, chunks)
	if rings[0].Small(d) {
		want = reference(dt, op, ins, count, rings[0].cfg.SmallBytes)
	}
	for i := range bufs {
		if !bytes.Equal(bufs[i], bufs[0]) {
			t.Fatalf("%s: rank %d's result differs from rank 0's", name, i)
		}
		if e, ok := sameResult(dt, bufs[i], want); !ok {
			t.Fatalf("%s: rank %d element %d differs from the reference", name, i, e)
		}
	}
}

// Chunks that do not fit the ring or the count are refused by name
// before the ring is touched: the next op still runs.
func TestAllReduceChunksBadChunks(t *testing.T) {
	rings := newWorld(t, worldOpts{n: 3})
	d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 10}
	buf := [][]byte{make([]byte, 40)}
	for want, chunks := range map[string][]int{
		"ring rank 0: allreduce: 2 chunks for a ring of 3 ranks":            {5, 5},
		"ring rank 0: allreduce: 0 chunks for a ring of 3 ranks":            nil,
		"ring rank 0: allreduce: chunks add up to 11 elements, count is 10": {4, 4, 3},
		"ring rank 0: allreduce: chunk 1 has -1 elements":                   {6, -1, 5},
	} {
		err := rings[0].AllReduceChunks(d, buf, chunks)
		if !errors.Is(err, collective.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("AllReduceChunks(chunks %v): %v, want ErrInvalid saying %q", chunks, err, want)
		}
	}
	noErrors(t, "allreduce after refused calls", onAll(t, rings, func(i int, r *Ring) error {
		return r.AllReduceChunks(d, [][]byte{make([]byte, 40)}, []int{10, 0, 0})
	}))
}

// Ranks that pass different chunks send segments of other lengths than
// their neighbours expect: every rank fails with a named error, not a
// hang or wrong data (no frame carries the chunks, but every chunk's
// length is compared on every link, in one half of the op or the other).
func TestAllReduceChunksDiffer(t *testing.T) {
	rings, _ := faultWorld(t, 3, nil, nil)
	startAll(t, rings)
	d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Int32, Reduce: collective.Sum, Count: 1 << 16}
	errs := opOnReal(t, rings, 15*time.Second, func(i int, r *Ring) error {
		chunks := []int{1 << 14, 1 << 15, 1 << 14}
		if i == 2 {
			chunks[0], chunks[1] = chunks[0]+1, chunks[1]-1
		}
		return r.AllReduceChunks(d, [][]byte{make([]byte, d.Bytes())}, chunks)
	})
	expectAll(t, rings, errs, ErrBadFrame, "segment")
}
