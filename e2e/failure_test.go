package e2e

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMismatch: calls that disagree, inside one node or across nodes, fail
// on every trainer with MISMATCH naming the ranks and both descriptions;
// nothing is exchanged, and the next call (in a new generation) succeeds.
func TestMismatch(t *testing.T) {
	for _, tc := range []struct {
		name, ranks string
		want        []string
	}{
		{"local", "3", []string{"world rank 2", "world rank 3", "count=1024", "count=1000"}},
		{"across nodes", "2,3", []string{"count=1024", "count=1000", "(world ranks 0-1)", "(world ranks 2-3)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := startWorld(t, 2, 2, "")
			bs := w.fleet().baselines()
			trs := w.startTrainers("-mode", "repeat", "-times", "2", "-count", "1024", "-count-for", tc.ranks+"=1000", "-mismatch-call", "0")
			for i, tr := range trs {
				evs, err := tr.wait(t, 60*time.Second)
				if err != nil {
					t.Fatalf("trainer %d: %v", i, err)
				}
				if len(evs) != 2 {
					t.Fatalf("trainer %d: %d events, want 2", i, len(evs))
				}
				e := evs[0]
				if e.OK || e.Code != "MISMATCH" {
					t.Fatalf("trainer %d call 0: ok=%v code=%s %s; want MISMATCH", i, e.OK, e.Code, e.Message)
				}
				if strings.Contains(e.Message, "[mismatch]") {
					t.Errorf("trainer %d: the daemons' internal tag reached the trainer: %s", i, e.Message)
				}
				for _, s := range tc.want {
					if !strings.Contains(e.Message, s) {
						t.Errorf("trainer %d: mismatch message does not name %q: %s", i, s, e.Message)
					}
				}
				if !evs[1].OK {
					t.Errorf("trainer %d call 1 after the mismatch failed: %s %s", i, evs[1].Code, evs[1].Message)
				} else if evs[1].Gen == 0 {
					t.Errorf("trainer %d call 1 ran in generation 0; the failed generation should have been replaced", i)
				}
			}
			w.fleet().checkBaselines(bs, 20*time.Second)
		})
	}
}

// TestTrainerKilled: a trainer killed while the others wait for it fails
// the collective on every other trainer, on every node, with TRAINER_LOST
// naming it; a replacement trainer attaches and the world goes on.
func TestTrainerKilled(t *testing.T) {
	w := startWorld(t, 2, 2, "")
	bs := w.fleet().baselines()
	var trs []*trainer
	for i := 0; i < 3; i++ {
		trs = append(trs, w.startTrainer(i/2, "-mode", "repeat", "-times", "2", "-count", "4096"))
		time.Sleep(100 * time.Millisecond) // take local ranks in order
	}
	victim := w.startTrainer(1, "-mode", "repeat", "-times", "1", "-pause", "1h")
	time.Sleep(500 * time.Millisecond)
	killed := time.Now()
	victim.cmd.Process.Kill()
	// The replacement takes the freed local rank once the others have
	// their error, then everyone's second call meets.
	time.Sleep(1500 * time.Millisecond)
	trs = append(trs, w.startTrainer(1, "-mode", "repeat", "-times", "1", "-count", "4096"))
	for i, tr := range trs {
		evs, err := tr.wait(t, 60*time.Second)
		if err != nil {
			t.Fatalf("trainer %d: %v", i, err)
		}
		if i == 3 {
			if len(evs) != 1 || !evs[0].OK {
				t.Fatalf("replacement trainer: %+v", evs)
			}
			continue
		}
		if len(evs) != 2 {
			t.Fatalf("trainer %d: %d events, want 2", i, len(evs))
		}
		e := evs[0]
		if e.OK || e.Code != "TRAINER_LOST" || !strings.Contains(e.Message, "world rank 3") {
			t.Fatalf("trainer %d call 0: ok=%v code=%s %q; want TRAINER_LOST naming world rank 3", i, e.OK, e.Code, e.Message)
		}
		if !evs[1].OK {
			t.Fatalf("trainer %d call 1 after the loss: %s %s", i, evs[1].Code, evs[1].Message)
		}
	}
	t.Logf("trainer killed at %v; all survivors told and recovered", killed.Format(time.StampMilli))
	w.fleet().checkBaselines(bs, 20*time.Second)
}

// TestDaemonKilled: kill -9 one daemon mid-allreduce; the trainers of the
// other nodes get PEER_LOST naming the dead node within a bound; once the
// daemon is restarted the ring re-forms and new calls succeed.
func TestDaemonKilled(t *testing.T) {
	testDaemonFault(t, func(w *world) { w.kill(2) }, func(w *world) { w.startDaemon(2); w.waitSocket(2, 20*time.Second) }, 0, 5*time.Second,
		"(world rank 2) closed its connections")
}

