package daemon

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// maxProgressError bounds the error quoted in a Progress line: systemd
// shows STATUS= on one line of `systemctl status`.
const maxProgressError = 200

// Progress is a one-line summary of where the daemon is, for systemd's
// STATUS= (`systemctl status collectived`): the ring's state and
// generation, trainers attached, calls made, and the collective under way
// with how long it has waited. Unlike Status it takes only the daemon's
// lock (no /proc reads, no stop-the-world memory statistics), so the
// service manager may be told every few seconds during training; and a
// daemon wedged on that lock cannot answer, which is what its watchdog
// checks.
func (d *Daemon) Progress() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	attached := 0
	var calls uint64
	for l := range d.slots {
		if d.slots[l].session != nil {
			attached++
		}
		calls += d.slots[l].calls
	}
	var b strings.Builder
	fmt.Fprintf(&b, "ring %s, generation %d, node %d of %d; trainers %d/%d attached, %d calls",
		d.state, d.gen, d.cfg.Rank, len(d.cfg.Peers), attached, len(d.slots), calls)
	if f := d.inflight; f.active {
		fmt.Fprintf(&b, "; collective %d %s for %v", f.seq, f.phase, time.Since(f.since).Round(time.Second))
	}
	if d.lastErr != nil && d.state != "up" {
		msg := d.lastErr.Error()
		if len(msg) > maxProgressError {
			cut := maxProgressError
			for cut > 0 && !utf8.RuneStart(msg[cut]) {
				cut--
			}
			msg = msg[:cut] + "…"
		}
		b.WriteString(": " + msg)
	}
	return strings.ReplaceAll(b.String(), "\n", " ")
}
