//go:build !purego

package ring

import (
	"golang.org/x/sys/cpu"

	"github.com/collectived/collectived/collective"
)

// Vector kernels. The Go kernels reduce one element per instruction; the
// reduce-scatter half of a large allreduce folds half the buffer per rank
// and call, on the op goroutine, between the receive and the send that
// wait for it. AVX2 does eight float32 per instruction. The assembly
// (kernel_amd64.s) handles whole 32-byte blocks; the tail goes to the Go
// kernel. Only operations whose vector instruction gives the very bits the
// Go operator gives are here: sums and products (IEEE-754 rounds each
// element alike; a NaN operand's payload carries through in both, and
// when both operands are NaN the result is a NaN, whose payload was never
// fixed: see doc.go), and int32 max and min. TestVectorKernelsMatchPortable
// holds them to that. Float max and min are not here: Go's builtins
// propagate NaN and order -0 below +0, which VMAXPS does not.

//go:noescape
func vaddF32(d, a, b *byte, n int)

//go:noescape
func vaddF64(d, a, b *byte, n int)

//go:noescape
func vaddI32(d, a, b *byte, n int)

//go:noescape
func vaddI64(d, a, b *byte, n int)

//go:noescape
func vmulF32(d, a, b *byte, n int)

//go:noescape
func vmulF64(d, a, b *byte, n int)

//go:noescape
func vmulI32(d, a, b *byte, n int)

//go:noescape
func vmaxI32(d, a, b *byte, n int)

//go:noescape
func vminI32(d, a, b *byte, n int)

func init() {
	if !cpu.X86.HasAVX2 {
		return
	}
	for _, v := range []struct {
		dt  collective.DType
		op  collective.ReduceOp
		asm func(d, a, b *byte, n int)
	}{
		{collective.Float32, collective.Sum, vaddF32},
		{collective.Float64, collective.Sum, vaddF64},
		{collective.Int32, collective.Sum, vaddI32},
		{collective.Int64, collective.Sum, vaddI64},
		{collective.Float32, collective.Prod, vmulF32},
		{collective.Float64, collective.Prod, vmulF64},
		{collective.Int32, collective.Prod, vmulI32},
		{collective.Int32, collective.Max, vmaxI32},
		{collective.Int32, collective.Min, vminI32},
	} {
		kernels[v.dt][v.op] = vectorized(v.asm, portable[v.dt][v.op])
		vectorOps = append(vectorOps, [2]int{int(v.dt), int(v.op)})
	}
}

// vectorOps lists the (dtype, op) pairs init gave vector kernels, for the
// tests that hold them to the Go kernels' bits.
var vectorOps [][2]int

// vectorized runs asm over the whole 32-byte blocks of d and tail, the Go
// kernel, over the rest. Blocks do not care about alignment (unaligned
// loads), and d may be a or b: each block is loaded before it is stored.
func vectorized(asm func(d, a, b *byte, n int), tail kernel) kernel {
	return func(d, a, b []byte) {
		a, b = a[:len(d)], b[:len(d)]
		n := len(d) &^ 31
		if n > 0 {
			asm(&d[0], &a[0], &b[0], n)
		}
		if n < len(d) {
			tail(d[n:], a[n:], b[n:])
		}
	}
}
