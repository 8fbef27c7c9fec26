package collectived_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	collectived "github.com/collectived/collectived/clients/go"
	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/daemon"
	"github.com/collectived/collectived/ipc"
)

// goroutinesBackTo waits (a while) for the number of goroutines to fall
// back to n: the client's helper ends once no call with callbacks is left.
func goroutinesBackTo(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before the calls:\n%s", runtime.NumGoroutine(), n, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// onceEach counts the calls of each of n callbacks.
type onceEach struct {
	ran  []atomic.Int32
	errs []error
	wg   sync.WaitGroup
}

func newOnceEach(n int) *onceEach {
	o := &onceEach{ran: make([]atomic.Int32, n), errs: make([]error, n)}
	o.wg.Add(n)
	return o
}

func (o *onceEach) fn(i int) func(error) {
	return func(err error) {
		if o.ran[i].Add(1) == 1 {
			o.errs[i] = err
			o.wg.Done()
		}
	}
}

// wait waits for every callback, then a moment more for any second call
// of one, and checks that each ran once.
func (o *onceEach) wait(t *testing.T) {
	t.Helper()
	all := make(chan struct{})
	go func() { o.wg.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(30 * time.Second):
		for i := range o.ran {
			if o.ran[i].Load() == 0 {
				t.Errorf("callback %d never ran", i)
			}
		}
		t.FailNow()
	}
	time.Sleep(20 * time.Millisecond)
	for i := range o.ran {
		if n := o.ran[i].Load(); n != 1 {
			t.Errorf("callback %d ran %d times", i, n)
		}
	}
}

// Many calls in flight at once, each with a callback or a future and no
// goroutine waiting for any: every callback runs once, after the call's
// result is back in the caller's buffer, with the call's own outcome (a
// refused broadcast its BAD_REQUEST), in whatever order the replies
// come; the client's helper goroutine is gone afterwards, and Wait on a
// handle whose callback ran returns the same outcome.
func TestThenEveryCallOnce(t *testing.T) {
	c := dial(t)
	seg, err := c.Alloc(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	// The client's eight scratch segments for small copied calls, made
	// now: made during the test, each would wait for its ALLOC_OK and
	// read the replies to the calls before it meanwhile.
	var warm []*collectived.Handle
	for i := 0; i < 8; i++ {
		h, err := c.Start(collective.Desc{Op: collective.OpAllReduce, DType: collective.Int32, Reduce: collective.Sum, Count: 4 << 10}, ints(16<<10, i))
		if err != nil {
			t.Fatal(err)
		}
		warm = append(warm, h)
	}
	for _, h := range warm {
		if err := h.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	base := runtime.NumGoroutine()
	const n = 32 // eight of each kind
	type call struct {
		h         *collectived.Handle
		buf, want []byte
		bad       bool
	}
	calls := make([]call, n)
	for i := range calls {
		var buf []byte
		switch i % 4 {
		case 0: // inline
			buf = ints(64, i)
		case 1: // copied through a scratch segment
			buf = ints(16<<10, i)
		case 2: // in a segment of the caller's
			buf = seg.Bytes()[i*1024 : i*1024+1024]
			copy(buf, ints(len(buf), i))
		case 3: // refused by the daemon: no rank 5 in a world of one
			buf = ints(8, i)
			calls[i].bad = true
		}
		d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Int32, Reduce: collective.Sum, Count: uint64(len(buf) / 4)}
		if calls[i].bad {
			d = collective.Desc{Op: collective.OpBroadcast, DType: collective.Int32, Count: 2, Root: 5}
		}
		calls[i].want = bytes.Clone(buf)
		h, err := c.Start(d, buf)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		calls[i].h, calls[i].buf = h, buf
		if i%4 < 2 {
			// Plain memory: only the result copied back restores it.
			// (No callback is registered yet, so nothing reads.)
			for k := range buf {
				buf[k] = 0xEE
			}
		}
	}
	o := newOnceEach(n)
	futures := make([]<-chan error, n)
	for i := range calls {
		if i/4%2 == 0 { // every kind of call both ways
			h, f := calls[i].h, o.fn(i)
			want := calls[i].want
			buf := calls[i].buf
			h.Then(func(err error) {
				if err == nil && !bytes.Equal(buf, want) {
					err = fmt.Errorf("the callback ran before the result was in the buffer")
				}
				f(err)
			})
		} else {
			futures[i] = calls[i].h.Future()
		}
	}
	for i, fut := range futures {
		if fut == nil {
			continue
		}
		select {
		case err := <-fut:
			o.fn(i)(err)
		case <-time.After(30 * time.Second):
			t.Fatalf("future %d never completed", i)
		}
		select {
		case err := <-fut:
			t.Errorf("future %d received twice (%v)", i, err)
		default:
		}
	}
	o.wait(t)
	for i, cl := range calls {
		err := o.errs[i]
		switch {
		case cl.bad && !errors.Is(err, collectived.ErrBadRequest):
			t.Errorf("call %d: %v, want BAD_REQUEST", i, err)
		case !cl.bad && err != nil:
			t.Errorf("call %d: %v", i, err)
		case !cl.bad && !bytes.Equal(cl.buf, cl.want):
			t.Errorf("call %d: result not in the buffer", i)
		}
		if werr := cl.h.Wait(); werr != err {
			t.Errorf("call %d: Wait after the callback: %v, the callback got %v", i, werr, err)
		}
	}
	// Done: f runs at once, on this goroutine.
	ran := false
	calls[0].h.Then(func(err error) { ran = err == nil })
	if !ran {
		t.Error("Then on a completed call did not run at once")
	}
	goroutinesBackTo(t, base)
	// A call answered before its callback was registered: Then runs it
	// at once (Done read the reply; nothing else did).
	h, err := collectived.AllReduceAsync(c, []int32{7}, collectived.Sum)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !h.Done(); time.Sleep(100 * time.Microsecond) {
		if time.Now().After(deadline) {
			t.Fatal("Done never saw the reply")
		}
	}
	ran = false
	h.Then(func(err error) { ran = err == nil })
	if !ran {
		t.Error("Then on an answered call did not run at once")
	}
}

// A callback may make calls of its own: a synchronous one, which waits
// for its reply, and an asynchronous one with its own callback, a chain
// of them, whether the helper or a waiting caller read the reply.
func TestThenCallbackMakesCalls(t *testing.T) {
	c := dial(t)
	base := runtime.NumGoroutine()
	for _, waiter := range []bool{false, true} {
		const depth = 20
		var ran atomic.Int32
		end := make(chan error, 1)
		var step func(k int) func(error)
		step = func(k int) func(error) {
			return func(err error) {
				ran.Add(1)
				if err != nil {
					end <- fmt.Errorf("step %d: %w", k, err)
					return
				}
				x := []float32{float32(k)}
				if err := collectived.AllReduce(c, x, collectived.Sum); err != nil || x[0] != float32(k) {
					end <- fmt.Errorf("step %d: a synchronous call in a callback: %v %v", k, err, x)
					return
				}
				if k == depth {
					end <- nil
					return
				}
				h, err := collectived.AllReduceAsync(c, []float32{1}, collectived.Sum)
				if err != nil {
					end <- err
					return
				}
				h.Then(step(k + 1))
			}
		}
		h, err := collectived.AllReduceAsync(c, []float32{1}, collectived.Sum)
		if err != nil {
			t.Fatal(err)
		}
		h.Then(step(0))
		if waiter {
			// Meanwhile this goroutine makes calls of its own: it reads
			// the replies for the callbacks too, when it holds the token.
			for k := 0; k < 50; k++ {
				if err := c.Barrier(); err != nil {
					t.Fatal(err)
				}
			}
		}
		select {
		case err := <-end:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("the chain stopped after %d callbacks (waiter %v)", ran.Load(), waiter)
		}
		if n := ran.Load(); n != depth+1 {
			t.Fatalf("%d callbacks ran, want %d", n, depth+1)
		}
	}
	goroutinesBackTo(t, base)
}

// Goroutines making synchronous calls and others starting calls with
// callbacks share a client: every callback runs once with its own result.
func TestThenWithConcurrentWaiters(t *testing.T) {
	c := dial(t)
	const goroutines, calls = 4, 100
	o := newOnceEach(goroutines * calls)
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < calls; k++ {
				i := g*calls + k
				if g%2 == 0 {
					if err := c.Barrier(); err != nil {
						t.Error(err)
						return
					}
				}
				x := []int32{int32(i), -int32(i)}
				h, err := collectived.AllReduceAsync(c, x, collectived.Sum)
				if err != nil {
					t.Error(err)
					return
				}
				f := o.fn(i)
				h.Then(func(err error) {
					if err == nil && (x[0] != int32(i) || x[1] != -int32(i)) {
						err = fmt.Errorf("call %d: got %v", i, x)
					}
					f(err)
				})
			}
		}()
	}
	wg.Wait()
	o.wait(t)
	for i, err := range o.errs {
		if err != nil {
			t.Errorf("call %d: %v", i, err)
		}
	}
}

