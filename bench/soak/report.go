package main

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
)

// printReport writes the human-readable result.
func printReport(w io.Writer, res *result) {
	o := res.Options
	fmt.Fprintf(w, "collectived soak: %d nodes x %d trainers, %d allreduces of %d B (float32 sum), status every %v\n",
		o.Nodes, o.Local, o.Calls, o.Size, o.Sample)
	m := res.Machine
	fmt.Fprintf(w, "machine: nproc %d, kernel %s, %s, load average %s at start, %s at end; %s\n",
		m.NProc, m.Kernel, m.GoVersion, m.LoadAvgStart, m.LoadAvgFinish, res.Started.Format("2006-01-02 15:04 MST"))
	status := "ok"
	if res.Error != "" {
		status = "FAILED"
	}
	fmt.Fprintf(w, "run %s: %d calls in %.1f s, %.0f calls/s (%.0f/s after warm-up); %d exact-sum checks passed\n",
		status, res.CallsDone, res.ElapsedSec, res.CallsPerSec, res.SteadyCallsPerSec, res.Checks)
	l := res.Latency
	fmt.Fprintf(w, "latency of one allreduce, all trainers (%d calls): median %.0f µs, mean %.0f µs, p99 %.0f µs, p99.9 %.0f µs, max %.1f ms\n",
		l.Calls, l.P50, l.Mean, l.P99, l.P999, l.Max/1000)
	nSteady := 0
	if len(res.Daemons) > 0 && len(res.Daemons[0].Fits) > 0 {
		nSteady = res.Daemons[0].Fits[0].Samples
	}
	fmt.Fprintf(w, "fit: least squares against calls done, over the %d samples after the first %d calls (warm-up)\n",
		nSteady, res.WarmupCalls)
	for _, d := range res.Daemons {
		fmt.Fprintf(w, "\ndaemon %d (pid %d)\n", d.Rank, d.PID)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "metric\tfirst\tlast\tmin\tmax\tchange\tslope per 100k calls\tflat\t")
		for _, f := range d.Fits {
			flat := "yes"
			switch {
			case f.Tolerance == 0:
				flat = "-"
			case f.Samples < 3:
				flat = "too few samples"
			case !f.Flat:
				flat = "NO"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", f.Metric,
				val(f.Unit, f.First, false), val(f.Unit, f.Last, false), val(f.Unit, f.Min, false), val(f.Unit, f.Max, false),
				val(f.Unit, f.Change, true), slope(f.Unit, f.SlopePer100k), flat)
		}
		tw.Flush()
		fmt.Fprintf(w, "with the status reads taken out: %.2g mallocs and %.2g heap bytes per call (one status read allocates %.0f times, %s; quiet, the daemon allocates %.1f times/s)\n",
			d.MallocsPerCall, d.HeapPerCall, d.MallocsPerStatus, bytesString(d.HeapPerStatus), d.QuietMallocsPerSec)
		if dt := d.Detached; dt != nil {
			fmt.Fprintf(w, "idle before trainers -> %v after they left: fds %d -> %d, goroutines %d -> %d, memfds %d -> %d, rss %s -> %s, heap %s -> %s\n",
				o.Settle, d.Idle.FDs, dt.FDs, d.Idle.Goroutines, dt.Goroutines, d.Idle.Memfds, dt.Memfds,
				val("B", float64(d.Idle.RSSBytes), false), val("B", float64(dt.RSSBytes), false),
				val("B", float64(d.Idle.HeapBytes), false), val("B", float64(dt.HeapBytes), false))
		}
	}
	if res.Error != "" {
		fmt.Fprintf(w, "\nerror: %s\n", res.Error)
	}
}

// val formats a value of unit; signed adds a + to positive values.
func val(unit string, v float64, signed bool) string {
	sign := ""
	if signed && v > 0 {
		sign = "+"
	}
	if unit == "B" {
		return sign + bytesString(v)
	}
	return sign + trimFloat(v)
}

func slope(unit string, v float64) string {
	sign := ""
	if v > 0 {
		sign = "+"
	}
	if unit == "B" {
		return sign + bytesString(v)
	}
	return fmt.Sprintf("%s%.3g", sign, v)
}

func bytesString(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1<<20:
		return fmt.Sprintf("%.2f MiB", v/(1<<20))
	case a >= 1<<10:
		return fmt.Sprintf("%.1f KiB", v/(1<<10))
	default:
		return fmt.Sprintf("%.0f B", v)
	}
}

func trimFloat(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return fmt.Sprintf("%.0f", v)
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
}
