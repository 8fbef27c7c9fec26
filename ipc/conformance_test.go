package ipc

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A CALL that comes with an fd fails itself, before it reaches the core:
// the core never sees the call, so it never joins a collective.
func TestCallWithFdNeverReachesTheCore(t *testing.T) {
	srv, h := startServer(t, nil)
	h.setHold()
	base := openFds(t)
	c := dial(t, srv.Path())
	c.attach()
	fd := memfd(t, 4096, unix.F_SEAL_SHRINK)
	c.send((&Call{Desc: descInt32(1, ""), Data: make([]byte, 4)}).Encode(9), fd)
	unix.Close(fd)
	f := c.read()
	if f.ID != 9 {
		t.Errorf("ERROR carries id %d, want the CALL's 9", f.ID)
	}
	c.expectError(f, CodeBadFD, true, "CALL (id 9) arrived with 1 fd(s) and carries none")
	if ev := h.waitGone(t); !strings.Contains(ev.cause.Error(), "CALL (id 9)") {
		t.Errorf("Disconnected cause %v", ev.cause)
	}
	h.mu.Lock()
	held := len(h.held)
	h.mu.Unlock()
	if held != 0 {
		t.Errorf("the core got %d call(s); a frame with a stray fd must not be acted on", held)
	}
	c.c.Close()
	waitFds(t, base)
}
