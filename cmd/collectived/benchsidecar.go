package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/collectived/collectived/internal/localworld"
)

// runBenchSidecar is `collectived bench --sidecar`: the daemons' world
// (one trainer per node) and the ring engines' world (what --ring-only
// runs) up at the same time, paced (pace.go) so that they take turns a
// block of calls at a time, the first of each pair of blocks alternating.
// Each side's figures are then taken over the same stretch of time, and
// each block of one side has a neighbour of the other to be set against.
func runBenchSidecar(c *cli.Context, self, dir string, nodes int, sizes []int64) error {
	block, iters := c.Int("sidecar-block"), c.Int("iters")
	deadline := time.Now().Add(c.Duration("timeout"))
	paceArgs := []string{"--pace-block", strconv.Itoa(block), "--pace-timeout", c.Duration("timeout").String()}

	ringSide, err := newPacedSide("ring-only", nodes, func(i int) string { return fmt.Sprintf("ring rank %d", i) })
	if err != nil {
		return err
	}
	defer ringSide.Close()
	daemonSide, err := newPacedSide("collectived", nodes, func(i int) string { return fmt.Sprintf("trainer of node %d", i) })
	if err != nil {
		return err
	}
	defer daemonSide.Close()

	ringDir, daemonDir := filepath.Join(dir, "ring"), filepath.Join(dir, "daemons")
	for _, d := range []string{ringDir, daemonDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
	}
	ports, err := localworld.FreePorts(2 * nodes)
	if err != nil {
		return err
	}
	results := filepath.Join(ringDir, "ring-results.json")
	rw, err := localworld.Start(localworld.Options{Bin: self, Dir: ringDir, Nodes: nodes, Local: 1, Ports: ports[:nodes],
		Job: "bench", TokenEnv: "COLLECTIVED_BENCH_TOKEN", Extra: c.String("extra-config"), Command: "bench-ring",
		Args: append([]string{"--sizes", c.String("sizes"), "--dtype", c.String("dtype"), "--op", c.String("op"),
			"--iters", strconv.Itoa(iters), "--warmup", strconv.Itoa(c.Int("warmup")), "--out", results}, paceArgs...),
		ExtraFiles: ringSide.childFiles})
	if err != nil {
		return err
	}
	defer rw.Stop()
	ringSide.detail = func(i int) string { return "its log ends:\n" + localworld.Tail(rw.Logs[i]) }

	dw, err := localworld.Start(localworld.Options{Bin: self, Dir: daemonDir, Nodes: nodes, Local: 1, Ports: ports[nodes:],
		Job: "bench", TokenEnv: "COLLECTIVED_BENCH_TOKEN", Extra: c.String("extra-config"), OpenWait: 20 * time.Second})
	if err != nil {
		return err
	}
	defer dw.Stop()
	trainers := make([]*benchTrainer, nodes)
	defer func() {
		for _, t := range trainers {
			if t != nil {
				t.cmd.Process.Kill()
				t.cmd.Wait()
			}
		}
	}()
	for n := range trainers {
		if trainers[n], err = startBenchTrainer(c, self, dw, n, 0, daemonSide.childFiles(n), paceArgs); err != nil {
			return err
		}
	}
	daemonSide.detail = func(i int) string {
		trainers[i].cmd.Process.Kill()
		trainers[i].cmd.Wait()
		return "its stderr: " + strings.TrimSpace(trainers[i].stderr.String())
	}
	ringSide.closeChildEnds()
	daemonSide.closeChildEnds()
	rows := trainers[0].rows(len(sizes))

	tty := isTerminal(os.Stderr)
	nblocks := (iters + block - 1) / block
	var daemonRes []sizeResult
	for si, size := range sizes {
		sides := [2]*pacedSide{daemonSide, ringSide}
		for b := -1; b < nblocks; b++ { // block -1: the checked call and warmup
			order := sides
			if b%2 != 0 {
				order[0], order[1] = sides[1], sides[0]
			}
			for _, s := range order {
				if err := s.step(deadline, size, b); err != nil {
					return exitf("bench --sidecar: %v", err)
				}
			}
			if tty {
				fmt.Fprintf(os.Stderr, "\r\033[K[%s] size %d/%d, block %d/%d", bar(si*nblocks+b+1, len(sizes)*nblocks, 30), si+1, len(sizes), b+1, nblocks)
			}
		}
		select {
		case r, ok := <-rows:
			if !ok {
				return exitf("bench --sidecar: the trainer of node 0 reported no result for %d bytes: %s", size, daemonSide.detail(0))
			}
			daemonRes = append(daemonRes, r)
		case <-time.After(time.Until(deadline)):
			return exitf("bench --sidecar: no result from the trainer of node 0 for %d bytes within --timeout %v", size, c.Duration("timeout"))
		}
	}
	if tty {
		fmt.Fprint(os.Stderr, "\r\033[K")
	}
	for i, t := range trainers {
		if err := t.cmd.Wait(); err != nil {
			return exitf("bench --sidecar: trainer of node %d: %v: %s", i, err, strings.TrimSpace(t.stderr.String()))
		}
		trainers[i] = nil
	}
	if err := rw.Wait(time.Until(deadline)); err != nil {
		return exitf("bench --sidecar: %v", err)
	}
	ringRes, err := readSizeResults(results)
	if err != nil || len(ringRes) != len(sizes) {
		return exitf("bench --sidecar: ring rank 0 reported %d of %d sizes (%v); its log:\n%s", len(ringRes), len(sizes), err, localworld.Tail(rw.Logs[0]))
	}

	p := newBenchPrinter(c, nodes, 1, "trainers, side by side with the ring engines alone")
	for i := range sizes {
		d, r := p.summarize(daemonRes[i]), p.summarize(ringRes[i])
		d.SidecarBlock, r.SidecarBlock = block, block
		d.BlockMediansUS, r.BlockMediansUS = blockMedians(daemonRes[i].TimesNS, block), blockMedians(ringRes[i].TimesNS, block)
		p.print(d)
		p.print(r)
		if !c.Bool("json") {
			fmt.Fprintf(c.App.Writer, "%12d sidecar overhead %+.1f%% (medians), %+.1f%% (median of the %d block pairs' own)\n",
				d.Bytes, (d.MedianUS/r.MedianUS-1)*100, (pairedRatio(d.BlockMediansUS, r.BlockMediansUS)-1)*100, len(d.BlockMediansUS))
		}
	}
	if !c.Bool("json") {
		fmt.Fprintf(c.App.Writer, "all %d sizes verified on all %d trainers and all %d ring ranks\n", len(sizes), nodes, nodes)
	}
	return nil
}

