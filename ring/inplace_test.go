package ring

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/collectived/collectived/collective"
)

// TestAllGatherLandsInPlace: the allgather half of a large allreduce is
// received straight into the caller's buffer (all of it in these runs; a
// segment whose reduce-scatter send is still under way when its turn
// comes is copied as before, hence the margin), on every world size and
// stream count, with exact results.
func TestAllGatherLandsInPlace(t *testing.T) {
	for _, tc := range []struct{ n, streams int }{{2, 1}, {2, 2}, {3, 2}, {4, 1}} {
		rings := newWorld(t, worldOpts{n: tc.n, streams: tc.streams, tweak: func(c *Config) {
			c.SegmentBytes = 16 << 10
			c.StripeBytes = 1
		}})
		const count = 1 << 18 // 1 MiB of float32: 16 segments per chunk and more
		d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: count}
		bufs := make([][]byte, tc.n)
		for i := range bufs {
			bufs[i] = make([]byte, d.Bytes())
			for e := 0; e < count; e++ {
				binary.LittleEndian.PutUint32(bufs[i][4*e:], math.Float32bits(float32(i+1)*float32(e%13)))
			}
		}
		before := make([]uint64, tc.n)
		for i, r := range rings {
			before[i] = r.inPlace
		}
		noErrors(t, "allreduce", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduce(d, bufs[i]) }))
		sum := float32(tc.n * (tc.n + 1) / 2)
		for i := range bufs {
			for e := 0; e < count; e++ {
				if got, want := math.Float32frombits(binary.LittleEndian.Uint32(bufs[i][4*e:])), sum*float32(e%13); got != want {
					t.Fatalf("world %d x %d streams, rank %d element %d: %v, want %v", tc.n, tc.streams, i, e, got, want)
				}
			}
		}
		// Each rank receives (n-1) chunks of allgather segments.
		chunk := count / tc.n * 4
		gathered := (tc.n - 1) * ((chunk + 16<<10 - 1) / (16 << 10))
		for i, r := range rings {
			t.Logf("world %d x %d streams, rank %d: %d of %d allgather frames received in place", tc.n, tc.streams, i, r.inPlace-before[i], gathered)
			if got, least := r.inPlace-before[i], gathered-2*rxBuffers*tc.streams; int(got) < least {
				t.Errorf("world %d x %d streams, rank %d: %d of %d allgather frames received in place, want at least %d",
					tc.n, tc.streams, i, got, gathered, least)
			}
			if r.placed != 0 {
				t.Errorf("rank %d: %d places still out after a successful op", i, r.placed)
			}
			if r.pl.buf != nil {
				t.Errorf("rank %d: the ring still holds the caller's buffer after the op", i)
			}
		}
	}
}

// TestFailedOpLeavesNoPlace: an allreduce that fails while a reader is
// receiving an allgather frame into the caller's buffer returns only once
// that reader has stopped: what the peer sends after the op returned
// never reaches the buffer.
func TestFailedOpLeavesNoPlace(t *testing.T) {
	const seg = 4096
	rings, links := faultWorld(t, 2, map[int]bool{1: true}, func(c *Config) { c.SegmentBytes, c.SmallBytes = seg, seg })
	fake := newFakeRank(links[1], 1, 2)
	go fake.start(11)
	defer fake.closeAll()
	startAll(t, rings)
	r := rings[0]
	const count = 16 * seg / 4 // two chunks of 8 segments
	d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: count}
	frame := func(step int, fill byte, n int) []byte {
		h := header{Kind: kindData, Sender: 1, Generation: 11, Step: uint32(step), Length: seg}
		h.setDesc(&d, d.Fingerprint())
		b := make([]byte, headerLen+seg)
		h.encode(b)
		for i := headerLen; i < len(b); i++ {
			b[i] = fill
		}
		s := seal(b)
		if n < seg {
			return s[:headerLen+n]
		}
		return s
	}
	// The reduce-scatter's 8 frames, then half of the first allgather
	// frame: rank 0's reader is then receiving it into its place.
	var head []byte
	for j := 0; j < 8; j++ {
		head = append(head, frame(0, 0, seg)...)
	}
	head = append(head, frame(1, 0x77, seg/2)...)
	fake.writeNext(head)

	buf := make([]byte, d.Bytes())
	done := make(chan error, 1)
	go func() { done <- r.AllReduce(d, buf) }()
	deadline := time.Now().Add(10 * time.Second)
	for r.Status().Step != 1 || r.prev[0].waitLocal.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("rank 0 never reached the allgather: %+v", r.Status())
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // the reader takes the half frame
	r.Abort(errors.New("test aborts mid-allgather"))
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the aborted allreduce did not return")
	}
	if err == nil {
		t.Fatal("the aborted allreduce succeeded")
	}
	snap := bytes.Clone(buf)
	// The rest of the frame, and a whole next one, after the op returned.
	fake.writeNext(append(frame(1, 0x77, seg)[headerLen+seg/2:], frame(1, 0x77, seg)...))
	time.Sleep(300 * time.Millisecond)
	if !bytes.Equal(buf, snap) {
		i := 0
		for buf[i] == snap[i] {
			i++
		}
		t.Fatalf("the buffer changed after the failed op returned (%v): byte %d is now %#x", err, i, buf[i])
	}
	if r.placed != 0 {
		t.Fatalf("%d places out after the failed op returned", r.placed)
	}
}

