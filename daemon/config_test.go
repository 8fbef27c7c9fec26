package daemon

import (
	"strings"
	"testing"
	"time"
)

// Each field New cannot work with is refused by name before anything is
// bound.
func TestConfigVerify(t *testing.T) {
	good := func() Config {
		c := DefaultConfig()
		c.Job, c.Token, c.Peers, c.SocketPath = "j", []byte("0123456789abcdef"), []string{"127.0.0.1:1", "127.0.0.1:2"}, "/tmp/x.sock"
		return c
	}
	if c := good(); c.Verify() != nil {
		t.Fatalf("a good config fails: %v", c.Verify())
	}
	for want, change := range map[string]func(*Config){
		"job name is empty":            func(c *Config) { c.Job = "" },
		"no peers":                     func(c *Config) { c.Peers = nil },
		"rank 2 outside [0, 2)":        func(c *Config) { c.Rank = 2 },
		"local size 0 < 1":             func(c *Config) { c.LocalSize = 0 },
		"socket path is empty":         func(c *Config) { c.SocketPath = "" },
		"needs a job token":            func(c *Config) { c.Token = nil },
		"collective timeout must be":   func(c *Config) { c.CollectiveTimeout = 0 },
		"heartbeat timeout must be":    func(c *Config) { c.HeartbeatTimeout = -time.Second },
		"first-call timeout must be":   func(c *Config) { c.FirstCallTimeout = 0 },
		"shutdown timeout must be pos": func(c *Config) { c.ShutdownTimeout = 0 },
	} {
		c := good()
		change(&c)
		err := c.Verify()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want an error saying %q, got %v", want, err)
		}
	}
	if _, err := New(Config{}); err == nil {
		t.Error("New with an empty config succeeded")
	}
}
