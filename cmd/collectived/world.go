package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// localWorld is a world of daemons started as processes on this machine,
// on loopback, for `collectived bench` and `make demo`.
type localWorld struct {
	dir     string
	job     string
	token   string
	nodes   int
	local   int
	sockets []string
	daemons []*exec.Cmd
	logs    []string
}

// startLocalWorld writes a config for nodes x local on 127.0.0.1 and starts
// one `collectived run` per node, waiting until every socket answers.
func startLocalWorld(nodes, local int, extra string, wait time.Duration) (*localWorld, error) {
	dir, err := os.MkdirTemp("", "collectived-world-")
	if err != nil {
		return nil, err
	}
	w := &localWorld{dir: dir, job: "bench", nodes: nodes, local: local}
	var tok [24]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return nil, err
	}
	w.token = hex.EncodeToString(tok[:])
	ports, err := freePorts(nodes)
	if err != nil {
		return nil, err
	}
	var peers strings.Builder
	for _, p := range ports {
		fmt.Fprintf(&peers, "  - 127.0.0.1:%d\n", p)
	}
	cfg := fmt.Sprintf("job:\n  name: %s\n  token_env: COLLECTIVED_BENCH_TOKEN\n  local_size: %d\npeers:\n%srank: 0\n%s",
		w.job, local, peers.String(), extra)
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	for i := 0; i < nodes; i++ {
		sock := filepath.Join(dir, fmt.Sprintf("node%d.sock", i))
		logPath := filepath.Join(dir, fmt.Sprintf("node%d.log", i))
		logf, err := os.Create(logPath)
		if err != nil {
			w.stop()
			return nil, err
		}
		cmd := exec.Command(self, "run", "--config", cfgPath, "--rank", fmt.Sprint(i), "--socket", sock)
		cmd.Env = append(os.Environ(), "COLLECTIVED_BENCH_TOKEN="+w.token)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
		if err := cmd.Start(); err != nil {
			logf.Close()
			w.stop()
			return nil, fmt.Errorf("start daemon %d: %w", i, err)
		}
		logf.Close()
		w.sockets = append(w.sockets, sock)
		w.daemons = append(w.daemons, cmd)
		w.logs = append(w.logs, logPath)
	}
	deadline := time.Now().Add(wait)
	for i, sock := range w.sockets {
		for {
			c, err := net.Dial("unix", sock)
			if err == nil {
				c.Close()
				break
			}
			if time.Now().After(deadline) {
				w.stop()
				return nil, fmt.Errorf("daemon %d never opened %s within %v; its log:\n%s", i, sock, wait, tail(w.logs[i]))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return w, nil
}

// stop ends every daemon by its PID: SIGTERM, then SIGKILL after a grace.
func (w *localWorld) stop() {
	for _, cmd := range w.daemons {
		if cmd.Process != nil {
			cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, cmd := range w.daemons {
		if cmd.Process == nil {
			continue
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}
	os.RemoveAll(w.dir)
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
