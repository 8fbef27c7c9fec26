package daemon_test

import (
	"testing"
	"time"

	"github.com/collectived/collectived/daemon"
	"github.com/collectived/collectived/ipc"
)

// The trainers' socket carries the daemon's settings, and a node with
// several trainers has its sessions re-arm their poll after every answer
// (docs/TUNING.md, section 15); a node with one keeps the default.
func TestServerConfig(t *testing.T) {
	c := daemon.DefaultConfig()
	c.SocketPath = "/run/test/d.sock"
	c.Spin = 200 * time.Microsecond
	c.InlineBytes = 4096
	sc := c.ServerConfig(nil)
	if sc.Path != c.SocketPath || sc.Spin != c.Spin || sc.InlineLimit != c.InlineBytes || sc.MaxClients != c.MaxClients {
		t.Errorf("server config %+v does not carry the daemon's %+v", sc, c)
	}
	if err := sc.Verify(); err != nil {
		t.Errorf("server config of the defaults: %v", err)
	}
	if sc.RearmMinBytes != ipc.DefaultRearmMinBytes {
		t.Errorf("one trainer: RearmMinBytes %d, want the default %d", sc.RearmMinBytes, ipc.DefaultRearmMinBytes)
	}
	c.LocalSize = 2
	if sc := c.ServerConfig(nil); sc.RearmMinBytes != 0 {
		t.Errorf("two trainers: RearmMinBytes %d, want 0 (re-arm after every call)", sc.RearmMinBytes)
	}
}
