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
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	cvd "github.com/collectived/collectived/clients/go"
	"github.com/collectived/collectived/internal/syncbuf"
)

// A cluster is a world of daemon processes, each either in a network
// namespace of its own (its own address, joined to the others through a
// bridge in one more namespace), or, for the tests that need no network
// faults, on loopback. Unlike world (harness_test.go) it can put daemons
// and trainers in namespaces, give a node a --listen address behind a
// relay, and start the daemons only after the caller has set up relays
// and firewall rules.
type cluster struct {
	t            *testing.T
	id           string // PID-SEQ: unique per test, names its namespaces
	dir          string
	nodes, local int
	token        string
	cfgPath      string
	netns        []string // per node; nil on loopback
	bridgeNS     string
	addrs        []string // the peers list
	listen       []string // per node --listen, "" for none
	sockets      []string
	logs         []string

	started bool // config written, stop arranged

	mu      sync.Mutex
	daemons []*exec.Cmd
}

// netPrefix is the /24 the namespaced nodes live in. These addresses exist
// only inside namespaces the test creates: nothing routes them out.
const netPrefix = "10.77.0."

// ringPort is every namespaced daemon's ring port: each has its own
// namespace, so they cannot collide.
const ringPort = 7101

var clusterSeq int

// nsPrefix starts the name of every namespace these tests create, followed
// by the test process's PID: cvde2e-PID-SEQ-n0.
const nsPrefix = "cvde2e-"

// sweepStaleNamespaces deletes namespaces left by a test process that no
// longer exists (killed before its cleanup could run), so that they do not
// pile up on a CI machine.
func sweepStaleNamespaces(t *testing.T) {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		rest, ok := strings.CutPrefix(name, nsPrefix)
		if !ok {
			continue
		}
		pidText, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid <= 0 || pid == os.Getpid() || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err == nil {
			t.Logf("deleted namespace %s left by dead test process %d", name, pid)
		} else {
			t.Logf("could not delete stale namespace %s: %v: %s", name, err, out)
		}
	}
}

// requireNetns skips unless this process may create network namespaces
// and iproute2 is installed.
func requireNetns(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network-namespace fault tests need root (they create namespaces, veths and a bridge)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("network-namespace fault tests need `ip` (Debian package iproute2), not installed")
	}
}

// requireIptables skips unless iptables is installed.
func requireIptables(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skip("this fault test needs `iptables` (Debian package iptables), not installed")
	}
}

// newNetCluster creates nodes namespaces at 10.77.0.1.. and a bridge
// namespace joining them, and writes the job config; the daemons start
// with startAll. Everything is removed in t.Cleanup, even on failure.
func newNetCluster(t *testing.T, nodes, local int) *cluster {
	t.Helper()
	requireNetns(t)
	sweepStaleNamespaces(t)
	c := newCluster(t, nodes, local)
	c.bridgeNS = nsPrefix + c.id + "-br"
	// Cleanups run last-in first-out: this one, registered before any
	// process is started, runs after every process is stopped.
	t.Cleanup(c.deleteNamespaces)
	if out, err := exec.Command("ip", "netns", "add", c.bridgeNS).CombinedOutput(); err != nil {
		t.Skipf("network namespaces refused here (ip netns add: %v: %s); skipping", err, bytes.TrimSpace(out))
	}
	c.ipn(c.bridgeNS, "link", "set", "lo", "up")
	c.ipn(c.bridgeNS, "link", "add", "br0", "type", "bridge")
	c.ipn(c.bridgeNS, "link", "set", "br0", "up")
	for i := 0; i < nodes; i++ {
		ns := fmt.Sprintf("%s%s-n%d", nsPrefix, c.id, i)
		c.netns = append(c.netns, ns)
		c.run("ip", "netns", "add", ns)
		// Both ends are created straight inside their namespaces: no
		// interface ever appears in the host's namespace.
		c.run("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", fmt.Sprintf("p%d", i), "netns", c.bridgeNS)
		c.ipn(c.bridgeNS, "link", "set", fmt.Sprintf("p%d", i), "master", "br0")
		c.ipn(c.bridgeNS, "link", "set", fmt.Sprintf("p%d", i), "up")
		c.ipn(ns, "link", "set", "lo", "up")
		c.ipn(ns, "addr", "add", c.nodeIP(i)+"/24", "dev", "eth0")
		c.ipn(ns, "link", "set", "eth0", "up")
		c.addrs = append(c.addrs, fmt.Sprintf("%s:%d", c.nodeIP(i), ringPort))
	}
	c.writeConfig(fastTimeouts)
	return c
}

