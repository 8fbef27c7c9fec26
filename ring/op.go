package ring

import (
	"fmt"
	"time"

	"github.com/collectived/collectived/collective"
)

// begin claims the ring for one op. A concurrent call gets ErrBusy and
// leaves the op under way alone. On a failed ring the op still takes its
// sequence number and returns the first error (see end).
func (r *Ring) begin(d *collective.Desc) error { return r.beginOp(d, false) }

// beginOp is begin for an op that reads the lent link itself (lent) or
// not, in which case the link goes back to its reader first.
func (r *Ring) beginOp(d *collective.Desc, lent bool) error {
	if !r.busy.CompareAndSwap(false, true) {
		return fmt.Errorf("ring rank %d: %s: %w", r.rank, d.Op, ErrBusy)
	}
	r.lent = lent
	if !r.started.Load() {
		r.busy.Store(false)
		return fmt.Errorf("ring rank %d: %s: %w: call Start first", r.rank, d.Op, ErrNotStarted)
	}
	// Frames carry what every rank's call shares (a v allgather's own
	// count is not).
	r.desc = d.Matched()
	r.fp = r.desc.Fingerprint()
	d = &r.desc
	// Every rank sees the same description, so all agree on the streams
	// an op uses: large ops stripe their segments across every stream,
	// small ones keep to the first, whose reader alone then stays awake.
	r.nstreams = 1
	if len(r.next) > 1 && d.Bytes() >= uint64(r.cfg.StripeBytes) {
		r.nstreams = uint64(len(r.next))
	}
	r.route(r.shortFrames(d))
	if r.nstreams != 1 || r.size == 1 || !r.rx[0].lendable() {
		r.lent = false // the lent link is one an op receives all its frames on
	}
	if r.size > 1 && !r.lent {
		// Only AllReduceLent's ops read a lent link themselves, and only
		// the one they receive on. They keep the other lent link (rank 0
		// of a ring of two lends two, duplex.go) unread, as between calls,
		// until something waits on it (reclaimIdle): handing it back and
		// asking for it again, when calls alternate between short and
		// longer small ops, woke its reader to poll and switched
		// GOMAXPROCS twice a call (docs/TUNING.md, section 25). Any other
		// op gives every lent link back.
		r.giveBack()
	}
	r.sendCount, r.recvCount = 0, 0
	for i := range r.completed {
		r.completed[i] = 0
	}
	r.setStep(-1)
	r.curSeq.Store(r.seq)
	r.curOp.Store(uint32(d.Op))
	r.setCurrent(true)
	return nil
}

// end finishes an op: it waits until no writer still reads the caller's
// buffer, turns any failure into this call's error, and advances seq.
func (r *Ring) end(err error) error {
	if r.size > 1 {
		if derr := r.drainWrites(); err == nil {
			err = derr
		}
	}
	if err == nil {
		err = r.healthy()
	}
	if err != nil {
		if e := r.opError(); e != nil {
			err = e
		}
		if r.placed > 0 {
			if r.healthy() == nil {
				r.Abort(err) // every failed op has failed the ring; make sure
			}
			r.stopPlacedReaders()
		}
	}
	r.pl = placement{} // nothing more is placed, nor is the buffer kept reachable
	r.setCurrent(false)
	r.curStep.Store(-1)
	r.seq++
	r.nextSeq.Store(r.seq)
	r.endDeferred() // clears curOp; an abort kept for this op now fails the ring
	r.lent, r.lentStop = false, nil
	r.busy.Store(false)
	return err
}

func (r *Ring) setStep(s int) {
	r.step = s
	r.curStep.Store(int64(s))
}

// healthy returns the ring's error once it has failed, without waiting.
func (r *Ring) healthy() error {
	select {
	case <-r.dying:
		return r.opError()
	default:
		return nil
	}
}

// opError is the error the current call returns: the first failure as
// recorded if it happened during this call, otherwise the first failure
// wrapped with this call's op and seq.
func (r *Ring) opError() error {
	r.mu.Lock()
	e := r.err
	r.mu.Unlock()
	if e == nil {
		return nil
	}
	if e.Op == r.desc.Op && e.Seq == r.seq && e.Op != collective.OpInvalid {
		return e
	}
	return &Error{Rank: r.rank, Op: r.desc.Op, Seq: r.seq, Step: -1, Generation: r.gen.Load(),
		PeerRank: e.PeerRank, PeerAddr: e.PeerAddr, Origin: e.Origin, Culprit: e.Culprit, Err: e}
}

