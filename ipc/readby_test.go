package ipc

import (
	"bytes"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// connPair is a client-side Conn and the raw other end of a socketpair.
func connPair(t *testing.T) (*Conn, *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	peer, mine := os.NewFile(uintptr(fds[0]), "peer"), os.NewFile(uintptr(fds[1]), "mine")
	nc, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		t.Fatal(err)
	}
	c := NewConn(nc.(*net.UnixConn), ClientSide)
	t.Cleanup(func() { c.Close(); peer.Close() })
	return c, peer
}

// ReadFrameBy returns a deadline error when nothing comes in time, and a
// frame half read when the deadline passed is completed by the next read:
// the client's waiters hand the connection on after a timeout.
func TestReadFrameByDeadlineKeepsStream(t *testing.T) {
	c, peer := connPair(t)
	if _, err := c.ReadFrameBy(time.Millisecond, time.Now().Add(20*time.Millisecond)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("nothing sent: %v, want a deadline error", err)
	}
	frame := HelloOK{Version: Version, WorldSize: 2, Generation: 7}.Encode(9)
	if _, err := peer.Write(frame[:5]); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadFrameBy(0, time.Now().Add(20*time.Millisecond)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("half a frame: %v, want a deadline error", err)
	}
	if _, err := peer.Write(frame[5:]); err != nil {
		t.Fatal(err)
	}
	f, err := c.ReadFrameBy(200*time.Microsecond, time.Now().Add(5*time.Second))
	if err != nil || f.Type != TypeHelloOK || f.ID != 9 {
		t.Fatalf("the rest of the frame: %v %v id %d", err, f.Type, f.ID)
	}
	if !bytes.Equal(f.Payload, frame[HeaderSize:]) {
		t.Fatalf("payload %x, want %x", f.Payload, frame[HeaderSize:])
	}
	// No deadline is left behind: a later read of a frame already there
	// succeeds however long after.
	time.Sleep(30 * time.Millisecond)
	peer.Write(frame)
	if f, err := c.ReadFrame(); err != nil || f.ID != 9 {
		t.Fatalf("plain read after ReadFrameBy: %v", err)
	}
}

// PeerClosed tells, without reading, that the other end has gone.
func TestPeerClosed(t *testing.T) {
	c, peer := connPair(t)
	if c.PeerClosed() {
		t.Fatal("PeerClosed with the peer connected")
	}
	peer.Close()
	if !c.PeerClosed() {
		t.Fatal("PeerClosed false after the peer closed")
	}
}
