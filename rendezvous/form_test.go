package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestFormWorlds(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4} {
		for _, streams := range []int{1, 3} {
			t.Run(fmt.Sprintf("world%d/streams%d", n, streams), func(t *testing.T) {
				w := newWorld(t, n, streams, nil)
				if n == 1 && w.ls[0].Addr() != nil {
					t.Fatalf("world of one bound %v", w.ls[0].Addr())
				}
				// Each rank proposes its own generation, so the test can
				// tell whose proposal came back on which link.
				for g := uint32(1); g <= 2; g++ {
					gens := gensOf(n, func(r int) uint32 { return 100*g + uint32(r) })
					links := mustFormAll(t, w.ls, gens)
					checkWired(t, w.peers, links, gens, streams)
					for _, k := range links {
						k.Close()
					}
				}
			})
		}
	}
}

func TestFormSetsNoDelay(t *testing.T) {
	w := newWorld(t, 2, 2, nil)
	links := mustFormAll(t, w.ls, []uint32{1, 1})
	for r, k := range links {
		for _, c := range append(append([]net.Conn{}, k.Next...), k.Prev...) {
			raw, err := c.(*net.TCPConn).SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			var v int
			var gerr error
			raw.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NODELAY) })
			if gerr != nil || v == 0 {
				t.Fatalf("rank %d conn %v: TCP_NODELAY = %d, %v", r, c.LocalAddr(), v, gerr)
			}
		}
	}
}

// A rank that starts while the others are already retrying still forms.
func TestFormLateRank(t *testing.T) {
	const n, late = 3, 2
	lns, peers := freeListeners(t, n)
	lns[late].Close() // nobody answers on its port yet
	ls := make([]*Listener, n)
	rejects := newRejectLog()
	for r := range n {
		if r == late {
			continue
		}
		cfg := testConfig(t, peers, r, 2)
		cfg.OnReject = rejects.hook
		l, err := NewListener(cfg, lns[r])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		ls[r] = l
	}
	gens := []uint32{1, 1, 1}
	base := ls[1].seq.Load()
	links := make([]*Links, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		if r == late {
			continue
		}
		wg.Go(func() { links[r], errs[r] = ls[r].Form(context.Background(), 1) })
	}
	// The late rank's prev (rank 1) is refused meanwhile; wait until it
	// has been, so the late start really comes after retries.
	waitRefused(t, ls[1], peers[late], base)
	cfg := testConfig(t, peers, late, 2)
	l, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ls[late] = l
	links[late], errs[late] = l.Form(context.Background(), 1)
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, k := range links {
			k.Close()
		}
	})
	checkWired(t, peers, links, gens, 2)
}

// waitRefused waits until l has failed at least twice to reach addr, as
// its log says (the log line is per kind of failure, so we poll dials).
func waitRefused(t *testing.T, l *Listener, addr string, base uint64) {
	t.Helper()
	for range 1000 {
		if l.seq.Load() >= base+3 { // one for Form, two dial attempts
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("rank %d never retried %s", l.cfg.Rank, addr)
}

// A node that crashed and restarted (fresh Listener, fresh epoch) re-forms
// with the survivors, who call Form again on their old Listeners. The
// survivors start before the crashed node's old listener is gone.
func TestFormAfterRestart(t *testing.T) {
	const n, crashed = 3, 1
	w := newWorld(t, n, 2, nil)
	links := mustFormAll(t, w.ls, []uint32{1, 1, 1})
	checkWired(t, w.peers, links, []uint32{1, 1, 1}, 2)
	for _, k := range links {
		k.Close()
	}

	gens := []uint32{2, 1, 2} // the restarted node knows nothing of generation 1
	base := w.ls[0].seq.Load()
	out := make([]*Links, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		if r != crashed {
			wg.Go(func() { out[r], errs[r] = w.ls[r].Form(context.Background(), gens[r]) })
		}
	}
	// Rank 0 keeps being told "not forming" by the old process until it dies.
	waitRefused(t, w.ls[0], w.peers[crashed], base)
	w.ls[crashed].Close()
	cfg := testConfig(t, w.peers, crashed, 2)
	l, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	out[crashed], errs[crashed] = l.Form(context.Background(), gens[crashed])
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, k := range out {
			k.Close()
		}
	})
	checkWired(t, w.peers, out, gens, 2)
}

func TestFormTimeoutNamesSilentPeer(t *testing.T) {
	lns, peers := freeListeners(t, 2)
	lns[1].Close() // rank 1 never comes up
	cfg := testConfig(t, peers, 0, 1)
	cfg.ConnectTimeout = time.Second
	l, err := NewListener(cfg, lns[0])
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	start := time.Now()
	_, err = l.Form(context.Background(), 1)
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("Form took %v with a 1s connect timeout", took)
	}
	wantErr(t, "Form", err, ErrTimeout,
		fmt.Sprintf("rendezvous rank 0: next rank 1 (%s) never answered within 1s", peers[1]),
		"connection refused",
		fmt.Sprintf("prev rank 1 (%s) never connected within 1s", peers[1]))
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Rank != 0 || pe.Peer != 1 || pe.Addr != peers[1] {
		t.Fatalf("error %v: PeerError %+v", err, pe)
	}
}

