package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseMinimalGivesDefaults(t *testing.T) {
	c := mustParse(t, base)
	want := Default()
	want.Job.Name = "demo"
	want.Job.TokenEnv = "TOK"
	want.Peers = []string{"127.0.0.1:7101", "127.0.0.1:7102"}
	got := *c
	got.pos = nil
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got\n%+v\nwant\n%+v", got, want)
	}
	if c.Source() != "config.yaml" {
		t.Errorf("Source() = %q", c.Source())
	}
}

func TestDefaults(t *testing.T) {
	d := Default()
	checks := []struct {
		name      string
		got, want any
	}{
		{"rank", d.Rank, AutoRank()},
		{"local_size", d.Job.LocalSize, 1},
		{"socket.path", d.Socket.Path, "/run/collectived/collectived.sock"},
		{"socket.mode", d.Socket.Mode, os.FileMode(0o660)},
		{"connect", d.Timeouts.Connect, 60 * time.Second},
		{"collective", d.Timeouts.Collective, 300 * time.Second},
		{"first_call", d.Timeouts.FirstCall, 10 * time.Minute},
		{"stall_warning", d.Timeouts.StallWarning, 10 * time.Second},
		{"hello", d.Timeouts.Hello, 5 * time.Second},
		{"heartbeat", d.Timeouts.Heartbeat, time.Second},
		{"heartbeat_timeout", d.Timeouts.HeartbeatTimeout, 10 * time.Second},
		{"streams", d.Ring.Streams, 2},
		{"segment", d.Ring.SegmentBytes, int64(512 << 10)},
		{"small", d.Ring.SmallBytes, int64(64 << 10)},
		{"inline", d.Limits.InlineBytes, int64(64 << 10)},
		{"shm quota", d.Limits.ShmQuotaBytes, int64(4 << 30)},
		{"max_segments", d.Limits.MaxSegments, 1024},
		{"max_in_flight", d.Limits.MaxInFlight, 1024},
		{"max_clients", d.Limits.MaxClients, 256},
		{"fusion threshold", d.Fusion.ThresholdBytes, int64(64 << 20)},
		{"fusion cycle", d.Fusion.Cycle, time.Millisecond},
		{"log level", d.Log.Level, "info"},
		{"log format", d.Log.Format, "text"},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("default %s = %v, want %v", c.name, c.got, c.want)
		}
	}
	// The defaults alone lack only what has no default.
	err := d.Validate()
	for _, w := range []string{"job.name: is empty", "job: needs the job token", "peers: no peers"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Default().Validate() = %v; want it to contain %q", err, w)
		}
	}
	d.Job.Name, d.Job.TokenEnv, d.Peers = "x", "T", []string{"10.0.0.1:1"}
	if err := d.Validate(); err != nil {
		t.Errorf("completed defaults do not validate: %v", err)
	}
}

func TestParseEveryKey(t *testing.T) {
	c := mustParse(t, `job:
  name: big.run-1_a
  token_file: /etc/collectived/token
  local_size: 8
peers: [ "10.0.0.1:7000", "node2.example:7000", "[fd00::3]:7000" ]
rank: 2
listen: 0.0.0.0:7000
socket:
  path: /tmp/c.sock
  mode: 0600
  allowed_uids: [1000, 0x3e9]
  allowed_gids: [100]
timeouts:
  connect: 2m
  collective: 1h
  first_call: 1h30m
  stall_warning: 500ms
  hello: 3s
  heartbeat: 250ms
  heartbeat_timeout: 2s
ring:
  streams: 4
  segment_bytes: 256KiB
  small_bytes: "8 KiB"
  spin: 0s
fusion:
  threshold_bytes: 16MiB
  cycle: 3ms
limits:
  inline_bytes: 1MiB
  shm_quota_bytes: 10GB
  max_segments: 300
  max_in_flight: 8
  max_clients: 16
log:
  level: debug
  format: json
`)
	want := Config{
		Job:    Job{Name: "big.run-1_a", TokenFile: "/etc/collectived/token", LocalSize: 8},
		Peers:  []string{"10.0.0.1:7000", "node2.example:7000", "[fd00::3]:7000"},
		Rank:   FixedRank(2),
		Listen: "0.0.0.0:7000",
		Socket: Socket{Path: "/tmp/c.sock", Mode: 0o600, AllowedUIDs: []uint32{1000, 1001}, AllowedGIDs: []uint32{100}},
		Timeouts: Timeouts{Connect: 2 * time.Minute, Collective: time.Hour, FirstCall: 90 * time.Minute,
			StallWarning: 500 * time.Millisecond, Hello: 3 * time.Second, Heartbeat: 250 * time.Millisecond, HeartbeatTimeout: 2 * time.Second},
		Ring:   Ring{Streams: 4, SegmentBytes: 256 << 10, SmallBytes: 8 << 10},
		Fusion: Fusion{ThresholdBytes: 16 << 20, Cycle: 3 * time.Millisecond},
		Limits: Limits{InlineBytes: 1 << 20, ShmQuotaBytes: 10e9, MaxSegments: 300, MaxInFlight: 8, MaxClients: 16},
		Log:    Log{Level: "debug", Format: "json"},
	}
	got := *c
	got.pos = nil
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got\n%+v\nwant\n%+v", got, want)
	}
	if c.WorldSize() != 24 {
		t.Errorf("WorldSize = %d, want 24", c.WorldSize())
	}
	if c.ListenAddress(2) != "0.0.0.0:7000" {
		t.Errorf("ListenAddress = %q", c.ListenAddress(2))
	}
	if c.Log.SlogLevel().String() != "DEBUG" {
		t.Errorf("SlogLevel = %v", c.Log.SlogLevel())
	}
}

