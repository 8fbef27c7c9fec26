package e2e

import (
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The fault tests below run a world of 4 nodes x 2 trainers, each node's
// daemon and trainers in a network namespace of their own (10.77.0.1-4,
// joined by veths to a bridge in a fifth namespace), and break it the way
// a cluster breaks: a daemon killed or frozen, a node cut off, a slow and
// lossy link, a trainer killed holding shared memory. Each checks who
// learns what and when, that the world recovers in a new generation, and
// that every surviving daemon's goroutines, fds, memfds and RSS return to
// their baseline.

const (
	netNodes = 4
	netLocal = 2
	// loopCount is the trainers' allreduce size: 1 MiB of float32, large
	// enough to use the ring's pipelined path and a shared segment.
	loopCount = "262144"
)

// hbTimeout is heartbeat_timeout in fastTimeouts: T in the [T/2, 2T]
// detection bound of silent faults.
var hbTimeout = func() time.Duration {
	m := regexp.MustCompile(`heartbeat_timeout: (\S+)`).FindStringSubmatch(fastTimeouts)
	if m == nil {
		panic("fastTimeouts sets no heartbeat_timeout")
	}
	d, err := time.ParseDuration(m[1])
	if err != nil {
		panic(err)
	}
	return d
}()

// daemonFault describes one daemon fault test.
type daemonFault struct {
	victim    int
	fault     func(c *cluster)
	heal      func(c *cluster)
	restarted bool // heal starts a new daemon: the victim has no baseline
	minDetect time.Duration
	maxDetect time.Duration
	wantCodes []string
}

// TestNetnsDaemonKilled: kill -9 one daemon mid-allreduce; every trainer
// on every other node gets an error naming the dead node within 2 s; the
// daemon restarted, the ring re-forms in a new generation and the same
// trainers' next calls succeed.
func TestNetnsDaemonKilled(t *testing.T) {
	runDaemonFault(t, daemonFault{
		victim:    2,
		fault:     func(c *cluster) { c.kill(2) },
		heal:      func(c *cluster) { c.startDaemon(2) },
		restarted: true,
		maxDetect: 2 * time.Second,
		wantCodes: []string{"PEER_LOST"},
	})
}

// TestNetnsDaemonStopped: SIGSTOP one daemon. Its TCP connections stay
// open (its kernel still acknowledges), so only the missing heartbeats
// tell: every other node's trainers fail within [T/2, 2T] of the
// heartbeat timeout T. After SIGCONT the world re-forms.
func TestNetnsDaemonStopped(t *testing.T) {
	runDaemonFault(t, daemonFault{
		victim:    1,
		fault:     func(c *cluster) { c.signal(1, syscall.SIGSTOP) },
		heal:      func(c *cluster) { c.signal(1, syscall.SIGCONT) },
		minDetect: hbTimeout / 2,
		maxDetect: 2 * hbTimeout,
		wantCodes: []string{"PEER_LOST", "TIMEOUT"},
	})
}

// TestNetnsPartition: a silent partition. iptables in node 3's namespace
// drops everything in and out on its link, with no RST or ICMP: the others
// fail within [T/2, 2T]; once the rules are removed the world re-forms.
func TestNetnsPartition(t *testing.T) {
	requireNetns(t)
	requireIptables(t)
	rules := [][]string{{"INPUT", "-i", "eth0", "-j", "DROP"}, {"OUTPUT", "-o", "eth0", "-j", "DROP"}}
	runDaemonFault(t, daemonFault{
		victim: 3,
		fault: func(c *cluster) {
			for _, r := range rules {
				c.iptables(3, append([]string{"-I"}, r...)...)
			}
		},
		heal: func(c *cluster) {
			for _, r := range rules {
				c.iptables(3, append([]string{"-D"}, r...)...)
			}
		},
		minDetect: hbTimeout / 2,
		maxDetect: 2 * hbTimeout,
		wantCodes: []string{"PEER_LOST", "TIMEOUT"},
	})
}

func runDaemonFault(t *testing.T, f daemonFault) {
	c := newNetCluster(t, netNodes, netLocal)
	c.startAll()
	bs := c.fleet().baselines()
	// Every trainer loops on 1 MiB allreduces; after the fault each goes
	// on until 3 calls in a row succeed in the re-formed ring.
	loopArgs := []string{"-mode", "loop", "-count", loopCount, "-until-ok", "3", "-need-fail", "-max-fails", "4"}
	var trs []*ftProc
	for n := 0; n < netNodes; n++ {
		for l := 0; l < netLocal; l++ {
			trs = append(trs, c.startFT(n, loopArgs...))
		}
	}
	waitFor(t, 60*time.Second, "every trainer to complete 2 calls", func() bool {
		for _, p := range trs {
			if len(p.events()) < 2 {
				return false
			}
		}
		return true
	})
	preGen := trs[0].events()[0].Gen
	victimName := fmt.Sprintf("rank %d", f.victim)
	victimAddr := c.addrs[f.victim]

	faultAt := time.Now()
	f.fault(c)
	var minD, maxD time.Duration
	first := true
	for i, p := range trs {
		if p.node == f.victim {
			continue
		}
		var fe ftEvent
		waitFor(t, f.maxDetect+10*time.Second, fmt.Sprintf("trainer %d on node %d to see the fault", i, p.node), func() bool {
			var ok bool
			fe, ok = firstFailure(p.events())
			return ok
		})
		d := fe.end().Sub(faultAt)
		if first || d < minD {
			minD = d
		}
		if first || d > maxD {
			maxD = d
		}
		first = false
		t.Logf("trainer %d (world rank %d, node %d) told after %v: %s %s", i, fe.Rank, p.node, d.Round(time.Millisecond), fe.Code, fe.Message)
		if !containsAny(fe.Code, f.wantCodes) {
			t.Errorf("trainer %d on node %d: code %s, want one of %v: %s", i, p.node, fe.Code, f.wantCodes, fe.Message)
		}
		if !strings.Contains(fe.Message, victimName) && !strings.Contains(fe.Message, victimAddr) {
			t.Errorf("trainer %d on node %d: error names neither %q nor %s: %s", i, p.node, victimName, victimAddr, fe.Message)
		}
		if d > f.maxDetect || d < f.minDetect {
			t.Errorf("trainer %d on node %d learnt of the fault after %v, want within [%v, %v]", i, p.node, d, f.minDetect, f.maxDetect)
		}
	}
	t.Logf("detection after the fault: min %v, max %v (bound [%v, %v])", minD.Round(time.Millisecond), maxD.Round(time.Millisecond), f.minDetect, f.maxDetect)

	f.heal(c)
	if f.restarted {
		// The dead daemon's trainers lost their connection; new ones
		// take their places and join the re-formed ring's first call.
		c.fleet().waitUp(f.victim, preGen+1, 30*time.Second)
		for l := 0; l < netLocal; l++ {
			trs = append(trs, c.startFT(f.victim, "-mode", "loop", "-count", loopCount, "-until-ok", "3", "-max-fails", "3"))
		}
	}
	for i, p := range trs {
		evs, err := p.wait(90 * time.Second)
		if p.node == f.victim && f.restarted && i < netNodes*netLocal {
			continue // killed with their daemon
		}
		if err != nil {
			t.Fatalf("trainer %d on node %d: %v; events %+v", i, p.node, err, evs)
		}
		if len(evs) < 3 {
			t.Fatalf("trainer %d on node %d: %d events, want at least 3: %+v", i, p.node, len(evs), evs)
		}
		for _, e := range evs[len(evs)-3:] {
			if !e.OK {
				t.Fatalf("trainer %d on node %d: no 3 successes in a row after healing: %+v", i, p.node, evs)
			}
			if e.Gen <= preGen {
				t.Errorf("trainer %d on node %d: call %d after healing ran in generation %d, not after the failed %d", i, p.node, e.Call, e.Gen, preGen)
			}
		}
	}
	var keep []baseline
	for _, b := range bs {
		if !(f.restarted && b.node == f.victim) {
			keep = append(keep, b)
		}
	}
	c.fleet().checkBaselines(keep, 20*time.Second)
}

func containsAny(s string, subs []string) bool {
	for _, x := range subs {
		if strings.Contains(s, x) {
			return true
		}
	}
	return false
}

// TestNetnsTrainerKilledHoldingShm: a trainer holding three 1 MiB shared
// segments (one used in a collective) is killed -9 while the other seven
// wait for it in the next collective. Its daemon closes the segments
// (memfds back to baseline) and every other trainer, on every node, gets
// TRAINER_LOST naming its world rank; a replacement attaches and the
// world goes on.
func TestNetnsTrainerKilledHoldingShm(t *testing.T) {
	c := newNetCluster(t, netNodes, netLocal)
	c.startAll()
	bs := c.fleet().baselines()
	const node, segs = 1, 3
	// 512 float32s (2 KiB) go inline: the others hold no segment of their
	// own, so the daemon's memfds are the holder's alone.
	loopArgs := []string{"-mode", "loop", "-count", "512", "-until-ok", "2", "-need-fail", "-max-fails", "3"}
	var trs []*ftProc
	for n := 0; n < netNodes; n++ {
		locals := netLocal
		if n == node {
			locals-- // the holder takes the other local rank
		}
		for l := 0; l < locals; l++ {
			trs = append(trs, c.startFT(n, loopArgs...))
		}
	}
	holder := c.startFT(node, "-mode", "hold", "-segments", fmt.Sprint(segs), "-segment-bytes", fmt.Sprint(1<<20), "-count", "512", "-hold-calls", "1")
	var held ftEvent
	waitFor(t, 60*time.Second, "the holder to hold its segments", func() bool {
		for _, e := range holder.events() {
			if e.Held > 0 {
				held = e
				return true
			}
		}
		return false
	})
	st, err := c.status(node)
	if err != nil {
		t.Fatal(err)
	}
	// Go trainers attach with a lane each (protocol version 2), one memfd
	// more per trainer.
	if lanes := st.lanes(); lanes != netLocal {
		t.Fatalf("daemon %d: %d of its %d trainers have a lane, want all", node, lanes, netLocal)
	}
	if want := bs[node].ps.Memfds + segs + netLocal; st.Process.Memfds != want {
		t.Fatalf("daemon %d holds %d memfds while the holder has %d segments and %d trainers a lane each, want %d", node, st.Process.Memfds, segs, netLocal, want)
	}
	killedAt := time.Now()
	holder.cmd.Process.Kill()
	victim := fmt.Sprintf("world rank %d", held.Rank)
	var maxD time.Duration
	for i, p := range trs {
		var fe ftEvent
		waitFor(t, 30*time.Second, fmt.Sprintf("trainer %d on node %d to learn of the loss", i, p.node), func() bool {
			var ok bool
			fe, ok = firstFailure(p.events())
			return ok
		})
		if fe.Code != "TRAINER_LOST" || !strings.Contains(fe.Message, victim) {
			t.Errorf("trainer %d on node %d: %s %q; want TRAINER_LOST naming %s", i, p.node, fe.Code, fe.Message, victim)
		}
		maxD = max(maxD, fe.end().Sub(killedAt))
	}
	t.Logf("all 7 trainers told of %s's death within %v", victim, maxD.Round(time.Millisecond))
	waitFor(t, 10*time.Second, fmt.Sprintf("daemon %d to close the dead trainer's segments and free its rank", node), func() bool {
		st, err := c.status(node)
		if err != nil || st.Process.Memfds != bs[node].ps.Memfds+st.lanes() {
			return false
		}
		attached := 0
		for _, tr := range st.Trainers {
			if tr.Attached {
				attached++
			}
		}
		return attached == netLocal-1
	})
	trs = append(trs, c.startFT(node, "-mode", "loop", "-count", "512", "-until-ok", "2", "-max-fails", "2"))
	for i, p := range trs {
		evs, err := p.wait(60 * time.Second)
		if err != nil {
			t.Fatalf("trainer %d on node %d: %v", i, p.node, err)
		}
		if len(evs) < 2 || !evs[len(evs)-1].OK || !evs[len(evs)-2].OK {
			t.Fatalf("trainer %d on node %d did not recover: %+v", i, p.node, evs)
		}
	}
	c.fleet().checkBaselines(bs, 20*time.Second)
}