// twoTrainers starts a daemon of its own serving a world of one node with
// two local trainers, and returns its socket and a function that stops it.
func twoTrainers(t *testing.T) (string, func()) {
	t.Helper()
	dir := t.TempDir()
	cfg := daemon.DefaultConfig()
	cfg.Job = "then"
	cfg.Token = []byte("0123456789abcdef0123")
	cfg.Peers = []string{"127.0.0.1:1"}
	cfg.LocalSize = 2
	cfg.SocketPath = filepath.Join(dir, "d.sock")
	d, err := daemon.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d.Start()
	var once sync.Once
	stop := func() { once.Do(func() { d.Close() }) }
	t.Cleanup(stop)
	return cfg.SocketPath, stop
}

func dialTwo(t *testing.T, sock string, rank int, timeout time.Duration) *collectived.Client {
	t.Helper()
	c, err := collectived.Dial(collectived.Options{Socket: sock, Job: "then", LocalRank: rank, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A mismatch fails the one collective whose calls disagree: of calls in
// flight with callbacks, that one's callback gets MISMATCH and the
// others their results.
func TestThenMismatch(t *testing.T) {
	sock, _ := twoTrainers(t)
	a, b := dialTwo(t, sock, 0, 0), dialTwo(t, sock, 1, 0)
	const n, bad = 8, 3
	o := newOnceEach(n)
	xs := make([][]float32, n)
	for i := range xs {
		xs[i] = []float32{float32(i), 1}
		h, err := collectived.AllReduceAsync(a, xs[i], collectived.Sum)
		if err != nil {
			t.Fatal(err)
		}
		h.Then(o.fn(i))
	}
	for i := 0; i < n; i++ {
		y := []float32{float32(i), 1}
		if i == bad {
			y = append(y, 0) // three elements against two
		}
		err := collectived.AllReduce(b, y, collectived.Sum)
		if (i == bad) != errors.Is(err, collectived.ErrMismatch) {
			t.Fatalf("the other trainer's call %d: %v", i, err)
		}
	}
	o.wait(t)
	for i, err := range o.errs {
		if i == bad {
			if !errors.Is(err, collectived.ErrMismatch) {
				t.Errorf("call %d: %v, want MISMATCH", i, err)
			}
			continue
		}
		if err != nil || xs[i][0] != float32(2*i) || xs[i][1] != 2 {
			t.Errorf("call %d: %v %v", i, err, xs[i])
		}
	}
}

// The end of the connection reaches every callback of a call in flight,
// with the reason: the client's Close, the daemon's shutdown, and the
// client's own timeout when nothing answers.
func TestThenConnectionEnds(t *testing.T) {
	base := runtime.NumGoroutine()
	for _, how := range []string{"close", "shutdown", "timeout"} {
		t.Run(how, func(t *testing.T) {
			sock, stop := twoTrainers(t)
			timeout := time.Duration(0)
			if how == "timeout" {
				timeout = 300 * time.Millisecond
			}
			a := dialTwo(t, sock, 0, timeout)
			// The other trainer attaches but never calls: a's calls
			// stay in flight.
			dialTwo(t, sock, 1, 0)
			const n = 16
			o := newOnceEach(n)
			for i := 0; i < n; i++ {
				h, err := collectived.AllReduceAsync(a, []float32{1}, collectived.Sum)
				if err != nil {
					t.Fatal(err)
				}
				h.Then(o.fn(i))
			}
			time.Sleep(50 * time.Millisecond)
			for i := range o.ran {
				if o.ran[i].Load() != 0 {
					t.Fatalf("callback %d ran before the end", i)
				}
			}
			switch how {
			case "close":
				a.Close()
			case "shutdown":
				stop()
			}
			o.wait(t)
			for i, err := range o.errs {
				var ok bool
				switch how {
				case "close":
					ok = err != nil && strings.Contains(err.Error(), "client closed")
				case "shutdown":
					ok = errors.Is(err, ipc.ErrShutdown)
				case "timeout":
					ok = errors.Is(err, collectived.ErrTimeout) && strings.Contains(err.Error(), "no reply from daemon")
				}
				if !ok {
					t.Errorf("call %d: %v", i, err)
				}
			}
		})
	}
	goroutinesBackTo(t, base)
}

// ints is n bytes of int32s, from seed up.
func ints(n, seed int) []byte {
	b := make([]byte, n)
	for i := 0; i+4 <= n; i += 4 {
		binary.LittleEndian.PutUint32(b[i:], uint32(seed+i))
	}
	return b
}

// A callback may close the client: one run by Close itself (whose own
// Close returns at once), and one run by the client's helper goroutine.
// Either way every callback runs once, and calls made in them fail.
func TestThenCallbackCloses(t *testing.T) {
	base := runtime.NumGoroutine()
	sock, stop := twoTrainers(t)
	a := dialTwo(t, sock, 0, 0)
	b := dialTwo(t, sock, 1, 0) // attached, never calls: a's calls stay in flight
	const n = 8
	o := newOnceEach(n)
	var after atomic.Int32
	for i := 0; i < n; i++ {
		h, err := collectived.AllReduceAsync(a, []float32{1}, collectived.Sum)
		if err != nil {
			t.Fatal(err)
		}
		f := o.fn(i)
		h.Then(func(err error) {
			a.Close()
			if _, err := collectived.AllReduceAsync(a, []float32{1}, collectived.Sum); err != nil {
				after.Add(1)
			}
			f(err)
		})
	}
	closed := make(chan struct{})
	go func() { a.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return: a callback's Close waited for it")
	}
	o.wait(t)
	for i, err := range o.errs {
		if err == nil || !strings.Contains(err.Error(), "client closed") {
			t.Errorf("call %d: %v", i, err)
		}
	}
	if after.Load() != n {
		t.Errorf("%d of %d calls made in callbacks after Close failed", after.Load(), n)
	}

	b.Close()
	stop()

	// In a world of one the calls complete; the first callback, on the
	// client's helper goroutine, closes the client while the others are
	// still to run.
	c, err := collectived.Dial(collectived.Options{LocalRank: -1})
	if err != nil {
		t.Fatal(err)
	}
	o = newOnceEach(n)
	hs := make([]*collectived.Handle, n)
	for i := range hs {
		if hs[i], err = collectived.AllReduceAsync(c, []float32{1}, collectived.Sum); err != nil {
			t.Fatal(err)
		}
	}
	for i, h := range hs {
		f := o.fn(i)
		h.Then(func(err error) {
			c.Close()
			f(err)
		})
	}
	o.wait(t)
	for i, err := range o.errs {
		if err != nil && !strings.Contains(err.Error(), "client closed") {
			t.Errorf("world of one, call %d: %v", i, err)
		}
	}
	goroutinesBackTo(t, base)
}
