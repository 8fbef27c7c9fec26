package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	cvd "github.com/collectived/collectived/clients/go"
	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/ring"
	"github.com/collectived/collectived/shm"
)

// --between: before every warmup and timed call of the size measured, an
// untimed call of the same collective at another size, as a trainer whose buffers come in
// several sizes makes them. What the call measured then costs includes
// switching from the other size (docs/TUNING.md, section 25: a ring of
// two lends different links to 4-byte and 16 KiB calls).

var betweenFlag = &cli.StringFlag{Name: "between", Usage: "before every warmup and timed call, an untimed call of the same collective (same dtype and reduce op) of this many bytes (units allowed), as a trainer with buffers of several sizes makes: the call measured then pays for switching sizes"}

// parseBetween reads --between: 0 when unset. parseWorkload checks it
// with the other workload flags, so later reads need not.
func parseBetween(c *cli.Context) (int64, error) {
	s := c.String("between")
	if s == "" {
		return 0, nil
	}
	n, err := parseSize("--between", s)
	if err == nil && n == 0 {
		err = fmt.Errorf("--between: %q: want at least one byte (or leave it unset)", s)
	}
	return n, err
}

// betweenElems is the element count of bench-ring's --between call: at
// least one.
func betweenElems(n int64, dt collective.DType) int64 { return max(n/int64(dt.Size()), 1) }

// trainerBetween is a bench trainer's --between call (call nil when
// unset): the collective measured, at --between's size, on buffers of its
// own laid out as the measured ones are (shared memory above the inline
// limit). free releases what it holds.
func trainerBetween(c *cli.Context, cl *cvd.Client, w workload) (*trainerBufs, error) {
	n, _ := parseBetween(c)
	if n == 0 {
		return &trainerBufs{free: func() {}}, nil
	}
	b, err := newTrainerBufs(cl, w, w.count(n, cl.Size()), 1)
	if err != nil {
		return nil, fmt.Errorf("--between buffer: %w", err)
	}
	return b, nil
}

// ringBetween is bench-ring's --between call (nil when unset), on a memfd
// buffer like its own.
func ringBetween(c *cli.Context, r *ring.Ring, dt collective.DType, op collective.ReduceOp) (call func() error, free func(), err error) {
	n, _ := parseBetween(c)
	if n == 0 {
		return nil, func() {}, nil
	}
	count := betweenElems(n, dt)
	seg, err := shm.Create(count * int64(dt.Size()))
	if err != nil {
		return nil, nil, fmt.Errorf("--between buffer: %w", err)
	}
	buf := seg.Bytes()[:count*int64(dt.Size())]
	d := collective.Desc{Op: collective.OpAllReduce, DType: dt, Reduce: op, Count: uint64(count)}
	return func() error { return r.AllReduce(d, buf) }, func() { seg.Close() }, nil
}
