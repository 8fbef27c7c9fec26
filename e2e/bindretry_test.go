package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDaemonWaitsForRingPortInUse: a node's ring port held by another
// process when its daemon starts (a dial's source port, a daemon killed
// just before) holds the daemon up, not down: it retries the bind, logs
// who holds the port, and once the port is released after 2s it binds,
// the ring forms and allreduce works.
func TestDaemonWaitsForRingPortInUse(t *testing.T) {
	ports := freePorts(t, 2)
	held, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", ports[1]))
	if err != nil {
		t.Fatalf("hold port %d: %v (environment: another process took it just now; rerun)", ports[1], err)
	}
	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(2 * time.Second)
		held.Close()
	}()
	start := time.Now()
	w := startWorldPorts(t, 2, 1, "", ports)
	<-released
	if took := time.Since(start); took < 2*time.Second {
		t.Errorf("daemon 1 opened its socket %v after start, before its ring port was released", took)
	}
	log := w.log(1)
	if !strings.Contains(log, "rendezvous port in use, retrying bind") || !strings.Contains(log, "held_by") {
		t.Errorf("daemon 1 did not log its bind retries and the port's holder:\n%s", log)
	}
	trs := w.startTrainers("-mode", "repeat", "-times", "3", "-count", "4096")
	checkSameResults(t, trs, 3)
}

// TestDaemonRingPortInUseTimeout: a ring port held past timeouts.connect
// ends the daemon with an error naming the port and the process holding
// it (this test).
func TestDaemonRingPortInUseTimeout(t *testing.T) {
	ports := freePorts(t, 2)
	held, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", ports[0]))
	if err != nil {
		t.Fatalf("hold port %d: %v (environment: another process took it just now; rerun)", ports[0], err)
	}
	defer held.Close()
	out, err := runFailingDaemon(t, ports, "timeouts:\n  connect: 1s\n", 15*time.Second)
	if err == nil {
		t.Fatalf("daemon exited 0 with its ring port held:\n%s", out)
	}
	for _, want := range []string{
		fmt.Sprintf("listen on 127.0.0.1:%d: port still in use after", ports[0]),
		"address already in use",
		fmt.Sprintf("held by LISTEN socket of pid %d (", os.Getpid()),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("daemon's output does not say %q:\n%s", want, out)
		}
	}
}

// runFailingDaemon runs node 0 of a world on ports with the given config
// extra, expecting it to exit by itself within d, and returns its output
// and exit status.
func runFailingDaemon(t *testing.T, ports []int, extra string, d time.Duration) (string, error) {
	t.Helper()
	dir, err := os.MkdirTemp("", "cvd-bind-") // sun_path is short: not t.TempDir()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var peers strings.Builder
	for _, p := range ports {
		fmt.Fprintf(&peers, "  - 127.0.0.1:%d\n", p)
	}
	cfg := filepath.Join(dir, "config.yaml")
	body := fmt.Sprintf("job:\n  name: e2e\n  token_env: E2E_TOKEN\npeers:\n%srank: 0\n%s", peers.String(), extra)
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(daemonBin, "run", "--config", cfg, "--rank", "0", "--socket", filepath.Join(dir, "d.sock"))
	cmd.Env = append(os.Environ(), "E2E_TOKEN=0123456789abcdef0123")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
		return out.String(), err
	case <-time.After(d):
		cmd.Process.Kill()
		<-done
		t.Fatalf("daemon (pid %d) still running %v after start; want it to give up by itself. Output:\n%s", cmd.Process.Pid, d, out.String())
		return "", nil
	}
}
