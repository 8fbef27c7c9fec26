package ring

import (
	"errors"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/collectived/collectived/internal/parked"
)

// Lending the link small ops receive on to the op goroutine.
//
// A small allreduce through a daemon is a chain of short hops, and on a
// machine with few CPUs every hand-off between goroutines (the ring reader
// delivering a frame to the op) waits for a thread to get a CPU. A caller
// that makes small calls in a row from one goroutine (the daemon's session
// reader of a node with one trainer) can instead run them with
// AllReduceLent: the reader of the stream the call receives on (stream 0
// from the previous rank, or a ring of two's duplex stream, duplex.go)
// lends it the connection at a frame boundary and parks, and the op
// goroutine reads its frames itself, heartbeats and aborts included
// (readFrame, the reader's own step). It keeps the link between such
// calls and gives it back with GiveBack when they stop; every op that is
// not lent gives it back first. Rank 0 of a ring of two lends two links
// (the duplex stream for short ops, stream 0 from rank 1 for the longer
// small ones): a lent op keeps the one it does not read, so that calls
// alternating between the two hand nothing back and forth. A lent link
// that nobody is reading (kept, or between calls) goes back to its
// reader as soon as something waits on it (reclaimIdle: the heartbeat
// loop looks every tick, a waiting borrower every lentPark), so a peer's
// abort, a diverged op's frame or a reset is read within a tick.
//
// While the link is lent, the process runs on one P (narrow): its work is
// the borrower's alone. An idle second P would have its thread sleep in
// epoll_wait (the daemon always has goroutines parked in the netpoller and
// timers armed), and every frame that arrives would wake it, which
// measured slower than the hand-offs saved (docs/TUNING.md, section 10).
// A companion goroutine yielding in a loop on that P (section 10's cure)
// kept it awake but was one more thread wanting a CPU on every turn of
// every poller on the machine (section 20). GOMAXPROCS goes back to what
// it was (widen) when the link does, before any other op, so the large
// ops that follow run on every P, and while a borrower waits for a link
// still being handed over. Changing it stops the world for some
// microseconds, once per stretch of small calls.

const (
	lendNone    int32 = iota // the reader reads
	lendAsked                // a borrower asked; the reader lends at its next frame boundary
	lendOut                  // the reader is parked; the borrower may read
	lendReading              // the borrower is reading a frame: not to be taken back
)

// errLend ends a reader's poll at a frame boundary when a borrower asked.
var errLend = errors.New("ring: link lent to the op goroutine")

// lendable reports whether the stream can be lent: one small ops receive
// on (Ring.lenders), when its reader polls (Config.Spin > 0).
func (s *stream) lendable() bool { return s.resume != nil }

// lendToBorrower is the reader's side: it parks until the link comes back.
// False means the ring is ending and the reader should drain and stop.
func (s *stream) lendToBorrower() bool {
	if !s.lend.CompareAndSwap(lendAsked, lendOut) {
		return true // given back before the reader let go: read on
	}
	select {
	case <-s.resume:
		return true
	case <-s.r.stop:
		return false
	case <-s.r.dying:
		// The borrower's op fails as well and gives the link back; do not
		// read beside it for long.
		t := time.NewTimer(s.r.cfg.AbortWait)
		defer t.Stop()
		select {
		case <-s.resume:
		case <-t.C:
		}
		return false
	}
}

// GiveBack returns the lent link to its reader, if an
// AllReduceLent borrowed it. Call it from the goroutine that made the
// calls, between ops, when its calls stop; it is idempotent.
func (r *Ring) GiveBack() {
	if r.size == 1 || r.busy.Load() {
		return // an op under way gave it back as it began
	}
	r.giveBack()
}

// giveBack returns every lent link, and every P: reclaimIdle may have
// taken the links back already, leaving the process narrowed.
func (r *Ring) giveBack() {
	for _, s := range r.lenders {
		r.giveBackStream(s)
	}
	r.widen()
}

func (r *Ring) giveBackStream(s *stream) {
	for {
		switch st := s.lend.Load(); st {
		case lendNone:
			return
		case lendAsked:
			if s.lend.CompareAndSwap(lendAsked, lendNone) {
				return
			}
		case lendOut, lendReading: // reading: never, from the borrower itself
			if !s.lend.CompareAndSwap(st, lendNone) {
				continue // reclaimIdle took it back, and woke the reader
			}
			r.widen()
			select {
			case s.resume <- struct{}{}:
			default:
			}
			return
		}
	}
}

// reclaimIdle gives back every lent link that no borrower is reading and
// on which something waits: a frame, the peer's close or an error. Rank 0
// of a ring of two keeps both its links lent through calls that read only
// one, and between calls; without this, a peer's abort, its diverged
// op's frame or a reset connection would lie there unread. The heartbeat
// loop calls it every tick, and a borrower every lentPark it waits, for
// every link but its own (own).
func (r *Ring) reclaimIdle(own *stream) {
	for _, s := range r.lenders {
		if s != own && s.lend.Load() == lendOut && s.pending() && s.lend.CompareAndSwap(lendOut, lendNone) {
			// The peer was not silent: it sent what waits. Its reader
			// reads it next; until then the hung check must not count
			// the time the link was lent.
			s.lastRead.Store(time.Now().UnixNano())
			select {
			case s.resume <- struct{}{}:
			default:
			}
		}
	}
}

