package daemon

import (
	"fmt"
	"strings"
	"time"

	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/ipc"
)

// call is one queued request and when it arrived.
type call struct {
	req *ipc.Request
	at  time.Time
}

// slot is one local rank's place: the attached trainer, if any, and its
// calls not yet part of a collective, oldest first.
type slot struct {
	session *ipc.Session
	pid     int32
	label   string
	calls   uint64          // calls made since the daemon started
	last    collective.Desc // the last call made
	queue   []call          // pending, head first
	// owed is set when a generation failed before this slot's trainer
	// (attached or still to come) made its call of the failed collective:
	// that call gets this error instead of joining the next generation, so
	// that every trainer fails the same (k-th) call and the next calls line
	// up again.
	owed *ipc.Error
	// owedBy is the trainer that owed it, if one was attached: its debt
	// leaves with it, and its replacement starts afresh. nil means the
	// debt waits for whichever trainer attaches next.
	owedBy *ipc.Session
	// lostMid is set when the slot's trainer left mid-collective, so
	// causing the failure: its replacement starts afresh and owes nothing.
	lostMid bool
	// one is the buffer list of a call run inline (hotlane.go), kept so
	// that it does not allocate; gone is its stop check (trainerGone).
	one  [1][]byte
	gone func() error
}

// missing describes the local ranks without a call at their head, as world
// ranks with node, local rank and pid, for stall reports and timeouts.
// The caller holds d.mu.
func (d *Daemon) missingLocked() string {
	var b strings.Builder
	for l := range d.slots {
		s := &d.slots[l]
		if len(s.queue) > 0 {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "world rank %d (node %d, local rank %d, ", d.worldRank(l), d.cfg.Rank, l)
		if s.session == nil {
			b.WriteString("no trainer attached)")
		} else {
			fmt.Fprintf(&b, "pid %d)", s.pid)
		}
	}
	return b.String()
}

// headsLocked reports whether every slot has a call at its head and, if
// so, the oldest arrival among the heads.
func (d *Daemon) headsLocked() (ready bool, oldest time.Time, any bool) {
	ready = true
	for l := range d.slots {
		q := d.slots[l].queue
		if len(q) == 0 {
			ready = false
			continue
		}
		if !any || q[0].at.Before(oldest) {
			oldest = q[0].at
		}
		any = true
	}
	return ready, oldest, any
}

// popHeadsLocked moves the head call of every slot into dst.
func (d *Daemon) popHeadsLocked(dst []call) []call {
	dst = dst[:0]
	for l := range d.slots {
		s := &d.slots[l]
		dst = append(dst, s.queue[0])
		copy(s.queue, s.queue[1:])
		s.queue[len(s.queue)-1] = call{}
		s.queue = s.queue[:len(s.queue)-1]
	}
	return dst
}

// drainLocked removes every queued call of every slot into dst.
func (d *Daemon) drainLocked(dst []call) []call {
	for l := range d.slots {
		s := &d.slots[l]
		dst = append(dst, s.queue...)
		for i := range s.queue {
			s.queue[i] = call{}
		}
		s.queue = s.queue[:0]
	}
	return dst
}

func (d *Daemon) worldRank(local int) int { return d.cfg.Rank*d.cfg.LocalSize + local }

// describeWorldRank names a world rank the way errors show it.
func (d *Daemon) describeWorldRank(w int) string {
	L := d.cfg.LocalSize
	return fmt.Sprintf("world rank %d (node %d, local rank %d)", w, w/L, w%L)
}

// describeNode names a node rank with its address and world ranks.
func (d *Daemon) describeNode(n int) string {
	L := d.cfg.LocalSize
	addr := ""
	if n >= 0 && n < len(d.cfg.Peers) {
		addr = " " + d.cfg.Peers[n]
	}
	if L == 1 {
		return fmt.Sprintf("node %d%s (world rank %d)", n, addr, n)
	}
	return fmt.Sprintf("node %d%s (world ranks %d-%d)", n, addr, n*L, n*L+L-1)
}
