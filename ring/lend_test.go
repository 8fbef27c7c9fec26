package ring

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/collectived/collectived/collective"
)

// lentWorld is a ring whose readers poll, so that their first link from
// the previous rank can be lent.
func lentWorld(t *testing.T, n, streams int, tweak func(*Config)) []*Ring {
	return newWorld(t, worldOpts{n: n, streams: streams, tweak: func(c *Config) {
		c.Spin = 200 * time.Microsecond
		c.StripeBytes = 64 << 10 // small ops keep to stream 0, as in the daemon
		if tweak != nil {
			tweak(c)
		}
	}})
}

// float32Bufs fills n buffers of count float32s with rank-dependent values
// and returns them with the expected sum.
func float32Bufs(n, count, salt int) ([][]byte, []float32) {
	bufs := make([][]byte, n)
	want := make([]float32, count)
	for i := range bufs {
		bufs[i] = make([]byte, 4*count)
		for k := 0; k < count; k++ {
			v := float32((i+1)*(k%7+salt%3)) / 4
			binary.LittleEndian.PutUint32(bufs[i][4*k:], math.Float32bits(v))
			want[k] += v
		}
	}
	return bufs, want
}

func checkFloat32(t *testing.T, what string, bufs [][]byte, want []float32) {
	t.Helper()
	for k, w := range want {
		if got := math.Float32frombits(binary.LittleEndian.Uint32(bufs[0][4*k:])); got != w {
			t.Fatalf("%s: element %d = %v, want %v", what, k, got, w)
		}
	}
	for i := 1; i < len(bufs); i++ {
		if !bytes.Equal(bufs[i], bufs[0]) {
			t.Fatalf("%s: rank %d differs from rank 0", what, i)
		}
	}
}

// Small allreduces run with the link lent to the calling goroutine give
// the reference's bits on every rank, mixed with large ones and other ops
// (which take the link back), across a GiveBack and an idle spell longer
// than the heartbeat timeout (the link given back, the reader sees the
// heartbeats), and allocate nothing once warm.
func TestAllReduceLent(t *testing.T) {
	for _, tc := range []struct{ n, streams int }{{2, 1}, {3, 2}, {4, 1}} {
		t.Run(fmt.Sprintf("world%d_streams%d", tc.n, tc.streams), func(t *testing.T) {
			n := tc.n
			wide := runtime.GOMAXPROCS(0)
			rings := lentWorld(t, n, tc.streams, func(c *Config) {
				c.HeartbeatInterval = 50 * time.Millisecond
				c.HeartbeatTimeout = 400 * time.Millisecond
			})
			lent := func(count, salt int) {
				d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: uint64(count)}
				bufs, want := float32Bufs(n, count, salt)
				noErrors(t, "lent allreduce", onAll(t, rings, func(i int, r *Ring) error {
					return r.AllReduceLent(d, [][]byte{bufs[i]}, nil)
				}))
				checkFloat32(t, fmt.Sprintf("lent count %d", count), bufs, want)
			}
			for k := 0; k < 200; k++ {
				lent(1+k%9, k)
			}
			lentOut := 0
			for _, r := range rings {
				for _, s := range r.lenders {
					if s.lend.Load() == lendOut {
						lentOut++
					}
				}
			}
			if lentOut == 0 {
				t.Errorf("no rank borrowed its link in 200 small calls")
			}
			// While a link is lent, the process runs on one P (lend.go,
			// narrow); the large op below gives it back its Ps.
			if wide > 1 && runtime.GOMAXPROCS(0) != 1 {
				t.Errorf("GOMAXPROCS %d with links lent, want 1", runtime.GOMAXPROCS(0))
			}
			// A large allreduce (lent or not) and a barrier take the link back.
			big := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 100_003}
			bufs, want := float32Bufs(n, 100_003, 1)
			noErrors(t, "large allreduce", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduceLent(big, [][]byte{bufs[i]}, nil) }))
			checkFloat32(t, "large", bufs, want)
			if got := runtime.GOMAXPROCS(0); got != wide {
				t.Errorf("GOMAXPROCS %d after a large op, want %d as before the lent calls", got, wide)
			}
			lent(5, 2)
			noErrors(t, "barrier", onAll(t, rings, func(i int, r *Ring) error { return r.Barrier(collective.Desc{Op: collective.OpBarrier}) }))
			lent(3, 3)
			for _, r := range rings {
				r.GiveBack()
			}
			if got := runtime.GOMAXPROCS(0); got != wide {
				t.Errorf("GOMAXPROCS %d after GiveBack, want %d", got, wide)
			}
			time.Sleep(700 * time.Millisecond) // > HeartbeatTimeout: silence would be a hung peer
			for i, r := range rings {
				if err := r.Err(); err != nil {
					t.Fatalf("rank %d failed while idle with its link given back: %v", i, err)
				}
			}
			lent(7, 4)

			// Warm: no allocation per call on the lent path.
			d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Int64, Reduce: collective.Max, Count: 16}
			ab := make([][]byte, n)
			for i := range ab {
				ab[i] = make([]byte, d.Bytes())
			}
			allocs := allocsPerOp(t, rings, 100, func(i int, r *Ring) error { return r.AllReduceLent(d, ab[i:i+1], nil) })
			if allocs > 1 {
				t.Errorf("%.1f allocations per lent allreduce", allocs)
			}
		})
	}
}

