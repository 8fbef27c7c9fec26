package ring

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/collectived/collectived/collective"
)

// flipRelay is a TCP proxy on 127.0.0.1 that a test puts on every stream
// of the link from rank 0 to rank 1. It forwards both ways frame by frame
// (it reads each header's length field before the flip, so its own
// framing survives a flipped length) and, once armed, XORs one byte of
// the frame its rule picks, once: what a faulty NIC, switch or a man in
// the middle does to a link whose TCP checksums it recomputes. It knows
// the frame layout of this build: a payload's trailer follows it.
type flipRelay struct {
	ln      net.Listener
	target  string
	rule    flipRule
	armed   atomic.Bool
	seen    atomic.Int64 // frames the rule matched while armed
	flipped chan struct{}
	once    sync.Once

	mu     sync.Mutex
	conns  []net.Conn
	closed bool
	wg     sync.WaitGroup
}

// flipRule picks the frame and the byte to flip.
type flipRule struct {
	back    bool      // frames from rank 1 to rank 0 (a ring of two's duplex stream); else rank 0 to rank 1
	kind    frameKind // frames of this kind count
	min     int       // ... whose payload is at least this long
	nth     int       // the nth such frame (from 1) is flipped
	payload bool      // at is a payload offset (taken mod the payload's length); else a header offset
	trailer bool      // at is an offset in the payload's trailer (mod its length)
	at      int
	mask    byte
}

func startFlipRelay(t testing.TB, target string, rule flipRule) *flipRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &flipRelay{ln: ln, target: target, rule: rule, flipped: make(chan struct{})}
	f.wg.Add(1)
	go f.acceptLoop()
	t.Cleanup(f.close)
	return f
}

func (f *flipRelay) addr() string { return f.ln.Addr().String() }

func (f *flipRelay) acceptLoop() {
	defer f.wg.Done()
	for {
		down, err := f.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", f.target)
		if err != nil {
			down.Close()
			continue
		}
		f.mu.Lock()
		if f.closed {
			f.mu.Unlock()
			down.Close()
			up.Close()
			return
		}
		f.conns = append(f.conns, down, up)
		f.wg.Add(2)
		f.mu.Unlock()
		go f.pump(up, down, false)
		go f.pump(down, up, true)
	}
}

func (f *flipRelay) close() {
	f.mu.Lock()
	f.closed = true
	cs := f.conns
	f.conns = nil
	f.mu.Unlock()
	f.ln.Close()
	for _, c := range cs {
		c.Close()
	}
	f.wg.Wait()
}

// pick counts a frame against the rule and returns the byte to flip: a
// header offset, headerLen + an offset in the payload and its trailer,
// or -1.
func (f *flipRelay) pick(back bool, kind frameKind, n int) int {
	r := &f.rule
	if !f.armed.Load() || back != r.back || kind != r.kind || n < r.min {
		return -1
	}
	if f.seen.Add(1) != int64(r.nth) {
		return -1
	}
	f.once.Do(func() { close(f.flipped) })
	switch {
	case r.payload:
		return headerLen + r.at%n
	case r.trailer:
		return headerLen + n + r.at%trailerLen
	}
	return r.at
}

// pump copies src to dst frame by frame, flipping what pick says, and
// passes src's end on as a half-close.
func (f *flipRelay) pump(dst, src net.Conn, back bool) {
	defer f.wg.Done()
	br := bufio.NewReaderSize(src, 256<<10)
	var h [headerLen]byte
	buf := make([]byte, 64<<10)
	defer func() {
		if tc, ok := dst.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
	}()
	for {
		if _, err := io.ReadFull(br, h[:]); err != nil {
			return
		}
		n := int(binary.LittleEndian.Uint32(h[52:]))
		at := f.pick(back, frameKind(h[5]), n)
		if at >= 0 && at < headerLen {
			h[at] ^= f.rule.mask
		}
		if _, err := dst.Write(h[:]); err != nil {
			return
		}
		n += trailerFor(n) // the payload's checksum follows it
		for off := 0; off < n; {
			m := min(len(buf), n-off)
			if _, err := io.ReadFull(br, buf[:m]); err != nil {
				return
			}
			if p := at - headerLen; at >= headerLen && p >= off && p < off+m {
				buf[p-off] ^= f.rule.mask
			}
			if _, err := dst.Write(buf[:m]); err != nil {
				return
			}
			off += m
		}
	}
}

