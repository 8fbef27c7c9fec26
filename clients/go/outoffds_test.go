package collectived_test

import (
	"strings"
	"testing"

	"github.com/collectived/collectived/internal/fdtest"
)

// A trainer whose fd table is full cannot receive ALLOC_OK's fd (the
// daemon, in this process too, takes the one fd left for the segment):
// Alloc fails saying this process is out of file descriptors, not that
// the daemon sent too many, and a new client works once fds are free.
func TestAllocWhileOutOfFDs(t *testing.T) {
	c := dial(t)
	release, err := fdtest.ExhaustLeaving(1)
	if err != nil {
		t.Fatal(err)
	}
	seg, err := c.Alloc(1 << 20)
	release()
	if err == nil {
		seg.Free()
		t.Fatal("Alloc with no fd free for the segment succeeded")
	}
	if !strings.Contains(err.Error(), "its fd could not be received: this process is out of file descriptors") {
		t.Fatalf("Alloc with no fd free: %v; want it to say this process is out of file descriptors", err)
	}
	c.Close()
	seg, err = dial(t).Alloc(1 << 20)
	if err != nil {
		t.Fatalf("Alloc on a new client once fds are free: %v", err)
	}
	seg.Free()
}
