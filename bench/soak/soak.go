package main

import (
	"github.com/collectived/collectived/internal/localworld"

	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"time"
)

// machine describes where the soak ran.
type machine struct {
	NProc         int    `json:"nproc"`
	Kernel        string `json:"kernel"`
	GoVersion     string `json:"go_version"`
	LoadAvgStart  string `json:"loadavg_start"`
	LoadAvgFinish string `json:"loadavg_finish"`
}

// result is everything the soak measured; it is the --json output.
type result struct {
	Options     options   `json:"options"`
	Machine     machine   `json:"machine"`
	Started     time.Time `json:"started"`
	Finished    time.Time `json:"finished"`
	Interrupted bool      `json:"interrupted,omitempty"`
	Error       string    `json:"error,omitempty"`

	CallsDone   int64 `json:"calls_done"`
	WarmupCalls int64 `json:"warmup_calls"`
	Checks      int   `json:"checks"` // exact-sum checks passed, over all trainers
	// ElapsedSec is from the trainers' start to the last call.
	ElapsedSec        float64 `json:"elapsed_sec"`
	CallsPerSec       float64 `json:"calls_per_sec"`
	SteadyCallsPerSec float64 `json:"steady_calls_per_sec"` // after warm-up
	Latency           latency `json:"latency_us"`

	Daemons []daemonResult `json:"daemons"`
	Samples []sample       `json:"samples"`
}

type latency struct {
	Calls uint64  `json:"calls"`
	Mean  float64 `json:"mean"`
	P50   float64 `json:"p50"`
	P99   float64 `json:"p99"`
	P999  float64 `json:"p99_9"`
	Max   float64 `json:"max"`
}

// daemonResult is the analysis of one daemon's samples.
type daemonResult struct {
	Rank int `json:"rank"`
	PID  int `json:"pid"`
	// Idle is before any trainer attached; Detached is --settle after
	// all left.
	Idle     metrics  `json:"idle"`
	Detached *metrics `json:"detached,omitempty"`
	Fits     []fit    `json:"fits"`
	// MallocsPerStatus is what one status read allocates in the daemon
	// (measured after the run, trainers attached, or before it if the run
	// failed); MallocsPerCall is the fitted mallocs slope with the status
	// reads of the fitted span taken out. QuietMallocsPerSec is the
	// daemon's allocation rate with trainers attached but not calling:
	// time-based work (heartbeats flow on quiet links only) that the
	// per-call figure may still include.
	MallocsPerStatus   float64 `json:"mallocs_per_status"`
	MallocsPerCall     float64 `json:"mallocs_per_call"`
	QuietMallocsPerSec float64 `json:"quiet_mallocs_per_sec"`
	// HeapPerStatus is how much the Go heap grows per status read until
	// the next GC; HeapPerCall is the heap_bytes slope with the fitted
	// span's reads taken out (garbage not yet collected counts).
	HeapPerStatus float64 `json:"heap_bytes_per_status"`
	HeapPerCall   float64 `json:"heap_bytes_per_call"`
}

func readMachine() machine {
	m := machine{NProc: runtime.NumCPU(), LoadAvgStart: loadavg()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if out, err := exec.Command("go", "env", "GOVERSION").Output(); err == nil {
		m.GoVersion = strings.TrimSpace(string(out))
	}
	return m
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "soak: "+format+"\n", args...)
}

