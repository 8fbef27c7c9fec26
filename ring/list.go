package ring

import (
	"fmt"

	"github.com/collectived/collectived/collective"
)

// Fused allreduces without copies.
//
// AllReduceList runs many allreduces of one description (the members)
// as one ring operation, as Fusion does, but on the members' own
// buffers: nothing is gathered into a fused buffer nor scattered back.
// The layout is PlanFusion's (fused chunk c is the members' own chunks c
// in member order, a member that alone takes the small path wholly in
// chunk 0), so every member gets the bits it would get alone, under the
// same rule (Exact). What changes is how a chunk is cut into pipeline
// segments: a frame is sent from, and received into, one member's
// buffer, so no segment crosses a member boundary. Member m's piece of
// every chunk is cut into the same number of parts, parts[m], set by its
// longest chunk and the segment size; segment j of every chunk is then
// part k of member m's piece for the same (m, k), and the ring's steps,
// which send segment j of one chunk and receive segment j of another,
// pair pieces of one member. A segment is (member, byte range), the same
// range in each of the member's local buffers.
//
// Frames: a step carries Segments() frames, the sum of the members'
// parts, where one allreduce of all the bytes would carry its longest
// chunk's segments: about one more frame per member. A member that alone
// takes the small path has all its data in chunk 0 and nothing in the
// others, yet takes a segment of every chunk: an empty frame in every
// step that sends another chunk. Measured on ResNet-50's step in world 2
// (BenchmarkAllReduceList: 115 of its 161 tensors take the small path),
// those frames cost no more than fusing the small members apart into 16
// ops that take the small path: 456 frames a step against 242 and 16
// more ops, and within the noise of one allreduce of all the bytes
// either way. The 16-bit floats must run them apart unless FusibleSmall
// (Exact refuses them). An empty member takes no segment.
//
// A fused count that takes the small path (its members then all do) is
// run as AllReduceChunks runs it: every rank's members are folded and
// copied into the ring's scratch at their places in chunk 0, which
// circulates whole, and each member's result is folded from there; that
// is the copy AllReduceLocal's small path makes too.

// List is a plan for AllReduceList: PlanFusion's layout (the embedded
// Fusion, whose Count is the fused count and whose Gather, Scatter and
// Chunks run the same members through AllReduceChunks) and the segments
// the members' pieces are cut into. A plan depends only on the counts
// and the ring's configuration; it is read only, so members fused step
// after step can keep theirs, and goroutines may share it.
type List struct {
	*Fusion
	segBytes int
	// parts[m] is how many segments member m's piece of every chunk is
	// cut into (0 for an empty member).
	parts []int
	// segs[j] is segment j of every chunk: a member and its part.
	segs []listSeg
}

type listSeg struct{ m, k int32 }

// PlanList lays out members of counts[m] elements of es bytes, in the
// order given, for AllReduceList on a ring of n ranks whose Config's
// SmallBytes and SegmentBytes are smallBytes and segBytes.
func PlanList(counts []int, n, es, smallBytes, segBytes int) (*List, error) {
	f, err := PlanFusion(counts, n, es, smallBytes)
	if err != nil {
		return nil, err
	}
	if segBytes < es {
		return nil, fmt.Errorf("ring: list of %d-byte elements with segment_bytes %d: %w", es, segBytes, collective.ErrInvalid)
	}
	l := &List{Fusion: f, segBytes: segBytes, parts: make([]int, len(counts))}
	perSeg := segBytes / es
	for m := range counts {
		_, longest := f.own(m, 0) // chunk 0 is never shorter than another
		l.parts[m] = (longest + perSeg - 1) / perSeg
		for k := 0; k < l.parts[m]; k++ {
			l.segs = append(l.segs, listSeg{m: int32(m), k: int32(k)})
		}
	}
	return l, nil
}

// Segments is how many frames each step of AllReduceList's large path
// sends (and receives): the sum of the members' parts.
func (l *List) Segments() int { return len(l.segs) }

// segment is segment j of chunk c: its member and its byte offset and
// length in the member's buffers.
func (l *List) segment(c, j int) (m, off, n int) {
	s := l.segs[j]
	m = int(s.m)
	po, pn := l.own(m, c)
	ss, sn := split(pn, l.parts[m], int(s.k))
	return m, (po + ss) * l.es, sn * l.es
}

