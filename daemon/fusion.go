package daemon

import (
	"fmt"
	"math"
	"time"

	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/ring"
)

// Fusion: the named allreduces a round runs that share a dtype, reduce
// op and scales are run as one ring operation of up to FusionThreshold
// bytes, directly on the trainers' buffers (ring.AllReduceList: no
// copies). Every member keeps the fold order it has alone, so the
// results are bit-identical to the calls run one by one. Where a 16-bit
// float that alone takes the small path would fold otherwise in a larger
// operation (ring.FusibleSmall), such members are fused only with their
// kind, in operations that stay small.

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
		if desc.Op != collective.OpAllReduce || limit == 0 || b >= limit {
			dst = append(dst, group{members: []int{m}, bytes: b})
			continue
		}
		md := desc.Matched()
		k := fusionKey{dtype: desc.DType, reduce: desc.Reduce, pre: math.Float64bits(md.PreScale), post: math.Float64bits(md.PostScale)}
		bound := limit
		if small := int(b) <= d.cfg.SmallBytes || int(desc.Count) < n; small && !ring.FusibleSmall(desc, n, L) {
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

// runFused runs a group of allreduces as one ring operation seq, on the
// trainers' own buffers.
func (d *Daemon) runFused(r *ring.Ring, seq uint64, g group) error {
	nm := &d.nm
	L := len(d.slots)
	first := nm.taken[g.members[0]*L].c.Desc
	counts := make([]int, len(g.members))
	members := make([][][]byte, len(g.members))
	// The description's name carries a digest of the members, so that
	// nodes whose plans differed (a bug: every node plans from the same
	// round) would fail on the ring's comparison, not compute silently.
	h := nameHash("")
	for i, m := range g.members {
		dm := nm.taken[m*L].c.Desc
		counts[i] = int(dm.Count)
		h = (h ^ nameHash(dm.Name) ^ dm.Count) * 1099511628211
		members[i] = make([][]byte, L)
		for l := 0; l < L; l++ {
			members[i][l] = nm.taken[m*L+l].c.Buf
		}
	}
	plan, err := ring.PlanList(counts, len(d.cfg.Peers), first.DType.Size(), d.cfg.SmallBytes, d.cfg.SegmentBytes)
	if err != nil {
		return failKind(errInternal, "collective %d: fusing %d named calls: %v", seq, len(g.members), err)
	}
	desc := collective.Desc{Op: collective.OpAllReduce, DType: first.DType, Reduce: first.Reduce, Count: uint64(plan.Count),
		PreScale: first.PreScale, PostScale: first.PostScale, Named: true, // no ordered call can match it
		Name: clip(fmt.Sprintf("%d named calls fused (%016x), from %q", len(g.members), h, first.Name), collective.MaxNameLen)}
	d.mu.Lock()
	d.inflight = inflight{active: true, seq: seq, phase: phaseRing, desc: desc, since: time.Now()}
	d.mu.Unlock()
	return r.AllReduceList(desc, plan, members)
}
