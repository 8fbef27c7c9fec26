package collectived

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/collectived/collectived/ipc"
	"golang.org/x/sys/unix"
)

// Handle is a request in flight. Wait returns its outcome.
type Handle struct {
	c     *Client
	id    uint64
	done  chan struct{} // dispatch sends once per request (buffered)
	fired atomic.Bool   // the reply (or the connection's end) has arrived
	err   error
	timer *time.Timer // reused by pooled handles

	// Filled by dispatch (read.go) before it signals done.
	result   []byte // inline calls: where the result goes
	fd       int    // ALLOC_OK
	seg      ipc.AllocOK
	status   []byte
	gen      uint32
	seq      uint64
	scratch  *Segment // a copied call's scratch segment, released in complete
	copyBack []byte   // where a copied call's result goes
	copyOff  int      // the result's offset in the scratch segment
	finished bool
	bulk     bool // a call too large for polling to pay (pollMaxBytes)
	laneOK   bool // a call that may take the lane (lane.go)
	named    bool // a named call (Desc.Named) of the name below
	name     string
}

// pollMaxBytes is the largest call whose reply the client polls for. A
// larger one takes longer than the spin here, and polling through it only
// takes CPU from the daemons doing the work (measured: polling through
// 64 MiB calls doubled their time on two CPUs).
const pollMaxBytes = ipc.PollMaxBytes

// Wait blocks until the request completes or the client's timeout passes.
//
// The waiting goroutines read the replies themselves (read.go): the one
// holding the connection's read token reads until its own reply comes,
// handing every other reply to its handle, then passes the token on.
func (h *Handle) Wait() error {
	if h.finished {
		return h.err
	}
	c := h.c
	deadline := time.Now().Add(c.timeout)
	for {
		if h.fired.Load() {
			<-h.done // already sent: does not block
			return h.complete(h.err)
		}
		// The token is free in the common case, one call at a time: take
		// it without arming a timer.
		select {
		case <-c.token:
			timedOut := c.readUntil(h, deadline)
			c.token <- struct{}{}
			if timedOut {
				return h.timedOut()
			}
			continue
		default:
		}
		if h.timer == nil {
			h.timer = time.NewTimer(time.Until(deadline))
		} else {
			h.timer.Reset(time.Until(deadline))
		}
		select {
		case <-c.token:
			h.timer.Stop()
			timedOut := c.readUntil(h, deadline)
			c.token <- struct{}{}
			if timedOut {
				return h.timedOut()
			}
		case <-h.done:
			h.timer.Stop()
			return h.complete(h.err)
		case <-h.timer.C:
			return h.timedOut()
		}
	}
}

// timedOut ends a Wait whose deadline passed, unless the reply won the
// race.
func (h *Handle) timedOut() error {
	c := h.c
	if !c.forget(h.id) {
		// The reply won the race with the deadline: take it.
		<-h.done
		return h.complete(h.err)
	}
	return h.complete(fmt.Errorf("collectived: no reply from daemon at %s within %v (request %d): %w",
		c.socket, c.timeout, h.id, ipc.ErrTimeout))
}

func (h *Handle) complete(err error) error {
	if !h.finished {
		h.finished = true
		if h.scratch != nil {
			err = h.releaseScratch(err)
		}
		h.err = err
	}
	return h.err
}

// releaseScratch ends a copied call: the result goes to the caller's
// buffer and the scratch segment back to the free list, unless no answer
// came (a timeout, a lost connection), when the daemon may still write
// into it: then it is never used again.
func (h *Handle) releaseScratch(err error) error {
	s, buf, off := h.scratch, h.copyBack, h.copyOff
	h.scratch, h.copyBack, h.copyOff = nil, nil, 0
	if err == nil {
		copy(buf, s.mem[off:off+len(buf)])
	} else if !daemonAnswered(err) {
		return err
	}
	h.c.putScratch(s)
	return err
}

// daemonAnswered reports whether err is the daemon's answer to a call, after
// which the daemon holds nothing of the call's buffer.
func daemonAnswered(err error) bool {
	var e *ipc.Error
	return errors.As(err, &e) && !e.Fatal
}

// signal hands the handle its outcome (dispatch filled it in).
func (h *Handle) signal() {
	h.fired.Store(true)
	h.done <- struct{}{}
}

// Done reports whether the reply has arrived. When no goroutine is reading
// the connection, it reads whatever replies have arrived, without waiting.
func (h *Handle) Done() bool {
	if h.finished || h.fired.Load() {
		return true
	}
	select {
	case <-h.c.token:
		h.c.readArrived()
		h.c.token <- struct{}{}
	default:
	}
	return h.fired.Load()
}

// Generation and Seq name the collective a completed call ran as.
func (h *Handle) Generation() uint32 { return h.gen }
func (h *Handle) Seq() uint64        { return h.seq }

// handlePool recycles the handles of synchronous calls (Do), whose
// handles never reach the caller, so that a steady loop of calls does not
// allocate.
var handlePool = sync.Pool{New: func() any { return &Handle{done: make(chan struct{}, 1)} }}

// send registers a handle and writes the frame that encode appends.
func (c *Client) send(encode func(b []byte, id uint64) []byte, result []byte) (*Handle, error) {
	return c.sendWith(&Handle{done: make(chan struct{}, 1)}, encode, result)
}

