package ring

import (
	"bytes"
	"testing"

	"github.com/collectived/collectived/collective"
)

// TestDirectLongFrames: frames longer than coalesceBytes, up to
// directBytes, go out from the op goroutine in one writev from the
// caller's buffer, both on the small path (every rank's whole buffer) and
// as ring segments. With socket buffers far smaller than a frame the
// writes are partial (checked by hand: a resume from the wrong
// offset fails it) and resume where they stopped. Results are exact
// either way, and the ring keeps no pointer into the caller's buffer.
func TestDirectLongFrames(t *testing.T) {
	const count = 12 << 10 // 48 KiB of float32
	d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: count}
	for _, tc := range []struct {
		name    string
		small   int // SmallBytes: the small path carries 48 KiB frames, the ring 24 KiB ones
		sockBuf int
	}{
		{"small path", 64 << 10, 0},
		{"ring segments", 4 << 10, 0},
		{"small path, 8 KiB socket buffers", 64 << 10, 8 << 10},
		{"ring segments, 8 KiB socket buffers", 4 << 10, 8 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rings := newWorld(t, worldOpts{n: 2, tweak: func(c *Config) {
				c.SmallBytes, c.SocketBuffer = tc.small, tc.sockBuf
			}})
			for round := 0; round < 2; round++ {
				ins := make([][]byte, 2)
				bufs := make([][]byte, 2)
				for i := range ins {
					ins[i] = input(collective.Float32, collective.Sum, i+round, count)
					bufs[i] = bytes.Clone(ins[i])
				}
				before := []uint64{rings[0].sentDirect, rings[1].sentDirect}
				noErrors(t, "allreduce", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduce(d, bufs[i]) }))
				want := reference(collective.Float32, collective.Sum, ins, count, tc.small)
				for i, r := range rings {
					if !bytes.Equal(bufs[i], want) {
						t.Fatalf("round %d, rank %d: result differs from the reference fold", round, i)
					}
					frames := uint64(1) // the small path: one frame each way
					if tc.small < int(d.Bytes()) {
						frames = 2 // reduce-scatter and allgather, one segment each
					}
					// A frame finds the socket full only if the previous op's
					// last frame is still unread; it is then queued, so
					// allow one.
					if got := r.sentDirect - before[i]; got+1 < frames || got > frames {
						t.Errorf("round %d, rank %d: %d of %d frames written by the op itself", round, i, got, frames)
					}
					if iov := r.tx[0].iov; iov[0].Base != nil || iov[1].Base != nil {
						t.Errorf("rank %d: the stream still points into a caller's buffer after the op", i)
					}
				}
			}
		})
	}
}
