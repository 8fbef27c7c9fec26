package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/collectived/collectived/collective"
)

// asMainEnv makes this test binary run its command line as collectived's
// main does (TestMain): `collectived bench` starts its daemons and
// trainers from os.Executable(), which in a test is this binary.
const asMainEnv = "COLLECTIVED_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// --op names a collective, or as before an allreduce's reduce op; --reduce
// goes with the collectives that reduce, and a contradiction or an
// unknown name is refused with the flags named.
func TestParseCollective(t *testing.T) {
	for _, tc := range []struct {
		op, reduce string
		set        bool
		coll       collective.Op
		r          collective.ReduceOp
		err        string
	}{
		{"allreduce", "sum", false, collective.OpAllReduce, collective.Sum, ""},
		{"allreduce", "max", true, collective.OpAllReduce, collective.Max, ""},
		{"sum", "sum", false, collective.OpAllReduce, collective.Sum, ""},
		{"avg", "sum", false, collective.OpAllReduce, collective.Avg, ""},
		{"prod", "prod", true, collective.OpAllReduce, collective.Prod, ""},
		{"allgather", "sum", false, collective.OpAllGather, collective.ReduceNone, ""},
		{"reducescatter", "min", true, collective.OpReduceScatter, collective.Min, ""},
		{"reduce_scatter", "sum", false, collective.OpReduceScatter, collective.Sum, ""},
		{"reduce", "avg", true, collective.OpReduce, collective.Avg, ""},
		{"broadcast", "sum", false, collective.OpBroadcast, collective.ReduceNone, ""},
		{"broadcast", "max", true, 0, 0, "--reduce max: broadcast reduces nothing; leave --reduce out"},
		{"allgather", "sum", true, 0, 0, "--reduce sum: allgather reduces nothing"},
		{"sum", "max", true, 0, 0, "--op sum is an allreduce with reduce op sum, and --reduce says max"},
		{"reduce", "mean", true, 0, 0, `--reduce: unknown reduce op "mean"`},
		{"gather", "sum", false, 0, 0, `--op "gather": want a collective (allreduce, allgather, reducescatter, reduce, broadcast) or, for an allreduce, a reduce op`},
	} {
		coll, r, err := parseCollective(tc.op, tc.reduce, tc.set)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("--op %s --reduce %s (set %v): %v, want an error saying %q", tc.op, tc.reduce, tc.set, err, tc.err)
			}
			continue
		}
		if err != nil || coll != tc.coll || r != tc.r {
			t.Errorf("--op %s --reduce %s (set %v) = %v %v %v, want %v %v", tc.op, tc.reduce, tc.set, coll, r, err, tc.coll, tc.r)
		}
	}
}

