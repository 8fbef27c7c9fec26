//go:build !purego

package ring

import "golang.org/x/sys/cpu"

// Vector conversions of the 16-bit floats (half_amd64.s): AVX2 for
// bfloat16, F16C for float16. n is a multiple of 8.

//go:noescape
func widenBF16(dst *float32, src *byte, n int)

//go:noescape
func narrowBF16(dst *byte, src *float32, n int)

//go:noescape
func widenF16(dst *float32, src *byte, n int)

//go:noescape
func narrowF16(dst *byte, src *float32, n int)

// addBF16 and addF16 are a hop's whole arithmetic in the common case
// (one local input, a sum, nothing to scale): dst = round(a + b).
//
//go:noescape
func addBF16(dst, a, b *byte, n int)

//go:noescape
func addF16(dst, a, b *byte, n int)

func init() {
	if cpu.X86.HasAVX2 {
		halfVec.bf16 = true
		halfVec.f16 = cpu.X86.HasAVX && hasF16C()
	}
}

// hasF16C reads CPUID leaf 1, ECX bit 29 (x/sys/cpu does not export it).
func hasF16C() bool {
	_, _, ecx, _ := cpuid(1, 0)
	return ecx&(1<<29) != 0
}

//go:noescape
func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)
