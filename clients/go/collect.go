package collectived

import (
	"fmt"

	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/ipc"
)

// checkCall refuses, before sending, what the connection's protocol
// version cannot carry. Everything else the daemon checks, and its
// BAD_REQUEST names the field.
func (c *Client) checkCall(d *collective.Desc) error {
	if v := d.Since(); v > c.Version() {
		return fmt.Errorf("collectived: %s needs protocol version %d; the daemon at %s speaks %d: %w", d.String(), v, c.socket, c.Version(), ipc.ErrUnsupported)
	}
	if d.Named && d.Name == "" {
		return ipc.Errorf(ipc.CodeBadRequest, "%s: a named call needs a name", d.String())
	}
	if d.Counts != nil && len(d.Counts) != c.Size() {
		return ipc.Errorf(ipc.CodeBadRequest, "%s: %d per-rank counts for a world of %d", d.String(), len(d.Counts), c.Size())
	}
	return nil
}

// StartInto sends a call whose result is not its input, an allgather or
// a reduce_scatter (protocol version 3): in holds d.Count elements, out
// the caller's result (d.Result elements). Neither may be touched until
// Wait returns. Both in segments of this client go as shared memory
// (zero copy); else small ones inline, larger ones through a scratch
// segment.
func (c *Client) StartInto(d collective.Desc, in, out []byte) (*Handle, error) {
	return c.startInto(&Handle{done: make(chan struct{}, 1)}, d, in, out)
}

// DoInto is StartInto and Wait.
func (c *Client) DoInto(d collective.Desc, in, out []byte) error {
	h := handlePool.Get().(*Handle)
	if _, err := c.startInto(h, d, in, out); err != nil {
		recycle(h)
		return err
	}
	err := h.Wait()
	recycle(h)
	return err
}

func (c *Client) startInto(h *Handle, d collective.Desc, in, out []byte) (*Handle, error) {
	if d.Op != collective.OpAllGather && d.Op != collective.OpReduceScatter {
		return nil, fmt.Errorf("collectived: %s works in place; use Start", d)
	}
	if err := c.checkCall(&d); err != nil {
		return nil, err
	}
	es := uint64(d.DType.Size())
	if uint64(len(in)) != d.Bytes() {
		return nil, fmt.Errorf("collectived: %s: input is %d bytes, the description needs %d", d, len(in), d.Bytes())
	}
	if want := d.Result(c.Rank(), c.Size()) * es; uint64(len(out)) != want {
		return nil, fmt.Errorf("collectived: %s: result buffer is %d bytes, the call gives %d", d, len(out), want)
	}
	call := ipc.Call{Desc: d}
	h.prepare(&d, len(in)+len(out))
	si, oi, inSeg := c.locate(in)
	so, oo, outSeg := c.locate(out)
	if (inSeg || len(in) == 0) && (outSeg || len(out) == 0) && (inSeg || outSeg) {
		call.SHM, call.Out = true, true
		if !inSeg {
			si, oi = so, 0
		}
		if !outSeg {
			so, oo = si, 0
		}
		call.Segment, call.Offset, call.OutSegment, call.OutOffset = si.id, oi, so.id, oo
		return c.sendWith(h, call.Append, nil)
	}
	if len(in) <= c.inlineMax && len(out) <= c.inlineMax {
		call.Data = in
		return c.sendWith(h, call.Append, out)
	}
	outOff := (len(in) + 63) &^ 63
	s, err := c.takeScratch(outOff + len(out))
	if err != nil {
		return nil, err
	}
	if s == nil {
		return nil, fmt.Errorf("collectived: %s: no scratch segment free for %d bytes (the daemon's shared-memory quota?): %w", d, outOff+len(out), ipc.ErrQuota)
	}
	copy(s.mem, in)
	call.SHM, call.Segment, call.Out, call.OutSegment, call.OutOffset = true, s.id, true, s.id, uint64(outOff)
	h.scratch, h.copyBack, h.copyOff = s, out, outOff
	if h, err = c.sendWith(h, call.Append, nil); err != nil {
		c.putScratch(s)
		return nil, err
	}
	return h, nil
}

func intsToCounts(counts []int) ([]uint64, error) {
	u := make([]uint64, len(counts))
	for i, n := range counts {
		if n < 0 {
			return nil, fmt.Errorf("collectived: counts[%d] = %d is negative", i, n)
		}
		u[i] = uint64(n)
	}
	return u, nil
}

// AllGather gathers every trainer's x, which all have the same length,
// into out (len(x) times the world size), in world-rank order.
func AllGather[T Elem](c *Client, x, out []T) error {
	d := collective.Desc{Op: collective.OpAllGather, DType: dtypeOf[T](), Count: uint64(len(x))}
	return c.DoInto(d, asBytes(x), asBytes(out))
}

// AllGatherV gathers blocks of per-rank lengths: counts[i] is world rank
// i's, len(x) must be the caller's own, out holds their sum.
func AllGatherV[T Elem](c *Client, x []T, counts []int, out []T) error {
	u, err := intsToCounts(counts)
	if err != nil {
		return err
	}
	d := collective.Desc{Op: collective.OpAllGather, DType: dtypeOf[T](), Count: uint64(len(x)), Counts: u}
	return c.DoInto(d, asBytes(x), asBytes(out))
}

// ReduceScatter reduces x (the whole vector, a multiple of the world
// size long) across the world and leaves the caller's block of the
// result in out (len(x) / world size elements).
func ReduceScatter[T Elem](c *Client, x, out []T, op ReduceOp) error {
	d := collective.Desc{Op: collective.OpReduceScatter, DType: dtypeOf[T](), Reduce: op, Count: uint64(len(x))}
	return c.DoInto(d, asBytes(x), asBytes(out))
}

// ReduceScatterV is ReduceScatter with per-rank block lengths, which sum
// to len(x); out holds the caller's counts[rank] elements.
func ReduceScatterV[T Elem](c *Client, x []T, counts []int, out []T, op ReduceOp) error {
	u, err := intsToCounts(counts)
	if err != nil {
		return err
	}
	d := collective.Desc{Op: collective.OpReduceScatter, DType: dtypeOf[T](), Reduce: op, Count: uint64(len(x)), Counts: u}
	return c.DoInto(d, asBytes(x), asBytes(out))
}

// Reduce reduces x across the world into world rank root's x; the other
// trainers' x are left unchanged.
func Reduce[T Elem](c *Client, x []T, root int, op ReduceOp) error {
	return c.Do(collective.Desc{Op: collective.OpReduce, DType: dtypeOf[T](), Reduce: op, Count: uint64(len(x)), Root: uint32(root)}, asBytes(x))
}
