package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	cvd "github.com/collectived/collectived/clients/go"
	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/config"
)

// bench --tensors FILE: a training step's gradients (issue 27). Each
// timed iteration is one step: every trainer starts an allreduce of every
// tensor of FILE (bench/resnet50_shapes.txt: ResNet-50's 161), all in
// flight at once, then waits for all of them. With --named they are named
// calls (Desc.Named, the tensor's name), each trainer making them in an
// order of its own, a fresh permutation every step; without, ordered
// calls in the file's order on every trainer (each with the tensor's
// name, which ordered calls are matched on too). --concat adds one
// allreduce of all the tensors' bytes concatenated, step by step in turn
// with the tensors' calls in the same world: what fusion is measured
// against. The tensors lie back to back in one segment of shared memory,
// each at a 64-byte boundary (zero copy, small ones too); the
// concatenation in another.

var stepFlags = []cli.Flag{
	&cli.StringFlag{Name: "tensors", Usage: "a file of named tensors, \"name shape\" a line (bench/resnet50_shapes.txt): each timed iteration is a step that allreduces every one of them, all in flight at once, then waits for all (--sizes does not apply)"},
	&cli.BoolFlag{Name: "named", Usage: "with --tensors: named calls (protocol version 4), each trainer in its own order (--order)"},
	&cli.StringFlag{Name: "order", Usage: "with --tensors: the order each trainer calls the tensors in, file or random (a fresh permutation every step, seeded by --seed and the world rank; named calls only); default random with --named, else file"},
	&cli.BoolFlag{Name: "concat", Usage: "with --tensors: also time one allreduce of all the tensors' bytes concatenated, step by step in turn with the tensors' calls (two rows)"},
	&cli.Uint64Flag{Name: "seed", Value: 1, Usage: "with --order random: the seed of every trainer's permutations (each trainer's own stream, by world rank)"},
}

// stepTensor is one tensor of a --tensors file.
type stepTensor struct {
	name  string
	shape []uint64
	count uint64
}

// step is a bench --tensors workload.
type step struct {
	file    string // as given
	tensors []stepTensor
	named   bool
	random  bool // each trainer its own fresh permutation every step
	concat  bool
	seed    uint64
}

// elems is the elements of all the tensors.
func (s *step) elems() uint64 {
	var n uint64
	for _, t := range s.tensors {
		n += t.count
	}
	return n
}

func (s *step) order() string {
	if s.random {
		return "random"
	}
	return "file"
}

// what says what the tensors' calls are, for the table.
func (s *step) what() string {
	kind := "ordered"
	if s.named {
		kind = "named"
	}
	return fmt.Sprintf("%d %s calls, %s order", len(s.tensors), kind, s.order())
}

// parseStep reads the --tensors flags: nil without --tensors, whose
// companions are then refused.
func parseStep(c *cli.Context) (*step, error) {
	file := c.String("tensors")
	if file == "" {
		for _, f := range []string{"named", "order", "concat", "seed"} {
			if c.IsSet(f) {
				return nil, fmt.Errorf("--%s goes with --tensors", f)
			}
		}
		return nil, nil
	}
	ts, err := readTensors(file)
	if err != nil {
		return nil, fmt.Errorf("--tensors: %w", err)
	}
	s := &step{file: file, tensors: ts, named: c.Bool("named"), concat: c.Bool("concat"), seed: c.Uint64("seed")}
	switch o := c.String("order"); o {
	case "":
		s.random = s.named
	case "file":
	case "random":
		if !s.named {
			return nil, errors.New("--order random needs --named: ordered calls match by their place in each trainer's sequence, so every trainer must make them in one order")
		}
		s.random = true
	default:
		return nil, fmt.Errorf("--order %q: want file or random", o)
	}
	if c.IsSet("seed") && !s.random {
		return nil, errors.New("--seed goes with --order random")
	}
	return s, nil
}

// args passes s on to a bench-trainer.
func (s *step) args() []string {
	f, err := filepath.Abs(s.file)
	if err != nil {
		f = s.file
	}
	a := []string{"--tensors", f, "--named=" + strconv.FormatBool(s.named), "--order", s.order(), "--concat=" + strconv.FormatBool(s.concat)}
	if s.random {
		a = append(a, "--seed", strconv.FormatUint(s.seed, 10))
	}
	return a
}

// readTensors reads a --tensors file.
func readTensors(path string) ([]stepTensor, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseTensors(f, path)
}

