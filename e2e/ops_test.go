package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func statusJSON(t *testing.T, sock string) map[string]any {
	t.Helper()
	out, err := exec.Command(daemonBin, "status", "--socket", sock, "--job", "e2e", "--json").CombinedOutput()
	if err != nil {
		t.Fatalf("collectived status: %v: %s", err, out)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("status output is not JSON: %v: %s", err, out)
	}
	return m
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestStallReportAndStatus: a collective one trainer has not joined is
// logged as stalled with that trainer's world rank, node, local rank and
// pid, and `collectived status` shows the same while it waits.
func TestStallReportAndStatus(t *testing.T) {
	w := startWorld(t, 1, 2, "")
	caller := w.startTrainer(0, "-mode", "repeat", "-times", "1", "-count", "16")
	waitFor(t, 10*time.Second, "trainer 0 to attach", func() bool {
		return strings.Contains(w.log(0), "world_rank=0")
	})
	idle := w.startTrainer(0, "-mode", "repeat", "-times", "1", "-count", "16", "-pause", "1h")
	pid := idle.cmd.Process.Pid
	wantMissing := "world rank 1 (node 0, local rank 1, pid " + strconv.Itoa(pid) + ")"
	waitFor(t, 10*time.Second, "the stall warning in the log", func() bool {
		l := w.log(0)
		return strings.Contains(l, "collective stalled") && strings.Contains(l, wantMissing)
	})
	st := statusJSON(t, w.sockets[0])
	in, _ := st["in_flight"].(map[string]any)
	if in == nil || !strings.Contains(in["not_called"].(string), wantMissing) || in["phase"] != "waiting for local calls" {
		t.Fatalf("status in_flight = %v, want waiting for %s", st["in_flight"], wantMissing)
	}
	trs := st["trainers"].([]any)
	if len(trs) != 2 || trs[1].(map[string]any)["pid"].(float64) != float64(pid) {
		t.Fatalf("status trainers = %v", trs)
	}
	out, err := exec.Command(daemonBin, "status", "--socket", w.sockets[0], "--job", "e2e").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "not called by "+wantMissing) {
		t.Fatalf("plain status does not show who is missing: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "process: pid ") || !strings.Contains(string(out), "goroutines") ||
		!regexp.MustCompile(`\d+ fds of \d+ `).Match(out) {
		t.Fatalf("plain status does not show the daemon's process figures (fds of their limit):\n%s", out)
	}
	proc, _ := st["process"].(map[string]any)
	fds, _ := proc["fds"].(float64)
	limit, _ := proc["fd_limit"].(float64)
	if fds < 1 || limit < fds {
		t.Fatalf("status JSON: process %v: want fds at least one and within fd_limit", proc)
	}
	// Both trainers are Go clients, which open their lane.
	if n := strings.Count(string(out), `"e2e-trainer", small calls on its lane,`); n != 2 {
		t.Fatalf("plain status shows %d trainers on their lane, want 2:\n%s", n, out)
	}
	if lane, _ := trs[1].(map[string]any)["lane"].(bool); !lane {
		t.Fatalf("status JSON: trainer 1 has no lane: %v", trs[1])
	}
	idle.cmd.Process.Kill()
	evs, err := caller.wait(t, 20*time.Second)
	if err != nil || len(evs) != 1 || evs[0].Code != "TRAINER_LOST" {
		t.Fatalf("caller after the idle trainer died: %v %+v", err, evs)
	}
}

// TestCollectiveTimeout: a collective not completed within the collective
// timeout fails with TIMEOUT naming who never called.
func TestCollectiveTimeout(t *testing.T) {
	cfg := strings.NewReplacer("collective: 20s", "collective: 3s", "first_call: 20s", "first_call: 3s", "stall_warning: 2s", "stall_warning: 1s").Replace(fastTimeouts)
	w := startWorld(t, 2, 1, cfg)
	caller := w.startTrainer(0, "-mode", "repeat", "-times", "1", "-count", "16")
	idle := w.startTrainer(1, "-mode", "repeat", "-times", "1", "-count", "16", "-pause", "1h")
	_ = idle
	evs, err := caller.wait(t, 30*time.Second)
	if err != nil || len(evs) != 1 {
		t.Fatalf("caller: %v %+v", err, evs)
	}
	e := evs[0]
	// The idle node times out itself, having heard that its neighbour
	// is inside the collective, and names its trainer with its pid.
	if e.Code != "TIMEOUT" || !strings.Contains(e.Message, "timed out after 3s on node 1: not called by world rank 1 (node 1, local rank 0, pid") {
		t.Fatalf("caller got %s %q, want TIMEOUT naming world rank 1 and its pid", e.Code, e.Message)
	}
	if e.Millis < 2500 || e.Millis > 20000 {
		t.Fatalf("timed out after %d ms, configured 3 s", e.Millis)
	}
}

// TestLocalCollectiveTimeout: when the trainer that never calls is on the
// caller's own node, TIMEOUT names it as the stall report does: world
// rank, node, local rank and pid.
func TestLocalCollectiveTimeout(t *testing.T) {
	cfg := strings.NewReplacer("collective: 20s", "collective: 2s", "first_call: 20s", "first_call: 2s", "stall_warning: 2s", "stall_warning: 1s").Replace(fastTimeouts)
	w := startWorld(t, 1, 2, cfg)
	caller := w.startTrainer(0, "-mode", "repeat", "-times", "1", "-count", "16")
	waitFor(t, 10*time.Second, "trainer 0 to attach", func() bool {
		return strings.Contains(w.log(0), "world_rank=0")
	})
	idle := w.startTrainer(0, "-mode", "repeat", "-times", "1", "-count", "16", "-pause", "1h")
	evs, err := caller.wait(t, 30*time.Second)
	if err != nil || len(evs) != 1 {
		t.Fatalf("caller: %v %+v", err, evs)
	}
	want := "not called by world rank 1 (node 0, local rank 1, pid " + strconv.Itoa(idle.cmd.Process.Pid) + ")"
	if e := evs[0]; e.Code != "TIMEOUT" || !strings.Contains(e.Message, want) {
		t.Fatalf("caller got %s %q, want TIMEOUT saying %q", e.Code, e.Message, want)
	}
}

// TestShutdown: SIGTERM and SIGINT fail pending calls with SHUTDOWN,
// remove the socket and exit 0.
func TestShutdown(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) { testShutdown(t, sig) })
	}
}

