package main

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseFlagsDefaults(t *testing.T) {
	o, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.Calls != 1000000 || o.Nodes != 2 || o.Local != 2 || o.Size != 4 || o.Sample != 5*time.Second || o.CheckEvery != 10000 {
		t.Fatalf("defaults = %+v", o)
	}
}

func TestParseFlagsErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--calls", "0"}, "--calls 0"},
		{[]string{"--nodes", "0"}, "--nodes 0"},
		{[]string{"--local", "65"}, "--local 65"},
		{[]string{"--nodes", "64", "--local", "8"}, "512 trainers"},
		{[]string{"--size", "6"}, "--size 6"},
		{[]string{"--size", "0"}, "--size 0"},
		{[]string{"--sample", "1ms"}, "--sample 1ms"},
		{[]string{"--warmup", "1"}, "--warmup 1"},
		{[]string{"--warmup", "-0.5"}, "--warmup -0.5"},
		{[]string{"--check-every", "0"}, "--check-every 0"},
		{[]string{"--settle", "-1s"}, "--settle -1s"},
		{[]string{"--bin", "/nonexistent/collectived"}, "/nonexistent/collectived"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"--calls", "many"}, "invalid value"},
	} {
		_, err := parseFlags(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseFlags(%q) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}

// TestExpectedIsTheSum: the check value is exactly the float32 sum of
// every rank's value, for the largest world the flags allow, and it
// differs between consecutive calls.
func TestExpectedIsTheSum(t *testing.T) {
	for _, size := range []int{1, 4, 256} {
		for _, k := range []int{0, 1, 255, 256, 999999} {
			for j := 0; j < 9; j++ {
				var sum float32
				for r := 0; r < size; r++ {
					sum += value(r, k, j)
				}
				if want := expected(size, k, j); sum != want {
					t.Fatalf("size %d call %d element %d: sum %v, expected() %v", size, k, j, sum, want)
				}
				if want := expected(size, k, j); want >= 1<<24 {
					t.Fatalf("size %d: %v is past float32's exact integers", size, want)
				}
			}
			if expected(size, k, 0) == expected(size, k+1, 0) {
				t.Fatalf("size %d: calls %d and %d expect the same sum", size, k, k+1)
			}
		}
	}
}

func TestFitLine(t *testing.T) {
	xs := []float64{0, 1e5, 2e5, 3e5}
	ys := []float64{10, 12, 14, 16} // +2 per 100k calls
	f := fitLine(xs, ys)
	if math.Abs(f.SlopePer100k-2) > 1e-9 || math.Abs(f.Projected-6) > 1e-9 {
		t.Fatalf("slope %v projected %v, want 2 and 6", f.SlopePer100k, f.Projected)
	}
	if f.First != 10 || f.Last != 16 || f.Min != 10 || f.Max != 16 || f.Change != 6 || f.Samples != 4 {
		t.Fatalf("figures %+v", f)
	}
	flat := fitLine(xs, []float64{5, 7, 5, 7})
	if math.Abs(flat.SlopePer100k-0.4) > 1e-9 {
		t.Fatalf("sawtooth slope %v, want 0.4", flat.SlopePer100k)
	}
	if f := fitLine([]float64{3, 3}, []float64{1, 2}); f.SlopePer100k != 0 {
		t.Fatalf("no spread in x: slope %v, want 0", f.SlopePer100k)
	}
	if f := fitLine(nil, nil); f.Samples != 0 {
		t.Fatalf("empty: %+v", f)
	}
}

func TestAnalyzeFlat(t *testing.T) {
	o := options{Calls: 400000, Warmup: 0.25}
	res := &result{Daemons: []daemonResult{{MallocsPerStatus: 100, HeapPerStatus: 4096}}}
	for i := 0; i <= 8; i++ {
		calls := int64(i * 50000)
		m := metrics{RSSBytes: 10 << 20, FDs: 17, Goroutines: 16, Mallocs: uint64(1000 + 100*i), HeapBytes: uint64(5<<20 + 4096*i)}
		if i < 2 {
			m.FDs = 30 // warm-up: left out of the fit
		}
		if i >= 5 {
			m.Goroutines = 17 // one goroutine more from then on: a trend
		}
		res.Samples = append(res.Samples, sample{TSec: float64(i), Calls: calls, Daemons: []metrics{m}})
	}
	analyze(res, o)
	if res.WarmupCalls != 100000 {
		t.Fatalf("warm-up %d calls, want 100000", res.WarmupCalls)
	}
	got := map[string]fit{}
	for _, f := range res.Daemons[0].Fits {
		got[f.Metric] = f
	}
	if f := got["fds"]; !f.Flat || f.Samples != 7 {
		t.Errorf("fds: %+v, want flat over 7 samples", f)
	}
	if f := got["rss_bytes"]; !f.Flat {
		t.Errorf("rss: %+v, want flat", f)
	}
	if f := got["goroutines"]; f.Flat {
		t.Errorf("goroutines: %+v, want not flat", f)
	}
	// All mallocs came from the status reads: none per call.
	if pc := res.Daemons[0].MallocsPerCall; math.Abs(pc) > 1e-9 {
		t.Errorf("mallocs per call %v, want 0", pc)
	}
	if pc := res.Daemons[0].HeapPerCall; math.Abs(pc) > 1e-9 {
		t.Errorf("heap bytes per call %v, want 0", pc)
	}
	if math.Abs(res.SteadyCallsPerSec-50000) > 1e-6 {
		t.Errorf("steady rate %v, want 50000", res.SteadyCallsPerSec)
	}
}

func TestHistogram(t *testing.T) {
	h := newHistogram()
	for i := 1; i <= 100; i++ {
		h.add(time.Duration(i) * time.Microsecond)
	}
	h.add(time.Second) // past the last bucket
	if q := h.quantile(0.5); q != 52*time.Microsecond {
		t.Errorf("median %v, want 52µs (bucket upper edge)", q)
	}
	if q := h.quantile(1); q != time.Second {
		t.Errorf("max quantile %v, want 1s", q)
	}
	o := newHistogram()
	o.merge(h)
	if o.n != 101 || o.max != time.Second {
		t.Errorf("merged n %d max %v", o.n, o.max)
	}
	if q := newHistogram().quantile(0.5); q != 0 {
		t.Errorf("empty median %v", q)
	}
}

func TestCheckDaemonCounts(t *testing.T) {
	s := sample{Daemons: []metrics{{Trainers: []uint64{5, 5}}, {Trainers: []uint64{5, 4}}}}
	err := checkDaemonCounts(s, 5)
	if err == nil || !strings.Contains(err.Error(), "daemon 1 counts 4 calls from local rank 1") {
		t.Fatalf("err = %v", err)
	}
	s.Daemons[1].Trainers[1] = 5
	if err := checkDaemonCounts(s, 5); err != nil {
		t.Fatal(err)
	}
}
