package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	cvd "github.com/collectived/collectived/clients/go"
)

// Bad up flags are refused, by name, before any daemon starts.
func TestUpRefusesBadFlags(t *testing.T) {
	for want, args := range map[string][]string{
		"--nodes 0 x --local 2":  {"--nodes", "0"},
		"--nodes 2 x --local -1": {"--local", "-1"},
		"--job is empty":         {"--job", ""},
	} {
		app := newApp()
		app.ExitErrHandler = func(*cli.Context, error) {}
		var out bytes.Buffer
		app.Writer, app.ErrWriter = &out, &out
		err := app.Run(append([]string{"collectived", "up"}, args...))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("up %v: %v, want an error saying %q", args, err, want)
		}
	}
}

// upBinary builds this command (once per test binary run) for the tests
// that run `collectived up` as a user does, Ctrl-C included.
func upBinary(t *testing.T) string {
	t.Helper()
	if b := os.Getenv("COLLECTIVED_BIN"); b != "" {
		return b
	}
	bin := filepath.Join(t.TempDir(), "collectived")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

type upProc struct {
	cmd     *exec.Cmd
	out     *bufio.Scanner
	lines   []string
	sockets []string
	pids    []int
	dir     string
}

var nodeLine = regexp.MustCompile(`^node (\d+): socket (\S+)  \(pid (\d+), `)
var inLine = regexp.MustCompile(`, in (\S+)$`)

// startUp runs `collectived up` and reads its output until it says it is
// ready.
func startUp(t *testing.T, args ...string) *upProc {
	t.Helper()
	cmd := exec.Command(upBinary(t), append([]string{"up"}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	u := &upProc{cmd: cmd, out: bufio.NewScanner(stdout)}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
		}
	})
	for u.out.Scan() {
		line := u.out.Text()
		u.lines = append(u.lines, line)
		if m := inLine.FindStringSubmatch(line); m != nil && strings.HasPrefix(line, "collectived up:") {
			u.dir = m[1]
		}
		if m := nodeLine.FindStringSubmatch(line); m != nil {
			pid, _ := strconv.Atoi(m[3])
			u.sockets, u.pids = append(u.sockets, m[2]), append(u.pids, pid)
		}
		if strings.HasPrefix(line, "ready;") {
			return u
		}
	}
	cmd.Wait()
	t.Fatalf("collectived up ended before it was ready: %v\n%s", cmd.ProcessState, strings.Join(u.lines, "\n"))
	return nil
}

// rest reads what up prints until it exits, and its exit status.
func (u *upProc) rest() (string, error) {
	var b strings.Builder
	for u.out.Scan() {
		b.WriteString(u.out.Text() + "\n")
	}
	return b.String(), u.cmd.Wait()
}

// `collectived up --nodes 2 --local 2` runs a world trainers can use with
// what it prints (socket, job), and Ctrl-C stops every daemon and removes
// its directory.
func TestUpRunsAWorldUntilCtrlC(t *testing.T) {
	u := startUp(t, "--nodes", "2", "--local", "2", "--job", "uptest")
	if len(u.sockets) != 2 || u.dir == "" {
		t.Fatalf("up printed no sockets or directory:\n%s", strings.Join(u.lines, "\n"))
	}
	// Four trainers, by what up printed: world ranks 0-1 on node 0, 2-3 on node 1.
	var wg sync.WaitGroup
	sums := make([][]float32, 4)
	errs := make([]error, 4)
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			c, err := cvd.Dial(cvd.Options{Socket: u.sockets[r/2], Job: "uptest", LocalRank: r % 2,
				Label: "up test", Timeout: 60 * time.Second})
			if err != nil {
				errs[r] = err
				return
			}
			defer c.Close()
			if c.Rank() != r || c.Size() != 4 {
				errs[r] = fmt.Errorf("trainer %d is world rank %d of %d", r, c.Rank(), c.Size())
				return
			}
			buf := make([]byte, 4*3)
			for i := 0; i < 3; i++ {
				binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(float32(r+1)))
			}
			if err := c.AllReduce(buf, cvd.Float32, cvd.Sum); err != nil {
				errs[r] = err
				return
			}
			for i := 0; i < 3; i++ {
				sums[r] = append(sums[r], math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:])))
			}
		}(r)
	}
	wg.Wait()
	for r := 0; r < 4; r++ {
		if errs[r] != nil {
			t.Fatalf("trainer %d: %v", r, errs[r])
		}
		if fmt.Sprint(sums[r]) != "[10 10 10]" {
			t.Errorf("trainer %d: allreduce gave %v, want [10 10 10]", r, sums[r])
		}
	}
	// Ctrl-C.
	if err := u.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	out, err := u.rest()
	if err != nil {
		t.Fatalf("up after Ctrl-C: %v\n%s", err, out)
	}
	if !strings.Contains(out, "stopped 2 daemons") {
		t.Errorf("up after Ctrl-C printed %q, want it to say it stopped 2 daemons", out)
	}
	for r, pid := range u.pids {
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("daemon %d (pid %d) still running after up ended", r, pid)
		}
		if c, err := net.Dial("unix", u.sockets[r]); err == nil {
			c.Close()
			t.Errorf("node %d's socket still answers", r)
		}
	}
	if _, err := os.Stat(u.dir); !os.IsNotExist(err) {
		t.Errorf("up's directory %s still there after it ended (%v)", u.dir, err)
	}
}

// A daemon that exits by itself stops the others, and up fails naming it.
func TestUpFailsWhenADaemonDies(t *testing.T) {
	u := startUp(t, "--nodes", "2", "--local", "1")
	if len(u.pids) != 2 {
		t.Fatalf("up printed %d daemons:\n%s", len(u.pids), strings.Join(u.lines, "\n"))
	}
	if err := syscall.Kill(u.pids[1], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	out, err := u.rest()
	if err == nil {
		t.Fatalf("up went on after its daemon 1 was killed:\n%s", out)
	}
	if syscall.Kill(u.pids[0], 0) == nil {
		t.Errorf("daemon 0 (pid %d) still running after up failed", u.pids[0])
	}
}