func testShutdown(t *testing.T, sig syscall.Signal) {
	w := startWorld(t, 1, 2, "")
	caller := w.startTrainer(0, "-mode", "repeat", "-times", "1", "-count", "16")
	waitFor(t, 10*time.Second, "the call to be queued", func() bool {
		return strings.Contains(w.log(0), "world_rank=0")
	})
	time.Sleep(200 * time.Millisecond)
	w.mu.Lock()
	d := w.daemons[0]
	w.daemons[0] = nil
	w.mu.Unlock()
	d.Process.Signal(sig)
	done := make(chan error, 1)
	go func() { done <- d.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("daemon exited with %v after %v; log:\n%s", err, sig, w.log(0))
		}
	case <-time.After(15 * time.Second):
		d.Process.Kill()
		t.Fatalf("daemon did not exit within 15s of %v", sig)
	}
	if _, err := os.Stat(w.sockets[0]); !os.IsNotExist(err) {
		t.Errorf("socket %s still there after shutdown: %v", w.sockets[0], err)
	}
	evs, err := caller.wait(t, 10*time.Second)
	// The daemon says why before it closes: a pending call gets SHUTDOWN,
	// not a bare connection error.
	if err != nil || len(evs) != 1 || evs[0].OK || evs[0].Code != "SHUTDOWN" {
		t.Fatalf("pending caller after shutdown: %v %+v, want SHUTDOWN", err, evs)
	}
	if !strings.Contains(strings.ToLower(evs[0].Message), "shut") {
		t.Errorf("pending call's error does not say the daemon shut down: %s", evs[0].Message)
	}
}