// failLocal fails the ring with a cause found by the op itself and
// returns this call's error.
func (r *Ring) failLocal(s *stream, cause error) error {
	r.failFrom(s, cause)
	return r.opError()
}

func (r *Ring) noteDone(d txDone) {
	r.outstanding[d.stream]--
	r.completed[d.stream]++
}

func (r *Ring) pending() int {
	n := 0
	for _, o := range r.outstanding {
		n += o
	}
	return n
}

// canSend reports whether send would queue without waiting.
func (r *Ring) canSend() bool {
	return r.outstanding[r.sendCount%r.nstreams] < txDepth
}

// send queues one frame for the next rank; the payload is read by the
// writer goroutine until the write is reported done.
func (r *Ring) send(kind frameKind, payload []byte, aux uint64) error {
	i := int(r.sendCount % r.nstreams)
	s := r.tx[i]
	if r.outstanding[i] >= txDepth {
		r.timer.Reset(r.cfg.OpTimeout)
		for r.outstanding[i] >= txDepth {
			select {
			case d := <-r.done:
				r.noteDone(d)
			case n := <-r.peerOp:
				if err := r.peerDiverged(n); err != nil {
					return err
				}
			case <-r.dying:
				return r.opError()
			case <-r.timer.C:
				return r.failLocal(s, r.timeout("sending to"))
			}
		}
	}
	if err := r.healthy(); err != nil {
		return err
	}
	h := header{Kind: kind, Seq: r.seq, Generation: r.gen.Load(), Sender: uint32(r.rank),
		Step: uint32(r.step), Length: uint32(len(payload)), Aux: aux}
	h.setDesc(&r.desc, r.fp)
	if r.outstanding[i] == 0 && len(payload) <= directBytes {
		// Nothing of this op is queued ahead of it on the stream, so
		// writing it here keeps the order.
		sent, err := s.trySendDirect(&h, payload)
		if err != nil {
			if e := r.opError(); e != nil {
				return e
			}
			return err
		}
		if sent {
			r.sentDirect++
			r.completed[i]++
			r.sendCount++
			return nil
		}
	}
	s.reqs <- txReq{hdr: h, payload: payload} // never blocks: outstanding < txDepth
	r.outstanding[i]++
	r.sendCount++
	return nil
}

// A start frame's count bits: some rank the sender heard from (itself
// included) was fresh (Config.Fresh), or was not.
const (
	startFresh    = 1
	startNotFresh = 2
	startVacated  = 4 // some rank's Config.Vacated
)

// startFrame sends the largest generation proposal and finished count
// this rank knows of.
func (r *Ring) startFrame(gen uint32, finished, seen uint64) error {
	i := int(r.sendCount % r.nstreams)
	if err := r.healthy(); err != nil {
		return err
	}
	h := header{Kind: kindStart, Generation: gen, Sender: uint32(r.rank), Step: uint32(r.step), Aux: finished, Count: seen}
	r.tx[i].reqs <- txReq{hdr: h}
	r.outstanding[i]++
	r.sendCount++
	return nil
}

// recv waits for the next frame from the previous rank and checks that
// it belongs to the op and step under way. The caller returns the buffer
// with release.
func (r *Ring) recv(kind frameKind) (*rxBuf, error) {
	s := r.rx[r.recvCount%r.nstreams]
	r.timer.Reset(r.cfg.OpTimeout)
	for {
		select {
		case b := <-s.full:
			return r.accept(s, kind, b)
		case d := <-r.done:
			r.noteDone(d)
			r.timer.Reset(r.cfg.OpTimeout)
		case n := <-r.peerOp:
			if err := r.peerDiverged(n); err != nil {
				return nil, err
			}
		case <-r.dying:
			return nil, r.opError()
		case <-r.timer.C:
			return nil, r.failLocal(s, r.timeout("waiting for data from"))
		}
	}
}

func (r *Ring) timeout(what string) error {
	return fmt.Errorf("%w for %v %s the peer", ErrTimeout, r.cfg.OpTimeout, what)
}

