package ring

import (
	"encoding/binary"
	"math"
	"unsafe"

	"github.com/collectived/collectived/collective"
)

// kernel computes dst[i] = a[i] (op) b[i] over whole elements of the
// byte slices, which hold native little-endian values. dst may alias a or
// b. The left operand a is the accumulator of the documented fold order.
type kernel func(dst, a, b []byte)

// kernelFor returns the reduce kernel for a dtype and reduce op, or nil.
func kernelFor(dt collective.DType, op collective.ReduceOp) kernel {
	if int(dt) >= len(kernels) || int(op) >= len(kernels[dt]) {
		return nil
	}
	return kernels[dt][op]
}

// kernels is what the ring runs: portable, with the entries this CPU has
// vector code for replaced at init (kernel_amd64.go).
var kernels = portable

// portable are the kernels in Go, for every host.
// Avg reduces with Sum; its division is the folder's (arith.go). The
// 16-bit floats' kernels compute each element in float32 and round it.
var portable = [...][6]kernel{
	collective.Float32:  {collective.Sum: f32Sum, collective.Prod: f32Prod, collective.Max: f32Max, collective.Min: f32Min, collective.Avg: f32Sum},
	collective.Float64:  {collective.Sum: f64Sum, collective.Prod: f64Prod, collective.Max: f64Max, collective.Min: f64Min, collective.Avg: f64Sum},
	collective.Int32:    {collective.Sum: i32Sum, collective.Prod: i32Prod, collective.Max: i32Max, collective.Min: i32Min},
	collective.Int64:    {collective.Sum: i64Sum, collective.Prod: i64Prod, collective.Max: i64Max, collective.Min: i64Min},
	collective.Bytes:    {},
	collective.Float16:  {}, // halfKernels, set by init: they use the float32 kernels
	collective.BFloat16: {},
	collective.Int8:     {collective.Sum: bytesKernel(sumT[int8]), collective.Prod: bytesKernel(prodT[int8]), collective.Max: bytesKernel(maxT[int8]), collective.Min: bytesKernel(minT[int8])},
	collective.Uint8:    {collective.Sum: bytesKernel(sumT[uint8]), collective.Prod: bytesKernel(prodT[uint8]), collective.Max: bytesKernel(maxT[uint8]), collective.Min: bytesKernel(minT[uint8])},
}

func init() {
	portable[collective.Float16] = halfKernels(collective.Float16)
	portable[collective.BFloat16] = halfKernels(collective.BFloat16)
	kernels[collective.Float16], kernels[collective.BFloat16] = portable[collective.Float16], portable[collective.BFloat16]
}

// bytesKernel runs a kernel on one-byte elements, which need no alignment.
func bytesKernel[T int8 | uint8](f func(d, a, b []T)) kernel {
	return func(d, a, b []byte) {
		n := len(d)
		f(unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(d))), n),
			unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(a))), n),
			unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), n))
	}
}

