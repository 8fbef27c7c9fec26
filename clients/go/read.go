package collectived

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/collectived/collectived/ipc"
)

// Replies are read by the goroutines waiting for them, one at a time: the
// holder of c.token reads frames and hands each to its handle until its
// own reply has come, then passes the token on. There is no reader
// goroutine. One parked on the socket (or any timer armed while a caller
// polls) makes an idle P's thread sleep in epoll, and every reply then
// wakes that thread as well as the caller: on a machine of two CPUs that
// cost a small call about a third of its time (docs/TUNING.md, section 10).

// readUntil reads and delivers frames until h has its reply, polling for
// up to the client's spin when h is small. It reports whether the deadline
// passed first. A broken connection fails every pending request, h among
// them.
func (c *Client) readUntil(h *Handle, deadline time.Time) (timedOut bool) {
	spin := c.spin
	if h.bulk {
		spin = 0
	}
	for !h.fired() {
		f, err := c.readFrame(spin, deadline)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && time.Now().After(deadline) {
				return true
			}
			c.fail(c.lost(err))
			return false
		}
		if cause := c.dispatch(f); cause != nil {
			c.fail(cause)
			return false
		}
	}
	return false
}

// readArrived delivers the frames already received, without waiting.
func (c *Client) readArrived() {
	for {
		f, err := c.readFrame(0, time.Now())
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				c.fail(c.lost(err))
			}
			return
		}
		if cause := c.dispatch(f); cause != nil {
			c.fail(cause)
			return
		}
	}
}

// drain reads until the daemon closes its end or the deadline passes,
// delivering what comes: Close's wait for the daemon to let go.
func (c *Client) drain(deadline time.Time) {
	for {
		f, err := c.readFrame(0, deadline)
		if err != nil {
			return
		}
		if cause := c.dispatch(f); cause != nil {
			c.fail(cause)
			return
		}
	}
}

// readFrame reads the next frame from the socket or the lane.
func (c *Client) readFrame(spin time.Duration, deadline time.Time) (ipc.Frame, error) {
	f, err := c.conn.ReadFrameBy(spin, deadline)
	if err == ipc.ErrRung {
		return c.lane.Take(c.laneBuf, c.conn.MaxFrame())
	}
	return f, err
}

func (c *Client) lost(err error) error {
	return fmt.Errorf("collectived: connection to %s lost: %w", c.socket, err)
}
