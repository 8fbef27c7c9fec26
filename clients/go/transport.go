package collectived

import (
	"errors"
	"fmt"
	"time"

	"github.com/collectived/collectived/ipc"
	"golang.org/x/sys/unix"
)

// Handle is a request in flight. Wait returns its outcome.
type Handle struct {
	c    *Client
	id   uint64
	done chan struct{}
	err  error

	// Filled by the reader before done closes.
	result   []byte // inline calls: where the result goes
	fd       int    // ALLOC_OK
	seg      ipc.AllocOK
	status   []byte
	gen      uint32
	seq      uint64
	finish   func(error) error // runs in Wait, once (copy back, release scratch)
	finished bool
}

// Wait blocks until the request completes or the client's timeout passes.
func (h *Handle) Wait() error {
	t := time.NewTimer(h.c.timeout)
	defer t.Stop()
	select {
	case <-h.done:
	case <-t.C:
		h.c.forget(h.id)
		return h.complete(fmt.Errorf("collectived: no reply from daemon at %s within %v (request %d): %w",
			h.c.socket, h.c.timeout, h.id, ipc.ErrTimeout))
	}
	return h.complete(h.err)
}

func (h *Handle) complete(err error) error {
	if !h.finished {
		h.finished = true
		if h.finish != nil {
			err = h.finish(err)
		}
		h.err = err
	}
	return h.err
}

// Done reports whether the reply has arrived.
func (h *Handle) Done() bool {
	select {
	case <-h.done:
		return true
	default:
		return false
	}
}

// Generation and Seq name the collective a completed call ran as.
func (h *Handle) Generation() uint32 { return h.gen }
func (h *Handle) Seq() uint64        { return h.seq }

// send registers a handle and writes the frame that encode appends.
func (c *Client) send(encode func(b []byte, id uint64) []byte, result []byte) (*Handle, error) {
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	id := c.nextID
	c.nextID++
	h := &Handle{c: c, id: id, done: make(chan struct{}), result: result, fd: -1}
	c.pending[id] = h
	c.mu.Unlock()

	c.wmu.Lock()
	c.wbuf = encode(c.wbuf[:0], id)
	err := c.conn.WriteFrame(c.wbuf, -1)
	c.wmu.Unlock()
	if err != nil {
		c.forget(id)
		return nil, fmt.Errorf("collectived: send to %s: %w", c.socket, err)
	}
	return h, nil
}

func (c *Client) forget(id uint64) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

// reader delivers replies to their handles until the connection ends, then
// fails every request still pending with the reason.
func (c *Client) reader() {
	defer close(c.readerDone)
	var callOK ipc.CallOK
	var cause error
	for {
		f, err := c.conn.ReadFrame()
		if err != nil {
			cause = fmt.Errorf("collectived: connection to %s lost: %w", c.socket, err)
			break
		}
		if f.Type == ipc.TypeError && f.ID == 0 {
			e, derr := ipc.DecodeError(f.Flags, f.Payload)
			if derr != nil {
				cause = derr
			} else {
				cause = e
			}
			break
		}
		c.mu.Lock()
		h := c.pending[f.ID]
		delete(c.pending, f.ID)
		c.mu.Unlock()
		if h == nil {
			// A reply to a request whose Wait timed out.
			if f.FD >= 0 {
				unix.Close(f.FD)
			}
			continue
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
		close(h.done)
	}
	if cause == nil {
		cause = errClosed
	}
	c.mu.Lock()
	if c.err == nil {
		c.err = cause
	}
	pending := c.pending
	c.pending = map[uint64]*Handle{}
	c.mu.Unlock()
	for _, h := range pending {
		h.err = cause
		close(h.done)
	}
	c.conn.Close()
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
