package daemon_test

import (
	"testing"
	"time"

	"github.com/collectived/collectived/daemon"
	"github.com/collectived/collectived/ipc"
	"github.com/collectived/collectived/rendezvous"
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

// Every node must stripe the same ops, and daemons of different builds
// learn whether they do only from the ring handshake's version: a change
// to the stripe rule without a new rendezvous.ProtocolVersion (or the
// other way round) fails here. Version 3 stripes from 4 segments, 2 MiB
// by default (docs/TUNING.md, section 19); versions 4 (the ring of two's
// duplex stream, ring/duplex.go) and 5 (frame checksums) keep that rule.
func TestStripeRuleIsVersioned(t *testing.T) {
	c := daemon.DefaultConfig()
	rc := c.RingConfig(0, nil)
	if rc.StripeBytes != 4*c.SegmentBytes || rc.StripeBytes != 2<<20 || rendezvous.ProtocolVersion != 5 {
		t.Errorf("ring handshake version %d with ops striped from %d bytes (%d segments of %d); version 5 stripes from 4 segments, 2 MiB by default",
			rendezvous.ProtocolVersion, rc.StripeBytes, rc.StripeBytes/c.SegmentBytes, c.SegmentBytes)
	}
}

// A ring port (or a socket) in use at start is retried for as long as the ring may take
// to form (timeouts.connect), not for the rendezvous package's default.
func TestRendezvousBindTimeout(t *testing.T) {
	c := daemon.DefaultConfig()
	c.ConnectTimeout = 7 * time.Second
	if rc := c.RendezvousConfig(nil); rc.BindTimeout != 7*time.Second || rc.ConnectTimeout != 7*time.Second {
		t.Errorf("rendezvous bind timeout %v, connect timeout %v; want both timeouts.connect, 7s", rc.BindTimeout, rc.ConnectTimeout)
	}
	if sc := c.ServerConfig(nil); sc.BindTimeout != 7*time.Second {
		t.Errorf("unix socket bind timeout %v, want timeouts.connect, 7s", sc.BindTimeout)
	}
}
