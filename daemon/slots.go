package daemon

import (
	"fmt"
	"strings"

	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/ipc"
)

// call is one queued request and when it arrived.
type call = queued[*ipc.Request]

// slot is one local rank's place as the daemon sees it: the attached
// trainer and what status shows of it. Its calls and debts are the
// matcher's (match.go).
type slot struct {
	session *ipc.Session
	pid     int32
	label   string
	calls   uint64          // calls made since the daemon started
	last    collective.Desc // the last call made
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
		if d.match.queueLen(l) > 0 {
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