// pending reports whether a read of the stream would not block: a frame
// waits, or the connection has ended.
func (s *stream) pending() bool {
	if s.sr == nil {
		return false
	}
	ready := false
	_ = s.sr.rc.Control(func(fd uintptr) {
		fds := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds[:], 0)
		ready = err == nil && n > 0
	})
	return ready
}

// stopEvery is how often a waiting lent call asks its stop check: often
// enough that a lost trainer is found at once, rarely enough that a small
// call, which ends sooner, never pays for the question (a system call).
const stopEvery = time.Millisecond

// lentPark bounds how long a borrower sleeps in one read of the lent link
// before it looks again at its deadline, its stop check and what the
// other links' readers noted (a peer's diverged op seen on another
// stream: without the look it would wait for the next frame here, a
// heartbeat at the latest). On a pollConn the wake-up allocates nothing.
const lentPark = 5 * time.Millisecond

// recvLent is recv for an op run by AllReduceLent: it reads the link it
// receives on itself once the reader has lent it, and until then takes
// what the reader delivers.
func (r *Ring) recvLent(kind frameKind) (*rxBuf, error) {
	s := r.rx[0]
	s.lend.CompareAndSwap(lendNone, lendAsked)
	if s.lend.Load() != lendOut {
		// Its reader may be asleep in the netpoller, which a process on
		// one P (narrowed for the other lent link) does not look at while
		// this goroutine polls: every P back until the reader lets go,
		// and the reader woken to see the question now rather than when
		// the peer's frame comes.
		r.widen()
		if s.sr != nil && s.sr.pc != nil {
			s.sr.park.WakeNow()
		}
	}
	if s.sr != nil {
		s.sr.quiet = false
	}
	deadline := time.Now().Add(r.cfg.OpTimeout).UnixNano()
	lastYield := time.Now().UnixNano()
	lastStop := lastYield // a call that ends within stopEvery asks nothing
	for {
		select {
		case b := <-s.full:
			return r.accept(s, kind, b)
		case d := <-r.done:
			r.noteDone(d)
		case n := <-r.peerOp:
			if err := r.peerDiverged(n); err != nil {
				return nil, err
			}
		default:
		}
		if err := r.healthy(); err != nil {
			return nil, err
		}
		now := time.Now().UnixNano()
		if now > deadline {
			return nil, r.failLocal(s, r.timeout("waiting for data from"))
		}
		if r.lentStop != nil && now-lastStop > int64(stopEvery) {
			lastStop = now
			if err := r.lentStop(); err != nil {
				r.Abort(err)
				return nil, r.opError()
			}
		}
		if s.lend.CompareAndSwap(lendOut, lendReading) {
			// The reader hands over every frame it read before it lets go:
			// one may have landed since the look above.
			select {
			case b := <-s.full:
				s.lend.CompareAndSwap(lendReading, lendOut)
				return r.accept(s, kind, b)
			default:
			}
			r.narrow()
			s.sr.borrowed, s.sr.boundary = true, true
			b, st := s.readFrame()
			s.sr.borrowed = false
			s.lend.CompareAndSwap(lendReading, lendOut)
			switch st {
			case frameOK:
				s.sr.quiet = false
				if b != nil {
					return r.accept(s, kind, b)
				}
				continue // a heartbeat or a deferred abort: read on
			case frameLend:
				// Parked lentPark with nothing read: look around (the
				// other lent link too), then park again without polling
				// first.
				s.sr.quiet = true
				r.reclaimIdle(s)
				continue
			default:
				if err := r.opError(); err != nil {
					return nil, err
				}
				return nil, r.failLocal(s, ErrClosed)
			}
		}
		// The reader has not let go yet: it is handing over a frame, or
		// asleep in the netpoller until the next one comes (and woken
		// here, if it has come).
		parked.Poll(now)
		if now-lastYield > int64(20*time.Microsecond) {
			runtime.Gosched()
			lastYield = now
		}
		_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	}
}

// accept counts a received frame and checks that it belongs to the op.
func (r *Ring) accept(s *stream, kind frameKind, b *rxBuf) (*rxBuf, error) {
	r.recvCount++
	if err := r.checkFrame(s, kind, &b.hdr); err != nil {
		s.free <- b
		return nil, err
	}
	return b, nil
}

// narrow runs the process on one P while the link is lent (see the top of
// this file); widen restores what it was, when the link comes back or the
// ring closes.
func (r *Ring) narrow() {
	if r.narrowedFrom.Load() != 0 {
		return
	}
	if prev := runtime.GOMAXPROCS(0); prev > 1 {
		runtime.GOMAXPROCS(1)
		r.narrowedFrom.Store(int32(prev))
	}
}

func (r *Ring) widen() {
	prev := r.narrowedFrom.Swap(0)
	if prev == 0 {
		return
	}
	if os.Getenv("GOMAXPROCS") == "" {
		// Back to the runtime's own choice, which follows the CPU
		// quota; a GOMAXPROCS call would have frozen it.
		runtime.SetDefaultGOMAXPROCS()
		return
	}
	runtime.GOMAXPROCS(int(prev))
}
