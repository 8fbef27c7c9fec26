package ipc

import (
	"os"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/collectived/collectived/internal/parked"
)

// recvmsg reads once from the socket into p and c.oob. It calls recvmsg(2)
// itself rather than through (*net.UnixConn).ReadMsgUnix, which allocates
// the sender's address on every call: this way a steady stream of frames
// is read without allocating. MSG_CMSG_CLOEXEC makes every received fd
// close-on-exec atomically, so a daemon that execs never leaks a client's
// fd. Deadlines and Close work as for any net.Conn read.
func (c *Conn) recvmsg(p []byte) (n, oobn, flags int, err error) {
	if c.rawErr != nil {
		return 0, 0, 0, c.rawErr
	}
	c.rp = p
	if spin := c.readSpin; spin > 0 {
		if c.yieldP {
			// Whatever this reader just woke (a waiting caller) runs on
			// this goroutine's P: let it, before polling holds the P.
			runtime.Gosched()
		}
		c.pollUntil = time.Now().UnixNano() + spin
	} else {
		c.pollUntil = 0
	}
	for {
		err := c.raw.Read(c.recvFn)
		c.park.Awake()
		if c.laneParked {
			c.laneParked = false
			c.lane.unpark()
		}
		if err == nil {
			return c.rn, c.roobn, c.rflags, c.rerr
		}
		if c.takeRearm(err) {
			// Rearm's signal, not a deadline: poll again.
			c.pollUntil = time.Now().UnixNano() + c.spin.Load()
			continue
		}
		return 0, 0, 0, c.readError(err)
	}
}

// recvOnce is the RawConn.Read callback; false means "wait until
// readable".
func (c *Conn) recvOnce(fd uintptr) bool {
	for {
		if c.lane != nil && c.r == c.w && c.pollUntil != 0 {
			// Polling between frames with a lane: small calls come there,
			// so the lane is looked at on every turn (a load) and the
			// socket only every laneSocketEvery (a system call).
			if c.lane.Rung() {
				return c.rung()
			}
			now := time.Now().UnixNano()
			if now < c.socketAt && now < c.pollUntil {
				c.yield(now)
				continue
			}
			c.socketAt = now + laneSocketEvery
		}
		c.iov.Base = unsafe.SliceData(c.rp)
		c.iov.SetLen(len(c.rp))
		c.msg = unix.Msghdr{Iov: &c.iov, Iovlen: 1, Control: unsafe.SliceData(c.oob)}
		c.msg.SetControllen(len(c.oob))
		n, _, errno := unix.Syscall(unix.SYS_RECVMSG, fd, uintptr(unsafe.Pointer(&c.msg)), unix.MSG_CMSG_CLOEXEC)
		switch errno {
		case 0:
			c.rn, c.roobn, c.rflags, c.rerr = int(n), int(c.msg.Controllen), int(c.msg.Flags), nil
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			// The lane is looked at only between frames: a frame half read
			// from the socket is finished first.
			atBoundary := c.lane != nil && c.r == c.w
			if atBoundary && c.lane.Rung() {
				return c.rung()
			}
			if now := time.Now().UnixNano(); c.pollUntil != 0 && now < c.pollUntil {
				c.yield(now)
				continue
			}
			if atBoundary && !c.laneParked {
				if !c.lane.park() {
					return c.rung()
				}
				c.laneParked = true
			}
			if c.pollUntil != 0 && c.onPark != nil {
				c.onPark()
			}
			if !c.parkDeadline.IsZero() && !c.deadlineSet {
				// Only now, parking, does the read need its deadline: a
				// timer armed while polling would have an idle P's thread
				// wait in epoll, woken by every frame that arrives.
				c.deadlineSet = true
				_ = c.SetReadDeadline(c.parkDeadline)
			}
			if c.rf != nil && c.spin.Load() > 0 {
				// Other goroutines' polls wake this read (Rearm) as soon
				// as its socket is readable (internal/parked).
				c.park.Sleep()
			}
			return false
		default:
			c.rn, c.roobn, c.rflags, c.rerr = 0, 0, 0, os.NewSyscallError("recvmsg", errno)
			return true
		}
	}
}

// rung ends the read callback with ErrRung: nothing read from the socket,
// a frame waiting on the lane.
func (c *Conn) rung() bool {
	c.rn, c.roobn, c.rflags, c.rerr = 0, 0, 0, ErrRung
	return true
}

// laneSocketEvery is how often a reader polling a lane also polls its
// socket, and goschedEvery how often a polling reader that yields its P
// (ReadFrame) does so. Each turn of a poller costs the pollers of the
// other processes on its CPU their turn: on two CPUs a system call or a
// trip through the Go scheduler in every turn measured slower than these
// intervals (docs/TUNING.md, section 20).
const (
	laneSocketEvery = int64(20 * time.Microsecond)
	goschedEvery    = int64(20 * time.Microsecond)
)

// yield ends one empty turn of a poll: other processes get the CPU
// (sched_yield), and now and then, for ReadFrame, this process's other
// goroutines the P; readers parked beside it whose data has come are
// woken (internal/parked).
func (c *Conn) yield(now int64) {
	parked.Poll(now)
	if c.yieldP && now-c.goschedAt > goschedEvery {
		c.goschedAt = now
		runtime.Gosched()
	}
	_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
}