// Bad --op, --reduce and --dtype combinations are refused by bench
// before anything starts, naming the flags.
func TestBenchRefusesBadOps(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--op", "alltoall"}, `bench: --op "alltoall": want a collective`},
		{[]string{"--op", "allgather", "--reduce", "sum"}, "--reduce sum: allgather reduces nothing"},
		{[]string{"--op", "reduce", "--dtype", "bytes"}, "--op reduce --dtype bytes: reduce cannot reduce untyped bytes"},
		{[]string{"--op", "reducescatter", "--reduce", "avg", "--dtype", "int8"}, "avg needs a float dtype, got int8"},
		{[]string{"--op", "allgather", "--ring-only"}, "--op allgather and --ring-only: the ring engine alone measures allreduce only"},
		{[]string{"--op", "broadcast", "--sidecar"}, "--op broadcast and --sidecar: the ring engine alone measures allreduce only"},
		{[]string{"--op", "reduce", "--trainer-cmd", "python3"}, "--op reduce and --trainer-cmd: trainers of --trainer-cmd measure allreduce only"},
	} {
		_, err := runApp(t, append([]string{"bench", "--sizes", "4"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("bench %v: %v, want an error saying %q", tc.args, err, tc.want)
		}
	}
	_, err := runApp(t, "bench-ring", "--config", "/nonexistent", "--sizes", "4", "--op", "allgather")
	if err == nil || !strings.Contains(err.Error(), "the ring engine alone measures allreduce only") {
		t.Errorf("bench-ring --op allgather: %v", err)
	}
}

// Sizes and bandwidths by NCCL's conventions: a reduce_scatter's input is
// a multiple of the world size; allgather's algbw counts the gathered
// vector; busbw is algbw x 2(W-1)/W, (W-1)/W or 1.
func TestSizesAndBusbw(t *testing.T) {
	f32 := func(coll collective.Op) workload {
		w := workload{coll: coll, dt: collective.Float32}
		if coll.Reduces() {
			w.op = collective.Sum
		}
		return w
	}
	if n := f32(collective.OpReduceScatter).count(100, 3); n != 24 {
		t.Errorf("reduce_scatter count of 100 bytes of float32 in a world of 3 = %d, want 24", n)
	}
	if n := f32(collective.OpReduceScatter).count(4, 3); n != 3 {
		t.Errorf("reduce_scatter count of 4 bytes in a world of 3 = %d, want 3 (one per rank)", n)
	}
	if n := f32(collective.OpAllGather).count(2, 3); n != 1 {
		t.Errorf("allgather count of 2 bytes = %d, want 1", n)
	}
	res := sizeResult{Bytes: 1000, TimesNS: []int64{1000, 1000, 1000}} // 1 GB/s of the input
	for _, tc := range []struct {
		coll       collective.Op
		total      int64
		algbw, bus float64
	}{
		{collective.OpAllReduce, 1000, 1, 2 * 3.0 / 4},
		{collective.OpAllGather, 4000, 4, 4 * 3.0 / 4},
		{collective.OpReduceScatter, 1000, 1, 3.0 / 4},
		{collective.OpReduce, 1000, 1, 1},
		{collective.OpBroadcast, 1000, 1, 1},
	} {
		r := summarize(res, 2, 2, f32(tc.coll))
		if r.TotalBytes != tc.total || math.Abs(r.AlgBWGBs-tc.algbw) > 1e-9 || math.Abs(r.BusBWGBs-tc.bus) > 1e-9 || r.Collective != tc.coll.String() {
			t.Errorf("%s in a world of 4: total %d, algbw %v, busbw %v (%s), want %d, %v, %v", tc.coll, r.TotalBytes, r.AlgBWGBs, r.BusBWGBs, r.Collective, tc.total, tc.algbw, tc.bus)
		}
		if (r.Root != nil) != tc.coll.Rooted() || (r.Op != "") != tc.coll.Reduces() {
			t.Errorf("%s: root %v, op %q", tc.coll, r.Root, r.Op)
		}
	}
}

// simulate does what the daemon does with every rank's filled slot, by a
// plain loop over elements read as float64: ranks[r] is rank r's check.
func simulate(ranks []*check) {
	w, world := ranks[0].w, len(ranks)
	es, n := w.dt.Size(), ranks[0].count
	get := func(r, i int) float64 { return w.dt.Get(ranks[r].slots[0].in[i*es:]) }
	fold := func(i int) float64 {
		acc := get(0, i)
		for r := 1; r < world; r++ {
			x := get(r, i)
			switch w.op {
			case collective.Sum, collective.Avg:
				acc += x
			case collective.Prod:
				acc *= x
			case collective.Max:
				acc = max(acc, x)
			case collective.Min:
				acc = min(acc, x)
			}
		}
		if !w.dt.Float() {
			return wrapInt(w.dt, int64(acc))
		}
		if w.op == collective.Avg {
			acc = float64(float32(acc) / float32(world))
		}
		return acc
	}
	out := make([][]byte, world)
	for r := range ranks {
		s := ranks[r].slots[0]
		switch w.coll {
		case collective.OpAllGather:
			out[r] = make([]byte, n*world*es)
			for b := 0; b < world; b++ {
				copy(out[r][b*n*es:], ranks[b].slots[0].in)
			}
		case collective.OpBroadcast:
			out[r] = append([]byte(nil), ranks[benchRoot].slots[0].in...)
		case collective.OpReduce:
			out[r] = append([]byte(nil), s.in...)
			if r == benchRoot {
				for i := 0; i < n; i++ {
					w.dt.Put(out[r][i*es:], fold(i))
				}
			}
		case collective.OpReduceScatter:
			m := n / world
			out[r] = make([]byte, m*es)
			for i := 0; i < m; i++ {
				w.dt.Put(out[r][i*es:], fold(r*m+i))
			}
		default:
			out[r] = make([]byte, n*es)
			for i := 0; i < n; i++ {
				w.dt.Put(out[r][i*es:], fold(i))
			}
		}
	}
	for r := range ranks {
		copy(ranks[r].slots[0].result(), out[r])
	}
}

// Every collective's check, on every dtype and reduce op it takes, in
// worlds of 1 to 5: what the collective makes of the ranks' known inputs
// passes; a result off by one element, or left as it was, is caught and
// the element named.
func TestChecksOfEveryCollective(t *testing.T) {
	dtypes := []collective.DType{collective.Float32, collective.Float64, collective.Int32, collective.Int64, collective.Bytes,
		collective.Float16, collective.BFloat16, collective.Int8, collective.Uint8}
	var cases []workload
	for _, coll := range []collective.Op{collective.OpAllReduce, collective.OpAllGather, collective.OpReduceScatter, collective.OpReduce, collective.OpBroadcast} {
		for _, dt := range dtypes {
			ops := []collective.ReduceOp{collective.ReduceNone}
			if coll.Reduces() {
				ops = []collective.ReduceOp{collective.Sum, collective.Prod, collective.Max, collective.Min, collective.Avg}
			}
			for _, op := range ops {
				w := workload{coll: coll, dt: dt, op: op}
				if w.desc(0).Validate(1) == nil {
					cases = append(cases, w)
				}
			}
		}
	}
	for _, w := range cases {
		for _, world := range []int{1, 2, 3, 5} {
			// Long enough to hold more than a period, with a tail.
			count := w.count(int64((benchPeriod+13)*world*w.dt.Size()), world)
			name := fmt.Sprintf("%s in a world of %d", w, world)
			ranks := make([]*check, world)
			for r := range ranks {
				s := slot{in: make([]byte, int(count)*w.dt.Size())}
				if nout := w.outBytes(count, world); nout > 0 {
					s.out = make([]byte, nout)
				}
				ranks[r] = newCheck(w, r, world, count, []slot{s})
				ranks[r].fill()
			}
			simulate(ranks)
			for r, k := range ranks {
				if err := k.verify(); err != nil {
					t.Fatalf("%s, rank %d: %v", name, r, err)
				}
			}
			// One element of the last rank's result wrong, past a period.
			last := ranks[world-1]
			got := last.slots[0].result()
			e := (len(got)/w.dt.Size() - 3)
			orig := w.dt.Get(got[e*w.dt.Size():])
			w.dt.Put(got[e*w.dt.Size():], orig+100)
			if w.dt.Get(got[e*w.dt.Size():]) == orig { // a type that cannot hold it: change a bit
				got[e*w.dt.Size()] ^= 1
			}
			if err := last.verify(); err == nil || !strings.Contains(err.Error(), "wrong result at element "+strconv.Itoa(e)) {
				t.Errorf("%s: one wrong element %d: %v", name, e, err)
			}
			// A call that does nothing: right only where the buffer is
			// the result already (reduce's other ranks, broadcast's root);
			// caught wherever it must differ.
			for r, k := range ranks {
				k.fill()
				err := k.verify()
				root := r == benchRoot
				right := w.coll == collective.OpReduce && !root || w.coll == collective.OpBroadcast && root
				wrong := w.coll == collective.OpAllGather || w.coll == collective.OpReduceScatter ||
					world > 1 && (w.coll == collective.OpBroadcast && !root ||
						w.op == collective.Sum && (w.coll == collective.OpAllReduce || w.coll == collective.OpReduce && root))
				if right && err != nil || wrong && err == nil {
					t.Errorf("%s, rank %d: a call that did nothing: %v", name, r, err)
				}
			}
		}
	}
}

// benchJSON runs collectived bench with args and the test binary as its
// daemons and trainers; it must succeed. It returns the rows and all that
// was printed.
func benchJSON(t *testing.T, args ...string) ([]benchRow, string) {
	t.Helper()
	t.Setenv(asMainEnv, "1")
	out, err := runApp(t, append([]string{"bench", "--json", "--warmup", "1", "--prewarm", "20", "--timeout", "5m"}, args...)...)
	if err != nil {
		t.Fatalf("bench %v: %v\n%s", args, err, out)
	}
	var rows []benchRow
	for _, line := range strings.Split(out, "\n") {
		var r benchRow
		if strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &r) == nil {
			rows = append(rows, r)
		}
	}
	return rows, out
}

