package main

import (
	"math"
)

// fit is one metric of one daemon after warm-up.
type fit struct {
	Metric  string  `json:"metric"`
	Unit    string  `json:"unit"`
	Samples int     `json:"samples"`
	First   float64 `json:"first"`
	Last    float64 `json:"last"`
	Min     float64 `json:"min"`
	Max     float64 `json:"max"`
	Change  float64 `json:"change"` // last - first
	// SlopePer100k is the least-squares slope against calls done, in
	// units per 100,000 calls.
	SlopePer100k float64 `json:"slope_per_100k_calls"`
	// Projected is the slope times the calls after warm-up: how much the
	// trend alone added over the measured span.
	Projected float64 `json:"projected_over_span"`
	// Tolerance is the largest Projected still called flat; 0 for
	// counters (mallocs), which are expected to grow with status reads.
	Tolerance float64 `json:"tolerance,omitempty"`
	Flat      bool    `json:"flat"`
}

// metricDef says how to read and judge one metric.
type metricDef struct {
	name, unit string
	tol        float64
	get        func(metrics) float64
}

var metricDefs = []metricDef{
	{"rss_bytes", "B", 1 << 20, func(m metrics) float64 { return float64(m.RSSBytes) }},
	{"heap_bytes", "B", 1 << 20, func(m metrics) float64 { return float64(m.HeapBytes) }},
	{"fds", "fds", 0.5, func(m metrics) float64 { return float64(m.FDs) }},
	{"goroutines", "goroutines", 0.5, func(m metrics) float64 { return float64(m.Goroutines) }},
	{"memfds", "fds", 0.5, func(m metrics) float64 { return float64(m.Memfds) }},
	{"mallocs", "allocs", 0, func(m metrics) float64 { return float64(m.Mallocs) }},
}

// analyze fits every metric of every daemon over the samples taken after
// the warm-up.
func analyze(res *result, o options) {
	res.WarmupCalls = int64(math.Ceil(o.Warmup * float64(o.Calls)))
	var steady []sample
	for _, s := range res.Samples {
		if s.Calls >= res.WarmupCalls {
			steady = append(steady, s)
		}
	}
	if len(steady) >= 2 {
		a, b := steady[0], steady[len(steady)-1]
		if b.TSec > a.TSec {
			res.SteadyCallsPerSec = float64(b.Calls-a.Calls) / (b.TSec - a.TSec)
		}
	}
	for i := range res.Daemons {
		d := &res.Daemons[i]
		d.Fits = nil
		for _, def := range metricDefs {
			xs := make([]float64, 0, len(steady))
			ys := make([]float64, 0, len(steady))
			for _, s := range steady {
				if i < len(s.Daemons) {
					xs = append(xs, float64(s.Calls))
					ys = append(ys, def.get(s.Daemons[i]))
				}
			}
			f := fitLine(xs, ys)
			f.Metric, f.Unit, f.Tolerance = def.name, def.unit, def.tol
			f.Flat = def.tol > 0 && f.Samples >= 3 && math.Abs(f.Projected) <= def.tol
			d.Fits = append(d.Fits, f)
			if f.Samples < 2 {
				continue
			}
			span := xs[len(xs)-1] - xs[0]
			if span <= 0 {
				continue
			}
			// Status reads happened by time, between the first and the
			// last steady sample: Samples-1 reads, not one per call.
			reads := float64(f.Samples - 1)
			switch def.name {
			case "mallocs":
				d.MallocsPerCall = (f.Projected - d.MallocsPerStatus*reads) / span
			case "heap_bytes":
				d.HeapPerCall = (f.Projected - d.HeapPerStatus*reads) / span
			}
		}
	}
}

// fitLine is ordinary least squares of ys against xs, plus the plain
// figures of ys.
func fitLine(xs, ys []float64) fit {
	f := fit{Samples: len(ys)}
	if len(ys) == 0 {
		return f
	}
	f.First, f.Last = ys[0], ys[len(ys)-1]
	f.Min, f.Max = ys[0], ys[0]
	for _, y := range ys {
		f.Min = math.Min(f.Min, y)
		f.Max = math.Max(f.Max, y)
	}
	f.Change = f.Last - f.First
	if len(ys) < 2 {
		return f
	}
	var mx, my float64
	for i := range xs {
		mx += xs[i]
		my += ys[i]
	}
	n := float64(len(xs))
	mx /= n
	my /= n
	var sxy, sxx float64
	for i := range xs {
		sxy += (xs[i] - mx) * (ys[i] - my)
		sxx += (xs[i] - mx) * (xs[i] - mx)
	}
	if sxx == 0 {
		return f
	}
	slope := sxy / sxx
	f.SlopePer100k = slope * 1e5
	f.Projected = slope * (xs[len(xs)-1] - xs[0])
	return f
}
