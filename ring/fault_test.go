package ring

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/collectived/collectived/collective"
)

var arDesc = collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 100000, Name: "grad"}

// faultWorld starts the ranks not in skip over real TCP and returns the
// rings (nil at skipped ranks) and the raw links (for the fake ranks).
func faultWorld(t *testing.T, n int, skip map[int]bool, tweak func(*Config)) ([]*Ring, []Links) {
	return faultWorldOver(t, n, false, skip, tweak)
}

func faultWorldOver(t *testing.T, n int, pipe bool, skip map[int]bool, tweak func(*Config)) ([]*Ring, []Links) {
	t.Helper()
	var links []Links
	if pipe {
		links = pipeLinks(n, 2)
	} else {
		links = tcpLinks(t, n, 1)
	}
	rings := newRings(t, links, skip, func(cfg *Config) {
		cfg.OpTimeout = 10 * time.Second
		cfg.HeartbeatInterval = 50 * time.Millisecond
		cfg.HeartbeatTimeout = 3 * time.Second
		if tweak != nil {
			tweak(cfg)
		}
	})
	return rings, links
}

// startAll runs Start on every real rank.
func startAll(t *testing.T, rings []*Ring) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(rings))
	for i, r := range rings {
		if r == nil {
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); _, errs[i] = r.Start() }()
	}
	waitBounded(t, &wg, 30*time.Second)
	noErrors(t, "start", errs)
}

// opOnReal runs f on every real rank concurrently, bounded.
func opOnReal(t *testing.T, rings []*Ring, bound time.Duration, f func(i int, r *Ring) error) []error {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(rings))
	for i, r := range rings {
		if r == nil {
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = f(i, r) }()
	}
	waitBounded(t, &wg, bound)
	return errs
}

// expectAll checks that every real rank failed with sentinel and that its
// message names each of the words.
func expectAll(t *testing.T, rings []*Ring, errs []error, sentinel error, words ...string) {
	t.Helper()
	for i, r := range rings {
		if r == nil {
			continue
		}
		err := errs[i]
		if !errors.Is(err, sentinel) {
			t.Errorf("rank %d: %v, want errors.Is %v", i, err, sentinel)
			continue
		}
		var re *Error
		if !errors.As(err, &re) {
			t.Errorf("rank %d: %T is not a *ring.Error", i, err)
		}
		for _, w := range words {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("rank %d: %q does not say %q", i, err, w)
			}
		}
		t.Logf("rank %d: %v", i, err)
	}
}

func allReduceOn(i int, r *Ring) error {
	return r.AllReduce(arDesc, make([]byte, arDesc.Bytes()))
}

// A rank whose links close without warning (a crash): its neighbours see
// the peer closing, everyone else learns it from their abort.
func TestFaultPeerCloses(t *testing.T) {
	rings, links := faultWorld(t, 4, map[int]bool{2: true}, nil)
	// Rank 2 answers Start like a real rank would, then dies.
	fake := newFakeRank(links[2], 2, 4)
	go fake.start(10 + 3)
	startAll(t, rings)
	time.AfterFunc(200*time.Millisecond, fake.closeAll)
	errs := opOnReal(t, rings, 15*time.Second, allReduceOn)
	expectAll(t, rings, errs, ErrPeerClosed, "rank 2", "allreduce seq 0")
	var e *Error
	if errors.As(errs[0], &e) && e.Origin == 0 {
		t.Errorf("rank 0 is not next to rank 2 yet names itself as origin: %v", errs[0])
	}
	if !errors.Is(errs[0], ErrAborted) {
		t.Errorf("rank 0 learnt of the failure other than by an abort frame: %v", errs[0])
	}
}

// A rank that is alive at the TCP level but sends nothing at all (as if
// SIGSTOPped): heartbeats find it long before the op timeout.
func TestFaultPeerHung(t *testing.T) {
	rings, links := faultWorld(t, 3, map[int]bool{1: true}, func(c *Config) {
		c.OpTimeout = 60 * time.Second
		c.HeartbeatTimeout = time.Second
	})
	fake := newFakeRank(links[1], 1, 3)
	go fake.start(10 + 2)
	startAll(t, rings)
	fake.silent()
	t0 := time.Now()
	errs := opOnReal(t, rings, 15*time.Second, allReduceOn)
	expectAll(t, rings, errs, ErrPeerHung, "rank 1")
	if d := time.Since(t0); d > 30*time.Second {
		t.Errorf("hang detected after %v", d)
	}
	fake.closeAll()
}

