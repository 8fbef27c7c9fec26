package main

import (
	"encoding/json"
	"fmt"
	"os"
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
			&cli.IntFlag{Name: "iters", Value: 20},
			&cli.IntFlag{Name: "warmup", Value: 3},
			&cli.IntFlag{Name: "prewarm"},
			betweenFlag,
			inFlightFlag,
			&cli.IntFlag{Name: "local-rank", Value: -1},
			&cli.DurationFlag{Name: "spin"},
			&cli.IntFlag{Name: "inline-max"},
			&cli.BoolFlag{Name: "no-lane"},
		}, paceFlags...),
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
			tb := trainerBench{cl: cl, w: w, inFlight: c.Int("in-flight"), iters: c.Int("iters"),
				warmup: c.Int("warmup"), pace: pace, between: between.call}
			for i, size := range sizes {
				res, err := tb.size(size, firstOnly(i, prewarm))
				if err != nil {
					return fmt.Errorf("world rank %d, size %d: %w", cl.Rank(), size, err)
				}
				if cl.Rank() == 0 {
					if err := enc.Encode(res); err != nil {
						return err
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
// not nil, runs first.
func (tb trainerBench) size(size int64, prewarm func() error) (sizeResult, error) {
	cl, w := tb.cl, tb.w
	count := w.count(size, cl.Size())
	bufs, err := newTrainerBufs(cl, w, count, tb.inFlight)
	if err != nil {
		return sizeResult{}, err
	}
	defer bufs.free()
	res := sizeResult{Bytes: int64(count) * int64(w.dt.Size()), Path: bufs.path, Lane: cl.HasLane()}
	res.TimesNS, err = measurement{
		chk:   newCheck(w, cl.Rank(), cl.Size(), count, bufs.slots),
		iters: tb.iters, warmup: tb.warmup, pace: tb.pace, prewarm: prewarm, between: tb.between,
		call: bufs.call,
	}.run()
	return res, err
}

// measurement is one size of a bench command: call runs one call on each
// of chk's slots (one, but for bench --in-flight), whose known values chk
// writes and checks. prewarm, if not nil, runs first (the first size's:
// see prewarmer). A pacer (bench --sidecar) runs prewarm, the checked
// call and warmup as one block and the timed calls in blocks, each when
// the parent says and each after one untimed call; nil runs them at once.
// between, if not nil, runs before every warmup and timed call, untimed
// (bench --between).
type measurement struct {
	chk              *check
	iters, warmup    int
	pace             *pacer
	prewarm, between func() error
	call             func() error
}

// run is the protocol of every bench command for one size: a checked
// call on known values, warmup calls, then iters timed calls, the last of
// them on known values again and checked too. It returns the timed
// calls' durations in nanoseconds.
func (m measurement) run() ([]int64, error) {
	if err := m.pace.wait(); err != nil {
		return nil, err
	}
	if m.prewarm != nil {
		if err := m.prewarm(); err != nil {
			return nil, fmt.Errorf("prewarm: %w", err)
		}
	}
	m.chk.fill()
	if err := m.call(); err != nil {
		return nil, err
	}
	if err := m.chk.verify(); err != nil {
		return nil, err
	}
	for i := 0; i < m.warmup; i++ {
		if err := runBetween(m.between); err != nil {
			return nil, err
		}
		if err := m.call(); err != nil {
			return nil, err
		}
	}
	if err := m.pace.done(); err != nil {
		return nil, err
	}
	times := make([]int64, 0, m.iters)
	for i := 0; i < m.iters; i++ {
		if m.pace.starts(i) {
			if err := m.pace.wait(); err != nil {
				return nil, err
			}
			// The other world had the machine until now: the first call
			// after its turn runs cold (TUNING section 21), so it is not
			// timed.
			if err := m.call(); err != nil {
				return nil, err
			}
		}
		if i == m.iters-1 {
			m.chk.fill()
		}
		if err := runBetween(m.between); err != nil {
			return nil, err
		}
		t0 := time.Now()
		err := m.call()
		took := time.Since(t0)
		if err != nil {
			return nil, err
		}
		times = append(times, took.Nanoseconds())
		if i == m.iters-1 {
			if err := m.chk.verify(); err != nil {
				return nil, err
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
