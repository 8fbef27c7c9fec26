package main

import (
	"log/slog"
	"testing"

	"github.com/collectived/collectived/config"
)

// Every limit in the file reaches the daemon's config, and from there the
// trainers' socket's.
func TestLimitsReachTheDaemon(t *testing.T) {
	t.Setenv("CVD_LOAD_TEST_TOKEN", "0123456789abcdef0123456789")
	cfg, err := config.Parse([]byte(`job:
  name: load-test
  token_env: CVD_LOAD_TEST_TOKEN
  local_size: 2
peers: ["127.0.0.1:7000"]
limits:
  inline_bytes: 8KiB
  shm_quota_bytes: 64MiB
  max_segments: 17
  max_in_flight: 5
  max_clients: 9
`), "config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dc, err := daemonConfig(cfg, 0, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	sc := dc.ServerConfig(nil)
	for _, c := range []struct {
		name      string
		got, want int64
	}{
		{"inline_bytes", int64(sc.InlineLimit), 8 << 10},
		{"shm_quota_bytes", sc.ShmQuota, 64 << 20},
		{"max_segments", int64(sc.MaxSegments), 17},
		{"max_in_flight", int64(sc.MaxInFlight), 5},
		{"max_clients", int64(sc.MaxClients), 9},
	} {
		if c.got != c.want {
			t.Errorf("limits.%s: the socket's config has %d, the file says %d", c.name, c.got, c.want)
		}
	}
}