// While idle, too: no op under way, and Err reports the hung peer.
func TestFaultPeerHungIdle(t *testing.T) {
	rings, links := faultWorld(t, 2, map[int]bool{1: true}, func(c *Config) { c.HeartbeatTimeout = 500 * time.Millisecond })
	fake := newFakeRank(links[1], 1, 2)
	go fake.start(11)
	startAll(t, rings)
	fake.silent()
	deadline := time.Now().Add(10 * time.Second)
	for rings[0].Err() == nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	err := rings[0].Err()
	if !errors.Is(err, ErrPeerHung) || !strings.Contains(err.Error(), "idle") || !strings.Contains(err.Error(), "rank 1") {
		t.Fatalf("idle hang: %v", err)
	}
	// The next call reports it, wrapped with its own op and seq.
	err = allReduceOn(0, rings[0])
	if !errors.Is(err, ErrPeerHung) || !strings.Contains(err.Error(), "allreduce seq 0: failed earlier: idle") {
		t.Fatalf("call after idle failure: %v", err)
	}
	fake.closeAll()
}

// A rank that calls late (its owner is slow) is not hung: the root of a
// broadcast fills the late rank's receive buffers and socket, so neither
// data nor heartbeats move from it for well past the heartbeat timeout,
// and still every rank succeeds.
func TestSlowCallerIsNotHung(t *testing.T) {
	rings := newWorld(t, worldOpts{n: 3, tweak: func(c *Config) {
		c.HeartbeatInterval = 50 * time.Millisecond
		c.HeartbeatTimeout = 500 * time.Millisecond
		c.SegmentBytes = 1 << 20
	}})
	const size = 32 << 20
	d := collective.Desc{Op: collective.OpBroadcast, DType: collective.Bytes, Count: size}
	ad := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 4 << 20}
	errs := onAll(t, rings, func(i int, r *Ring) error {
		if i == 1 {
			time.Sleep(2 * time.Second)
		}
		if err := r.Broadcast(d, make([]byte, size)); err != nil {
			return err
		}
		if i == 2 {
			time.Sleep(2 * time.Second)
		}
		return r.AllReduce(ad, make([]byte, ad.Bytes()))
	})
	noErrors(t, "slow caller", errs)
}

// A rank that never calls: the others fail after OpTimeout with
// ErrTimeout, and the late rank learns it from their abort.
func TestFaultOpTimeout(t *testing.T) {
	rings, _ := faultWorld(t, 3, nil, func(c *Config) { c.OpTimeout = 700 * time.Millisecond })
	startAll(t, rings)
	errs := opOnReal(t, rings, 15*time.Second, func(i int, r *Ring) error {
		if i == 2 {
			time.Sleep(2 * time.Second)
		}
		return allReduceOn(i, r)
	})
	expectAll(t, rings, errs, ErrTimeout, "no progress")
	if !errors.Is(errs[2], ErrAborted) {
		t.Errorf("the late rank: %v, want an abort", errs[2])
	}
}

// Ranks calling different collectives: everyone fails with ErrMismatch,
// and the detecting rank's message shows both descriptions.
func TestFaultMismatch(t *testing.T) {
	cases := []struct {
		name  string
		call  func(r *Ring) error
		words []string
	}{
		{"count", func(r *Ring) error {
			d := arDesc
			d.Count++
			return r.AllReduce(d, make([]byte, d.Bytes()))
		}, []string{"count=100000", "count=100001"}},
		{"op", func(r *Ring) error {
			d := collective.Desc{Op: collective.OpBroadcast, DType: collective.Float32, Count: 100000}
			return r.Broadcast(d, make([]byte, d.Bytes()))
			// Whichever rank finds it (rank 1, or rank 2 from rank 1's
			// description check) names both calls.
		}, []string{"broadcast(float32, count=100000, root=0", "allreduce(float32, sum, count=100000"}},
		{"name", func(r *Ring) error {
			d := arDesc
			d.Name = "other"
			return r.AllReduce(d, make([]byte, d.Bytes()))
		}, []string{"allreduce(float32, sum, count=100000, name differs)"}},
		{"small", func(r *Ring) error {
			d := arDesc
			d.Count = 3
			return r.AllReduce(d, make([]byte, d.Bytes()))
		}, []string{"count=3"}},
		{"skipped op", func(r *Ring) error {
			if err := r.Barrier(collective.Desc{Op: collective.OpBarrier}); err != nil {
				return err
			}
			return allReduceOn(0, r)
		}, []string{"barrier(", "seq 0 allreduce(float32, sum, count=100000"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rings, _ := faultWorldOver(t, 3, c.name == "op", nil, nil)
			startAll(t, rings)
			errs := opOnReal(t, rings, 15*time.Second, func(i int, r *Ring) error {
				if i == 1 {
					return c.call(r)
				}
				return allReduceOn(i, r)
			})
			// Every rank, however it learnt of it, sees both descriptions.
			expectAll(t, rings, errs, ErrMismatch, c.words...)
			for i, err := range errs {
				var e *Error
				if errors.As(err, &e) && e.Origin == i && !strings.Contains(err.Error(), fmt.Sprintf("rank %d sent seq", e.PeerRank)) {
					t.Errorf("rank %d detected the mismatch but does not name the peer's description: %v", i, err)
				}
			}
			// Later calls return the same failure, wrapped with their own op and seq.
			err := rings[0].Barrier(collective.Desc{Op: collective.OpBarrier})
			if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "barrier seq 1: failed earlier: ") {
				t.Errorf("later call: %v", err)
			}
		})
	}
}

