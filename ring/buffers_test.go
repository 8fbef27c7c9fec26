package ring

import (
	"runtime"
	"testing"

	"github.com/collectived/collectived/collective"
)

// TestBufferBytes: Status.BufferBytes is what New allocates for the
// pipeline (the figure bench/compare holds the daemon's memory to), and
// ops of any size add nothing to it: they work in the caller's buffer.
func TestBufferBytes(t *testing.T) {
	const seg, small = 512 << 10, 4096
	// Per ring: 2 streams x (4 receive buffers of a segment and a
	// trailer + a write buffer of header, 16 KiB and a trailer), and a
	// small-op scratch of 2 x 4 KiB; and the duplex stream's other side
	// (duplex.go): on rank 0, 4 receive buffers of the small limit and a
	// trailer, on rank 1, a write buffer.
	const wbuf = headerLen + 16<<10 + trailerLen
	const base = 2*(4*(seg+trailerLen)+wbuf) + 2*small
	want := []int64{base + 4*(small+trailerLen), base + wbuf}
	count := 16 << 20 / 4
	bufs := [][]byte{make([]byte, 4*count), make([]byte, 4*count)}
	heap := func() uint64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	rings := newWorld(t, worldOpts{n: 2, streams: 2, tweak: func(c *Config) {
		c.SegmentBytes, c.SmallBytes = seg, small
	}})
	built := heap()
	for i, r := range rings {
		if got := r.Status().BufferBytes; got != want[i] {
			t.Fatalf("rank %d: BufferBytes %d, want %d", i, got, want[i])
		}
	}
	if grew := int64(built - before); grew < want[0]+want[1] || grew > want[0]+want[1]+1<<20 {
		t.Fatalf("building two rings grew the heap by %d bytes, want their BufferBytes (%d + %d) and at most 1 MiB more", grew, want[0], want[1])
	}
	d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: uint64(count)}
	for k := 0; k < 3; k++ {
		noErrors(t, "allreduce 16 MiB", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduce(d, bufs[i]) }))
	}
	if after := heap(); after > built+256<<10 {
		t.Fatalf("three 16 MiB allreduces grew the heap from %d to %d bytes: an op allocated beyond the pipeline buffers", built, after)
	}
}
