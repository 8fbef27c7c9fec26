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
			inFlightFlag,
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
			between, free, err := trainerBetween(c, cl, dt, op)
			if err != nil {
				return err
			}
			defer free()
			enc := json.NewEncoder(os.Stdout)
			prewarm := prewarmer(c.Int("prewarm"), dt, func(one []byte) error { return cl.AllReduce(one, dt, op) })
			tb := trainerBench{cl: cl, dt: dt, op: op, inFlight: c.Int("in-flight"), iters: c.Int("iters"),
				warmup: c.Int("warmup"), pace: pace, between: between}
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

// trainerBench is what a bench trainer measures at every size: iters
// timed calls (after warmup untimed ones) of dt reduced with op, inFlight
// at once (bench --in-flight), paced by pace (bench --sidecar) and each
// after between (bench --between) when they are not nil.
type trainerBench struct {
	cl                      *cvd.Client
	dt                      collective.DType
	op                      collective.ReduceOp
	inFlight, iters, warmup int
	pace                    *pacer
	between                 func() error
}

// size measures one size, on inFlight buffers of it; prewarm, if not
// nil, runs first.
func (tb trainerBench) size(size int64, prewarm func() error) (sizeResult, error) {
	cl, dt, op, inFlight := tb.cl, tb.dt, tb.op, tb.inFlight
	es := int64(dt.Size())
	count := size / es
	if count == 0 {
		count = 1
	}
	n := int(count * es)
	res := sizeResult{Bytes: int64(n), Path: "inline", Lane: cl.HasLane()}
	var all []byte
	if n > cl.InlineLimit() {
		seg, err := cl.Alloc(n * inFlight)
		if err != nil {
			return res, err
		}
		defer seg.Free()
		all = seg.Bytes()[:n*inFlight]
		res.Path = "shm"
	} else {
		all = make([]byte, n*inFlight)
		if n > cl.InlineMax() {
			res.Path = "copied"
		}
	}
	bufs := make([][]byte, inFlight)
	for i := range bufs {
		bufs[i] = all[i*n : (i+1)*n : (i+1)*n]
	}
	call := func() error { return cl.AllReduce(bufs[0], dt, op) }
	if inFlight > 1 {
		call = inFlightCall(cl, bufs, dt, op)
	}
	var err error
	res.TimesNS, err = measurement{
		bufs: bufs, dt: dt, op: op, rank: cl.Rank(), world: cl.Size(),
		iters: tb.iters, warmup: tb.warmup, pace: tb.pace, prewarm: prewarm, between: tb.between,
		allreduce: call,
	}.run()
	return res, err
}

// measurement is one size of a bench command: allreduce runs one call on
// each of bufs (one buffer, but for bench --in-flight), which hold
// elements of dt (reduced with op) on world rank rank of world. prewarm, if not nil, runs first (the first size's: see
// prewarmer). A pacer (bench --sidecar) runs prewarm, the checked call
// and warmup as one block and the timed calls in blocks, each when the
// parent says and each after one untimed call; nil runs them at once.
// between, if not nil, runs before every warmup and timed call, untimed
// (bench --between).
type measurement struct {
	bufs             [][]byte
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
	m.fill()
	if err := m.allreduce(); err != nil {
		return nil, err
	}
	if err := m.verify(); err != nil {
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
			m.fill()
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
			if err := m.verify(); err != nil {
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

func (m measurement) fill() {
	for _, b := range m.bufs {
		fill(b, m.dt, m.op, m.rank)
	}
}

// verify checks every buffer, naming which of several was wrong.
func (m measurement) verify() error {
	for i, b := range m.bufs {
		if err := verify(b, m.dt, m.op, m.world); err != nil {
			if len(m.bufs) > 1 {
				return fmt.Errorf("buffer %d of %d in flight: %w", i+1, len(m.bufs), err)
			}
			return err
		}
	}
	return nil
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
