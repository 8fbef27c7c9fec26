package ring

import (
	"encoding/binary"
	"math"
	"unsafe"

	"github.com/collectived/collectived/collective"
)

// folder is one reduction's arithmetic (docs/PROTOCOL.md, Reductions):
// how a node folds its local inputs into its partial, how a received
// partial combines with them, and how the final value is scaled for avg
// and postscale. Types other than the 16-bit floats compute in
// themselves through the kernels, one rounding per operation; the 16-bit
// floats compute in float32 and round to their type once, where a value
// is written (fold16).
type folder struct {
	k    kernel
	dt   collective.DType
	op   collective.ReduceOp
	half bool
	// first is local input 0; nil when the working buffer already holds
	// it (AllReduceLocal works in the first trainer's buffer).
	first []byte
	// others are local inputs 1, 2, ..., read only.
	others [][]byte
	// back writes final values into others too (allreduce, in place).
	back bool
	// pre, div and post are the prescale, avg's divisor and the postscale;
	// 0 where there is none.
	pre, div, post float64
	// f32 is the float32 working space of the 16-bit types.
	f32 *halfScratch
}

// halfScratch holds a block's float32 accumulator and operand.
type halfScratch struct{ acc, v [block]float32 }

func newFolder(d *collective.Desc, first []byte, others [][]byte, back bool, ranks int, f32 *halfScratch) folder {
	m := d.Matched() // a scale of 1 is none
	f := folder{k: kernelFor(d.DType, d.Reduce), dt: d.DType, op: d.Reduce, half: d.DType.Half(),
		first: first, others: others, back: back, pre: m.PreScale, post: m.PostScale, f32: f32}
	if d.Reduce == collective.Avg && ranks > 1 {
		f.div = float64(ranks)
	}
	return f
}

// scales reports whether finishing a value changes it.
func (f *folder) scales() bool { return f.div != 0 || f.post != 0 }

// input returns local input i's bytes at [off, off+n); input 0 is seg
// itself when the working buffer holds it.
func (f *folder) input(i int, seg []byte, off int) []byte {
	if i == 0 {
		if f.first == nil {
			return seg
		}
		return f.first[off : off+len(seg)]
	}
	return f.others[i-1][off : off+len(seg)]
}

// local sets seg, the working buffer's bytes at off, to the fold of the
// local inputs there, in local-rank order, prescaled.
func (f *folder) local(seg []byte, off int) {
	if f.half && len(f.others) == 0 && f.pre == 0 {
		// One input, no arithmetic: the input itself, unchanged.
		if f.first != nil {
			copy(seg, f.first[off:off+len(seg)])
		}
		return
	}
	if f.half {
		f.fold16(seg, nil, off, false)
		return
	}
	if f.first != nil {
		copy(seg, f.first[off:off+len(seg)])
	}
	if f.pre != 0 {
		scaleWide(seg, seg, f.dt, f.pre, 0)
	}
	for _, o := range f.others {
		o = o[off : off+len(seg)]
		if f.pre != 0 {
			addScaled(seg, o, f.dt, f.pre)
		} else {
			f.k(seg, seg, o)
		}
	}
}

// combine sets dst, the working buffer's bytes at off, to recv (op) the
// local fold there, the received partial on the left; final finishes it.
func (f *folder) combine(dst, recv []byte, off int, final bool) {
	if f.half {
		f.fold16(dst, recv, off, final)
		return
	}
	f.local(dst, off)
	f.k(dst, recv, dst)
	if final {
		f.finish(dst)
	}
}

// localFinal is the whole reduction of a ring of one: the local fold,
// finished.
func (f *folder) localFinal(seg []byte, off int) {
	if f.half {
		f.fold16(seg, nil, off, true)
		return
	}
	f.local(seg, off)
	f.finish(seg)
}

// total sets dst to parts[0] (op) parts[1] (op) ..., left to right,
// finished: the small path's fold of every node's partial.
func (f *folder) total(dst []byte, parts func(i int) []byte, n int) {
	if f.half {
		f.sum16(dst, parts, n)
		return
	}
	copy(dst, parts(0))
	for i := 1; i < n; i++ {
		f.k(dst, dst, parts(i))
	}
	f.finish(dst)
}

// finish scales a final value of a type computed in itself: divided by
// avg's divisor, then multiplied by the postscale, each rounded.
func (f *folder) finish(seg []byte) {
	if f.div != 0 {
		scaleWide(seg, seg, f.dt, 1, f.div)
	}
	if f.post != 0 {
		scaleWide(seg, seg, f.dt, f.post, 0)
	}
}

// copyBack writes seg, final values at off, into the other inputs when
// they are outputs too.
func (f *folder) copyBack(seg []byte, off int) {
	if !f.back {
		return
	}
	for _, o := range f.others {
		copy(o[off:off+len(seg)], seg)
	}
}

