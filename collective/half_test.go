package collective

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

// nearest is the reference rounding: the representable value (given as
// a sorted list of the finite non-negative values of the type) nearest
// to |f|, ties to the even bit pattern, computed exactly with big.Float.
func nearest(f float32, values []float32, bits []uint16, overflowAt *big.Float) uint16 {
	a := float32(math.Abs(float64(f)))
	var sign uint16
	if math.Signbit(float64(f)) {
		sign = 0x8000
	}
	x := new(big.Float).SetFloat64(float64(a))
	if x.Cmp(overflowAt) >= 0 {
		return sign | bits[len(bits)-1]
	}
	i := 0
	lo, hi := 0, len(values)-1
	for lo <= hi { // the last value <= a
		m := (lo + hi) / 2
		if values[m] <= a {
			i, lo = m, m+1
		} else {
			hi = m - 1
		}
	}
	if values[i] == a {
		return sign | bits[i]
	}
	d0 := new(big.Float).Sub(x, new(big.Float).SetFloat64(float64(values[i])))
	d1 := new(big.Float).Sub(new(big.Float).SetFloat64(float64(values[i+1])), x)
	switch d0.Cmp(d1) {
	case -1:
		return sign | bits[i]
	case 1:
		return sign | bits[i+1]
	}
	if bits[i]&1 == 0 {
		return sign | bits[i]
	}
	return sign | bits[i+1]
}

func table(widen func(uint16) float32, maxBits uint16) ([]float32, []uint16) {
	var v []float32
	var b []uint16
	for h := uint16(0); h <= maxBits; h++ {
		v = append(v, widen(h))
		b = append(b, h)
	}
	return v, b
}

func TestHalfConversions(t *testing.T) {
	types := []struct {
		name     string
		widen    func(uint16) float32
		narrow   func(float32) uint16
		inf      uint16
		exactMax float64 // largest finite value
		ulpTop   float64 // spacing at the top of the range
	}{
		{"float16", Float16ToFloat32, Float32ToFloat16, 0x7c00, 65504, 32},
		{"bfloat16", BFloat16ToFloat32, Float32ToBFloat16, 0x7f80, float64(math.Float32frombits(0x7f7f0000)), math.Ldexp(1, 120)},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, ty := range types {
		// Widening then narrowing every pattern is the identity (NaNs
		// stay NaN).
		for h := 0; h < 1<<16; h++ {
			f := ty.widen(uint16(h))
			got := ty.narrow(f)
			if f != f {
				if g := ty.widen(got); g == g {
					t.Fatalf("%s: NaN %#04x narrowed to %#04x, not a NaN", ty.name, h, got)
				}
				continue
			}
			if got != uint16(h) {
				t.Fatalf("%s: %#04x -> %v -> %#04x", ty.name, h, f, got)
			}
		}
		values, bits := table(ty.widen, ty.inf)
		// Values at and beyond ty.exactMax + half an ulp round to infinity.
		overflow := new(big.Float).SetFloat64(ty.exactMax + ty.ulpTop/2)
		check := func(f float32) {
			want := nearest(f, values, bits, overflow)
			if got := ty.narrow(f); got != want {
				t.Fatalf("%s: narrow(%v = %#08x) = %#04x, want %#04x", ty.name, f, math.Float32bits(f), got, want)
			}
		}
		for i := 0; i < 200000; i++ {
			// Random bit patterns over the whole float32 range, and values
			// near the type's own range, midpoints included.
			b := rng.Uint32()
			if f := math.Float32frombits(b); f == f && !math.IsInf(float64(f), 0) {
				check(f)
			}
			h := uint16(rng.IntN(int(ty.inf)))
			lo, hi := ty.widen(h), ty.widen(h+1)
			mid := float32((float64(lo) + float64(hi)) / 2)
			check(mid)
			check(-mid)
			check(math.Nextafter32(mid, 0))
			check(math.Nextafter32(mid, float32(math.Inf(1))))
		}
		if got := ty.narrow(float32(math.Inf(-1))); got != 0x8000|ty.inf {
			t.Errorf("%s: -inf narrowed to %#04x", ty.name, got)
		}
	}
}