// A rank whose links drop (its process killed) while its neighbours run
// lent calls: every other rank fails with ErrPeerClosed naming it as the
// culprit, within a bound.
func TestAllReduceLentPeerCloses(t *testing.T) {
	const n = 3
	rings := lentWorld(t, n, 1, nil)
	d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 4}
	bufs, _ := float32Bufs(n, 4, 0)
	for k := 0; k < 20; k++ {
		noErrors(t, "warm-up", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduceLent(d, [][]byte{bufs[i]}, nil) }))
	}
	time.AfterFunc(50*time.Millisecond, func() {
		for _, s := range rings[2].all {
			s.conn.Close()
		}
	})
	t0 := time.Now()
	errs := onAll(t, rings[:2], func(i int, r *Ring) error {
		for {
			if err := r.AllReduceLent(d, [][]byte{bufs[i]}, nil); err != nil {
				return err
			}
		}
	})
	if el := time.Since(t0); el > 10*time.Second {
		t.Fatalf("failure took %v to reach the lent ranks", el)
	}
	// A rank that found the dropped link itself names rank 2 the culprit;
	// one that heard first from rank 2 (its sockets did not all drop at
	// once) names it as the origin.
	for i, err := range errs {
		var e *Error
		if !errors.As(err, &e) || (e.Culprit != 2 && e.Origin != 2) || !errors.Is(err, ErrPeerClosed) {
			t.Errorf("rank %d: %v, want ErrPeerClosed naming rank 2", i, err)
		}
	}
}

// A lent call whose peer never calls times out after OpTimeout even while
// the peer's heartbeats keep arriving on the lent link.
func TestAllReduceLentTimesOut(t *testing.T) {
	rings := lentWorld(t, 2, 1, func(c *Config) {
		c.OpTimeout = time.Second
		c.HeartbeatInterval = 50 * time.Millisecond
		c.HeartbeatTimeout = 2 * time.Second
	})
	d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 2}
	bufs, _ := float32Bufs(2, 2, 0)
	for k := 0; k < 10; k++ {
		noErrors(t, "warm-up", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduceLent(d, [][]byte{bufs[i]}, nil) }))
	}
	t0 := time.Now()
	err := rings[0].AllReduceLent(d, [][]byte{bufs[0]}, nil)
	el := time.Since(t0)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("lent call with a silent peer: %v, want ErrTimeout", err)
	}
	if el < 900*time.Millisecond || el > 5*time.Second {
		t.Fatalf("timed out after %v, OpTimeout 1s", el)
	}
}

