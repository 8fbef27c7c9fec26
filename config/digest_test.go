package config

import (
	"bytes"
	"encoding/hex"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func digestBase() *Config {
	c := Default()
	c.Job = Job{Name: "demo", TokenEnv: "T", LocalSize: 2}
	c.Peers = []string{"10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"}
	// Pinned, not the defaults: the golden digest below was computed for
	// these values, and defaults may be retuned.
	c.Ring.Streams, c.Ring.SegmentBytes, c.Ring.SmallBytes = 1, 1*MiB, 4096
	return &c
}

func TestShapeDigestStable(t *testing.T) {
	a, b := digestBase(), digestBase()
	if a.ShapeDigest() != b.ShapeDigest() {
		t.Fatal("equal configs give different digests")
	}
	// The value was computed independently (Python, from the encoding in
	// ShapeDigest's doc). A change of it means nodes running the old and the new code
	// can no longer join one job: bump shapeDomain on purpose, then update.
	const golden = "a3296ad78e10f34986741a970c461d6aece9f74bb4d081638009f764024598e7"
	d := a.ShapeDigest()
	if got := hex.EncodeToString(d[:]); got != golden {
		t.Errorf("ShapeDigest = %s, want the golden %s", got, golden)
	}
}

func TestShapeDigestCoversSharedFields(t *testing.T) {
	ref := digestBase().ShapeDigest()
	for name, change := range map[string]func(*Config){
		"job name":       func(c *Config) { c.Job.Name = "demo2" },
		"peer address":   func(c *Config) { c.Peers[2] = "10.0.0.3:7001" },
		"peer order":     func(c *Config) { c.Peers[0], c.Peers[1] = c.Peers[1], c.Peers[0] },
		"peer added":     func(c *Config) { c.Peers = append(c.Peers, "10.0.0.4:7000") },
		"peer removed":   func(c *Config) { c.Peers = c.Peers[:2] },
		"peer split":     func(c *Config) { c.Peers = []string{"10.0.0.1:7000" + "10.0.0.2:7000", "10.0.0.3:7000"} },
		"local size":     func(c *Config) { c.Job.LocalSize = 3 },
		"streams":        func(c *Config) { c.Ring.Streams = 2 },
		"segment bytes":  func(c *Config) { c.Ring.SegmentBytes = 512 * KiB },
		"small bytes":    func(c *Config) { c.Ring.SmallBytes = 8192 },
		"inline bytes":   func(c *Config) { c.Limits.InlineBytes = 128 * KiB },
		"fusion bytes":   func(c *Config) { c.Fusion.ThresholdBytes = 0 },
		"name into peer": func(c *Config) { c.Job.Name = "dem"; c.Peers[0] = "o" + c.Peers[0] },
	} {
		c := digestBase()
		change(c)
		if c.ShapeDigest() == ref {
			t.Errorf("changing the %s does not change the digest", name)
		}
	}
}

func TestShapeDigestIgnoresNodeLocalFields(t *testing.T) {
	ref := digestBase().ShapeDigest()
	for name, change := range map[string]func(*Config){
		"rank":         func(c *Config) { c.Rank = FixedRank(1) },
		"listen":       func(c *Config) { c.Listen = "0.0.0.0:7000" },
		"token env":    func(c *Config) { c.Job.TokenEnv = "OTHER" },
		"token file":   func(c *Config) { c.Job.TokenEnv, c.Job.TokenFile = "", "/etc/t" },
		"socket path":  func(c *Config) { c.Socket.Path = "/tmp/x.sock" },
		"socket mode":  func(c *Config) { c.Socket.Mode = 0o600 },
		"socket uids":  func(c *Config) { c.Socket.AllowedUIDs = []uint32{5} },
		"log level":    func(c *Config) { c.Log.Level = "debug" },
		"log format":   func(c *Config) { c.Log.Format = "json" },
		"timeouts":     func(c *Config) { c.Timeouts.Collective = time.Hour },
		"shm quota":    func(c *Config) { c.Limits.ShmQuotaBytes = GiB },
		"max clients":  func(c *Config) { c.Limits.MaxClients = 8 },
		"fusion cycle": func(c *Config) { c.Fusion.Cycle = 5 * time.Millisecond },
	} {
		c := digestBase()
		change(c)
		if c.ShapeDigest() != ref {
			t.Errorf("changing the %s changes the digest", name)
		}
	}
}

func TestLogValueHidesToken(t *testing.T) {
	t.Setenv("COLLECTIVED_LOG_TEST_TOKEN", secret)
	c := mustParse(t, "job:\n  name: demo\n  token_env: COLLECTIVED_LOG_TEST_TOKEN\npeers: [\"127.0.0.1:1\"]\n")
	if _, err := c.Token(); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("config", "config", c)
	out := buf.String()
	if strings.Contains(out, secret) {
		t.Errorf("log shows the token: %s", out)
	}
	d := c.ShapeDigest()
	for _, want := range []string{`"job":"demo"`, `"token_from":"env:COLLECTIVED_LOG_TEST_TOKEN"`, `"peers":["127.0.0.1:1"]`,
		`"mode":"0660"`, `"segment_bytes":"512KiB"`, `"rank":"auto"`, `"shape_digest":"` + hex.EncodeToString(d[:]) + `"`} {
		if !strings.Contains(out, want) {
			t.Errorf("log %s lacks %s", out, want)
		}
	}
}
