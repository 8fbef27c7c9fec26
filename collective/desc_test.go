package collective

import (
	"errors"
	"math"
	"testing"
)

func TestValidate(t *testing.T) {
	good := []Desc{
		{Op: OpAllReduce, DType: Float32, Reduce: Sum, Count: 10},
		{Op: OpAllReduce, DType: Int64, Reduce: Min, Count: 0, Name: "g"},
		{Op: OpBroadcast, DType: Bytes, Count: 3, Root: 3},
		{Op: OpAllGather, DType: Float64, Count: 1},
		{Op: OpBarrier},
	}
	for _, d := range good {
		if err := d.Validate(4); err != nil {
			t.Errorf("%v: unexpected error %v", d, err)
		}
	}
	bad := map[string]Desc{
		"unknown op code":         {Op: 9, DType: Float32, Reduce: Sum},
		"needs a reduce op":       {Op: OpAllReduce, DType: Float32},
		"untyped bytes":           {Op: OpAllReduce, DType: Bytes, Reduce: Sum},
		"unknown dtype code 77":   {Op: OpAllGather, DType: 77},
		"root 4 outside world":    {Op: OpBroadcast, DType: Float32, Root: 4},
		"takes no reduce op":      {Op: OpBroadcast, DType: Float32, Reduce: Max},
		"barrier takes no":        {Op: OpBarrier, Count: 1},
		"allgather takes no root": {Op: OpAllGather, DType: Int32, Root: 1},
		"beyond any buffer":       {Op: OpAllReduce, DType: Float32, Reduce: Sum, Count: 1 << 41},
	}
	for want, d := range bad {
		err := d.Validate(4)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%v: error %v does not wrap ErrInvalid", d, err)
			continue
		}
		if !contains(err.Error(), want) {
			t.Errorf("%v: error %q does not say %q", d, err, want)
		}
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

func TestFingerprintDistinguishesEveryField(t *testing.T) {
	base := Desc{Op: OpAllReduce, DType: Float32, Reduce: Sum, Count: 10, Name: "x"}
	variants := []Desc{base, base, base, base, base, base}
	variants[0].Op = OpBroadcast
	variants[1].DType = Float64
	variants[2].Reduce = Max
	variants[3].Count = 11
	variants[4].Root = 1
	variants[5].Name = "y"
	for i, v := range variants {
		if v.Fingerprint() == base.Fingerprint() {
			t.Errorf("variant %d (%v) has the same fingerprint as %v", i, v, base)
		}
	}
	if base.Fingerprint() != (Desc{Op: OpAllReduce, DType: Float32, Reduce: Sum, Count: 10, Name: "x"}).Fingerprint() {
		t.Error("equal descriptions have different fingerprints")
	}
	if n := testing.AllocsPerRun(100, func() { _ = base.Fingerprint() }); n != 0 {
		t.Errorf("Fingerprint allocates %v times", n)
	}
}

func TestStringAndParse(t *testing.T) {
	d := Desc{Op: OpAllReduce, DType: Float32, Reduce: Sum, Count: 1024, Name: "grad"}
	if got, want := d.String(), `allreduce(float32, sum, count=1024, name="grad")`; got != want {
		t.Errorf("String = %s, want %s", got, want)
	}
	if got := (Desc{Op: OpBarrier}).String(); got != "barrier()" {
		t.Errorf("barrier String = %s", got)
	}
	for _, s := range []string{"float32", "f64", "int32", "i64", "bytes", "bf16", "float16", "int8", "u8"} {
		if _, err := ParseDType(s); err != nil {
			t.Errorf("ParseDType(%q): %v", s, err)
		}
	}
	if _, err := ParseDType("complex64"); err == nil || !contains(err.Error(), "bfloat16") {
		t.Errorf("ParseDType(complex64) = %v, want an error listing the types", err)
	}
	if r, err := ParseReduceOp("max"); err != nil || r != Max {
		t.Errorf("ParseReduceOp(max) = %v, %v", r, err)
	}
	if r, err := ParseReduceOp("avg"); err != nil || r != Avg {
		t.Errorf("ParseReduceOp(avg) = %v, %v", r, err)
	}
	if _, err := ParseReduceOp("mean"); err == nil {
		t.Error("ParseReduceOp(mean) succeeded")
	}
	v := Desc{Op: OpAllGather, DType: BFloat16, Count: 2, Counts: []uint64{2, 0, 5}, Shape: Shape{N: 2, Dims: [MaxDims]uint64{1, 2}}}
	if got, want := v.String(), "allgather(bfloat16, count=2, shape=(1,2), counts=[2,0,5])"; got != want {
		t.Errorf("String = %s, want %s", got, want)
	}
	r := Desc{Op: OpReduce, DType: Float16, Reduce: Avg, Count: 3, Root: 2, PreScale: 0.5}
	if got, want := r.String(), "reduce(float16, avg, count=3, root=2, prescale=0.5)"; got != want {
		t.Errorf("String = %s, want %s", got, want)
	}
}

func TestPutGet(t *testing.T) {
	b := make([]byte, 8)
	for _, d := range []DType{Float32, Float64, Int32, Int64, Bytes} {
		for _, v := range []float64{0, 1, 7, 100, 255} {
			d.Put(b, v)
			if got := d.Get(b); got != v {
				t.Errorf("%s: put %v, got %v", d, v, got)
			}
		}
	}
	Int32.Put(b, -5)
	if b[0] != 0xfb || b[3] != 0xff {
		t.Errorf("int32 -5 is not little-endian two's complement: % x", b[:4])
	}
	if got := DTypeInvalid.Get(b); got == got {
		t.Errorf("invalid dtype read %v, want NaN", got)
	}
}

func shape(dims ...uint64) Shape {
	s := Shape{N: uint8(len(dims))}
	copy(s.Dims[:], dims)
	return s
}

func TestValidateVersion3(t *testing.T) {
	good := []Desc{
		{Op: OpAllReduce, DType: BFloat16, Reduce: Avg, Count: 12, Shape: shape(3, 4)},
		{Op: OpAllReduce, DType: Float16, Reduce: Sum, Count: 1, PreScale: 2, PostScale: 0.25},
		{Op: OpAllReduce, DType: Int8, Reduce: Prod, Count: 5},
		{Op: OpReduce, DType: Uint8, Reduce: Max, Count: 5, Root: 3},
		{Op: OpReduceScatter, DType: Float32, Reduce: Sum, Count: 8},
		{Op: OpReduceScatter, DType: Float32, Reduce: Sum, Count: 3, Counts: []uint64{0, 1, 2, 0}},
		{Op: OpAllGather, DType: Int64, Count: 2, Counts: []uint64{1, 2, 0, 7}, Shape: shape(2, 1)},
		{Op: OpAllGather, DType: Float32, Count: 0, Shape: shape(0, 5)},
	}
	for _, d := range good {
		if err := d.Validate(4); err != nil {
			t.Errorf("%v: unexpected error %v", d, err)
		}
	}
	bad := map[string]Desc{
		"avg needs a float dtype, got int32":             {Op: OpAllReduce, DType: Int32, Reduce: Avg, Count: 1},
		"shape (3,4) holds 12 elements, count is 13":     {Op: OpAllReduce, DType: Float32, Reduce: Sum, Count: 13, Shape: shape(3, 4)},
		"shape has 9 dimensions":                         {Op: OpAllReduce, DType: Float32, Reduce: Sum, Shape: Shape{N: 9}},
		"3 per-rank counts for a world of 4":             {Op: OpAllGather, DType: Float32, Counts: []uint64{1, 1, 1}},
		"reduce_scatter counts sum to 3, count is 4":     {Op: OpReduceScatter, DType: Float32, Reduce: Sum, Count: 4, Counts: []uint64{1, 1, 1, 0}},
		"not a multiple of the world size 4":             {Op: OpReduceScatter, DType: Float32, Reduce: Sum, Count: 6},
		"allreduce takes no per-rank counts":             {Op: OpAllReduce, DType: Float32, Reduce: Sum, Counts: []uint64{0, 0, 0, 0}},
		"reduce root 4 outside world of 4":               {Op: OpReduce, DType: Float32, Reduce: Sum, Root: 4},
		"not max of float32":                             {Op: OpAllReduce, DType: Float32, Reduce: Max, PreScale: 2},
		"prescale NaN must be finite":                    {Op: OpAllReduce, DType: Float32, Reduce: Sum, PreScale: math.NaN()},
		"barrier takes no count, root, reduce op, shape": {Op: OpBarrier, Shape: shape(1)},
		"brings the total beyond any buffer":             {Op: OpAllGather, DType: Float32, Counts: []uint64{1 << 39, 1 << 39, 1, 0}},
	}
	for want, d := range bad {
		err := d.Validate(4)
		if !errors.Is(err, ErrInvalid) || !contains(err.Error(), want) {
			t.Errorf("%v: error %v, want one saying %q", d, err, want)
		}
	}
	v := Desc{Op: OpAllGather, DType: Float32, Count: 2, Counts: []uint64{1, 2, 0, 7}}
	if err := v.CheckRank(1); err != nil {
		t.Errorf("CheckRank(1): %v", err)
	}
	if err := v.CheckRank(3); err == nil || !contains(err.Error(), "counts[3] = 7") {
		t.Errorf("CheckRank(3) = %v, want the rank's entry named", err)
	}
}

func TestMatchedAndEqual(t *testing.T) {
	counts := []uint64{1, 2, 0, 7}
	a := Desc{Op: OpAllGather, DType: Float32, Count: 1, Counts: counts, Shape: shape(1, 3)}
	b := Desc{Op: OpAllGather, DType: Float32, Count: 7, Counts: []uint64{1, 2, 0, 7}, Shape: shape(7, 3)}
	if !a.Equal(b) || a.Fingerprint() != b.Fingerprint() {
		t.Errorf("v allgather calls of ranks 0 and 3 do not match: %v, %v", a, b)
	}
	differ := map[string]Desc{}
	c := b
	c.Counts = []uint64{2, 1, 0, 7}
	differ["counts"] = c
	c = b
	c.Shape = shape(7, 4)
	differ["inner dimension"] = c
	c = b
	c.Shape = Shape{}
	differ["no shape"] = c
	c = b
	c.Counts = nil
	differ["no counts"] = c
	r := Desc{Op: OpAllReduce, DType: Float32, Reduce: Sum, Count: 12, Shape: shape(3, 4)}
	r2 := r
	r2.Shape = shape(4, 3)
	r3 := r
	r3.PreScale = 2
	r4 := r
	r4.PostScale = -1
	for name, d := range differ {
		if d.Equal(b) || d.Fingerprint() == b.Fingerprint() {
			t.Errorf("%s: %v matches %v", name, d, b)
		}
	}
	for _, d := range []Desc{r2, r3, r4} {
		if d.Equal(r) || d.Fingerprint() == r.Fingerprint() {
			t.Errorf("%v matches %v", d, r)
		}
	}
	// A shape's first dimension counts outside the v allgather.
	g := Desc{Op: OpAllGather, DType: Float32, Count: 6, Shape: shape(2, 3)}
	g2 := g
	g2.Shape = shape(3, 2)
	if g.Equal(g2) || g.Fingerprint() == g2.Fingerprint() {
		t.Errorf("%v matches %v", g, g2)
	}
	if n := testing.AllocsPerRun(100, func() { _ = b.Fingerprint(); _ = a.Equal(b) }); n != 0 {
		t.Errorf("Fingerprint and Equal allocate %v times", n)
	}
}

func TestResult(t *testing.T) {
	cases := []struct {
		d    Desc
		rank int
		want uint64
	}{
		{Desc{Op: OpAllGather, Count: 3}, 1, 12},
		{Desc{Op: OpAllGather, Count: 2, Counts: []uint64{1, 2, 0, 7}}, 1, 10},
		{Desc{Op: OpReduceScatter, Count: 8}, 2, 2},
		{Desc{Op: OpReduceScatter, Count: 10, Counts: []uint64{1, 2, 0, 7}}, 3, 7},
		{Desc{Op: OpReduce, Count: 5}, 0, 5},
	}
	for _, c := range cases {
		if got := c.d.Result(c.rank, 4); got != c.want {
			t.Errorf("%v.Result(%d, 4) = %d, want %d", c.d, c.rank, got, c.want)
		}
	}
}

func TestBlock(t *testing.T) {
	cases := []struct {
		d      Desc
		w      int
		off, n uint64
	}{
		{Desc{Op: OpAllGather, Count: 3}, 2, 6, 3},
		{Desc{Op: OpAllGather, Count: 2, Counts: []uint64{1, 2, 0, 7}}, 3, 3, 7},
		{Desc{Op: OpAllGather, Count: 2, Counts: []uint64{1, 2, 0, 7}}, 0, 0, 1},
		{Desc{Op: OpReduceScatter, Count: 8}, 3, 6, 2},
		{Desc{Op: OpReduceScatter, Count: 10, Counts: []uint64{1, 2, 0, 7}}, 2, 3, 0},
	}
	for _, c := range cases {
		if off, n := c.d.Block(c.w, 4); off != c.off || n != c.n {
			t.Errorf("%v.Block(%d, 4) = %d, %d; want %d, %d", c.d, c.w, off, n, c.off, c.n)
		}
	}
}
