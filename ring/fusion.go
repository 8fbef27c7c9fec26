package ring

import (
	"fmt"

	"github.com/collectived/collectived/collective"
)

// Fusing allreduces.
//
// Many allreduces of one dtype, reduce op and scales (the members) can
// run as one: each rank copies its members into one fused buffer, runs
// AllReduceChunks on it and copies the results back. An element's
// result depends only on the rank its fold starts at (doc.go, Reduction
// order), so a member gets the bits it would get alone when each of its
// elements is folded from the same rank as it would be alone:
//
//   - a member that alone takes the large path has its chunk c in fused
//     chunk c, which the ring folds from rank c;
//   - a member that alone takes the small path is folded in rank order
//     0..N-1, which is fused chunk 0's order, so it goes wholly there.
//
// Fused chunk c is thus the members' own chunks c one after another, in
// member order. The second rule fails for the 16-bit floats: the small
// path rounds each rank's partial and then only the final value, the
// large path rounds the partial every hop sends but folds the last
// rank's own local fold in unrounded (docs/PROTOCOL.md, Reductions).
// FusibleSmall says when the two agree anyway; Exact applies it.
//
// A daemon fusing members m of one description d, with locals trainers'
// buffers each: plan := PlanFusion(counts, ring size, element size,
// small_bytes); if plan.Exact(d, locals), then for every local buffer l
// plan.Gather(fused[l], m, member m's buffer l) for every m; d.Count =
// plan.Count; AllReduceChunks(d, fused, plan.Chunks); then
// plan.Scatter(member m's buffer l, m, fused[l]). A plan depends only on
// the counts and the ring, so a set fused step after step can keep it.
// AllReduceList (list.go) runs the same layout on the members' own
// buffers, without Gather and Scatter.

// Fusion is the layout of members in a fused allreduce (PlanFusion).
// Offsets and counts are in elements; Gather and Scatter take bytes.
type Fusion struct {
	// Count is the fused buffer's length in elements, the sum of the
	// members'.
	Count int
	// Chunks are the fused buffer's chunks, for AllReduceChunks.
	Chunks []int

	n, es, smallBytes int
	counts            []int
	// at[m*n+c] is where member m's chunk c starts in the fused buffer.
	at []int
}

// PlanFusion lays out members of counts[m] elements of es bytes for a
// ring of n ranks whose Config.SmallBytes is smallBytes, in the order
// given. Exact tells whether the result is bit-identical to running the
// members alone.
func PlanFusion(counts []int, n, es, smallBytes int) (*Fusion, error) {
	if n < 1 || es < 1 || smallBytes < 0 {
		return nil, fmt.Errorf("ring: fusion for %d ranks, %d-byte elements, small_bytes %d: %w", n, es, smallBytes, collective.ErrInvalid)
	}
	f := &Fusion{Chunks: make([]int, n), n: n, es: es, smallBytes: smallBytes,
		counts: append([]int(nil), counts...), at: make([]int, len(counts)*n)}
	for m, cnt := range counts {
		if cnt < 0 {
			return nil, fmt.Errorf("ring: fusion member %d has %d elements: %w", m, cnt, collective.ErrInvalid)
		}
	}
	for c := 0; c < n; c++ {
		start := f.Count
		for m := range counts {
			f.at[m*n+c] = f.Count
			_, l := f.own(m, c)
			f.Count += l
		}
		f.Chunks[c] = f.Count - start
	}
	return f, nil
}

// small is Ring.isSmall for count elements.
func (f *Fusion) small(count int) bool { return count*f.es <= f.smallBytes || count < f.n }

// own is member m's chunk c as the ring would cut it alone: count
// elements from off in the member's buffer. A small-path member is all
// chunk 0.
func (f *Fusion) own(m, c int) (off, count int) {
	total := f.counts[m]
	if f.small(total) {
		if c == 0 {
			return 0, total
		}
		return total, 0
	}
	return partition{base: total / f.n, rem: total % f.n}.chunk(c)
}

// Piece is member m's chunk c: count elements from off in the member's
// buffer, which go at elements from at in the fused buffer.
func (f *Fusion) Piece(m, c int) (at, off, count int) {
	off, count = f.own(m, c)
	return f.at[m*f.n+c], off, count
}

// Gather copies member m's buffer into its places in fused: AllReduceChunks'
// input, one of each rank's local buffers.
func (f *Fusion) Gather(fused []byte, m int, member []byte) error {
	if err := f.check(fused, m, member); err != nil {
		return err
	}
	for c := 0; c < f.n; c++ {
		at, off, count := f.Piece(m, c)
		copy(fused[at*f.es:(at+count)*f.es], member[off*f.es:])
	}
	return nil
}

// Scatter copies member m's result from fused into member.
func (f *Fusion) Scatter(member []byte, m int, fused []byte) error {
	if err := f.check(fused, m, member); err != nil {
		return err
	}
	for c := 0; c < f.n; c++ {
		at, off, count := f.Piece(m, c)
		copy(member[off*f.es:(off+count)*f.es], fused[at*f.es:])
	}
	return nil
}

func (f *Fusion) check(fused []byte, m int, member []byte) error {
	switch {
	case m < 0 || m >= len(f.counts):
		return fmt.Errorf("ring: fusion of %d members has no member %d: %w", len(f.counts), m, collective.ErrInvalid)
	case len(member) != f.counts[m]*f.es:
		return fmt.Errorf("ring: fusion member %d is %d bytes, want %d: %w", m, len(member), f.counts[m]*f.es, collective.ErrInvalid)
	case len(fused) != f.Count*f.es:
		return fmt.Errorf("ring: fused buffer is %d bytes, want %d: %w", len(fused), f.Count*f.es, collective.ErrInvalid)
	}
	return nil
}

// Exact reports whether AllReduceChunks of the fused buffer with Chunks
// gives every member the bytes AllReduceLocal gives it alone, for members
// described by d (dtype, reduce op and scales; its count is not used) on
// a ring whose ranks each fold locals local buffers. It is when the
// fused buffer takes the small path (its members then do too, folded
// alike), or when no member that alone takes the small path has data, or
// when FusibleSmall says such members fold alike in chunk 0.
func (f *Fusion) Exact(d collective.Desc, locals int) bool {
	if f.small(f.Count) || FusibleSmall(d, f.n, locals) {
		return true
	}
	for _, count := range f.counts {
		if count > 0 && f.small(count) {
			return false
		}
	}
	return true
}

// FusibleSmall reports whether an allreduce described by d that alone
// takes the small path gives the same bytes in chunk 0 of a large-path
// allreduce, on a ring of n ranks that each fold locals local buffers.
// It does for every dtype but the 16-bit floats, and for those in a world
// of one (no ring), and for max and min, whose every value is one of the
// inputs (they take no scales), exact in any order. Otherwise the large
// path rounds every hop's partial where the small path rounds none, and
// it folds the last rank's local fold unrounded into the partial it
// receives where the small path rounds it first. So sum, prod and avg
// agree only in a ring of two whose ranks each have one buffer and no
// prescale: the local fold is then the input itself.
func FusibleSmall(d collective.Desc, n, locals int) bool {
	switch {
	case n <= 1 || !d.DType.Half() || d.Reduce == collective.Max || d.Reduce == collective.Min:
		return true
	}
	return n == 2 && locals <= 1 && d.Matched().PreScale == 0
}