// A peer that sends garbage: the receiver names it, the others learn the
// cause by abort.
func TestFaultGarbage(t *testing.T) {
	for _, g := range []struct {
		name     string
		bytes    func() []byte
		word     string
		backward bool // sent to rank 0, against the data direction
	}{
		{"http", func() []byte { return []byte(strings.Repeat("GET / HTTP/1.1\r\nHost: x\r\n\r\n", 4)) }, "bad magic", false},
		{"oversized", func() []byte {
			h := header{Kind: kindData, Sender: 1, Length: 1 << 31}
			b := make([]byte, headerLen)
			h.encode(b)
			return b
		}, "exceeds the limit", false},
		{"kind", func() []byte {
			h := header{Kind: 9, Sender: 1}
			b := make([]byte, headerLen)
			h.encode(b)
			return b
		}, "unknown frame kind 9", false},
		{"sender", func() []byte {
			h := header{Kind: kindHeartbeat, Sender: 0}
			b := make([]byte, headerLen)
			h.encode(b)
			return b
		}, "claims sender rank 0", false},
		{"backward data", func() []byte {
			h := header{Kind: kindData, Sender: 1}
			b := make([]byte, headerLen)
			h.encode(b)
			return b
		}, "data frame on the backward direction", true},
	} {
		t.Run(g.name, func(t *testing.T) {
			rings, links := faultWorld(t, 3, map[int]bool{1: true}, nil)
			fake := newFakeRank(links[1], 1, 3)
			go fake.start(12)
			startAll(t, rings)
			time.AfterFunc(100*time.Millisecond, func() {
				if g.backward {
					fake.writePrev(g.bytes())
				} else {
					fake.writeNext(g.bytes())
				}
			})
			errs := opOnReal(t, rings, 15*time.Second, allReduceOn)
			expectAll(t, rings, errs, ErrBadFrame, g.word, "rank 1")
			detector, other := 2, 0
			if g.backward {
				detector, other = 0, 2
			}
			if !errors.Is(errs[other], ErrAborted) || !strings.Contains(errs[other].Error(), fmt.Sprintf("origin rank %d", detector)) {
				t.Errorf("rank %d: %v, want an abort from origin rank %d", other, errs[other], detector)
			}
			fake.closeAll()
		})
	}
}

// A frame of another generation is refused with ErrGeneration.
func TestFaultGeneration(t *testing.T) {
	rings, links := faultWorld(t, 2, map[int]bool{1: true}, nil)
	fake := newFakeRank(links[1], 1, 2)
	go fake.start(11)
	startAll(t, rings)
	d := collective.Desc{Op: collective.OpBarrier}
	h := header{Kind: kindData, Sender: 1, Generation: 99}
	h.setDesc(&d, d.Fingerprint())
	b := make([]byte, headerLen)
	h.encode(b)
	time.AfterFunc(50*time.Millisecond, func() { fake.writeData(true, b) })
	err := rings[0].Barrier(d)
	if !errors.Is(err, ErrGeneration) || !strings.Contains(err.Error(), "generation 99") {
		t.Fatalf("%v, want ErrGeneration naming generation 99", err)
	}
	fake.closeAll()
}

