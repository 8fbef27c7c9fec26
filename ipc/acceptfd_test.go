package ipc

import (
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/collectived/collectived/internal/fdtest"
	"github.com/collectived/collectived/internal/syncbuf"
)

// A daemon out of fds cannot accept: it logs why and retries, the trainer
// already attached goes on being served, and the connection waiting in
// the backlog is accepted and attaches once fds are free again.
func TestAcceptOutOfFDs(t *testing.T) {
	var logs syncbuf.Buffer
	srv, _ := startServer(t, func(c *ServerConfig) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	attached := dial(t, srv.Path())
	attached.attach()

	const retrying = "accept failed; retrying"
	var status Frame
	nc, err := fdtest.ConnectWhileFull("unix", srv.Path(), func() bool {
		if !strings.Contains(logs.String(), retrying) {
			return false
		}
		status = attached.roundTrip(AppendEmpty(nil, TypeStatus, attached.id()), -1)
		return true
	}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if log := logs.String(); !strings.Contains(log, retrying) || !strings.Contains(log, "too many open files") {
		nc.Close()
		t.Fatalf("no accept failure naming the cause in the log within 10s:\n%s", log)
	}
	if status.Type != TypeStatusOK {
		nc.Close()
		t.Fatalf("the attached trainer's STATUS while the daemon was out of fds: %s (%v), want STATUS_OK", status.Type, attached.errorOf(status))
	}

	uc := nc.(*net.UnixConn)
	uc.SetReadDeadline(time.Now().Add(20 * time.Second))
	waiting := &client{t: t, uc: uc, c: NewConn(uc, ClientSide), next: 1}
	t.Cleanup(func() { waiting.c.Close() })
	waiting.attach()
}
