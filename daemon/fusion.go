package daemon

import (
	"fmt"
	"math"
	"time"

	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/ring"
)

// Fusion: the named allreduces a round runs that share a dtype, reduce
// op and scales, each smaller than a pipeline segment, are packed into
// ring operations of at most FusionThreshold bytes, each rank's buffers copied into one fused
// buffer per local trainer and out again (ring.Fusion). The layout gives
// every element the fold order it would have alone, so the results are
// bit-identical to the calls run one by one. Members that alone take
// the small path are fused only among themselves, into buffers that
// take it too (planGroups).

// group is a ring operation a round runs: members indexes the round's
// names (nm.taken holds L calls per name).
type group struct {
	members []int
	bytes   uint64
	fuse    bool
}

// fusionKey is what members of one fused operation share.
type fusionKey struct {
	dtype     collective.DType
	reduce    collective.ReduceOp
	pre, post uint64 // scale bits, as matched (1 is none)
	smallOnly bool   // 16-bit members that alone take the small path
}

// planGroups cuts the round's names into ring operations, the same on
// every node (it depends only on the round's result): allreduces by
// fusion key, in the order of each group's first name, each other op on
// its own.
func (d *Daemon) planGroups(dst []group) []group {
	nm := &d.nm
	L := len(d.slots)
	n := len(d.cfg.Peers)
	limit := uint64(d.cfg.FusionThreshold)
	open := map[fusionKey]int{}
	for m := 0; m < len(nm.taken)/L; m++ {
		desc := nm.taken[m*L].c.Desc
		b := desc.Bytes()
		// A call of a pipeline segment or more runs alone: it fills the
		// ring's pipeline by itself, and copying it into and out of a
		// fused buffer would cost more than the ring operation saved
		// (docs/BENCHMARKS.md, "Named calls and fusion").
		if desc.Op != collective.OpAllReduce || limit == 0 || b >= limit || int(b) >= d.cfg.SegmentBytes {
			dst = append(dst, group{members: []int{m}, bytes: b})
			continue
		}
		md := desc.Matched()
		k := fusionKey{dtype: desc.DType, reduce: desc.Reduce, pre: math.Float64bits(md.PreScale), post: math.Float64bits(md.PostScale)}
		bound := limit
		if int(b) <= d.cfg.SmallBytes || int(desc.Count) < n {
			// A call that alone takes the small path is fused only with
			// its kind, in a buffer that takes it too: in a larger one
			// it would sit wholly in chunk 0 (its fold order), which
			// slows the ring down to that chunk, and for the 16-bit
			// floats it would fold in another order (ring.FusibleSmall).
			k.smallOnly = true
			bound = min(limit, uint64(d.cfg.SmallBytes))
		}
		if gi, ok := open[k]; ok && dst[gi].bytes+b <= bound {
			dst[gi].members = append(dst[gi].members, m)
			dst[gi].bytes += b
			dst[gi].fuse = true
			continue
		}
		open[k] = len(dst)
		dst = append(dst, group{members: []int{m}, bytes: b})
	}
	return dst
}

// runFused runs a group of allreduces as one ring operation seq.
func (d *Daemon) runFused(r *ring.Ring, seq uint64, g group) error {
	nm := &d.nm
	L := len(d.slots)
	first := nm.taken[g.members[0]*L].c.Desc
	es := first.DType.Size()
	counts := make([]int, len(g.members))
	for i, m := range g.members {
		counts[i] = int(nm.taken[m*L].c.Desc.Count)
	}
	plan, err := ring.PlanFusion(counts, len(d.cfg.Peers), es, d.cfg.SmallBytes)
	if err != nil {
		return failKind(errInternal, "collective %d: fusing %d named calls: %v", seq, len(g.members), err)
	}
	if !plan.Exact(first, L) {
		return failKind(errInternal, "collective %d: fusing %d named calls would change their results; planGroups should not have grouped them", seq, len(g.members))
	}
	if len(nm.fused) < L {
		nm.fused = make([][]byte, L)
	}
	size := plan.Count * es
	for l := 0; l < L; l++ {
		if cap(nm.fused[l]) < size {
			nm.fused[l] = make([]byte, size)
		}
		nm.fused[l] = nm.fused[l][:size]
		for i, m := range g.members {
			if err := plan.Gather(nm.fused[l], i, nm.taken[m*L+l].c.Buf); err != nil {
				return failKind(errInternal, "collective %d: %v", seq, err)
			}
		}
	}
	desc := collective.Desc{Op: collective.OpAllReduce, DType: first.DType, Reduce: first.Reduce, Count: uint64(plan.Count),
		PreScale: first.PreScale, PostScale: first.PostScale,
		Name: clipName(fmt.Sprintf("%d named calls fused, from %q", len(g.members), first.Name))}
	d.mu.Lock()
	d.inflight = inflight{active: true, seq: seq, phase: phaseRing, desc: desc, since: time.Now()}
	d.mu.Unlock()
	if err := r.AllReduceChunks(desc, nm.fused[:L], plan.Chunks); err != nil {
		return err
	}
	for l := 0; l < L; l++ {
		for i, m := range g.members {
			if err := plan.Scatter(nm.taken[m*L+l].c.Buf, i, nm.fused[l]); err != nil {
				return failKind(errInternal, "collective %d: %v", seq, err)
			}
		}
	}
	return nil
}

func clipName(s string) string {
	if len(s) > collective.MaxNameLen {
		return s[:collective.MaxNameLen]
	}
	return s
}
