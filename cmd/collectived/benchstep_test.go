package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/collectived/collectived/config"
)

// A --tensors file: "name shape" lines, comments and blank lines
// skipped; what is not a tensor is refused with its line.
func TestParseTensors(t *testing.T) {
	ts, err := parseTensors(strings.NewReader("# a comment\n\nconv.weight 64x3x7x7\n  bn.bias   64  \n"), "f")
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 2 || ts[0].name != "conv.weight" || !slices.Equal(ts[0].shape, []uint64{64, 3, 7, 7}) || ts[0].count != 9408 ||
		ts[1].name != "bn.bias" || ts[1].count != 64 {
		t.Fatalf("parsed %+v", ts)
	}
	for _, tc := range []struct{ in, want string }{
		{"a 4\nb 2x2\na 1\n", "f:3: a again (first on line 1): names are unique"},
		{"a 4 extra\n", `f:1: want "name shape"`},
		{"a\n", `f:1: want "name shape"`},
		{"a 4x0\n", `f:1: a: shape "4x0": want 1 to 8 dimensions of at least 1`},
		{"a 4xb\n", `f:1: a: shape "4xb"`},
		{"a 1x1x1x1x1x1x1x1x1\n", "want 1 to 8 dimensions"},
		{"a 65536x65536x2\n", "more than 2^32 elements"},
		{"# nothing\n", "f: no tensors"},
		{strings.Repeat("n", 256) + " 4\n", "is 256 bytes, at most 255"},
	} {
		if _, err := parseTensors(strings.NewReader(tc.in), "f"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseTensors(%q): %v, want %q", tc.in, err, tc.want)
		}
	}
}

// bench/resnet50_shapes.txt is ResNet-50's parameters: 161 tensors,
// 25,557,032 elements.
func TestResNet50Shapes(t *testing.T) {
	ts, err := readTensors(filepath.Join("..", "..", "bench", "resnet50_shapes.txt"))
	if err != nil {
		t.Fatal(err)
	}
	s := step{tensors: ts}
	if len(ts) != 161 || s.elems() != 25557032 || ts[0].name != "conv1.weight" || ts[160].name != "fc.bias" {
		t.Fatalf("%d tensors of %d elements, first %s, last %s; want 161 of 25557032, conv1.weight to fc.bias",
			len(ts), s.elems(), ts[0].name, ts[len(ts)-1].name)
	}
}

// Each trainer's random order is a fresh permutation every step, its own
// (by world rank) and the same run after run; the file's order stays.
func TestStepOrder(t *testing.T) {
	const n = 161
	file := newStepOrder(n, false, 1, 0)
	for i := 0; i < 2; i++ {
		if seq := file.next(); !slices.IsSorted(seq) || len(seq) != n {
			t.Fatalf("file order, step %d: %v", i, seq)
		}
	}
	steps := func(rank int) [][]int {
		o := newStepOrder(n, true, 1, rank)
		var out [][]int
		for i := 0; i < 3; i++ {
			out = append(out, slices.Clone(o.next()))
		}
		return out
	}
	r0, r1 := steps(0), steps(1)
	for i, seq := range r0 {
		sorted := slices.Sorted(slices.Values(seq))
		for k, v := range sorted {
			if v != k {
				t.Fatalf("rank 0, step %d is no permutation of 0..%d: %v", i, n-1, seq)
			}
		}
		if slices.IsSorted(seq) || slices.Equal(seq, r1[i]) || i > 0 && slices.Equal(seq, r0[i-1]) {
			t.Errorf("step %d: rank 0's order %v, rank 1's %v, the step before %v: want each fresh and its own", i, seq[:8], r1[i][:8], r0[max(i-1, 0)][:8])
		}
	}
	if again := steps(0); !slices.EqualFunc(again, r0, slices.Equal) {
		t.Error("rank 0's orders differ from one run to the next with the same seed")
	}
}

