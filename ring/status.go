package ring

import (
	"time"

	"github.com/collectived/collectived/collective"
)

// Status is a snapshot of a ring for `collectived status`: where it is
// and when each neighbour was last heard from.
type Status struct {
	Rank, Size int
	Generation uint32
	Started    bool
	// Op is the collective under way (OpInvalid when idle); Seq is its
	// seq, or the next seq when idle; Step is its step (-1 when none).
	Op                 collective.Op
	Seq                uint64
	Step               int
	NextAddr, PrevAddr string
	// LastFromNext and LastFromPrev are when a frame last arrived from
	// each neighbour (zero in a world of one).
	LastFromNext, LastFromPrev time.Time
	Err                        error // the first failure, nil while healthy
	// BufferBytes is what the ring allocated at New for its pipeline: the
	// receive buffers of the streams from the previous rank, the write
	// buffers of those to the next, the small-op scratch, and in a ring of
	// two the duplex stream's other side (duplex.go). Ops borrow
	// the caller's buffer for everything else, so this bounds what a ring
	// adds to its process's memory whatever the sizes reduced.
	BufferBytes int64
}

// Status may be called from any goroutine.
func (r *Ring) Status() Status {
	st := Status{
		Rank: r.rank, Size: r.size, Generation: r.gen.Load(), Started: r.started.Load(),
		Op: collective.Op(r.curOp.Load()), Seq: r.nextSeq.Load(), Step: -1, Err: r.Err(),
		BufferBytes: r.bufBytes,
	}
	if st.Op != collective.OpInvalid {
		st.Seq = r.curSeq.Load()
		st.Step = int(r.curStep.Load())
	}
	if len(r.next) > 0 {
		st.NextAddr, st.PrevAddr = r.next[0].peerAddr, r.prev[0].peerAddr
		st.LastFromNext, st.LastFromPrev = lastHeard(r.next), lastHeard(r.prev)
	}
	return st
}

func lastHeard(ss []*stream) time.Time {
	var last int64
	for _, s := range ss {
		last = max(last, s.lastRead.Load())
	}
	return time.Unix(0, last)
}

// PeerOp is a collective a neighbour announced it is inside (heartbeats
// carry the op under way while a link is quiet).
type PeerOp struct {
	Desc  collective.Desc
	Seq   uint64
	Rank  int       // the neighbour's ring rank
	Addr  string    // its address
	Since time.Time // when this rank first heard of it
}

// PeerInOp reports the latest op a neighbour announced, if any. A rank
// idle at seq k whose neighbour is inside op k knows the collective has
// begun elsewhere while its own caller has not called: the daemon's stall
// report names its missing trainers from that moment.
func (r *Ring) PeerInOp() (PeerOp, bool) {
	r.curMu.Lock()
	defer r.curMu.Unlock()
	n := &r.peerAt[r.peerLast%peerHistory]
	if n.s == nil {
		return PeerOp{}, false // nothing heard yet
	}
	h := &n.h
	return PeerOp{Seq: h.Seq, Rank: n.s.peerRank, Addr: n.s.peerAddr, Since: n.at,
		Desc: collective.Desc{Op: h.Op, DType: h.DType, Reduce: h.Reduce, Root: h.Root, Count: h.Count}}, true
}
