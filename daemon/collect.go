package daemon

import (
	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/ring"
)

// The node-local phases of reduce, allgather and reduce_scatter: the
// trainers' buffers are shared memory (or their inline copies), folded
// and copied here; only the node's block crosses the ring.

// scratch is a work buffer of n bytes, reused across calls.
func (d *Daemon) scratch(n int) []byte {
	if cap(d.work) < n {
		d.work = make([]byte, n)
	}
	return d.work[:n]
}

// inputs lists the calls' input buffers in local-rank order.
func (d *Daemon) inputs(calls []call) [][]byte {
	d.localBufs = d.localBufs[:0]
	for _, c := range calls {
		d.localBufs = append(d.localBufs, c.c.Buf)
	}
	return d.localBufs
}

// reduce folds every node's trainers into the work buffer and copies the
// result to the root, whose node this may be; the other trainers' buffers
// are left as they were.
func (d *Daemon) reduce(r *ring.Ring, desc collective.Desc, calls []call) error {
	L := d.cfg.LocalSize
	work := d.scratch(len(calls[0].c.Buf))
	err := r.ReduceLocal(desc, work, d.inputs(calls)) // the root stays a world rank
	clear(d.localBufs)
	if err == nil && int(desc.Root)/L == d.cfg.Rank {
		copy(calls[int(desc.Root)%L].c.Buf, work)
	}
	return err
}

// allGather places the node's trainers' blocks in the first trainer's
// result, gathers the other nodes' blocks around them, and copies the
// whole result to the other trainers.
func (d *Daemon) allGather(r *ring.Ring, desc collective.Desc, calls []call) error {
	out := calls[0].c.Out
	es := desc.DType.Size()
	first, _ := desc.Block(d.worldRank(0), d.cfg.LocalSize*len(d.cfg.Peers))
	off := int(first) * es
	for _, c := range calls {
		off += copy(out[off:], c.c.Buf)
	}
	if err := r.AllGatherInto(desc, out); err != nil {
		return err
	}
	for _, c := range calls[1:] {
		copy(c.c.Out, out)
	}
	return nil
}

// reduceScatter reduces the trainers' whole vectors into the work buffer,
// of which the ring leaves this node's block final, and hands each
// trainer its own block.
func (d *Daemon) reduceScatter(r *ring.Ring, desc collective.Desc, calls []call) error {
	work := d.scratch(len(calls[0].c.Buf))
	err := r.ReduceScatterLocal(desc, work, d.inputs(calls))
	clear(d.localBufs)
	if err != nil {
		return err
	}
	es := desc.DType.Size()
	world := d.cfg.LocalSize * len(d.cfg.Peers)
	for l, c := range calls {
		off, _ := desc.Block(d.worldRank(l), world)
		copy(c.c.Out, work[int(off)*es:])
	}
	return nil
}