// A lent call whose peer sends nothing at all, not even heartbeats, still
// times out after OpTimeout and still asks its stop check: the borrower's
// read of the quiet link ends every lentPark for it to look.
func TestAllReduceLentQuietPeer(t *testing.T) {
	d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 2}
	gone := errors.New("the caller's client has gone")
	for _, c := range []struct {
		name string
		stop bool
	}{{"timeout", false}, {"stop", true}} {
		t.Run(c.name, func(t *testing.T) {
			rings := lentWorld(t, 2, 1, func(cfg *Config) {
				cfg.OpTimeout = time.Second
				if c.stop {
					cfg.OpTimeout = time.Minute
				}
				cfg.HeartbeatInterval = time.Hour
				cfg.HeartbeatTimeout = 2 * time.Hour
			})
			bufs, _ := float32Bufs(2, 2, 0)
			for k := 0; k < 10; k++ {
				noErrors(t, "warm-up", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduceLent(d, [][]byte{bufs[i]}, nil) }))
			}
			t0 := time.Now()
			var stop func() error
			if c.stop {
				stop = func() error {
					if time.Since(t0) > 100*time.Millisecond {
						return gone
					}
					return nil
				}
			}
			errc := make(chan error, 1)
			go func() { errc <- rings[0].AllReduceLent(d, [][]byte{bufs[0]}, stop) }()
			var err error
			select {
			case err = <-errc:
			case <-time.After(10 * time.Second):
				t.Fatal("the lent call on a quiet link has not returned after 10s")
			}
			t.Logf("after %v: %v", time.Since(t0), err)
			if c.stop && (!errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), gone.Error())) {
				t.Fatalf("got %v, want the stop check's answer", err)
			}
			if !c.stop && !errors.Is(err, ErrTimeout) {
				t.Fatalf("got %v, want ErrTimeout", err)
			}
		})
	}
}

