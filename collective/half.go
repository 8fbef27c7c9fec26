package collective

import "math"

// The 16-bit float types travel as their bits; the daemon computes with
// them in float32 (docs/PROTOCOL.md, Reductions). These conversions are
// exact from 16 bits to float32 and round to nearest even the other way.

// BFloat16ToFloat32 widens a bfloat16 exactly.
func BFloat16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Float32ToBFloat16 rounds to the nearest bfloat16, ties to even. A NaN
// stays a NaN (made quiet, sign kept); overflow rounds to infinity.
func Float32ToBFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// Float16ToFloat32 widens an IEEE binary16 exactly; a NaN is made quiet
// (its payload kept), as x86's F16C conversion does.
func Float16ToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	frac := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f && frac == 0:
		return math.Float32frombits(sign | 0x7f800000)
	case exp == 0x1f: // NaN, made quiet as the F16C instruction does
		return math.Float32frombits(sign | 0x7fc00000 | frac<<13)
	case exp != 0: // normal
		return math.Float32frombits(sign | (exp+112)<<23 | frac<<13)
	case frac == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal: frac * 2^-24, exact in float32.
	v := float32(frac) * (1.0 / (1 << 24))
	if sign != 0 {
		v = -v
	}
	return v
}

// Float32ToFloat16 rounds to the nearest IEEE binary16, ties to even. A
// NaN stays a NaN (made quiet, sign kept); overflow rounds to infinity.
func Float32ToFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	frac := b & 0x7fffff
	if exp == 0xff {
		if frac != 0 {
			return sign | 0x7e00 | uint16(frac>>13)
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15 // the binary16 biased exponent
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// Subnormal or zero in binary16: shift the significand (with its
		// implicit bit) right, rounding to nearest even.
		if e < -10 {
			return sign // below half the smallest subnormal
		}
		m := frac | 0x800000
		shift := uint32(14 - e)
		half := uint32(1) << (shift - 1)
		r := m >> shift
		rest := m & (1<<shift - 1)
		if rest > half || rest == half && r&1 == 1 {
			r++
		}
		return sign | uint16(r)
	}
	r := uint32(e)<<10 | frac>>13
	rest := frac & 0x1fff
	if rest > 0x1000 || rest == 0x1000 && r&1 == 1 {
		r++ // may carry into the exponent, up to infinity: still correct
	}
	return sign | uint16(r)
}
