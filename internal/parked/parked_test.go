package parked

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// sleeping is how many readers are on the set.
func sleeping() int { return int(set.n.Load()) }

// pollNow is Poll without its rate limit: the tests look when they mean
// to.
func pollNow() {
	set.mu.Lock()
	defer set.mu.Unlock()
	pollLocked(time.Now().UnixNano())
}

// socketPair is a connected pair of real Unix stream sockets, closed
// when the test ends.
func socketPair(t testing.TB) (a, b int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unix.Close(fds[0])
		unix.Close(fds[1])
	})
	return fds[0], fds[1]
}

// counted is a Reader whose wake counts its calls.
type counted struct {
	Reader
	wakes atomic.Int32
}

func newCounted(fd int) *counted {
	c := &counted{}
	c.Init(fd, func() { c.wakes.Add(1) })
	return c
}

func TestPollWakesOnlyReadableSleepers(t *testing.T) {
	a, b := socketPair(t)
	r := newCounted(a)
	r.Sleep()
	defer r.Awake()
	if sleeping() != 1 {
		t.Fatalf("sleeping() = %d after Sleep, want 1", sleeping())
	}
	pollNow()
	if n := r.wakes.Load(); n != 0 {
		t.Fatalf("woken %d times with nothing to read", n)
	}
	if sleeping() != 1 {
		t.Fatalf("sleeping() = %d after a poll that found nothing, want 1", sleeping())
	}
	before := Woken()
	if _, err := unix.Write(b, []byte{1}); err != nil {
		t.Fatal(err)
	}
	pollNow()
	if n := r.wakes.Load(); n != 1 {
		t.Fatalf("woken %d times once readable, want 1", n)
	}
	if sleeping() != 0 {
		t.Fatalf("sleeping() = %d after the wake, want 0: a woken reader leaves the set", sleeping())
	}
	if got := Woken() - before; got != 1 {
		t.Fatalf("Woken() grew by %d, want 1", got)
	}
	pollNow()
	if n := r.wakes.Load(); n != 1 {
		t.Fatalf("woken %d times: a reader off the set was woken again", n)
	}
	// Back to sleep with the byte still unread: level, not edge.
	r.Awake()
	r.Sleep()
	pollNow()
	if n := r.wakes.Load(); n != 2 {
		t.Fatalf("woken %d times after sleeping again on a readable fd, want 2", n)
	}
}

func TestAwakeLeavesTheSet(t *testing.T) {
	a, b := socketPair(t)
	r := newCounted(a)
	r.Sleep()
	r.Sleep() // twice is once
	if sleeping() != 1 {
		t.Fatalf("sleeping() = %d after two Sleeps, want 1", sleeping())
	}
	r.Awake()
	r.Awake()
	if sleeping() != 0 {
		t.Fatalf("sleeping() = %d after Awake, want 0", sleeping())
	}
	if _, err := unix.Write(b, []byte{1}); err != nil {
		t.Fatal(err)
	}
	pollNow()
	if n := r.wakes.Load(); n != 0 {
		t.Fatalf("a reader awake was woken %d times", n)
	}
}

func TestPeerCloseWakes(t *testing.T) {
	a, b := socketPair(t)
	r := newCounted(a)
	r.Sleep()
	defer r.Awake()
	if err := unix.Shutdown(b, unix.SHUT_WR); err != nil {
		t.Fatal(err)
	}
	pollNow()
	if n := r.wakes.Load(); n != 1 {
		t.Fatalf("woken %d times after the peer shut down its side, want 1: the read would see the end", n)
	}
}

// More sleepers than one poll looks at are all reached by the polls that
// follow.
func TestPollReachesEverySleeper(t *testing.T) {
	const n = maxPoll + 5
	rs := make([]*counted, n)
	for i := range rs {
		a, b := socketPair(t)
		if _, err := unix.Write(b, []byte{1}); err != nil {
			t.Fatal(err)
		}
		rs[i] = newCounted(a)
		rs[i].Sleep()
	}
	// Each poll looks at every sleeper: readers asleep longer than
	// longAfter (10 ms, which setting up 21 of them can take on a loaded
	// machine) are otherwise looked at only every longEvery, the rule
	// TestLongSleeperLookedAtLess checks.
	set.longAt = 0
	pollNow()
	if sleeping() != n-maxPoll {
		t.Fatalf("sleeping() = %d after one poll, want %d", sleeping(), n-maxPoll)
	}
	set.longAt = 0
	pollNow()
	for i, r := range rs {
		if w := r.wakes.Load(); w != 1 {
			t.Errorf("reader %d woken %d times, want 1", i, w)
		}
		r.Awake()
	}
}

