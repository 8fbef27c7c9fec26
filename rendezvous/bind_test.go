package rendezvous

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A ring port held by someone else when the node starts (a dial's source
// port, a daemon still dying) is retried: once released, Listen binds it
// and the ring forms.
func TestListenWaitsForPortInUse(t *testing.T) {
	lns, peers := freeListeners(t, 2)
	held := lns[0] // rank 0's port, held by "someone else" for 2s
	cfg := testConfig(t, peers, 0, 1)
	cfg.BindTimeout = 15 * time.Second
	released := make(chan time.Time, 1)
	go func() {
		time.Sleep(2 * time.Second)
		held.Close()
		released <- time.Now()
	}()
	start := time.Now()
	l0, err := Listen(cfg)
	if err != nil {
		<-released
		t.Fatalf("Listen with the port released after 2s of a 15s bind timeout: %v", err)
	}
	defer l0.Close()
	rel := <-released
	if took := time.Since(start); took < 2*time.Second || time.Since(rel) > 2*time.Second {
		t.Errorf("Listen returned after %v, the port was released %v before it returned: want it to wait for the release and bind within 2s of it (if it waited but bound late, the machine is overloaded: rerun with fewer parallel tests)",
			took, time.Since(rel))
	}
	l1, err := NewListener(testConfig(t, peers, 1, 1), lns[1])
	if err != nil {
		t.Fatal(err)
	}
	defer l1.Close()
	gens := []uint32{1, 1}
	links := mustFormAll(t, []*Listener{l0, l1}, gens)
	checkWired(t, peers, links, gens, 1)
}

// A port held past the bind timeout fails Listen with an error that wraps
// EADDRINUSE and names the address and the process holding it (this one).
func TestListenPortInUseTimeout(t *testing.T) {
	lns, peers := freeListeners(t, 2)
	defer lns[0].Close()
	defer lns[1].Close()
	cfg := testConfig(t, peers, 0, 1)
	cfg.BindTimeout = time.Second
	start := time.Now()
	l, err := Listen(cfg)
	if err == nil {
		l.Close()
		t.Fatalf("Listen on %s, a port this test holds, succeeded", peers[0])
	}
	if took := time.Since(start); took < time.Second || took > 10*time.Second {
		t.Errorf("Listen gave up after %v, want about the 1s bind timeout (over 10s: the machine is too slow or overloaded)", took)
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("error does not wrap EADDRINUSE: %v", err)
	}
	me := fmt.Sprintf("LISTEN socket of pid %d (", os.Getpid())
	for _, want := range []string{"rendezvous rank 0", "listen on " + peers[0], "port still in use after", "held by ", me} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// Failures a retry cannot mend return at once.
func TestListenOtherBindErrorsAtOnce(t *testing.T) {
	cfg := testConfig(t, []string{"192.0.2.1:7000", "192.0.2.2:7000"}, 0, 1) // TEST-NET-1: not ours
	cfg.BindTimeout = 30 * time.Second
	start := time.Now()
	l, err := Listen(cfg)
	if err == nil {
		l.Close()
		t.Fatal("Listen on 192.0.2.1, an address this machine does not have, succeeded")
	}
	if !errors.Is(err, syscall.EADDRNOTAVAIL) || !strings.Contains(err.Error(), "listen on 192.0.2.1:7000") {
		t.Errorf("error %v: want EADDRNOTAVAIL naming the address", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("took %v: an address that is not ours was retried", took)
	}
}