func TestListenDefaultsToOwnPeer(t *testing.T) {
	c := mustParse(t, base+"rank: 1\n")
	if got := c.ListenAddress(1); got != "127.0.0.1:7102" {
		t.Errorf("ListenAddress(1) = %q", got)
	}
	if got := c.ListenAddress(5); got != "" {
		t.Errorf("ListenAddress(5) = %q, want empty", got)
	}
}

func TestSizeForms(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want int64
	}{
		{"4096", 4096},
		{`"4096"`, 4096},
		{"0x1000", 4096},
		{"4KiB", 4096},
		{"4kib", 4096},
		{`"4 KiB"`, 4096},
		{"1MiB", 1 << 20},
		{"2GiB", 2 << 30},
		{"1TiB", 1 << 40},
		{"8000B", 8000},
		{"8KB", 8000},
		{"8MB", 8e6},
		{"1GB", 1e9},
		{"0", 0},
	} {
		c := mustParse(t, base+"limits:\n  shm_quota_bytes: "+tc.yaml+"\n")
		if c.Limits.ShmQuotaBytes != tc.want {
			t.Errorf("shm_quota_bytes: %s = %d, want %d", tc.yaml, c.Limits.ShmQuotaBytes, tc.want)
		}
	}
}

func TestParseSizeAndFormatSize(t *testing.T) {
	for _, n := range []int64{0, 1, 1000, 4096, 4097, 64 << 10, 3 << 20, 4 << 30, 5 << 40} {
		s := FormatSize(n)
		back, err := ParseSize(s)
		if err != nil || back != n {
			t.Errorf("ParseSize(FormatSize(%d) = %q) = %d, %v", n, s, back, err)
		}
	}
	if FormatSize(64<<10) != "64KiB" || FormatSize(4097) != "4097" {
		t.Errorf("FormatSize: %q %q", FormatSize(64<<10), FormatSize(4097))
	}
	for _, bad := range []string{"", "KiB", "-1", "1.5MiB", "4K", "4 M", "1PiB", "99999999999TiB", "99999999999999999999"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) succeeded", bad)
		}
	}
}

func TestDurationForms(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want time.Duration
	}{
		{"10s", 10 * time.Second},
		{`"10s"`, 10 * time.Second},
		{"1m30s", 90 * time.Second},
		{"250ms", 250 * time.Millisecond},
		{"2h", 2 * time.Hour},
	} {
		c := mustParse(t, base+"timeouts:\n  connect: "+tc.yaml+"\n")
		if c.Timeouts.Connect != tc.want {
			t.Errorf("connect: %s = %v, want %v", tc.yaml, c.Timeouts.Connect, tc.want)
		}
	}
}

func TestModeForms(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want os.FileMode
	}{
		{`"0660"`, 0o660},
		{"0660", 0o660},
		{"660", 0o660},
		{"0o600", 0o600},
		{`"0700"`, 0o700},
	} {
		c := mustParse(t, base+"socket:\n  mode: "+tc.yaml+"\n")
		if c.Socket.Mode != tc.want {
			t.Errorf("mode: %s = %#o, want %#o", tc.yaml, c.Socket.Mode, tc.want)
		}
	}
}

func TestRankForms(t *testing.T) {
	if c := mustParse(t, base+"rank: auto\n"); !c.Rank.Auto || c.Rank.String() != "auto" {
		t.Errorf("rank auto = %+v", c.Rank)
	}
	if c := mustParse(t, base+"rank: 1\n"); c.Rank != FixedRank(1) || c.Rank.String() != "1" {
		t.Errorf("rank 1 = %+v", c.Rank)
	}
}

