package daemon

import (
	"testing"
	"time"

	"github.com/collectived/collectived/ipc"
)

// A node's attached trainer that had not called when a node elsewhere
// died (a failure this node judged to fail no collective) still owes the
// collective that another node failed, although the next generation
// sees a restarted daemon: it goes on calling, and its next call must not
// meet the other trainers' calls of the collective after.
func TestAttachedTrainerOwesAcrossARestart(t *testing.T) {
	m := newMatcher[int](1)
	m.formed(0, false, false, nil, nil) // the job's first generation
	owner := new(int)
	m.attach(0, owner)
	e := func(int) *ipc.Error { return ipc.Errorf(ipc.CodePeerLost, "peer lost") }
	// The abort reaches this node while none of its trainers had called,
	// not marked begun, and a restart kind (a peer closed): with a
	// trainer attached the node takes it as begun, and the trainer owes.
	m.fail(nil, failure{at: time.Now(), restart: true, err: e, owed: e}, nil)
	if m.finished != 1 || m.owes(0) != 1 {
		t.Fatalf("after the failure: finished %d, owes %d; want 1 and 1", m.finished, m.owes(0))
	}
	// Another node had failed collective 0 too; the dead one restarted
	// fresh. The trainer owes it once, not twice.
	got := m.formed(1, true, false, func(int, uint64) *ipc.Error { return ipc.Errorf(ipc.CodePeerLost, "behind") }, nil)
	if len(got) != 0 || m.owes(0) != 1 || m.finished != 1 {
		t.Fatalf("formed: failed %d calls, owes %d, finished %d; want the attached trainer to owe collective 0 once", len(got), m.owes(0), m.finished)
	}
	if d := m.payDebt(0); d == nil || d.Code != ipc.CodePeerLost {
		t.Fatalf("the trainer's next call: %v, want the owed PEER_LOST", d)
	}
}

// A node with no trainer at a restart joins the world's count: its next
// trainers start afresh and owe nothing.
func TestEmptyNodeJoinsAtARestart(t *testing.T) {
	m := newMatcher[int](2)
	m.formed(0, false, false, nil, nil)
	got := m.formed(5, true, false, func(int, uint64) *ipc.Error { return ipc.Errorf(ipc.CodePeerLost, "behind") }, nil)
	if len(got) != 0 || m.owes(0) != 0 || m.owes(1) != 0 || m.finished != 5 {
		t.Fatalf("failed %d, owes %d/%d, finished %d; want none owed at 5", len(got), m.owes(0), m.owes(1), m.finished)
	}
}

// behind is what formed would owe: 0 for a node that joins the count.
func TestBehind(t *testing.T) {
	m := newMatcher[int](1)
	m.formed(0, false, false, nil, nil)
	if n := m.behind(1<<40, true, false); n != 0 {
		t.Errorf("empty node at a restart: behind %d, want 0 (it joins)", n)
	}
	m.attach(0, new(int))
	if n := m.behind(1<<40, true, false); n != 1<<40 {
		t.Errorf("attached trainer: behind %d, want %d", n, uint64(1)<<40)
	}
	if n := m.behind(0, false, false); n != 0 {
		t.Errorf("ahead of the ring: behind %d, want 0", n)
	}
}

// A restarted daemon's trainers that attach before its first generation
// forms join at the world's count: they owe nothing of the collectives
// the job ran before the daemon existed (e2e TestDaemonKilled, when the
// new trainer wins the race with the formation).
func TestFreshDaemonTrainersJoinTheWorld(t *testing.T) {
	m := newMatcher[int](2)
	m.attach(0, "trainer 0")
	m.attach(1, "trainer 1")
	if b := m.behind(162, true, false); b != 0 {
		t.Fatalf("a fresh daemon's trainers are %d behind, want 0", b)
	}
	failed := m.formed(162, true, false, func(int, uint64) *ipc.Error { return ipc.Errorf(ipc.CodePeerLost, "owed") }, nil)
	if len(failed) != 0 || m.owes(0) != 0 || m.owes(1) != 0 || m.finished != 162 {
		t.Fatalf("formed: %d failed, owes %v %v, finished %d; want none owed at 162", len(failed), m.owes(0), m.owes(1), m.finished)
	}
	// The same node in its next generation is not fresh: attached
	// trainers owe what it missed.
	if b := m.behind(170, true, false); b != 8 {
		t.Fatalf("behind %d after the first generation, want 8", b)
	}
}