// Abort from outside (the daemon found a local mismatch): every rank
// fails with the origin and reason text.
func TestAbortTravels(t *testing.T) {
	for _, pipe := range []bool{false, true} {
		t.Run(fmt.Sprintf("pipe=%v", pipe), func(t *testing.T) { testAbortTravels(t, pipe) })
	}
}

func testAbortTravels(t *testing.T, pipe bool) {
	rings, _ := faultWorldOver(t, 4, pipe, nil, nil)
	startAll(t, rings)
	reason := errors.New("trainer 3 called allreduce(float32) while trainer 0 called broadcast")
	errs := opOnReal(t, rings, 15*time.Second, func(i int, r *Ring) error {
		if i == 2 {
			time.Sleep(100 * time.Millisecond)
			r.Abort(reason)
			return r.Barrier(collective.Desc{Op: collective.OpBarrier})
		}
		return allReduceOn(i, r)
	})
	expectAll(t, rings, errs, ErrAborted, "origin rank 2", reason.Error())
	if !errors.Is(errs[2], reason) {
		t.Errorf("rank 2's own error does not wrap its reason: %v", errs[2])
	}
}

// Close while an op waits: the op fails with ErrClosed at once, the
// neighbours learn the rank closed.
func TestCloseDuringOp(t *testing.T) {
	for _, pipe := range []bool{false, true} {
		t.Run(fmt.Sprintf("pipe=%v", pipe), func(t *testing.T) { testCloseDuringOp(t, pipe) })
	}
}

func testCloseDuringOp(t *testing.T, pipe bool) {
	rings, _ := faultWorldOver(t, 3, pipe, nil, nil)
	startAll(t, rings)
	errs := opOnReal(t, rings, 15*time.Second, func(i int, r *Ring) error {
		if i == 1 {
			time.Sleep(200 * time.Millisecond)
			r.Close()
			r.Close()
			return r.Barrier(collective.Desc{Op: collective.OpBarrier})
		}
		return allReduceOn(i, r)
	})
	if !errors.Is(errs[1], ErrClosed) {
		t.Errorf("closed rank: %v", errs[1])
	}
	for _, i := range []int{0, 2} {
		if !errors.Is(errs[i], ErrAborted) || !errors.Is(errs[i], ErrPeerClosed) || !strings.Contains(errs[i].Error(), "rank 1 closed its ring") {
			t.Errorf("rank %d: %v", i, errs[i])
		}
	}
}

// A second op while one is under way is refused, and the first is not
// disturbed.
func TestConcurrentCallRefused(t *testing.T) {
	rings := newWorld(t, worldOpts{n: 2})
	started := make(chan struct{})
	errs := onAll(t, rings, func(i int, r *Ring) error {
		if i == 0 {
			go func() {
				time.Sleep(50 * time.Millisecond)
				close(started)
			}()
			return r.Barrier(collective.Desc{Op: collective.OpBarrier})
		}
		<-started
		// rank 0 is inside its barrier, waiting for rank 1.
		if err := rings[0].Barrier(collective.Desc{Op: collective.OpBarrier}); !errors.Is(err, ErrBusy) {
			return fmt.Errorf("concurrent call: %v, want ErrBusy", err)
		}
		return r.Barrier(collective.Desc{Op: collective.OpBarrier})
	})
	noErrors(t, "concurrent", errs)
}

// fakeRank speaks just enough of the protocol over a rank's raw links.
type fakeRank struct {
	links      Links
	rank, size int
	mu         sync.Mutex
	quiet      bool
	done       chan struct{}
}

func newFakeRank(l Links, rank, size int) *fakeRank {
	return &fakeRank{links: l, rank: rank, size: size, done: make(chan struct{})}
}

// start answers the generation agreement (proposing gen) and then keeps
// sending heartbeats both ways until silent or closed, reading and
// discarding whatever arrives.
func (f *fakeRank) start(gen uint32) {
	for _, c := range append(append([]net.Conn(nil), f.links.Next...), f.links.Prev...) {
		go io.Copy(io.Discard, c)
	}
	for s := 0; s < f.size-1; s++ {
		h := header{Kind: kindStart, Sender: uint32(f.rank), Generation: gen, Step: uint32(s)}
		b := make([]byte, headerLen)
		h.encode(b)
		f.writeData(true, b)
	}
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-f.done:
			return
		case <-t.C:
		}
		f.mu.Lock()
		q := f.quiet
		f.mu.Unlock()
		if q {
			continue
		}
		h := header{Kind: kindHeartbeat, Sender: uint32(f.rank)}
		b := make([]byte, headerLen)
		h.encode(b)
		f.writeNext(b)
		for _, c := range f.links.Prev {
			c.Write(b)
		}
	}
}

