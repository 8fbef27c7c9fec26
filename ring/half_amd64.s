//go:build !purego

#include "textflag.h"

// Conversions between the 16-bit floats and float32, eight elements a
// turn; n is a multiple of 8. They give the bits of the Go conversions in
// package collective (TestHalfVectorsMatchPortable holds them to it).

DATA bf16ones<>+0(SB)/4, $0x00000001
GLOBL bf16ones<>(SB), RODATA|NOPTR, $4
DATA bf16bias<>+0(SB)/4, $0x00007fff
GLOBL bf16bias<>(SB), RODATA|NOPTR, $4
DATA bf16abs<>+0(SB)/4, $0x7fffffff
GLOBL bf16abs<>(SB), RODATA|NOPTR, $4
DATA bf16inf<>+0(SB)/4, $0x7f800000
GLOBL bf16inf<>(SB), RODATA|NOPTR, $4
DATA bf16quiet<>+0(SB)/4, $0x00000040
GLOBL bf16quiet<>(SB), RODATA|NOPTR, $4

// BF16_CONSTANTS loads ROUND_BF16's constants into Y8-Y12.
#define BF16_CONSTANTS \
	VPBROADCASTD bf16ones<>(SB), Y8 \
	VPBROADCASTD bf16bias<>(SB), Y9 \
	VPBROADCASTD bf16abs<>(SB), Y10 \
	VPBROADCASTD bf16inf<>(SB), Y11 \
	VPBROADCASTD bf16quiet<>(SB), Y12

// ROUND_BF16 rounds the eight float32 in Y0 to bfloat16 in X3:
// (b + 0x7fff + (b>>16)&1) >> 16, or (b>>16)|0x40 for a NaN.
#define ROUND_BF16 \
	VPSRLD $16, Y0, Y1 \
	VPAND Y8, Y1, Y2 \
	VPADDD Y9, Y0, Y3 \
	VPADDD Y2, Y3, Y3 \
	VPSRLD $16, Y3, Y3 \
	VPOR Y12, Y1, Y4 \
	VPAND Y10, Y0, Y5 \
	VPCMPGTD Y11, Y5, Y5 \
	VPBLENDVB Y5, Y4, Y3, Y3 \
	VEXTRACTI128 $1, Y3, X6 \
	VPACKUSDW X6, X3, X3

// func widenBF16(dst *float32, src *byte, n int)
TEXT ·widenBF16(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
wloop:
	CMPQ CX, $8
	JLT  wdone
	VPMOVZXWD (SI), Y0
	VPSLLD $16, Y0, Y0
	VMOVDQU Y0, (DI)
	ADDQ $16, SI
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  wloop
wdone:
	VZEROUPPER
	RET

// func narrowBF16(dst *byte, src *float32, n int)
TEXT ·narrowBF16(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	BF16_CONSTANTS
nloop:
	CMPQ CX, $8
	JLT  ndone
	VMOVDQU (SI), Y0
	ROUND_BF16
	VMOVDQU X3, (DI)
	ADDQ $32, SI
	ADDQ $16, DI
	SUBQ $8, CX
	JMP  nloop
ndone:
	VZEROUPPER
	RET

// func widenF16(dst *float32, src *byte, n int)
TEXT ·widenF16(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
hwloop:
	CMPQ CX, $8
	JLT  hwdone
	VCVTPH2PS (SI), Y0
	VMOVUPS Y0, (DI)
	ADDQ $16, SI
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  hwloop
hwdone:
	VZEROUPPER
	RET

// func narrowF16(dst *byte, src *float32, n int)
// Immediate 0: round to nearest even, whatever MXCSR says.
TEXT ·narrowF16(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
hnloop:
	CMPQ CX, $8
	JLT  hndone
	VMOVUPS (SI), Y0
	VCVTPS2PH $0, Y0, X1
	VMOVDQU X1, (DI)
	ADDQ $32, SI
	ADDQ $16, DI
	SUBQ $8, CX
	JMP  hnloop
hndone:
	VZEROUPPER
	RET

// func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)
TEXT ·cpuid(SB), NOSPLIT, $0-24
	MOVL eaxArg+0(FP), AX
	MOVL ecxArg+4(FP), CX
	CPUID
	MOVL AX, eax+8(FP)
	MOVL BX, ebx+12(FP)
	MOVL CX, ecx+16(FP)
	MOVL DX, edx+20(FP)
	RET

// func addBF16(dst, a, b *byte, n int)
// dst = bfloat16(float32(a) + float32(b)), rounded as narrowBF16 rounds.
TEXT ·addBF16(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	BF16_CONSTANTS
aloop:
	CMPQ CX, $8
	JLT  adone
	VPMOVZXWD (SI), Y0
	VPMOVZXWD (DX), Y1
	VPSLLD $16, Y0, Y0
	VPSLLD $16, Y1, Y1
	VADDPS Y1, Y0, Y0
	ROUND_BF16
	VMOVDQU X3, (DI)
	ADDQ $16, SI
	ADDQ $16, DX
	ADDQ $16, DI
	SUBQ $8, CX
	JMP  aloop
adone:
	VZEROUPPER
	RET

// func addF16(dst, a, b *byte, n int)
TEXT ·addF16(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
hloop:
	CMPQ CX, $8
	JLT  hdone
	VCVTPH2PS (SI), Y0
	VCVTPH2PS (DX), Y1
	VADDPS Y1, Y0, Y0
	VCVTPS2PH $0, Y0, X1
	VMOVDQU X1, (DI)
	ADDQ $16, SI
	ADDQ $16, DX
	ADDQ $16, DI
	SUBQ $8, CX
	JMP  hloop
hdone:
	VZEROUPPER
	RET
