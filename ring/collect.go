package ring

import (
	"fmt"

	"github.com/collectived/collectived/collective"
)

// The version-3 collectives whose result differs in size from the input:
// allgather into one contiguous buffer and reduce-scatter. Blocks are
// those of world ranks, Config.Local to a ring rank in order, so a ring
// rank's block is its world ranks' blocks side by side.

// blocks is a world-rank layout cut at ring ranks: ring rank i's block
// is bytes [offs[i], offs[i+1]). It is computed once per op (from the
// counts, O(world)) into the ring's own slice, so that the op and its
// readers (inplace.go) find any block in O(1) without allocating.
type blocks struct {
	offs []int
	es   int
}

func (r *Ring) blocksOf(d *collective.Desc) blocks {
	local, world := max(r.cfg.Local, 1), r.ranks()
	if cap(r.blockOffs) < r.size+1 {
		r.blockOffs = make([]int, r.size+1)
	}
	b := blocks{offs: r.blockOffs[:r.size+1], es: d.DType.Size()}
	for i := 0; i <= r.size; i++ {
		var off uint64
		if i < r.size {
			off, _ = d.Block(i*local, world)
		} else {
			last, n := d.Block(world-1, world)
			off = last + n
		}
		b.offs[i] = int(off) * b.es
	}
	return b
}

// span is ring rank i's block in bytes.
func (b blocks) span(i int) (off, length int) { return b.offs[i], b.offs[i+1] - b.offs[i] }

// segments is how many frames every block travels in: the same for all
// blocks of an op, so that each step's sends and receives pair up.
func (r *Ring) segments(b blocks) int {
	longest := 0
	for i := 0; i < r.size; i++ {
		_, l := b.span(i)
		longest = max(longest, l)
	}
	seg := r.cfg.SegmentBytes / b.es * b.es
	return max(1, (longest+seg-1)/seg)
}

// piece is segment j of nseg of a block of l bytes at off, cut in whole
// elements.
func piece(off, l, es, j, nseg int) (int, int) {
	n := l / es
	base, rem := n/nseg, n%nseg
	s := j*base + min(j, rem)
	c := base
	if j < rem {
		c++
	}
	return off + s*es, c * es
}

// AllGatherInto gathers every world rank's block into out, which holds
// the whole result (world-rank order, d.Result elements) and, on entry,
// this ring rank's own block already in place (its world ranks' blocks,
// which the caller copied there). d is a world rank's call: Count its
// block, or Counts every world rank's. Step s sends the block of ring
// rank r-s and receives that of r-s-1, in segments relayed as they come.
func (r *Ring) AllGatherInto(d collective.Desc, out []byte) error {
	if err := r.checkCall(&d, collective.OpAllGather, -1); err != nil {
		return err
	}
	if want := d.Result(0, r.ranks()) * uint64(d.DType.Size()); uint64(len(out)) != want {
		return fmt.Errorf("ring rank %d: %s: result buffer is %d bytes, %s needs %d: %w", r.rank, d.Op, len(out), d.String(), want, collective.ErrInvalid)
	}
	if err := r.begin(&d); err != nil {
		return err
	}
	var err error
	if r.size > 1 {
		if err = r.healthy(); err == nil {
			// The layout goes in the ring's own slice: after begin, when
			// no other op can be using it.
			err = r.allGatherInto(r.blocksOf(&r.desc), out)
		}
	}
	return r.end(err)
}

func (r *Ring) allGatherInto(b blocks, out []byte) error {
	n := r.size
	nseg := r.segments(b)
	// Segments land in out itself (inplace.go); end stops placing.
	r.pl = placement{buf: out, total: uint64((n - 1) * nseg), gather: b, gathering: true, nseg: nseg}
	for s := 0; s < n-1; s++ {
		r.setStep(s)
		so, sl := b.span(mod(r.rank-s, n))
		ro, rl := b.span(mod(r.rank-s-1, n))
		for j := 0; j < nseg; j++ {
			bf, qo, ql, err := r.swapSegment(out, b.es, so, sl, ro, rl, j, nseg)
			if err != nil {
				return err
			}
			dst := out[qo : qo+ql]
			if bf.place {
				if ql > 0 && &bf.data[0] != &dst[0] {
					return r.failLocal(r.rx[(r.recvCount-1)%r.nstreams], fmt.Errorf("internal error: segment %d of step %d was received at the wrong place", j, s))
				}
				r.inPlace++
			} else {
				copy(dst, bf.data)
			}
			r.release(bf)
		}
	}
	return nil
}

