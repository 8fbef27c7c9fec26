package ipc

import (
	"net"
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
