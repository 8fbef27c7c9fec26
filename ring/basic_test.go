package ring

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/collectived/collectived/collective"
)

func TestQuickAllReduce(t *testing.T) {
	for _, n := range []int{2, 3} {
		rings := newWorld(t, worldOpts{n: n})
		for _, count := range []int{1, 100, 5000, 100000} {
			d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: uint64(count)}
			bufs := make([][]byte, n)
			for i := range bufs {
				bufs[i] = make([]byte, count*4)
				for e := 0; e < count; e++ {
					binary.LittleEndian.PutUint32(bufs[i][e*4:], math.Float32bits(float32(e+i)))
				}
			}
			noErrors(t, "allreduce", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduce(d, bufs[i]) }))
			for e := 0; e < count; e++ {
				got := math.Float32frombits(binary.LittleEndian.Uint32(bufs[0][e*4:]))
				want := float32(n*e + n*(n-1)/2)
				if got != want {
					t.Fatalf("n=%d count=%d elem %d = %v want %v", n, count, e, got, want)
				}
			}
		}
	}
}
