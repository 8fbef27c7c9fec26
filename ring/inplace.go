package ring

import "time"

// Receiving in place.
//
// In the allgather half of a ring allreduce every received segment is
// final: it would be read into one of the stream's receive buffers and
// then copied to where it belongs in the caller's buffer. On two CPUs that
// copy (half the buffer, per rank and call) is time the pipeline waits
// for. The op instead hands the reader the destination itself: a stream's
// receive buffers go round in a FIFO (free), one data frame each, so the
// buffer the op releases after the stream's k-th frame of the op is the
// one its (k+rxBuffers)-th frame lands in. When that frame is an allgather
// segment whose bytes this rank has finished sending (reduce-scatter sent
// them from the same place), the op releases a stand-in that points at the
// destination (a place), and parks its own buffer until the place comes
// back. Frames of a later op never get a place, so when an op succeeds
// every place has come back. When it fails, end stops the readers that may
// still hold one before the op returns: the caller's buffer is the
// caller's again the moment the op returns. A place is written before the
// frame's checksum is checked (stream.receive), but the op takes the
// frame only once it matched: a mismatch fails the op, which returns the
// error and no result.

// placement is what an allreduce needs to know to place its allgather
// frames: set by allReduceRing for the op under way, zero otherwise (and
// then nothing is placed). AllGatherInto places every frame (gather set):
// each block is received once, before this rank sends it on.
type placement struct {
	buf       []byte
	members   [][][]byte // a list's members (AllReduceList), buf unused
	p         partition
	total     uint64 // data frames this op receives
	gather    blocks
	gathering bool
	nseg      int // AllGatherInto's segments per block
}

// placeFor is where receive number m of the op under way (counted from 0
// over the whole op) lands when it is received in place, or nil: it must
// be an allgather segment of this op whose bytes this rank has finished
// sending in the reduce-scatter.
func (r *Ring) placeFor(m uint64) []byte {
	pl := &r.pl
	if pl.gathering {
		return r.gatherPlace(m)
	}
	n, nseg := r.size, uint64(pl.p.nseg)
	step := int(m / nseg)
	if m >= pl.total || step < n-1 {
		return nil
	}
	t, j := step-(n-1), int(m%nseg)
	if g := uint64(t)*nseg + uint64(j); r.completed[g%r.nstreams] <= g/r.nstreams {
		return nil // still being sent from there: this one takes the copy
	}
	rm, ro, rl := pl.p.segment(mod(r.rank-t, n), j)
	b := pl.buf
	if pl.members != nil {
		b = pl.members[rm][0]
	}
	return b[ro : ro+rl : ro+rl]
}

// bufOf is the working buffer of segments of member m of the allreduce
// under way: buf, or member m's first local buffer, in which case f is
// pointed at the member's other local buffers.
func (pl *placement) bufOf(m int, f *folder) []byte {
	if pl.members == nil {
		return pl.buf
	}
	f.others = pl.members[m][1:]
	return pl.members[m][0]
}

// gatherPlace is placeFor for AllGatherInto: receive m is segment m%nseg
// of the block of rank r-1-m/nseg, whose bytes nothing sends before the
// op has received them.
func (r *Ring) gatherPlace(m uint64) []byte {
	pl := &r.pl
	if m >= pl.total {
		return nil
	}
	nseg := uint64(pl.nseg)
	step, j := int(m/nseg), int(m%nseg)
	ro, rl := pl.gather.span(mod(r.rank-step-1, r.size))
	po, pn := piece(ro, rl, pl.gather.es, j, pl.nseg)
	if pn == 0 {
		return nil // nothing to place; the empty frame takes a buffer
	}
	return pl.buf[po : po+pn : po+pn]
}

// release returns b, the buffer of the frame just received, to its
// stream: as it is, or, while an allreduce places its allgather, in favour
// of a place for the frame that will take its turn, rxBuffers frames later
// on the same stream.
func (r *Ring) release(b *rxBuf) {
	s := r.rx[(r.recvCount-1)%r.nstreams]
	var dst []byte
	if r.pl.total > 0 {
		dst = r.placeFor(r.recvCount - 1 + rxBuffers*r.nstreams)
	}
	switch {
	case dst != nil && b.place:
		b.buf = dst
	case dst != nil:
		s.spare = append(s.spare, b)
		b = s.placeFree[len(s.placeFree)-1]
		s.placeFree = s.placeFree[:len(s.placeFree)-1]
		b.buf = dst
		r.placed++
	case b.place:
		b.buf, b.data = nil, nil
		s.placeFree = append(s.placeFree, b)
		b = s.spare[len(s.spare)-1]
		s.spare = s.spare[:len(s.spare)-1]
		r.placed--
	}
	s.free <- b
}

// stopPlacedReaders is end's part for a failed op that left places with
// the readers: it shuts the read side of the links from the previous rank
// (the ring is dead; nothing more is read there) and waits, bounded, for
// their readers to return, so that none writes into the caller's buffer
// after the op has returned.
func (r *Ring) stopPlacedReaders() {
	for _, s := range r.prev {
		if cr, ok := s.conn.(interface{ CloseRead() error }); ok {
			_ = cr.CloseRead()
		} else {
			_ = s.conn.Close()
		}
		_ = s.conn.SetReadDeadline(time.Now())
	}
	t := time.NewTimer(3 * r.cfg.AbortWait)
	defer t.Stop()
	for _, s := range r.prev {
		select {
		case <-s.readerDone:
		case <-t.C:
			r.log.Error("ring reader still running after the op failed; its buffer may still be written",
				"rank", r.rank, "stream", s.idx, "waited", 3*r.cfg.AbortWait)
			return
		}
	}
	r.placed = 0
}
