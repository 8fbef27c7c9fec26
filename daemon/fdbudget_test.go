package daemon

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/collectived/collectived/internal/fdtest"
	"github.com/collectived/collectived/internal/syncbuf"
)

// A soft fd limit below what max_clients connections and local_size
// trainers at max_segments each would need is logged at start, naming
// both figures and the remedies; a limit above it is not.
func TestWarnFDLimit(t *testing.T) {
	restore, err := fdtest.LowerLimit(1000)
	if err != nil {
		t.Fatal(err)
	}
	defer restore()
	for _, c := range []struct {
		localSize, maxSegments int
		warn                   bool
	}{
		{2, 1024, true}, // 256 + 2 x 1026 + 64 = 2372 needed
		{2, 300, false}, // 256 + 2 x 302 + 64 = 924
	} {
		var logs syncbuf.Buffer
		cfg := DefaultConfig()
		cfg.LocalSize, cfg.MaxSegments = c.localSize, c.maxSegments
		d := &Daemon{cfg: cfg, log: slog.New(slog.NewTextHandler(&logs, nil))}
		d.warnFDLimit()
		got := logs.String()
		if warned := strings.Contains(got, "the fd limit is below what the clients and their segments may take"); warned != c.warn {
			t.Errorf("local_size %d, max_segments %d, limit 1000: warned %v, want %v:\n%s", c.localSize, c.maxSegments, warned, c.warn, got)
		}
		if c.warn && (!strings.Contains(got, "rlimit_nofile=1000") || !strings.Contains(got, "needed=2372")) {
			t.Errorf("the warning does not name the limit and what is needed:\n%s", got)
		}
	}
}

// A vm.max_map_count below what local_size trainers at max_segments each
// would map is logged at start, naming both; one above it is not; an
// unreadable count is not guessed at.
func TestWarnMapLimit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "max_map_count")
	if err := os.WriteFile(path, []byte("65530\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path                   string
		localSize, maxSegments int
		warn                   bool
	}{
		{path, 64, 1024, true}, // 64 x 1024 + 1024 = 66560 needed
		{path, 8, 1024, false}, // 9216
		{path + ".missing", 64, 1024, false},
	} {
		var logs syncbuf.Buffer
		cfg := DefaultConfig()
		cfg.LocalSize, cfg.MaxSegments = c.localSize, c.maxSegments
		d := &Daemon{cfg: cfg, log: slog.New(slog.NewTextHandler(&logs, nil))}
		d.warnMapLimit(c.path)
		got := logs.String()
		if warned := strings.Contains(got, "vm.max_map_count is below"); warned != c.warn {
			t.Errorf("%s, local_size %d, max_segments %d: warned %v, want %v:\n%s", c.path, c.localSize, c.maxSegments, warned, c.warn, got)
		}
		if c.warn && (!strings.Contains(got, "max_map_count=65530") || !strings.Contains(got, "needed=66560")) {
			t.Errorf("the warning does not name the count and what is needed:\n%s", got)
		}
	}
}
