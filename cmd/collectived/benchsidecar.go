package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/collectived/collectived/internal/localworld"
)

// endGrace is how long a paced process that closed its pacing socket is
// given to exit, so that the failure report has its reason.
const endGrace = 5 * time.Second

// othersGrace is how long a failure report waits for the daemons' exits
// to be known, all daemons together.
const othersGrace = time.Second

// runBenchSidecar is `collectived bench --sidecar`: the daemons' world
// (one trainer per node) and the ring engines' world (what --ring-only
// runs) up at the same time, paced (pace.go) so that they take turns a
// block of calls at a time, the first of each pair of blocks alternating
// (turnOrder). Each side's figures are then taken over the same stretch of
// time, and each block of one side has a neighbour of the other to be set
// against.
func runBenchSidecar(c *cli.Context, self, dir string, nodes int, wl workload, sizes []int64) error {
	block, iters := c.Int("sidecar-block"), c.Int("iters")
	deadline := time.Now().Add(c.Duration("timeout"))
	paceArgs := []string{"--pace-block", strconv.Itoa(block), "--pace-timeout", c.Duration("timeout").String()}

	ringSide, err := newPacedSide("ring-only", nodes, func(i int) string { return fmt.Sprintf("ring rank %d", i) })
	if err != nil {
		return err
	}
	defer ringSide.Close()
	daemonSide, err := newPacedSide("collectived", nodes, func(i int) string { return fmt.Sprintf("the trainer of node %d", i) })
	if err != nil {
		return err
	}
	defer daemonSide.Close()

	ringDir, daemonDir := filepath.Join(dir, "ring"), filepath.Join(dir, "daemons")
	for _, d := range []string{ringDir, daemonDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return fmt.Errorf("bench --sidecar: %w", err)
		}
	}
	// One call for both worlds' ports: two calls could hand the second
	// world a port the first has not bound yet.
	ports, err := localworld.FreePorts(2 * nodes)
	if err != nil {
		return fmt.Errorf("bench --sidecar: ring ports: %w", err)
	}
	results := filepath.Join(ringDir, "ring-results.json")
	ro := ringWorld(c, self, ringDir, nodes, results)
	ro.Ports, ro.Args, ro.ExtraFiles = ports[:nodes], append(ro.Args, paceArgs...), ringSide.childFiles
	rw, err := localworld.Start(ro)
	if err != nil {
		return err
	}
	defer rw.Stop()
	ringSide.state = func(i int, grace time.Duration) (bool, string) {
		exited, err := rw.Exit(i, grace)
		status := "still running"
		if exited {
			status = exitStatus(err)
		}
		return exited, fmt.Sprintf("%s; its log ends:\n%s", status, localworld.Tail(rw.Logs[i]))
	}

	do := daemonWorld(c, self, daemonDir, nodes, 1)
	do.Ports = ports[nodes:]
	dw, err := localworld.Start(do)
	if err != nil {
		return err
	}
	defer dw.Stop()
	trainers := make([]*benchTrainer, nodes)
	defer func() {
		for _, t := range trainers {
			if t != nil {
				t.kill()
			}
		}
	}()
	for n := range trainers {
		if trainers[n], err = startBenchTrainer(c, self, dw, n, 0, daemonSide.childFiles(n), paceArgs); err != nil {
			return fmt.Errorf("bench --sidecar: %w", err)
		}
	}
	daemonSide.state = func(i int, grace time.Duration) (bool, string) { return trainers[i].ended(grace) }
	daemonSide.others = func() (out []string) {
		// A daemon that died is seen by its trainer (its socket closes)
		// a moment before the daemon is reaped: let the exits land.
		until := time.Now().Add(othersGrace)
		for r := range nodes {
			if exited, err := dw.Exit(r, time.Until(until)); exited {
				out = append(out, fmt.Sprintf("daemon %d (pid %d) exited: %s; its log ends:\n%s", r, dw.PID(r), exitStatus(err), localworld.Tail(dw.Logs[r])))
			}
		}
		return out
	}
	ringSide.closeChildEnds()
	daemonSide.closeChildEnds()
	rows := trainers[0].rows(len(sizes))

	tty := isTerminal(os.Stderr)
	nblocks := (iters + block - 1) / block
	sides := [2]*pacedSide{daemonSide, ringSide}
	var daemonRes []sizeResult
	for si, size := range sizes {
		for b := -1; b < nblocks; b++ { // block -1: the checked call and warmup
			for _, k := range turnOrder(b) {
				if err := sides[k].step(deadline, size, b); err != nil {
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
				_, how := trainers[0].ended(endGrace)
				if trainers[0].bad != "" {
					how = "it printed " + trainers[0].bad + "; " + how
				}
				return exitf("bench --sidecar: the trainer of node 0 reported no result for %d bytes: %s", size, how)
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
		if err := t.wait(max(time.Until(deadline), endGrace)); err != nil {
			return exitf("bench --sidecar: the trainer of node %d: %v: %s", i, err, strings.TrimSpace(t.stderr.String()))
		}
		t.out.Close()
		trainers[i] = nil
	}
	if err := rw.Wait(time.Until(deadline)); err != nil {
		return exitf("bench --sidecar: %v", err)
	}
	ringRes, err := readSizeResults(results)
	if err != nil || len(ringRes) != len(sizes) {
		return exitf("bench --sidecar: ring rank 0 reported %d of %d sizes (%v); its log:\n%s", len(ringRes), len(sizes), err, localworld.Tail(rw.Logs[0]))
	}

	p := newBenchPrinter(c, wl, sizes, nodes, 1, "trainers, side by side with the ring engines alone")
	for i := range sizes {
		d, r := p.summarize(daemonRes[i], i), p.summarize(ringRes[i], i)
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

// turnOrder is which side (0: the daemons, 1: the ring engines) takes
// block b's turn first: the ring engines for the warmup (b = -1), then
// the daemons and the ring engines in turn, so that neither always runs
// right after the other.
func turnOrder(b int) [2]int {
	if b%2 != 0 {
		return [2]int{1, 0}
	}
	return [2]int{0, 1}
}

// pacedSide is the parent's end of one world's pacing sockets.
type pacedSide struct {
	name string
	who  func(i int) string // names process i
	// state reports whether process i has ended, waiting up to grace for
	// it, and what it left behind (exit status, stderr or log).
	state func(i int, grace time.Duration) (ended bool, how string)
	// others lists the side's helpers that have ended (the daemons).
	others func() []string
	conns  []net.Conn
	kids   []*os.File // the processes' ends, until they are started
	b      [1]byte
}

func newPacedSide(name string, n int, who func(int) string) (*pacedSide, error) {
	s := &pacedSide{name: name, who: who,
		state: func(int, time.Duration) (bool, string) { return false, "" }, others: func() []string { return nil }}
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
	for i, c := range s.conns {
		c.SetWriteDeadline(deadline)
		s.b[0] = paceGo
		if _, err := c.Write(s.b[:]); err != nil {
			return s.fail(i, size, what, err)
		}
	}
	for i, c := range s.conns {
		c.SetReadDeadline(deadline)
		if _, err := io.ReadFull(c, s.b[:]); err != nil {
			return s.fail(i, size, what, err)
		}
		if s.b[0] != paceDone {
			return s.fail(i, size, what, fmt.Errorf("sent %q on its pacing socket, want %q", s.b[0], paceDone))
		}
	}
	return nil
}

// fail is the error of a step that process i failed: what it said or how
// it ended, and every other process of the side that has ended too (the
// one that failed first may not be the first found).
func (s *pacedSide) fail(i int, size int64, what string, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, unix.EPIPE) || errors.Is(err, unix.ECONNRESET) {
		err = errors.New("it closed its pacing socket")
	}
	_, how := s.state(i, endGrace)
	var also strings.Builder
	for j := range s.conns {
		if ended, h := s.state(j, 0); j != i && ended {
			fmt.Fprintf(&also, "\n%s has ended too: %s", s.who(j), h)
		}
	}
	for _, o := range s.others() {
		also.WriteString("\n" + o)
	}
	return fmt.Errorf("%s, %s, %d bytes, %s: %w; %s%s", s.name, s.who(i), size, what, err, how, also.String())
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

// pairedRatio is the median over blocks of a's block ÷ b's (0 if there
// are none).
func pairedRatio(a, b []float64) float64 {
	var r []float64
	for i := range min(len(a), len(b)) {
		r = append(r, a[i]/b[i])
	}
	slices.Sort(r)
	switch {
	case len(r) == 0:
		return 0
	case len(r)%2 == 0:
		return (r[len(r)/2-1] + r[len(r)/2]) / 2
	}
	return r[len(r)/2]
}