// pacedSide is the parent's end of one world's pacing sockets.
type pacedSide struct {
	name   string
	who    func(i int) string // names process i
	detail func(i int) string // what process i left behind (log, stderr), once started
	conns  []net.Conn
	kids   []*os.File // the processes' ends, until they are started
	b      [1]byte
}

func newPacedSide(name string, n int, who func(int) string) (*pacedSide, error) {
	s := &pacedSide{name: name, who: who, detail: func(int) string { return "" }}
	for i := 0; i < n; i++ {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("bench --sidecar: pacing socketpair: %w", err)
		}
		mine := os.NewFile(uintptr(fds[0]), "pace")
		c, err := net.FileConn(mine)
		mine.Close()
		if err != nil {
			unix.Close(fds[1])
			s.Close()
			return nil, fmt.Errorf("bench --sidecar: pacing socket: %w", err)
		}
		s.conns = append(s.conns, c)
		s.kids = append(s.kids, os.NewFile(uintptr(fds[1]), "pace"))
	}
	return s, nil
}

// childFiles is process i's ExtraFiles: its pacing socket as fd 3.
func (s *pacedSide) childFiles(i int) []*os.File { return []*os.File{s.kids[i]} }

// closeChildEnds drops the parent's copies of the processes' ends, so that
// a process that dies reads as EOF on its socket.
func (s *pacedSide) closeChildEnds() {
	for _, f := range s.kids {
		f.Close()
	}
	s.kids = nil
}

