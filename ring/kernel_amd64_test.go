//go:build !purego

package ring

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"golang.org/x/sys/cpu"

	"github.com/collectived/collectived/collective"
)

// TestVectorKernelsInUse keeps the comparison below from passing vacuously
// on the machines that have the instructions.
func TestVectorKernelsInUse(t *testing.T) {
	if !cpu.X86.HasAVX2 {
		t.Skip("no AVX2 on this CPU: the Go kernels run")
	}
	if len(vectorOps) != 9 {
		t.Fatalf("%d vector kernels installed, want 9", len(vectorOps))
	}
}

// TestVectorKernelsMatchPortable holds every vector kernel to the bits of
// the Go kernel it replaces (a NaN for a NaN where both operands are
// NaN): random bit patterns (so NaNs with payloads,
// infinities, denormals and signed zeros for floats, overflow for
// integers), every length up to a few blocks and some long ones, aligned
// and misaligned, with d distinct from, equal to a, and equal to b.
func TestVectorKernelsMatchPortable(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	lengths := []int{}
	for n := 0; n <= 80; n++ {
		lengths = append(lengths, n)
	}
	lengths = append(lengths, 255, 1024, 4099, 1<<16+3)
	for _, vo := range vectorOps {
		dt, op := collective.DType(vo[0]), collective.ReduceOp(vo[1])
		vec, ref := kernels[dt][op], portable[dt][op]
		es := dt.Size()
		for _, n := range lengths {
			for _, skew := range []int{0, 1, es / 2} {
				a := make([]byte, n*es+skew)[skew:]
				b := make([]byte, n*es+skew)[skew:]
				fillSpecial(rng, dt, a)
				fillSpecial(rng, dt, b)
				want := make([]byte, len(a))
				ref(want, a, b)
				for _, alias := range []string{"distinct", "d=a", "d=b"} {
					got := make([]byte, len(a)+skew)[skew:]
					aa, bb := append([]byte(nil), a...), append([]byte(nil), b...)
					switch alias {
					case "d=a":
						got = aa
					case "d=b":
						got = bb
					}
					vec(got, aa, bb)
					if i := firstDiff(dt, got, want); i >= 0 {
						e := i / es * es
						t.Fatalf("%s %s, %d elements, skew %d, %s: element %d is %x, the Go kernel gives %x (a %x, b %x)",
							dt, op, n, skew, alias, i/es, got[e:e+es], want[e:e+es], a[e:e+es], b[e:e+es])
					}
				}
			}
		}
	}
}

// firstDiff is the first byte of the first element where x and y differ,
// or -1. Two NaNs are the same element: which operand's NaN an addition
// of two NaNs returns is left to the CPU and, for Go code, to the
// compiler, which may swap the operands of a commutative operation (it
// does under -race, on the misaligned path).
func firstDiff(dt collective.DType, x, y []byte) int {
	if bytes.Equal(x, y) {
		return -1
	}
	es := dt.Size()
	for i := 0; i+es <= len(x); i += es {
		if bytes.Equal(x[i:i+es], y[i:i+es]) || bothNaN(dt, x[i:], y[i:]) {
			continue
		}
		return i
	}
	return -1
}

func bothNaN(dt collective.DType, x, y []byte) bool {
	switch dt {
	case collective.Float32:
		return math.IsNaN(float64(ldF32(x))) && math.IsNaN(float64(ldF32(y)))
	case collective.Float64:
		return math.IsNaN(ldF64(x)) && math.IsNaN(ldF64(y))
	}
	return false
}

// fillSpecial fills b with random bits, and for floats plants the values
// where vector and scalar code could part: NaNs with distinct payloads on
// both sides, infinities, zeros of both signs, denormals.
func fillSpecial(rng *rand.Rand, dt collective.DType, b []byte) {
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	es := dt.Size()
	for i := 0; i+es <= len(b); i += es {
		if rng.IntN(4) != 0 {
			continue
		}
		switch dt {
		case collective.Float32:
			specials := []uint32{0x7fc00001 + rng.Uint32()&0xffff, 0xffc00000 | rng.Uint32()&0x3fffff, 0x7f800001,
				math.Float32bits(float32(math.Inf(1))), math.Float32bits(float32(math.Inf(-1))), 0, 0x80000000, 1, 0x807fffff}
			binary.LittleEndian.PutUint32(b[i:], specials[rng.IntN(len(specials))])
		case collective.Float64:
			specials := []uint64{0x7ff8000000000001 + rng.Uint64()&0xffff, 0xfff8000000000000 | rng.Uint64()&0xfffffffffffff, 0x7ff0000000000001,
				math.Float64bits(math.Inf(1)), math.Float64bits(math.Inf(-1)), 0, 1 << 63, 1, 0x800fffffffffffff}
			binary.LittleEndian.PutUint64(b[i:], specials[rng.IntN(len(specials))])
		}
	}
}

// BenchmarkSegmentFold is the reduce-scatter's fold of one received
// 512 KiB segment into the caller's buffer (k(dst, rx, dst)), by the
// kernel in use and by the Go kernel.
func BenchmarkSegmentFold(b *testing.B) {
	const size = 512 << 10
	for _, name := range []string{"in_use", "go"} {
		b.Run(name, func(b *testing.B) {
			k := kernels[collective.Float32][collective.Sum]
			if name == "go" {
				k = portable[collective.Float32][collective.Sum]
			}
			dst, rx := make([]byte, size), make([]byte, size)
			b.SetBytes(size)
			b.ReportAllocs()
			for b.Loop() {
				k(dst, rx, dst)
			}
		})
	}
}