// A step's many calls in flight raise the daemon's limit, unless the
// user's config sets it; another limits section is refused.
func TestStepConfig(t *testing.T) {
	def := config.DefaultMaxInFlight
	many := def + 100
	raised := fmt.Sprintf("limits:\n  max_in_flight: %d\n", many+def)
	for _, tc := range []struct {
		extra string
		calls int
		want  string
	}{
		{"", def, ""},
		{"", many, raised},
		{"ring:\n  streams: 2", many, "ring:\n  streams: 2\n" + raised},
		{"limits:\n  max_in_flight: 50000\n", many, "limits:\n  max_in_flight: 50000\n"},
	} {
		got, err := stepConfig(tc.extra, tc.calls)
		if err != nil || got != tc.want {
			t.Errorf("stepConfig(%q, %d) = %q, %v; want %q", tc.extra, tc.calls, got, err, tc.want)
		}
	}
	want := fmt.Sprintf("add max_in_flight: %d to it", many+def)
	if _, err := stepConfig("limits:\n  inline_bytes: 1024\n", many); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a limits section without max_in_flight: %v, want %q", err, want)
	}
}

// writeTensors writes a --tensors file of n small tensors and a large one
// (shared memory above the inline limit either way: every tensor lies in
// the step's segment).
func writeTensors(t *testing.T, n int) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("# test tensors\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "layer%d.weight %dx3\n", i, i%5+1)
	}
	b.WriteString("big.weight 256x128\n")
	path := filepath.Join(t.TempDir(), "tensors.txt")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// What does not go with --tensors is refused by name.
func TestBenchStepRefusals(t *testing.T) {
	file := writeTensors(t, 3)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--named"}, "--named goes with --tensors"},
		{[]string{"--concat"}, "--concat goes with --tensors"},
		{[]string{"--tensors", file, "--sizes", "4"}, "--sizes and --tensors"},
		{[]string{"--tensors", file, "--op", "allgather"}, "--op allgather and --tensors"},
		{[]string{"--tensors", file, "--in-flight", "2"}, "--in-flight and --tensors"},
		{[]string{"--tensors", file, "--between", "4"}, "--between and --tensors"},
		{[]string{"--tensors", file, "--ring-only"}, "--ring-only and --tensors"},
		{[]string{"--tensors", file, "--alternate-dtype", "bf16"}, "--alternate-dtype and --tensors"},
		{[]string{"--tensors", file, "--order", "random"}, "--order random needs --named"},
		{[]string{"--tensors", file, "--named", "--order", "sorted"}, `--order "sorted": want file or random`},
		{[]string{"--tensors", file, "--seed", "3"}, "--seed goes with --order random"},
		{[]string{"--tensors", filepath.Join(t.TempDir(), "none.txt")}, "--tensors: open"},
	} {
		_, err := runApp(t, append([]string{"bench"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("bench %v: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// bench --tensors --concat: a step of 71 calls in flight and the
// concatenation, in turn, in worlds of 2 x 1 and 2 x 2, every result
// checked; ordered calls, named calls in the file's order and named
// calls in each trainer's own random order.
func TestBenchStep(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worlds of daemons")
	}
	file := writeTensors(t, 70)
	want := int64(256 * 128 * 4)
	for i := 0; i < 70; i++ {
		want += int64((i%5 + 1) * 3 * 4)
	}
	for _, args := range [][]string{
		{"--local", "1", "--concat"},
		{"--local", "2", "--concat", "--named", "--order", "file"},
		{"--local", "2", "--concat", "--named"},
	} {
		rows, out := benchJSON(t, append([]string{"--nodes", "2", "--tensors", file, "--iters", "2"}, args...)...)
		if len(rows) != 2 {
			t.Fatalf("bench --tensors %v: %d rows, want 2:\n%s", args, len(rows), out)
		}
		named := slices.Contains(args, "--named")
		order := "file"
		if named && !slices.Contains(args, "file") {
			order = "random"
		}
		if r := rows[0]; r.Calls != 71 || r.Named != named || r.Order != order || r.Concat || r.Bytes != want || !r.Verified || r.Iters != 2 || r.Tensors != "tensors.txt" {
			t.Errorf("bench --tensors %v: the step's row %+v, want 71 calls of %d bytes, named %v", args, r, want, named)
		}
		if r := rows[1]; r.Calls != 1 || !r.Concat || r.Bytes != want || !r.Verified || r.Iters != 2 {
			t.Errorf("bench --tensors %v: the concatenation's row %+v, want 1 call of %d bytes", args, r, want)
		}
	}
}
