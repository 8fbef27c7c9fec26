package ring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"
)

// tcpLinks connects n ranks in a ring over real TCP on 127.0.0.1: rank i
// dials rank i+1's listener once per stream.
func tcpLinks(t testing.TB, n, streams int) []Links { return tcpLinksVia(t, n, streams, nil) }

// tcpLinksVia is tcpLinks where via, if not nil, may send rank i's
// streams to another address than rank i+1's listener (a relay that
// forwards to it); PrevAddr still names the dialing rank.
func tcpLinksVia(t testing.TB, n, streams int, via func(i int, listener string) string) []Links {
	t.Helper()
	links := make([]Links, n)
	if n == 1 {
		return links
	}
	ls := make([]net.Listener, n)
	for i := range ls {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls[i] = l
		defer l.Close()
	}
	for i := 0; i < n; i++ {
		j := (i + 1) % n
		addr := ls[j].Addr().String()
		if via != nil {
			addr = via(i, addr)
		}
		links[i].NextAddr = addr
		links[j].PrevAddr = fmt.Sprintf("127.0.0.1 rank %d", i)
		for s := 0; s < streams; s++ {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			a, err := ls[j].Accept()
			if err != nil {
				t.Fatal(err)
			}
			links[i].Next = append(links[i].Next, c)
			links[j].Prev = append(links[j].Prev, a)
		}
	}
	return links
}

// newRings makes (does not start) a ring per rank over links, from
// testConfig with tweak applied, closed at the end of the test; ranks in
// skip get none.
func newRings(t testing.TB, links []Links, skip map[int]bool, tweak func(*Config)) []*Ring {
	t.Helper()
	n := len(links)
	rings := make([]*Ring, n)
	for i := range rings {
		if skip[i] {
			continue
		}
		cfg := testConfig(i, n)
		if tweak != nil {
			tweak(&cfg)
		}
		r, err := New(cfg, links[i])
		if err != nil {
			t.Fatal(err)
		}
		rings[i] = r
		t.Cleanup(func() { r.Close() })
	}
	return rings
}

// proposing is tweak after each rank proposes generation 10+rank, so that
// Start's agreement on the largest is seen.
func proposing(tweak func(*Config)) func(*Config) {
	return func(c *Config) {
		c.Generation = uint32(10 + c.Rank)
		if tweak != nil {
			tweak(c)
		}
	}
}

// pipeLinks connects n ranks with in-process net.Pipe streams.
func pipeLinks(n, streams int) []Links {
	links := make([]Links, n)
	if n == 1 {
		return links
	}
	for i := 0; i < n; i++ {
		j := (i + 1) % n
		links[i].NextAddr = fmt.Sprintf("pipe:%d", j)
		links[j].PrevAddr = fmt.Sprintf("pipe:%d", i)
		for s := 0; s < streams; s++ {
			a, b := net.Pipe()
			links[i].Next = append(links[i].Next, a)
			links[j].Prev = append(links[j].Prev, b)
		}
	}
	return links
}

// testConfig has timeouts short enough for tests yet safe under -race on
// a loaded two-core machine.
func testConfig(rank, size int) Config {
	c := DefaultConfig()
	c.Rank, c.Size = rank, size
	c.SegmentBytes = 64 << 10
	c.OpTimeout = 20 * time.Second
	c.HeartbeatInterval = 200 * time.Millisecond
	c.HeartbeatTimeout = 8 * time.Second
	c.AbortWait = 500 * time.Millisecond
	return c
}

type worldOpts struct {
	n, streams int
	pipe       bool
	tweak      func(*Config)
}

// newWorld builds and starts a ring of n ranks; rings are closed at the
// end of the test.
func newWorld(t testing.TB, o worldOpts) []*Ring {
	t.Helper()
	if o.streams == 0 {
		o.streams = 1
	}
	var links []Links
	if o.pipe {
		links = pipeLinks(o.n, o.streams)
	} else {
		links = tcpLinks(t, o.n, o.streams)
	}
	rings := newRings(t, links, nil, proposing(o.tweak))
	errs := onAll(t, rings, func(i int, r *Ring) error {
		g, err := r.Start()
		if err == nil && g != uint32(10+o.n-1) && (o.tweak == nil) {
			err = fmt.Errorf("rank %d adopted generation %d, want %d", i, g, 10+o.n-1)
		}
		return err
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d start: %v", i, err)
		}
	}
	return rings
}

// onAll runs f on every rank concurrently and waits, bounded, for all.
func onAll(t testing.TB, rings []*Ring, f func(i int, r *Ring) error) []error {
	t.Helper()
	errs := make([]error, len(rings))
	var wg sync.WaitGroup
	for i, r := range rings {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(i, r)
		}()
	}
	waitBounded(t, &wg, 60*time.Second)
	return errs
}

// allocsPerOp runs op on every rank together, runs times, and returns what
// testing.AllocsPerRun counts per run: the whole process's allocations,
// rank 0's op and this helper's channel handshakes included.
func allocsPerOp(t *testing.T, rings []*Ring, runs int, op func(i int, r *Ring) error) float64 {
	t.Helper()
	n := len(rings)
	start, done := make(chan struct{}), make(chan error, n-1)
	for i := 1; i < n; i++ {
		go func() {
			for range start {
				done <- op(i, rings[i])
			}
		}()
	}
	defer close(start)
	return testing.AllocsPerRun(runs, func() {
		for i := 1; i < n; i++ {
			start <- struct{}{}
		}
		if err := op(0, rings[0]); err != nil {
			t.Fatal(err)
		}
		for i := 1; i < n; i++ {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
	})
}

func waitBounded(t testing.TB, wg *sync.WaitGroup, d time.Duration) {
	t.Helper()
	c := make(chan struct{})
	go func() { wg.Wait(); close(c) }()
	select {
	case <-c:
	case <-time.After(d):
		t.Fatalf("ranks still running after %v: a hang", d)
	}
}

func noErrors(t testing.TB, what string, errs []error) {
	t.Helper()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// seal gives the frames laid out one after another in b (headers
// encoded, each payload behind its header, no trailers) their checksums,
// as the peer sending them computes them: it returns them with each
// payload's trailer behind it. A last frame cut short is returned as it
// is, its header sealed: seal the whole frame before cutting it.
func seal(b []byte) []byte {
	var out []byte
	for off := 0; off < len(b); {
		if off+headerLen > len(b) {
			return append(out, b[off:]...)
		}
		h := b[off : off+headerLen]
		binary.LittleEndian.PutUint32(h[headerSumAt:], checksum(h[:headerSumAt]))
		n := int(binary.LittleEndian.Uint32(h[52:]))
		end := off + headerLen + n
		if end > len(b) {
			return append(out, b[off:]...)
		}
		out = append(out, b[off:end]...)
		if n > 0 {
			out = binary.LittleEndian.AppendUint32(out, checksum(b[off+headerLen:end]))
		}
		off = end
	}
	return out
}
