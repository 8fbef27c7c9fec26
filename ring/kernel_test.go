package ring

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/collectived/collectived/collective"
)

// TestKernelsAgainstLoop checks each kernel, on aligned and misaligned
// buffers (the portable path), against a plain loop.
func TestKernelsAgainstLoop(t *testing.T) {
	for _, dt := range numDTypes {
		for _, op := range reduceOps {
			k := kernelFor(dt, op)
			if k == nil {
				t.Fatalf("no kernel for %s %s", dt, op)
			}
			for _, count := range []int{0, 1, 3, 7, 8, 9, 33, 1000} {
				a, b := input(dt, op, 0, count), input(dt, op, 1, count)
				want := reference(dt, op, [][]byte{a, b}, count, 1<<30)
				got := make([]byte, len(a))
				k(got, a, b)
				if e, ok := sameResult(dt, got, want); !ok {
					t.Fatalf("%s %s count %d: element %d differs", dt, op, count, e)
				}
				// Misaligned by one byte, and in place (dst aliasing a).
				mis := make([]byte, len(a)+1)[1:]
				copy(mis, a)
				k(mis, mis, b)
				if e, ok := sameResult(dt, mis, want); !ok {
					t.Fatalf("%s %s count %d misaligned: element %d differs", dt, op, count, e)
				}
			}
		}
	}
	if kernelFor(collective.Bytes, collective.Sum) != nil || kernelFor(collective.Float32, collective.ReduceNone) != nil || kernelFor(99, 1) != nil {
		t.Fatal("a kernel exists for a combination allreduce refuses")
	}
}

func TestKernelSemantics(t *testing.T) {
	f32 := func(v ...float32) []byte {
		b := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
		}
		return b
	}
	nan := float32(math.NaN())
	out := make([]byte, 12)
	f32Max(out, f32(nan, 1, 2), f32(1, nan, 3))
	for i := 0; i < 2; i++ {
		if v := math.Float32frombits(binary.LittleEndian.Uint32(out[4*i:])); v == v {
			t.Errorf("max element %d = %v, want NaN", i, v)
		}
	}
	f32Min(out, f32(nan, 1, 2), f32(1, nan, 3))
	if v := math.Float32frombits(binary.LittleEndian.Uint32(out[0:])); v == v {
		t.Errorf("min with NaN = %v", v)
	}
	i32 := make([]byte, 4)
	binary.LittleEndian.PutUint32(i32, math.MaxInt32)
	one := []byte{1, 0, 0, 0}
	i32Sum(i32, i32, one)
	if int32(binary.LittleEndian.Uint32(i32)) != math.MinInt32 {
		t.Errorf("int32 sum does not wrap: %d", int32(binary.LittleEndian.Uint32(i32)))
	}
	if !bytes.Equal(out[8:], f32(2)) {
		t.Errorf("min(2,3) = %x", out[8:])
	}
}

// BenchmarkKernel measures each reduce kernel over 1 MiB (out of place,
// so that repeated products do not drift into denormals).
func BenchmarkKernel(b *testing.B) {
	const size = 1 << 20
	for _, dt := range numDTypes {
		for _, op := range reduceOps {
			b.Run(fmt.Sprintf("%s_%s", dt, op), func(b *testing.B) {
				k := kernelFor(dt, op)
				x, y := input(dt, op, 0, size/dt.Size()), input(dt, op, 1, size/dt.Size())
				out := make([]byte, size)
				b.SetBytes(size)
				b.ReportAllocs()
				for b.Loop() {
					k(out, x, y)
				}
			})
		}
	}
}

func TestReduceExported(t *testing.T) {
	a, b := input(collective.Float64, collective.Sum, 0, 9), input(collective.Float64, collective.Sum, 1, 9)
	want := reference(collective.Float64, collective.Sum, [][]byte{a, b}, 9, 1<<30)
	if err := Reduce(a, b, collective.Float64, collective.Sum); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, want) {
		t.Fatal("Reduce differs from the reference fold")
	}
	if err := Reduce(a, b[:8], collective.Float64, collective.Sum); err == nil || !strings.Contains(err.Error(), "reduce of 8 bytes into 72 bytes") {
		t.Errorf("length mismatch: %v", err)
	}
	if err := Reduce(a[:3], b[:3], collective.Float64, collective.Sum); err == nil {
		t.Error("partial element accepted")
	}
	if err := Reduce(a, b, collective.Bytes, collective.Sum); err == nil || !strings.Contains(err.Error(), "no reduce kernel for bytes sum") {
		t.Errorf("bytes: %v", err)
	}
	if n := testing.AllocsPerRun(100, func() { _ = Reduce(a, b, collective.Float64, collective.Max) }); n != 0 {
		t.Errorf("Reduce allocates %v times", n)
	}
}
