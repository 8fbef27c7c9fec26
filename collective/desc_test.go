package collective

import (
	"errors"
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
		"unknown dtype code 7":    {Op: OpAllGather, DType: 7},
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
	for _, s := range []string{"float32", "f64", "int32", "i64", "bytes"} {
		if _, err := ParseDType(s); err != nil {
			t.Errorf("ParseDType(%q): %v", s, err)
		}
	}
	if _, err := ParseDType("bf16"); err == nil {
		t.Error("ParseDType(bf16) succeeded")
	}
	if r, err := ParseReduceOp("max"); err != nil || r != Max {
		t.Errorf("ParseReduceOp(max) = %v, %v", r, err)
	}
	if _, err := ParseReduceOp("avg"); err == nil {
		t.Error("ParseReduceOp(avg) succeeded")
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
