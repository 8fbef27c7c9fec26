package daemon

import (
	"fmt"
	"time"
)

// watchRing logs a collective that has stayed in the ring past the stall
// warning interval. The engine is blocked inside the ring op then, so it
// cannot say so itself; what this node can tell is whom it waits for. The
// node whose trainers have not called logs them, with their pids, from
// waitLocal.
func (d *Daemon) watchRing() {
	t := time.NewTicker(max(d.cfg.StallWarning/4, 10*time.Millisecond))
	defer t.Stop()
	var (
		seq      uint64
		gen      uint32
		warned   time.Duration // the last warning threshold passed
		tracking bool
	)
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-t.C:
		}
		d.mu.Lock()
		f, r := d.inflight, d.ring
		d.mu.Unlock()
		if !f.active || f.phase != phaseRing || r == nil {
			tracking = false
			continue
		}
		if g := r.Generation(); !tracking || f.seq != seq || g != gen {
			tracking, seq, gen, warned = true, f.seq, g, 0
		}
		waited := time.Since(f.since)
		if waited < warned+d.cfg.StallWarning {
			continue
		}
		warned = waited - waited%d.cfg.StallWarning
		n := len(d.cfg.Peers)
		prev := (d.cfg.Rank + n - 1) % n
		st := r.Status()
		heard := "never"
		if !st.LastFromPrev.IsZero() && st.LastFromPrev.Unix() > 0 {
			heard = fmt.Sprintf("%.1fs ago", time.Since(st.LastFromPrev).Seconds())
		}
		d.log.Warn("collective stalled in the ring", "seq", f.seq, "generation", gen,
			"waited", waited.Round(time.Millisecond), "call", f.desc.String(), "step", st.Step,
			"waiting_for", fmt.Sprintf("data from ring rank %d, %s, last heard %s", prev, d.describeNode(prev), heard),
			"hint", "the node whose trainers have not called logs them as not_called")
	}
}