// `collectived bench --op X` measures every collective through real
// daemons and trainers, in worlds of 2 x 1 and 2 x 2, inline, copied
// through the client's scratch segment and in shared memory, and every
// trainer's checked calls pass.
func TestBenchEveryCollective(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worlds of daemons")
	}
	for _, local := range []int{1, 2} {
		world := 2 * local
		for _, tc := range []struct {
			args  []string
			coll  string
			dtype string
			op    string
		}{
			{[]string{"--op", "allgather", "--dtype", "bf16"}, "allgather", "bfloat16", ""},
			{[]string{"--op", "reducescatter", "--dtype", "float32", "--reduce", "avg"}, "reduce_scatter", "float32", "avg"},
			{[]string{"--op", "reduce_scatter", "--dtype", "int8", "--reduce", "max"}, "reduce_scatter", "int8", "max"},
			{[]string{"--op", "reduce", "--dtype", "f16"}, "reduce", "float16", "sum"},
			{[]string{"--op", "broadcast", "--dtype", "bytes"}, "broadcast", "bytes", ""},
			{[]string{"--op", "allreduce", "--dtype", "bf16", "--reduce", "avg"}, "allreduce", "bfloat16", "avg"},
			{[]string{"--op", "prod", "--dtype", "uint8"}, "allreduce", "uint8", "prod"},
		} {
			// 4 B inline; 8 KiB copied (an allgather's result of 2 x 2 x 8
			// KiB too); 192 KiB in shared memory.
			args := append([]string{"--nodes", "2", "--local", strconv.Itoa(local), "--sizes", "4,8KiB,192KiB", "--iters", "3"}, tc.args...)
			rows, out := benchJSON(t, args...)
			if len(rows) != 3 {
				t.Fatalf("bench %v: %d rows, want 3:\n%s", args, len(rows), out)
			}
			for i, path := range []string{"inline", "copied", "shm"} {
				r := rows[i]
				if r.Path != path || !r.Verified || r.Iters != 3 || r.Collective != tc.coll || r.DType != tc.dtype || r.Op != tc.op || r.MedianUS <= 0 || r.BusBWGBs <= 0 {
					t.Errorf("bench %v: row %d = %+v, want %s %s %s on path %s, 3 verified iterations", args, i, r, tc.coll, tc.dtype, tc.op, path)
				}
				if want := r.Bytes; tc.coll == "allgather" && r.TotalBytes != want*int64(world) || tc.coll != "allgather" && r.TotalBytes != want {
					t.Errorf("bench %v: row %d: total_bytes %d for %d bytes", args, i, r.TotalBytes, r.Bytes)
				}
			}
		}
	}
}