// swapSegment sends segment j of the block of buf at so (sl bytes) and
// receives segment j of the block at ro (rl bytes), checked for length:
// one pipeline step of AllGatherInto and ReduceScatterLocal. It returns
// the received frame (to release) and where it belongs in buf.
func (r *Ring) swapSegment(buf []byte, es, so, sl, ro, rl, j, nseg int) (bf *rxBuf, qo, ql int, err error) {
	po, pl := piece(so, sl, es, j, nseg)
	if err := r.send(kindData, buf[po:po+pl], 0); err != nil {
		return nil, 0, 0, err
	}
	if bf, err = r.recv(kindData); err != nil {
		return nil, 0, 0, err
	}
	qo, ql = piece(ro, rl, es, j, nseg)
	if err := r.expectLen(bf, ql); err != nil {
		return nil, 0, 0, err
	}
	return bf, qo, ql, nil
}

// ReduceScatterLocal reduces ins, this ring rank's local inputs (each the
// whole vector, d.Count elements, left unchanged), across the ring and
// leaves in work (as long as an input) this ring rank's block of the
// result, at its place in the vector; the rest of work is scratch. Step
// s sends the partial of block r-s-1 and receives that of block r-s-2,
// which it combines with its own inputs (received partial on the left);
// step n-2 completes block r. Block c's elements are thus
// ((x_{c+1} op x_{c+2}) op ...) op x_c, computed by rank c alone.
func (r *Ring) ReduceScatterLocal(d collective.Desc, work []byte, ins [][]byte) error {
	if err := r.checkCall(&d, collective.OpReduceScatter, len(work)); err != nil {
		return err
	}
	if err := r.checkInputs(&d, work, ins); err != nil {
		return err
	}
	f := newFolder(&d, ins[0], ins[1:], false, r.ranks(), &r.f32)
	if err := r.begin(&d); err != nil {
		return err
	}
	var err error
	if r.size == 1 {
		f.localFinal(work, 0)
	} else if err = r.healthy(); err == nil {
		err = r.reduceScatter(r.blocksOf(&r.desc), work, &f)
	}
	return r.end(err)
}

func (r *Ring) reduceScatter(b blocks, work []byte, f *folder) error {
	n := r.size
	nseg := r.segments(b)
	for s := 0; s < n-1; s++ {
		r.setStep(s)
		so, sl := b.span(mod(r.rank-s-1, n))
		ro, rl := b.span(mod(r.rank-s-2, n))
		for j := 0; j < nseg; j++ {
			if s == 0 {
				po, pl := piece(so, sl, b.es, j, nseg)
				f.local(work[po:po+pl], po)
			}
			bf, qo, ql, err := r.swapSegment(work, b.es, so, sl, ro, rl, j, nseg)
			if err != nil {
				return err
			}
			f.combine(work[qo:qo+ql], bf.data, qo, s == n-2)
			r.release(bf)
		}
	}
	return nil
}

// BlockSpan is ring rank i's block of a version-3 allgather or
// reduce_scatter result (AllGatherInto's out, ReduceScatterLocal's work):
// byte offset and length.
func (r *Ring) BlockSpan(d *collective.Desc, i int) (off, length int) {
	local, es := max(r.cfg.Local, 1), uint64(d.DType.Size())
	o, _ := d.Block(i*local, r.ranks())
	end, n := d.Block((i+1)*local-1, r.ranks())
	return int(o * es), int((end + n - o) * es)
}

// checkInputs checks the local inputs of a reduction into work: at least
// one, each as long as work.
func (r *Ring) checkInputs(d *collective.Desc, work []byte, ins [][]byte) error {
	if len(ins) == 0 {
		return fmt.Errorf("ring rank %d: %s of no buffers: %w", r.rank, d.Op, collective.ErrInvalid)
	}
	for i, in := range ins {
		if len(in) != len(work) {
			return fmt.Errorf("ring rank %d: %s: local buffer %d is %d bytes, want %d: %w", r.rank, d.Op, i, len(in), len(work), collective.ErrInvalid)
		}
	}
	return nil
}