// block is how many elements fold16 computes per pass: its float32
// accumulator lives on the stack.
const block = 256

// fold16 sets dst (16-bit floats at off) to the rounding of
// lead (op) (pre*x_0 (op) pre*x_1 ...), computed in float32, lead the
// received partial (nil: none); final divides and scales before rounding.
func (f *folder) fold16(dst, lead []byte, off int, final bool) {
	n := len(dst) / 2
	if lead != nil && f.sumsTwo(final) {
		// One local input (in dst), a sum, nothing to scale: the fused
		// vector loop, then the tail the usual way.
		v := n &^ 7
		if v > 0 {
			if f.dt == collective.BFloat16 {
				addBF16(&dst[0], &lead[0], &dst[0], v)
			} else {
				addF16(&dst[0], &lead[0], &dst[0], v)
			}
		}
		if v == n {
			return
		}
		dst, lead, off, n = dst[2*v:], lead[2*v:], off+2*v, n-v
	}
	acc, v := &f.f32.acc, &f.f32.v
	pre := float32(f.pre)
	for b := 0; b < n; b += block {
		m := min(block, n-b)
		lo, hi := 2*b, 2*(b+m)
		f.widen(acc[:m], f.input(0, dst, off)[lo:hi])
		if pre != 0 {
			mulBy(acc[:m], pre)
		}
		for i := range f.others {
			f.widen(v[:m], f.input(i+1, dst, off)[lo:hi])
			if pre != 0 {
				mulBy(v[:m], pre)
			}
			combine32(f.op, acc[:m], acc[:m], v[:m])
		}
		if lead != nil {
			f.widen(v[:m], lead[lo:hi])
			combine32(f.op, acc[:m], v[:m], acc[:m])
		}
		if final {
			f.finish32(acc[:m])
		}
		f.narrow(dst[lo:hi], acc[:m])
	}
}

// sumsTwo reports whether a combine is round(received + dst) alone, which
// the fused vector loops compute.
func (f *folder) sumsTwo(final bool) bool {
	vec := f.dt == collective.BFloat16 && halfVec.bf16 || f.dt == collective.Float16 && halfVec.f16
	return vec && littleEndianHost && f.first == nil && len(f.others) == 0 && f.pre == 0 &&
		(f.op == collective.Sum || f.op == collective.Avg) && !(final && f.scales())
}

// sum16 is total for the 16-bit floats: one float32 fold of every part,
// rounded once.
func (f *folder) sum16(dst []byte, parts func(i int) []byte, n int) {
	acc, v := &f.f32.acc, &f.f32.v
	count := len(dst) / 2
	for b := 0; b < count; b += block {
		m := min(block, count-b)
		lo, hi := 2*b, 2*(b+m)
		f.widen(acc[:m], parts(0)[lo:hi])
		for i := 1; i < n; i++ {
			f.widen(v[:m], parts(i)[lo:hi])
			combine32(f.op, acc[:m], acc[:m], v[:m])
		}
		f.finish32(acc[:m])
		f.narrow(dst[lo:hi], acc[:m])
	}
}

func (f *folder) finish32(acc []float32) {
	if f.div != 0 {
		d := float32(f.div)
		for i := range acc {
			acc[i] /= d
		}
	}
	if f.post != 0 {
		mulBy(acc, float32(f.post))
	}
}

// halfVec tells which 16-bit types have vector conversions on this CPU
// (half_amd64.go).
var halfVec struct{ bf16, f16 bool }

func (f *folder) widen(dst []float32, src []byte) {
	if v := len(dst) &^ 7; v > 0 && littleEndianHost {
		switch {
		case f.dt == collective.BFloat16 && halfVec.bf16:
			widenBF16(&dst[0], &src[0], v)
		case f.dt == collective.Float16 && halfVec.f16:
			widenF16(&dst[0], &src[0], v)
		default:
			v = 0
		}
		dst, src = dst[v:], src[2*v:]
	}
	h, ok := view[uint16](src[:2*len(dst)])
	if !ok {
		f.widenSlow(dst, src)
		return
	}
	h = h[:len(dst)]
	if f.dt == collective.BFloat16 {
		for i, x := range h {
			dst[i] = math.Float32frombits(uint32(x) << 16)
		}
		return
	}
	for i, x := range h {
		dst[i] = collective.Float16ToFloat32(x)
	}
}

