package ipc

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/shm"
)

// Request is one validated CALL handed to the Handler. It stays valid
// until the core calls Reply or Fail (exactly once), even after the
// session has ended; then the session reuses it.
type Request struct {
	ID   uint64
	Desc collective.Desc
	// Buf is the caller's buffer: for an inline call a copy of the data,
	// for a shared-memory call the range of the segment (which stays
	// mapped until Reply or Fail). The result goes into it, in place.
	Buf    []byte
	Inline bool
	// Out is where the result goes when it is not Buf (allgather and
	// reduce_scatter, protocol version 3): the call's result span, or for
	// an inline call the answer's result bytes. Nil otherwise.
	Out []byte
	// WorldRank is the caller's world rank.
	WorldRank int

	counts []uint64 // Desc.Counts' storage, reused
	in     []byte   // an inline Out call's input, reused
	relOut func()   // releases the Out span

	lane bool // the call came on the lane: so does its answer, when it fits

	s       *Session
	release func()
	frame   []byte // CallOKPrefix + inline data: Buf is frame[CallOKPrefix:]
	out     []byte // the frame the writer sends
	state   atomic.Uint32
}

const (
	reqIdle uint32 = iota
	reqInFlight
	reqAnswered
)

// Session is the session the call came on.
func (r *Request) Session() *Session { return r.s }

// Reply answers the call with success. An inline call's result is Buf.
func (r *Request) Reply(generation uint32, seq uint64) {
	if r.callOK(generation, seq) {
		r.s.queue(r)
	}
}

// callOK makes the CALL_OK answer in r.out; false if the call was already
// answered.
func (r *Request) callOK(generation uint32, seq uint64) bool {
	if !r.answer() {
		return false
	}
	n := 0
	if r.Inline {
		n = len(r.Buf)
		if r.Out != nil {
			n = len(r.Out)
		}
	}
	PutCallOKPrefix(r.frame, r.ID, generation, seq, n)
	r.out = r.frame[:CallOKPrefix+n]
	return true
}

// ReplyNow is Reply written by the calling goroutine instead of the
// session's writer, when no answer is queued ahead of it: for a caller on
// the session's own goroutine, the hand-off to the writer would cost a
// small call a goroutine wake-up. It may block as long as the write does
// (bounded by the session's write timeout).
func (r *Request) ReplyNow(generation uint32, seq uint64) {
	if !r.callOK(generation, seq) {
		return
	}
	s := r.s
	s.mu.Lock()
	if s.closed || len(s.outq) > 0 {
		s.mu.Unlock()
		s.queue(r)
		return
	}
	s.mu.Unlock()
	s.retire(r)
	err := s.writeAnswer(r)
	s.reuse(r)
	if err != nil {
		s.Close(err)
	}
}

// writeAnswer sends r's answer: on the lane if the call came that way and
// the answer fits, ringing the client if it sleeps on the socket; else on
// the socket (a client takes answers from both).
func (s *Session) writeAnswer(r *Request) error {
	if !r.lane {
		return s.conn.WriteFrame(r.out, -1)
	}
	// The client may put its next call as soon as it sees this answer:
	// the lane is free before the answer is out.
	s.laneBusy.Store(false)
	if len(r.out) > LaneFrameMax {
		return s.conn.WriteFrame(r.out, -1)
	}
	if s.lane.Put(r.out) {
		return s.conn.WriteFrame(WakeClientFrame, -1)
	}
	return nil
}

// Fail answers the call with an ERROR: an *Error's code and message (never
// fatal: the session goes on), or INTERNAL with err's text.
func (r *Request) Fail(err error) {
	if !r.answer() {
		return
	}
	var e *Error
	if !errors.As(err, &e) {
		e = &Error{Code: CodeInternal, Message: fmt.Sprint(err)}
	}
	ne := *e
	ne.Fatal = false
	// The frame buffer is free now; reuse it when it is big enough.
	r.out = ne.Append(r.frame[:0], r.ID)
	r.s.queue(r)
}

func (r *Request) answer() bool {
	if r.state.CompareAndSwap(reqInFlight, reqAnswered) {
		return true
	}
	r.s.log.Error("BUG: call answered twice or after reuse", "id", r.ID, "call", r.Desc.String())
	return false
}

