package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// benchRow is the part of `collectived bench --json`'s rows checked here.
type benchRow struct {
	Bytes    int64     `json:"bytes"`
	Path     string    `json:"path"`
	Lane     bool      `json:"lane"`
	Iters    int       `json:"iters"`
	MedianUS float64   `json:"median_us"`
	BusBW    float64   `json:"busbw_GBps"`
	Verified bool      `json:"verified"`
	Between  int64     `json:"between_bytes"`
	InFlight int       `json:"in_flight"`
	Block    int       `json:"sidecar_block"`
	Blocks   []float64 `json:"block_medians_us"`
}

func runBench(t *testing.T, args ...string) ([]benchRow, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, daemonBin, append([]string{"bench"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	text := out.String() + errb.String() // before the scanner drains out
	var rows []benchRow
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var r benchRow
		if json.Unmarshal(sc.Bytes(), &r) == nil {
			rows = append(rows, r)
		}
	}
	return rows, text, err
}

// benchRows runs bench with args, which must succeed and report n rows.
func benchRows(t *testing.T, n int, args ...string) []benchRow {
	t.Helper()
	rows, out, err := runBench(t, args...)
	if err != nil {
		t.Fatalf("bench %v: %v\n%s", args, err, out)
	}
	if len(rows) != n {
		t.Fatalf("bench %v: %d rows, want %d:\n%s", args, len(rows), n, out)
	}
	return rows
}

// The benchmark's modes, through the daemons (with and without the lane)
// and on the ring engines alone, with and without a call of another size
// between the calls measured, run end to end, verify their results and
// report every size.
func TestBenchCommand(t *testing.T) {
	for _, mode := range []struct {
		flags   []string
		small   string // the path a 4-byte buffer takes
		large   string // and a 1 MiB one
		lane    bool
		between int64
		reqs    int // calls in flight (0: the one of the default)
	}{
		{nil, "inline", "shm", true, 0, 0},
		{[]string{"--client-no-lane"}, "inline", "shm", false, 0, 0},
		{[]string{"--ring-only"}, "ring", "ring", false, 0, 0},
		{[]string{"--between", "16KiB"}, "inline", "shm", true, 16 << 10, 0},
		{[]string{"--ring-only", "--between", "256KiB"}, "ring", "ring", false, 256 << 10, 0},
		{[]string{"--in-flight", "3"}, "inline", "shm", true, 0, 3},
	} {
		args := append([]string{"--nodes", "2", "--local", "1", "--sizes", "4,1MiB", "--iters", "5", "--json"}, mode.flags...)
		rows := benchRows(t, 2, args...)
		for i, want := range []struct {
			bytes int64
			path  string
		}{{4, mode.small}, {1 << 20, mode.large}} {
			r := rows[i]
			if r.Bytes != want.bytes || r.Path != want.path || r.Lane != mode.lane || r.Iters != 5 || !r.Verified || r.MedianUS <= 0 || r.BusBW <= 0 || r.Between != mode.between || r.InFlight != mode.reqs {
				t.Errorf("bench %v: row %d = %+v, want %d bytes on path %s, lane %v, 5 verified iterations, %d bytes between, %d in flight", args, i, r, want.bytes, want.path, mode.lane, mode.between, mode.reqs)
			}
		}
	}
}

// Every mode stops at --timeout, killing what it started, and says so.
func TestBenchTimeout(t *testing.T) {
	_, out, err := runBench(t, "--sizes", "64MiB", "--iters", "100000", "--timeout", "2s")
	if err == nil || !strings.Contains(out, "bench: not finished within --timeout 2s: 0 of 1 sizes done") {
		t.Fatalf("bench past its --timeout: %v\n%s", err, out)
	}
	_, out, err = runBench(t, "--ring-only", "--sizes", "64MiB", "--iters", "100000", "--timeout", "2s")
	if err == nil || !strings.Contains(out, "still running after 2s") {
		t.Fatalf("bench --ring-only past its --timeout: %v\n%s", err, out)
	}
}

// --ring-only and --sidecar have no trainers to spread over a node: more
// than one per node is refused by name.
func TestBenchRingOnlyRefusesLocal(t *testing.T) {
	for _, mode := range []string{"--ring-only", "--sidecar"} {
		_, out, err := runBench(t, mode, "--nodes", "2", "--local", "2", "--sizes", "4")
		if err == nil || !strings.Contains(out, mode+" runs one ring rank per node and no trainers beside it: --local is 2, want 1") {
			t.Fatalf("bench %s --local 2: %v\n%s", mode, err, out)
		}
	}
}

// --sidecar runs the daemons' world and the ring engines alone side by
// side, a block at a time: every size is reported for both, verified,
// with the median of each block.
func TestBenchSidecar(t *testing.T) {
	args := []string{"--sidecar", "--nodes", "2", "--sizes", "4,1MiB", "--iters", "5", "--sidecar-block", "2", "--json"}
	rows := benchRows(t, 4, args...)
	for i, want := range []struct {
		bytes int64
		path  string
	}{{4, "inline"}, {4, "ring"}, {1 << 20, "shm"}, {1 << 20, "ring"}} {
		r := rows[i]
		if r.Bytes != want.bytes || r.Path != want.path || r.Iters != 5 || !r.Verified || r.MedianUS <= 0 || r.Block != 2 || len(r.Blocks) != 3 {
			t.Errorf("bench %v: row %d = %+v, want %d bytes on path %s, 5 verified iterations in 3 blocks of up to 2", args, i, r, want.bytes, want.path)
		}
		for _, b := range r.Blocks {
			if b <= 0 {
				t.Errorf("bench %v: row %d: block medians %v", args, i, r.Blocks)
			}
		}
	}
	// The table says what the sidecar costs, per size.
	_, out, err := runBench(t, "--sidecar", "--sizes", "4", "--iters", "2")
	if err != nil || !strings.Contains(out, "4 sidecar overhead") || !strings.Contains(out, "all 1 sizes verified on all 2 trainers and all 2 ring ranks") {
		t.Fatalf("bench --sidecar (table): %v\n%s", err, out)
	}
}

// childrenOf lists the processes whose parent is pid.
func childrenOf(pid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so cut at ")".
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out
}

// A daemon killed in the middle of bench --sidecar fails the run with a
// report that names the paced process that noticed, says how it ended and
// that the daemon exited, by its pid; nothing is left running.
func TestBenchSidecarDaemonKilled(t *testing.T) {
	cmd := exec.Command(daemonBin, "bench", "--sidecar", "--sizes", "1MiB", "--iters", "1000000", "--timeout", "2m")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		<-done
	}()
	// Every process the bench starts (2 daemons, 2 trainers, 2 ring
	// ranks), to check afterwards that none outlived it; the victim is the
	// daemon of node 1, running `run` on the daemons' config.
	var started []int
	victim := 0
	for deadline := time.Now().Add(30 * time.Second); len(started) < 6 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		started = childrenOf(cmd.Process.Pid)
	}
	for _, c := range started {
		argv, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(c), "cmdline"))
		a := string(argv)
		if strings.Contains(a, "run\x00") && strings.Contains(a, "/daemons/config.yaml") && strings.Contains(a, "--rank\x001\x00") {
			victim = c
		}
	}
	if len(started) != 6 || victim == 0 {
		t.Fatalf("bench --sidecar (pid %d) runs %v within 30s, want 6 processes, the daemon of node 1 among them:\n%s", cmd.Process.Pid, started, out.String())
	}
	time.Sleep(time.Second) // into the timed blocks
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-done:
		done <- err // for the deferred cleanup
	case <-time.After(time.Minute):
		t.Fatalf("bench --sidecar still running a minute after its daemon %d was killed:\n%s", victim, out.String())
	}
	text := out.String()
	if err == nil || !strings.Contains(text, "bench --sidecar: collectived, the trainer of node") ||
		!strings.Contains(text, fmt.Sprintf("daemon 1 (pid %d) exited: signal: killed", victim)) {
		t.Fatalf("bench --sidecar with daemon %d killed: %v\n%s", victim, err, text)
	}
	t.Logf("the report:\n%s", text)
	for _, p := range started {
		if argv, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p), "cmdline")); err == nil && bytes.HasPrefix(argv, []byte(daemonBin)) {
			t.Errorf("process %d (%q) outlived the bench", p, bytes.ReplaceAll(argv, []byte{0}, []byte{' '}))
		}
	}
}
