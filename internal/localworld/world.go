package localworld

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options describe the world to start.
type Options struct {
	Bin          string // the collectived binary
	Dir          string // where the config, sockets and logs go (the caller owns it)
	Nodes, Local int
	Job          string // default "bench"
	TokenEnv     string // the variable the daemons read the token from; default COLLECTIVED_LOCAL_TOKEN
	Extra        string // YAML appended to the config (timeouts, ring tuning)
	OpenWait     time.Duration
	StopGrace    time.Duration
	Warn         io.Writer // where Stop reports daemons that had to be killed; default os.Stderr
	// Command is the subcommand every node runs, with --config and --rank
	// (and, for "run", --socket); default "run". Another command (such as
	// bench-ring) opens no Unix socket: Start does not wait for one, and
	// the caller waits for the processes with Wait.
	Command string
	Args    []string // appended to every node's arguments
	// Ports, if set, are the nodes' ring ports (one per node); default
	// FreePorts. Two worlds started together take theirs from one
	// FreePorts call, or the second could be handed a port the first has
	// not bound yet.
	Ports []int
	// ExtraFiles, if set, gives node n's process open files from fd 3 on
	// (bench --sidecar's pacing sockets).
	ExtraFiles func(node int) []*os.File
}

// World is a running set of daemons.
type World struct {
	Job     string
	Config  string   // path of the config file
	Sockets []string // node rank -> its Unix socket
	Logs    []string // node rank -> its log file
	// Exited receives the rank of each daemon that ends without Stop.
	Exited <-chan int

	o        Options
	procs    []*proc
	exited   chan int
	stopping chan struct{}
	stopOnce sync.Once
}

type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once reaped
	err  error         // its exit status, valid after done
}

