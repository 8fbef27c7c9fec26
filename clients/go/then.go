package collectived

import (
	"errors"
	"os"
	"time"
)

// Callbacks (Then, Future). No goroutine is made per call: a reply is
// read by whichever goroutine holds the connection's read token (read.go),
// and a handle with callbacks that it completes is settled there (signal)
// and put on the client's ready list. That goroutine runs the list once it
// has passed the token on and holds none of the client's locks
// (runReady), so a callback may make calls of its own, and wait for them.
// While calls with callbacks are in flight and no caller reads, one
// goroutine per client (help) reads for them, and ends when none is left.

// Then arranges for f to be called once, with the error Wait would return
// (nil when the call succeeded), when the call completes: its result is
// then in the caller's buffers, which the caller owns again. If the call
// has completed already, f runs at once, on the calling goroutine. Then
// may be called several times; the functions given before the call
// completed run in the order given.
//
// Otherwise f runs on the goroutine that reads the call's reply: one
// inside a call of this client that waits for a reply (Wait or Done of
// another handle, a synchronous call such as AllReduce or Alloc, a Start
// that makes a scratch segment), Close (f then gets the error every call
// in flight gets), or, while no caller reads the connection, the client's
// own goroutine, which runs while calls with callbacks are in flight and
// ends when none is left. f runs after that goroutine has let go of the
// connection and the client's locks: f may start calls and wait for
// them. f should be short: the replies of other calls are not read while
// it runs on the goroutine that reads them, and callbacks of different
// calls may run at the same time, on different goroutines.
//
// A call with callbacks waits for its reply at most the client's timeout
// from the first Then, as Wait does from its start; f then gets an
// ErrTimeout error. Wait may still be called, from the handle's own
// goroutine, and returns the same error; a handle is not for several
// goroutines at once (its callbacks aside).
func (h *Handle) Then(f func(error)) {
	if f == nil {
		panic("collectived: Then(nil)")
	}
	if h.finished {
		f(h.err)
		return
	}
	c := h.c
	c.mu.Lock()
	if h.thensRan {
		// runReady settled it (thenErr) and ran the others.
		c.mu.Unlock()
		f(h.thenErr)
		return
	}
	old := h.state.Or(stateThen)
	if old&stateFired == 0 || old&stateThen != 0 {
		// Not answered yet, or answered and on the ready list: whoever
		// runs the list runs f too.
		h.thens = append(h.thens, f)
		if old&stateThen == 0 {
			h.thenBy = time.Now().Add(c.timeout)
			if !c.helping {
				c.helping = true
				go c.help()
			}
		}
		c.mu.Unlock()
		return
	}
	// Answered before it had callbacks: signal sent on done, which Wait
	// takes at once.
	c.mu.Unlock()
	f(h.Wait())
}

// Future returns a channel that receives the call's outcome once (the
// error Wait would return) when the call completes; it has room for it,
// so no goroutine waits to send. It is made with Then: nothing is left
// behind when the channel is never read.
func (h *Handle) Future() <-chan error {
	ch := make(chan error, 1)
	h.Then(func(err error) { ch <- err })
	return ch
}

// queueReady puts a handle with callbacks, now settled, on the ready
// list. Its signaller runs the list (runReady) once it holds neither the
// read token nor a lock.
func (c *Client) queueReady(h *Handle) {
	c.mu.Lock()
	if c.readyTail == nil {
		c.readyHead = h
	} else {
		c.readyTail.readyNext = h
	}
	c.readyTail = h
	c.hasReady.Store(true)
	c.mu.Unlock()
}

// runReady runs the callbacks of the handles on the ready list (signal
// settled them). Called without the read token and without c.mu; a
// callback's own calls may run it again inside.
func (c *Client) runReady() {
	if !c.hasReady.Load() {
		return
	}
	c.mu.Lock()
	first := c.readyHead
	c.readyHead, c.readyTail = nil, nil
	c.hasReady.Store(false)
	for h := first; h != nil; h = h.readyNext {
		h.thensRan = true // h.thens is this goroutine's from now on
	}
	c.mu.Unlock()
	for h := first; h != nil; {
		next := h.readyNext
		thens := h.thens
		h.thens, h.readyNext = nil, nil
		for _, f := range thens {
			f(h.thenErr)
		}
		h = next
	}
}

// help reads the connection for the calls with callbacks in flight while
// no caller does: it takes the read token whenever it is free, reads one
// frame (parking, without polling: the caller is busy elsewhere), passes
// the token on and runs what it completed. It ends once no call with
// callbacks is in flight. At most one runs per client (c.helping).
func (c *Client) help() {
	for {
		<-c.token
		c.mu.Lock()
		by, any := c.thenDeadline()
		if !any {
			c.helping = false
			c.mu.Unlock()
			c.token <- struct{}{}
			c.runReady()
			return
		}
		c.mu.Unlock()
		f, err := c.readFrame(0, by)
		switch {
		case err == nil:
			if cause := c.dispatch(f); cause != nil {
				c.fail(cause)
			}
		case errors.Is(err, os.ErrDeadlineExceeded):
			if !time.Now().Before(by) {
				c.expireThens()
			}
		default:
			c.fail(c.lost(err))
		}
		c.token <- struct{}{}
		c.runReady()
	}
}

// thenDeadline is the earliest thenBy of the calls with callbacks in
// flight; false when there are none. c.mu is held.
func (c *Client) thenDeadline() (time.Time, bool) {
	var by time.Time
	any := false
	for _, h := range c.pending {
		if h.state.Load()&stateThen != 0 && (!any || h.thenBy.Before(by)) {
			by, any = h.thenBy, true
		}
	}
	return by, any
}

// expireThens fails the calls with callbacks whose wait has run out, as
// Wait's timeout does (a late reply is dropped; a named call keeps its
// name until it comes).
func (c *Client) expireThens() {
	now := time.Now()
	var late []*Handle
	c.mu.Lock()
	for id, h := range c.pending {
		if h.state.Load()&stateThen != 0 && !now.Before(h.thenBy) {
			delete(c.pending, id)
			late = append(late, h)
		}
	}
	c.mu.Unlock()
	for _, h := range late {
		h.err = c.timeoutError(h)
		h.signal()
	}
}
