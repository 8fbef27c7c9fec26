package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/internal/localworld"
)

const defaultBenchSizes = "4,64,1024,4096,65536,262144,1048576,4194304,16777216,67108864,268435456"

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "start a world of daemons and trainers on this machine (loopback) and measure a collective (allreduce by default)",
		Flags: append([]cli.Flag{
			&cli.IntFlag{Name: "nodes", Value: 2, Usage: "daemons (ring ranks)"},
			&cli.IntFlag{Name: "local", Value: 1, Usage: "trainers per daemon"},
			&cli.StringFlag{Name: "sizes", Value: defaultBenchSizes, Usage: "comma-separated buffer sizes in bytes (units allowed: 64KiB, 1MiB); what a size is depends on --op"},
			&cli.StringFlag{Name: "dtype", Value: "float32", Usage: "element type: float32, float64, int32, int64, bytes (allgather and broadcast only), float16, bfloat16 (bf16), int8, uint8"},
			opFlag,
			reduceFlag,
			alternateFlag,
			&cli.IntFlag{Name: "iters", Value: 20, Usage: "timed iterations per size"},
			&cli.IntFlag{Name: "warmup", Value: 3, Usage: "untimed iterations per size"},
			&cli.IntFlag{Name: "prewarm", Value: defaultPrewarm, Usage: "untimed calls of one element (of the collective measured) before the first size: the first fraction of a second after the processes start runs slower (docs/TUNING.md, section 22)"},
			betweenFlag,
			inFlightFlag,
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object per size"},
			&cli.StringFlag{Name: "extra-config", Usage: "YAML appended to the generated config (e.g. ring tuning)"},
			&cli.DurationFlag{Name: "client-spin", Usage: "trainers' Options.Spin (0: the client's default; negative: never poll)"},
			&cli.BoolFlag{Name: "client-no-lane", Usage: "trainers' Options.NoLane: small calls keep to the socket instead of the connection's lane of shared memory"},
			&cli.IntFlag{Name: "client-inline-max", Usage: "trainers' Options.InlineMax: the largest buffer sent inline, larger ones up to the daemon's inline limit are copied through shared memory (0: the client's default; negative: none inline)"},
			&cli.StringFlag{Name: "trainer-cmd", Usage: "run each trainer as this command (split on spaces; bench-trainer's flags are appended, and world rank 0 prints its rows) instead of the Go bench-trainer: e.g. \".venv/bin/python bench/py_trainer.py\" for trainers written with the Python client; allreduce only"},
			&cli.BoolFlag{Name: "ring-only", Usage: "no daemons or trainers: each node's ring engine called in its own process, on the ring settings its daemon would use (the sidecar's baseline); allreduce only"},
			&cli.BoolFlag{Name: "sidecar", Usage: "the daemons' world and the ring engines alone (--ring-only) up together, taking turns a block of calls at a time, each size reported for both: the sidecar's own cost, both sides seeing the same machine; allreduce only"},
			&cli.IntFlag{Name: "sidecar-block", Value: 1, Usage: "with --sidecar: timed calls per block; each block starts with one untimed call, as the first after the other side's turn runs cold"},
			&cli.DurationFlag{Name: "timeout", Value: 30 * time.Minute, Usage: "how long the whole run may take"},
		}, stepFlags...),
		Action: runBench,
	}
}

