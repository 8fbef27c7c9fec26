package e2e

import (
	"strings"
	"testing"
	"time"
)

// TestRingPayloadByteFlipped (issue 29): a relay on the link from node 0
// to node 1 (node 1's address in the peer list is the relay's) flips one
// payload byte of a frame of a 4 MiB float32 sum allreduce. The call it
// hits fails on every trainer with CORRUPT naming the link (both nodes
// with their addresses); no trainer gets a result, right or wrong. The
// ring re-forms and the next allreduces, which the relay leaves alone,
// give every trainer the exact sum in a new generation.
//
// The relay flips a frame of the reduce-scatter (step 0): node 0 cannot
// finish before node 1 has checked it, since it waits for node 1's
// reduced chunk. A flip in node 0's last frames could let node 0 finish
// first with its result (right: nothing corrupted reached it), and its
// trainer would learn of the failure at its next call, as of any failure
// of an op's last frames (docs/MATCHING.md); ring/corrupt_test.go covers
// those cases.
func TestRingPayloadByteFlipped(t *testing.T) {
	c := newLoopCluster(t, 2, 1)
	// Node 1 listens on its own port; the peers list sends node 0 to the
	// relay in front of it. Both are on 127.0.0.1, node 0's address.
	c.listen[1] = c.addrs[1]
	rl := startRelay(t, relayOpts{listen: "127.0.0.1:0", target: c.listen[1]})
	c.addrs[1] = rl.addr()
	c.startAll()
	var trs []*ftProc
	for n := 0; n < 2; n++ {
		// 1 Mi float32 elements: 4 MiB, the ring's large path.
		trs = append(trs, c.startFT(n, "-mode", "loop", "-count", "1048576", "-until-ok", "2", "-need-fail", "-max-fails", "3"))
	}
	waitFor(t, 60*time.Second, "2 calls each", func() bool { return len(trs[0].events()) >= 2 && len(trs[1].events()) >= 2 })
	rl.flip.Store(true)
	select {
	case <-rl.flipped:
	case <-time.After(20 * time.Second):
		t.Fatal("the relay saw no data frame to flip")
	}
	flipNs := rl.flipNs.Load()
	// A trainer's call k-1 ended before it made call k, and collective k
	// sends nothing before every trainer made its call: so the call the
	// flip hit is, on every trainer, the first that ended after the flip.
	hit := func(p *ftProc) (ftEvent, bool) {
		for _, e := range p.events() {
			if e.EndNs > flipNs {
				return e, true
			}
		}
		return ftEvent{}, false
	}
	waitFor(t, 60*time.Second, "the flipped call to end on every trainer", func() bool {
		_, a := hit(trs[0])
		_, b := hit(trs[1])
		return a && b
	})
	for i, p := range trs {
		e, _ := hit(p)
		switch {
		case e.OK:
			t.Errorf("trainer %d: call %d, which the flip hit, succeeded (a right result, by luck or elsewhere); want CORRUPT", i, e.Call)
		case e.Code == "WRONG":
			t.Errorf("trainer %d: call %d returned a WRONG result, silently: %s", i, e.Call, e.Message)
		case e.Code != "CORRUPT":
			t.Errorf("trainer %d: call %d failed with %s, want CORRUPT: %s", i, e.Call, e.Code, e.Message)
		default:
			// The link: node 0 sent, node 1 (through the relay, its
			// address in the peer list) received.
			for _, w := range []string{"node 0 " + c.addrs[0], "node 1 " + c.addrs[1], "corrupted", "checksum"} {
				if !strings.Contains(e.Message, w) {
					t.Errorf("trainer %d: CORRUPT message does not name %q: %s", i, w, e.Message)
				}
			}
			t.Logf("trainer %d told: %s %s", i, e.Code, e.Message)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	for i, p := range trs {
		evs, err := p.wait(90 * time.Second)
		if err != nil {
			t.Fatalf("trainer %d: %v", i, err)
		}
		fe, _ := firstFailure(evs)
		var genBefore uint32
		for _, e := range evs[:fe.Call] {
			genBefore = e.Gen
		}
		last := evs[len(evs)-1]
		if !last.OK || last.Gen <= genBefore || last.Call <= fe.Call {
			t.Fatalf("trainer %d: no exact sum in a new generation (after %d) after the failure: %+v", i, genBefore, evs)
		}
		for _, e := range evs {
			if !e.OK && e.Code != "CORRUPT" {
				t.Errorf("trainer %d: call %d: %s %s, want only CORRUPT failures", i, e.Call, e.Code, e.Message)
			}
		}
	}
	if !strings.Contains(c.fullLog(1), "checksum") {
		t.Errorf("node 1's log does not say a checksum failed")
	}
}
