package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/collectived/collectived/internal/localworld"
)

// benchTrainer is one `bench-trainer` process. Its stdout is our end of a
// pipe of our own, not exec's StdoutPipe, so that the goroutine waiting
// for the process (which it starts) never closes it under a reader.
type benchTrainer struct {
	cmd    *exec.Cmd
	out    *os.File
	stderr *bytes.Buffer // read only once done is closed
	done   chan struct{} // closed once the process is reaped
	err    error         // its exit status, once done is closed
	bad    string        // a line of its stdout that was no result (rows)
}

// startBenchTrainer starts the trainer of local rank l on node n of w (the
// Go bench-trainer, or --trainer-cmd with the same flags); files become
// its fd 3 on, extra is appended to its arguments.
func startBenchTrainer(c *cli.Context, self string, w *localworld.World, n, l int, files []*os.File, extra []string) (*benchTrainer, error) {
	args := append([]string{"bench-trainer", "--socket", w.Sockets[n], "--job", w.Job, "--local-rank", strconv.Itoa(l)},
		workloadArgs(c)...)
	args = append(args, "--in-flight", strconv.Itoa(c.Int("in-flight")),
		"--spin", c.Duration("client-spin").String(), "--inline-max", strconv.Itoa(c.Int("client-inline-max")),
		"--no-lane="+strconv.FormatBool(c.Bool("client-no-lane")))
	argv := append([]string{self}, args...)
	if tc := strings.Fields(c.String("trainer-cmd")); len(tc) > 0 {
		argv = append(tc, args[1:]...) // its flags, without the subcommand's name
	}
	cmd := exec.Command(argv[0], append(argv[1:], extra...)...)
	r, wr, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("trainer %d of node %d: stdout pipe: %w", l, n, err)
	}
	t := &benchTrainer{cmd: cmd, out: r, stderr: new(bytes.Buffer), done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = wr, t.stderr
	cmd.ExtraFiles = files
	cmd.SysProcAttr = &unix.SysProcAttr{Pdeathsig: unix.SIGKILL}
	err = cmd.Start()
	wr.Close() // the child has its copy: our reads end when it exits
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("start trainer %d of node %d: %w", l, n, err)
	}
	go func() {
		t.err = cmd.Wait()
		close(t.done)
	}()
	return t, nil
}

// wait waits up to d for the trainer to end by itself and returns its exit
// status; after d it is killed and that is the error.
func (t *benchTrainer) wait(d time.Duration) error {
	select {
	case <-t.done:
		return t.err
	case <-time.After(d):
		t.cmd.Process.Kill()
		<-t.done
		return fmt.Errorf("still running after %v: killed", d)
	}
}

// ended reports whether the trainer has ended, waiting up to grace for it,
// and if so how: its exit status and stderr. One still running after a
// grace above 0 is killed (and so has ended).
func (t *benchTrainer) ended(grace time.Duration) (bool, string) {
	var err error
	select {
	case <-t.done:
		err = t.err
	default:
		if grace <= 0 {
			return false, ""
		}
		err = t.wait(grace)
	}
	return true, fmt.Sprintf("%s; its stderr: %s", exitStatus(err), strings.TrimSpace(t.stderr.String()))
}

// exitStatus says how a process ended, given what Wait returned.
func exitStatus(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// kill ends the trainer if it still runs, and reaps it.
func (t *benchTrainer) kill() {
	t.cmd.Process.Kill()
	<-t.done
	t.out.Close()
}

// rows reads the results world rank 0 prints, one per size (n of them),
// until its stdout ends or holds something else (t.bad says what).
func (t *benchTrainer) rows(n int) <-chan sizeResult {
	ch := make(chan sizeResult, n)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(t.out)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			var r sizeResult
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.bad = fmt.Sprintf("%.200q (%v)", sc.Text(), err)
				return
			}
			ch <- r
		}
	}()
	return ch
}

// readSizeResults reads the results a bench-ring rank 0 wrote.
func readSizeResults(path string) ([]sizeResult, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []sizeResult
	dec := json.NewDecoder(f)
	for {
		var r sizeResult
		if err := dec.Decode(&r); err == io.EOF {
			return out, nil
		} else if err != nil {
			return out, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, r)
	}
}