// TestPlacedFrameTooLong: an allgather frame longer than its segment but
// within the longest payload is refused as a bad frame naming both
// lengths; it is not written past its place in the caller's buffer.
func TestPlacedFrameTooLong(t *testing.T) {
	const seg, segLen = 4096, 4000 // 8 segments of 1000 float32 per chunk
	rings, links := faultWorld(t, 2, map[int]bool{1: true}, func(c *Config) { c.SegmentBytes, c.SmallBytes = seg, seg })
	fake := newFakeRank(links[1], 1, 2)
	go fake.start(11)
	defer fake.closeAll()
	startAll(t, rings)
	d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 2 * 8 * 1000}
	frame := func(step, n int) []byte {
		h := header{Kind: kindData, Sender: 1, Generation: 11, Step: uint32(step), Length: uint32(n)}
		h.setDesc(&d, d.Fingerprint())
		b := make([]byte, headerLen+n)
		h.encode(b)
		return seal(b)
	}
	var frames []byte
	for j := 0; j < 8; j++ {
		frames = append(frames, frame(0, segLen)...)
	}
	frames = append(frames, frame(1, seg)...)
	go fake.writeNext(frames)
	buf := make([]byte, d.Bytes()+seg) // room past the op's bytes, watched below
	errs := opOnReal(t, rings, 15*time.Second, func(i int, r *Ring) error { return r.AllReduce(d, buf[:d.Bytes()]) })
	expectAll(t, rings, errs, ErrBadFrame, "data frame of 4096 bytes where a segment of 4000 was due")
	if tail := buf[d.Bytes():]; !bytes.Equal(tail, make([]byte, seg)) {
		t.Fatal("bytes past the op's buffer were written")
	}
}

// TestWrongLengthFrameWhileMoreArrive: a data frame of the wrong length is
// a bad frame naming both lengths, even while the frames behind it keep
// arriving. The op gives the frame's buffer back to its reader before it
// fails the ring, and the reader at once reads the next frame into it:
// the length in the message must be taken first (-race flagged the read
// of a length the reader was rewriting).
func TestWrongLengthFrameWhileMoreArrive(t *testing.T) {
	rings, links := faultWorld(t, 2, map[int]bool{1: true}, func(c *Config) { c.SmallBytes = 64 << 10 })
	fake := newFakeRank(links[1], 1, 2)
	go fake.start(11)
	defer fake.closeAll()
	startAll(t, rings)
	const count = 16 << 10 // 64 KiB of float32: the small path, one whole frame
	d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: count}
	var stream []byte
	for i := 0; i < rxBuffers+2; i++ { // a short frame, then more than the reader has buffers for
		h := header{Kind: kindData, Sender: 1, Generation: 11, Step: 0, Length: 4096}
		h.setDesc(&d, d.Fingerprint())
		b := make([]byte, headerLen+4096)
		h.encode(b)
		stream = append(stream, seal(b)...)
	}
	fake.writeData(d.Bytes() <= duplexBytes, stream) // longer: the one-way streams
	err := rings[0].AllReduce(d, make([]byte, d.Bytes()))
	if !errors.Is(err, ErrBadFrame) || !strings.Contains(err.Error(), "segment of 4096 bytes at step 0, want 65536") {
		t.Fatalf("got %v, want a bad frame of 4096 bytes where 65536 were due", err)
	}
}
