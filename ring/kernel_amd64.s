// AVX2 reduce kernels (see kernel_amd64.go), all of one shape:
// d[i] = a[i] OP b[i] over n bytes, n a multiple of 32, four 32-byte
// blocks per turn and then single blocks. Each block's a is loaded and
// its b read before its d is stored, so d may be a or b. a is the first
// source operand, whose NaN the instruction returns when both are NaN.

//go:build !purego

#include "textflag.h"

// KERNEL(OP) is the body of every kernel below.
#define KERNEL(OP) \
	MOVQ d+0(FP), DI \
	MOVQ a+8(FP), SI \
	MOVQ b+16(FP), DX \
	MOVQ n+24(FP), CX \
block128: \
	CMPQ CX, $128 \
	JLT  block32 \
	VMOVDQU 0(SI), Y0 \
	VMOVDQU 32(SI), Y1 \
	VMOVDQU 64(SI), Y2 \
	VMOVDQU 96(SI), Y3 \
	OP 0(DX), Y0, Y0 \
	OP 32(DX), Y1, Y1 \
	OP 64(DX), Y2, Y2 \
	OP 96(DX), Y3, Y3 \
	VMOVDQU Y0, 0(DI) \
	VMOVDQU Y1, 32(DI) \
	VMOVDQU Y2, 64(DI) \
	VMOVDQU Y3, 96(DI) \
	ADDQ $128, SI \
	ADDQ $128, DX \
	ADDQ $128, DI \
	SUBQ $128, CX \
	JMP  block128 \
block32: \
	CMPQ CX, $32 \
	JLT  done \
	VMOVDQU (SI), Y0 \
	OP (DX), Y0, Y0 \
	VMOVDQU Y0, (DI) \
	ADDQ $32, SI \
	ADDQ $32, DX \
	ADDQ $32, DI \
	SUBQ $32, CX \
	JMP  block32 \
done: \
	VZEROUPPER \
	RET

// func vaddF32(d, a, b *byte, n int)
TEXT ·vaddF32(SB), NOSPLIT, $0-32
	KERNEL(VADDPS)

// func vaddF64(d, a, b *byte, n int)
TEXT ·vaddF64(SB), NOSPLIT, $0-32
	KERNEL(VADDPD)

// func vaddI32(d, a, b *byte, n int)
TEXT ·vaddI32(SB), NOSPLIT, $0-32
	KERNEL(VPADDD)

// func vaddI64(d, a, b *byte, n int)
TEXT ·vaddI64(SB), NOSPLIT, $0-32
	KERNEL(VPADDQ)

// func vmulF32(d, a, b *byte, n int)
TEXT ·vmulF32(SB), NOSPLIT, $0-32
	KERNEL(VMULPS)

// func vmulF64(d, a, b *byte, n int)
TEXT ·vmulF64(SB), NOSPLIT, $0-32
	KERNEL(VMULPD)

// func vmulI32(d, a, b *byte, n int)
TEXT ·vmulI32(SB), NOSPLIT, $0-32
	KERNEL(VPMULLD)

// func vmaxI32(d, a, b *byte, n int)
TEXT ·vmaxI32(SB), NOSPLIT, $0-32
	KERNEL(VPMAXSD)

// func vminI32(d, a, b *byte, n int)
TEXT ·vminI32(SB), NOSPLIT, $0-32
	KERNEL(VPMINSD)
