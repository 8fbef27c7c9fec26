package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/urfave/cli/v2"

	cvd "github.com/collectived/collectived/clients/go"
)

// sizeResult is what world rank 0 of `bench-trainer` reports per size.
type sizeResult struct {
	Bytes   int64   `json:"bytes"`
	TimesNS []int64 `json:"times_ns"`
	Path    string  `json:"path"` // inline, copied (through the client's scratch segment) or shm
	Lane    bool    `json:"lane"` // the trainer's connection has a lane (Client.HasLane)
	// DType is the element type measured, with bench --alternate-dtype
	// (two results per size); empty otherwise (the workload's).
	DType string `json:"dtype,omitempty"`
	// With bench --tensors: the calls of a step (a timed iteration), and
	// what they were: named or not, in which order (file, random), or the
	// one call of the tensors concatenated; the file's base name.
	Calls   int    `json:"calls,omitempty"`
	Named   bool   `json:"named,omitempty"`
	Order   string `json:"order,omitempty"`
	Concat  bool   `json:"concat,omitempty"`
	Tensors string `json:"tensors,omitempty"`
	// DaemonNamed is, on the step's row, the "named" object of its
	// daemon's status after the run (its counters), when it has one.
	DaemonNamed map[string]any `json:"daemon_named,omitempty"`
}

// benchTrainerCommand is one trainer of `collectived bench`: a hidden
// subcommand so that trainers are real processes of their own.
func benchTrainerCommand() *cli.Command {
	return &cli.Command{
		Name:   "bench-trainer",
		Hidden: true,
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "socket", Required: true},
			&cli.StringFlag{Name: "job", Required: true},
			&cli.StringFlag{Name: "sizes", Required: true},
			&cli.StringFlag{Name: "dtype", Value: "float32"},
			opFlag,
			reduceFlag,
			alternateFlag,
			&cli.IntFlag{Name: "iters", Value: 20},
			&cli.IntFlag{Name: "warmup", Value: 3},
			&cli.IntFlag{Name: "prewarm"},
			betweenFlag,
			inFlightFlag,
			&cli.IntFlag{Name: "local-rank", Value: -1},
			&cli.DurationFlag{Name: "spin"},
			&cli.IntFlag{Name: "inline-max"},
			&cli.BoolFlag{Name: "no-lane"},
		}, slices.Concat(paceFlags, stepFlags)...),
		Action: func(c *cli.Context) error {
			sizes, w, err := parseWorkload(c)
			if err != nil {
				return err
			}
			if err := checkInFlight(c); err != nil {
				return err
			}
			pace, err := pacerFromFlags(c)
			if err != nil {
				return err
			}
			// The pacing socket is left to the exit to close: closed now, the
			// parent would read its end before main has printed why we failed.
			cl, err := cvd.Dial(cvd.Options{Socket: c.String("socket"), Job: c.String("job"), LocalRank: c.Int("local-rank"), Label: "bench-trainer", Spin: c.Duration("spin"), InlineMax: c.Int("inline-max"), NoLane: c.Bool("no-lane")})
			if err != nil {
				return err
			}
			defer cl.Close()
			between, err := trainerBetween(c, cl, w)
			if err != nil {
				return err
			}
			defer between.free()
			// The prewarm's calls are the smallest of the collective
			// measured, on zeros: one element (one per rank for
			// reduce_scatter).
			one, err := newTrainerBufs(cl, w, w.count(0, cl.Size()), 1)
			if err != nil {
				return err
			}
			defer one.free()
			enc := json.NewEncoder(os.Stdout)
			prewarm := prewarmer(c.Int("prewarm"), one.call)
			st, err := parseStep(c)
			if err != nil {
				return err
			}
			if st != nil {
				return runStepTrainer(c, cl, w, st, prewarm, enc)
			}
			tb := trainerBench{cl: cl, w: w, inFlight: c.Int("in-flight"), iters: c.Int("iters"),
				warmup: c.Int("warmup"), pace: pace, between: between.call}
			for i, size := range sizes {
				res, err := tb.size(size, firstOnly(i, prewarm))
				if err != nil {
					return fmt.Errorf("world rank %d, size %d: %w", cl.Rank(), size, err)
				}
				if cl.Rank() == 0 {
					for _, r := range res {
						if err := enc.Encode(r); err != nil {
							return err
						}
					}
				}
			}
			return nil
		},
	}
}

// parseWorkload reads what every bench command measures: --sizes,
// --dtype, --op and --reduce, and the counts of calls.
func parseWorkload(c *cli.Context) (sizes []int64, w workload, err error) {
	if sizes, err = parseSizes(c.String("sizes")); err != nil {
		return
	}
	if n := c.Int("iters"); n < 1 {
		err = fmt.Errorf("--iters %d: want at least 1", n)
		return
	}
	for _, name := range []string{"warmup", "prewarm"} {
		if n := c.Int(name); n < 0 {
			err = fmt.Errorf("--%s %d: want 0 or more", name, n)
			return
		}
	}
	if _, err = parseBetween(c); err != nil {
		return
	}
	w, err = parseBenchWorkload(c)
	return
}

// trainerBench is what a bench trainer measures at every size: iters
// timed calls (after warmup untimed ones) of w, inFlight at once (bench
// --in-flight), paced by pace (bench --sidecar) and each after between
// (bench --between) when they are not nil.
type trainerBench struct {
	cl                      *cvd.Client
	w                       workload
	inFlight, iters, warmup int
	pace                    *pacer
	between                 func() error
}

