package ipc

import (
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/collectived/collectived/internal/fdtest"
)

// rearmPair is a daemon-side Conn that polls for spin and counts each time
// its read parks (SetOnPark), and the client end writing to it.
func rearmPair(t *testing.T, spin time.Duration) (a, b *Conn, parked chan struct{}) {
	t.Helper()
	ua, ub, err := unixPair(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a, b = NewConn(ua, DaemonSide), NewConn(ub, ClientSide)
	if err := a.EnableRearm(); err != nil {
		t.Fatal(err)
	}
	// CloseSocket, not Close: a reader goroutine may still be in ReadFrame,
	// and only CloseSocket may run beside it.
	t.Cleanup(func() { a.CloseSocket(); b.Close() })
	a.SetSpin(spin)
	parked = make(chan struct{}, 64)
	a.SetOnPark(func() { parked <- struct{}{} })
	return a, b, parked
}

// readEnded is what a ReadFrame running on another goroutine returned,
// waited for at most 10 s.
func readEnded(t *testing.T, got chan error, what string) error {
	t.Helper()
	select {
	case err := <-got:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the read never returned", what)
		return nil
	}
}

func waitParked(t *testing.T, parked chan struct{}, what string) {
	t.Helper()
	select {
	case <-parked:
	case <-time.After(10 * time.Second):
		t.Fatalf("the reader never parked %s", what)
	}
}

// Rearm sends a reader that has parked back to polling: it polls again
// (and parks again when that poll runs out), the deadline Rearm signals
// with never surfaces as an error, and the next frame is read.
func TestRearm(t *testing.T) {
	a, b, parked := rearmPair(t, time.Millisecond)
	got := make(chan error, 1)
	go func() {
		f, err := a.ReadFrame()
		if err == nil && f.ID != 7 {
			err = errors.New("read the wrong frame")
		}
		got <- err
	}()
	waitParked(t, parked, "after its first poll")
	a.Rearm()
	waitParked(t, parked, "after polling again on Rearm")
	select {
	case err := <-got:
		t.Fatalf("ReadFrame returned %v after Rearm, before any frame was sent", err)
	case <-time.After(20 * time.Millisecond):
	}
	if err := b.WriteFrame(AppendEmpty(nil, TypeStatus, 7), -1); err != nil {
		t.Fatal(err)
	}
	if err := readEnded(t, got, "the frame sent after Rearm"); err != nil {
		t.Fatalf("ReadFrame after Rearm: %v", err)
	}
}

// On a connection that does not poll, Rearm does nothing: a real deadline
// still ends the read with os.ErrDeadlineExceeded, named as a read of the
// socket.
func TestRearmWithoutSpin(t *testing.T) {
	a, _, _ := rearmPair(t, 0)
	a.Rearm()
	if err := a.SetReadDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	_, err := a.ReadFrame()
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("ReadFrame past a real deadline: %v, want os.ErrDeadlineExceeded", err)
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "read" || oe.Net != "unix" {
		t.Fatalf("deadline error %v (%T): want a *net.OpError naming the read of the unix socket", err, err)
	}
}

// Waking a parked reader with Rearm and reading the next frame allocates
// nothing: the daemon does it after every long call.
func TestRearmAllocs(t *testing.T) {
	a, b, parked := rearmPair(t, 200*time.Microsecond)
	frame := AppendEmpty(nil, TypeStatus, 1)
	read := make(chan error, 1)
	go func() {
		for {
			_, err := a.ReadFrame()
			read <- err
			if err != nil {
				return
			}
		}
	}()
	cycle := func() {
		<-parked
		a.Rearm()
		<-parked // polled again, and parked again
		if err := b.WriteFrame(frame, -1); err != nil {
			t.Error(err)
		}
		if err := <-read; err != nil {
			t.Error(err)
		}
	}
	cycle() // the first Rearm creates the deadline's timer
	if n := testing.AllocsPerRun(100, cycle); n != 0 {
		t.Fatalf("Rearm and a frame read: %.1f allocations per cycle, want 0", n)
	}
}

// Rearms racing with a reader that keeps reading never turn into a read
// error: each signal is taken whole or left whole for the next park.
func TestRearmRacesReads(t *testing.T) {
	a, b, parked := rearmPair(t, 50*time.Microsecond)
	go func() {
		for range parked {
		}
	}()
	const frames = 2000
	done := make(chan error, 1)
	go func() {
		for i := 0; i < frames; i++ {
			if _, err := a.ReadFrame(); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				a.Rearm()
				time.Sleep(time.Duration(len(stop)) * time.Microsecond)
			}
		}
	}()
	frame := AppendEmpty(nil, TypeStatus, 1)
	for i := 0; i < frames; i++ {
		if err := b.WriteFrame(frame, -1); err != nil {
			t.Fatal(err)
		}
		if i%100 == 0 {
			time.Sleep(time.Millisecond) // let the reader park now and then
		}
	}
	err := <-done
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("a read failed while Rearm raced it: %v", err)
	}
}

