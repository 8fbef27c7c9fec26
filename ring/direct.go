package ring

import (
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// directBytes is the largest payload the op goroutine writes itself (see
// trySendDirect): every frame of a small op, and the segments of
// mid-size ops, whose hand-off to the writer goroutine cost more than
// their write.
const directBytes = 64 << 10

// trySendDirect writes a frame from the op goroutine itself, when nothing
// of this op is queued on the stream and its write lock is free. Handing
// the frame to the writer goroutine costs every step of a small op a
// goroutine wake-up, and, while a P is idle, an OS thread's. It reports
// false, having written nothing, when the frame must be queued instead:
// the lock is held (a heartbeat), the socket is full, or the stream is
// not a plain socket. A payload up to coalesceBytes is copied behind the
// header, with its trailer, and written with write(2); a longer one goes
// out with the header in one writev(2), from where it is, then its
// trailer, summed once the payload is written (stream.frame).
func (s *stream) trySendDirect(h *header, payload []byte) (sent bool, err error) {
	if s.rc == nil {
		return false, nil
	}
	select {
	case s.wsem <- struct{}{}:
	default:
		return false, nil
	}
	defer func() { <-s.wsem }()
	// wbuf is the writer goroutine's, but only under wsem, which we hold.
	s.direct, s.directPay = s.frame(h, payload)
	s.directOff, s.directErr, s.directFull, s.directSummed = 0, nil, false, false
	if rerr := s.rc.Write(s.directFn); rerr != nil && s.directErr == nil {
		s.directErr = rerr
	}
	if s.directPay != nil {
		s.iov = [2]unix.Iovec{} // keep no pointer into the caller's buffer
	}
	s.direct, s.directPay = nil, nil
	if s.directFull {
		return false, nil
	}
	s.lastWrite.Store(time.Now().UnixNano())
	if s.directErr != nil {
		if s.r.lent && s.lend.Load() != lendNone {
			// This goroutine also holds the link's read side (a ring of
			// two's duplex stream, lent to its lent op): its reader is
			// parked, so writeFailed would wait for it in vain. It reads
			// on, to find the peer's abort or close.
			s.r.giveBackStream(s)
		}
		s.writeFailed(s.directErr)
		return false, s.directErr
	}
	return true, nil
}

// writeDirect is the RawConn.Write callback of trySendDirect; false means
// "wait until writable", which it asks only to finish a frame begun.
func (s *stream) writeDirect(fd uintptr) bool {
	body := len(s.direct) + len(s.directPay)
	total := body
	if s.directPay != nil {
		total += trailerLen
	}
	for s.directOff < total {
		if s.directOff == body && !s.directSummed {
			putTrailer(s.tail(), checksum(s.directPay))
			s.directSummed = true
		}
		n, err := s.writeSome(fd)
		switch err {
		case nil:
			s.directOff += n
		case unix.EINTR:
		case unix.EAGAIN:
			if s.directOff == 0 {
				s.directFull = true
				return true
			}
			return false
		default:
			s.directErr = err
			return true
		}
	}
	return true
}

// writeSome writes what is left of the frame from directOff: the rest of
// the header (or coalesced frame), then the payload, in one system call;
// then the payload's trailer.
func (s *stream) writeSome(fd uintptr) (int, error) {
	if len(s.directPay) == 0 {
		return unix.Write(int(fd), s.direct[s.directOff:])
	}
	if body := len(s.direct) + len(s.directPay); s.directOff >= body {
		return unix.Write(int(fd), s.tail()[s.directOff-body:])
	}
	n := 0
	if s.directOff < len(s.direct) {
		rest := s.direct[s.directOff:]
		s.iov[n].Base = &rest[0]
		s.iov[n].SetLen(len(rest))
		n++
	}
	pay := s.directPay[max(0, s.directOff-len(s.direct)):]
	s.iov[n].Base = &pay[0]
	s.iov[n].SetLen(len(pay))
	n++
	w, _, errno := unix.Syscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&s.iov[0])), uintptr(n))
	if errno != 0 {
		return 0, errno
	}
	return int(w), nil
}

// rawConn is c's syscall.RawConn, nil when c has none.
func rawConn(c any) syscall.RawConn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}
