package main

import (
	"errors"
	"fmt"

	"github.com/urfave/cli/v2"

	cvd "github.com/collectived/collectived/clients/go"
	"github.com/collectived/collectived/collective"
)

// --in-flight K: each timed iteration starts K calls at once, each on
// a buffer of its own, and waits for all of them, as a trainer that
// overlaps its gradient buckets does (torch's DDP: an async allreduce per
// bucket). The group is timed as one; a client that runs overlapping
// calls no faster than one after another shows it here.

// maxInFlight is the largest --in-flight: the daemon's default limit on
// calls a connection may have outstanding (limits.max_in_flight).
const maxInFlight = 64

var inFlightFlag = &cli.IntFlag{Name: "in-flight", Value: 1, Usage: "calls each trainer starts at once per iteration, each on a buffer of its own, then waits for all (as a trainer overlapping its gradient buckets does); the group is timed as one, and algbw counts all its bytes"}

// checkInFlight refuses an --in-flight outside 1 to maxInFlight.
func checkInFlight(c *cli.Context) error {
	if k := c.Int("in-flight"); k < 1 || k > maxInFlight {
		return fmt.Errorf("--in-flight %d: want 1 to %d", k, maxInFlight)
	}
	return nil
}

// inFlightCall is a bench trainer's timed call with --in-flight K: start
// a call of d on each of slots (in place, or into the slot's out), then
// wait for every one. A failure to start waits for those started before
// it returns.
func inFlightCall(cl *cvd.Client, d collective.Desc, slots []slot) func() error {
	hs := make([]*cvd.Handle, len(slots))
	return func() error {
		var errs []error
		started := 0
		for i, s := range slots {
			var h *cvd.Handle
			var err error
			if s.out != nil {
				h, err = cl.StartInto(d, s.in, s.out)
			} else {
				h, err = cl.Start(d, s.in)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("call %d of %d in flight: %w", i+1, len(slots), err))
				break
			}
			hs[i] = h
			started++
		}
		for i, h := range hs[:started] {
			if err := h.Wait(); err != nil {
				errs = append(errs, fmt.Errorf("call %d of %d in flight: %w", i+1, len(slots), err))
			}
		}
		return errors.Join(errs...)
	}
}