// Poll's rate limit: a second Poll right after the first asks nothing.
func TestPollRateLimited(t *testing.T) {
	a, b := socketPair(t)
	r := newCounted(a)
	Poll(time.Now().UnixNano()) // with nobody asleep: returns at once
	r.Sleep()
	defer r.Awake()
	set.polled.Store(0)
	// The clock is passed, not read again: on a loaded machine the write
	// alone can take longer than pollEvery.
	now := time.Now().UnixNano()
	Poll(now)
	if _, err := unix.Write(b, []byte{1}); err != nil {
		t.Fatal(err)
	}
	Poll(now + pollEvery/2) // within pollEvery of the first: asks nothing
	if n := r.wakes.Load(); n != 0 {
		t.Fatalf("woken %d times by a poll within pollEvery of the last", n)
	}
	set.polled.Store(0)
	Poll(time.Now().UnixNano())
	if n := r.wakes.Load(); n != 1 {
		t.Fatalf("woken %d times once pollEvery had passed, want 1", n)
	}
}

// A reader asleep longer than longAfter is looked at every longEvery, not
// on every poll.
func TestLongSleeperLookedAtLess(t *testing.T) {
	a, b := socketPair(t)
	r := newCounted(a)
	r.Sleep()
	defer r.Awake()
	set.mu.Lock()
	r.since -= 2 * longAfter
	set.longAt = time.Now().UnixNano() + int64(time.Hour) // not due
	set.mu.Unlock()
	if _, err := unix.Write(b, []byte{1}); err != nil {
		t.Fatal(err)
	}
	pollNow()
	if n := r.wakes.Load(); n != 0 {
		t.Fatalf("a long sleeper was looked at %d times before longEvery had passed", n)
	}
	set.mu.Lock()
	set.longAt = 0 // due
	set.mu.Unlock()
	pollNow()
	if n := r.wakes.Load(); n != 1 {
		t.Fatalf("a long sleeper woken %d times once longEvery had passed, want 1", n)
	}
}

// Readers sleeping and waking while others poll: a wake never runs for a
// reader whose Awake has returned, and none is lost for one asleep.
func TestWakeOnlyWhileOnTheSet(t *testing.T) {
	const readers, rounds = 4, 500
	var wg sync.WaitGroup
	var stop atomic.Bool
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				pollNow()
				runtime.Gosched()
			}
		}()
	}
	var bad atomic.Int32
	var rg sync.WaitGroup
	for range readers {
		a, b := socketPair(t)
		if _, err := unix.Write(b, []byte{1}); err != nil {
			t.Fatal(err)
		}
		rg.Add(1)
		go func() {
			defer rg.Done()
			var asleep atomic.Bool
			var woke atomic.Bool
			r := &Reader{}
			r.Init(a, func() {
				if !asleep.Load() {
					bad.Add(1)
				}
				woke.Store(true)
			})
			for range rounds {
				woke.Store(false)
				asleep.Store(true)
				r.Sleep()
				for !woke.Load() { // readable: a poll must come
					runtime.Gosched()
				}
				r.Awake()
				asleep.Store(false)
			}
		}()
	}
	rg.Wait()
	stop.Store(true)
	wg.Wait()
	if n := bad.Load(); n != 0 {
		t.Fatalf("%d wakes ran for a reader awake", n)
	}
	if sleeping() != 0 {
		t.Fatalf("sleeping() = %d at the end, want 0", sleeping())
	}
}

func TestNoAllocations(t *testing.T) {
	a, b := socketPair(t)
	r := newCounted(a)
	r.Sleep() // grows the set once
	r.Awake()
	if n := testing.AllocsPerRun(200, func() {
		r.Sleep()
		pollNow()
		r.Awake()
	}); n != 0 {
		t.Fatalf("Sleep, Poll, Awake with nothing readable: %v allocations, want 0", n)
	}
	if _, err := unix.Write(b, []byte{1}); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(200, func() {
		r.Sleep()
		pollNow() // wakes it
		r.Awake()
	}); n != 0 {
		t.Fatalf("Sleep, a Poll that wakes, Awake: %v allocations, want 0", n)
	}
}

func TestWakeNow(t *testing.T) {
	a, _ := socketPair(t)
	r := newCounted(a)
	if r.WakeNow() {
		t.Fatal("WakeNow woke a reader that was not asleep")
	}
	r.Sleep()
	if !r.WakeNow() {
		t.Fatal("WakeNow did not wake a reader asleep with nothing to read")
	}
	if n := r.wakes.Load(); n != 1 {
		t.Fatalf("wake ran %d times, want 1", n)
	}
	if r.Asleep() || r.WakeNow() {
		t.Fatal("a reader woken by WakeNow stayed on the set")
	}
	r.Awake()
}