func (r *Ring) checkFrame(s *stream, kind frameKind, h *header) error {
	if h.Kind != kind {
		return r.failLocal(s, badFrame("%s frame where a %s frame was due (seq %d, peer at seq %d)", h.Kind, kind, r.seq, h.Seq))
	}
	if kind == kindStart {
		if h.Step != uint32(r.step) {
			return r.failLocal(s, badFrame("start frame for step %d, want step %d", h.Step, r.step))
		}
		return nil
	}
	if g := r.gen.Load(); h.Generation != g {
		return r.failLocal(s, fmt.Errorf("%w: peer is in generation %d, this rank in %d", ErrGeneration, h.Generation, g))
	}
	if h.Seq != r.seq || !h.sameDesc(&r.desc, r.fp) {
		return r.mismatch(s, h, "")
	}
	if h.Step != uint32(r.step) {
		return r.failLocal(s, badFrame("frame for step %d, want step %d", h.Step, r.step))
	}
	return nil
}

// expectLen checks a data frame's payload length against what the
// algorithm computed for this segment.
func (r *Ring) expectLen(b *rxBuf, n int) error {
	got := len(b.data)
	if got == n {
		return nil
	}
	// Released, b is the reader's again, and it may be reading the next
	// frame into it already: take its length first.
	r.release(b)
	s := r.rx[(r.recvCount-1)%r.nstreams]
	return r.failLocal(s, badFrame("segment of %d bytes at step %d, want %d (segment_bytes, small_bytes and AllReduceChunks' chunks must be the same on every rank)", got, r.step, n))
}

// waitSent waits until the g-th frame queued in this op has been written,
// before its source bytes are overwritten.
func (r *Ring) waitSent(g uint64) error {
	S := r.nstreams
	i, k := g%S, g/S
	if r.completed[i] > k {
		return nil
	}
	r.timer.Reset(r.cfg.OpTimeout)
	for r.completed[i] <= k {
		select {
		case d := <-r.done:
			r.noteDone(d)
		case n := <-r.peerOp:
			if err := r.peerDiverged(n); err != nil {
				return err
			}
		case <-r.dying:
			return r.opError()
		case <-r.timer.C:
			return r.failLocal(r.tx[i], r.timeout("sending to"))
		}
	}
	return nil
}

// drainWrites waits for every queued write of this op. After a failure
// the links are closed within 3 x AbortWait, which ends any blocked write;
// the wait is bounded regardless, so that no op outlives its timeouts.
func (r *Ring) drainWrites() error {
	if r.pending() == 0 {
		return nil
	}
	var err error
	dying := r.dying
	failed, kicked := false, false
	r.timer.Reset(r.cfg.OpTimeout)
	for r.pending() > 0 {
		select {
		case d := <-r.done:
			r.noteDone(d)
			if !failed {
				r.timer.Reset(r.cfg.OpTimeout)
			}
		case <-dying:
			dying, failed = nil, true
			r.timer.Reset(min(drainGrace, r.cfg.AbortWait))
		case <-r.timer.C:
			switch {
			case !failed:
				err = r.failLocal(r.tx[0], r.timeout("sending to"))
				dying, failed = nil, true
				r.timer.Reset(min(drainGrace, r.cfg.AbortWait))
			case !kicked:
				// The ring has failed and a write still blocks: its peer
				// stopped reading (a partition, a stopped process). Cut it
				// short instead of waiting for the abort to close the link,
				// which would tell this rank's trainers seconds late.
				kicked = true
				r.kickWrites()
				r.timer.Reset(4*r.cfg.AbortWait + time.Second)
			default:
				return r.opError()
			}
		}
	}
	return err
}

// drainGrace is how long a failed op lets its queued writes finish before
// it cuts blocked ones short.
const drainGrace = 100 * time.Millisecond

// kickWrites ends the writes blocked on streams that still have this op's
// frames queued, by giving them a deadline in the past.
func (r *Ring) kickWrites() {
	for i, s := range r.tx {
		if r.outstanding[i] > 0 {
			_ = s.conn.SetWriteDeadline(time.Now())
		}
	}
}

func (r *Ring) mismatch(s *stream, h *header, how string) error {
	return r.failLocal(s, &mismatchError{
		local:  fmt.Sprintf("seq %d %s", r.seq, r.desc.String()),
		remote: fmt.Sprintf("seq %d %s", h.Seq, h.remoteDesc(&r.desc)),
		rank:   r.rank,
		peer:   s.peerRank,
		how:    how,
	})
}

// peerDiverged turns a peer's note of another call at this seq into a
// mismatch; a stale note (an earlier op) is ignored.
func (r *Ring) peerDiverged(n peerNote) error {
	if n.h.Seq != r.seq || n.h.sameDesc(&r.desc, r.fp) {
		return nil
	}
	return r.mismatch(n.s, &n.h, n.via)
}
