package rendezvous

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/collectived/collectived/internal/localworld"
	"github.com/collectived/collectived/internal/syncbuf"
)

var (
	testToken  = []byte("test-token-0123456789abcdef")
	testDigest = sha256.Sum256([]byte("test shape"))
)

// testLogger collects a test's logs and prints them only if it fails;
// writing after the test ended is harmless.
func testLogger(t testing.TB) *slog.Logger {
	buf := &syncbuf.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs:\n%s", buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// rejection is one call of Config.OnReject.
type rejection struct {
	addr string
	err  error
}

// rejectLog records OnReject calls and lets a test wait for one.
type rejectLog struct {
	ch chan rejection
}

func newRejectLog() *rejectLog { return &rejectLog{ch: make(chan rejection, 1024)} }

func (r *rejectLog) hook(addr string, err error) {
	select {
	case r.ch <- rejection{addr, err}:
	default:
	}
}

// waitFor returns the first recorded rejection wrapping target, failing
// the test if none comes within d. Others seen meanwhile are skipped.
func (r *rejectLog) waitFor(t *testing.T, target error, d time.Duration) rejection {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	var seen []string
	for {
		select {
		case rj := <-r.ch:
			if errors.Is(rj.err, target) {
				return rj
			}
			if len(seen) < 10 {
				seen = append(seen, rj.err.Error())
			}
		case <-timer.C:
			t.Fatalf("no rejection wrapping %q within %v; saw %q", target, d, seen)
			return rejection{}
		}
	}
}

// freeListeners binds n listeners on 127.0.0.1 so the peer list can be
// built before any node starts. Their ports lie outside the ephemeral
// range (localworld.Listeners): tests close some to have a node bind the
// port later, and a dial must not take it as its source port meanwhile.
func freeListeners(t testing.TB, n int) ([]net.Listener, []string) {
	t.Helper()
	lns, err := localworld.Listeners(n)
	if err != nil {
		t.Fatal(err)
	}
	peers := make([]string, n)
	for i, ln := range lns {
		peers[i] = ln.Addr().String()
	}
	return lns, peers
}

func testConfig(t testing.TB, peers []string, rank, streams int) Config {
	c := DefaultConfig()
	c.Job = "test-job"
	c.Token = testToken
	c.Peers = peers
	c.Rank = rank
	c.Streams = streams
	c.Digest = testDigest
	c.ConnectTimeout = 20 * time.Second
	c.HandshakeTimeout = 2 * time.Second
	c.Logger = testLogger(t).With("test_rank", rank)
	return c
}

// testWorld is n listeners on 127.0.0.1 with the same job.
type testWorld struct {
	t       *testing.T
	peers   []string
	ls      []*Listener
	rejects []*rejectLog
}

func newWorld(t *testing.T, n, streams int, tweak func(*Config)) *testWorld {
	t.Helper()
	lns, peers := freeListeners(t, n)
	w := &testWorld{t: t, peers: peers, ls: make([]*Listener, n), rejects: make([]*rejectLog, n)}
	for r := range n {
		w.rejects[r] = newRejectLog()
		cfg := testConfig(t, peers, r, streams)
		cfg.OnReject = w.rejects[r].hook
		if tweak != nil {
			tweak(&cfg)
		}
		l, err := NewListener(cfg, lns[r])
		if err != nil {
			t.Fatal(err)
		}
		w.ls[r] = l
		t.Cleanup(func() { l.Close() })
	}
	return w
}

// formAll runs Form on every rank at once; gens[r] is rank r's proposal.
func formAll(ls []*Listener, gens []uint32) ([]*Links, []error) {
	links := make([]*Links, len(ls))
	errs := make([]error, len(ls))
	var wg sync.WaitGroup
	for r, l := range ls {
		wg.Go(func() { links[r], errs[r] = l.Form(context.Background(), gens[r]) })
	}
	wg.Wait()
	return links, errs
}

func mustFormAll(t *testing.T, ls []*Listener, gens []uint32) []*Links {
	t.Helper()
	links, errs := formAll(ls, gens)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: Form: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, k := range links {
			k.Close()
		}
	})
	return links
}

