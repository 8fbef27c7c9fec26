package localworld

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "collectived")
	out, err := exec.Command("go", "build", "-o", bin, "../../cmd/collectived").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "lw-") // sun_path is short: not t.TempDir()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// A world starts, answers on every socket, reports a daemon that dies by
// itself, and stops (twice, harmlessly) with every process reaped.
func TestStartDieStop(t *testing.T) {
	bin := build(t)
	w, err := Start(Options{Bin: bin, Dir: shortDir(t), Nodes: 2, Local: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for i, s := range w.Sockets {
		c, err := net.Dial("unix", s)
		if err != nil {
			t.Fatalf("socket %d: %v", i, err)
		}
		c.Close()
	}
	syscall.Kill(w.PID(1), syscall.SIGKILL)
	select {
	case r := <-w.Exited:
		if r != 1 || !strings.Contains(w.Died(r).Error(), "daemon 1 (pid") {
			t.Fatalf("exited %d: %v", r, w.Died(r))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a killed daemon was not reported")
	}
	w.Stop()
	w.Stop()
	if err := syscall.Kill(w.PID(0), 0); err == nil {
		t.Fatalf("daemon 0 (pid %d) still alive after Stop", w.PID(0))
	}
	select {
	case r := <-w.Exited:
		t.Fatalf("Stop's own SIGTERM was reported as daemon %d dying", r)
	default:
	}
}

func TestStartErrors(t *testing.T) {
	if _, err := Start(Options{Bin: "/bin/true", Dir: shortDir(t), Nodes: 0, Local: 1}); err == nil || !strings.Contains(err.Error(), "0 nodes") {
		t.Fatalf("0 nodes: %v", err)
	}
	_, err := Start(Options{Bin: "/nonexistent/collectived", Dir: shortDir(t), Nodes: 1, Local: 1})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/collectived") {
		t.Fatalf("missing binary: %v", err)
	}
	_, err = Start(Options{Bin: "/bin/true", Dir: shortDir(t), Nodes: 2, Local: 1, Ports: []int{1}})
	if err == nil || !strings.Contains(err.Error(), "localworld: 1 ports for 2 nodes") {
		t.Fatalf("too few ports: %v", err)
	}
	_, err = Start(Options{Bin: "/bin/false", Dir: shortDir(t), Nodes: 1, Local: 1, OpenWait: 5 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "exited before opening") {
		t.Fatalf("a daemon that exits at once: %v", err)
	}
}

// A node command other than run opens no socket: Start returns at once and
// Wait reports how the nodes ended, naming the first that failed.
func TestWaitCommand(t *testing.T) {
	bin := build(t)
	w, err := Start(Options{Bin: bin, Dir: shortDir(t), Nodes: 2, Local: 1, Command: "bench-ring", Args: []string{"--sizes", "4", "--iters", "2"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Wait(time.Minute); err != nil {
		t.Fatalf("bench-ring nodes: %v", err)
	}
	w.Stop()

	w, err = Start(Options{Bin: bin, Dir: shortDir(t), Nodes: 2, Local: 1, Command: "bench-ring", Args: []string{"--sizes", "lots"}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if err := w.Wait(time.Minute); err == nil || !strings.Contains(err.Error(), ") failed: exit status") || !strings.Contains(err.Error(), "--sizes") {
		t.Fatalf("nodes given bad sizes: %v, want the first node's failure and its log naming --sizes", err)
	}

	dir := shortDir(t)
	sleeper := filepath.Join(dir, "sleeper")
	if err := os.WriteFile(sleeper, []byte("#!/bin/sh\nexec sleep 30\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	w, err = Start(Options{Bin: sleeper, Dir: dir, Nodes: 1, Local: 1, Command: "sleep"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if err := w.Wait(100 * time.Millisecond); err == nil || !strings.Contains(err.Error(), "still running after 100ms") {
		t.Fatalf("a node that does not end: %v", err)
	}
	if exited, err := w.Exit(0, 50*time.Millisecond); exited || err != nil {
		t.Fatalf("Exit of a node still running: %v %v", exited, err)
	}
	w.Stop()
	if exited, err := w.Exit(0, 0); !exited || err == nil || !strings.Contains(err.Error(), "signal: terminated") {
		t.Fatalf("Exit of a node stopped: %v %v, want its SIGTERM", exited, err)
	}
}
