package e2e

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/collectived/collectived/internal/localworld"
	"github.com/collectived/collectived/internal/syncbuf"
)

var daemonBin, trainerBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "collectived-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	daemonBin = os.Getenv("COLLECTIVED_BIN")
	if daemonBin == "" {
		daemonBin = filepath.Join(dir, "collectived")
		if err := goBuild(daemonBin, "../cmd/collectived"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	trainerBin = filepath.Join(dir, "trainer")
	if err := goBuild(trainerBin, "./trainer"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func goBuild(out, pkg string) error {
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %w", pkg, err)
	}
	return nil
}

// fastTimeouts keep failure tests short; every test world uses them unless
// it says otherwise.
const fastTimeouts = `timeouts:
  connect: 20s
  collective: 20s
  first_call: 20s
  stall_warning: 2s
  hello: 2s
  heartbeat: 200ms
  heartbeat_timeout: 1500ms
`

// world is a set of daemon processes on loopback.
type world struct {
	t            *testing.T
	dir          string
	nodes, local int
	cfgPath      string
	token        string
	sockets      []string
	addrs        []string // ring addresses, node rank order
	logs         []string
	mu           sync.Mutex
	daemons      []*exec.Cmd
}

func startWorld(t *testing.T, nodes, local int, extra string) *world {
	t.Helper()
	return startWorldPorts(t, nodes, local, extra, freePorts(t, nodes))
}

// startWorldPorts is startWorld on the given ring ports, one per node.
func startWorldPorts(t *testing.T, nodes, local int, extra string, ports []int) *world {
	t.Helper()
	if len(ports) != nodes {
		t.Fatalf("startWorldPorts: %d ports for %d nodes", len(ports), nodes)
	}
	// Socket paths must fit sun_path: a short temp dir, not t.TempDir().
	dir, err := os.MkdirTemp("", "cvd-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	var tok [24]byte
	rand.Read(tok[:])
	w := &world{t: t, dir: dir, nodes: nodes, local: local, token: hex.EncodeToString(tok[:])}
	var peers strings.Builder
	for _, p := range ports {
		fmt.Fprintf(&peers, "  - 127.0.0.1:%d\n", p)
		w.addrs = append(w.addrs, fmt.Sprintf("127.0.0.1:%d", p))
	}
	if extra == "" {
		extra = fastTimeouts
	}
	cfg := fmt.Sprintf("job:\n  name: e2e\n  token_env: E2E_TOKEN\n  local_size: %d\npeers:\n%srank: 0\n%s", local, peers.String(), extra)
	w.cfgPath = filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(w.cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	w.daemons = make([]*exec.Cmd, nodes)
	for i := 0; i < nodes; i++ {
		w.sockets = append(w.sockets, filepath.Join(dir, fmt.Sprintf("n%d.sock", i)))
		w.logs = append(w.logs, filepath.Join(dir, fmt.Sprintf("n%d.log", i)))
	}
	t.Cleanup(w.stop)
	for i := 0; i < nodes; i++ {
		w.startDaemon(i)
	}
	for i := 0; i < nodes; i++ {
		w.waitSocket(i, 20*time.Second)
	}
	return w
}

func (w *world) startDaemon(i int) {
	w.t.Helper()
	logf, err := os.OpenFile(w.logs[i], os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		w.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(daemonBin, "run", "--config", w.cfgPath, "--rank", fmt.Sprint(i), "--socket", w.sockets[i])
	cmd.Env = append(os.Environ(), "E2E_TOKEN="+w.token)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		w.t.Fatalf("start daemon %d: %v", i, err)
	}
	w.mu.Lock()
	w.daemons[i] = cmd
	w.mu.Unlock()
}

func (w *world) waitSocket(i int, d time.Duration) {
	w.t.Helper()
	deadline := time.Now().Add(d)
	for {
		c, err := net.Dial("unix", w.sockets[i])
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			log := w.log(i)
			w.t.Fatalf("daemon %d never opened %s within %v; log:\n%s%s", i, w.sockets[i], d, log, localworld.EnvHint(log))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// signal sends sig to daemon i by its PID.
func (w *world) signal(i int, sig syscall.Signal) {
	w.mu.Lock()
	cmd := w.daemons[i]
	w.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		cmd.Process.Signal(sig)
	}
}

// pid is daemon i's process id, 0 if it is not running.
func (w *world) pid(i int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if cmd := w.daemons[i]; cmd != nil && cmd.Process != nil {
		return cmd.Process.Pid
	}
	return 0
}

// kill ends daemon i with SIGKILL and reaps it.
func (w *world) kill(i int) {
	w.mu.Lock()
	cmd := w.daemons[i]
	w.daemons[i] = nil
	w.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Kill()
	cmd.Wait()
}

func (w *world) stop() {
	w.mu.Lock()
	ds := append([]*exec.Cmd(nil), w.daemons...)
	w.mu.Unlock()
	for _, cmd := range ds {
		if cmd != nil {
			cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for i, cmd := range ds {
		if cmd == nil {
			continue
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil && w.t.Failed() {
				w.t.Logf("daemon %d exited: %v", i, err)
			}
		case <-time.After(10 * time.Second):
			w.t.Errorf("daemon %d did not stop within 10s of SIGTERM; killing pid %d", i, cmd.Process.Pid)
			cmd.Process.Kill()
			<-done
		}
	}
	// The job token is a secret: whatever a test did, no daemon's log
	// (read whole, not the tail that log shows) may contain it.
	for i, p := range w.logs {
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(w.token)) {
			w.t.Errorf("daemon %d's log %s contains the job token", i, p)
		}
	}
	if w.t.Failed() {
		for i := range w.logs {
			w.t.Logf("daemon %d log:\n%s", i, w.log(i))
		}
	}
	os.RemoveAll(w.dir)
}

func (w *world) fleet() fleet { return fleet{t: w.t, sockets: w.sockets, log: w.log} }

func (w *world) log(i int) string {
	b, _ := os.ReadFile(w.logs[i])
	if len(b) > 6000 {
		b = b[len(b)-6000:]
	}
	return string(b)
}

// trainer is one trainer process.
type trainer struct {
	node   int
	cmd    *exec.Cmd
	stdout syncbuf.Buffer // read while the process may still write (a timeout)
	stderr syncbuf.Buffer
	done   chan error
}

// event mirrors the trainer program's output.
type event struct {
	Call    int    `json:"call"`
	Rank    int    `json:"rank"`
	Desc    string `json:"desc"`
	Path    string `json:"path"`
	OK      bool   `json:"ok"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Hash    string `json:"hash"`
	Gen     uint32 `json:"gen"`
	Seq     uint64 `json:"seq"`
	Millis  int64  `json:"ms"`
}

func (w *world) startTrainer(node int, args ...string) *trainer {
	w.t.Helper()
	tr := &trainer{node: node, done: make(chan error, 1)}
	tr.cmd = exec.Command(trainerBin, append([]string{"-socket", w.sockets[node], "-job", "e2e"}, args...)...)
	tr.cmd.Stdout, tr.cmd.Stderr = &tr.stdout, &tr.stderr
	tr.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := tr.cmd.Start(); err != nil {
		w.t.Fatalf("start trainer: %v", err)
	}
	go func() { tr.done <- tr.cmd.Wait() }()
	w.t.Cleanup(func() {
		tr.cmd.Process.Kill()
		<-tr.done
		tr.done <- nil
	})
	return tr
}

// startTrainers starts local trainers on every node, node by node.
func (w *world) startTrainers(args ...string) []*trainer {
	var trs []*trainer
	for n := 0; n < w.nodes; n++ {
		for l := 0; l < w.local; l++ {
			trs = append(trs, w.startTrainer(n, args...))
		}
	}
	return trs
}

// wait waits for the trainer to exit and returns its events.
func (tr *trainer) wait(t *testing.T, d time.Duration) ([]event, error) {
	t.Helper()
	var err error
	select {
	case err = <-tr.done:
		tr.done <- err
	case <-time.After(d):
		t.Fatalf("trainer pid %d still running after %v; stderr:\n%s", tr.cmd.Process.Pid, d, tr.stderr.String())
	}
	var evs []event
	sc := bufio.NewScanner(strings.NewReader(tr.stdout.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e event
		if jerr := json.Unmarshal(sc.Bytes(), &e); jerr != nil {
			t.Fatalf("trainer printed %q: %v", sc.Text(), jerr)
		}
		evs = append(evs, e)
	}
	if err != nil {
		err = fmt.Errorf("%w: %s", err, strings.TrimSpace(tr.stderr.String()))
	}
	return evs, err
}

// freePorts returns n TCP ports free on 127.0.0.1 just now, all different
// and outside the kernel's ephemeral range (localworld.FreePorts).
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	ports, err := localworld.FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	return ports
}
