package collectived

import (
	"encoding/json"
	"fmt"

	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/ipc"
)

// Start sends one collective call on buf (len(buf) == d.Bytes()) and
// returns at once. The result lands in buf; buf must not be touched until
// Wait returns. buf may be plain memory (inline up to InlineMax, else
// copied through a scratch segment) or lie inside a Segment (zero copy).
func (c *Client) Start(d collective.Desc, buf []byte) (*Handle, error) {
	return c.start(&Handle{done: make(chan struct{}, 1)}, d, buf)
}

func (c *Client) start(h *Handle, d collective.Desc, buf []byte) (*Handle, error) {
	if uint64(len(buf)) != d.Bytes() {
		return nil, fmt.Errorf("collectived: %s: buffer is %d bytes, the description needs %d", d, len(buf), d.Bytes())
	}
	if err := c.checkCall(&d); err != nil {
		return nil, err
	}
	if d.Op == collective.OpAllGather || d.Op == collective.OpReduceScatter {
		return nil, fmt.Errorf("collectived: %s: the result is not the input; use StartInto", d)
	}
	var call ipc.Call
	call.Desc = d
	h.prepare(&d, len(buf))
	if seg, off, ok := c.locate(buf); ok {
		call.SHM, call.Segment, call.Offset = true, seg.id, off
		return c.sendWith(h, call.Append, nil)
	}
	if len(buf) == 0 || len(buf) <= c.inlineMax {
		call.Data = buf
		return c.sendWith(h, call.Append, buf)
	}
	s, err := c.takeScratch(len(buf))
	if err != nil {
		return nil, err
	}
	if s == nil {
		// Every small-call scratch segment is in use (calls in flight):
		// this one goes inline rather than making another.
		call.Data = buf
		return c.sendWith(h, call.Append, buf)
	}
	copy(s.mem, buf)
	call.SHM, call.Segment = true, s.id
	h.scratch, h.copyBack = s, buf
	h, err = c.sendWith(h, call.Append, nil)
	if err != nil {
		c.putScratch(s)
		return nil, err
	}
	return h, nil
}

// prepare sets what a call of d with n bytes of buffers asks of its
// handle. Its waiter polls for the reply only when the call is small: the
// reply to a bulk call comes too late for a poll to catch. A named call
// never takes the lane, which carries the calls matched by order only
// (docs/PROTOCOL.md, "Named calls").
func (h *Handle) prepare(d *collective.Desc, n int) {
	h.bulk = n > pollMaxBytes
	h.laneOK = !h.bulk && !d.Named
	h.named, h.name = d.Named, d.Name
}

// holdName records that request id is a named call of name in flight.
// c.mu is held.
func (c *Client) holdName(name string, id uint64) {
	if c.names == nil {
		c.names, c.nameOf = map[string]uint64{}, map[uint64]string{}
	}
	c.names[name], c.nameOf[id] = id, name
}

// nameAnswered frees the name of request id, if it is a named call, once
// the daemon has answered it. A named call whose Wait timed out keeps its
// name until then: the daemon still has it in flight and would refuse
// another of the name. c.mu is held.
func (c *Client) nameAnswered(id uint64) {
	if name, ok := c.nameOf[id]; ok {
		delete(c.nameOf, id)
		delete(c.names, name)
	}
}

// Do sends one collective call and waits for it. In the steady state it
// does not allocate.
func (c *Client) Do(d collective.Desc, buf []byte) error {
	h := handlePool.Get().(*Handle)
	if _, err := c.start(h, d, buf); err != nil {
		recycle(h)
		return err
	}
	err := h.Wait()
	recycle(h)
	return err
}

// AllReduce reduces buf, holding elements of dt, across the world in place.
func (c *Client) AllReduce(buf []byte, dt DType, op ReduceOp) error {
	if dt.Size() == 0 {
		return fmt.Errorf("collectived: allreduce: unknown dtype %v", dt)
	}
	return c.Do(collective.Desc{Op: collective.OpAllReduce, DType: dt, Reduce: op, Count: uint64(len(buf) / dt.Size())}, buf)
}

// AllReduce reduces x across the world in place.
func AllReduce[T Elem](c *Client, x []T, op ReduceOp) error {
	return c.Do(collective.Desc{Op: collective.OpAllReduce, DType: dtypeOf[T](), Reduce: op, Count: uint64(len(x))}, asBytes(x))
}

// AllReduceAsync starts an allreduce of x; x must not be touched until the
// handle's Wait returns.
func AllReduceAsync[T Elem](c *Client, x []T, op ReduceOp) (*Handle, error) {
	dt := dtypeOf[T]()
	return c.Start(collective.Desc{Op: collective.OpAllReduce, DType: dt, Reduce: op, Count: uint64(len(x))}, asBytes(x))
}

// Broadcast copies world rank root's x into every trainer's x.
func Broadcast[T Elem](c *Client, x []T, root int) error {
	return c.Do(collective.Desc{Op: collective.OpBroadcast, DType: dtypeOf[T](), Count: uint64(len(x)), Root: uint32(root)}, asBytes(x))
}

// Barrier returns once every trainer of the world has called it.
func (c *Client) Barrier() error {
	return c.Do(collective.Desc{Op: collective.OpBarrier}, nil)
}

// Status asks the daemon for its state (see docs/PROTOCOL.md, STATUS_OK).
func (c *Client) Status() (map[string]any, error) {
	raw, err := c.StatusJSON()
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("collectived: status: %w", err)
	}
	return m, nil
}

// StatusJSON asks the daemon for its state as raw JSON.
func (c *Client) StatusJSON() ([]byte, error) {
	h, err := c.send(func(b []byte, id uint64) []byte { return ipc.AppendEmpty(b, ipc.TypeStatus, id) }, nil)
	if err != nil {
		return nil, err
	}
	if err := h.Wait(); err != nil {
		return nil, fmt.Errorf("collectived: status: %w", err)
	}
	return h.status, nil
}
