package rendezvous

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/collectived/collectived/internal/sockowner"
)

// Bind retry backoff: the first retry comes soon, since the usual holder
// (a dial's source port, a daemon just killed, a test's probe) lets go
// within milliseconds; later ones no slower than maxBindBackoff, so a
// port freed is taken promptly.
const (
	minBindBackoff = 20 * time.Millisecond
	maxBindBackoff = 500 * time.Millisecond
)

// bind listens on addr, retrying while the port is in use for up to
// timeout. A busy port is usually a passing thing on a node that starts
// and restarts daemons: a connection's source port that happens to be
// ours, or the previous daemon's socket still being torn down. Any other
// failure (no such address, no permission) will not pass and returns at
// once. The error after the timeout wraps syscall.EADDRINUSE and names the
// address and, where /proc tells, who holds the port.
func bind(addr string, timeout time.Duration, log *slog.Logger) (net.Listener, error) {
	start := time.Now()
	deadline := start.Add(timeout)
	backoff := minBindBackoff
	for attempt := 1; ; attempt++ {
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			if attempt > 1 {
				log.Info("rendezvous bound after retries", "addr", addr, "attempts", attempt, "waited", time.Since(start).Round(time.Millisecond))
			}
			return ln, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("listen on %s: %w", addr, err)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, fmt.Errorf("listen on %s: port still in use after %v (%d attempts; bind timeout, timeouts.connect in the config); held by %s: %w",
				addr, time.Since(start).Round(time.Millisecond), attempt, holder(addr), err)
		}
		wait := min(backoff, left)
		log.Warn("rendezvous port in use, retrying bind", "addr", addr, "attempt", attempt, "in", wait.Round(time.Millisecond), "left", left.Round(time.Millisecond),
			"held_by", holder(addr), "err", err)
		time.Sleep(wait)
		backoff = min(2*backoff, maxBindBackoff)
	}
}

// holder names who holds addr's port, best effort.
func holder(addr string) string {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return "unknown (port " + strconv.Quote(p) + " is not a number)"
	}
	return sockowner.TCP(port)
}
