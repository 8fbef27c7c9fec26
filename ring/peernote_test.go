package ring

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/collectived/collectived/collective"
)

// TestPeerNoteNeverStale races a reader hearing a diverged peer op at
// every seq against ops beginning and ending: once an op has begun, the
// one-slot note channel must hold no note about an earlier op, which
// would crowd out the op's own (heard sends without waiting).
func TestPeerNoteNeverStale(t *testing.T) {
	mine := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 1}
	theirs := collective.Desc{Op: collective.OpBroadcast, DType: collective.Float32, Count: 1, Root: 1}
	r := &Ring{peerOp: make(chan peerNote, 1), desc: mine, fp: mine.Fingerprint()}
	s := &stream{r: r, peerRank: 1}
	var at atomic.Uint64 // the seq the peer is at
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var h header
		h.setDesc(&theirs, theirs.Fingerprint())
		for {
			select {
			case <-stop:
				return
			default:
			}
			h.Seq = at.Load()
			r.heard(s, &h, viaData)
		}
	}()
	defer func() {
		close(stop)
		wg.Wait()
	}()
	n := 20000
	if testing.Short() {
		n = 2000
	}
	stale := 0
	for k := range uint64(n) {
		r.seq = k
		at.Store(k)
		r.setCurrent(true)
		select {
		case note := <-r.peerOp:
			if note.h.Seq != k {
				stale++
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("op %d: no note of the peer's diverged op within 5s", k)
		}
		r.setCurrent(false)
	}
	if stale > 0 {
		t.Fatalf("%d of %d ops found a note about an earlier op first", stale, n)
	}
}

// PeerInOp reports nothing before any peer op is heard of, then the one
// heard of last, with who sent it and when it was first heard.
func TestPeerInOp(t *testing.T) {
	r := &Ring{peerOp: make(chan peerNote, 1)}
	if p, ok := r.PeerInOp(); ok {
		t.Fatalf("nothing heard yet: got %+v", p)
	}
	s := &stream{r: r, peerRank: 1, peerAddr: "127.0.0.1:7001"}
	theirs := collective.Desc{Op: collective.OpBroadcast, DType: collective.Float32, Count: 3, Root: 1}
	var h header
	h.setDesc(&theirs, theirs.Fingerprint())
	before := time.Now()
	for _, seq := range []uint64{peerHistory, peerHistory + 1, peerHistory} { // slot 0 first, then back to it
		h.Seq = seq
		r.heard(s, &h, viaHeartbeat)
	}
	p, ok := r.PeerInOp()
	if !ok || p.Seq != peerHistory || p.Rank != 1 || p.Addr != "127.0.0.1:7001" || !p.Desc.Equal(collective.Desc{Op: collective.OpBroadcast, DType: collective.Float32, Count: 3, Root: 1}) {
		t.Fatalf("PeerInOp = %+v, %v; want seq %d's broadcast from rank 1 at 127.0.0.1:7001", p, ok, peerHistory)
	}
	if p.Since.Before(before) {
		t.Fatalf("Since %v is before the op was first heard of (%v)", p.Since, before)
	}
}