// queue hands an answered request to the writer, or finishes it at once if
// the session has ended. It never blocks: outq holds MaxInFlight requests.
func (s *Session) queue(r *Request) {
	s.mu.Lock()
	if !s.closed {
		s.outq <- r
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	s.retire(r)
	s.reuse(r)
}

// retire ends the call's claims before its answer is written: the client
// may reuse the id, count the slot free and free the segment as soon as it
// reads the answer, so none of these may lag behind the write. Until
// retired, a queued answer still counts against MaxInFlight, which is what
// bounds outq.
func (s *Session) retire(r *Request) {
	if r.release != nil {
		r.release()
		r.release = nil
	}
	if r.relOut != nil {
		r.relOut()
		r.relOut = nil
	}
	r.Buf, r.Out = nil, nil
	s.mu.Lock()
	delete(s.inflight, r.ID)
	s.mu.Unlock()
}

// reuse puts a written (or dropped) request back on the free list.
func (s *Session) reuse(r *Request) {
	if cap(r.out) > cap(r.frame) {
		r.frame = r.out[:cap(r.out)] // Fail grew it; keep the bigger one
	}
	r.out = nil
	r.state.Store(reqIdle)
	s.recycle(r)
}

// writeLoop is the writer goroutine: it sends answers queued by Reply and
// Fail until the session ends, then finishes whatever is left.
func (s *Session) writeLoop() {
	defer close(s.wdone)
	for {
		select {
		case r := <-s.outq:
			s.retire(r)
			err := s.writeAnswer(r)
			// Through a long call the reader has stopped polling; the
			// trainer's next call comes right after this answer.
			rearm := r.Desc.Bytes() >= s.srv.cfg.RearmMinBytes
			s.reuse(r)
			if err != nil {
				s.Close(err)
			} else if rearm {
				s.conn.Rearm()
			}
		case <-s.quit:
			for {
				select {
				case r := <-s.outq:
					s.retire(r)
					s.reuse(r)
				default:
					return
				}
			}
		}
	}
}

// handleCall validates a CALL and passes it to the handler.
func (s *Session) handleCall(f Frame) error {
	if err := s.observerRefused(f.Type); err != nil {
		return err
	}
	if s.fromLane && s.laneBusy.Load() {
		return Fatalf(CodeBadFrame, "CALL (id %d) came on the lane before the lane's last call was answered", f.ID)
	}
	if err := CheckExtFlag(f.Payload, int(s.hello.Version)); err != nil {
		return err
	}
	c := &s.call
	if err := DecodeCall(f.Payload, c, &s.names); err != nil {
		return err
	}
	d := c.Desc
	if d.Named && s.fromLane {
		// One lane call is answered before the next is sent: a named
		// call, which waits for the other trainers in any order, would
		// hold up the trainer's ordered calls behind it.
		return Errorf(CodeBadRequest, "CALL %s: a named call came on the lane, which carries ordered calls only; send it on the socket", d.String())
	}
	lim := CallLimits{Version: int(s.hello.Version), WorldSize: int(s.helloOK.WorldSize), WorldRank: int(s.helloOK.WorldRank), InlineLimit: s.srv.cfg.InlineLimit}
	resultBytes, err := CheckCall(c, lim)
	if err != nil {
		return err
	}
	outward := d.Op == collective.OpAllGather || d.Op == collective.OpReduceScatter

	s.mu.Lock()
	if _, dup := s.inflight[f.ID]; dup {
		s.mu.Unlock()
		return Fatalf(CodeBadFrame, "CALL id %d is already in flight", f.ID)
	}
	if len(s.inflight) >= s.srv.cfg.MaxInFlight {
		n := len(s.inflight)
		s.mu.Unlock()
		return Errorf(CodeTooMany, "CALL %s: %d calls in flight, the limit is %d", d, n, s.srv.cfg.MaxInFlight)
	}
	if id, dup := s.namedInFlightLocked(d.Name, d.Named); dup {
		s.mu.Unlock()
		return Errorf(CodeBadRequest, "CALL %s: world rank %d already has a call named %q in flight (id %d); a name may be in flight once per trainer",
			d.String(), s.helloOK.WorldRank, d.Name, id)
	}
	var r *Request
	if n := len(s.free); n > 0 {
		r = s.free[n-1]
		s.free = s.free[:n-1]
	}
	s.mu.Unlock()
	if r == nil {
		r = &Request{s: s, frame: make([]byte, CallOKPrefix+lim.InlineLimit)}
	}

	r.ID, r.Desc, r.Inline, r.lane = f.ID, d, !c.SHM, s.fromLane
	r.WorldRank = int(s.helloOK.WorldRank)
	if d.Counts != nil {
		// s.call's counts are the next CALL's storage.
		r.counts = append(r.counts[:0], d.Counts...)
		r.Desc.Counts = r.counts
	}
	if c.SHM {
		buf, release, err := s.table.Acquire(c.Segment, c.Offset, d.Bytes())
		if err != nil {
			s.recycle(r)
			return s.segmentError(d, err)
		}
		r.Buf, r.release = buf, release
		if c.Out {
			out, rel, err := s.table.Acquire(c.OutSegment, c.OutOffset, resultBytes)
			if err != nil {
				release()
				r.Buf, r.release = nil, nil
				s.recycle(r)
				return s.segmentError(d, err)
			}
			r.Out, r.relOut = out, rel
		}
	} else if outward {
		// The answer's result bytes are the output; the input needs its own.
		r.in = append(r.in[:0], c.Data...)
		r.Buf = r.in
		r.Out = r.frame[CallOKPrefix : CallOKPrefix+int(resultBytes)]
	} else {
		r.Buf = r.frame[CallOKPrefix : CallOKPrefix+copy(r.frame[CallOKPrefix:], c.Data)]
	}
	r.state.Store(reqInFlight)
	s.mu.Lock()
	s.inflight[f.ID] = r
	s.mu.Unlock()
	if r.lane {
		s.laneBusy.Store(true)
	}
	s.h.Call(s, r)
	return nil
}

// namedInFlightLocked finds a named call of name in flight (unanswered),
// for a new named call of it. s.mu is held.
func (s *Session) namedInFlightLocked(name string, named bool) (uint64, bool) {
	if !named {
		return 0, false
	}
	for id, r := range s.inflight {
		if r.Desc.Named && r.Desc.Name == name {
			return id, true
		}
	}
	return 0, false
}

// recycle returns an unused request to the free list.
func (s *Session) recycle(r *Request) {
	s.mu.Lock()
	s.free = append(s.free, r)
	s.mu.Unlock()
}

// segmentError turns a failed span into the call's error.
func (s *Session) segmentError(d collective.Desc, err error) error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, shm.ErrBadSegment) || errors.Is(err, shm.ErrRange) {
		return Errorf(CodeBadSegment, "CALL %s: %v", d, err)
	}
	return Errorf(CodeInternal, "CALL %s: %v", d, err)
}