// soak runs the whole benchmark. It returns what it measured, even when it
// also returns an error (a partial run is still worth reading).
func soak(ctx context.Context, o options) (*result, error) {
	res := &result{Options: o, Machine: readMachine(), Started: time.Now().UTC()}
	defer func() { res.Finished = time.Now().UTC(); res.Machine.LoadAvgFinish = loadavg() }()

	dir, err := os.MkdirTemp("", "cvd-soak-")
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		// The daemons' logs outlive a failed run: they say why.
		if ok {
			os.RemoveAll(dir)
		} else {
			progress("daemon logs kept in %s", dir)
		}
	}()
	bin := o.Bin
	if bin == "" {
		progress("building ./cmd/collectived")
		if bin, err = buildDaemon(dir); err != nil {
			return nil, err
		}
	}
	w, err := localworld.Start(localworld.Options{Bin: bin, Dir: dir, Nodes: o.Nodes, Local: o.Local,
		Job: jobName, TokenEnv: tokenEnv, OpenWait: openWait, StopGrace: stopGrace})
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("interrupted")
	}

	obs := make([]*observer, o.Nodes)
	for i, sock := range w.Sockets {
		if obs[i], err = dialObserver(sock, i, o.DialTimeout); err != nil {
			return nil, err
		}
		defer obs[i].c.Close()
	}
	for i, ob := range obs {
		m, err := ob.read()
		if err != nil {
			return nil, err
		}
		per, heap, err := ob.perStatus()
		if err != nil {
			return nil, err
		}
		res.Daemons = append(res.Daemons, daemonResult{Rank: i, PID: ob.pid, Idle: m, MallocsPerStatus: per, HeapPerStatus: heap})
	}

	trainers := make([]*trainer, 0, o.Nodes*o.Local)
	defer func() {
		for _, t := range trainers {
			t.c.Close()
		}
	}()
	for node := 0; node < o.Nodes; node++ {
		for local := 0; local < o.Local; local++ {
			t, err := dialTrainer(w.Sockets[node], node, local, o.Spin, o.DialTimeout)
			if err != nil {
				return res, err
			}
			trainers = append(trainers, t)
		}
	}
	progress("%d daemons (pids %s), %d trainers, %d allreduces of %d B each, sampling every %v",
		o.Nodes, pids(res.Daemons), len(trainers), o.Calls, o.Size, o.Sample)

	runCtx, stopTrainers := context.WithCancel(ctx)
	defer stopTrainers()
	errc := make(chan error, len(trainers))
	var wg sync.WaitGroup
	start := time.Now()
	for _, t := range trainers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errc <- t.run(runCtx, o.Calls, o.Size/4, o.CheckEvery)
		}()
	}
	allDone := make(chan struct{})
	go func() { wg.Wait(); close(allDone) }()

	callsDone := func() int64 {
		n := int64(o.Calls)
		for _, t := range trainers {
			n = min(n, t.done.Load())
		}
		return n
	}
	takeSample := func() error {
		s := sample{TSec: time.Since(start).Seconds(), Calls: callsDone()}
		for _, ob := range obs {
			m, err := ob.read()
			if err != nil {
				return err
			}
			s.Daemons = append(s.Daemons, m)
		}
		res.Samples = append(res.Samples, s)
		return nil
	}
	if err := takeSample(); err != nil {
		return res, err
	}

	tick := time.NewTicker(o.Sample)
	defer tick.Stop()
	var runErr error
	finished := false
	got := 0 // trainers' results received
	for !finished && runErr == nil {
		select {
		case <-tick.C:
			if err := takeSample(); err != nil {
				runErr = err
			} else {
				printProgress(res, o)
			}
		case <-allDone:
			finished = true
		case err := <-errc:
			got++
			if err != nil {
				runErr = err
				// A call that failed because a daemon died: say so first.
				select {
				case r := <-w.Exited:
					runErr = fmt.Errorf("%w (first failed call: %v)", w.Died(r), err)
				case <-time.After(500 * time.Millisecond):
				}
			}
		case r := <-w.Exited:
			runErr = w.Died(r)
		case <-ctx.Done():
			res.Interrupted = true
			runErr = fmt.Errorf("interrupted by a signal after %d calls", callsDone())
		}
	}
	res.ElapsedSec = time.Since(start).Seconds()
	if finished {
		// Trainers may have ended with an error as well as finished.
		for ; got < len(trainers); got++ {
			if err := <-errc; err != nil && runErr == nil {
				runErr = err
			}
		}
		if runErr == nil {
			if err := takeSample(); err != nil {
				runErr = err
			}
		}
		if runErr == nil {
			runErr = checkDaemonCounts(res.Samples[len(res.Samples)-1], o.Calls)
		}
	}
	res.CallsDone = callsDone()
	if runErr != nil {
		// Unblock trainers still in a call: their daemons go away.
		stopTrainers()
		w.Stop()
		select {
		case <-allDone:
		case <-time.After(stopGrace + 5*time.Second):
			progress("trainers still blocked after the daemons stopped; leaving them")
		}
	}
	hist := newHistogram()
	for _, t := range trainers {
		res.Checks += t.checks
		hist.merge(t.lat)
	}
	res.Latency = summarize(hist)
	if res.ElapsedSec > 0 {
		res.CallsPerSec = float64(res.CallsDone) / res.ElapsedSec
	}

	if runErr == nil {
		for i, ob := range obs {
			per, heap, rate, err := ob.quietMallocs(time.Second)
			if err != nil {
				runErr = err
				break
			}
			d := &res.Daemons[i]
			d.MallocsPerStatus, d.HeapPerStatus, d.QuietMallocsPerSec = per, heap, rate
		}
	}
	if runErr == nil && o.Settle > 0 {
		for _, t := range trainers {
			t.c.Close()
		}
		trainers = nil
		time.Sleep(o.Settle)
		for i, ob := range obs {
			m, err := ob.read()
			if err != nil {
				runErr = err
				break
			}
			res.Daemons[i].Detached = &m
		}
	}
	analyze(res, o)
	if runErr != nil {
		res.Error = runErr.Error()
	} else {
		ok = true
	}
	return res, runErr
}

// checkDaemonCounts: each daemon counted exactly the calls its trainers
// made, no more (a duplicate) and no fewer (a lost call).
func checkDaemonCounts(s sample, calls int) error {
	for i, m := range s.Daemons {
		for l, n := range m.Trainers {
			if n != uint64(calls) {
				return fmt.Errorf("daemon %d counts %d calls from local rank %d, which made %d", i, n, l, calls)
			}
		}
	}
	return nil
}

func pids(ds []daemonResult) string {
	var s []string
	for _, d := range ds {
		s = append(s, fmt.Sprint(d.PID))
	}
	return strings.Join(s, ",")
}

func summarize(h *histogram) latency {
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	l := latency{Calls: h.n, P50: us(h.quantile(0.5)), P99: us(h.quantile(0.99)), P999: us(h.quantile(0.999)), Max: us(h.max)}
	if h.n > 0 {
		l.Mean = us(h.sum) / float64(h.n)
	}
	return l
}

func printProgress(res *result, o options) {
	s := res.Samples[len(res.Samples)-1]
	rate := 0.0
	if s.TSec > 0 {
		rate = float64(s.Calls) / s.TSec
	}
	var b strings.Builder
	fmt.Fprintf(&b, "[%6.0fs] %9d calls %7.0f/s", s.TSec, s.Calls, rate)
	if rate > 0 && s.Calls < int64(o.Calls) {
		fmt.Fprintf(&b, " eta %4.0fs", float64(int64(o.Calls)-s.Calls)/rate)
	}
	for i, m := range s.Daemons {
		fmt.Fprintf(&b, " | d%d %s rss %.1fMiB fds %d gor %d heap %.1fMiB", i, m.Ring,
			float64(m.RSSBytes)/(1<<20), m.FDs, m.Goroutines, float64(m.HeapBytes)/(1<<20))
	}
	progress("%s", b.String())
}