// writeData writes b where this rank sends an op's data frames: in a
// world of two, an op of short frames (Start, Barrier, a small
// allreduce) goes on the duplex stream (duplex.go), rank 0's first
// stream to next and rank 1's first from prev; everything else goes on
// every stream to next.
func (f *fakeRank) writeData(short bool, b []byte) {
	if !short || f.size != 2 {
		f.writeNext(b)
		return
	}
	c := f.links.Prev[0]
	if f.rank == 0 {
		c = f.links.Next[0]
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	c.Write(b)
}

func (f *fakeRank) writeNext(b []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.links.Next {
		c.Write(b)
	}
}

func (f *fakeRank) writePrev(b []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.links.Prev {
		c.Write(b)
	}
}

func (f *fakeRank) silent() {
	f.mu.Lock()
	f.quiet = true
	f.mu.Unlock()
}

func (f *fakeRank) closeAll() {
	select {
	case <-f.done:
		return
	default:
	}
	close(f.done)
	for _, c := range f.links.Next {
		c.Close()
	}
	for _, c := range f.links.Prev {
		c.Close()
	}
}

// Ranks whose diverged calls send no data at all (each thinks the other
// is the broadcast root) still find the mismatch, from the op announced
// in heartbeats, long before the op timeout.
func TestFaultMismatchWithoutData(t *testing.T) {
	rings, _ := faultWorld(t, 2, nil, func(c *Config) { c.OpTimeout = 30 * time.Second })
	startAll(t, rings)
	t0 := time.Now()
	errs := opOnReal(t, rings, 20*time.Second, func(i int, r *Ring) error {
		d := collective.Desc{Op: collective.OpBroadcast, DType: collective.Bytes, Count: 10, Root: uint32(1 - i)}
		return r.Broadcast(d, make([]byte, 10))
	})
	expectAll(t, rings, errs, ErrMismatch, "root=0", "root=1")
	if d := time.Since(t0); d > 15*time.Second {
		t.Errorf("mismatch found after %v, the op timeout is 30s", d)
	}
}

// Frames that are well formed but do not fit the op under way: each is
// refused with ErrBadFrame naming what was wrong.
func TestFaultBadDataFrames(t *testing.T) {
	frame := func(h header, payload int) []byte {
		h.Sender, h.Generation, h.Length = 1, 11, uint32(payload)
		b := make([]byte, headerLen+payload)
		h.encode(b)
		return seal(b)
	}
	withDesc := func(d collective.Desc, h header) header {
		h.Kind = kindData
		h.setDesc(&d, d.Fingerprint())
		return h
	}
	small := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 3}
	gather := collective.Desc{Op: collective.OpAllGather, DType: collective.Bytes}
	cases := []struct {
		name   string
		frames [][]byte
		short  bool // the op's frames travel on the duplex stream (duplex.go)
		call   func(r *Ring) error
		word   string
	}{
		{"step", [][]byte{frame(withDesc(barrierDesc, header{Step: 5}), 0)}, true,
			func(r *Ring) error { return r.Barrier(barrierDesc) }, "frame for step 5, want step 0"},
		{"length", [][]byte{frame(withDesc(small, header{}), 8)}, true,
			func(r *Ring) error { return r.AllReduce(small, make([]byte, 12)) }, "segment of 8 bytes at step 0, want 12"},
		{"start during op", [][]byte{frame(header{Kind: kindStart}, 0)}, true,
			func(r *Ring) error { return r.Barrier(barrierDesc) }, "start frame where a data frame was due"},
		{"gather block too large", [][]byte{frame(withDesc(gather, header{Aux: 1 << 40}), 0)}, false,
			func(r *Ring) error { _, err := r.AllGather(gather, nil, nil); return err }, "allgather block of 1099511627776 bytes announced"},
		{"gather block changes", [][]byte{frame(withDesc(gather, header{Aux: 100000}), 64<<10), frame(withDesc(gather, header{Aux: 7}), 0)}, false,
			func(r *Ring) error { _, err := r.AllGather(gather, nil, nil); return err }, "block length changed from 100000 to 7"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rings, links := faultWorld(t, 2, map[int]bool{1: true}, nil)
			fake := newFakeRank(links[1], 1, 2)
			go fake.start(11)
			startAll(t, rings)
			go func() {
				for _, f := range c.frames {
					fake.writeData(c.short, f)
				}
			}()
			errs := opOnReal(t, rings, 15*time.Second, func(i int, r *Ring) error { return c.call(r) })
			expectAll(t, rings, errs, ErrBadFrame, c.word, "from rank 1")
			fake.closeAll()
		})
	}
}