// TestCheck: `collectived check` prints the resolved world for a good
// config and names the file, line and key of a bad one.
func TestCheck(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	os.WriteFile(good, []byte("job:\n  name: j\n  token_env: CHECK_TOKEN\n  local_size: 2\npeers:\n  - 127.0.0.1:7001\n  - 127.0.0.1:7002\n"), 0o600)
	cmd := exec.Command(daemonBin, "check", "--config", good, "--rank", "1")
	cmd.Env = append(os.Environ(), "CHECK_TOKEN=0123456789abcdef0123")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "2 nodes x 2 trainers = world of 4") || !strings.Contains(string(out), "* node 1  127.0.0.1:7002") {
		t.Fatalf("check of a good config: %v\n%s", err, out)
	}
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("job:\n  name: j\n  token_env: CHECK_TOKEN\npeers:\n  - 127.0.0.1:7001\ntimeouts:\n  collective: 5x\n"), 0o600)
	out, err = exec.Command(daemonBin, "check", "--config", bad).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "bad.yaml:7: timeouts.collective") {
		t.Fatalf("check of a bad config: %v\n%s", err, out)
	}
	unknown := filepath.Join(dir, "unknown.yaml")
	os.WriteFile(unknown, []byte("job:\n  name: j\n  token_env: CHECK_TOKEN\n  locl_size: 2\npeers:\n  - 127.0.0.1:7001\n"), 0o600)
	out, err = exec.Command(daemonBin, "check", "--config", unknown).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "unknown.yaml:4") || !strings.Contains(string(out), "locl_size") {
		t.Fatalf("check of a config with an unknown key: %v\n%s", err, out)
	}
	cmd = exec.Command(daemonBin, "check", "--config", good, "--rank", "1")
	cmd.Env = append(os.Environ(), "CHECK_TOKEN=")
	if out, err = cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "CHECK_TOKEN") {
		t.Fatalf("check without the token: %v\n%s", err, out)
	}
}

// TestStatusWaitingOnPeer: while node 0 waits in the ring for node 1 (whose
// trainer has not called), status says which ring op and step it is in and
// how long ago each neighbour was last heard from.
func TestStatusWaitingOnPeer(t *testing.T) {
	w := startWorld(t, 2, 1, "")
	caller := w.startTrainer(0, "-mode", "repeat", "-times", "1", "-count", "16")
	_ = w.startTrainer(1, "-mode", "repeat", "-times", "1", "-count", "16", "-pause", "1h")
	var ring map[string]any
	waitFor(t, 10*time.Second, "node 0 to be in the ring op", func() bool {
		st := statusJSON(t, w.sockets[0])
		ring, _ = st["ring"].(map[string]any)
		return ring != nil && ring["op"] == "allreduce seq 0"
	})
	if _, ok := ring["heard_from_prev_sec"].(float64); !ok {
		t.Fatalf("status ring = %v, want heard_from_prev_sec", ring)
	}
	if b, _ := ring["buffer_bytes"].(float64); b < 64<<10 {
		t.Fatalf("status ring = %v, want buffer_bytes: the ring's pipeline buffers, at least its receive buffers", ring)
	}
	out, err := exec.Command(daemonBin, "status", "--socket", w.sockets[0], "--job", "e2e").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "in allreduce seq 0 step") || !strings.Contains(string(out), "heard") {
		t.Fatalf("plain status while waiting on the peer: %v\n%s", err, out)
	}
	caller.cmd.Process.Kill()
}