// newLoopCluster is a cluster on 127.0.0.1 with free ports.
func newLoopCluster(t *testing.T, nodes, local int) *cluster {
	t.Helper()
	c := newCluster(t, nodes, local)
	for _, p := range freePorts(t, nodes) {
		c.addrs = append(c.addrs, fmt.Sprintf("127.0.0.1:%d", p))
	}
	return c
}

func newCluster(t *testing.T, nodes, local int) *cluster {
	clusterSeq++
	// Socket paths must fit sun_path: a short temp dir, not t.TempDir().
	dir, err := os.MkdirTemp("", "cvd-ft-")
	if err != nil {
		t.Fatal(err)
	}
	var tok [24]byte
	rand.Read(tok[:])
	c := &cluster{t: t, id: fmt.Sprintf("%d-%d", os.Getpid(), clusterSeq), dir: dir,
		nodes: nodes, local: local, token: hex.EncodeToString(tok[:])}
	c.listen = make([]string, nodes)
	c.daemons = make([]*exec.Cmd, nodes)
	for i := 0; i < nodes; i++ {
		c.sockets = append(c.sockets, filepath.Join(dir, fmt.Sprintf("n%d.sock", i)))
		c.logs = append(c.logs, filepath.Join(dir, fmt.Sprintf("n%d.log", i)))
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return c
}

func (c *cluster) nodeIP(i int) string { return fmt.Sprintf("%s%d", netPrefix, i+1) }

func (c *cluster) writeConfig(timeouts string) {
	var peers strings.Builder
	for _, a := range c.addrs {
		fmt.Fprintf(&peers, "  - %s\n", a)
	}
	cfg := fmt.Sprintf("job:\n  name: e2e\n  token_env: E2E_TOKEN\n  local_size: %d\npeers:\n%srank: 0\n%s", c.local, peers.String(), timeouts)
	c.cfgPath = filepath.Join(c.dir, "config.yaml")
	if err := os.WriteFile(c.cfgPath, []byte(cfg), 0o600); err != nil {
		c.t.Fatal(err)
	}
}

// run runs a setup command and fails the test if it fails.
func (c *cluster) run(name string, args ...string) string {
	c.t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		c.t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (c *cluster) ipn(ns string, args ...string) {
	c.t.Helper()
	c.run("ip", append([]string{"-n", ns}, args...)...)
}

// iptables runs iptables inside node i's namespace (-w: wait for the
// xtables lock rather than fail).
func (c *cluster) iptables(i int, args ...string) string {
	c.t.Helper()
	return c.run("ip", append([]string{"netns", "exec", c.netns[i], "iptables", "-w"}, args...)...)
}

// deleteNamespaces removes the namespaces; their veths, the bridge and
// every iptables rule inside them go with them.
func (c *cluster) deleteNamespaces() {
	for _, ns := range append(append([]string(nil), c.netns...), c.bridgeNS) {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil && !strings.Contains(string(out), "No such file") {
			c.t.Errorf("cleanup: ip netns del %s: %v: %s", ns, err, out)
		}
	}
}

// command builds a command that runs in node i's namespace, if any.
func (c *cluster) command(i int, bin string, args ...string) *exec.Cmd {
	var cmd *exec.Cmd
	if c.netns != nil {
		// ip netns exec execs the program in place: the PID is the
		// program's own, and so is the parent-death signal.
		cmd = exec.Command("ip", append([]string{"netns", "exec", c.netns[i], bin}, args...)...)
	} else {
		cmd = exec.Command(bin, args...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// startAll starts every daemon and waits until each socket answers and
// the ring is up.
func (c *cluster) startAll() {
	c.t.Helper()
	for i := 0; i < c.nodes; i++ {
		c.startOnly(i)
	}
	for i := 0; i < c.nodes; i++ {
		c.fleet().waitUp(i, 0, 30*time.Second)
	}
}

// startOnly starts daemon i, the first time with the config written and
// stopping arranged, and waits until its socket answers (its ring may
// still be forming).
func (c *cluster) startOnly(i int) {
	c.t.Helper()
	if !c.started {
		c.started = true
		if c.cfgPath == "" {
			c.writeConfig(fastTimeouts)
		}
		c.t.Cleanup(c.stop)
	}
	c.startDaemon(i)
	waitFor(c.t, 20*time.Second, fmt.Sprintf("daemon %d's socket", i), func() bool {
		conn, err := net.Dial("unix", c.sockets[i])
		if err == nil {
			conn.Close()
		}
		return err == nil
	})
}

func (c *cluster) startDaemon(i int) {
	c.t.Helper()
	logf, err := os.OpenFile(c.logs[i], os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		c.t.Fatal(err)
	}
	defer logf.Close()
	args := []string{"run", "--config", c.cfgPath, "--rank", fmt.Sprint(i), "--socket", c.sockets[i]}
	if c.listen[i] != "" {
		args = append(args, "--listen", c.listen[i])
	}
	cmd := c.command(i, daemonBin, args...)
	cmd.Env = append(os.Environ(), "E2E_TOKEN="+c.token)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start daemon %d: %v", i, err)
	}
	c.mu.Lock()
	c.daemons[i] = cmd
	c.mu.Unlock()
}

// signal sends sig to daemon i by its PID.
func (c *cluster) signal(i int, sig syscall.Signal) {
	c.mu.Lock()
	cmd := c.daemons[i]
	c.mu.Unlock()
	if cmd != nil {
		cmd.Process.Signal(sig)
	}
}

// kill ends daemon i with SIGKILL and reaps it.
func (c *cluster) kill(i int) {
	c.mu.Lock()
	cmd := c.daemons[i]
	c.daemons[i] = nil
	c.mu.Unlock()
	if cmd != nil {
		cmd.Process.Kill()
		cmd.Wait()
	}
}

func (c *cluster) stop() {
	c.mu.Lock()
	ds := append([]*exec.Cmd(nil), c.daemons...)
	c.mu.Unlock()
	for _, cmd := range ds {
		if cmd != nil {
			cmd.Process.Signal(syscall.SIGCONT) // a stopped daemon cannot act on SIGTERM
			cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for i, cmd := range ds {
		if cmd == nil {
			continue
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			c.t.Errorf("daemon %d did not stop within 10s of SIGTERM; killing pid %d", i, cmd.Process.Pid)
			cmd.Process.Kill()
			<-done
		}
	}
	if c.t.Failed() {
		for i := range c.logs {
			c.t.Logf("daemon %d log:\n%s", i, c.log(i))
		}
	}
}

func (c *cluster) log(i int) string {
	b, _ := os.ReadFile(c.logs[i])
	if len(b) > 6000 {
		b = b[len(b)-6000:]
	}
	return string(b)
}

// fullLog is daemon i's whole log.
func (c *cluster) fullLog(i int) string {
	b, _ := os.ReadFile(c.logs[i])
	return string(b)
}

// status asks daemon i for its state as an observer, as `collectived
// status` does.
func (c *cluster) status(i int) (nodeStatus, error) {
	return clusterStatus(c.sockets[i])
}

func clusterStatus(socket string) (nodeStatus, error) {
	var st nodeStatus
	cl, err := cvd.Dial(cvd.Options{Socket: socket, Job: "e2e", Observer: true, LocalRank: -1,
		Label: "e2e status", Timeout: 5 * time.Second, DialTimeout: 5 * time.Second})
	if err != nil {
		return st, err
	}
	defer cl.Close()
	raw, err := cl.StatusJSON()
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(raw, &st)
}

// fleet is the cluster's daemons seen through their sockets: waitUp,
// baselines and checkBaselines (baseline_test.go), as for a world.
func (c *cluster) fleet() fleet { return fleet{t: c.t, sockets: c.sockets, log: c.log} }

// nodeStatus is the part of the daemon's STATUS_OK document (daemon.Status)
// these tests read; decoding only it keeps them independent of the rest.
type nodeStatus struct {
	Ring struct {
		State      string `json:"state"`
		Generation uint32 `json:"generation"`
		LastError  string `json:"last_error"`
	} `json:"ring"`
	Trainers []struct {
		LocalRank int   `json:"local_rank"`
		WorldRank int   `json:"world_rank"`
		Attached  bool  `json:"attached"`
		PID       int32 `json:"pid"`
		Lane      bool  `json:"lane"`
	} `json:"trainers"`
	Process procStatus `json:"process"`
}

// lanes is how many attached trainers have a lane: each is a memfd the
// daemon holds (docs/PROTOCOL.md, LANE).
func (st nodeStatus) lanes() int {
	n := 0
	for _, tr := range st.Trainers {
		if tr.Attached && tr.Lane {
			n++
		}
	}
	return n
}

// faultTrainerBin is e2e/faulttrainer, built once on first use.
var faultTrainerBin = sync.OnceValues(func() (string, error) {
	out := filepath.Join(filepath.Dir(trainerBin), "faulttrainer")
	return out, goBuild(out, "./faulttrainer")
})

// ftEvent mirrors e2e/faulttrainer's output.
type ftEvent struct {
	Call    int    `json:"call"`
	Rank    int    `json:"rank"`
	OK      bool   `json:"ok"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Gen     uint32 `json:"gen"`
	Seq     uint64 `json:"seq"`
	StartNs int64  `json:"start_ns"`
	EndNs   int64  `json:"end_ns"`
	Held    int    `json:"held"`
}

func (e ftEvent) end() time.Time { return time.Unix(0, e.EndNs) }

// ftProc is one faulttrainer process.
type ftProc struct {
	t      *testing.T
	node   int
	cmd    *exec.Cmd
	stdout syncbuf.Buffer
	stderr syncbuf.Buffer
	done   chan struct{}
	err    error // valid once done is closed
}

// startFT starts a faulttrainer on node i with the given arguments.
func (c *cluster) startFT(i int, args ...string) *ftProc {
	c.t.Helper()
	bin, err := faultTrainerBin()
	if err != nil {
		c.t.Fatal(err)
	}
	p := &ftProc{t: c.t, node: i, done: make(chan struct{})}
	p.cmd = c.command(i, bin, append([]string{"-socket", c.sockets[i], "-job", "e2e"}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	if err := p.cmd.Start(); err != nil {
		c.t.Fatalf("start faulttrainer on node %d: %v", i, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	c.t.Cleanup(func() { p.cmd.Process.Kill(); <-p.done })
	return p
}

// events parses the complete lines printed so far.
func (p *ftProc) events() []ftEvent {
	p.t.Helper()
	var evs []ftEvent
	sc := bufio.NewScanner(strings.NewReader(p.stdout.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e ftEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			continue // a line still being written
		}
		evs = append(evs, e)
	}
	return evs
}

// lastCall is the number of the last call printed so far, read from the
// end of the output (cheap even after thousands of calls), or -1.
func (p *ftProc) lastCall() int {
	out := strings.TrimRight(p.stdout.String(), "\n")
	var e ftEvent
	for out != "" {
		i := strings.LastIndexByte(out, '\n')
		if json.Unmarshal([]byte(out[i+1:]), &e) == nil {
			return e.Call
		}
		out = out[:max(i, 0)]
	}
	return -1
}

// wait waits for the process to exit and returns its events.
func (p *ftProc) wait(d time.Duration) ([]ftEvent, error) {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		p.t.Fatalf("faulttrainer pid %d on node %d still running after %v; stderr:\n%s\nevents so far: %+v",
			p.cmd.Process.Pid, p.node, d, p.stderr.String(), p.events())
	}
	err := p.err
	if err != nil {
		err = fmt.Errorf("%w: %s", err, strings.TrimSpace(p.stderr.String()))
	}
	return p.events(), err
}

// startTrainerIn is world.startTrainer for a cluster: the e2e trainer
// program in node i's namespace, returning the harness's trainer type so
// that trainer.wait and checkSameResults apply.
func (c *cluster) startTrainerIn(i int, args ...string) *trainer {
	c.t.Helper()
	tr := &trainer{node: i, done: make(chan error, 1)}
	tr.cmd = c.command(i, trainerBin, append([]string{"-socket", c.sockets[i], "-job", "e2e"}, args...)...)
	tr.cmd.Stdout, tr.cmd.Stderr = &tr.stdout, &tr.stderr
	if err := tr.cmd.Start(); err != nil {
		c.t.Fatalf("start trainer: %v", err)
	}
	go func() { tr.done <- tr.cmd.Wait() }()
	c.t.Cleanup(func() {
		tr.cmd.Process.Kill()
		err := <-tr.done
		tr.done <- err
	})
	return tr
}

// firstFailure is the first failed call in evs.
func firstFailure(evs []ftEvent) (ftEvent, bool) {
	for _, e := range evs {
		if !e.OK && e.Held == 0 {
			return e, true
		}
	}
	return ftEvent{}, false
}
