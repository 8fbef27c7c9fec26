package main

import (
	"log/slog"
	"os"
	"sync"
	"time"

	sd "github.com/coreos/go-systemd/v22/daemon"

	"github.com/collectived/collectived/daemon"
)

// notifier speaks systemd's notify protocol (NOTIFY_SOCKET) through
// go-systemd: READY=1 once the sockets are bound, STATUS= with the ring's
// state and progress, WATCHDOG=1 while the daemon answers, STOPPING=1 on
// shutdown. Outside systemd every call is a no-op.
type notifier struct {
	log *slog.Logger
}

func newNotifier(log *slog.Logger) *notifier { return &notifier{log: log} }

func (n *notifier) send(state string) {
	if _, err := sd.SdNotify(false, state); err != nil {
		n.log.Warn("systemd notify failed", "state", state, "err", err)
	}
}

func (n *notifier) ready()    { n.send(sd.SdNotifyReady) }
func (n *notifier) stopping() { n.send(sd.SdNotifyStopping) }

// status forwards a one-line ring state; it must not block the daemon.
func (n *notifier) status(line string) { n.send("STATUS=" + line) }

// progressor is what the watchdog asks: *daemon.Daemon.
type progressor interface{ Progress() string }

var _ progressor = (*daemon.Daemon)(nil)

// progressEvery is how often STATUS= is refreshed with the daemon's
// progress (calls made, the collective under way) between state changes.
const progressEvery = 5 * time.Second

// watchdog runs, under systemd, a ticker that refreshes STATUS= with
// d.Progress every progressEvery and, if the unit has WatchdogSec=, pings
// WATCHDOG=1 at half its interval (the ticker then runs at the shorter of
// the two). Both go out only once Progress has taken the daemon's main
// lock: a daemon wedged on that lock stops the pings and systemd restarts
// it.
func (n *notifier) watchdog(d progressor) (stop func()) {
	if os.Getenv("NOTIFY_SOCKET") == "" {
		return func() {}
	}
	every, ping := progressEvery, false
	if interval, err := sd.SdWatchdogEnabled(false); err == nil && interval > 0 {
		ping = true
		every = min(every, interval/2)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			msg := "STATUS=" + d.Progress()
			if ping {
				msg = sd.SdNotifyWatchdog + "\n" + msg
			}
			n.send(msg)
		}
	}()
	return func() { close(done); wg.Wait() }
}
