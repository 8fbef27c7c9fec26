package main

import (
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pacedPair is a pacing side of one process whose end this test plays.
func pacedPair(t *testing.T) (*pacedSide, net.Conn) {
	t.Helper()
	s, err := newPacedSide("ring-only", 1, func(i int) string { return "ring rank 0" })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	s.state = func(int, time.Duration) (bool, string) { return true, "its log ends: boom" }
	kid, err := net.FileConn(s.kids[0])
	if err != nil {
		t.Fatal(err)
	}
	s.closeChildEnds()
	t.Cleanup(func() { kid.Close() })
	return s, kid
}

// A paced process runs its prewarm, checked call and warmup as one block and its
// timed calls in blocks of --pace-block, each only after the parent's
// go-ahead, and reports each block over.
func TestPacedMeasureTakesTurns(t *testing.T) {
	s, kidConn := pacedPair(t)
	f, err := kidConn.(*net.UnixConn).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pace, err := openPacer(f.Fd(), 2, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer pace.c.Close()
	calls := make(chan struct{}, 16) // one per call, sent before the block is reported over
	done := make(chan error, 1)
	go func() {
		call := func() error {
			calls <- struct{}{}
			return nil
		}
		m := f32sum(make([]byte, 8), 1, 5, 1)
		m.pace, m.call = pace, call
		m.prewarm = prewarmer(3, call)
		_, err := m.run()
		done <- err
	}()
	deadline := time.Now().Add(time.Minute)
	made := 0
	// 3 prewarm calls, the checked call and 1 warmup, then timed blocks of
	// 2, 2 and 1, each after an untimed call.
	for step, want := range []int{5, 8, 11, 13} {
		select {
		case <-calls:
			t.Fatalf("a call ran before the go-ahead of step %d", step)
		case <-time.After(20 * time.Millisecond):
		}
		if err := s.step(deadline, 8, step-1); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		for len(calls) > 0 {
			<-calls
			made++
		}
		if made != want {
			t.Fatalf("after step %d: %d calls made, want %d", step, made, want)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// What goes wrong on a pacing socket is named: which side, which process,
// which size and block, and what the process left behind.
func TestPacedSideErrors(t *testing.T) {
	deadline := time.Now().Add(time.Minute)
	s, kid := pacedPair(t)
	go func() {
		var b [1]byte
		kid.Read(b[:])
		kid.Write([]byte{'x'})
	}()
	err := s.step(deadline, 64, 2)
	if err == nil || !strings.Contains(err.Error(), "ring-only, ring rank 0, 64 bytes, block 3: sent 'x' on its pacing socket, want 'd'; its log ends: boom") {
		t.Fatalf("a process answering 'x': %v", err)
	}

	s, kid = pacedPair(t)
	kid.Close()
	err = s.step(deadline, 4, -1)
	if err == nil || !strings.Contains(err.Error(), "ring-only, ring rank 0, 4 bytes, checked call and warmup: it closed its pacing socket; its log ends: boom") {
		t.Fatalf("a process that has ended: %v", err)
	}

	s, _ = pacedPair(t)
	err = s.step(time.Now().Add(50*time.Millisecond), 4, 0)
	if err == nil || !strings.Contains(err.Error(), "block 1: ") || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("a process that never answers: %v", err)
	}
}

// A paced process refuses bad pacing flags and a bad fd by name, and a
// parent that sends something else than the go-ahead, or nothing in time.
func TestPacerErrors(t *testing.T) {
	if p, err := openPacer(paceFD, 0, time.Second); p != nil || err != nil {
		t.Fatalf("--pace-block 0: %v %v, want no pacer", p, err)
	}
	if _, err := openPacer(paceFD, -1, time.Second); err == nil || !strings.Contains(err.Error(), "--pace-block -1: want 0 (not paced) or more") {
		t.Fatalf("--pace-block -1: %v", err)
	}
	if _, err := openPacer(paceFD, 1, 0); err == nil || !strings.Contains(err.Error(), "--pace-timeout 0s: want more than 0") {
		t.Fatalf("--pace-timeout 0: %v", err)
	}
	f, err := os.CreateTemp(t.TempDir(), "notasocket")
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Dup(int(f.Fd()))
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := openPacer(uintptr(fd), 1, time.Second); err == nil || !strings.Contains(err.Error(), "is not the pacing socket") {
		t.Fatalf("a regular file as the pacing fd: %v", err)
	}

	open := func(timeout time.Duration) (*pacer, net.Conn) {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		p, err := openPacer(uintptr(fds[0]), 1, timeout)
		if err != nil {
			t.Fatal(err)
		}
		pf := os.NewFile(uintptr(fds[1]), "parent")
		parent, err := net.FileConn(pf)
		pf.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.c.Close(); parent.Close() })
		return p, parent
	}
	p, parent := open(time.Minute)
	parent.Write([]byte{'q'})
	if err := p.wait(); err == nil || !strings.Contains(err.Error(), "the parent sent 'q', want 'g'") {
		t.Fatalf("a parent sending 'q': %v", err)
	}
	p, _ = open(50 * time.Millisecond)
	if err := p.wait(); err == nil || !strings.Contains(err.Error(), "waiting for the go-ahead") || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("a parent saying nothing: %v", err)
	}
	p, parent = open(time.Minute)
	parent.Close()
	if err := p.wait(); err == nil || !strings.Contains(err.Error(), "waiting for the go-ahead: EOF") {
		t.Fatalf("a parent gone: %v", err)
	}
}

// The two sides take turns, and which goes first alternates: the ring
// engines for the warmup, then the daemons, the ring engines, ...
func TestTurnOrder(t *testing.T) {
	first := map[int]int{}
	for b := -1; b < 6; b++ {
		o := turnOrder(b)
		if o[0] == o[1] || o[0] < 0 || o[0] > 1 || o[1] < 0 || o[1] > 1 {
			t.Fatalf("turnOrder(%d) = %v: want both sides once", b, o)
		}
		if b >= 0 {
			first[o[0]]++
		}
		if b > -1 && o == turnOrder(b-1) {
			t.Fatalf("blocks %d and %d start with the same side %d", b-1, b, o[0])
		}
	}
	if first[0] != 3 || first[1] != 3 {
		t.Fatalf("sides first in six timed blocks: %v, want 3 each", first)
	}
}

func TestBlockMediansAndPairedRatio(t *testing.T) {
	got := blockMedians([]int64{1000, 3000, 2000, 8000, 4000}, 2)
	if want := []float64{2, 5, 4}; !slices.Equal(got, want) {
		t.Fatalf("blockMedians = %v, want %v (µs; the last block short)", got, want)
	}
	for _, tc := range []struct {
		a, b []float64
		want float64
	}{
		{nil, nil, 0},
		{[]float64{2}, []float64{1}, 2},
		{[]float64{1, 3, 6}, []float64{1, 2, 2}, 1.5},        // ratios 1, 1.5, 3
		{[]float64{1, 3, 6, 8}, []float64{1, 2, 2, 2}, 2.25}, // 1, 1.5, 3, 4: the middle two
		{[]float64{4, 4, 4}, []float64{2, 2}, 2},             // only blocks both have
	} {
		if got := pairedRatio(tc.a, tc.b); got != tc.want {
			t.Errorf("pairedRatio(%v, %v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}
