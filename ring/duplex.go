package ring

import "github.com/collectived/collectived/collective"

// A ring of two carries its small ops both ways on one connection.
//
// In a ring of two both links lead to the same peer, each connection
// carrying data one way. The receiving end of a one-way connection has
// nothing to send back but acknowledgements, so every other small frame
// it reads makes the kernel send a bare TCP ACK, from inside that read:
// on loopback the ACK's whole journey (out, in, and the sender's side
// processing it) runs in the reader's read(2), several microseconds on
// the small op's path (docs/TUNING.md, section 24). When data flows both
// ways on one connection, as MPI's TCP transport has it, each frame
// carries the acknowledgement of the last one received and no bare ACK is
// sent.
//
// So in a ring of two, stream 0 of the link rank 0 dialled (rank 0's
// next[0], rank 1's prev[0]) is duplex: the ops whose every frame is
// short (Start, Barrier, an allreduce on the small path of at most
// duplexBytes) send and receive on it, and it is the stream lent to
// AllReduceLent. Every other op keeps to the links as in a larger ring
// (so rank 0's longer frames still go out on this connection, one way):
// two long frames crossing on one connection measured slower than on
// two. Both ends
// derive the same choice from the description, so they agree on where
// each frame travels; the rendezvous protocol version (4) keeps peers
// that send the old way out of the ring.

// duplexBytes is the longest payload that travels both ways on the
// duplex stream, and so the longest rank 0 receives on it. Measured
// against one-way streams (docs/TUNING.md, section 24): 4 B faster,
// 4 KiB the same, 16 KiB and 64 KiB slower.
const duplexBytes = 4 << 10

// setupDuplex makes the ring of two's duplex stream: rank 0's next[0]
// learns to receive short frames, rank 1's prev[0] to send them.
func (r *Ring) setupDuplex() {
	if r.size != 2 {
		return
	}
	var d *stream
	if r.rank == 0 {
		d = r.next[0]
		d.receiveData(r.duplexLimit())
		r.bufBytes += int64(rxBuffers * (r.duplexLimit() + trailerLen))
	} else {
		d = r.prev[0]
		d.sendData()
		r.bufBytes += int64(len(d.wbuf))
	}
	d.duplex = true
	r.pair = []*stream{d}
}

// duplexLimit is the longest payload an op on the duplex stream sends.
func (r *Ring) duplexLimit() int { return min(r.smallLimit, duplexBytes) }

// shortFrames reports whether every frame of an op of d is at most
// duplexLimit, so that it travels on the duplex stream: a barrier (empty
// frames) or an allreduce on the small path that short. Every rank
// answers alike for the same description.
func (r *Ring) shortFrames(d *collective.Desc) bool {
	switch d.Op {
	case collective.OpBarrier:
		return true
	case collective.OpAllReduce:
		return r.Small(*d) && d.Bytes() <= uint64(r.duplexLimit())
	}
	return false
}

// route picks the streams the op under way sends on and receives from:
// the duplex stream for an op of short frames in a ring of two,
// otherwise the links' streams (only the first unless the op stripes).
func (r *Ring) route(short bool) {
	r.tx, r.rx = r.next, r.prev
	if short && r.pair != nil && r.nstreams == 1 {
		r.tx, r.rx = r.pair, r.pair
	}
}

// setupLenders makes the streams small ops receive on lendable
// (AllReduceLent): stream 0 from prev, and a ring of two's duplex stream.
func (r *Ring) setupLenders() {
	r.lenders = []*stream{r.prev[0]}
	if r.pair != nil && r.pair[0] != r.prev[0] {
		r.lenders = append(r.lenders, r.pair[0])
	}
	for _, s := range r.lenders {
		s.makeLendable()
	}
}
