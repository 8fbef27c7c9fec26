package main

import (
	"log/slog"
	"sync"
	"time"

	sd "github.com/coreos/go-systemd/v22/daemon"

	"github.com/collectived/collectived/daemon"
)

// notifier speaks systemd's notify protocol (NOTIFY_SOCKET) through
// go-systemd: READY=1 once the sockets are bound, STATUS= with the ring's
// state, WATCHDOG=1 while the daemon answers, STOPPING=1 on shutdown.
// Outside systemd every call is a no-op.
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

// watchdog pings systemd at half the configured interval for as long as
// the daemon's main lock can be taken: a daemon wedged on that lock stops
// the pings and systemd restarts it.
func (n *notifier) watchdog(d *daemon.Daemon) (stop func()) {
	interval, err := sd.SdWatchdogEnabled(false)
	if err != nil || interval <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(interval / 2)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if d.Alive() {
					n.send(sd.SdNotifyWatchdog)
				}
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}
