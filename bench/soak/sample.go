package main

import (
	"encoding/json"
	"fmt"
	"time"

	cvd "github.com/collectived/collectived/clients/go"
)

// metrics is what one status read says about one daemon. The field names
// are daemon/status.go's.
type metrics struct {
	RSSBytes   int64    `json:"rss_bytes"`
	FDs        int      `json:"fds"`
	Goroutines int      `json:"goroutines"`
	HeapBytes  uint64   `json:"heap_bytes"`
	Mallocs    uint64   `json:"mallocs"`
	Memfds     int      `json:"memfds"`
	Ring       string   `json:"ring"`
	Trainers   []uint64 `json:"trainer_calls"` // calls per local rank, as the daemon counts them
}

// sample is one read of every daemon.
type sample struct {
	TSec    float64   `json:"t_sec"`
	Calls   int64     `json:"calls"` // collectives every trainer has completed
	Daemons []metrics `json:"daemons"`
}

// observer is a status-only connection to one daemon.
type observer struct {
	rank int
	c    *cvd.Client
	pid  int
}

func dialObserver(socket string, rank int, dialTimeout time.Duration) (*observer, error) {
	c, err := cvd.Dial(cvd.Options{Socket: socket, Job: jobName, Observer: true, LocalRank: -1,
		Timeout: 30 * time.Second, DialTimeout: dialTimeout, Spin: -1})
	if err != nil {
		return nil, fmt.Errorf("observer of daemon %d: %w", rank, err)
	}
	return &observer{rank: rank, c: c}, nil
}

// statusJSON is the part of daemon.Status the soak reads.
type statusJSON struct {
	Ring struct {
		State string `json:"state"`
	} `json:"ring"`
	Trainers []struct {
		Calls uint64 `json:"calls"`
	} `json:"trainers"`
	Process struct {
		PID        int    `json:"pid"`
		Goroutines int    `json:"goroutines"`
		FDs        int    `json:"fds"`
		Memfds     int    `json:"memfds"`
		RSSBytes   int64  `json:"rss_bytes"`
		Mallocs    uint64 `json:"mallocs"`
		HeapBytes  uint64 `json:"heap_bytes"`
	} `json:"process"`
}

func (o *observer) read() (metrics, error) {
	raw, err := o.c.StatusJSON()
	if err != nil {
		return metrics{}, fmt.Errorf("status of daemon %d: %w", o.rank, err)
	}
	var st statusJSON
	if err := json.Unmarshal(raw, &st); err != nil {
		return metrics{}, fmt.Errorf("status of daemon %d: %w", o.rank, err)
	}
	if st.Process.PID == 0 || st.Process.RSSBytes == 0 || st.Process.FDs == 0 {
		return metrics{}, fmt.Errorf("status of daemon %d: no process figures in %.200s", o.rank, raw)
	}
	o.pid = st.Process.PID
	m := metrics{RSSBytes: st.Process.RSSBytes, FDs: st.Process.FDs, Goroutines: st.Process.Goroutines,
		HeapBytes: st.Process.HeapBytes, Mallocs: st.Process.Mallocs, Memfds: st.Process.Memfds, Ring: st.Ring.State}
	for _, t := range st.Trainers {
		m.Trainers = append(m.Trainers, t.Calls)
	}
	return m, nil
}

// perStatus measures what a status read itself allocates in the daemon
// (allocations, and heap bytes while no GC runs), so that it can be taken
// out of the per-call figures: reads are made by time, not by call, and
// would otherwise look like a per-call cost.
func (o *observer) perStatus() (mallocs, heap float64, err error) {
	const reads = 8
	first, err := o.read()
	if err != nil {
		return 0, 0, err
	}
	last := first
	for i := 0; i < reads; i++ {
		if last, err = o.read(); err != nil {
			return 0, 0, err
		}
	}
	return float64(last.Mallocs-first.Mallocs) / reads, (float64(last.HeapBytes) - float64(first.HeapBytes)) / reads, nil
}

// quietMallocs measures, with no collective running, what a status read
// allocates and how many allocations per second the daemon makes anyway
// (timers, heartbeats on quiet links).
func (o *observer) quietMallocs(wait time.Duration) (perStatus, heapPerStatus, perSec float64, err error) {
	if perStatus, heapPerStatus, err = o.perStatus(); err != nil {
		return 0, 0, 0, err
	}
	a, err := o.read()
	if err != nil {
		return 0, 0, 0, err
	}
	t0 := time.Now()
	time.Sleep(wait)
	b, err := o.read()
	if err != nil {
		return 0, 0, 0, err
	}
	perSec = (float64(b.Mallocs-a.Mallocs) - perStatus) / time.Since(t0).Seconds()
	return perStatus, heapPerStatus, max(perSec, 0), nil
}
