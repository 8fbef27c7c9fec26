package e2e

import (
	"crypto/rand"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// slotHolders is how many unauthenticated handshakes the attacker below
// keeps open at once: twice the handshake slots a daemon gives the prev
// peer's address (rendezvous.DefaultConfig().MaxPending), so that it
// always holds every one of them and still has more waiting.
const slotHolders = 2 * 64

// slotAttack connects, from inside network namespace netns, to addr over
// and over, keeping `holders` connections open at once: half send a
// hello that passes every check but can never be proven (it has no
// token), half send nothing. Each is read until the daemon closes it and
// replaced at once.
type slotAttack struct {
	stop    chan struct{}
	wg      sync.WaitGroup
	opened  atomic.Int64
	dialErr atomic.Value
}

func startSlotAttack(t *testing.T, c *cluster, netns, addr string, holders int) *slotAttack {
	t.Helper()
	a := &slotAttack{stop: make(chan struct{})}
	sem := make(chan struct{}, holders)
	tmpl := c.validHello(0)
	ready := make(chan error, 4)
	// The sockets must be made on a thread inside the namespace; once
	// made they work from any goroutine.
	for d := 0; d < 4; d++ {
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			// The thread goes back to its own namespace at the end rather
			// than ending with the goroutine: it may be the one that
			// started a daemon, whose parent-death signal would kill it.
			runtime.LockOSThread()
			home, err := os.Open("/proc/thread-self/ns/net")
			if err != nil {
				runtime.UnlockOSThread()
				ready <- err
				return
			}
			defer home.Close()
			f, err := os.Open("/run/netns/" + netns)
			if err != nil {
				runtime.UnlockOSThread()
				ready <- err
				return
			}
			err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
			f.Close()
			ready <- err
			if err != nil {
				runtime.UnlockOSThread()
				return
			}
			defer func() {
				if unix.Setns(int(home.Fd()), unix.CLONE_NEWNET) == nil {
					runtime.UnlockOSThread()
				} // else the thread ends with the goroutine
			}()
			dialer := net.Dialer{Timeout: 2 * time.Second}
			for i := 0; ; i++ {
				select {
				case <-a.stop:
					return
				case sem <- struct{}{}:
				}
				conn, err := dialer.Dial("tcp", addr)
				if err != nil {
					a.dialErr.Store(err)
					<-sem
					time.Sleep(time.Millisecond)
					continue
				}
				a.opened.Add(1)
				if i%2 == 0 {
					h := tmpl
					rand.Read(h.nonce[:])
					conn.Write(h.frame())
				}
				a.wg.Add(1)
				go func() {
					defer a.wg.Done()
					defer func() { <-sem }()
					go func() { <-a.stop; conn.Close() }()
					io.Copy(io.Discard, conn)
					conn.Close()
				}()
			}
		}()
	}
	for range 4 {
		if err := <-ready; err != nil {
			close(a.stop)
			a.wg.Wait()
			t.Fatalf("slot attack in %s: %v", netns, err)
		}
	}
	t.Cleanup(a.end)
	return a
}

func (a *slotAttack) end() {
	select {
	case <-a.stop:
		return
	default:
	}
	close(a.stop)
	a.wg.Wait()
}

// TestNetnsHandshakeSlotsHeld: an attacker on node 0's own address (it
// runs in node 0's namespace) keeps more unauthenticated handshakes open
// to node 1's ring port than node 1 has slots for, replacing each the
// moment it ends, half of them with a hello that passes every check but
// the proof. Node 0's daemon is then restarted: node 1 must take the
// genuine node 0's streams (which complete the HMAC proof) while the
// attack goes on, and the ring re-forms in a new generation and runs an
// allreduce. Before the fix the attacker held all 8 slots and the ring
// stayed down as long as the attack ran.
func TestNetnsHandshakeSlotsHeld(t *testing.T) {
	c := newNetCluster(t, 2, 1)
	c.startAll()
	gen := c.fleet().waitUp(1, 0, 30*time.Second).Ring.Generation
	a := startSlotAttack(t, c, c.netns[0], c.addrs[1], slotHolders)
	waitFor(t, 20*time.Second, "the attacker to open its connections", func() bool { return a.opened.Load() >= slotHolders })

	c.kill(0)
	c.startDaemon(0)
	// timeouts.connect is 20s (fastTimeouts): three formations' worth.
	st := c.fleet().waitUp(1, gen+1, 60*time.Second)
	c.fleet().waitUp(0, st.Ring.Generation, 60*time.Second)
	t.Logf("ring re-formed in generation %d while the attacker had opened %d connections from node 0's address",
		st.Ring.Generation, a.opened.Load())
	trs := []*ftProc{c.startFT(0, "-mode", "loop", "-until-ok", "2", "-max-fails", "1"), c.startFT(1, "-mode", "loop", "-until-ok", "2", "-max-fails", "1")}
	for i, p := range trs {
		evs, err := p.wait(60 * time.Second)
		if err != nil || len(evs) != 2 || !evs[1].OK {
			t.Fatalf("trainer on node %d during the attack: %v %+v", i, err, evs)
		}
	}
	opened := a.opened.Load()
	a.end()
	if err, _ := a.dialErr.Load().(error); err != nil {
		t.Logf("the attacker's last failed dial: %v", err)
	}
	ring, _ := refusals(t, c.sockets[1])
	t.Logf("the attacker opened %d connections; node 1 counts %d refusals: %v", opened, ring.Total, ring.Reasons)
	if ring.Total == 0 {
		t.Fatalf("node 1 counted no refusals of the attacker's %d connections", opened)
	}
}