// step lets every process of the side run one block (-1: the checked call
// and warmup) of size, and waits until all have said it is over.
func (s *pacedSide) step(deadline time.Time, size int64, block int) error {
	what := fmt.Sprintf("block %d", block+1)
	if block < 0 {
		what = "checked call and warmup"
	}
	fail := func(i int, err error) error {
		if errors.Is(err, io.EOF) {
			err = errors.New("it ended")
		}
		return fmt.Errorf("%s, %s, %d bytes, %s: %w; %s", s.name, s.who(i), size, what, err, s.detail(i))
	}
	for i, c := range s.conns {
		c.SetWriteDeadline(deadline)
		s.b[0] = paceGo
		if _, err := c.Write(s.b[:]); err != nil {
			return fail(i, err)
		}
	}
	for i, c := range s.conns {
		c.SetReadDeadline(deadline)
		if _, err := io.ReadFull(c, s.b[:]); err != nil {
			return fail(i, err)
		}
		if s.b[0] != paceDone {
			return fail(i, fmt.Errorf("sent %q on its pacing socket, want %q", s.b[0], paceDone))
		}
	}
	return nil
}

func (s *pacedSide) Close() {
	for _, c := range s.conns {
		c.Close()
	}
	s.closeChildEnds()
}

// blockMedians is the median of each block of times, in µs.
func blockMedians(times []int64, block int) []float64 {
	var out []float64
	for i := 0; i < len(times); i += block {
		out = append(out, medianNS(times[i:min(i+block, len(times))])/1e3)
	}
	return out
}

// pairedRatio is the median over blocks of a's block ÷ b's.
func pairedRatio(a, b []float64) float64 {
	var r []float64
	for i := range min(len(a), len(b)) {
		r = append(r, a[i]/b[i])
	}
	slices.Sort(r)
	if len(r) == 0 {
		return 0
	}
	if len(r)%2 == 0 {
		return (r[len(r)/2-1] + r[len(r)/2]) / 2
	}
	return r[len(r)/2]
}

// benchTrainer is one `bench-trainer` process.
type benchTrainer struct {
	cmd    *exec.Cmd
	out    io.ReadCloser
	stderr *bytes.Buffer
}

// startBenchTrainer starts the trainer of local rank l on node n of w;
// files become its fd 3 on, extra is appended to its arguments.
func startBenchTrainer(c *cli.Context, self string, w *localworld.World, n, l int, files []*os.File, extra []string) (*benchTrainer, error) {
	cmd := exec.Command(self, append([]string{"bench-trainer", "--socket", w.Sockets[n], "--job", w.Job, "--local-rank", strconv.Itoa(l),
		"--sizes", c.String("sizes"), "--dtype", c.String("dtype"), "--op", c.String("op"),
		"--iters", strconv.Itoa(c.Int("iters")), "--warmup", strconv.Itoa(c.Int("warmup")),
		"--spin", c.Duration("client-spin").String(), "--inline-max", strconv.Itoa(c.Int("client-inline-max")),
		"--no-lane=" + strconv.FormatBool(c.Bool("client-no-lane"))}, extra...)...)
	t := &benchTrainer{cmd: cmd, stderr: new(bytes.Buffer)}
	cmd.Stderr = t.stderr
	cmd.ExtraFiles = files
	cmd.SysProcAttr = &unix.SysProcAttr{Pdeathsig: unix.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start trainer: %w", err)
	}
	t.out = out
	return t, nil
}

// rows reads the results world rank 0 prints, one per size (n of them),
// until its stdout ends.
func (t *benchTrainer) rows(n int) <-chan sizeResult {
	ch := make(chan sizeResult, n)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(t.out)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			var r sizeResult
			if json.Unmarshal(sc.Bytes(), &r) != nil {
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