// Start writes the config and starts the daemons; it returns once every
// socket answers, or stops what it started and says why.
func Start(o Options) (*World, error) {
	if o.Job == "" {
		o.Job = "bench"
	}
	if o.Command == "" {
		o.Command = "run"
	}
	if o.TokenEnv == "" {
		o.TokenEnv = "COLLECTIVED_LOCAL_TOKEN"
	}
	if o.OpenWait <= 0 {
		o.OpenWait = 30 * time.Second
	}
	if o.StopGrace <= 0 {
		o.StopGrace = 10 * time.Second
	}
	if o.Warn == nil {
		o.Warn = os.Stderr
	}
	if o.Nodes < 1 || o.Local < 1 {
		return nil, fmt.Errorf("localworld: %d nodes x %d trainers: want at least 1 x 1", o.Nodes, o.Local)
	}
	var tok [24]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return nil, err
	}
	ports := o.Ports
	if ports == nil {
		var err error
		if ports, err = FreePorts(o.Nodes); err != nil {
			return nil, err
		}
	} else if len(ports) != o.Nodes {
		return nil, fmt.Errorf("localworld: %d ports for %d nodes", len(ports), o.Nodes)
	}
	var peers strings.Builder
	for _, p := range ports {
		fmt.Fprintf(&peers, "  - 127.0.0.1:%d\n", p)
	}
	w := &World{Job: o.Job, Config: filepath.Join(o.Dir, "config.yaml"), o: o,
		exited: make(chan int, o.Nodes), stopping: make(chan struct{})}
	w.Exited = w.exited
	cfg := fmt.Sprintf("job:\n  name: %s\n  token_env: %s\n  local_size: %d\npeers:\n%srank: 0\n%s",
		o.Job, o.TokenEnv, o.Local, peers.String(), o.Extra)
	if err := os.WriteFile(w.Config, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	env := append(os.Environ(), o.TokenEnv+"="+hex.EncodeToString(tok[:]))
	for i := 0; i < o.Nodes; i++ {
		sock := filepath.Join(o.Dir, fmt.Sprintf("n%d.sock", i))
		logPath := filepath.Join(o.Dir, fmt.Sprintf("n%d.log", i))
		logf, err := os.Create(logPath)
		if err != nil {
			w.Stop()
			return nil, err
		}
		p := &proc{done: make(chan struct{})}
		args := []string{o.Command, "--config", w.Config, "--rank", fmt.Sprint(i)}
		if o.Command == "run" {
			args = append(args, "--socket", sock)
		}
		p.cmd = exec.Command(o.Bin, append(args, o.Args...)...)
		p.cmd.Env = env
		p.cmd.Stdout, p.cmd.Stderr = logf, logf
		if o.ExtraFiles != nil {
			p.cmd.ExtraFiles = o.ExtraFiles(i)
		}
		// If the caller is killed outright, its daemons go with it.
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		err = p.cmd.Start()
		logf.Close()
		if err != nil {
			w.Stop()
			return nil, fmt.Errorf("localworld: start daemon %d (%s): %w", i, o.Bin, err)
		}
		w.Sockets, w.Logs, w.procs = append(w.Sockets, sock), append(w.Logs, logPath), append(w.procs, p)
		go w.reap(i, p)
	}
	if o.Command != "run" {
		return w, nil
	}
	deadline := time.Now().Add(o.OpenWait)
	for i, p := range w.procs {
		for {
			c, err := net.Dial("unix", w.Sockets[i])
			if err == nil {
				c.Close()
				break
			}
			select {
			case <-p.done:
				w.Stop()
				log := Tail(w.Logs[i])
				return nil, fmt.Errorf("localworld: daemon %d exited before opening %s (%v); its log:\n%s%s", i, w.Sockets[i], p.err, log, EnvHint(log))
			default:
			}
			if time.Now().After(deadline) {
				w.Stop()
				log := Tail(w.Logs[i])
				return nil, fmt.Errorf("localworld: daemon %d never opened %s within %v; its log:\n%s%s", i, w.Sockets[i], o.OpenWait, log, EnvHint(log))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return w, nil
}

// reap waits for daemon r and reports an exit that Stop did not ask for.
func (w *World) reap(r int, p *proc) {
	p.err = p.cmd.Wait()
	close(p.done)
	select {
	case <-w.stopping:
	default:
		w.exited <- r
	}
}

// PID is daemon r's process id.
func (w *World) PID(r int) int { return w.procs[r].cmd.Process.Pid }

// Exit waits up to d for node r to exit and reports whether it did, and
// its exit status if so. It does not consume Exited.
func (w *World) Exit(r int, d time.Duration) (exited bool, err error) {
	p := w.procs[r]
	select {
	case <-p.done:
		return true, p.err
	default:
	}
	if d <= 0 {
		return false, nil
	}
	select {
	case <-p.done:
		return true, p.err
	case <-time.After(d):
		return false, nil
	}
}

// Died describes daemon r's unasked-for exit.
func (w *World) Died(r int) error {
	p := w.procs[r]
	<-p.done
	return fmt.Errorf("daemon %d (pid %d) died: %v; its log ends:\n%s", r, w.PID(r), p.err, Tail(w.Logs[r]))
}

// Wait waits up to d for every node to exit by itself, and returns the
// first failure as it happens: a node that exited with an error (with its
// log), or the timeout naming a node still running. It consumes Exited.
// The caller still calls Stop, which then ends what is left.
func (w *World) Wait(d time.Duration) error {
	deadline := time.After(d)
	for left := len(w.procs); left > 0; left-- {
		select {
		case r := <-w.exited:
			if p := w.procs[r]; p.err != nil {
				return fmt.Errorf("localworld: node %d (pid %d) failed: %v; its log ends:\n%s", r, w.PID(r), p.err, Tail(w.Logs[r]))
			}
		case <-deadline:
			for r, p := range w.procs {
				select {
				case <-p.done:
				default:
					return fmt.Errorf("localworld: node %d (pid %d) still running after %v; its log ends:\n%s", r, w.PID(r), d, Tail(w.Logs[r]))
				}
			}
			return nil // all ended just now
		}
	}
	return nil
}

// Stop ends every daemon by its PID: SIGTERM, then SIGKILL after the
// grace. It is idempotent and returns once all are reaped.
func (w *World) Stop() {
	w.stopOnce.Do(func() {
		close(w.stopping)
		for _, p := range w.procs {
			p.cmd.Process.Signal(syscall.SIGTERM)
		}
		deadline := time.After(w.o.StopGrace)
		for r, p := range w.procs {
			select {
			case <-p.done:
			case <-deadline:
				fmt.Fprintf(w.o.Warn, "daemon %d (pid %d) still running %v after SIGTERM: SIGKILL\n", r, w.PID(r), w.o.StopGrace)
				p.cmd.Process.Kill()
				<-p.done
			}
		}
		for r, p := range w.procs {
			if !p.cmd.ProcessState.Success() && !signalled(p.cmd.ProcessState) {
				fmt.Fprintf(w.o.Warn, "daemon %d exited: %v; log tail:\n%s\n", r, p.err, Tail(w.Logs[r]))
			}
		}
	})
}

func signalled(ps *os.ProcessState) bool {
	ws, ok := ps.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled()
}

// EnvHint explains a daemon log that blames the machine rather than the
// code: a port or socket another process held for the whole bind timeout.
// It is "" for any other log.
func EnvHint(log string) string {
	if !strings.Contains(log, "still in use after") {
		return ""
	}
	return "\n(this failure comes from the machine, not the code: another process held the daemon's port or socket " +
		"for the whole bind timeout, timeouts.connect; the log names it. Stop it, or if it is a daemon left over by an " +
		"earlier run, kill it by that pid.)"
}

// Tail is the end of a log file, for error messages.
func Tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
