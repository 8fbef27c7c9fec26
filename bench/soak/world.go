package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	jobName  = "soak"
	tokenEnv = "COLLECTIVED_SOAK_TOKEN"
	// stopGrace bounds how long a daemon may take to leave after SIGTERM
	// before it is killed.
	stopGrace = 10 * time.Second
	// openWait bounds how long a daemon may take to open its socket.
	openWait = 30 * time.Second
)

// daemonProc is one collectived process of the world.
type daemonProc struct {
	rank   int
	cmd    *exec.Cmd
	socket string
	log    string
	done   chan struct{} // closed once the process has been reaped
	err    error         // its exit status, valid after done
}

// world is nodes daemons on 127.0.0.1, owned by the soak: stop ends them.
type world struct {
	dir     string
	bin     string
	nodes   int
	local   int
	daemons []*daemonProc
	// exited receives the rank of each daemon that ends by itself.
	exited   chan int
	stopping chan struct{}
	stopOnce sync.Once
}

// buildDaemon builds ./cmd/collectived of the module this program lives
// in, wherever it is run from.
func buildDaemon(dir string) (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("go env GOMOD: not inside the collectived module (run from the repository, or give --bin)")
	}
	bin := filepath.Join(dir, "collectived")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/collectived")
	cmd.Dir = filepath.Dir(mod)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build ./cmd/collectived in %s: %w\n%s", cmd.Dir, err, stderr.String())
	}
	return bin, nil
}

// startWorld writes a config for nodes x local on 127.0.0.1 and starts
// one `collectived run` per node, waiting until every socket answers.
func startWorld(dir, bin string, nodes, local int) (*world, error) {
	w := &world{dir: dir, bin: bin, nodes: nodes, local: local,
		exited: make(chan int, nodes), stopping: make(chan struct{})}
	var tok [24]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return nil, err
	}
	token := hex.EncodeToString(tok[:])
	ports, err := freePorts(nodes)
	if err != nil {
		return nil, err
	}
	var peers strings.Builder
	for _, p := range ports {
		fmt.Fprintf(&peers, "  - 127.0.0.1:%d\n", p)
	}
	cfg := fmt.Sprintf("job:\n  name: %s\n  token_env: %s\n  local_size: %d\npeers:\n%srank: 0\n",
		jobName, tokenEnv, local, peers.String())
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	for i := 0; i < nodes; i++ {
		d := &daemonProc{rank: i, done: make(chan struct{}),
			socket: filepath.Join(dir, fmt.Sprintf("n%d.sock", i)),
			log:    filepath.Join(dir, fmt.Sprintf("n%d.log", i))}
		logf, err := os.Create(d.log)
		if err != nil {
			w.stop()
			return nil, err
		}
		d.cmd = exec.Command(bin, "run", "--config", cfgPath, "--rank", fmt.Sprint(i), "--socket", d.socket)
		d.cmd.Env = append(os.Environ(), tokenEnv+"="+token)
		d.cmd.Stdout, d.cmd.Stderr = logf, logf
		// If this program is killed outright, its daemons go with it.
		d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		err = d.cmd.Start()
		logf.Close()
		if err != nil {
			w.stop()
			return nil, fmt.Errorf("start daemon %d (%s): %w", i, bin, err)
		}
		w.daemons = append(w.daemons, d)
		go w.reap(d)
	}
	deadline := time.Now().Add(openWait)
	for _, d := range w.daemons {
		for {
			c, err := net.Dial("unix", d.socket)
			if err == nil {
				c.Close()
				break
			}
			select {
			case <-d.done:
				w.stop()
				return nil, fmt.Errorf("daemon %d exited before opening %s (%v); its log:\n%s", d.rank, d.socket, d.err, tail(d.log))
			default:
			}
			if time.Now().After(deadline) {
				w.stop()
				return nil, fmt.Errorf("daemon %d never opened %s within %v; its log:\n%s", d.rank, d.socket, openWait, tail(d.log))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return w, nil
}

// reap waits for d and reports an exit that stop did not ask for.
func (w *world) reap(d *daemonProc) {
	d.err = d.cmd.Wait()
	close(d.done)
	select {
	case <-w.stopping:
	default:
		w.exited <- d.rank
	}
}

// died describes daemon r's unasked-for exit.
func (w *world) died(r int) error {
	d := w.daemons[r]
	return fmt.Errorf("daemon %d (pid %d) died during the run: %v; its log ends:\n%s", r, d.cmd.Process.Pid, d.err, tail(d.log))
}

// stop ends every daemon by its PID: SIGTERM, then SIGKILL after
// stopGrace. It is idempotent and returns once all are reaped.
func (w *world) stop() {
	w.stopOnce.Do(func() {
		close(w.stopping)
		for _, d := range w.daemons {
			d.cmd.Process.Signal(syscall.SIGTERM)
		}
		deadline := time.After(stopGrace)
		for _, d := range w.daemons {
			select {
			case <-d.done:
			case <-deadline:
				fmt.Fprintf(os.Stderr, "soak: daemon %d (pid %d) still running %v after SIGTERM: SIGKILL\n", d.rank, d.cmd.Process.Pid, stopGrace)
				d.cmd.Process.Kill()
				<-d.done
			}
		}
		for _, d := range w.daemons {
			if !d.cmd.ProcessState.Success() && !signalled(d.cmd.ProcessState) {
				fmt.Fprintf(os.Stderr, "soak: daemon %d exited: %v; log tail:\n%s\n", d.rank, d.err, tail(d.log))
			}
		}
	})
}

// signalled reports whether the process ended on a signal we sent.
func signalled(ps *os.ProcessState) bool {
	ws, ok := ps.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled()
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
			return nil, fmt.Errorf("free port on 127.0.0.1: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}