func (f *folder) narrow(dst []byte, src []float32) {
	if v := len(src) &^ 7; v > 0 && littleEndianHost {
		switch {
		case f.dt == collective.BFloat16 && halfVec.bf16:
			narrowBF16(&dst[0], &src[0], v)
		case f.dt == collective.Float16 && halfVec.f16:
			narrowF16(&dst[0], &src[0], v)
		default:
			v = 0
		}
		dst, src = dst[2*v:], src[v:]
	}
	h, ok := view[uint16](dst[:2*len(src)])
	if !ok {
		f.narrowSlow(dst, src)
		return
	}
	h = h[:len(src)]
	if f.dt == collective.BFloat16 {
		for i, x := range src {
			b := math.Float32bits(x)
			r := uint16((b + 0x7fff + (b>>16)&1) >> 16)
			if b&0x7fffffff > 0x7f800000 {
				r = uint16(b>>16) | 0x40 // NaN stays NaN
			}
			h[i] = r
		}
		return
	}
	for i, x := range src {
		h[i] = collective.Float32ToFloat16(x)
	}
}

// widenSlow and narrowSlow serve misaligned buffers and big-endian hosts.
func (f *folder) widenSlow(dst []float32, src []byte) {
	for i := range dst {
		x := binary.LittleEndian.Uint16(src[2*i:])
		if f.dt == collective.BFloat16 {
			dst[i] = collective.BFloat16ToFloat32(x)
		} else {
			dst[i] = collective.Float16ToFloat32(x)
		}
	}
}

func (f *folder) narrowSlow(dst []byte, src []float32) {
	for i, x := range src {
		if f.dt == collective.BFloat16 {
			binary.LittleEndian.PutUint16(dst[2*i:], collective.Float32ToBFloat16(x))
		} else {
			binary.LittleEndian.PutUint16(dst[2*i:], collective.Float32ToFloat16(x))
		}
	}
}

func mulBy(x []float32, s float32) {
	for i := range x {
		x[i] *= s
	}
}

// combine32 sets d[i] = a[i] (op) b[i] in float32, with the float32
// kernels (vector code where the CPU has it); max and min propagate NaN
// as the kernels do.
func combine32(op collective.ReduceOp, d, a, b []float32) {
	if op == collective.Avg {
		op = collective.Sum
	}
	kernelFor(collective.Float32, op)(f32bytes(d), f32bytes(a), f32bytes(b))
}

func f32bytes(x []float32) []byte {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 4*len(x))
}

// halfKernels are the pairwise kernels of a 16-bit float type, for
// Reduce: each element computed in float32 and rounded. (Their float32
// space escapes to the heap: Reduce is not on the ring's data path.)
func halfKernels(dt collective.DType) [6]kernel {
	var ks [6]kernel
	for op := collective.Sum; op <= collective.Avg; op++ {
		f := folder{dt: dt, op: op}
		ks[op] = func(d, a, b []byte) {
			var x, y [block]float32
			n := len(d) / 2
			for s := 0; s < n; s += block {
				m := min(block, n-s)
				lo, hi := 2*s, 2*(s+m)
				f.widen(x[:m], a[lo:hi])
				f.widen(y[:m], b[lo:hi])
				combine32(op, x[:m], x[:m], y[:m])
				f.narrow(d[lo:hi], x[:m])
			}
		}
	}
	return ks
}

// scaleWide sets dst[i] = src[i] * mul (mul != 1) or src[i] / div
// (div != 0) in the type of a float32 or float64 buffer, each rounded
// once.
func scaleWide(dst, src []byte, dt collective.DType, mul, div float64) {
	switch dt {
	case collective.Float32:
		m, d := float32(mul), float32(div)
		for i := 0; i+4 <= len(dst); i += 4 {
			x := math.Float32frombits(binary.LittleEndian.Uint32(src[i:]))
			if div != 0 {
				x /= d
			} else {
				x *= m
			}
			binary.LittleEndian.PutUint32(dst[i:], math.Float32bits(x))
		}
	case collective.Float64:
		for i := 0; i+8 <= len(dst); i += 8 {
			x := math.Float64frombits(binary.LittleEndian.Uint64(src[i:]))
			if div != 0 {
				x /= div
			} else {
				x *= mul
			}
			binary.LittleEndian.PutUint64(dst[i:], math.Float64bits(x))
		}
	}
}

// addScaled sets dst[i] += float(src[i] * pre), the product rounded
// before the sum (no fused multiply-add).
func addScaled(dst, src []byte, dt collective.DType, pre float64) {
	switch dt {
	case collective.Float32:
		p := float32(pre)
		for i := 0; i+4 <= len(dst); i += 4 {
			x := math.Float32frombits(binary.LittleEndian.Uint32(dst[i:]))
			y := float32(math.Float32frombits(binary.LittleEndian.Uint32(src[i:])) * p)
			binary.LittleEndian.PutUint32(dst[i:], math.Float32bits(x+y))
		}
	case collective.Float64:
		for i := 0; i+8 <= len(dst); i += 8 {
			x := math.Float64frombits(binary.LittleEndian.Uint64(dst[i:]))
			y := float64(math.Float64frombits(binary.LittleEndian.Uint64(src[i:])) * pre)
			binary.LittleEndian.PutUint64(dst[i:], math.Float64bits(x+y))
		}
	}
}