// relayWorld builds (but does not start) a ring of n ranks over TCP on
// 127.0.0.1, every stream of the link from rank 0 to rank 1 through a
// flipRelay with the rule, not yet armed.
func relayWorld(t *testing.T, n, streams int, rule flipRule, tweak func(*Config)) ([]*Ring, *flipRelay) {
	t.Helper()
	var f *flipRelay
	links := tcpLinksVia(t, n, streams, func(i int, listener string) string {
		if i != 0 {
			return listener
		}
		f = startFlipRelay(t, listener, rule) // a node whose peer list sends it to the relay
		return f.addr()
	})
	rings := newRings(t, links, nil, proposing(tweak))
	return rings, f
}

// expectCorrupt checks that every rank failed with ErrCorrupt naming the
// link from -> to (its sender as the culprit, its receiver as the origin)
// and that none returned a wrong result. wrong reports, for a rank that
// returned no error, whether its result was wrong.
//
// early: a rank other than the receiver may have finished the op before
// the receiver checked the flipped frame, when its op did not wait on
// anything the receiver sends after that frame (a small allreduce, whose
// buffers all set out at once; a broadcast's root; an allgather's blocks
// that other ranks forward; the last frames of the op). It then returned
// the right result (nothing corrupted reached it), and its ring must fail
// with ErrCorrupt right after: its next op reports it.
func expectCorrupt(t *testing.T, rings []*Ring, f *flipRelay, errs []error, from, to int, early bool, wrong func(i int) bool, words ...string) {
	t.Helper()
	select {
	case <-f.flipped:
	default:
		t.Fatalf("the relay flipped nothing (%d frames matched its rule %+v)", f.seen.Load(), f.rule)
	}
	link := fmt.Sprintf("on the link from rank %d to rank %d", from, to)
	for i, err := range errs {
		if err == nil {
			what := "a right result"
			if wrong != nil && wrong(i) {
				what = "a WRONG result, silently"
			} else if early && i != to && errors.Is(errs[to], ErrCorrupt) {
				select {
				case <-rings[i].Done():
				case <-time.After(20 * time.Second):
				}
				if err = rings[i].Err(); errors.Is(err, ErrCorrupt) {
					t.Logf("rank %d: finished before rank %d checked the frame, with the right result; its ring then failed: %v", i, to, err)
					continue
				}
			}
			t.Errorf("rank %d: no error, %s: a flipped byte must fail the op with ErrCorrupt (ring: %v)", i, what, err)
			continue
		}
		var re *Error
		if !errors.Is(err, ErrCorrupt) || !errors.As(err, &re) {
			t.Errorf("rank %d: %v, want ErrCorrupt", i, err)
			continue
		}
		if re.Origin != to || re.Culprit != from {
			t.Errorf("rank %d: origin %d culprit %d, want origin %d (the receiver) and culprit %d (the sender): %v", i, re.Origin, re.Culprit, to, from, err)
		}
		for _, w := range append([]string{link}, words...) {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("rank %d: %q does not say %q", i, err, w)
			}
		}
		t.Logf("rank %d: %v", i, err)
	}
}

// f32Bufs gives rank i a buffer of count float32 elements, all i+1.
func f32Bufs(n, count int) [][]byte {
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, 4*count)
		for e := 0; e < count; e++ {
			binary.LittleEndian.PutUint32(bufs[i][4*e:], math.Float32bits(float32(i+1)))
		}
	}
	return bufs
}

// sumWrong reports whether buf is not n(n+1)/2 everywhere.
func sumWrong(buf []byte, n int) bool {
	want := float32(n * (n + 1) / 2)
	for e := 0; e+4 <= len(buf); e += 4 {
		if math.Float32frombits(binary.LittleEndian.Uint32(buf[e:])) != want {
			return true
		}
	}
	return false
}

func arOf(count int) collective.Desc {
	return collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: uint64(count)}
}

