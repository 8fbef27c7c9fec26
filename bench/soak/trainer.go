package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	cvd "github.com/collectived/collectived/clients/go"
)

// trainer is one rank of the world, a goroutine of this program.
type trainer struct {
	node, local int
	rank, size  int
	c           *cvd.Client
	done        atomic.Int64 // calls completed
	checks      int          // sums checked
	lat         *histogram
}

func dialTrainer(socket string, node, local int, spin, dialTimeout time.Duration) (*trainer, error) {
	c, err := cvd.Dial(cvd.Options{Socket: socket, Job: jobName, LocalRank: local,
		Label: fmt.Sprintf("soak-%d.%d", node, local), Spin: spin, DialTimeout: dialTimeout})
	if err != nil {
		return nil, fmt.Errorf("trainer node %d local %d: %w", node, local, err)
	}
	return &trainer{node: node, local: local, rank: c.Rank(), size: c.Size(), c: c, lat: newHistogram()}, nil
}

// value is what rank puts in element j of call k; every trainer's sum of
// it is an exact float32 integer, and it changes from call to call so that
// a result from the wrong collective is caught.
func value(rank, k, j int) float32 {
	return float32((rank+1)*(k%256+1) + j%7)
}

// expected is the sum of value over size ranks.
func expected(size, k, j int) float32 {
	return float32(size*(size+1)/2*(k%256+1) + size*(j%7))
}

// errStopped means the soak was interrupted, not that a call failed.
var errStopped = errors.New("stopped")

// run makes calls allreduces of n float32, checking the sum every
// checkEvery calls and on the last one.
func (t *trainer) run(ctx context.Context, calls, n, checkEvery int) error {
	buf := make([]float32, n)
	for k := 0; k < calls; k++ {
		if k&255 == 0 && ctx.Err() != nil {
			return errStopped
		}
		for j := range buf {
			buf[j] = value(t.rank, k, j)
		}
		t0 := time.Now()
		err := cvd.AllReduce(t.c, buf, cvd.Sum)
		t.lat.add(time.Since(t0))
		if err != nil {
			if ctx.Err() != nil {
				return errStopped
			}
			return fmt.Errorf("trainer world rank %d (node %d local %d), call %d: %w", t.rank, t.node, t.local, k, err)
		}
		if (k+1)%checkEvery == 0 || k == calls-1 {
			for j := range buf {
				if want := expected(t.size, k, j); buf[j] != want {
					return fmt.Errorf("trainer world rank %d (node %d local %d), call %d: element %d = %v, want %v: WRONG RESULT",
						t.rank, t.node, t.local, k, j, buf[j], want)
				}
			}
			t.checks++
		}
		t.done.Store(int64(k + 1))
	}
	return nil
}

// histogram holds latencies in 1 µs buckets up to histMax, and counts
// the rest in the last bucket: enough for a median and a p99 of millions
// of calls in fixed memory.
type histogram struct {
	counts []uint32
	n      uint64
	sum    time.Duration
	max    time.Duration
}

const histMax = 100 * time.Millisecond

func newHistogram() *histogram {
	return &histogram{counts: make([]uint32, histMax/time.Microsecond+1)}
}

func (h *histogram) add(d time.Duration) {
	i := int(d / time.Microsecond)
	if i >= len(h.counts) {
		i = len(h.counts) - 1
	}
	h.counts[i]++
	h.n++
	h.sum += d
	if d > h.max {
		h.max = d
	}
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	h.max = max(h.max, o.max)
}

// quantile returns the upper edge of the bucket holding quantile q.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	target := uint64(q * float64(h.n))
	if target >= h.n {
		target = h.n - 1
	}
	var seen uint64
	for i, c := range h.counts {
		seen += uint64(c)
		if seen > target {
			if i == len(h.counts)-1 {
				return h.max
			}
			return time.Duration(i+1) * time.Microsecond
		}
	}
	return h.max
}