func TestEmptySectionsKeepDefaults(t *testing.T) {
	c := mustParse(t, base+"timeouts:\nring: {}\nsocket:\n  allowed_uids:\n")
	if c.Timeouts != Default().Timeouts || c.Ring != Default().Ring || c.Socket.AllowedUIDs != nil {
		t.Errorf("empty sections changed defaults: %+v %+v", c.Timeouts, c.Ring)
	}
}

func TestAliasesAreFollowed(t *testing.T) {
	c := mustParse(t, base+"timeouts:\n  connect: &t 7s\n  hello: *t\n")
	if c.Timeouts.Hello != 7*time.Second {
		t.Errorf("hello = %v", c.Timeouts.Hello)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(path, []byte(base+"rank: 9\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if err == nil || !strings.Contains(err.Error(), path+":7: rank: 9 is out of range: 2 peers give ranks 0 to 1") {
		t.Errorf("Load error = %v", err)
	}
	_, err = Load(filepath.Join(dir, "missing.yaml"))
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("Load(missing) = %v", err)
	}
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, make([]byte, MaxFileBytes+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("Load(big) = %v", err)
	}
}

// The example at the top of the repository parses, validates, and mentions
// every key the schema knows.
func TestExampleConfig(t *testing.T) {
	c, err := Load("../config.yaml")
	if err != nil {
		t.Fatalf("../config.yaml: %v", err)
	}
	if c.Job.Name != "demo" || len(c.Peers) != 3 || c.Job.LocalSize != 2 || c.Job.TokenEnv != "COLLECTIVED_TOKEN" {
		t.Errorf("example config = %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	if r, err := c.ResolveRank(-1); err != nil || r != 0 {
		t.Errorf("ResolveRank = %d, %v", r, err)
	}
	text, err := os.ReadFile("../config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range allKeys {
		leaf := k[strings.LastIndex(k, ".")+1:]
		if !strings.Contains(string(text), leaf+":") {
			t.Errorf("config.yaml does not document %s", k)
		}
	}
}

var allKeys = []string{
	"job", "job.name", "job.token_file", "job.token_env", "job.local_size",
	"peers", "rank", "listen",
	"socket", "socket.path", "socket.mode", "socket.allowed_uids", "socket.allowed_gids",
	"timeouts", "timeouts.connect", "timeouts.collective", "timeouts.first_call", "timeouts.stall_warning",
	"timeouts.hello", "timeouts.heartbeat", "timeouts.heartbeat_timeout",
	"ring", "ring.streams", "ring.segment_bytes", "ring.small_bytes", "ring.spin",
	"limits", "limits.inline_bytes", "limits.shm_quota_bytes", "limits.max_segments", "limits.max_in_flight", "limits.max_clients",
	"log", "log.level", "log.format",
}

func TestSlogLevel(t *testing.T) {
	for level, want := range map[string]string{"debug": "DEBUG", "info": "INFO", "warn": "WARN", "error": "ERROR"} {
		if got := (Log{Level: level}).SlogLevel().String(); got != want {
			t.Errorf("SlogLevel(%s) = %s", level, got)
		}
	}
}

func TestListenAllInterfaces(t *testing.T) {
	for _, l := range []string{":7101", "0.0.0.0:7101", "[::]:7101"} {
		if c := mustParse(t, base+"listen: \""+l+"\"\n"); c.Listen != l {
			t.Errorf("listen %q = %q", l, c.Listen)
		}
	}
}

func TestMorePeersThanSupported(t *testing.T) {
	src := "job:\n  name: demo\n  token_env: T\npeers:\n" + strings.Repeat("  - 127.0.0.1:1\n", MaxPeers+1)
	mustFail(t, src, "config.yaml:5: peers: has 4097 entries; at most 4096 are supported")
}

func TestLeadingZeroRefused(t *testing.T) {
	mustFail(t, base+"ring:\n  small_bytes: 0100\n", "config.yaml:8: ring.small_bytes: 0100 has a leading zero")
	mustFail(t, base+"rank: 01\n", "config.yaml:7: rank: 01 has a leading zero")
	mustFail(t, base+"socket:\n  allowed_gids: [0100]\n", "config.yaml:8: socket.allowed_gids[0]: the integer 0100 is not a numeric gid")
	mustFail(t, base+"socket:\n  mode: \"0o\"\n", `config.yaml:8: socket.mode: "0o" is not an octal mode`)
	mustFail(t, base+"ring:\n  small_bytes: 99999999999999999999\n", "config.yaml:8: ring.small_bytes: must be a whole number of bytes")
}