// AllReduceList is AllReduceLocal of every member of plan at once, as
// one ring operation on the members' own buffers: members[m][i] is
// member m's local buffer i (as AllReduceLocal's bufs), counts[m]
// elements of d's dtype; every member has the same number of local
// buffers. d describes them all (dtype, reduce op, scales, name) and its
// Count is plan.Count. Every member ends with the bytes AllReduceLocal
// gives it alone, when plan.Exact(d, local buffers) holds; a plan that
// is not exact is refused. Every rank must pass an equal plan (the same
// counts, in the same order) with the description; as with
// AllReduceChunks no frame carries it, and plans that differ fail the op
// with ErrBadFrame when a segment's length differs, or give wrong
// results when none does. Buffers must not overlap. A steady caller
// reusing its plan allocates nothing.
func (r *Ring) AllReduceList(d collective.Desc, plan *List, members [][][]byte) error {
	if err := r.checkList(&d, plan, members); err != nil {
		return err
	}
	f := newFolder(&d, nil, nil, true, r.ranks(), &r.f32)
	if err := r.begin(&d); err != nil {
		return err
	}
	var err error
	es := plan.es
	if r.size == 1 {
		for m := range members {
			buf := members[m][0]
			f.others = members[m][1:]
			f.localFinal(buf, 0)
			f.copyBack(buf, 0)
		}
	} else if err = r.healthy(); err == nil {
		if r.isSmall(plan.Count*es, es) {
			err = r.allReduceSmallList(plan, members, &f)
		} else {
			err = r.allReduceRing(nil, members, partition{es: es, nseg: plan.Segments(), list: plan}, &f)
		}
	}
	return r.end(err)
}

// checkList checks AllReduceList's arguments against the plan and the
// ring, without touching the ring.
func (r *Ring) checkList(d *collective.Desc, plan *List, members [][][]byte) error {
	op := collective.OpAllReduce
	switch {
	case plan == nil:
		return fmt.Errorf("ring rank %d: %s list without a plan: %w", r.rank, op, collective.ErrInvalid)
	case plan.es != d.DType.Size():
		return fmt.Errorf("ring rank %d: %s list: plan of %d-byte elements for %s: %w", r.rank, op, plan.es, d.DType, collective.ErrInvalid)
	case plan.n != r.size || plan.smallBytes != r.cfg.SmallBytes || plan.segBytes != r.cfg.SegmentBytes:
		return fmt.Errorf("ring rank %d: %s list: plan for %d ranks, small_bytes %d, segment_bytes %d; the ring has %d, %d, %d: %w",
			r.rank, op, plan.n, plan.smallBytes, plan.segBytes, r.size, r.cfg.SmallBytes, r.cfg.SegmentBytes, collective.ErrInvalid)
	case len(members) != len(plan.counts):
		return fmt.Errorf("ring rank %d: %s list: %d members for a plan of %d: %w", r.rank, op, len(members), len(plan.counts), collective.ErrInvalid)
	}
	if err := r.checkCall(d, op, plan.Count*plan.es); err != nil {
		return err
	}
	locals := 1
	if len(members) > 0 {
		locals = len(members[0])
	}
	if locals == 0 {
		return fmt.Errorf("ring rank %d: %s list: member 0 has no buffers: %w", r.rank, op, collective.ErrInvalid)
	}
	for m, bufs := range members {
		if len(bufs) != locals {
			return fmt.Errorf("ring rank %d: %s list: member %d has %d local buffers, member 0 has %d: %w",
				r.rank, op, m, len(bufs), locals, collective.ErrInvalid)
		}
		for i, b := range bufs {
			if want := plan.counts[m] * plan.es; len(b) != want {
				return fmt.Errorf("ring rank %d: %s list: member %d's local buffer %d is %d bytes, the plan's %d elements are %d: %w",
					r.rank, op, m, i, len(b), plan.counts[m], want, collective.ErrInvalid)
			}
		}
	}
	if !plan.Exact(*d, locals) {
		return fmt.Errorf("ring rank %d: %s list of %s: members that alone take the small path would round otherwise beside larger ones (FusibleSmall); run them apart: %w",
			r.rank, op, d.String(), collective.ErrInvalid)
	}
	return nil
}

// allReduceSmallList is the small path of a list: every member's local
// fold goes to its place in chunk 0 of this rank's scratch slot, the
// slots circulate as allReduceSmall's do, and each member's result is
// the fold of its places in every slot, in rank order.
func (r *Ring) allReduceSmallList(plan *List, members [][][]byte, f *folder) error {
	es, L := plan.es, plan.Count*plan.es
	own := r.smallSlot(r.rank, L)
	for m, bufs := range members {
		at, _, _ := plan.Piece(m, 0)
		f.others = bufs[1:]
		f.local(bufs[0], 0)
		copy(own[at*es:], bufs[0])
	}
	if err := r.circulate(L); err != nil {
		return err
	}
	for m, bufs := range members {
		at, _, _ := plan.Piece(m, 0)
		lo, hi := at*es, at*es+len(bufs[0])
		f.others = bufs[1:]
		f.total(bufs[0], func(i int) []byte { return r.smallSlot(i, L)[lo:hi] }, r.size)
		f.copyBack(bufs[0], 0)
	}
	return nil
}
