package ring

import (
	"errors"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/collectived/collectived/internal/parked"
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
