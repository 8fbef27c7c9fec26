package rendezvous

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/collectived/collectived/internal/fdtest"
	"github.com/collectived/collectived/internal/syncbuf"
)

// A listener out of fds cannot accept: it logs why and retries, and the
// connection waiting in the backlog is accepted and served (here refused
// for its bad magic, by name) once fds are free again.
func TestAcceptOutOfFDs(t *testing.T) {
	var logs syncbuf.Buffer
	tg := newTarget(t, false, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	const retrying = "rendezvous accept failed, retrying"
	c, err := fdtest.ConnectWhileFull("tcp", tg.addr, func() bool { return strings.Contains(logs.String(), retrying) }, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if log := logs.String(); !strings.Contains(log, retrying) || !strings.Contains(log, "too many open files") {
		t.Fatalf("no accept failure naming the cause in the log within 10s:\n%s", log)
	}
	c.Write([]byte("garbage!"))
	rj := tg.rejects.waitFor(t, ErrBadMagic, 10*time.Second)
	wantErr(t, "listener", rj.err, ErrBadMagic)
}
