package main

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// wedgeable is a daemon's Progress as the watchdog sees it, with its lock
// held from outside: Progress blocks until Unlock, as the daemon's does
// while something holds its main lock.
type wedgeable struct{ mu sync.Mutex }

func (w *wedgeable) Progress() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return "ring up, generation 1"
}

// TestWatchdogStopsWhileWedged: under systemd with WatchdogSec=, the
// daemon pings WATCHDOG=1 while Progress answers, none while Progress is
// stuck on the daemon's lock (so systemd restarts a wedged daemon), and
// pings again once the lock is free. A real notify socket stands in for
// systemd.
func TestWatchdogStopsWhileWedged(t *testing.T) {
	dir, err := os.MkdirTemp("", "cvd-notify-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", sock)
	t.Setenv("WATCHDOG_USEC", "100000") // pings every 50 ms
	t.Setenv("WATCHDOG_PID", "")

	// pings counts WATCHDOG=1 datagrams until d passes.
	pings := func(d time.Duration) int {
		n := 0
		buf := make([]byte, 4096)
		deadline := time.Now().Add(d)
		for {
			conn.SetReadDeadline(deadline)
			k, err := conn.Read(buf)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return n
			}
			if err != nil {
				t.Fatalf("reading the notify socket: %v", err)
			}
			if msg := string(buf[:k]); strings.Contains(msg, "WATCHDOG=1") {
				if !strings.Contains(msg, "STATUS=ring up, generation 1") {
					t.Fatalf("a ping without the daemon's progress: %q", msg)
				}
				n++
			}
		}
	}

	var d wedgeable
	n := newNotifier(slog.New(slog.DiscardHandler))
	stop := n.watchdog(&d)
	defer stop()
	if got := pings(500 * time.Millisecond); got < 3 {
		t.Fatalf("%d pings in 500 ms from a daemon that answers, want several (one per 50 ms)", got)
	}
	d.mu.Lock()
	pings(100 * time.Millisecond) // one may have left as the lock was taken
	if got := pings(500 * time.Millisecond); got != 0 {
		d.mu.Unlock()
		t.Fatalf("%d pings in 500 ms from a daemon wedged on its lock, want none", got)
	}
	d.mu.Unlock()
	if got := pings(500 * time.Millisecond); got < 3 {
		t.Fatalf("%d pings in 500 ms after the lock was freed, want several", got)
	}
}
