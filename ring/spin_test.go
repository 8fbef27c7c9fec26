package ring

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/collectived/collectived/collective"
)

// With links polled before parking (Config.Spin), and small ops kept to
// one stream while large ones stripe (Config.StripeBytes), results are the
// same bits on every rank, as the reference says, and a warm ring still
// allocates nothing per op.
func TestSpinningLinks(t *testing.T) {
	for _, streams := range []int{1, 3} {
		t.Run(fmt.Sprintf("streams=%d", streams), func(t *testing.T) {
			const n = 3
			// Ops from 64 KiB stripe over every stream, smaller ones keep
			// to the first: the counts below cover both.
			rings := newWorld(t, worldOpts{n: n, streams: streams, tweak: func(c *Config) {
				c.Spin = 200 * time.Microsecond
				c.SegmentBytes = 64 << 10
				c.StripeBytes = 64 << 10
			}})
			for _, count := range []int{1, 1000, 300_001} {
				d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: uint64(count)}
				bufs := make([][]byte, n)
				for i := range bufs {
					bufs[i] = make([]byte, d.Bytes())
					for k := 0; k < count; k++ {
						binary.LittleEndian.PutUint32(bufs[i][4*k:], math.Float32bits(float32(i+1)*float32(k%5)))
					}
				}
				noErrors(t, "allreduce", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduce(d, bufs[i]) }))
				for k := 0; k < count; k++ {
					want := float32(n*(n+1)/2) * float32(k%5)
					if got := math.Float32frombits(binary.LittleEndian.Uint32(bufs[0][4*k:])); got != want {
						t.Fatalf("count %d element %d: %v, want %v", count, k, got, want)
					}
				}
				for i := 1; i < n; i++ {
					if !bytes.Equal(bufs[i], bufs[0]) {
						t.Fatalf("count %d: rank %d differs from rank 0", count, i)
					}
				}
			}
			d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Int64, Reduce: collective.Max, Count: 512}
			bufs := [][]byte{make([]byte, d.Bytes()), make([]byte, d.Bytes()), make([]byte, d.Bytes())}
			allocs := allocsPerOp(t, rings, 50, func(i int, r *Ring) error { return r.AllReduce(d, bufs[i]) })
			// AllocsPerRun counts the whole process: rank 0's op and the
			// channel handshakes of this test's own goroutines.
			if allocs > 1 {
				t.Errorf("%.1f allocations per op with spinning links", allocs)
			}
		})
	}
}
