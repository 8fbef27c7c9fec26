package main

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/ipc"
)

func TestParseSizes(t *testing.T) {
	got, err := parseSizes("4, 64KiB,1MiB,2G")
	if err != nil || len(got) != 4 || got[0] != 4 || got[1] != 64<<10 || got[2] != 1<<20 || got[3] != 2<<30 {
		t.Fatalf("parseSizes = %v, %v", got, err)
	}
	for _, bad := range []string{"", "x", "-1", "5GiB", "1.5MiB"} {
		if _, err := parseSizes(bad); err == nil || !strings.Contains(err.Error(), "--sizes") {
			t.Errorf("parseSizes(%q) = %v, want an error naming --sizes", bad, err)
		}
	}
}

// Bad bench flags are refused, by name, before any daemon starts.
func TestBenchRefusesBadFlags(t *testing.T) {
	for want, args := range map[string][]string{
		"--nodes 0 x --local 1":            {"--nodes", "0"},
		"at most 64 trainers":              {"--nodes", "9", "--local", "8"},
		"--sizes":                          {"--sizes", "4,lots"},
		"unknown dtype \"complex64\"":      {"--dtype", "complex64"},
		"--op \"mean\": want a collective": {"--op", "mean"},
		"--iters 0":                        {"--iters", "0"},
		"--warmup -1: want 0 or more":      {"--warmup", "-1"},
		"--prewarm -1: want 0 or more":     {"--prewarm", "-1"},
		"--timeout 0s: want more":          {"--ring-only", "--timeout", "0s"},
		"--sidecar runs one ring rank per node and no trainers beside it: --local is 2, want 1": {"--sidecar", "--local", "2"},
		"--sidecar-block 0: want at least 1":                                                    {"--sidecar", "--sidecar-block", "0"},
		"--ring-only and --sidecar":                                                             {"--sidecar", "--ring-only"},
		"--trainer-cmd and --ring-only: --ring-only runs no trainers":                           {"--ring-only", "--trainer-cmd", "python3"},
		`--trainer-cmd "/nonexistent/py x": exec: "/nonexistent/py"`:                            {"--sizes", "4", "--trainer-cmd", "/nonexistent/py x"},
		"--trainer-cmd is empty: want a command":                                                {"--sizes", "4", "--trainer-cmd", " "},
		"--in-flight 0: want 1 to 64":                                                           {"--sizes", "4", "--in-flight", "0"},
		"--in-flight 65: want 1 to 64":                                                          {"--sizes", "4", "--in-flight", "65"},
		"--in-flight 2 and --ring-only: the ring engine alone takes one call at a time":         {"--ring-only", "--in-flight", "2"},
		"--in-flight 3 and --sidecar":                                                           {"--sidecar", "--in-flight", "3"},
	} {
		app := newApp()
		app.ExitErrHandler = func(*cli.Context, error) {} // report, do not os.Exit
		var out bytes.Buffer
		app.Writer, app.ErrWriter = &out, &out
		err := app.Run(append([]string{"collectived", "bench"}, args...))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("bench %v: %v, want an error saying %q", args, err, want)
		}
	}
}

// The hidden per-process commands check the counts their parent gives
// them as bench does its own.
func TestWorkerCommandsRefuseBadCounts(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench-trainer", "--socket", "/nonexistent", "--job", "j", "--sizes", "4", "--prewarm", "-1"}, "--prewarm -1: want 0 or more"},
		{[]string{"bench-trainer", "--socket", "/nonexistent", "--job", "j", "--sizes", "4", "--warmup", "-2"}, "--warmup -2: want 0 or more"},
		{[]string{"bench-ring", "--config", "/nonexistent", "--sizes", "4", "--iters", "0"}, "--iters 0: want at least 1"},
		{[]string{"bench-trainer", "--socket", "/nonexistent", "--job", "j", "--sizes", "4", "--in-flight", "0"}, "--in-flight 0: want 1 to 64"},
	} {
		if _, err := runApp(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error saying %q", tc.args, err, tc.want)
		}
	}
}

func TestVersion(t *testing.T) {
	app := newApp()
	var out bytes.Buffer
	app.Writer = &out
	if err := app.Run([]string{"collectived", "version"}); err != nil || !strings.Contains(out.String(), fmt.Sprintf("client protocol %d to %d", ipc.MinVersion, ipc.Version)) {
		t.Fatalf("version: %v %q", err, out.String())
	}
}

// f32sum is a float32 sum measurement as world rank 0, on buf.
func f32sum(buf []byte, world, iters, warmup int) measurement {
	w := workload{coll: collective.OpAllReduce, dt: collective.Float32, op: collective.Sum}
	return measurement{chk: newCheck(w, 0, world, uint64(len(buf)/4), []slot{{in: buf}}), iters: iters, warmup: warmup}
}

