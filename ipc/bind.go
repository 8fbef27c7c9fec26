package ipc

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/collectived/collectived/internal/sockowner"
)

// Socket bind retry backoff: a daemon that is stopping lets go of its
// socket within its shutdown, usually milliseconds; later retries no
// slower than maxBindBackoff, so a socket freed is taken promptly.
const (
	minBindBackoff = 20 * time.Millisecond
	maxBindBackoff = 500 * time.Millisecond
)

// listenSocketRetry is listenSocket, retrying for up to timeout while a
// live daemon answers on path: on a node where a daemon is restarted, the
// previous one may still be shutting down. After the timeout the error
// wraps ErrSocketInUse and names the path and the process that answered.
// A timeout of 0 tries once. Other failures return at once.
func listenSocketRetry(path string, mode os.FileMode, timeout time.Duration, log *slog.Logger) (*net.UnixListener, os.FileInfo, error) {
	start := time.Now()
	deadline := start.Add(timeout)
	backoff := minBindBackoff
	for attempt := 1; ; attempt++ {
		l, fi, err := listenSocket(path, mode)
		if err == nil {
			if attempt > 1 {
				log.Info("unix socket bound after retries", "socket", path, "attempts", attempt, "waited", time.Since(start).Round(time.Millisecond))
			}
			return l, fi, nil
		}
		if !errors.Is(err, ErrSocketInUse) && !errors.Is(err, syscall.EADDRINUSE) {
			return nil, nil, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			if attempt == 1 {
				return nil, nil, err
			}
			return nil, nil, fmt.Errorf("ipc: socket %s still in use after %v (%d attempts; bind timeout, timeouts.connect in the config): %w",
				path, time.Since(start).Round(time.Millisecond), attempt, err)
		}
		wait := min(backoff, left)
		log.Warn("unix socket in use, retrying", "socket", path, "attempt", attempt, "in", wait.Round(time.Millisecond), "left", left.Round(time.Millisecond), "err", err)
		time.Sleep(wait)
		backoff = min(2*backoff, maxBindBackoff)
	}
}

// answering names the process listening on the Unix socket c is connected
// to, by SO_PEERCRED (the listener's credentials as of its listen call).
func answering(c net.Conn) string {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return "unknown (not a Unix connection)"
	}
	cr, err := PeerCred(uc)
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	return sockowner.Process(int(cr.PID))
}
