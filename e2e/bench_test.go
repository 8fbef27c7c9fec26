package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// benchRow is the part of `collectived bench --json`'s rows checked here.
type benchRow struct {
	Bytes    int64   `json:"bytes"`
	Path     string  `json:"path"`
	Lane     bool    `json:"lane"`
	Iters    int     `json:"iters"`
	MedianUS float64 `json:"median_us"`
	BusBW    float64 `json:"busbw_GBps"`
	Verified bool    `json:"verified"`
}

func runBench(t *testing.T, args ...string) ([]benchRow, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, daemonBin, append([]string{"bench"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var rows []benchRow
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var r benchRow
		if json.Unmarshal(sc.Bytes(), &r) == nil {
			rows = append(rows, r)
		}
	}
	return rows, out.String() + errb.String(), err
}

// The benchmark's modes, through the daemons (with and without the lane)
// and on the ring engines alone, run end to end, verify their results and
// report every size.
func TestBenchCommand(t *testing.T) {
	for _, mode := range []struct {
		flags []string
		small string // the path a 4-byte buffer takes
		large string // and a 1 MiB one
		lane  bool
	}{
		{nil, "inline", "shm", true},
		{[]string{"--client-no-lane"}, "inline", "shm", false},
		{[]string{"--ring-only"}, "ring", "ring", false},
	} {
		args := append([]string{"--nodes", "2", "--local", "1", "--sizes", "4,1MiB", "--iters", "5", "--json"}, mode.flags...)
		rows, out, err := runBench(t, args...)
		if err != nil {
			t.Fatalf("bench %v: %v\n%s", args, err, out)
		}
		if len(rows) != 2 {
			t.Fatalf("bench %v: %d rows, want 2:\n%s", args, len(rows), out)
		}
		for i, want := range []struct {
			bytes int64
			path  string
		}{{4, mode.small}, {1 << 20, mode.large}} {
			r := rows[i]
			if r.Bytes != want.bytes || r.Path != want.path || r.Lane != mode.lane || r.Iters != 5 || !r.Verified || r.MedianUS <= 0 || r.BusBW <= 0 {
				t.Errorf("bench %v: row %d = %+v, want %d bytes on path %s, lane %v, 5 verified iterations", args, i, r, want.bytes, want.path, mode.lane)
			}
		}
	}
}

// --ring-only has no trainers to spread over a node: more than one per
// node is refused by name.
func TestBenchRingOnlyRefusesLocal(t *testing.T) {
	_, out, err := runBench(t, "--ring-only", "--nodes", "2", "--local", "2", "--sizes", "4")
	if err == nil || !strings.Contains(out, "--ring-only runs one ring rank per node and no trainers: --local is 2, want 1") {
		t.Fatalf("bench --ring-only --local 2: %v\n%s", err, out)
	}
}
