package rendezvous

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestConfigVerify(t *testing.T) {
	good := func() Config {
		c := DefaultConfig()
		c.Job = "j"
		c.Token = testToken
		c.Peers = []string{"127.0.0.1:7000", "127.0.0.1:7001"}
		return c
	}
	if err := good().Verify(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	cases := []struct {
		name  string
		tweak func(*Config)
		want  string
	}{
		{"no job", func(c *Config) { c.Job = "" }, "job name is empty"},
		{"long job", func(c *Config) { c.Job = strings.Repeat("j", 256) }, "job name is 256 bytes, at most 255"},
		{"short token", func(c *Config) { c.Token = []byte("short") }, "job token is 5 bytes, at least 16"},
		{"no peers", func(c *Config) { c.Peers = nil }, "peer list is empty"},
		{"rank high", func(c *Config) { c.Rank = 2 }, "rank 2 outside the peer list [0, 2)"},
		{"rank negative", func(c *Config) { c.Rank = -1 }, "rank -1 outside"},
		{"peer no port", func(c *Config) { c.Peers[1] = "127.0.0.1" }, `peer 1 "127.0.0.1"`},
		{"peer port 0", func(c *Config) { c.Peers[1] = "127.0.0.1:0" }, `port "0" is not in [1, 65535]`},
		{"peer no host", func(c *Config) { c.Peers[1] = ":7000" }, "no host"},
		{"peer unspecified", func(c *Config) { c.Peers[1] = "0.0.0.0:7000" }, "unspecified address"},
		{"duplicate peer", func(c *Config) { c.Peers[1] = c.Peers[0] }, "peer 0 and peer 1 are both"},
		{"loopback mixed", func(c *Config) { c.Peers[1] = "10.1.2.3:7001" }, `peer 0 "127.0.0.1:7000" is a loopback address but peer 1 "10.1.2.3:7001" is not`},
		{"localhost mixed", func(c *Config) { c.Peers = []string{"10.1.2.3:7001", "localhost:7000"} }, `peer 1 "localhost:7000" is a loopback address`},
		{"bad listen", func(c *Config) { c.Listen = "nonsense" }, `listen address "nonsense"`},
		{"streams", func(c *Config) { c.Streams = 65 }, "streams 65 outside [1, 64]"},
		{"connect timeout", func(c *Config) { c.ConnectTimeout = -1 }, "connect timeout -1ns is negative"},
		{"bind timeout", func(c *Config) { c.BindTimeout = -1 }, "bind timeout -1ns is negative"},
		{"handshake timeout", func(c *Config) { c.HandshakeTimeout = -1 }, "handshake timeout -1ns is negative"},
		{"max pending", func(c *Config) { c.MaxPending = -1 }, "max pending handshakes -1"},
	}
	for _, tc := range cases {
		c := good()
		c.Peers = append([]string(nil), c.Peers...)
		tc.tweak(&c)
		err := c.Verify()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
		if _, lerr := Listen(c); lerr == nil {
			t.Errorf("%s: Listen accepted the config", tc.name)
		}
	}
}

// Zero timeouts and limits take the defaults: nothing waits forever.
func TestConfigDefaults(t *testing.T) {
	c := Config{}.withDefaults()
	d := DefaultConfig()
	if c.ConnectTimeout != d.ConnectTimeout || c.HandshakeTimeout != d.HandshakeTimeout ||
		c.MaxPending != d.MaxPending || c.Streams != DefaultStreams || c.Logger == nil {
		t.Fatalf("defaults not applied: %+v", c)
	}
}

func TestTokenNeverLogged(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	c := DefaultConfig()
	c.Token = []byte("super-secret-token-value")
	c.Job = "j"
	log.Info("config", "cfg", c)
	if strings.Contains(buf.String(), "super-secret") || !strings.Contains(buf.String(), "job=j") {
		t.Fatalf("logged config: %s", buf.String())
	}
}