// The bench commands check their results: a call that leaves the buffer
// as it was (here, no allreduce at all in a world of 2) is caught, by
// element, before any timing is reported; a working one passes.
func TestMeasureChecksResults(t *testing.T) {
	buf := make([]byte, 16)
	nothing := f32sum(buf, 2, 3, 1)
	nothing.call = func() error { return nil }
	_, err := nothing.run()
	if err == nil || !strings.Contains(err.Error(), "wrong result at element 0") {
		t.Fatalf("measure of a call that does nothing: %v, want a wrong result at element 0", err)
	}
	// In a world of 1 the buffer itself is the sum.
	one := f32sum(buf, 1, 3, 1)
	one.call = func() error { return nil }
	times, err := one.run()
	if err != nil || len(times) != 3 {
		t.Fatalf("measure in a world of one: %v, %d times, want 3", err, len(times))
	}
	boom := errors.New("boom")
	failing := f32sum(buf, 1, 3, 1)
	failing.call = func() error { return boom }
	if _, err := failing.run(); !errors.Is(err, boom) {
		t.Fatalf("measure of a failing call: %v, want its error", err)
	}
}

// With several buffers in flight every one is checked, and a wrong one
// is named by its place among them.
func TestMeasureChecksEveryBufferInFlight(t *testing.T) {
	bufs := [][]byte{make([]byte, 8), make([]byte, 8), make([]byte, 8)}
	slots := []slot{{in: bufs[0]}, {in: bufs[1]}, {in: bufs[2]}}
	w := workload{coll: collective.OpAllReduce, dt: collective.Float32, op: collective.Sum}
	m := measurement{chk: newCheck(w, 0, 2, 2, slots), iters: 2, warmup: 1}
	// A world of 2 as rank 0 (values 1, 2): the sum is 3 and 6. The call
	// does it for all buffers but the second.
	m.call = func() error {
		for i, b := range bufs {
			if i != 1 {
				collective.Float32.Put(b[0:], 3)
				collective.Float32.Put(b[4:], 6)
			}
		}
		return nil
	}
	_, err := m.run()
	if err == nil || !strings.Contains(err.Error(), "buffer 2 of 3 in flight: wrong result at element 0") {
		t.Fatalf("measure with the second of three buffers left alone: %v, want it named", err)
	}
	m.call = func() error {
		for _, b := range bufs {
			collective.Float32.Put(b[0:], 3)
			collective.Float32.Put(b[4:], 6)
		}
		return nil
	}
	if times, err := m.run(); err != nil || len(times) != 2 {
		t.Fatalf("measure with every buffer reduced: %v, %d times, want 2", err, len(times))
	}
}

// --prewarm: the first size of a sweep makes n one-element calls before
// its checked call, the others none; a failing one is named as such and
// stops the size before anything is timed.
func TestPrewarmRunsBeforeTheFirstSizeOnly(t *testing.T) {
	var order []string
	prewarm := prewarmer(4, func() error {
		order = append(order, "pre")
		return nil
	})
	call := func() error { order = append(order, "call"); return nil }
	buf := make([]byte, 8)
	for i := range 2 {
		m := f32sum(buf, 1, 1, 0)
		m.prewarm, m.call = firstOnly(i, prewarm), call
		if _, err := m.run(); err != nil {
			t.Fatal(err)
		}
	}
	// Size 0: 4 prewarm calls, the checked call, 1 timed; size 1: checked, timed.
	if got, want := strings.Join(order, " "), "pre pre pre pre call call call call"; got != want {
		t.Fatalf("calls made: %q, want %q", got, want)
	}
	if prewarmer(0, call) != nil {
		t.Error("prewarmer(0) makes calls; want none (nil)")
	}
	boom := errors.New("boom")
	sized := false // the size's own calls: the checked one and the timed ones
	m := f32sum(buf, 1, 1, 0)
	m.prewarm = prewarmer(2, func() error { return boom })
	m.call = func() error { sized = true; return nil }
	_, err := m.run()
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "prewarm: boom") || sized {
		t.Fatalf("a failing prewarm: %v (the size's calls made: %v), want \"prewarm: boom\" and none", err, sized)
	}
}

// --between: its call runs before every warmup and timed call, never
// before the checked one, and never inside the timing; a failing one is
// named as --between's.
func TestMeasureBetween(t *testing.T) {
	var order []string
	call := func() error { order = append(order, "call"); return nil }
	between := func() error { order = append(order, "between"); return nil }
	buf := make([]byte, 8)
	m := f32sum(buf, 1, 2, 1)
	m.between, m.call = between, call
	times, err := m.run()
	if err != nil || len(times) != 2 {
		t.Fatalf("measure: %v, %d times, want 2", err, len(times))
	}
	// The checked call, then warmup 1 and timed 2, each after a between.
	if got, want := strings.Join(order, " "), "call between call between call between call"; got != want {
		t.Fatalf("calls made: %q, want %q", got, want)
	}
	boom := errors.New("boom")
	m.between = func() error { return boom }
	_, err = m.run()
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "the call of --between's size: boom") {
		t.Fatalf("a failing between call: %v, want it named", err)
	}
}

// --between takes one size with units; zero, a list or garbage is refused
// with the flag named, before anything starts.
func TestBetweenFlag(t *testing.T) {
	if n, err := parseSize("--between", "16KiB"); err != nil || n != 16<<10 {
		t.Fatalf("parseSize(16KiB) = %d, %v", n, err)
	}
	for _, tc := range []struct{ arg, want string }{
		{"0", `--between: "0": want at least one byte (or leave it unset)`},
		{"4,8", `--between: "4,8" is not a size between 0 and 4GiB`},
		{"lots", `--between: "lots" is not a size between 0 and 4GiB`},
	} {
		_, err := runApp(t, "bench", "--sizes", "4", "--between", tc.arg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("bench --between %s: %v, want %q", tc.arg, err, tc.want)
		}
	}
}
