package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	cvd "github.com/collectived/collectived/clients/go"
	"github.com/collectived/collectived/collective"
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
			&cli.StringFlag{Name: "op", Value: "sum"},
			&cli.IntFlag{Name: "iters", Value: 20},
			&cli.IntFlag{Name: "warmup", Value: 3},
			&cli.IntFlag{Name: "prewarm"},
			betweenFlag,
			&cli.IntFlag{Name: "local-rank", Value: -1},
			&cli.DurationFlag{Name: "spin"},
			&cli.IntFlag{Name: "inline-max"},
			&cli.BoolFlag{Name: "no-lane"},
		}, paceFlags...),
		Action: func(c *cli.Context) error {
			sizes, dt, op, err := parseWorkload(c)
			if err != nil {
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
			between, free, err := trainerBetween(c, cl, dt, op)
			if err != nil {
				return err
			}
			defer free()
			enc := json.NewEncoder(os.Stdout)
			prewarm := prewarmer(c.Int("prewarm"), dt, func(one []byte) error { return cl.AllReduce(one, dt, op) })
			for i, size := range sizes {
				res, err := benchOneSize(cl, size, dt, op, c.Int("iters"), c.Int("warmup"), pace, firstOnly(i, prewarm), between)
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
// --dtype and --op.
func parseWorkload(c *cli.Context) (sizes []int64, dt collective.DType, op collective.ReduceOp, err error) {
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
	if dt, err = collective.ParseDType(c.String("dtype")); err != nil {
		return
	}
	op, err = collective.ParseReduceOp(c.String("op"))
	return
}

func benchOneSize(cl *cvd.Client, size int64, dt collective.DType, op collective.ReduceOp, iters, warmup int, pace *pacer, prewarm, between func() error) (sizeResult, error) {
	es := int64(dt.Size())
	count := size / es
	if count == 0 {
		count = 1
	}
	n := int(count * es)
	res := sizeResult{Bytes: int64(n), Path: "inline", Lane: cl.HasLane()}
	var buf []byte
	if n > cl.InlineLimit() {
		seg, err := cl.Alloc(n)
		if err != nil {
			return res, err
		}
		defer seg.Free()
		buf = seg.Bytes()[:n]
		res.Path = "shm"
	} else {
		buf = make([]byte, n)
		if n > cl.InlineMax() {
			res.Path = "copied"
		}
	}
	var err error
	res.TimesNS, err = measurement{
		buf: buf, dt: dt, op: op, rank: cl.Rank(), world: cl.Size(),
		iters: iters, warmup: warmup, pace: pace, prewarm: prewarm, between: between,
		allreduce: func() error { return cl.AllReduce(buf, dt, op) },
	}.run()
	return res, err
}

// measurement is one size of a bench command: allreduce runs one call on
// buf, which holds elements of dt (reduced with op) on world rank rank
// of world. prewarm, if not nil, runs first (the first size's: see
// prewarmer). A pacer (bench --sidecar) runs prewarm, the checked call
// and warmup as one block and the timed calls in blocks, each when the
// parent says and each after one untimed call; nil runs them at once.
// between, if not nil, runs before every warmup and timed call, untimed
// (bench --between).
type measurement struct {
	buf              []byte
	dt               collective.DType
	op               collective.ReduceOp
	rank, world      int
	iters, warmup    int
	pace             *pacer
	prewarm, between func() error
	allreduce        func() error
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
	fill(m.buf, m.dt, m.op, m.rank)
	if err := m.allreduce(); err != nil {
		return nil, err
	}
	if err := verify(m.buf, m.dt, m.op, m.world); err != nil {
		return nil, err
	}
	for i := 0; i < m.warmup; i++ {
		if err := runBetween(m.between); err != nil {
			return nil, err
		}
		if err := m.allreduce(); err != nil {
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
			if err := m.allreduce(); err != nil {
				return nil, err
			}
		}
		if i == m.iters-1 {
			fill(m.buf, m.dt, m.op, m.rank)
		}
		if err := runBetween(m.between); err != nil {
			return nil, err
		}
		t0 := time.Now()
		err := m.allreduce()
		took := time.Since(t0)
		if err != nil {
			return nil, err
		}
		times = append(times, took.Nanoseconds())
		if i == m.iters-1 {
			if err := verify(m.buf, m.dt, m.op, m.world); err != nil {
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

// value is what rank w contributes at element i; exact in every dtype for
// the worlds a machine can hold, so verification is exact too.
func value(i, w int, op collective.ReduceOp) float64 {
	if op == collective.Prod {
		if (i+w)%3 == 0 {
			return -1
		}
		return 1
	}
	return float64((w + 1) * (i%7 + 1))
}

func expected(i, size int, op collective.ReduceOp) float64 {
	k := float64(i%7 + 1)
	switch op {
	case collective.Sum:
		return k * float64(size*(size+1)/2)
	case collective.Max:
		return k * float64(size)
	case collective.Min:
		return k
	}
	p := 1.0
	for w := 0; w < size; w++ {
		p *= value(i, w, op)
	}
	return p
}

func fill(buf []byte, dt collective.DType, op collective.ReduceOp, rank int) {
	es := dt.Size()
	for i := 0; i*es < len(buf); i++ {
		dt.Put(buf[i*es:], value(i, rank, op))
	}
}

func verify(buf []byte, dt collective.DType, op collective.ReduceOp, size int) error {
	es := dt.Size()
	for i := 0; i*es < len(buf); i++ {
		if got, want := dt.Get(buf[i*es:]), expected(i, size, op); got != want {
			return fmt.Errorf("wrong result at element %d: got %v, want %v", i, got, want)
		}
	}
	return nil
}