// TestCorruptPayload: one payload byte flipped on the link from rank 0 to
// rank 1 (or back, on a ring of two's duplex stream) fails the op on
// every rank with ErrCorrupt naming the link, whatever path received the
// frame: the small path (through a reader, on the duplex stream, and
// read by the op goroutine itself on a lent link), a large allreduce's
// reduce-scatter (a receive buffer) and its allgather (received in place,
// straight into the caller's buffer, with frames written by the writer
// goroutine or by the op goroutine itself, over one stream or two),
// a broadcast and an allgather. No rank gets a wrong result; a rank whose
// op did not wait on the receiver may finish first with the right one
// (early, see expectCorrupt). Before the checksum every one of these
// returned success, with a wrong result on some rank.
func TestCorruptPayload(t *testing.T) {
	const flip = 0x10 // in byte 2 of a float32: 1.0 becomes 1.125, 2.0 2.25
	for _, tc := range []struct {
		name       string
		n, streams int
		rule       flipRule
		tweak      func(*Config)
		warm       int // ops before the relay is armed
		op         func(i int, r *Ring, buf []byte) error
		count      int // float32 elements per rank
		from, to   int
		placed     bool // the flipped frame is an allgather segment received in place
		early      bool // ranks other than the receiver may finish first (expectCorrupt)
		// wrong reports whether rank i's buffer (after the op) holds a
		// wrong result; nil: a sum, as f32Bufs's buffers give it
		wrong func(n, i int, buf []byte) bool
	}{
		{name: "small", n: 3, early: true, count: 1024, from: 0, to: 1,
			rule: flipRule{kind: kindData, min: 1, nth: 1, payload: true, at: 6, mask: flip}},
		{name: "small duplex", n: 2, early: true, count: 16, from: 1, to: 0,
			rule: flipRule{back: true, kind: kindData, min: 1, nth: 1, payload: true, at: 6, mask: flip}},
		{name: "small lent", n: 3, early: true, count: 16, from: 0, to: 1, warm: 3,
			tweak: func(c *Config) {
				c.Spin = 200 * time.Microsecond
				// No heartbeat arrives between calls to take the lent
				// link back (reclaimIdle): the borrower reads the frame.
				c.HeartbeatInterval, c.HeartbeatTimeout = time.Hour, 2*time.Hour
			},
			op: func(i int, r *Ring, buf []byte) error {
				return r.AllReduceLent(arOf(len(buf)/4), [][]byte{buf}, nil)
			},
			rule: flipRule{kind: kindData, min: 1, nth: 1, payload: true, at: 6, mask: flip}},
		{name: "reduce-scatter", n: 3, count: 1 << 18, from: 0, to: 1,
			tweak: func(c *Config) { c.SegmentBytes = 16 << 10 },
			rule:  flipRule{kind: kindData, min: 1, nth: 2, payload: true, at: 4098, mask: flip}},
		{name: "allgather in place, writer goroutine", n: 2, count: 1 << 20, from: 0, to: 1, placed: true,
			tweak: func(c *Config) { c.SegmentBytes = 256 << 10 },
			// 4 MiB: 2 chunks of 8 segments of 256 KiB, 16 frames from
			// rank 0 to rank 1; the 14th is an allgather segment.
			rule: flipRule{kind: kindData, min: 1, nth: 14, payload: true, at: 100002, mask: flip}},
		{name: "allgather in place, direct writes, two streams", n: 2, streams: 2, count: 1 << 18, from: 0, to: 1, placed: true,
			tweak: func(c *Config) { c.SegmentBytes, c.StripeBytes = 16<<10, 1 },
			// 1 MiB: 2 chunks of 32 segments of 16 KiB, 64 frames.
			rule: flipRule{kind: kindData, min: 1, nth: 60, payload: true, at: 10002, mask: flip}},
		{name: "allgather in place, last frame", n: 2, count: 1 << 20, from: 0, to: 1, placed: true, early: true,
			tweak: func(c *Config) { c.SegmentBytes = 256 << 10 },
			rule:  flipRule{kind: kindData, min: 1, nth: 16, payload: true, at: 100002, mask: flip}},
		{name: "payload checksum", n: 3, count: 1 << 18, from: 0, to: 1,
			tweak: func(c *Config) { c.SegmentBytes = 16 << 10 },
			rule:  flipRule{kind: kindData, min: 1, nth: 2, trailer: true, at: 1, mask: 0x40}},
		{name: "broadcast", n: 3, early: true, count: 1 << 16, from: 0, to: 1,
			tweak: func(c *Config) { c.SegmentBytes = 16 << 10 },
			op: func(i int, r *Ring, buf []byte) error {
				return r.Broadcast(collective.Desc{Op: collective.OpBroadcast, DType: collective.Bytes, Count: uint64(len(buf))}, buf)
			},
			wrong: func(n, i int, buf []byte) bool { return !bytes.Equal(buf, f32Bufs(1, len(buf)/4)[0]) },
			rule:  flipRule{kind: kindData, min: 1, nth: 3, payload: true, at: 2, mask: flip}},
		{name: "allgather", n: 3, early: true, count: 1 << 14, from: 0, to: 1,
			tweak: func(c *Config) { c.SegmentBytes = 16 << 10 },
			op: func(i int, r *Ring, buf []byte) error {
				out, err := r.AllGather(collective.Desc{Op: collective.OpAllGather, DType: collective.Bytes}, buf, nil)
				if err == nil {
					// Leave in buf whether a block differs from its rank's.
					want := f32Bufs(len(out), len(buf)/4)
					for j := range out {
						if !bytes.Equal(out[j], want[j]) {
							buf[0] ^= 0xff
						}
					}
				}
				return err
			},
			wrong: func(n, i int, buf []byte) bool { return !bytes.Equal(buf, f32Bufs(n, len(buf)/4)[i]) },
			rule:  flipRule{kind: kindData, min: 1, nth: 4, payload: true, at: 2, mask: flip}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rings, f := relayWorld(t, tc.n, max(tc.streams, 1), tc.rule, tc.tweak)
			startAll(t, rings)
			op := tc.op
			if op == nil {
				op = func(i int, r *Ring, buf []byte) error { return r.AllReduce(arOf(len(buf)/4), buf) }
			}
			for k := 0; k < tc.warm; k++ {
				bufs := f32Bufs(tc.n, tc.count)
				noErrors(t, "warm-up", onAll(t, rings, func(i int, r *Ring) error { return op(i, r, bufs[i]) }))
			}
			if tc.warm > 0 && tc.op != nil && rings[1].prev[0].lend.Load() != lendOut {
				t.Fatalf("rank 1's link from rank 0 is not lent after %d lent calls: the borrower would not read the frame", tc.warm)
			}
			bufs := f32Bufs(tc.n, tc.count)
			placed := rings[tc.to].inPlace
			f.armed.Store(true)
			errs := onAll(t, rings, func(i int, r *Ring) error { return op(i, r, bufs[i]) })
			wrong := tc.wrong
			if wrong == nil {
				wrong = func(n, i int, buf []byte) bool { return sumWrong(buf, n) }
			}
			expectCorrupt(t, rings, f, errs, tc.from, tc.to, tc.early, func(i int) bool { return wrong(tc.n, i, bufs[i]) }, "payload checksum")
			if tc.placed && rings[tc.to].inPlace == placed {
				t.Errorf("rank %d received nothing in place during the op: the in-place path was not exercised", tc.to)
			}
		})
	}
}