// TestDaemonStopped: SIGSTOP one daemon; its neighbours see no heartbeat
// and fail within [T/2, 2T] of the heartbeat timeout T; after SIGCONT the
// stopped daemon finds its ring gone, and all re-form.
func TestDaemonStopped(t *testing.T) {
	const T = 1500 * time.Millisecond // heartbeat_timeout in fastTimeouts
	testDaemonFault(t, func(w *world) { w.signal(2, syscall.SIGSTOP) }, func(w *world) { w.signal(2, syscall.SIGCONT) }, T/2, 2*T+time.Second,
		"(world rank 2) stopped answering")
}

// culprit is how every survivor's error must name the faulty node, in the
// daemon's summary, however the survivor heard of it (itself or by abort).
func testDaemonFault(t *testing.T, fault, heal func(*world), minDetect, maxDetect time.Duration, culprit string) {
	w := startWorld(t, 3, 1, "")
	bs := w.fleet().baselines(0, 1) // the survivors; node 2 may be a new process
	// Trainers of nodes 0 and 1 loop on 1 MiB allreduces until one fails.
	var survivors []*trainer
	for n := 0; n < 2; n++ {
		survivors = append(survivors, w.startTrainer(n, "-mode", "repeat", "-times", "100000", "-count", "262144", "-stop-on-error"))
	}
	victimTrainer := w.startTrainer(2, "-mode", "repeat", "-times", "100000", "-count", "262144", "-stop-on-error")
	time.Sleep(1500 * time.Millisecond)
	faultAt := time.Now()
	fault(w)
	var genBefore uint32 // the newest generation a call succeeded in before the fault
	for i, tr := range survivors {
		evs, err := tr.wait(t, 30*time.Second)
		if err != nil {
			t.Fatalf("trainer on node %d: %v", i, err)
		}
		if len(evs) < 2 {
			t.Fatalf("trainer on node %d: only %d calls before the fault", i, len(evs))
		}
		last := evs[len(evs)-1]
		if last.OK {
			t.Fatalf("trainer on node %d never saw the fault", i)
		}
		for _, e := range evs {
			if e.OK {
				genBefore = max(genBefore, e.Gen)
			}
		}
		if last.Code != "PEER_LOST" && last.Code != "TIMEOUT" {
			t.Errorf("trainer on node %d: code %s, want PEER_LOST or TIMEOUT: %s", i, last.Code, last.Message)
		}
		if !strings.Contains(last.Message, "rank 2") {
			t.Errorf("trainer on node %d: error does not name node rank 2: %s", i, last.Message)
		}
		if !strings.Contains(last.Message, "[node 2 "+w.addrs[2]+" "+culprit) {
			t.Errorf("trainer on node %d: error does not say %q of node 2 at %s: %s", i, culprit, w.addrs[2], last.Message)
		}
		detect := time.Since(faultAt)
		t.Logf("node %d trainer told after at most %v: %s", i, detect.Round(time.Millisecond), last.Message)
		if detect > maxDetect {
			t.Errorf("node %d detection took %v, bound %v", i, detect, maxDetect)
		}
		// The failed call began before the fault and ended with it; it
		// cannot have ended before minDetect after the fault.
		if minDetect > 0 && time.Duration(last.Millis)*time.Millisecond < minDetect {
			t.Errorf("node %d's failed call lasted %dms, less than T/2 = %v after the fault at %v", i, last.Millis, minDetect, faultAt.Format(time.StampMilli))
		}
	}
	heal(w)
	victimTrainer.cmd.Process.Kill()
	var again []*trainer
	for n := 0; n < 3; n++ {
		again = append(again, w.startTrainer(n, "-mode", "repeat", "-times", "3", "-count", "1024", "-timeout", "40s"))
	}
	for i, tr := range again {
		evs, err := tr.wait(t, 60*time.Second)
		if err != nil {
			t.Fatalf("trainer on node %d after healing: %v", i, err)
		}
		okCount := 0
		for _, e := range evs {
			if e.OK {
				okCount++
			}
		}
		if okCount == 0 || !evs[len(evs)-1].OK {
			t.Fatalf("trainer on node %d after healing: %+v", i, evs)
		}
		// The failed generation is not reused: the ring re-formed.
		if g := evs[len(evs)-1].Gen; g <= genBefore {
			t.Errorf("trainer on node %d after healing ran in generation %d, not after the failed generation %d", i, g, genBefore)
		}
	}
	w.fleet().checkBaselines(bs, 20*time.Second)
}