// A reduce_scatter's sizes that do not divide among the trainers are
// rounded down, and bench says so; --in-flight and --between work on
// the other collectives too.
func TestBenchCollectiveOptions(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worlds of daemons")
	}
	rows, out := benchJSON(t, "--nodes", "2", "--local", "2", "--op", "reducescatter", "--sizes", "4,100020", "--iters", "2")
	if len(rows) != 2 || rows[0].Bytes != 16 || rows[0].RequestedBytes != 4 || rows[1].Bytes != 100016 || rows[1].RequestedBytes != 100020 {
		t.Fatalf("reducescatter of 4 and 100020 bytes in a world of 4: %+v\n%s", rows, out)
	}
	if !strings.Contains(out, "reduce_scatter of 100020 bytes: 100016 bytes instead, a multiple of 4 trainers x 4-byte elements") {
		t.Errorf("reducescatter rounding not said:\n%s", out)
	}
	rows, out = benchJSON(t, "--op", "allgather", "--sizes", "4,192KiB", "--iters", "2", "--in-flight", "3")
	if len(rows) != 2 || rows[1].InFlight != 3 || !rows[1].Verified || rows[1].Path != "shm" {
		t.Fatalf("allgather --in-flight 3: %+v\n%s", rows, out)
	}
	rows, out = benchJSON(t, "--op", "broadcast", "--sizes", "4,1MiB", "--iters", "2", "--between", "16KiB")
	if len(rows) != 2 || rows[1].BetweenBytes != 16<<10 || !rows[1].Verified {
		t.Fatalf("broadcast --between 16KiB: %+v\n%s", rows, out)
	}
	// The table says what the sizes are.
	t.Setenv(asMainEnv, "1")
	text, err := runApp(t, "bench", "--op", "allgather", "--sizes", "4", "--iters", "1", "--warmup", "0", "--prewarm", "0")
	if err != nil || !strings.Contains(text, "allgather float32, 1 iterations per size") ||
		!strings.Contains(text, "bytes: each trainer's block; the result is world x bytes") || !strings.Contains(text, "busbw = algbw x (W-1)/W") ||
		!strings.Contains(text, "all 1 sizes verified on all 2 trainers") {
		t.Fatalf("bench --op allgather (table): %v\n%s", err, text)
	}
}