// CloseSocket wakes a read parked on the reading fd, with an error that
// matches net.ErrClosed as a closed net.Conn's would.
func TestCloseWakesParkedRead(t *testing.T) {
	a, _, parked := rearmPair(t, 100*time.Microsecond)
	got := make(chan error, 1)
	go func() {
		_, err := a.ReadFrame()
		got <- err
	}()
	waitParked(t, parked, "before Close")
	a.CloseSocket()
	if err := readEnded(t, got, "CloseSocket"); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("parked ReadFrame after CloseSocket: %v, want net.ErrClosed", err)
	}
}

// A session re-arms its reader's poll after answering a call of
// ServerConfig.RearmMinBytes or more. With 0 (a daemon serving several
// trainers) even a small call's answer sends the parked reader back to
// polling, so it parks once more with no frame in between; with the
// default a small answer leaves it parked.
func TestSessionRearmsAfterAnswer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		min    uint64
		rearms bool
	}{
		{"every call", 0, true},
		{"default, small call", DefaultRearmMinBytes, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, h := startServer(t, func(c *ServerConfig) {
				c.Spin = 2 * time.Millisecond
				c.RearmMinBytes = tc.min
			})
			parked := make(chan struct{}, 64)
			h.mu.Lock()
			h.onPark = parked
			h.mu.Unlock()
			c := dial(t, srv.Path())
			c.attach()
			waitParked(t, parked, "after the handshake")
			h.setHold()
			call := Call{Desc: descInt32(2, ""), Data: make([]byte, 8)}
			c.send(call.Encode(c.id()), -1)
			waitParked(t, parked, "while its call was held")
			h.release()
			if f := c.read(); f.Type != TypeCallOK {
				t.Fatalf("answer: %s %v", f.Type, c.errorOf(f))
			}
			select {
			case <-parked:
				if !tc.rearms {
					t.Fatalf("the reader polled and parked again after an 8-byte answer with RearmMinBytes %d", tc.min)
				}
			case <-time.After(300 * time.Millisecond):
				if tc.rearms {
					t.Fatal("the reader stayed parked after the answer: RearmMinBytes 0 should have re-armed its poll")
				}
			}
		})
	}
}

// With the process out of fds, EnableRearm fails naming the duplicate it
// could not open and the cause, and leaves the Conn as it was: frames
// are still read and written through the one fd, Rearm does nothing, and
// a real deadline still ends a read. A daemon's session logs the error
// and goes on without re-armed polls.
func TestEnableRearmOutOfFDs(t *testing.T) {
	a, b := sidesPair(t)
	a.SetSpin(200 * time.Microsecond)

	release, err := fdtest.Exhaust()
	if err != nil {
		t.Fatal(err)
	}
	err = a.EnableRearm()
	release()
	if !errors.Is(err, syscall.EMFILE) || !strings.Contains(err.Error(), "duplicate the socket's fd for reading") {
		t.Fatalf("EnableRearm with no fd free: %v, want EMFILE naming the socket's duplicate fd", err)
	}

	a.Rearm()
	if err := b.WriteFrame(AppendEmpty(nil, TypeStatus, 7), -1); err != nil {
		t.Fatal(err)
	}
	if f, err := a.ReadFrame(); err != nil || f.ID != 7 {
		t.Fatalf("ReadFrame after a failed EnableRearm: frame %d, %v; want frame 7", f.ID, err)
	}
	if err := a.WriteFrame(AppendEmpty(nil, TypeFreeOK, 8), -1); err != nil {
		t.Fatalf("WriteFrame after a failed EnableRearm: %v", err)
	}
	if f, err := b.ReadFrame(); err != nil || f.ID != 8 {
		t.Fatalf("the client read frame %d, %v; want frame 8", f.ID, err)
	}
	if err := a.SetReadDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ReadFrame(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("ReadFrame past a deadline after a failed EnableRearm: %v, want os.ErrDeadlineExceeded", err)
	}
}
