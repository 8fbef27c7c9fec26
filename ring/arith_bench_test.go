package ring

import (
	"testing"

	"github.com/collectived/collectived/collective"
)

// BenchmarkCombine measures one hop's arithmetic (received partial plus
// the local input) per element type, the compute the 16-bit floats add.
func BenchmarkCombine(b *testing.B) {
	for _, dt := range []collective.DType{collective.Float32, collective.BFloat16, collective.Float16} {
		b.Run(dt.String(), func(b *testing.B) {
			n := 1 << 20
			d := collective.Desc{Op: collective.OpAllReduce, DType: dt, Reduce: collective.Sum, Count: uint64(n)}
			f := newFolder(&d, nil, nil, true, 2, new(halfScratch))
			dst := make([]byte, n*dt.Size())
			recv := make([]byte, n*dt.Size())
			b.SetBytes(int64(len(dst)))
			for b.Loop() {
				f.combine(dst, recv, 0, false)
			}
		})
	}
}