// littleEndianHost gates the unsafe fast path: it reinterprets the bytes
// in place, which is only the documented little-endian layout on a
// little-endian machine.
var littleEndianHost = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// view reinterprets b as a slice of T when b is suitably aligned (the
// race detector's checkptr rejects misaligned conversions, and some CPUs
// fault on them); ok is false otherwise and the caller takes the slow path.
func view[T any](b []byte) (s []T, ok bool) {
	var zero T
	size := int(unsafe.Sizeof(zero))
	n := len(b) / size
	if n == 0 {
		return nil, true
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	if !littleEndianHost || uintptr(p)%unsafe.Alignof(zero) != 0 {
		return nil, false
	}
	return unsafe.Slice((*T)(p), n), true
}

func views[T any](d, a, b []byte) (dd, aa, bb []T, ok bool) {
	var ok1, ok2, ok3 bool
	dd, ok1 = view[T](d)
	aa, ok2 = view[T](a)
	bb, ok3 = view[T](b)
	return dd, aa, bb, ok1 && ok2 && ok3
}

type number interface {
	~int8 | ~uint8 | ~int32 | ~int64 | ~float32 | ~float64
}

// The loops below are unrolled by eight with three-index re-slices so
// that the compiler drops bounds checks inside the unrolled body.

func sumT[T number](d, a, b []T) {
	n := len(d)
	a, b = a[:n], b[:n]
	i := 0
	for ; i+8 <= n; i += 8 {
		dd, aa, bb := d[i:i+8:i+8], a[i:i+8:i+8], b[i:i+8:i+8]
		dd[0] = aa[0] + bb[0]
		dd[1] = aa[1] + bb[1]
		dd[2] = aa[2] + bb[2]
		dd[3] = aa[3] + bb[3]
		dd[4] = aa[4] + bb[4]
		dd[5] = aa[5] + bb[5]
		dd[6] = aa[6] + bb[6]
		dd[7] = aa[7] + bb[7]
	}
	for ; i < n; i++ {
		d[i] = a[i] + b[i]
	}
}

func prodT[T number](d, a, b []T) {
	n := len(d)
	a, b = a[:n], b[:n]
	i := 0
	for ; i+8 <= n; i += 8 {
		dd, aa, bb := d[i:i+8:i+8], a[i:i+8:i+8], b[i:i+8:i+8]
		dd[0] = aa[0] * bb[0]
		dd[1] = aa[1] * bb[1]
		dd[2] = aa[2] * bb[2]
		dd[3] = aa[3] * bb[3]
		dd[4] = aa[4] * bb[4]
		dd[5] = aa[5] * bb[5]
		dd[6] = aa[6] * bb[6]
		dd[7] = aa[7] * bb[7]
	}
	for ; i < n; i++ {
		d[i] = a[i] * b[i]
	}
}

// maxT and minT use the builtins, which propagate NaN: if either operand
// is NaN the result is NaN.
func maxT[T number](d, a, b []T) {
	n := len(d)
	a, b = a[:n], b[:n]
	i := 0
	for ; i+4 <= n; i += 4 {
		dd, aa, bb := d[i:i+4:i+4], a[i:i+4:i+4], b[i:i+4:i+4]
		dd[0] = max(aa[0], bb[0])
		dd[1] = max(aa[1], bb[1])
		dd[2] = max(aa[2], bb[2])
		dd[3] = max(aa[3], bb[3])
	}
	for ; i < n; i++ {
		d[i] = max(a[i], b[i])
	}
}

func minT[T number](d, a, b []T) {
	n := len(d)
	a, b = a[:n], b[:n]
	i := 0
	for ; i+4 <= n; i += 4 {
		dd, aa, bb := d[i:i+4:i+4], a[i:i+4:i+4], b[i:i+4:i+4]
		dd[0] = min(aa[0], bb[0])
		dd[1] = min(aa[1], bb[1])
		dd[2] = min(aa[2], bb[2])
		dd[3] = min(aa[3], bb[3])
	}
	for ; i < n; i++ {
		d[i] = min(a[i], b[i])
	}
}

func add[T number](x, y T) T { return x + y }
func mul[T number](x, y T) T { return x * y }
func hi[T number](x, y T) T  { return max(x, y) }
func lo[T number](x, y T) T  { return min(x, y) }

// slow is the portable path for misaligned buffers or big-endian hosts.
func slow[T number](d, a, b []byte, size int, load func([]byte) T, store func([]byte, T), f func(T, T) T) {
	for i := 0; i+size <= len(d); i += size {
		store(d[i:], f(load(a[i:]), load(b[i:])))
	}
}

func ldF32(b []byte) float32    { return math.Float32frombits(binary.LittleEndian.Uint32(b)) }
func stF32(b []byte, v float32) { binary.LittleEndian.PutUint32(b, math.Float32bits(v)) }
func ldF64(b []byte) float64    { return math.Float64frombits(binary.LittleEndian.Uint64(b)) }
func stF64(b []byte, v float64) { binary.LittleEndian.PutUint64(b, math.Float64bits(v)) }
func ldI32(b []byte) int32      { return int32(binary.LittleEndian.Uint32(b)) }
func stI32(b []byte, v int32)   { binary.LittleEndian.PutUint32(b, uint32(v)) }
func ldI64(b []byte) int64      { return int64(binary.LittleEndian.Uint64(b)) }
func stI64(b []byte, v int64)   { binary.LittleEndian.PutUint64(b, uint64(v)) }

func f32Sum(d, a, b []byte) {
	if x, y, z, ok := views[float32](d, a, b); ok {
		sumT(x, y, z)
		return
	}
	slow(d, a, b, 4, ldF32, stF32, add[float32])
}

func f32Prod(d, a, b []byte) {
	if x, y, z, ok := views[float32](d, a, b); ok {
		prodT(x, y, z)
		return
	}
	slow(d, a, b, 4, ldF32, stF32, mul[float32])
}

func f32Max(d, a, b []byte) {
	if x, y, z, ok := views[float32](d, a, b); ok {
		maxT(x, y, z)
		return
	}
	slow(d, a, b, 4, ldF32, stF32, hi[float32])
}

func f32Min(d, a, b []byte) {
	if x, y, z, ok := views[float32](d, a, b); ok {
		minT(x, y, z)
		return
	}
	slow(d, a, b, 4, ldF32, stF32, lo[float32])
}

func f64Sum(d, a, b []byte) {
	if x, y, z, ok := views[float64](d, a, b); ok {
		sumT(x, y, z)
		return
	}
	slow(d, a, b, 8, ldF64, stF64, add[float64])
}

func f64Prod(d, a, b []byte) {
	if x, y, z, ok := views[float64](d, a, b); ok {
		prodT(x, y, z)
		return
	}
	slow(d, a, b, 8, ldF64, stF64, mul[float64])
}

func f64Max(d, a, b []byte) {
	if x, y, z, ok := views[float64](d, a, b); ok {
		maxT(x, y, z)
		return
	}
	slow(d, a, b, 8, ldF64, stF64, hi[float64])
}

func f64Min(d, a, b []byte) {
	if x, y, z, ok := views[float64](d, a, b); ok {
		minT(x, y, z)
		return
	}
	slow(d, a, b, 8, ldF64, stF64, lo[float64])
}

func i32Sum(d, a, b []byte) {
	if x, y, z, ok := views[int32](d, a, b); ok {
		sumT(x, y, z)
		return
	}
	slow(d, a, b, 4, ldI32, stI32, add[int32])
}

func i32Prod(d, a, b []byte) {
	if x, y, z, ok := views[int32](d, a, b); ok {
		prodT(x, y, z)
		return
	}
	slow(d, a, b, 4, ldI32, stI32, mul[int32])
}

func i32Max(d, a, b []byte) {
	if x, y, z, ok := views[int32](d, a, b); ok {
		maxT(x, y, z)
		return
	}
	slow(d, a, b, 4, ldI32, stI32, hi[int32])
}

func i32Min(d, a, b []byte) {
	if x, y, z, ok := views[int32](d, a, b); ok {
		minT(x, y, z)
		return
	}
	slow(d, a, b, 4, ldI32, stI32, lo[int32])
}

func i64Sum(d, a, b []byte) {
	if x, y, z, ok := views[int64](d, a, b); ok {
		sumT(x, y, z)
		return
	}
	slow(d, a, b, 8, ldI64, stI64, add[int64])
}

func i64Prod(d, a, b []byte) {
	if x, y, z, ok := views[int64](d, a, b); ok {
		prodT(x, y, z)
		return
	}
	slow(d, a, b, 8, ldI64, stI64, mul[int64])
}

func i64Max(d, a, b []byte) {
	if x, y, z, ok := views[int64](d, a, b); ok {
		maxT(x, y, z)
		return
	}
	slow(d, a, b, 8, ldI64, stI64, hi[int64])
}

func i64Min(d, a, b []byte) {
	if x, y, z, ok := views[int64](d, a, b); ok {
		minT(x, y, z)
		return
	}
	slow(d, a, b, 8, ldI64, stI64, lo[int64])
}