// The prev side's timeout names the last refusal, so the operator sees why
// the peer that did call never got in.
func TestFormTimeoutQuotesLastRefusal(t *testing.T) {
	lns, peers := freeListeners(t, 3)
	cfg := testConfig(t, peers, 1, 1)
	cfg.ConnectTimeout = time.Second
	l, err := NewListener(cfg, lns[1])
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// Rank 2 (next) answers TCP but never speaks: Form's dials time out.
	defer lns[2].Close()
	done := make(chan error, 1)
	go func() { _, err := l.Form(context.Background(), 1); done <- err }()
	waitForming(t, l)
	p := craft(t, peers, 0)
	p.hello.Digest[0] ^= 1
	if _, err := dialCrafted(peers[1], p); !errors.Is(err, ErrDigest) {
		t.Fatalf("crafted dial: %v", err)
	}
	err = <-done
	wantErr(t, "Form", err, ErrTimeout, "prev rank 0", "never connected within 1s", "last refused connection", "other job shape digest")
	wantErr(t, "Form", err, ErrTimeout, "next rank 2", "never answered within 1s", "handshake timed out")
}

// Another configuration is refused at once, not after the whole timeout.
func TestFormFailsFastOnOtherDigest(t *testing.T) {
	lns, peers := freeListeners(t, 2)
	ls := make([]*Listener, 2)
	for r := range 2 {
		cfg := testConfig(t, peers, r, 1)
		cfg.ConnectTimeout = time.Minute
		if r == 1 {
			cfg.Digest[31] ^= 0xff
			cfg.Digest[0] ^= 0xff
		}
		l, err := NewListener(cfg, lns[r])
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ls[r] = l
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs [2]error
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() { _, errs[r] = ls[r].Form(ctx, 1) })
	}
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatal("Form waited for the deadline instead of failing fast")
	}
	ours, theirs := shortHex(ls[0].cfg.Digest), shortHex(ls[1].cfg.Digest)
	for r, err := range errs {
		wantErr(t, fmt.Sprintf("rank %d", r), err, ErrDigest, ours, theirs, fmt.Sprintf("rendezvous rank %d: next rank %d", r, 1-r))
		if errors.Is(err, ErrTimeout) {
			t.Fatalf("rank %d: %v is a timeout", r, err)
		}
	}
}