// parseTensors reads "name shape" lines (shape: dimensions joined by x),
// skipping blank ones and "#" comments, as bench/tensors.py does: unique
// names of at most collective.MaxNameLen bytes, 1 to collective.MaxDims
// dimensions of at least 1, at least one tensor.
func parseTensors(r io.Reader, where string) ([]stepTensor, error) {
	var out []stepTensor
	seen := map[string]int{}
	sc := bufio.NewScanner(r)
	for ln := 1; sc.Scan(); ln++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("%s:%d: want \"name shape\", got %.100q", where, ln, line)
		}
		name, dims := f[0], strings.Split(f[1], "x")
		if len(name) > collective.MaxNameLen {
			return nil, fmt.Errorf("%s:%d: name %.40q... is %d bytes, at most %d", where, ln, name, len(name), collective.MaxNameLen)
		}
		if first, ok := seen[name]; ok {
			return nil, fmt.Errorf("%s:%d: %s again (first on line %d): names are unique", where, ln, name, first)
		}
		seen[name] = ln
		if len(dims) > collective.MaxDims {
			return nil, fmt.Errorf("%s:%d: %s: shape %q: want 1 to %d dimensions of at least 1", where, ln, name, f[1], collective.MaxDims)
		}
		t := stepTensor{name: name, count: 1}
		for _, d := range dims {
			v, err := strconv.ParseUint(d, 10, 64)
			if err != nil || v < 1 || v > 1<<32 {
				return nil, fmt.Errorf("%s:%d: %s: shape %q: want 1 to %d dimensions of at least 1 (and at most 2^32)", where, ln, name, f[1], collective.MaxDims)
			}
			t.shape = append(t.shape, v)
			t.count *= v
			if t.count > 1<<32 {
				return nil, fmt.Errorf("%s:%d: %s: shape %q has more than 2^32 elements", where, ln, name, f[1])
			}
		}
		out = append(out, t)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no tensors", where)
	}
	return out, nil
}

// checkStep refuses, for bench --tensors, what does not go with a step.
func checkStep(c *cli.Context, w workload) error {
	if c.IsSet("sizes") {
		return errors.New("--sizes and --tensors: a step's sizes are its tensors'; give one")
	}
	if w.coll != collective.OpAllReduce {
		return fmt.Errorf("--op %s and --tensors: a step is allreduces", c.String("op"))
	}
	for _, f := range []string{"alternate-dtype", "between", "trainer-cmd", "ring-only", "sidecar"} {
		if c.IsSet(f) {
			return fmt.Errorf("--%s and --tensors: a step is measured alone, by the Go bench-trainer", f)
		}
	}
	if c.IsSet("in-flight") {
		return errors.New("--in-flight and --tensors: a step's calls are all in flight at once already")
	}
	return nil
}

var limitsSection = regexp.MustCompile(`(?m)^limits:`)

// stepConfig is --extra-config for a step of calls calls in flight: the
// daemon's limits.max_in_flight raised above them when the default is
// too low (a trainer waiting, in the middle of its step, for a call
// another trainer makes last in its own order would never get there),
// unless --extra-config sets it, or sets other limits (then refused:
// two limits sections are no YAML).
func stepConfig(extra string, calls int) (string, error) {
	if calls <= config.DefaultMaxInFlight || strings.Contains(extra, "max_in_flight") {
		return extra, nil
	}
	// Room beyond the step: an answer the daemon has queued still
	// counts until written.
	n := calls + config.DefaultMaxInFlight
	if limitsSection.MatchString(extra) {
		return "", fmt.Errorf("--extra-config has a limits section without max_in_flight: add max_in_flight: %d to it (a step of --tensors has %d calls in flight; the default limit is %d)", n, calls, config.DefaultMaxInFlight)
	}
	if extra != "" && !strings.HasSuffix(extra, "\n") {
		extra += "\n"
	}
	return extra + fmt.Sprintf("limits:\n  max_in_flight: %d\n", n), nil
}

// stepRows is the rows a step reports: the tensors', and with --concat
// the concatenation's.
func (s *step) rows() int {
	if s.concat {
		return 2
	}
	return 1
}