// A lent call's stop check aborts the ring with its answer: the caller
// gets it, and so does every other rank.
func TestAllReduceLentStop(t *testing.T) {
	rings := lentWorld(t, 2, 1, nil)
	d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 2}
	bufs, _ := float32Bufs(2, 2, 0)
	for k := 0; k < 5; k++ {
		noErrors(t, "warm-up", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduceLent(d, [][]byte{bufs[i]}, nil) }))
	}
	t0 := time.Now()
	gone := errors.New("the caller's client has gone")
	err := rings[0].AllReduceLent(d, [][]byte{bufs[0]}, func() error {
		if time.Since(t0) > 100*time.Millisecond {
			return gone
		}
		return nil
	})
	if !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), gone.Error()) {
		t.Fatalf("stopped call: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for rings[1].Err() == nil {
		if time.Now().After(deadline) {
			t.Fatal("the abort never reached rank 1")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(rings[1].Err().Error(), gone.Error()) {
		t.Fatalf("rank 1: %v", rings[1].Err())
	}
}

// Small is the ring's own size rule, which the daemon's hot lane asks:
// allreduces under SmallBytes, or of fewer elements than ranks, and
// nothing else.
func TestSmallIsTheRingsRule(t *testing.T) {
	ar := func(count uint64, dt collective.DType) collective.Desc {
		return collective.Desc{Op: collective.OpAllReduce, DType: dt, Reduce: collective.Sum, Count: count}
	}
	type tcase struct {
		d    collective.Desc
		want bool
	}
	for _, w := range []struct {
		smallBytes int
		cases      []tcase
	}{
		{64, []tcase{
			{ar(1, collective.Float32), true},
			{ar(16, collective.Float32), true},  // 64 bytes: SmallBytes itself is small
			{ar(17, collective.Float32), false}, // 68 bytes
			{ar(1<<20, collective.Float64), false},
			{collective.Desc{Op: collective.OpBroadcast, DType: collective.Float32, Count: 1}, false},
			{collective.Desc{Op: collective.OpBarrier}, false},
		}},
		{0, []tcase{ // only the element count decides: 3 ranks
			{ar(2, collective.Float64), true},
			{ar(3, collective.Float64), false},
			{ar(2, collective.Bytes), true},
		}},
	} {
		rings := newWorld(t, worldOpts{n: 3, pipe: true, tweak: func(c *Config) { c.SmallBytes = w.smallBytes }})
		for _, tc := range w.cases {
			if got := rings[0].Small(tc.d); got != tc.want {
				t.Errorf("small_bytes %d: Small(%s) = %v, want %v", w.smallBytes, tc.d, got, tc.want)
			}
		}
	}
}

// BenchmarkAllReduceLentAlternating: lent calls alternating between a
// short allreduce (4 B, on a ring of two's duplex stream) and a small one
// too long for it (16 KiB, on the one-way stream), as a trainer's
// gradients of two sizes would; one op is one call of each. Both ranks
// share this process and its GOMAXPROCS, which a borrower narrows to one,
// so the times are not a daemon's (docs/TUNING.md, section 25, measures
// those); what it guards is the hand-over: rank 0 handing each link back
// and asking for it again took 20 ms an op here, keeping both 0.5 ms.
func BenchmarkAllReduceLentAlternating(b *testing.B) {
	rings := newWorld(b, worldOpts{n: 2, streams: 2, tweak: func(c *Config) {
		c.Spin = 200 * time.Microsecond
		c.StripeBytes = 64 << 10
	}})
	descs := []collective.Desc{
		{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 1},
		{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 4 << 10},
	}
	bufs := make([][]byte, 2)
	for i := range bufs {
		bufs[i] = make([]byte, 16<<10)
	}
	k := 0
	drv := newDriver(rings, func(i int, r *Ring) error {
		d := descs[k%2]
		return r.AllReduceLent(d, [][]byte{bufs[i][:d.Bytes()]}, nil)
	})
	defer drv.stop()
	op0 := func() error {
		d := descs[k%2]
		return rings[0].AllReduceLent(d, [][]byte{bufs[0][:d.Bytes()]}, nil)
	}
	for ; k < 20; k++ {
		if err := drv.run(op0); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		for range 2 {
			if err := drv.run(op0); err != nil {
				b.Fatal(err)
			}
			k++
		}
	}
}

// Lent calls narrow the process to one P; when the heartbeat loop then
// takes every idle lent link back (the peers' heartbeats wait on them),
// GiveBack still gives every P back, and a large op runs on all of them.
func TestLentReclaimThenGiveBackWidens(t *testing.T) {
	wide := runtime.GOMAXPROCS(0)
	if wide < 2 {
		t.Skip("needs GOMAXPROCS > 1")
	}
	rings := lentWorld(t, 3, 1, func(c *Config) {
		c.HeartbeatInterval = 20 * time.Millisecond
		c.HeartbeatTimeout = 400 * time.Millisecond
	})
	d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 3}
	for k := 0; k < 50; k++ {
		bufs, _ := float32Bufs(3, 3, k)
		noErrors(t, "lent", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduceLent(d, [][]byte{bufs[i]}, nil) }))
	}
	if runtime.GOMAXPROCS(0) != 1 {
		t.Fatalf("not narrowed after lent calls: %d", runtime.GOMAXPROCS(0))
	}
	// Idle: the peers' heartbeats land on the lent links, and the heartbeat
	// loop takes them back.
	waitFor(t, "every lent link reclaimed", func() bool {
		for _, r := range rings {
			for _, s := range r.lenders {
				if s.lend.Load() != lendNone {
					return false
				}
			}
		}
		return true
	})
	t.Logf("all links reclaimed; GOMAXPROCS now %d", runtime.GOMAXPROCS(0))
	for _, r := range rings {
		r.GiveBack()
	}
	if got := runtime.GOMAXPROCS(0); got != wide {
		t.Errorf("GOMAXPROCS %d after reclaim + GiveBack, want %d", got, wide)
	}
	big := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 100_003}
	bufs, want := float32Bufs(3, 100_003, 1)
	procs := 0
	noErrors(t, "large", onAll(t, rings, func(i int, r *Ring) error {
		err := r.AllReduce(big, bufs[i])
		if i == 0 {
			procs = runtime.GOMAXPROCS(0)
		}
		return err
	}))
	checkFloat32(t, "large", bufs, want)
	if procs != wide {
		t.Errorf("large (not lent) allreduce ran with GOMAXPROCS %d, want %d", procs, wide)
	}
}

// GiveBack (or an op that is not lent) and the heartbeat loop's
// reclaimIdle racing for one lent link wake its reader once: a second
// resume token would wake it again at its next lend, beside the
// borrower, two readers on one socket.
func TestGiveBackRacesReclaim(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := c.Write([]byte{1}); err != nil { // something waits: pending() is true
		t.Fatal(err)
	}
	r := &Ring{}
	s := &stream{r: r, resume: make(chan struct{}, 1), sr: &spinReader{rc: rawConn(a)}}
	r.lenders = []*stream{s}
	waitFor(t, "pending", s.pending)
	stale := 0
	const N = 100000
	for i := 0; i < N; i++ {
		s.lend.Store(lendOut) // the reader has lent and parked
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Add(2)
		go func() { defer wg.Done(); <-start; r.reclaimIdle(nil) }()
		go func() { defer wg.Done(); <-start; r.giveBackStream(s) }()
		close(start)
		<-s.resume // the parked reader wakes and reads on
		wg.Wait()
		if len(s.resume) != 0 {
			stale++
			<-s.resume
		}
	}
	if stale > 0 {
		t.Errorf("%d of %d races left a second resume token after the reader had woken", stale, N)
	}
}
