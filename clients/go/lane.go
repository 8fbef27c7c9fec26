package collectived

import (
	"fmt"
	"time"

	"github.com/collectived/collectived/ipc"
	"golang.org/x/sys/unix"
)

// The lane (docs/PROTOCOL.md, LANE): a small call goes to the daemon, and
// its answer comes back, through a page of shared memory both poll,
// instead of the socket. Order is what makes it safe: the daemon matches
// calls by the order it reads them, and the lane and the socket are two
// ways in. So a call takes the lane only when nothing else of this client
// is in flight, and nothing follows it on the socket until the daemon has
// taken it from the lane (waitLaneTaken). A named call (protocol version
// 4) never takes it: the lane carries calls matched by order only
// (Handle.prepare).

// openLane asks the daemon for the connection's lane and maps it.
func (c *Client) openLane() error {
	h, err := c.send(func(b []byte, id uint64) []byte { return ipc.AppendEmpty(b, ipc.TypeLane, id) }, nil)
	if err != nil {
		return err
	}
	if err := h.Wait(); err != nil {
		return fmt.Errorf("collectived: lane: %w", err)
	}
	if h.fd < 0 {
		return fmt.Errorf("collectived: lane: LANE_OK came without a memfd")
	}
	defer unix.Close(h.fd)
	l, err := ipc.OpenLane(h.fd, h.seg.Size, ipc.ClientSide)
	if err != nil {
		return fmt.Errorf("collectived: lane: %w", err)
	}
	// Only the token's holder reads, and it is this goroutine now.
	<-c.token
	c.lane, c.laneBuf = l, make([]byte, ipc.LaneFrameMax)
	c.conn.SetLane(l)
	c.token <- struct{}{}
	return nil
}

// closeLane unmaps the lane once no goroutine can touch it: writers put
// on it under wmu, and the token's holder polls it. A reader that keeps
// the token past closeWait (it cannot: the socket is closed and its next
// poll fails) would leave the lane mapped rather than fault.
func (c *Client) closeLane() {
	if c.lane == nil {
		return
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	select {
	case <-c.token:
		c.lane.Close()
		c.conn.SetLane(nil)
		c.lane = nil
		c.token <- struct{}{}
	case <-time.After(closeWait):
	}
}

// HasLane reports whether the connection has a lane (Options.NoLane unset
// and a daemon of protocol version 2): calls of up to ipc.PollMaxBytes
// made while no other is in flight then go through it.
func (c *Client) HasLane() bool {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.lane != nil
}

// takeLaneCall reports whether call id, whose frame is in c.wbuf, goes on
// the lane, and if so claims the lane for it. c.wmu is held.
func (c *Client) takeLaneCall(h *Handle, id uint64) bool {
	if c.lane == nil || !h.laneOK || len(c.wbuf) > ipc.LaneFrameMax {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.laneID != 0 || len(c.pending) != 1 {
		return false
	}
	c.laneID = id
	return true
}

// waitLaneTaken waits until the daemon has taken the frame this client
// last put on the lane, so that a frame sent on the socket now follows it.
// c.wmu is held.
func (c *Client) waitLaneTaken() error {
	if c.lane == nil || c.lane.Free() {
		return nil
	}
	deadline := time.Now().Add(c.timeout)
	for !c.lane.Free() {
		if time.Now().After(deadline) {
			return fmt.Errorf("collectived: the daemon at %s did not take the call on the lane within %v: %w", c.socket, c.timeout, ipc.ErrTimeout)
		}
		_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	}
	return nil
}

// laneAnswered frees the lane once the answer to its call has come
// (from either way in).
func (c *Client) laneAnswered(id uint64) {
	if c.laneID == id {
		c.laneID = 0
	}
}