// runStepTrainer measures a step on a bench trainer: world rank 0
// prints a sizeResult per row.
func runStepTrainer(c *cli.Context, cl *cvd.Client, w workload, s *step, prewarm func() error, enc interface{ Encode(any) error }) error {
	es := uint64(w.dt.Size())
	var stride uint64
	offs := make([]uint64, len(s.tensors))
	for i, t := range s.tensors {
		offs[i] = stride
		stride += uint64(align64(int(t.count * es)))
	}
	seg, err := cl.Alloc(int(stride))
	if err != nil {
		return fmt.Errorf("the tensors' segment of %d bytes: %w", stride, err)
	}
	defer seg.Free()
	mem := seg.Bytes()
	slots := make([]slot, len(s.tensors))
	descs := make([]collective.Desc, len(s.tensors))
	names := make([]string, len(s.tensors))
	for i, t := range s.tensors {
		n := t.count * es
		slots[i] = slot{in: mem[offs[i] : offs[i]+n : offs[i]+n]}
		descs[i] = w.desc(t.count)
		descs[i].Name, descs[i].Named = t.name, s.named
		names[i] = t.name
	}
	chk := newCheck(w, cl.Rank(), cl.Size(), 0, slots)
	chk.slotNames = names
	rank := cl.Rank()
	m := measurement{iters: c.Int("iters"), warmup: c.Int("warmup"), prewarm: prewarm,
		chk: chk, call: stepCall(cl, descs, slots, newStepOrder(len(descs), s.random, s.seed, rank))}
	total := s.elems()
	res := []sizeResult{{Bytes: int64(total * es), Path: "shm", Lane: cl.HasLane(), Calls: len(s.tensors),
		Named: s.named, Order: s.order(), Tensors: filepath.Base(s.file)}}
	if s.concat {
		cseg, err := cl.Alloc(int(total * es))
		if err != nil {
			return fmt.Errorf("the concatenation's segment of %d bytes: %w", total*es, err)
		}
		defer cseg.Free()
		buf := cseg.Bytes()[: total*es : total*es]
		d := w.desc(total)
		k := newCheck(w, rank, cl.Size(), total, []slot{{in: buf}})
		k.slotNames = []string{"the concatenation"}
		m.alt = &side{chk: k, call: func() error { return cl.Do(d, buf) }}
		res = append(res, sizeResult{Bytes: int64(total * es), Path: "shm", Lane: cl.HasLane(), Calls: 1,
			Concat: true, Tensors: filepath.Base(s.file)})
	}
	times, err := m.runAll()
	if err != nil {
		return fmt.Errorf("world rank %d, a step of %s: %w", rank, s.what(), err)
	}
	if rank != 0 {
		return nil
	}
	res[0].DaemonNamed = daemonNamed(cl)
	for i := range res {
		res[i].TimesNS = times[i]
		if err := enc.Encode(res[i]); err != nil {
			return err
		}
	}
	return nil
}

// stepCall is one step: start a call of descs[i] on slots[i] for every
// tensor, in order's next order, then wait for all of them. A failure to
// start waits for those started before it returns; the first failures
// are reported by the tensor's name.
func stepCall(cl *cvd.Client, descs []collective.Desc, slots []slot, order *stepOrder) func() error {
	hs := make([]*cvd.Handle, len(descs))
	return func() error {
		seq := order.next()
		var errs []error
		started := 0
		for _, i := range seq {
			h, err := cl.Start(descs[i], slots[i].in)
			if err != nil {
				errs = append(errs, fmt.Errorf("start %s (call %d of %d): %w", descs[i].Name, started+1, len(seq), err))
				break
			}
			hs[started] = h
			started++
		}
		for k, h := range hs[:started] {
			if err := h.Wait(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", descs[seq[k]].Name, err))
			}
			hs[k] = nil
		}
		if n := len(errs); n > 3 {
			errs = append(errs[:3], fmt.Errorf("and %d more calls failed", n-3))
		}
		return errors.Join(errs...)
	}
}

// stepOrder is the order a trainer calls a step's tensors in: the file's
// every step, or with a generator a fresh permutation every step.
type stepOrder struct {
	seq []int
	rng *rand.Rand
}

// newStepOrder is the order of n tensors: the file's, or with random a
// generator of its own for world rank rank.
func newStepOrder(n int, random bool, seed uint64, rank int) *stepOrder {
	o := &stepOrder{seq: make([]int, n)}
	for i := range o.seq {
		o.seq[i] = i
	}
	if random {
		o.rng = rand.New(rand.NewPCG(seed, uint64(rank)))
	}
	return o
}

// next is the order of the next step (valid until the one after).
func (o *stepOrder) next() []int {
	if o.rng != nil {
		o.rng.Shuffle(len(o.seq), func(i, j int) { o.seq[i], o.seq[j] = o.seq[j], o.seq[i] })
	}
	return o.seq
}

// daemonNamed is the "named" object of the daemon's status (a daemon
// with named calls has one), without its pending calls; nil if there is
// none or the status cannot be had.
func daemonNamed(cl *cvd.Client) map[string]any {
	st, err := cl.Status()
	if err != nil {
		return nil
	}
	n, _ := st["named"].(map[string]any)
	delete(n, "pending")
	return n
}
