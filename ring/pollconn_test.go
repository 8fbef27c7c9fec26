package ring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/internal/fdtest"
	"github.com/collectived/collectived/internal/parked"
	"github.com/collectived/collectived/internal/syncbuf"
)

// tcpPair is a connected pair of real TCP sockets on loopback.
func tcpPair(t *testing.T) (a *net.TCPConn, b net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	b, err = net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn), b
}

type readResult struct {
	b   [8]byte
	err error
}

// parkedLinkReader starts a goroutine reading 8-byte messages from a
// link's spinReader (which polls 20 µs, then parks) until it fails.
func parkedLinkReader(t *testing.T) (*spinReader, *pollConn, net.Conn, chan readResult) {
	t.Helper()
	a, b := tcpPair(t)
	pc, err := newPollConn(a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	sr, ok := newSpinReader(pc, 20*time.Microsecond).(*spinReader)
	if !ok || sr.pc != pc {
		t.Fatal("newSpinReader on a pollConn did not read through its duplicate fd")
	}
	got := make(chan readResult, 1)
	go func() {
		buf := make([]byte, 8)
		for {
			var r readResult
			_, r.err = io.ReadFull(sr, buf)
			copy(r.b[:], buf)
			got <- r
			if r.err != nil {
				return
			}
		}
	}()
	return sr, pc, b, got
}

// A wake with nothing to read (a poller's kick) ends the parked read,
// which polls again and parks again: it neither fails nor returns
// early, and the message that comes later is read whole.
func TestKickedLinkReaderParksAgain(t *testing.T) {
	sr, _, b, got := parkedLinkReader(t)
	waitFor(t, "the reader parked", sr.park.Asleep)
	for i := 0; i < 3; i++ {
		sr.kick()
		waitFor(t, "the reader took the kick and parked again", func() bool {
			return !sr.kicked.Load() && sr.park.Asleep()
		})
	}
	select {
	case r := <-got:
		t.Fatalf("read returned (%v, %v) with nothing sent", r.b, r.err)
	default:
	}
	want := [8]byte{1, 2, 3, 4, 5, 6, 7, 8}
	if _, err := b.Write(want[:]); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.err != nil || r.b != want {
			t.Fatalf("read (%v, %v), want (%v, nil)", r.b, r.err, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("message not read within 10s")
	}
}

// The case the parked set is for: a reader parked in the netpoller while
// this process's one P is held by a poller that yields it with Gosched,
// so the scheduler does not look at the netpoller (docs/TUNING.md,
// section 26). The poller's parked.Poll wakes the reader once its data
// has come, and the cycle allocates nothing: the kick is a deadline on
// the duplicate fd, whose RawConn does not wrap it in a new error.
func TestPollerWakesParkedLinkReader(t *testing.T) {
	sr, _, b, got := parkedLinkReader(t)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	msg := [8]byte{9, 9, 9, 9, 9, 9, 9, 9}
	var failed error
	cycle := func() {
		for end := time.Now().Add(10 * time.Second); !sr.park.Asleep(); runtime.Gosched() {
			if time.Now().After(end) {
				failed = errors.New("the reader did not park on the set within 10s")
				return
			}
		}
		if _, err := b.Write(msg[:]); err != nil {
			failed = err
			return
		}
		for end := time.Now().Add(10 * time.Second); ; {
			parked.Poll(time.Now().UnixNano())
			select {
			case r := <-got:
				if r.err != nil || r.b != msg {
					failed = errors.Join(failed, r.err, errors.New("message read wrong"))
				}
				return
			default:
			}
			if time.Now().After(end) {
				failed = errors.New("message not read within 10s")
				return
			}
			runtime.Gosched()
		}
	}
	cycle() // the first read sets up what later ones reuse
	if failed != nil {
		t.Fatal(failed)
	}
	woken := parked.Woken()
	allocs := testing.AllocsPerRun(100, cycle)
	if failed != nil {
		t.Fatal(failed)
	}
	if parked.Woken() == woken {
		t.Fatal("no message was read after a poller woke the reader: the netpoller woke it every time, so the test did not exercise the kick")
	}
	if allocs != 0 {
		t.Fatalf("%v allocations per message woken by a poller, want 0", allocs)
	}
}

// Closing a pollConn wakes a read parked on its duplicate fd, which
// reports the link closed here (net.ErrClosed), not a peer's doing.
func TestPollConnCloseWakesReader(t *testing.T) {
	sr, pc, _, got := parkedLinkReader(t)
	waitFor(t, "the reader parked", sr.park.Asleep)
	if err := pc.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if !errors.Is(r.err, net.ErrClosed) {
			t.Fatalf("read after Close: %v, want net.ErrClosed", r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("read parked on the duplicate fd not woken by Close within 10s")
	}
	if sr.park.Asleep() {
		t.Fatal("reader still on the parked set after its read ended")
	}
	if err := pc.Close(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second Close: %v, want net.ErrClosed", err)
	}
}

// A borrower asking for a link whose reader is asleep in the netpoller
// wakes it (parked.Reader.WakeNow), and the reader lends the link at
// once: it does not wait for the peer's next frame, which here does not
// come until rank 1 calls (no heartbeats within the test).
func TestBorrowerWakesParkedReader(t *testing.T) {
	rings := lentWorld(t, 2, 1, func(c *Config) {
		c.HeartbeatInterval = 30 * time.Second
		c.HeartbeatTimeout = 60 * time.Second
	})
	s := rings[0].pair[0] // rank 0 receives a ring of two's short ops here
	if s.sr == nil || s.sr.pc == nil {
		t.Fatal("the duplex stream is not read through a pollConn")
	}
	waitFor(t, "the duplex stream's reader parked", s.sr.park.Asleep)
	d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 1}
	bufs, want := float32Bufs(2, 1, 5)
	errs := make(chan error, 2)
	go func() { errs <- rings[0].AllReduceLent(d, [][]byte{bufs[0]}, nil) }()
	end := time.Now().Add(2 * time.Second)
	for s.lend.Load() != lendOut && s.lend.Load() != lendReading {
		if time.Now().After(end) {
			t.Fatalf("rank 0's reader had not lent its link 2 s after the borrower asked (state %d): it sleeps until the peer's frame", s.lend.Load())
		}
		time.Sleep(time.Millisecond)
	}
	go func() { errs <- rings[1].AllReduceLent(d, [][]byte{bufs[1]}, nil) }()
	for i := 0; i < 2; i++ {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the allreduce did not end within 10s")
		}
	}
	checkFloat32(t, "after the wake", bufs, want)
}

// A rank that cannot open its links' duplicate fds (the process is out of
// fds) warns for each link it receives on, naming the peer and the cause, and reads the sockets
// themselves: its ring forms and its allreduces, short (duplex stream)
// and long (data stream), come out right.
func TestLinkReadWithoutDuplicateFD(t *testing.T) {
	links := tcpLinks(t, 2, 1)
	var logs syncbuf.Buffer
	rings := make([]*Ring, 2)
	for i := range rings {
		cfg := testConfig(i, 2)
		cfg.Spin = 200 * time.Microsecond
		var release func()
		if i == 0 {
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			var err error
			if release, err = fdtest.Exhaust(); err != nil {
				t.Fatal(err)
			}
		}
		r, err := New(cfg, links[i])
		if release != nil {
			release()
		}
		if err != nil {
			t.Fatalf("rank %d: %v", i, err)
		}
		rings[i] = r
		t.Cleanup(func() { r.Close() })
	}
	// Rank 0 receives on two: its stream from rank 1 and the duplex stream.
	for _, s := range []*stream{rings[0].prev[0], rings[0].next[0]} {
		if _, ok := s.conn.(*pollConn); ok {
			t.Fatal("rank 0 read a link through a duplicate fd opened while the process had none free")
		}
	}
	log := logs.String()
	if strings.Count(log, "ring link read without a duplicate fd") != 2 || !strings.Contains(log, "peer_rank=1") ||
		!strings.Contains(log, "too many open files") {
		t.Fatalf("rank 0's log does not name the link it reads without a duplicate fd, its peer and the cause:\n%s", log)
	}
	startAll(t, rings)
	for _, n := range []int{1, 256 << 10} {
		bufs := make([][]byte, 2)
		errs := onAll(t, rings, func(i int, r *Ring) error {
			bufs[i] = make([]byte, 4*n)
			for k := 0; k < n; k++ {
				binary.LittleEndian.PutUint32(bufs[i][4*k:], math.Float32bits(float32(i+1)))
			}
			d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: uint64(n)}
			return r.AllReduce(d, bufs[i])
		})
		noErrors(t, fmt.Sprintf("allreduce of %d floats", n), errs)
		for i := range bufs {
			for k := 0; k < n; k++ {
				if v := math.Float32frombits(binary.LittleEndian.Uint32(bufs[i][4*k:])); v != 3 {
					t.Fatalf("allreduce of %d floats: rank %d element %d is %v, want 3", n, i, k, v)
				}
			}
		}
	}
}