func TestFormCloseAndReuse(t *testing.T) {
	w := newWorld(t, 2, 1, nil)
	l := w.ls[0]
	done := make(chan error, 1)
	go func() { _, err := l.Form(context.Background(), 1); done <- err }()
	waitForming(t, l)
	if _, err := l.Form(context.Background(), 1); !errors.Is(err, ErrFormInProgress) {
		t.Fatalf("second Form: %v, want ErrFormInProgress", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		wantErr(t, "Form during Close", err, ErrClosed, "rank 0")
	case <-time.After(10 * time.Second):
		t.Fatal("Form did not return after Close")
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := l.Form(context.Background(), 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Form after Close: %v", err)
	}

	one, err := Listen(testConfig(t, []string{"127.0.0.1:1"}, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	k, err := one.Form(context.Background(), 7)
	if err != nil || k.Next != nil || k.Prev != nil || k.NextGeneration != 7 {
		t.Fatalf("world of one: %+v, %v", k, err)
	}
	one.Close()
	if _, err := one.Form(context.Background(), 7); !errors.Is(err, ErrClosed) {
		t.Fatalf("world of one after Close: %v", err)
	}
}

func TestFormCallerCancel(t *testing.T) {
	lns, peers := freeListeners(t, 2)
	lns[1].Close()
	l, err := NewListener(testConfig(t, peers, 0, 1), lns[0])
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	_, err = l.Form(ctx, 1)
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrTimeout) {
		t.Fatalf("cancelled Form: %v", err)
	}
}

// A stream greeted under one Form but finishing its handshake under the
// next is refused as stale, and streams held by a Form that failed are
// closed, never handed to the next Form.
func TestFormStaleStreamRefused(t *testing.T) {
	lns, peers := freeListeners(t, 3)
	defer lns[2].Close() // next answers TCP but stays silent
	cfg := testConfig(t, peers, 1, 2)
	rejects := newRejectLog()
	cfg.OnReject = rejects.hook
	l, err := NewListener(cfg, lns[1])
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	ctx1, cancel1 := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Form(ctx1, 1) }()
	waitForming(t, l)

	// Stream 0 gets in completely under the first Form.
	p := craft(t, peers, 0)
	p.hello.Streams = 2
	p.cfg.Streams = 2
	in, err := dialCrafted(peers[1], p)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	// Stream 1 is greeted by the first Form, then stalls before its proof.
	raw, _ := net.Dial("tcp", peers[1])
	defer raw.Close()
	h1 := p.hello
	h1.Stream = 1
	h1.Nonce[0] ^= 0x55
	helloBytes := appendHello(nil, &h1)
	raw.Write(helloBytes)
	var buf frameBuf
	raw.SetDeadline(time.Now().Add(5 * time.Second))
	lf, err := readFrame(raw, &buf)
	if err != nil || lf.typ != frameHello {
		t.Fatalf("greeting: %v %v", lf.typ, err)
	}
	lraw := append([]byte(nil), lf.raw...)
	if _, err := readFrame(raw, &buf); err != nil {
		t.Fatal(err)
	}

	cancel1()
	<-done
	// The stream the failed Form held is closed.
	in.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := in.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("stream held by the failed Form: read %v, want EOF", err)
	}

	go func() { l.Form(context.Background(), 2) }()
	waitForming(t, l)
	raw.Write(appendAuth(nil, proof(testToken, labelDialer, helloBytes, lraw)))
	f, err := readFrame(raw, &buf)
	if err != nil || f.typ != frameStatus {
		t.Fatalf("verdict: %v %v", f.typ, err)
	}
	wantErr(t, "dialer", decodeStatus(f.payload), ErrStale, "earlier Form")
	rejects.waitFor(t, ErrStale, 5*time.Second)
	l.Close()
}

// Within one Form, a newer attempt of the prev peer replaces an older
// one's streams, an older attempt is refused, and a duplicate stream of
// the same attempt is refused.
func TestFormAttemptsSupersede(t *testing.T) {
	lns, peers := freeListeners(t, 3)
	defer lns[2].Close()
	cfg := testConfig(t, peers, 1, 2)
	rejects := newRejectLog()
	cfg.OnReject = rejects.hook
	l, err := NewListener(cfg, lns[1])
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	formInBackground(t, l)

	dial := func(seq uint64, stream uint16) (net.Conn, error) {
		p := craft(t, peers, 0)
		p.hello.Streams, p.cfg.Streams = 2, 2
		p.hello.Session = session{Epoch: 1000, Seq: seq}
		p.hello.Stream = stream
		return dialCrafted(peers[1], p)
	}
	c5, err := dial(5, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c5.Close()
	_, err = dial(4, 1)
	wantErr(t, "older attempt", err, ErrStale, "superseded")
	rejects.waitFor(t, ErrStale, 5*time.Second)
	_, err = dial(5, 0)
	wantErr(t, "duplicate", err, ErrUnexpectedRank, "duplicate stream 0")
	rejects.waitFor(t, ErrUnexpectedRank, 5*time.Second)
	c6, err := dial(6, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c6.Close()
	c5.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c5.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("superseded stream: read %v, want EOF", err)
	}
	if !strings.Contains(fmt.Sprint(c6.RemoteAddr()), "127.0.0.1") {
		t.Fatal(c6.RemoteAddr())
	}
}

// Each node dials from the address the peer list gives it, so a listener
// that checks its prev's address accepts it even where the kernel would
// have picked another source (here: 127.0.0.2 and 127.0.0.3 on loopback).
func TestFormDialsFromAdvertisedAddr(t *testing.T) {
	hosts := []string{"127.0.0.2", "127.0.0.3"}
	lns := make([]net.Listener, 2)
	peers := make([]string, 2)
	for r, h := range hosts {
		ln, err := net.Listen("tcp", h+":0")
		if err != nil {
			t.Skipf("cannot bind %s: %v", h, err)
		}
		lns[r], peers[r] = ln, ln.Addr().String()
	}
	ls := make([]*Listener, 2)
	for r := range 2 {
		cfg := testConfig(t, peers, r, 2)
		l, err := NewListener(cfg, lns[r])
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ls[r] = l
	}
	links := mustFormAll(t, ls, []uint32{1, 1})
	checkWired(t, peers, links, []uint32{1, 1}, 2)
	for r, k := range links {
		for _, c := range k.Next {
			if got := c.LocalAddr().(*net.TCPAddr).IP.String(); got != hosts[r] {
				t.Fatalf("rank %d dialled from %s, want %s", r, got, hosts[r])
			}
		}
	}
}

// Nothing outlives Close: the accept loop and every handshake goroutine end.
func TestListenerLeavesNoGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		w := newWorld(t, 3, 2, nil)
		links := mustFormAll(t, w.ls, []uint32{1, 1, 1})
		for _, k := range links {
			k.Close()
		}
		half, err := net.Dial("tcp", w.peers[0]) // a handshake in progress at Close
		if err != nil {
			t.Fatal(err)
		}
		defer half.Close()
		for _, l := range w.ls {
			l.Close()
		}
	}()
	var n int
	for range 200 {
		if n = runtime.NumGoroutine(); n <= before {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	buf := make([]byte, 1<<16)
	t.Fatalf("%d goroutines before, %d after Close:\n%s", before, n, buf[:runtime.Stack(buf, true)])
}
