package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/rendezvous"
	"github.com/collectived/collectived/ring"
	"github.com/collectived/collectived/shm"
)

// benchRingCommand is one node of `collectived bench --ring-only`: the
// ring engine called in this process, on the ring settings a daemon with
// the same config would use (daemon.Config.RingConfig), with no trainers,
// Unix socket or shared memory. Set against `collectived bench` on the
// same config, it isolates what the sidecar costs.
func benchRingCommand() *cli.Command {
	return &cli.Command{
		Name:   "bench-ring",
		Hidden: true,
		Flags: append([]cli.Flag{configFlag, rankFlag,
			&cli.StringFlag{Name: "sizes", Required: true},
			&cli.StringFlag{Name: "dtype", Value: "float32"},
			opFlag,
			reduceFlag,
			&cli.IntFlag{Name: "iters", Value: 20},
			&cli.IntFlag{Name: "warmup", Value: 3},
			&cli.IntFlag{Name: "prewarm"},
			betweenFlag,
			&cli.StringFlag{Name: "out", Usage: "where ring rank 0 writes one JSON result per size (default stdout)"},
		}, paceFlags...),
		Action: runBenchRing,
	}
}

func runBenchRing(c *cli.Context) error {
	sizes, w, err := parseWorkload(c)
	if err != nil {
		return err
	}
	if w.coll != collective.OpAllReduce {
		return fmt.Errorf("bench-ring: --op %s: the ring engine alone measures allreduce only", c.String("op"))
	}
	dt, op := w.dt, w.op
	pace, err := pacerFromFlags(c)
	if err != nil {
		return err
	}
	// The pacing socket is left to the exit to close: closed now, the
	// parent would read its end before main has printed why we failed.
	cfg, rank, err := loadConfig(c)
	if err != nil {
		return err
	}
	base := newLogger(cfg.Log)
	log := base.With("job", cfg.Job.Name, "node", rank)
	dc, err := daemonConfig(cfg, rank, log)
	if err != nil {
		return err
	}
	// The rendezvous adds the job and its rank to its lines itself.
	rv, err := rendezvous.Listen(dc.RendezvousConfig(base))
	if err != nil {
		return fmt.Errorf("bench-ring node %d: ring listener: %w", rank, err)
	}
	defer rv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), dc.ConnectTimeout)
	links, err := rv.Form(ctx, 0)
	cancel()
	if err != nil {
		return fmt.Errorf("bench-ring node %d: %w", rank, err)
	}
	r, err := ring.New(dc.RingConfig(0, log), ring.Links{Next: links.Next, Prev: links.Prev, NextAddr: links.NextAddr, PrevAddr: links.PrevAddr})
	if err != nil {
		links.Close()
		return err
	}
	defer r.Close()
	if _, err := r.Start(); err != nil {
		return fmt.Errorf("bench-ring node %d: %w", rank, err)
	}
	var out io.Writer = os.Stdout
	if p := c.String("out"); p != "" && rank == 0 {
		f, err := os.Create(p)
		if err != nil {
			return err
		}
		defer f.Close()
		out = f
	}
	enc := json.NewEncoder(out)
	d1 := collective.Desc{Op: collective.OpAllReduce, DType: dt, Reduce: op, Count: 1}
	one := make([]byte, dt.Size())
	prewarm := prewarmer(c.Int("prewarm"), func() error { return r.AllReduce(d1, one) })
	between, free, err := ringBetween(c, r, dt, op)
	if err != nil {
		return err
	}
	defer free()
	for i, size := range sizes {
		res, err := benchRingSize(r, rank, len(dc.Peers), size, w, c.Int("iters"), c.Int("warmup"), pace, firstOnly(i, prewarm), between)
		if err != nil {
			return fmt.Errorf("bench-ring node %d, size %d: %w", rank, size, err)
		}
		if rank == 0 {
			if err := enc.Encode(res); err != nil {
				return err
			}
		}
	}
	// Every rank passes this barrier only once all have timed every size,
	// so none closes its links under a neighbour still measuring.
	return r.Barrier(collective.Desc{Op: collective.OpBarrier})
}

// benchRingSize is trainerBench.size for the ring engine itself (an
// allreduce): the same fill, verification and timing, so that the two
// are comparable.
func benchRingSize(r *ring.Ring, rank, world int, size int64, w workload, iters, warmup int, pace *pacer, prewarm, between func() error) (sizeResult, error) {
	es := int64(w.dt.Size())
	count := w.count(size, world)
	// The buffer is a memfd mapping, as the daemon's are (shared with
	// its trainers), not the Go heap, so the baseline differs from the
	// daemon in nothing the sidecar does not add (TUNING section 21).
	seg, err := shm.Create(int64(count) * es)
	if err != nil {
		return sizeResult{}, fmt.Errorf("ring-only buffer: %w", err)
	}
	defer seg.Close()
	buf := seg.Bytes()[:int64(count)*es]
	res := sizeResult{Bytes: int64(len(buf)), Path: "ring"}
	d := w.desc(count)
	res.TimesNS, err = measurement{
		chk:   newCheck(w, rank, world, count, []slot{{in: buf}}),
		iters: iters, warmup: warmup, pace: pace, prewarm: prewarm, between: between,
		call: func() error { return r.AllReduce(d, buf) },
	}.run()
	return res, err
}
