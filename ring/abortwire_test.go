package ring

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/collectived/collectived/collective"
)

// wireLog is what a fake rank read from one raw link: the frames' headers
// (and abort reasons) in order, and how the stream ended.
type wireLog struct {
	headers []header
	reasons []string
	end     error // io.EOF when the peer shut the socket
}

// readWire decodes frames from c until it ends or the deadline passes.
func readWire(c net.Conn, deadline time.Time) wireLog {
	var w wireLog
	c.SetReadDeadline(deadline)
	b := make([]byte, headerLen)
	for {
		if _, err := io.ReadFull(c, b); err != nil {
			w.end = err
			return w
		}
		h, err := decodeHeader(b, 1<<30)
		if err != nil {
			w.end = err
			return w
		}
		payload := make([]byte, int(h.Length)+trailerFor(int(h.Length)))
		if _, err := io.ReadFull(c, payload); err != nil {
			w.end = err
			return w
		}
		payload = payload[:h.Length]
		w.headers = append(w.headers, h)
		if h.Kind == kindAbort {
			w.reasons = append(w.reasons, string(payload))
		} else {
			w.reasons = append(w.reasons, "")
		}
	}
}

// TestAbortFrameOnTheWire checks the abort protocol from outside, on the
// raw sockets: rank 2 finds garbage from rank 1 (a fake that only speaks
// Start), sends an abort frame with its rank, the failure's code and the
// reason back to rank 1 and on to rank 0, and shuts the socket; rank 0
// forwards the same origin and reason to rank 1 on the other link and
// shuts that too. So both of the fake's links carry the abort and then end.
func TestAbortFrameOnTheWire(t *testing.T) {
	rings, links := faultWorld(t, 3, map[int]bool{1: true}, nil)
	fake := links[1]
	defer func() {
		for _, c := range append(append([]net.Conn(nil), fake.Next...), fake.Prev...) {
			c.Close()
		}
	}()
	// Read both of the fake's links from the start: rank 0 sends Start and
	// data frames to it, rank 2 the abort back to it.
	deadline := time.Now().Add(15 * time.Second)
	var wg sync.WaitGroup
	var fromNext, fromPrev wireLog
	wg.Add(2)
	go func() { defer wg.Done(); fromNext = readWire(fake.Next[0], deadline) }()
	go func() { defer wg.Done(); fromPrev = readWire(fake.Prev[0], deadline) }()
	for s := 0; s < 2; s++ {
		h := header{Kind: kindStart, Sender: 1, Generation: 11, Step: uint32(s)}
		b := make([]byte, headerLen)
		h.encode(b)
		fake.Next[0].Write(b)
	}
	startAll(t, rings)
	time.AfterFunc(100*time.Millisecond, func() { fake.Next[0].Write([]byte("GET / HTTP/1.1\r\n\r\n" + strings.Repeat("x", 64))) })
	errs := opOnReal(t, rings, 15*time.Second, allReduceOn)
	expectAll(t, rings, errs, ErrBadFrame, "bad magic", "rank 1")
	waitBounded(t, &wg, 20*time.Second)

	for _, c := range []struct {
		name   string
		log    wireLog
		sender uint32
	}{{"from rank 2 (backward)", fromNext, 2}, {"from rank 0 (forwarded)", fromPrev, 0}} {
		if c.log.end != io.EOF {
			t.Errorf("%s: link ended with %v, want EOF: the failing rank must shut its sockets", c.name, c.log.end)
		}
		i := len(c.log.headers) - 1
		if i < 0 || c.log.headers[i].Kind != kindAbort {
			t.Errorf("%s: last frame is not an abort: %+v", c.name, c.log.headers)
			continue
		}
		h, reason := c.log.headers[i], c.log.reasons[i]
		origin, code := int(uint32(h.Aux)), abortCode(h.Aux>>32)
		if h.Sender != c.sender || origin != 2 || code != codeBadFrame {
			t.Errorf("%s: abort sender %d origin %d code %d, want sender %d origin 2 code %d", c.name, h.Sender, origin, code, c.sender, codeBadFrame)
		}
		if h.Op != collective.OpAllReduce || h.Seq != 0 {
			t.Errorf("%s: abort names op %v seq %d, want the origin's allreduce seq 0", c.name, h.Op, h.Seq)
		}
		if culprit := int(h.Aux>>culpritShift) - 1; culprit != 1 {
			t.Errorf("%s: abort names culprit %d, want rank 1, which sent the garbage", c.name, culprit)
		}
		if !strings.Contains(reason, "bad magic") || !strings.Contains(reason, "from rank 1") {
			t.Errorf("%s: abort reason %q does not carry the original cause", c.name, reason)
		}
	}
}