// benchRow is one size's result, as printed with --json.
type benchRow struct {
	// Bytes is a call's size as --op has it: each trainer's buffer
	// (allreduce, reduce, broadcast), each trainer's block (allgather) or
	// the whole input (reduce_scatter). TotalBytes is the full vector,
	// from which algbw is reckoned (NCCL's size): world x Bytes for
	// allgather, else Bytes. RequestedBytes is the size asked for, when
	// Bytes differs (rounded to whole elements, and for reduce_scatter to
	// a multiple of the world size).
	Bytes          int64  `json:"bytes"`
	TotalBytes     int64  `json:"total_bytes"`
	RequestedBytes int64  `json:"requested_bytes,omitempty"`
	Nodes          int    `json:"nodes"`
	Local          int    `json:"local"`
	Collective     string `json:"collective"`
	DType          string `json:"dtype"`
	// Op is the reduce op (allreduce, reduce_scatter, reduce), as it
	// was before bench measured other collectives than allreduce; Root
	// the root of reduce and broadcast.
	Op       string  `json:"op,omitempty"`
	Root     *int    `json:"root,omitempty"`
	Path     string  `json:"path"`
	Lane     bool    `json:"lane"` // the trainers' connections have a lane (--client-no-lane unset)
	Iters    int     `json:"iters"`
	MedianUS float64 `json:"median_us"`
	P99US    float64 `json:"p99_us"`
	AlgBWGBs float64 `json:"algbw_GBps"`
	BusBWGBs float64 `json:"busbw_GBps"`
	Verified bool    `json:"verified"`
	// With --between: the size of the untimed call before each one timed.
	BetweenBytes int64 `json:"between_bytes,omitempty"`
	// With --in-flight above 1: the calls each timed iteration started at
	// once. median_us and p99_us are then the whole group's, and algbw
	// and busbw count all their bytes.
	InFlight int `json:"in_flight,omitempty"`
	// With --trainer-cmd: the command each trainer ran.
	TrainerCmd string `json:"trainer_cmd,omitempty"`
	// With --sidecar: the timed calls per block the two sides took turns
	// in, and each block's median, in the order run.
	SidecarBlock   int       `json:"sidecar_block,omitempty"`
	BlockMediansUS []float64 `json:"block_medians_us,omitempty"`
	// With --tensors: a timed iteration is a step of Calls calls (the
	// tensors', all in flight at once; bytes counts them all), Named or
	// not, in Order; or the one call of them all Concatenated.
	Calls   int    `json:"calls,omitempty"`
	Named   bool   `json:"named,omitempty"`
	Order   string `json:"order,omitempty"`
	Concat  bool   `json:"concat,omitempty"`
	Tensors string `json:"tensors,omitempty"`
	// DaemonNamed: node 0's status' "named" object after the run (its
	// negotiation rounds, fused ring ops, cache), pending calls left out.
	DaemonNamed map[string]any `json:"daemon_named,omitempty"`
}