// size measures one size, on inFlight sets of buffers of it; prewarm, if
// not nil, runs first. With an alternate dtype (bench --alternate-dtype)
// it measures both at the same element count, call by call in turn, and
// returns a result for each, the alternate's second.
func (tb trainerBench) size(size int64, prewarm func() error) ([]sizeResult, error) {
	cl, w := tb.cl, tb.w
	count := w.count(size, cl.Size())
	ws := []workload{w}
	if w.alt.Valid() {
		ws = append(ws, workload{coll: w.coll, dt: w.alt, op: w.op})
	}
	var res []sizeResult
	var sides []side
	for _, x := range ws {
		bufs, err := newTrainerBufs(cl, x, count, tb.inFlight)
		if err != nil {
			return nil, err
		}
		defer bufs.free()
		r := sizeResult{Bytes: int64(count) * int64(x.dt.Size()), Path: bufs.path, Lane: cl.HasLane()}
		if len(ws) > 1 {
			r.DType = x.dt.String()
		}
		res = append(res, r)
		sides = append(sides, side{chk: newCheck(x, cl.Rank(), cl.Size(), count, bufs.slots), call: bufs.call})
	}
	m := measurement{iters: tb.iters, warmup: tb.warmup, pace: tb.pace, prewarm: prewarm, between: tb.between,
		chk: sides[0].chk, call: sides[0].call}
	if len(sides) > 1 {
		m.alt = &sides[1]
	}
	times, err := m.runAll()
	for i := range times {
		res[i].TimesNS = times[i]
	}
	return res, err
}

// side is what one kind of call of a measurement is: its buffers' known
// values (chk) and the call itself.
type side struct {
	chk  *check
	call func() error
}

// measurement is one size of a bench command: call runs one call on each
// of chk's slots (one, but for bench --in-flight), whose known values chk
// writes and checks. alt, if not nil, is a second kind of call (bench
// --alternate-dtype), measured the same way in turn with the first: each
// timed iteration times one of each, alternating which goes first.
// prewarm, if not nil, runs first (the first size's: see prewarmer). A
// pacer (bench --sidecar) runs prewarm, the checked call and warmup as
// one block and the timed calls in blocks, each when the parent says and
// each after one untimed call; nil runs them at once. between, if not
// nil, runs before every warmup and timed call, untimed (bench
// --between).
type measurement struct {
	chk              *check
	call             func() error
	alt              *side
	iters, warmup    int
	pace             *pacer
	prewarm, between func() error
}

// run is runAll for a measurement of one kind of call: its times.
func (m measurement) run() ([]int64, error) {
	times, err := m.runAll()
	if err != nil {
		return nil, err
	}
	return times[0], nil
}

// runAll is the protocol of every bench command for one size: a checked
// call on known values, warmup calls, then iters timed calls, the last of
// them on known values again and checked too; for each side in turn. It
// returns each side's timed calls' durations in nanoseconds.
func (m measurement) runAll() ([][]int64, error) {
	sides := []side{{chk: m.chk, call: m.call}}
	if m.alt != nil {
		sides = append(sides, *m.alt)
	}
	if err := m.pace.wait(); err != nil {
		return nil, err
	}
	if m.prewarm != nil {
		if err := m.prewarm(); err != nil {
			return nil, fmt.Errorf("prewarm: %w", err)
		}
	}
	for _, s := range sides {
		s.chk.fill()
		if err := s.call(); err != nil {
			return nil, err
		}
		if err := s.chk.verify(); err != nil {
			return nil, m.named(s, err)
		}
	}
	for i := 0; i < m.warmup; i++ {
		for _, s := range sides {
			if err := runBetween(m.between); err != nil {
				return nil, err
			}
			if err := s.call(); err != nil {
				return nil, err
			}
		}
	}
	if err := m.pace.done(); err != nil {
		return nil, err
	}
	times := make([][]int64, len(sides))
	for k := range times {
		times[k] = make([]int64, 0, m.iters)
	}
	for i := 0; i < m.iters; i++ {
		if m.pace.starts(i) {
			if err := m.pace.wait(); err != nil {
				return nil, err
			}
			// The other world had the machine until now: the first call
			// after its turn runs cold (TUNING section 21), so it is not
			// timed.
			for _, s := range sides {
				if err := s.call(); err != nil {
					return nil, err
				}
			}
		}
		last := i == m.iters-1
		if last {
			for _, s := range sides {
				s.chk.fill()
			}
		}
		for j := range sides {
			k := (i + j) % len(sides) // alternate which side goes first
			if err := runBetween(m.between); err != nil {
				return nil, err
			}
			t0 := time.Now()
			err := sides[k].call()
			took := time.Since(t0)
			if err != nil {
				return nil, err
			}
			times[k] = append(times[k], took.Nanoseconds())
		}
		if last {
			for _, s := range sides {
				if err := s.chk.verify(); err != nil {
					return nil, m.named(s, err)
				}
			}
		}
		if m.pace.ends(i, m.iters) {
			if err := m.pace.done(); err != nil {
				return nil, err
			}
		}
	}
	return times, nil
}

// named says which side's check failed when there are two.
func (m measurement) named(s side, err error) error {
	if m.alt == nil {
		return err
	}
	return fmt.Errorf("%s: %w", s.chk.w.dt, err)
}

// runBetween makes the untimed call of another size that --between puts
// before each call measured.
func runBetween(between func() error) error {
	if between == nil {
		return nil
	}
	if err := between(); err != nil {
		return fmt.Errorf("the call of --between's size: %w", err)
	}
	return nil
}