// TestFaultErrorNamesEverything: a rank closes in the middle of an
// allreduce; a rank next to it that finds this itself reports the peer's
// rank and address and where it was (op, seq, step) in *Error's fields,
// and every rank that heard of it by abort instead quotes the origin's
// words, the address included. (Which neighbour finds it first, and
// whether the other hears the abort before seeing the EOF, is a race.)
func TestFaultErrorNamesEverything(t *testing.T) {
	rings, links := faultWorld(t, 4, map[int]bool{2: true}, nil)
	fake := newFakeRank(links[2], 2, 4)
	go fake.start(10 + 3)
	defer fake.closeAll()
	startAll(t, rings)
	time.AfterFunc(200*time.Millisecond, fake.closeAll)
	errs := opOnReal(t, rings, 15*time.Second, allReduceOn)
	expectAll(t, rings, errs, ErrPeerClosed)

	neighbourAddr := map[int]string{1: links[1].NextAddr, 3: links[3].PrevAddr}
	origins := 0
	for i, err := range errs {
		if rings[i] == nil {
			continue
		}
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("rank %d: %T", i, err)
		}
		// Every rank, however it heard, knows whose fault it was.
		if e.Culprit != 2 {
			t.Errorf("rank %d: culprit %d, want 2 (the rank that closed): %v", i, e.Culprit, e)
		}
		addr, ok := neighbourAddr[e.Origin]
		if !ok {
			t.Errorf("rank %d: origin %d is not a neighbour of the closed rank: %v", i, e.Origin, e)
			continue
		}
		if e.Origin != i {
			if !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "from rank 2 ("+addr+"): peer closed") {
				t.Errorf("rank %d: %q does not quote origin %d's cause with the address %s", i, err, e.Origin, addr)
			}
			continue
		}
		origins++
		if e.Rank != i || e.PeerRank != 2 || e.PeerAddr != addr || errors.Is(err, ErrAborted) {
			t.Errorf("rank %d: rank %d peer %d %q, want rank %d peer 2 %q, found here: %v", i, e.Rank, e.PeerRank, e.PeerAddr, i, addr, e)
		}
		if e.Op != collective.OpAllReduce || e.Seq != 0 || e.Step < 0 || e.Step >= 2*(4-1) {
			t.Errorf("rank %d: op %v seq %d step %d, want allreduce seq 0 within its 6 steps: %v", i, e.Op, e.Seq, e.Step, e)
		}
		if want := fmt.Sprintf("allreduce seq 0 step %d: from rank 2 (%s)", e.Step, addr); !strings.Contains(e.Error(), want) {
			t.Errorf("rank %d: %q does not say %q", i, e, want)
		}
	}
	if origins == 0 {
		t.Fatal("no rank found the closed peer itself")
	}
	// A later call reports the same failure, in the same words.
	later := rings[0].Barrier(collective.Desc{Op: collective.OpBarrier})
	var le *Error
	if !errors.As(later, &le) || le.Culprit != 2 {
		t.Errorf("later call: culprit lost: %v", later)
	}
	if !errors.Is(later, ErrPeerClosed) || !strings.Contains(later.Error(), "failed earlier: "+strings.TrimPrefix(errs[0].Error(), "ring rank 0: ")) {
		t.Errorf("later call: %v\nwant it to repeat: %v", later, errs[0])
	}
}
