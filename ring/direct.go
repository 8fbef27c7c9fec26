package ring

import (
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// directBytes is the largest payload the op goroutine writes itself (see
// trySendDirect).
const directBytes = coalesceBytes

// trySendDirect writes a small frame from the op goroutine itself, when
// nothing of this op is queued on the stream and its write lock is free.
// Handing the frame to the writer goroutine costs every step of a small
// op a goroutine wake-up, and, while a P is idle, an OS thread's. It
// reports false, having written nothing, when the frame must be queued
// instead: the lock is held (a heartbeat), the socket is full, or the
// stream is not a plain socket.
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
	h.encode(s.wbuf[:headerLen])
	n := copy(s.wbuf[headerLen:], payload)
	s.direct = s.wbuf[:headerLen+n]
	s.directOff, s.directErr, s.directFull = 0, nil, false
	if rerr := s.rc.Write(s.directFn); rerr != nil && s.directErr == nil {
		s.directErr = rerr
	}
	s.direct = nil
	if s.directFull {
		return false, nil
	}
	s.lastWrite.Store(time.Now().UnixNano())
	if s.directErr != nil {
		s.writeFailed(s.directErr)
		return false, s.directErr
	}
	return true, nil
}

// writeDirect is the RawConn.Write callback of trySendDirect; false means
// "wait until writable", which it asks only to finish a frame begun.
func (s *stream) writeDirect(fd uintptr) bool {
	for s.directOff < len(s.direct) {
		n, err := unix.Write(int(fd), s.direct[s.directOff:])
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