// TestLiveSocketNotTaken: a second daemon configured with a live daemon's
// socket refuses to start, naming the socket, and the first one goes on
// serving; once that one is killed (its socket file left behind, stale),
// a new daemon replaces the file and serves.
func TestLiveSocketNotTaken(t *testing.T) {
	w := startWorld(t, 1, 1, "")
	// The second daemon waits for the socket for timeouts.connect (the
	// first may be stopping): 1s here, not the world's 20s.
	b, err := os.ReadFile(w.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg2 := filepath.Join(w.dir, "second.yaml")
	if err := os.WriteFile(cfg2, bytes.Replace(b, []byte("connect: 20s"), []byte("connect: 1s"), 1), 0o600); err != nil {
		t.Fatal(err)
	}
	// A world of one binds no ring port: the socket is all the two share.
	cmd := exec.Command(daemonBin, "run", "--config", cfg2, "--rank", "0", "--socket", w.sockets[0])
	cmd.Env = append(os.Environ(), "E2E_TOKEN="+w.token)
	done := make(chan []byte, 1)
	var runErr error
	go func() {
		out, err := cmd.CombinedOutput()
		runErr = err
		done <- out
	}()
	select {
	case out := <-done:
		if runErr == nil || !strings.Contains(string(out), w.sockets[0]) || !strings.Contains(string(out), "in use") {
			t.Fatalf("second daemon on a live socket: %v\n%s", runErr, out)
		}
		if holder := fmt.Sprintf("held by pid %d (", w.pid(0)); !strings.Contains(string(out), holder) {
			t.Errorf("second daemon's error does not name the first, %q:\n%s", holder, out)
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatal("a second daemon on a live socket was still running after 20s")
	}
	tr := w.startTrainer(0, "-mode", "repeat", "-times", "1", "-count", "16")
	if evs, err := tr.wait(t, 30*time.Second); err != nil || len(evs) != 1 || !evs[0].OK {
		t.Fatalf("trainer of the first daemon: %v %+v", err, evs)
	}

	w.kill(0)
	if st, err := os.Lstat(w.sockets[0]); err != nil || st.Mode()&os.ModeSocket == 0 {
		t.Fatalf("after kill -9 the socket file should be left behind: %v", err)
	}
	w.startDaemon(0)
	w.waitSocket(0, 20*time.Second)
	tr = w.startTrainer(0, "-mode", "repeat", "-times", "1", "-count", "16")
	if evs, err := tr.wait(t, 30*time.Second); err != nil || len(evs) != 1 || !evs[0].OK {
		t.Fatalf("trainer of the daemon that replaced a stale socket: %v %+v", err, evs)
	}
}

// TestStallAcrossNodes: when a whole node's trainers have not called, that
// node's daemon still reports them, with pids, in its log and its status,
// from the moment a neighbour's heartbeat says the collective has begun;
// the node waiting in the ring logs whom it waits for.
func TestStallAcrossNodes(t *testing.T) {
	cfg := strings.NewReplacer("collective: 20s", "collective: 6s", "first_call: 20s", "first_call: 6s", "stall_warning: 2s", "stall_warning: 1s").Replace(fastTimeouts)
	w := startWorld(t, 2, 1, cfg)
	idle := w.startTrainer(1, "-mode", "repeat", "-times", "1", "-count", "16", "-pause", "1h")
	waitFor(t, 10*time.Second, "the idle trainer to attach", func() bool {
		return strings.Contains(w.log(1), "world_rank=1")
	})
	caller := w.startTrainer(0, "-mode", "repeat", "-times", "1", "-count", "16")
	wantMissing := "world rank 1 (node 1, local rank 0, pid " + strconv.Itoa(idle.cmd.Process.Pid) + ")"
	waitFor(t, 10*time.Second, "node 1's stall warning naming its idle trainer", func() bool {
		l := w.log(1)
		return strings.Contains(l, "collective stalled") && strings.Contains(l, wantMissing) && strings.Contains(l, "begun_by")
	})
	st := statusJSON(t, w.sockets[1])
	in, _ := st["in_flight"].(map[string]any)
	if in == nil || in["phase"] != "waiting for local calls" || !strings.Contains(fmt.Sprint(in["not_called"]), wantMissing) {
		t.Fatalf("node 1 status in_flight = %v, want waiting for %s", st["in_flight"], wantMissing)
	}
	waitFor(t, 10*time.Second, "node 0's ring stall warning", func() bool {
		l := w.log(0)
		return strings.Contains(l, "collective stalled in the ring") && strings.Contains(l, "data from ring rank 1, node 1 127.0.0.1:")
	})
	evs, err := caller.wait(t, 30*time.Second)
	if err != nil || len(evs) != 1 || evs[0].Code != "TIMEOUT" {
		t.Fatalf("caller: %v %+v, want TIMEOUT", err, evs)
	}
}
