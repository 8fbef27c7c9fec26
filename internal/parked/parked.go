package parked

import (
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Reader is one reader that may park in the netpoller: its socket's fd and
// how to wake it. A reader's own goroutine calls Sleep and Awake; Poll
// calls wake, from another goroutine, while the reader is on the set.
type Reader struct {
	fd     int32
	wake   func()
	asleep bool  // between Sleep and Awake; the reader's own goroutine's
	on     bool  // on the set; guarded by set.mu
	since  int64 // unix nanoseconds it went on the set; guarded by set.mu
}

// Init names the fd the reader parks on and the function that ends its
// parked read. wake runs on a poller's goroutine under the set's lock: it
// must not block, nor call Sleep, Awake or Poll.
func (r *Reader) Init(fd int, wake func()) {
	r.fd, r.wake = int32(fd), wake
}

// pollEvery is how often Poll asks poll(2): a system call in every turn
// of every poller would cost the processes polling beside them their
// turns (docs/TUNING.md, section 20); a reader woken 20 µs late has lost
// little against the 100-350 µs it waited before.
const pollEvery = int64(20 * time.Microsecond)

// A reader asleep longer than longAfter is looked at only every
// longEvery: it is most likely an idle link (a stripe that small calls do
// not use), and asking for it every pollEvery would cost every small
// call a system call. A trainer's next request after a long call comes
// to a session reader asleep for the call's length, and is rearmed at the
// answer from 4 MiB on (ipc.ServerConfig.RearmMinBytes).
const (
	longAfter = int64(10 * time.Millisecond)
	longEvery = int64(time.Millisecond)
)

// maxPoll bounds the fds one Poll looks at; with more readers asleep, the
// next Poll starts where this one stopped.
const maxPoll = 16

var set struct {
	mu      sync.Mutex
	readers []*Reader
	n       atomic.Int32 // len(readers), read without the lock
	polled  atomic.Int64 // unix nanoseconds of the last Poll that looked
	longAt  int64        // unix nanoseconds of the last look at every reader
	next    int          // where the next Poll starts, with more than maxPoll
	pfds    [maxPoll]unix.PollFd
	who     [maxPoll]*Reader
	woken   atomic.Uint64
}

// Sleep puts r on the set: call it as the read parks (its RawConn
// callback returns false).
func (r *Reader) Sleep() {
	r.asleep = true
	set.mu.Lock()
	if !r.on {
		r.on, r.since = true, time.Now().UnixNano()
		set.readers = append(set.readers, r)
		set.n.Store(int32(len(set.readers)))
	}
	set.mu.Unlock()
}

// Awake takes r off the set: call it when the read returns, however it
// ended (after a read that did not Sleep it costs nothing). Once it has
// returned, r's wake function is not running and will not run until the
// next Sleep, so the reader can tell its wake signal from a deadline of
// its own.
func (r *Reader) Awake() {
	if !r.asleep {
		return
	}
	r.asleep = false
	set.mu.Lock()
	if r.on {
		removeLocked(r)
	}
	set.mu.Unlock()
}

// removeLocked takes r, which is on the set, off it.
func removeLocked(r *Reader) {
	r.on = false
	for i, x := range set.readers {
		if x == r {
			last := len(set.readers) - 1
			set.readers[i] = set.readers[last]
			set.readers[last] = nil
			set.readers = set.readers[:last]
			break
		}
	}
	set.n.Store(int32(len(set.readers)))
}

// Asleep reports whether r is on the set.
func (r *Reader) Asleep() bool {
	set.mu.Lock()
	defer set.mu.Unlock()
	return r.on
}

// WakeNow wakes r if it is on the set, whether or not its fd is readable,
// and reports whether it did: for a goroutine that wants the reader
// polling again before its data comes (a borrower asking for its link).
func (r *Reader) WakeNow() bool {
	set.mu.Lock()
	defer set.mu.Unlock()
	if !r.on {
		return false
	}
	removeLocked(r)
	r.wake()
	return true
}

// Woken reports how many readers Poll has woken since the process began.
func Woken() uint64 { return set.woken.Load() }

// Poll wakes the sleeping readers whose fd is readable (data, the peer's
// close or an error), each taken off the set as it is woken. Pollers call
// it between polls, with the time they read last (unix nanoseconds):
// every poller reads the clock on each turn already, and a second
// reading would lengthen each turn, which the pollers of the other
// processes wait for. It returns at once when nobody sleeps, when it
// looked less than pollEvery ago, or when another poller is in it. It
// does not allocate.
func Poll(now int64) {
	if set.n.Load() == 0 || now-set.polled.Load() < pollEvery || !set.mu.TryLock() {
		return
	}
	defer set.mu.Unlock()
	set.polled.Store(now)
	pollLocked(now)
}

// pollLocked is Poll's work, under set.mu.
func pollLocked(now int64) {
	total := len(set.readers)
	if total == 0 {
		return
	}
	all := now-set.longAt >= longEvery
	if all {
		set.longAt = now
	}
	start, n, i := set.next%total, 0, 0
	for ; i < total && n < maxPoll; i++ {
		r := set.readers[(start+i)%total]
		if !all && now-r.since >= longAfter {
			continue
		}
		set.pfds[n] = unix.PollFd{Fd: r.fd, Events: unix.POLLIN}
		set.who[n] = r
		n++
	}
	set.next = start + i
	if n == 0 {
		return
	}
	ready, err := unix.Poll(set.pfds[:n], 0)
	if err != nil || ready == 0 {
		clear(set.who[:n])
		return
	}
	for i := 0; i < n; i++ {
		r := set.who[i]
		set.who[i] = nil
		if set.pfds[i].Revents == 0 || !r.on {
			continue
		}
		removeLocked(r)
		set.woken.Add(1)
		r.wake()
	}
}
