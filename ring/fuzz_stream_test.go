package ring

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/collectived/collectived/collective"
)

// FuzzRingStream feeds arbitrary bytes to a real rank from an
// authenticated neighbour, after the generation agreement, while the rank
// runs an allreduce: the whole reader (header checks, abort reasons, data
// frames checked against the op under way), not only decodeHeader. The
// neighbour writes them once the op is under way, then closes its links. Whatever they were, the call
// returns (bounded), and a failure is a *ring.Error wrapping one of the
// ring's sentinels, never a panic or a hang.
//
// The first byte picks the direction (bit 0: on the streams to the fake
// from rank 0's next, where only heartbeats and aborts may come except on
// the duplex stream; otherwise where the op's data comes), the op (bit
// 1: a pipelined 400 KB allreduce instead of a 4-byte one on the small
// path), and whether the bytes are sealed first (bit 2: read as frames
// without trailers, each is given the checksums of what it holds, as a
// peer sending it would, so that mutations reach the checks behind the
// checksums; unsealed, a mutated frame is mostly ErrCorrupt).
func FuzzRingStream(f *testing.F) {
	const gen = 7
	unsealed := func(h header, payload []byte) []byte {
		h.Sender, h.Generation, h.Length = 1, gen, uint32(len(payload))
		b := make([]byte, headerLen, headerLen+len(payload))
		h.encode(b)
		return append(b, payload...)
	}
	frame := func(h header, payload []byte) []byte { return seal(unsealed(h, payload)) }
	data := func(d collective.Desc, step uint32, n int) []byte {
		h := header{Kind: kindData, Step: step}
		h.setDesc(&d, d.Fingerprint())
		return frame(h, make([]byte, n))
	}
	cat := func(flags byte, frames ...[]byte) []byte {
		b := []byte{flags}
		for _, fr := range frames {
			b = append(b, fr...)
		}
		return b
	}
	hb := frame(header{Kind: kindHeartbeat}, nil)
	f.Add(cat(0))
	f.Add(cat(0, hb, hb))
	f.Add(cat(1, hb))
	f.Add(cat(0, frame(header{Kind: kindAbort, Aux: 1}, []byte("rank 1 gave up"))))
	f.Add(cat(1, frame(header{Kind: kindAbort, Aux: 2 | 1<<32}, []byte("\x00\xff reason"))))
	f.Add(cat(0, data(arDesc1, 0, 4)))
	f.Add(cat(0, data(arDesc1, 0, 3)))
	f.Add(cat(2, data(arDesc, 0, 64<<10)))
	f.Add(cat(2, data(arDesc, 0, 50000), data(arDesc, 1, 50000)))
	f.Add(cat(2, data(arDesc, 0, 100)))
	f.Add(cat(1, data(arDesc1, 0, 4)))
	f.Add(cat(0, frame(header{Kind: kindStart}, nil)))
	f.Add(cat(0, []byte("GET / HTTP/1.1\r\n\r\n")))
	// Sealed by the harness (bit 2): frames without their trailers.
	rawData := func(d collective.Desc, step uint32, n int) []byte {
		h := header{Kind: kindData, Step: step}
		h.setDesc(&d, d.Fingerprint())
		return unsealed(h, make([]byte, n))
	}
	f.Add(cat(4, rawData(arDesc1, 1, 4)))
	f.Add(cat(4, rawData(arDesc1, 0, 4), rawData(arDesc1, 1, 4)))
	f.Add(cat(6, rawData(arDesc, 0, 64<<10)[:headerLen+100]))
	f.Add(cat(5, unsealed(header{Kind: kindAbort, Aux: 1}, []byte("rank 1 gave up"))))
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) == 0 || len(in) > 1<<20 {
			return
		}
		flags, payload := in[0], in[1:]
		if flags&4 != 0 {
			payload = seal(append([]byte(nil), payload...))
		}
		d := arDesc1
		if flags&2 != 0 {
			d = arDesc
		}
		rings, links := faultWorldOver(t, 2, true, map[int]bool{1: true}, func(c *Config) {
			c.OpTimeout = 5 * time.Second
		})
		fake := newFakeRank(links[1], 1, 2)
		var once sync.Once
		closeFake := func() { once.Do(fake.closeAll) }
		go fake.start(gen)
		startAll(t, rings)
		go func() {
			// Write once the op is under way, so that data frames meet
			// the checks against it rather than an idle ring.
			for deadline := time.Now().Add(5 * time.Second); rings[0].Status().Op == collective.OpInvalid && time.Now().Before(deadline); {
				time.Sleep(50 * time.Microsecond)
			}
			if flags&1 != 0 {
				fake.writePrev(payload)
			} else {
				fake.writeData(flags&2 == 0, payload)
			}
			closeFake()
		}()
		errs := opOnReal(t, rings, 20*time.Second, func(_ int, r *Ring) error {
			return r.AllReduce(d, make([]byte, d.Bytes()))
		})
		// The fake's links closing also ends the writer if the rank stopped
		// reading before it had written everything.
		closeFake()
		err := errs[0]
		if err == nil {
			return // the bytes were a valid peer's part of this allreduce
		}
		var re *Error
		if !errors.As(err, &re) {
			t.Fatalf("%T is not a *ring.Error: %v", err, err)
		}
		known := false
		for _, s := range []error{ErrAborted, ErrPeerClosed, ErrTimeout, ErrPeerHung, ErrMismatch, ErrBadFrame, ErrGeneration, ErrCorrupt} {
			known = known || errors.Is(err, s)
		}
		if !known {
			t.Fatalf("error wraps none of the ring's sentinels: %v", err)
		}
	})
}
