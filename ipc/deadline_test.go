package ipc

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// A write timeout set for a while (the client's HELLO) and then turned off
// must not leave its deadline behind: writes after the old deadline still
// go through. (Every Go client connection used to break DialTimeout after
// it was made.)
func TestWriteTimeoutOffClearsDeadline(t *testing.T) {
	a, b, err := unixPair(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	c := NewConn(a, ClientSide)
	c.SetWriteTimeout(50 * time.Millisecond)
	if err := c.WriteFrame(AppendEmpty(nil, TypeStatus, 1), -1); err != nil {
		t.Fatal(err)
	}
	c.SetWriteTimeout(0)
	time.Sleep(100 * time.Millisecond) // past the deadline the first write set
	if err := c.WriteFrame(AppendEmpty(nil, TypeStatus, 2), -1); err != nil {
		t.Fatalf("write after the timeout was turned off: %v", err)
	}
	// With the timeout on, a peer that stops reading still bounds the write.
	c.SetWriteTimeout(50 * time.Millisecond)
	big := make([]byte, 8<<20)
	if err := c.WriteFrame(big, -1); err == nil {
		t.Fatal("an 8 MiB write to a peer that never reads succeeded within the write timeout")
	}
}

func unixPair(dir string) (*net.UnixConn, *net.UnixConn, error) {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: dir + "/p.sock", Net: "unix"})
	if err != nil {
		return nil, nil, err
	}
	defer l.Close()
	a, err := net.DialUnix("unix", nil, l.Addr().(*net.UnixAddr))
	if err != nil {
		return nil, nil, err
	}
	b, err := l.AcceptUnix()
	if err != nil {
		a.Close()
		return nil, nil, err
	}
	return a, b, nil
}

// Rearm wakes a reader parked after its poll ran out and sends it back to
// polling: the read goes on, without the deadline Rearm signals with
// surfacing as an error, and the next frame arrives. On a connection that
// does not poll, Rearm does nothing; a real deadline still fails the read.
func TestRearm(t *testing.T) {
	a, b := connPair(t)
	a.SetSpin(time.Millisecond)
	got := make(chan error, 1)
	go func() {
		_, err := a.ReadFrame()
		got <- err
	}()
	time.Sleep(50 * time.Millisecond) // the poll has run out: parked
	a.Rearm()
	time.Sleep(50 * time.Millisecond)
	select {
	case err := <-got:
		t.Fatalf("ReadFrame returned %v after Rearm, before any frame was sent", err)
	default:
	}
	if err := b.WriteFrame(AppendEmpty(nil, TypeStatus, 7), -1); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("ReadFrame after Rearm: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the frame sent after Rearm was never read")
	}

	c, _ := connPair(t)
	c.Rearm() // spin 0: no-op
	if err := c.SetReadDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadFrame(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("ReadFrame past a real deadline: %v, want os.ErrDeadlineExceeded", err)
	}
}

// connPair is a connected daemon-side and client-side Conn, closed with
// the test.
func connPair(t *testing.T) (daemon, client *Conn) {
	t.Helper()
	ua, ub, err := unixPair(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ua.Close(); ub.Close() })
	return NewConn(ua, DaemonSide), NewConn(ub, ClientSide)
}