func (c *Client) sendWith(h *Handle, encode func(b []byte, id uint64) []byte, result []byte) (*Handle, error) {
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	if h.named {
		if other, busy := c.names[h.name]; busy {
			c.mu.Unlock()
			return nil, ipc.Errorf(ipc.CodeBadRequest, "named call %q: this client's call of that name (request %d) is still in flight; a name may be in flight only once", h.name, other)
		}
	}
	id := c.nextID
	c.nextID++
	h.c, h.id, h.result, h.fd = c, id, result, -1
	c.pending[id] = h
	if h.named {
		c.holdName(h.name, id)
	}
	c.mu.Unlock()

	c.wmu.Lock()
	c.wbuf = encode(c.wbuf[:0], id)
	var err error
	if c.takeLaneCall(h, id) {
		if c.lane.Put(c.wbuf) {
			err = c.conn.WriteFrame(ipc.WakeFrame, -1)
		}
	} else if err = c.waitLaneTaken(); err == nil {
		err = c.conn.WriteFrame(c.wbuf, -1)
	}
	c.wmu.Unlock()
	if err != nil {
		if !c.forget(id) {
			<-h.done // a reader failed it meanwhile
		}
		c.mu.Lock()
		c.nameAnswered(id)
		c.mu.Unlock()
		return nil, fmt.Errorf("collectived: send to %s: %w", c.socket, err)
	}
	return h, nil
}

// recycle returns a synchronous call's handle to the pool.
func recycle(h *Handle) {
	timer := h.timer
	*h = Handle{done: h.done, timer: timer}
	handlePool.Put(h)
}

// forget drops a pending request; false means a reader already took it
// and will signal (or has signalled) its handle.
func (c *Client) forget(id uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.pending[id]; !ok {
		return false
	}
	delete(c.pending, id)
	return true
}

// dispatch hands one frame to the handle it answers. A non-nil result is
// the end of the connection: a fatal ERROR from the daemon.
func (c *Client) dispatch(f ipc.Frame) error {
	if f.Type == ipc.TypeError && (f.ID == 0 || f.Flags&ipc.FlagFatal != 0) {
		// A fatal ERROR carries the id of the request that caused it, but
		// it ends the connection: that request and every other in flight
		// fail with it (fail), not with the EOF that follows.
		e, derr := ipc.DecodeError(f.Flags, f.Payload)
		if derr != nil {
			return derr
		}
		return e
	}
	if f.Type == ipc.TypeWakeClient {
		// A ring: the answer is on the lane, read next.
		if f.ID != 0 || len(f.Payload) != 0 {
			return ipc.Fatalf(ipc.CodeBadFrame, "WAKE_CLIENT with id %d and %d payload bytes, want 0 and 0", f.ID, len(f.Payload))
		}
		return nil
	}
	c.mu.Lock()
	h := c.pending[f.ID]
	delete(c.pending, f.ID)
	c.laneAnswered(f.ID)
	c.nameAnswered(f.ID)
	c.mu.Unlock()
	if h == nil {
		// A reply to a request whose Wait timed out.
		if f.FD >= 0 {
			unix.Close(f.FD)
		}
		return nil
	}
	switch f.Type {
	case ipc.TypeError:
		e, derr := ipc.DecodeError(f.Flags, f.Payload)
		if derr != nil {
			h.err = derr
		} else {
			h.err = e
		}
	case ipc.TypeCallOK:
		var callOK ipc.CallOK
		if err := ipc.DecodeCallOK(f.Payload, &callOK); err != nil {
			h.err = err
		} else {
			h.gen, h.seq = callOK.Generation, callOK.Seq
			if len(callOK.Result) != len(h.result) {
				h.err = fmt.Errorf("collectived: CALL_OK for request %d carries %d result bytes, want %d", f.ID, len(callOK.Result), len(h.result))
			} else {
				copy(h.result, callOK.Result)
			}
		}
	case ipc.TypeAllocOK:
		h.seg, h.err = ipc.DecodeAllocOK(f.Payload)
		h.fd = f.FD
	case ipc.TypeLaneOK:
		var lok ipc.LaneOK
		lok, h.err = ipc.DecodeLaneOK(f.Payload)
		h.seg.Size, h.fd = lok.Size, f.FD
	case ipc.TypeStatusOK:
		st, err := ipc.DecodeStatusOK(f.Payload)
		h.status, h.err = append([]byte(nil), st.JSON...), err
	case ipc.TypeFreeOK:
		h.err = ipc.DecodeEmpty(f.Type, f.Payload)
	default:
		h.err = fmt.Errorf("collectived: unexpected %s for request %d", f.Type, f.ID)
		if f.FD >= 0 {
			unix.Close(f.FD)
		}
	}
	h.signal()
	return nil
}

// fail ends the connection with cause: every request still pending fails
// with it, and so does every later call.
func (c *Client) fail(cause error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = cause
	}
	cause = c.err
	pending := c.pending
	c.pending = map[uint64]*Handle{}
	clear(c.names)
	clear(c.nameOf)
	c.mu.Unlock()
	for _, h := range pending {
		h.err = cause
		h.signal()
	}
	c.conn.CloseSocket()
}

// Err is the reason the connection ended, or nil while it is up.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if errors.Is(c.err, errClosed) {
		return nil
	}
	return c.err
}