// TestCorruptHeader: a flipped header byte of a data frame is a
// corruption too, whichever field it hits, and so is one of a start or a
// heartbeat frame. Before the header checksum, a flipped aux (unused by an
// allreduce), start frame generation or heartbeat field passed silently,
// and the others were reported as a bad frame or a mismatch.
func TestCorruptHeader(t *testing.T) {
	big := func(c *Config) { c.SegmentBytes = 16 << 10 }
	for _, tc := range []struct {
		name string
		rule flipRule
	}{
		{"magic", flipRule{at: 0, mask: 0x20}},
		{"kind", flipRule{at: 5, mask: 0x02}},
		{"root", flipRule{at: 12, mask: 0x01}},
		{"seq", flipRule{at: 32, mask: 0x01}},
		{"step", flipRule{at: 48, mask: 0x01}},
		{"length", flipRule{at: 53, mask: 0x01}},
		{"aux", flipRule{at: 56, mask: 0x01}},
		{"header checksum", flipRule{at: 64, mask: 0x01}},
		{"last header byte", flipRule{at: headerLen - 1, mask: 0x80}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rule := tc.rule
			rule.kind, rule.min, rule.nth = kindData, 1, 3
			rings, f := relayWorld(t, 3, 1, rule, big)
			startAll(t, rings)
			bufs := f32Bufs(3, 1<<18)
			f.armed.Store(true)
			errs := onAll(t, rings, func(i int, r *Ring) error { return r.AllReduce(arOf(1<<18), bufs[i]) })
			expectCorrupt(t, rings, f, errs, 0, 1, false, func(i int) bool { return sumWrong(bufs[i], 3) }, "header checksum")
		})
	}
	t.Run("start generation", func(t *testing.T) {
		rings, f := relayWorld(t, 3, 1, flipRule{kind: kindStart, nth: 1, at: 43, mask: 0x01}, big)
		f.armed.Store(true)
		errs := onAll(t, rings, func(i int, r *Ring) error {
			g, err := r.Start()
			if err == nil {
				t.Logf("rank %d adopted generation %d", i, g)
			}
			return err
		})
		// Ranks 0 and 2 end Start on what rank 1 sent before it read the
		// flipped frame; none may have adopted the flipped generation.
		expectCorrupt(t, rings, f, errs, 0, 1, true, func(i int) bool { return rings[i].Generation() != 12 }, "header checksum")
	})
	t.Run("heartbeat", func(t *testing.T) {
		rings, f := relayWorld(t, 3, 1, flipRule{kind: kindHeartbeat, nth: 1, at: 40, mask: 0x01}, big)
		startAll(t, rings)
		f.armed.Store(true)
		select {
		case <-f.flipped:
		case <-time.After(30 * time.Second):
			t.Fatal("no heartbeat crossed the relay")
		}
		// The idle ring fails (the ranks are told by abort); an op after
		// it reports that failure.
		errs := onAll(t, rings, func(i int, r *Ring) error {
			select {
			case <-r.Done():
			case <-time.After(20 * time.Second):
			}
			return r.Barrier(collective.Desc{Op: collective.OpBarrier})
		})
		expectCorrupt(t, rings, f, errs, 0, 1, false, nil, "header checksum")
	})
}