func runBench(c *cli.Context) error {
	nodes, local := c.Int("nodes"), c.Int("local")
	if nodes < 1 || local < 1 || nodes*local > 64 {
		return exitf("bench: --nodes %d x --local %d: want at least 1 x 1 and at most 64 trainers", nodes, local)
	}
	sizes, wl, err := parseWorkload(c)
	if err != nil {
		return exitf("bench: %v", err)
	}
	if err := checkInFlight(c); err != nil {
		return exitf("bench: %v", err)
	}
	if d := c.Duration("timeout"); d <= 0 {
		return exitf("bench: --timeout %v: want more than 0", d)
	}
	st, err := parseStep(c)
	if err != nil {
		return exitf("bench: %v", err)
	}
	extra := c.String("extra-config")
	if st != nil {
		if err := checkStep(c, wl); err != nil {
			return exitf("bench: %v", err)
		}
		sizes = []int64{int64(st.elems()) * int64(wl.dt.Size())}
		if extra, err = stepConfig(extra, len(st.tensors)); err != nil {
			return exitf("bench: %v", err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "collectived-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if c.Bool("ring-only") || c.Bool("sidecar") {
		mode := "--ring-only"
		if c.Bool("sidecar") {
			mode = "--sidecar"
		}
		if c.String("trainer-cmd") != "" {
			return exitf("bench: --trainer-cmd and %s: %s runs no trainers of the daemons' world alone; give one", mode, mode)
		}
		if k := c.Int("in-flight"); k != 1 {
			return exitf("bench: --in-flight %d and %s: the ring engine alone takes one call at a time; --in-flight is for trainers", k, mode)
		}
		if wl.coll != collective.OpAllReduce {
			return exitf("bench: --op %s and %s: the ring engine alone measures allreduce only", c.String("op"), mode)
		}
		if wl.alt.Valid() {
			return exitf("bench: --alternate-dtype and %s: %s measures one dtype; give one", mode, mode)
		}
		if c.Bool("ring-only") && c.Bool("sidecar") {
			return exitf("bench: --ring-only and --sidecar: --sidecar runs the ring engines alone itself, next to the daemons; give one")
		}
		if local != 1 {
			return exitf("bench: %s runs one ring rank per node and no trainers beside it: --local is %d, want 1", mode, local)
		}
		if c.Bool("sidecar") {
			if b := c.Int("sidecar-block"); b < 1 {
				return exitf("bench: --sidecar-block %d: want at least 1", b)
			}
			return runBenchSidecar(c, self, dir, nodes, wl, sizes)
		}
		return runBenchRingOnly(c, self, dir, nodes, wl, sizes)
	}
	if cmd := strings.Fields(c.String("trainer-cmd")); len(cmd) > 0 {
		if wl.coll != collective.OpAllReduce {
			return exitf("bench: --op %s and --trainer-cmd: trainers of --trainer-cmd measure allreduce only", c.String("op"))
		}
		if wl.alt.Valid() {
			return exitf("bench: --alternate-dtype and --trainer-cmd: trainers of --trainer-cmd measure one dtype")
		}
		if _, err := exec.LookPath(cmd[0]); err != nil {
			return exitf("bench: --trainer-cmd %q: %v", c.String("trainer-cmd"), err)
		}
	} else if c.IsSet("trainer-cmd") {
		return exitf("bench: --trainer-cmd is empty: want a command, such as \".venv/bin/python bench/py_trainer.py\"")
	}
	noteRounded(c, wl, sizes, nodes*local)
	opts := daemonWorld(c, self, dir, nodes, local)
	opts.Extra = extra
	w, err := localworld.Start(opts)
	if err != nil {
		return err
	}
	defer w.Stop()
	var stepArgs []string
	if st != nil {
		stepArgs = st.args()
	}

	var trainers []*benchTrainer
	defer func() {
		for _, t := range trainers {
			t.kill() // reaps those that ended by themselves too
		}
	}()
	for n := 0; n < nodes; n++ {
		for l := 0; l < local; l++ {
			t, err := startBenchTrainer(c, self, w, n, l, nil, stepArgs)
			if err != nil {
				return err
			}
			trainers = append(trainers, t)
			if n > 0 || l > 0 {
				go io.Copy(io.Discard, t.out)
			}
		}
	}
	// Past --timeout every trainer is killed, which ends the reads below.
	var timedOut atomic.Bool
	limit := time.AfterFunc(c.Duration("timeout"), func() {
		timedOut.Store(true)
		for _, t := range trainers {
			t.cmd.Process.Kill()
		}
	})
	defer limit.Stop()

	tty := isTerminal(os.Stderr)
	p := newBenchPrinter(c, wl, sizes, nodes, local, "trainers")
	sc := bufio.NewScanner(trainers[0].out)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	perSize := 1 // rows per size
	if wl.alt.Valid() {
		perSize = 2
	}
	if st != nil {
		perSize = st.rows()
	}
	done, rows := 0, 0
	for sc.Scan() {
		var r sizeResult
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return fmt.Errorf("bench: trainer 0 printed %q: %w", sc.Text(), err)
		}
		rows++
		done = rows / perSize
		if tty {
			fmt.Fprint(os.Stderr, "\r\033[K")
		}
		if rows > perSize*len(sizes) {
			return exitf("bench: trainer 0 reported %d results, %d asked for", rows, perSize*len(sizes))
		}
		p.row(r, (rows-1)/perSize)
		if tty && done < len(sizes) {
			fmt.Fprintf(os.Stderr, "[%s] size %d/%d", bar(done, len(sizes), 30), done+1, len(sizes))
		}
	}
	// Trainer 0 has closed its stdout: it is exiting. The others end with
	// their last call (bounded by the client's timeout), or are killed at
	// --timeout.
	var failed []string
	for i, t := range trainers {
		<-t.done
		if t.err != nil {
			failed = append(failed, fmt.Sprintf("trainer %d: %v: %s", i, t.err, strings.TrimSpace(t.stderr.String())))
		}
	}
	if timedOut.Load() {
		return exitf("bench: not finished within --timeout %v: %d of %d sizes done", c.Duration("timeout"), done, len(sizes))
	}
	if len(failed) > 0 || done != len(sizes) {
		return exitf("bench failed after %d of %d sizes:\n%s\ndaemon 0 log:\n%s", done, len(sizes), strings.Join(failed, "\n"), localworld.Tail(w.Logs[0]))
	}
	if !c.Bool("json") {
		if st != nil {
			fmt.Fprintf(c.App.Writer, "every step verified on all %d trainers\n", nodes*local)
		} else {
			fmt.Fprintf(c.App.Writer, "all %d sizes verified on all %d trainers\n", len(sizes), nodes*local)
		}
	}
	return nil
}

// benchPrinter prints bench results as a table or as JSON lines.
type benchPrinter struct {
	c            *cli.Context
	w            workload
	sizes        []int64 // as asked for (--sizes)
	nodes, local int
	between      int64 // --between, checked by runBench
	step         *step // --tensors, checked by runBench; nil without
	enc          *json.Encoder
}

func newBenchPrinter(c *cli.Context, w workload, sizes []int64, nodes, local int, who string) *benchPrinter {
	out := c.App.Writer
	nb, _ := parseBetween(c)
	st, _ := parseStep(c)
	if st != nil && !c.Bool("json") {
		fmt.Fprintf(out, "collectived bench: %d nodes x %d %s (world %d) on loopback, %s, %d iterations\n",
			nodes, local, who, nodes*local, w, c.Int("iters"))
		also := ""
		if st.concat {
			also = "; and one allreduce of all of them concatenated, a step of each in turn"
		}
		fmt.Fprintf(out, "an iteration is a step: %s of the %d tensors of %s (%d bytes), all in flight at once, then waited for%s\n",
			st.what(), len(st.tensors), st.file, sizes[0], also)
		fmt.Fprintf(out, "%-36s %12s %12s %12s %12s %12s %9s\n", "calls", "bytes", "median_us", "p99_us", "algbw_GB/s", "busbw_GB/s", "verified")
	} else if !c.Bool("json") {
		between := ""
		if nb > 0 {
			between = fmt.Sprintf(", each after an untimed call of %d bytes", nb)
		}
		if tc := c.String("trainer-cmd"); tc != "" {
			who += fmt.Sprintf(" (%q)", tc)
		}
		if k := c.Int("in-flight"); k > 1 {
			between += fmt.Sprintf(", %d calls in flight at once per iteration (times are the group's)", k)
		}
		fmt.Fprintf(out, "collectived bench: %d nodes x %d %s (world %d) on loopback, %s, %d iterations per size%s\n",
			nodes, local, who, nodes*local, w, c.Int("iters"), between)
		fmt.Fprintf(out, "%s; busbw = algbw x %s (NCCL's convention)\n", w.sizesMean(), w.busRule())
		if w.alt.Valid() {
			fmt.Fprintf(out, "%12s %9s %7s %12s %12s %12s %12s %9s\n", "bytes", "dtype", "path", "median_us", "p99_us", "algbw_GB/s", "busbw_GB/s", "verified")
		} else {
			fmt.Fprintf(out, "%12s %7s %12s %12s %12s %12s %9s\n", "bytes", "path", "median_us", "p99_us", "algbw_GB/s", "busbw_GB/s", "verified")
		}
	}
	return &benchPrinter{c: c, w: w, sizes: sizes, nodes: nodes, local: local, between: nb, step: st, enc: json.NewEncoder(out)}
}

// row prints the result of the i-th size.
func (p *benchPrinter) row(r sizeResult, i int) { p.print(p.summarize(r, i)) }

func (p *benchPrinter) summarize(r sizeResult, i int) benchRow {
	w := p.w
	if r.DType != "" {
		if dt, err := collective.ParseDType(r.DType); err == nil {
			w.dt = dt
		}
	}
	row := summarize(r, p.nodes, p.local, w)
	if i < len(p.sizes) && p.sizes[i] != row.Bytes && w.dt == p.w.dt {
		row.RequestedBytes = p.sizes[i]
	}
	if k := p.c.Int("in-flight"); k > 1 {
		row.InFlight = k
		row.AlgBWGBs *= float64(k)
		row.BusBWGBs *= float64(k)
	}
	row.BetweenBytes = p.between
	row.TrainerCmd = p.c.String("trainer-cmd")
	row.Calls, row.Named, row.Order, row.Concat, row.Tensors = r.Calls, r.Named, r.Order, r.Concat, r.Tensors
	row.DaemonNamed = r.DaemonNamed
	return row
}

func (p *benchPrinter) print(row benchRow) {
	if p.c.Bool("json") {
		p.enc.Encode(row)
		return
	}
	if p.step != nil {
		what := p.step.what()
		if row.Concat {
			what = "1 call, all tensors concatenated"
		}
		fmt.Fprintf(p.c.App.Writer, "%-36s %12d %12.1f %12.1f %12.3f %12.3f %9v\n", what, row.Bytes, row.MedianUS, row.P99US, row.AlgBWGBs, row.BusBWGBs, row.Verified)
		return
	}
	if p.w.alt.Valid() {
		fmt.Fprintf(p.c.App.Writer, "%12d %9s %7s %12.1f %12.1f %12.3f %12.3f %9v\n", row.Bytes, row.DType, row.Path, row.MedianUS, row.P99US, row.AlgBWGBs, row.BusBWGBs, row.Verified)
		return
	}
	fmt.Fprintf(p.c.App.Writer, "%12d %7s %12.1f %12.1f %12.3f %12.3f %9v\n", row.Bytes, row.Path, row.MedianUS, row.P99US, row.AlgBWGBs, row.BusBWGBs, row.Verified)
}

// noteRounded says, on stderr, which sizes a call cannot have as asked:
// a reduce_scatter's input is a whole number of elements for every rank.
// (Any size is rounded to whole elements, as it always was, silently.)
func noteRounded(c *cli.Context, w workload, sizes []int64, world int) {
	if w.coll != collective.OpReduceScatter {
		return
	}
	es := int64(w.dt.Size())
	for _, s := range sizes {
		if got := int64(w.count(s, world)) * es; got != s {
			fmt.Fprintf(c.App.ErrWriter, "bench: reduce_scatter of %d bytes: %d bytes instead, a multiple of %d trainers x %d-byte elements (at least one each)\n", s, got, world, es)
		}
	}
}

// sizesMean says what the sizes of w are, for the table's header.
func (w workload) sizesMean() string {
	switch w.coll {
	case collective.OpAllGather:
		return "bytes: each trainer's block; the result is world x bytes, and algbw = world x bytes / median time"
	case collective.OpReduceScatter:
		return "bytes: the whole input of each trainer; each gets bytes / world of the result; algbw = bytes / median time"
	}
	return "bytes: each trainer's buffer; algbw = bytes / median time"
}

// busRule is busFactor as a formula.
func (w workload) busRule() string {
	switch w.coll {
	case collective.OpAllReduce:
		return "2(W-1)/W"
	case collective.OpAllGather, collective.OpReduceScatter:
		return "(W-1)/W"
	}
	return "1"
}

// runBenchRingOnly runs the sizes on each node's ring engine alone, one
// process per node (bench-ring), and prints what ring rank 0 measured.
func runBenchRingOnly(c *cli.Context, self, dir string, nodes int, wl workload, sizes []int64) error {
	nsizes := len(sizes)
	results := filepath.Join(dir, "ring-results.json")
	w, err := localworld.Start(ringWorld(c, self, dir, nodes, results))
	if err != nil {
		return err
	}
	defer w.Stop()
	p := newBenchPrinter(c, wl, sizes, nodes, 1, "ring engines, no daemon")
	if err := w.Wait(c.Duration("timeout")); err != nil {
		return exitf("bench --ring-only: %v", err)
	}
	rs, err := readSizeResults(results)
	if err != nil {
		return exitf("bench --ring-only: results of ring rank 0: %v", err)
	}
	for i, r := range rs {
		p.row(r, i)
	}
	if len(rs) != nsizes {
		return exitf("bench --ring-only: ring rank 0 reported %d of %d sizes; its log:\n%s", len(rs), nsizes, localworld.Tail(w.Logs[0]))
	}
	if !c.Bool("json") {
		fmt.Fprintf(c.App.Writer, "all %d sizes verified on all %d ring ranks\n", nsizes, nodes)
	}
	return nil
}

// daemonWorld is the world of daemons every bench mode with trainers
// starts: nodes daemons for local trainers each.
func daemonWorld(c *cli.Context, self, dir string, nodes, local int) localworld.Options {
	return localworld.Options{Bin: self, Dir: dir, Nodes: nodes, Local: local,
		Job: "bench", TokenEnv: "COLLECTIVED_BENCH_TOKEN", Extra: c.String("extra-config"), OpenWait: 20 * time.Second}
}

// ringWorld is the world of ring engines alone (bench-ring, one per
// node) on the same config, ring rank 0 writing its results to results.
func ringWorld(c *cli.Context, self, dir string, nodes int, results string) localworld.Options {
	o := daemonWorld(c, self, dir, nodes, 1)
	o.Command = "bench-ring"
	o.Args = append(workloadArgs(c), "--out", results)
	return o
}

// workloadArgs passes bench's workload flags on to a bench-trainer or
// bench-ring process.
func workloadArgs(c *cli.Context) []string {
	w, _ := parseBenchWorkload(c) // checked by runBench
	return append([]string{"--sizes", c.String("sizes"),
		"--iters", strconv.Itoa(c.Int("iters")), "--warmup", strconv.Itoa(c.Int("warmup")),
		"--prewarm", strconv.Itoa(c.Int("prewarm")), "--between", c.String("between")}, w.args()...)
}

// summarize is one size's row: median, p99 and bandwidths of its times,
// algbw over the full vector and busbw by NCCL's conventions.
func summarize(r sizeResult, nodes, local int, w workload) benchRow {
	world := nodes * local
	ts := slices.Clone(r.TimesNS)
	slices.Sort(ts)
	med := medianSorted(ts)
	p99 := float64(ts[min(len(ts)-1, int(float64(len(ts))*0.99))])
	total := r.Bytes
	if w.coll == collective.OpAllGather {
		total *= int64(world)
	}
	alg := float64(total) / med // bytes per ns = GB/s
	row := benchRow{Bytes: r.Bytes, TotalBytes: total, Nodes: nodes, Local: local, Collective: w.coll.String(), DType: w.dt.String(),
		Path: r.Path, Lane: r.Lane, Iters: len(ts),
		MedianUS: med / 1e3, P99US: p99 / 1e3, AlgBWGBs: alg, BusBWGBs: alg * w.busFactor(world), Verified: true}
	if w.coll.Reduces() {
		row.Op = w.op.String()
	}
	if w.coll.Rooted() {
		root := benchRoot
		row.Root = &root
	}
	return row
}

// medianNS is the median of times (in ns, any order).
func medianNS(times []int64) float64 {
	ts := slices.Clone(times)
	slices.Sort(ts)
	return medianSorted(ts)
}

func medianSorted(ts []int64) float64 {
	if len(ts)%2 == 0 {
		return float64(ts[len(ts)/2-1]+ts[len(ts)/2]) / 2
	}
	return float64(ts[len(ts)/2])
}

func bar(done, total, width int) string {
	n := done * width / total
	return strings.Repeat("#", n) + strings.Repeat(".", width-n)
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// parseSizes reads "4,64KiB,1MiB" into bytes.
func parseSizes(s string) ([]int64, error) {
	var out []int64
	for _, f := range strings.Split(s, ",") {
		v, err := parseSize("--sizes", f)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// parseSize reads one size of flag: bytes, or with a unit (KiB, MiB, GiB).
func parseSize(flag, f string) (int64, error) {
	f = strings.TrimSpace(f)
	mult := int64(1)
	for _, u := range []struct {
		suf string
		m   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}} {
		if strings.HasSuffix(f, u.suf) {
			f, mult = strings.TrimSuffix(f, u.suf), u.m
			break
		}
	}
	v, err := strconv.ParseInt(f, 10, 64)
	if err != nil || v < 0 || v*mult > 4<<30 {
		return 0, fmt.Errorf("%s: %q is not a size between 0 and 4GiB", flag, f)
	}
	return v * mult, nil
}