// TestLateTrainerFailsTheFailedCall: collective 0 fails on node 0 (its
// trainers disagree) before node 1's trainers have even attached. When
// they attach and call, that first call is their call of the failed
// collective: it fails with the same cause instead of joining the next
// generation, so every trainer's second call meets in the new one.
func TestLateTrainerFailsTheFailedCall(t *testing.T) {
	w := startWorld(t, 2, 2, "")
	bs := w.fleet().baselines()
	var early []*trainer
	for i := 0; i < 2; i++ {
		early = append(early, w.startTrainer(0, "-mode", "repeat", "-times", "2", "-count", "64", "-count-for", "0=32", "-mismatch-call", "0"))
	}
	waitFor(t, 20*time.Second, "node 0 to fail collective 0", func() bool {
		return strings.Contains(w.log(0), "collective failed") && strings.Contains(w.log(1), "ring formed\" job=e2e node=1 generation=1")
	})
	var late []*trainer
	for i := 0; i < 2; i++ {
		late = append(late, w.startTrainer(1, "-mode", "repeat", "-times", "2", "-count", "64"))
	}
	for i, tr := range append(early, late...) {
		evs, err := tr.wait(t, 60*time.Second)
		if err != nil {
			t.Fatalf("trainer %d: %v", i, err)
		}
		if len(evs) != 2 {
			t.Fatalf("trainer %d: %d events, want 2", i, len(evs))
		}
		if evs[0].OK || evs[0].Code != "MISMATCH" || !strings.Contains(evs[0].Message, "count=32") {
			t.Errorf("trainer %d call 0: ok=%v %s %q; want MISMATCH naming count=32", i, evs[0].OK, evs[0].Code, evs[0].Message)
		}
		if !evs[1].OK || evs[1].Gen == 0 {
			t.Errorf("trainer %d call 1: ok=%v gen=%d %s %s; want success in a new generation", i, evs[1].OK, evs[1].Gen, evs[1].Code, evs[1].Message)
		}
	}
	w.fleet().checkBaselines(bs, 20*time.Second)
}

// TestIdleFailureOwesNothing: a node dies while the ring is idle and is
// restarted; fresh trainers on every node then meet at once, since no
// collective had begun when the ring failed.
func TestIdleFailureOwesNothing(t *testing.T) {
	w := startWorld(t, 2, 1, "")
	bs := w.fleet().baselines(1) // the survivor
	first := w.startTrainers("-mode", "repeat", "-times", "2", "-count", "8")
	for i, tr := range first {
		if evs, err := tr.wait(t, 30*time.Second); err != nil || len(evs) != 2 || !evs[1].OK {
			t.Fatalf("trainer %d before the fault: %v %+v", i, err, evs)
		}
	}
	w.kill(0)
	waitFor(t, 20*time.Second, "node 1 to see its ring fail", func() bool {
		return strings.Contains(w.log(1), "collective failed") || strings.Contains(w.log(1), "ring failed")
	})
	w.startDaemon(0)
	w.waitSocket(0, 20*time.Second)
	for i, tr := range w.startTrainers("-mode", "repeat", "-times", "1", "-count", "8") {
		evs, err := tr.wait(t, 40*time.Second)
		if err != nil || len(evs) != 1 || !evs[0].OK {
			t.Fatalf("fresh trainer %d after an idle failure: %v %+v", i, err, evs)
		}
	}
	w.fleet().checkBaselines(bs, 20*time.Second)
}

// TestTrainerKilledInLane: on nodes of one trainer a small call runs on
// the trainer's session goroutine (the hot lane), which does not read the
// socket meanwhile; a trainer killed while its call waits in the ring is
// still found at once, and the other node's trainer gets TRAINER_LOST
// naming it; a replacement attaches and the world goes on.
func TestTrainerKilledInLane(t *testing.T) {
	w := startWorld(t, 2, 1, "")
	bs := w.fleet().baselines()
	victim := w.startTrainer(0, "-mode", "repeat", "-times", "1", "-count", "16")
	waitFor(t, 10*time.Second, "the victim's call to wait in the ring", func() bool {
		return strings.Contains(w.log(0), "world_rank=0")
	})
	other := w.startTrainer(1, "-mode", "repeat", "-times", "2", "-count", "16", "-pause", "2s")
	time.Sleep(500 * time.Millisecond)
	victim.cmd.Process.Kill()
	waitFor(t, 10*time.Second, "node 0 to fail the collective", func() bool {
		return strings.Contains(w.log(0), "collective failed")
	})
	replacement := w.startTrainer(0, "-mode", "repeat", "-times", "1", "-count", "16", "-pause", "1s")
	evs, err := other.wait(t, 60*time.Second)
	if err != nil || len(evs) != 2 {
		t.Fatalf("node 1 trainer: %v %+v", err, evs)
	}
	if e := evs[0]; e.OK || e.Code != "TRAINER_LOST" || !strings.Contains(e.Message, "world rank 0 (node 0, local rank 0") {
		t.Fatalf("node 1 call 0: ok=%v %s %q, want TRAINER_LOST naming world rank 0", e.OK, e.Code, e.Message)
	}
	if !evs[1].OK {
		t.Fatalf("node 1 call 1 with the replacement: %s %s", evs[1].Code, evs[1].Message)
	}
	if evs, err := replacement.wait(t, 60*time.Second); err != nil || len(evs) != 1 || !evs[0].OK {
		t.Fatalf("replacement: %v %+v", err, evs)
	}
	w.fleet().checkBaselines(bs, 20*time.Second)
}