// TestCorruptAbortReason: an abort frame whose reason does not match its
// checksum is a corruption this rank found, not the abort it claims to
// be: the ring fails with ErrCorrupt naming the link, and the garbled
// reason is not reported as the cause.
func TestCorruptAbortReason(t *testing.T) {
	rings, links := faultWorld(t, 2, map[int]bool{1: true}, nil)
	fake := newFakeRank(links[1], 1, 2)
	go fake.start(11)
	defer fake.closeAll()
	startAll(t, rings)
	reason := []byte("rank 1 gave up")
	h := header{Kind: kindAbort, Sender: 1, Generation: 11, Length: uint32(len(reason)), Aux: 1 | uint64(codeTimeout)<<32}
	b := make([]byte, headerLen+len(reason))
	h.encode(b)
	copy(b[headerLen:], reason)
	b = seal(b)
	b[headerLen+5] ^= 0x01 // "rank 0 gave up", on the way
	time.AfterFunc(50*time.Millisecond, func() { fake.writeNext(b) })
	err := rings[0].Barrier(collective.Desc{Op: collective.OpBarrier})
	if !errors.Is(err, ErrCorrupt) || errors.Is(err, ErrAborted) || errors.Is(err, ErrTimeout) ||
		!strings.Contains(err.Error(), "abort frame payload checksum mismatch") || !strings.Contains(err.Error(), "on the link from rank 1 to rank 0") ||
		strings.Contains(err.Error(), "gave up") {
		t.Fatalf("got %v, want ErrCorrupt naming the link and not the garbled abort", err)
	}
}
