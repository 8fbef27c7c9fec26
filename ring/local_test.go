package ring

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/collectived/collectived/collective"
)

// AllReduceLocal gives every local buffer the bytes that folding them
// first (Reduce, left to right) and calling AllReduce gives: on the small
// path, on the ring with one and with several segments per chunk, and in
// a world of one.
func TestAllReduceLocal(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		rings := newWorld(t, worldOpts{n: n})
		for _, L := range []int{2, 3} {
			for _, count := range []int{1, 5, 3000, 40000} {
				for _, dt := range numDTypes {
					for _, op := range reduceOps {
						name := fmt.Sprintf("world%d/L%d/%d/%s/%s", n, L, count, dt, op)
						d := collective.Desc{Op: collective.OpAllReduce, DType: dt, Reduce: op, Count: uint64(count)}
						locals := make([][][]byte, n)
						want := make([][]byte, n)
						for i := range rings {
							for l := 0; l < L; l++ {
								locals[i] = append(locals[i], input(dt, op, i*L+l, count))
							}
							want[i] = bytes.Clone(locals[i][0])
							for l := 1; l < L; l++ {
								if err := Reduce(want[i], locals[i][l], dt, op); err != nil {
									t.Fatal(err)
								}
							}
						}
						noErrors(t, name+" AllReduce", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduce(d, want[i]) }))
						noErrors(t, name+" AllReduceLocal", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduceLocal(d, locals[i]) }))
						for i := range rings {
							for l, got := range locals[i] {
								if !bytes.Equal(got, want[i]) {
									t.Fatalf("%s: rank %d local buffer %d differs from fold-then-AllReduce", name, i, l)
								}
							}
						}
					}
				}
			}
		}
	}
}

// Local buffers of different lengths, or none at all, are refused by
// name before the ring is touched: the next op still runs.
func TestAllReduceLocalBadBuffers(t *testing.T) {
	rings := newWorld(t, worldOpts{n: 2})
	d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 4}
	for want, bufs := range map[string][][]byte{
		"allreduce of no buffers":                                                  nil,
		"local buffer 1 is 12 bytes, buffer 0 is 16":                               {make([]byte, 16), make([]byte, 12)},
		"buffer is 8 bytes, description allreduce(float32, sum, count=4) needs 16": {make([]byte, 8), make([]byte, 8)},
	} {
		err := rings[0].AllReduceLocal(d, bufs)
		if !errors.Is(err, collective.ErrInvalid) || !bytes.Contains([]byte(err.Error()), []byte(want)) {
			t.Errorf("AllReduceLocal(%d buffers): %v, want ErrInvalid saying %q", len(bufs), err, want)
		}
	}
	noErrors(t, "allreduce after refused calls", onAll(t, rings, func(i int, r *Ring) error {
		return r.AllReduceLocal(d, [][]byte{make([]byte, 16), make([]byte, 16)})
	}))
}