// checkWired sends one distinct byte on every Next stream and expects it on
// the neighbour's Prev stream of the same index, and checks addresses and
// generations.
func checkWired(t *testing.T, peers []string, links []*Links, gens []uint32, streams int) {
	t.Helper()
	n := len(links)
	for r, k := range links {
		if n == 1 {
			if k.Next != nil || k.Prev != nil {
				t.Fatalf("world of one: links %+v, want none", k)
			}
			continue
		}
		next, prev := (r+1)%n, (r-1+n)%n
		if len(k.Next) != streams || len(k.Prev) != streams {
			t.Fatalf("rank %d: %d next and %d prev streams, want %d", r, len(k.Next), len(k.Prev), streams)
		}
		if k.NextAddr != peers[next] || k.PrevAddr != peers[prev] {
			t.Fatalf("rank %d: next %s prev %s, want %s and %s", r, k.NextAddr, k.PrevAddr, peers[next], peers[prev])
		}
		if k.NextGeneration != gens[next] || k.PrevGeneration != gens[prev] {
			t.Fatalf("rank %d: next generation %d prev generation %d, want %d and %d",
				r, k.NextGeneration, k.PrevGeneration, gens[next], gens[prev])
		}
	}
	if n == 1 {
		return
	}
	for r, k := range links {
		for i, c := range k.Next {
			if _, err := c.Write([]byte{byte(16*r + i)}); err != nil {
				t.Fatalf("rank %d: write next stream %d: %v", r, i, err)
			}
		}
	}
	for r, k := range links {
		from := (r - 1 + n) % n
		for i, c := range k.Prev {
			var b [1]byte
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Read(b[:]); err != nil {
				t.Fatalf("rank %d: read prev stream %d: %v", r, i, err)
			}
			c.SetReadDeadline(time.Time{})
			if want := byte(16*from + i); b[0] != want {
				t.Fatalf("rank %d prev stream %d: got byte %d, want %d (from rank %d stream %d)", r, i, b[0], want, from, i)
			}
		}
	}
}

// craft returns dial parameters for a handshake as rank `rank` would send
// it to the listener at rank rank+1 of peers; tests then spoil one field.
func craft(t *testing.T, peers []string, rank int) *dialParams {
	cfg := testConfig(t, peers, rank, 1)
	cfg.HandshakeTimeout = 2 * time.Second
	n := len(peers)
	return &dialParams{cfg: &cfg, wantRank: (rank + 1) % n, hello: hello{
		ByteOrder: nativeBOM,
		Rank:      uint32(rank),
		World:     uint32(n),
		Streams:   1,
		Session:   session{Epoch: uint64(time.Now().UnixNano()), Seq: 1},
		Digest:    testDigest,
		Job:       "test-job",
	}}
}

// dialCrafted runs a crafted handshake against addr, returning the
// dialer-side error and, on success, the connection.
func dialCrafted(addr string, p *dialParams) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := dialStream(ctx, addr, p)
	return c, err
}

// wantErr fails unless err wraps target and its text holds every part.
func wantErr(t *testing.T, side string, err, target error, parts ...string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got error %v, want one wrapping %q", side, err, target)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("%s: error %q does not mention %q", side, err, p)
		}
	}
}

// formInBackground keeps a Form running on l for the rest of the test.
func formInBackground(t *testing.T, l *Listener) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if k, err := l.Form(ctx, 1); err == nil {
			k.Close()
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	waitForming(t, l)
}

func waitForming(t *testing.T, l *Listener) {
	t.Helper()
	for range 500 {
		l.mu.Lock()
		f := l.form
		l.mu.Unlock()
		if f != nil {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatal("Form never started")
}

func gensOf(n int, f func(r int) uint32) []uint32 {
	g := make([]uint32, n)
	for r := range g {
		g[r] = f(r)
	}
	return g
}

var _ = fmt.Sprint