// Close ends every goroutine a ring started, healthy or failed.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	base := runtime.NumGoroutine()
	for _, abort := range []bool{false, true} {
		rings := newWorld(t, worldOpts{n: 3, streams: 2})
		noErrors(t, "op", onAll(t, rings, func(i int, r *Ring) error { return allReduceOn(i, r) }))
		if abort {
			rings[1].Abort(errors.New("leak test"))
		}
		var wg sync.WaitGroup
		for _, r := range rings {
			wg.Add(1)
			go func() { defer wg.Done(); r.Close() }()
		}
		waitBounded(t, &wg, 20*time.Second)
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > base {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines after Close, %d before:\n%s", n, base, buf[:runtime.Stack(buf, true)])
	}
}

// Ranks configured with different segment sizes cut their frames
// differently: they fail with a named error, not a hang or wrong data.
func TestFaultSegmentSizesDiffer(t *testing.T) {
	rings, _ := faultWorld(t, 2, nil, func(c *Config) {
		if c.Rank == 1 {
			c.SegmentBytes = 128 << 10
		}
	})
	startAll(t, rings)
	d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Int32, Reduce: collective.Sum, Count: 1 << 20}
	errs := opOnReal(t, rings, 15*time.Second, func(i int, r *Ring) error { return r.AllReduce(d, make([]byte, d.Bytes())) })
	expectAll(t, rings, errs, ErrBadFrame, "must be the same on every rank")
}

// A broadcast whose calls differ in any field fails on every rank with
// ErrMismatch, the root included, and no rank's buffer is changed: the
// root used to send and return before any rank had compared the calls
// (issue 24, cases 1 and 2), so that two ranks each naming itself root
// both succeeded with their own data, and a root whose peers made an
// allreduce succeeded while they failed.
func TestBroadcastMismatchFailsEveryRank(t *testing.T) {
	const count = 16
	base := collective.Desc{Op: collective.OpBroadcast, DType: collective.Float32, Count: count}
	for _, n := range []int{2, 3, 4} {
		for root := 0; root < n; root++ {
			cases := []struct {
				name string
				desc func(i int) collective.Desc // rank i's call
			}{
				{"every rank its own root", func(i int) collective.Desc { d := base; d.Root = uint32(i); return d }},
				{"root alone broadcasts", func(i int) collective.Desc {
					d := base
					d.Root = uint32(root)
					if i != root {
						d.Op, d.Root, d.Reduce = collective.OpAllReduce, 0, collective.Sum
					}
					return d
				}},
				{"root's count differs", func(i int) collective.Desc {
					d := base
					d.Root = uint32(root)
					if i == root {
						d.Count--
					}
					return d
				}},
				{"root's name differs", func(i int) collective.Desc {
					d := base
					d.Root = uint32(root)
					if i == root {
						d.Name = "b"
					}
					return d
				}},
				{"last rank's root differs", func(i int) collective.Desc {
					d := base
					d.Root = uint32(root)
					if i == (root+n-1)%n {
						d.Root = uint32((root + 1) % n)
					}
					return d
				}},
			}
			for _, c := range cases {
				t.Run(fmt.Sprintf("n=%d/root=%d/%s", n, root, c.name), func(t *testing.T) {
					rings, _ := faultWorldOver(t, n, true, nil, func(cfg *Config) { cfg.OpTimeout = 20 * time.Second })
					startAll(t, rings)
					bufs := make([][]byte, n)
					errs := opOnReal(t, rings, 30*time.Second, func(i int, r *Ring) error {
						d := c.desc(i)
						bufs[i] = bytes.Repeat([]byte{byte(i + 1)}, int(d.Bytes()))
						if d.Op == collective.OpAllReduce {
							return r.AllReduce(d, bufs[i])
						}
						return r.Broadcast(d, bufs[i])
					})
					expectAll(t, rings, errs, ErrMismatch)
					for i, b := range bufs {
						if !bytes.Equal(b, bytes.Repeat([]byte{byte(i + 1)}, len(b))) {
							t.Errorf("rank %d: its buffer changed although the calls did not match", i)
						}
					}
				})
			}
		}
	}
}
