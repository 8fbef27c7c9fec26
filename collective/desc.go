package collective

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// MaxNameLen bounds the optional name of a call, in bytes.
const MaxNameLen = 255

// ErrInvalid is wrapped by every error Validate returns.
var ErrInvalid = errors.New("invalid collective description")

// MaxDims bounds the number of dimensions of a shape.
const MaxDims = 8

// Shape is the optional shape of a call's input buffer, outermost
// dimension first. N == 0 means no shape was given. It is comparable.
type Shape struct {
	N    uint8
	Dims [MaxDims]uint64
}

// Slice returns the dimensions in use.
func (s *Shape) Slice() []uint64 { return s.Dims[:min(int(s.N), MaxDims)] }

func (s Shape) String() string {
	str := "("
	for i, d := range s.Slice() {
		if i > 0 {
			str += ","
		}
		str += fmt.Sprint(d)
	}
	if s.N == 1 {
		str += ","
	}
	return str + ")"
}

// Desc describes one collective call. Two calls join the same collective
// only if their descriptions are Equal.
type Desc struct {
	Op     Op
	DType  DType
	Reduce ReduceOp
	// Count is the number of elements in the caller's input buffer. For
	// allgather it is the count this rank contributes.
	Count uint64
	// Root is the root rank of a broadcast or reduce, 0 otherwise.
	Root uint32
	// Name is an optional label; it takes part in matching.
	Name string
	// Named (protocol version 4): the call matches the calls of the same
	// Name on every trainer in whatever order they come, not by its
	// place in the trainer's sequence of calls (docs/MATCHING.md).
	Named bool
	// Shape, if Shape.N > 0, is the input's shape; it takes part in
	// matching (the first dimension of a "v" allgather excepted).
	Shape Shape
	// Counts, if not nil, are the per-rank counts of the "v" forms of
	// allgather and reduce_scatter, one per world rank.
	Counts []uint64
	// PreScale and PostScale, when nonzero, multiply every input element
	// before and every result element after a float reduction. Zero means
	// not given (a factor of 1); the wire never carries 0. Matched takes a
	// factor of exactly 1 as none, so that calls agree however a client
	// spells "no scaling".
	PreScale, PostScale float64
}

// Bytes is the caller's input buffer length in bytes.
func (d Desc) Bytes() uint64 { return d.Count * uint64(d.DType.Size()) }

// Scaled reports whether either scale factor is given.
func (d *Desc) Scaled() bool { return d.PreScale != 0 || d.PostScale != 0 }

// Extended reports whether the call needs protocol version 3's CALL
// extension.
func (d *Desc) Extended() bool { return d.Shape.N > 0 || d.Counts != nil || d.Scaled() }

// Since is the first protocol version that can carry the call.
func (d *Desc) Since() int {
	v := max(d.Op.Since(), d.DType.Since(), d.Reduce.Since())
	if d.Extended() {
		v = 3
	}
	if d.Named {
		v = 4
	}
	return v
}

// VCount reports whether d is the "v" allgather, whose Count is each
// rank's own and whose first shape dimension follows it.
func (d *Desc) VCount() bool { return d.Op == OpAllGather && d.Counts != nil }

// Matched is the part of d that every rank's call must share: d itself,
// except that a scale factor of 1 is none (0), and a "v" allgather's
// Count (the caller's own counts[r]) is replaced by the sum of the counts
// and its first shape dimension by 0.
func (d Desc) Matched() Desc {
	if d.PreScale == 1 {
		d.PreScale = 0
	}
	if d.PostScale == 1 {
		d.PostScale = 0
	}
	if d.VCount() {
		d.Count = d.Total()
		if d.Shape.N > 0 {
			d.Shape.Dims[0] = 0
		}
	}
	return d
}

// Total is the sum of Counts (0 without them). Validate has checked
// that it does not overflow.
func (d *Desc) Total() uint64 {
	var t uint64
	for _, c := range d.Counts {
		t += c
	}
	return t
}

// Equal reports whether two calls may join the same collective.
func (d Desc) Equal(o Desc) bool {
	a, b := d.Matched(), o.Matched()
	if len(a.Counts) != len(b.Counts) || (a.Counts == nil) != (b.Counts == nil) {
		return false
	}
	for i := range a.Counts {
		if a.Counts[i] != b.Counts[i] {
			return false
		}
	}
	return a.Op == b.Op && a.DType == b.DType && a.Reduce == b.Reduce && a.Count == b.Count &&
		a.Root == b.Root && a.Name == b.Name && a.Named == b.Named && a.Shape == b.Shape &&
		math.Float64bits(a.PreScale) == math.Float64bits(b.PreScale) &&
		math.Float64bits(a.PostScale) == math.Float64bits(b.PostScale)
}

// maxCount bounds any count: no buffer is larger.
const maxCount = 1 << 40

// Validate checks that the description is well formed for a world of the
// given size (the number of ranks a root falls within and Counts has).
func (d Desc) Validate(worldSize int) error {
	if !d.Op.Valid() {
		return fmt.Errorf("%w: unknown op code %d", ErrInvalid, uint8(d.Op))
	}
	if len(d.Name) > MaxNameLen {
		return fmt.Errorf("%w: name is %d bytes, limit %d", ErrInvalid, len(d.Name), MaxNameLen)
	}
	if d.Named && d.Name == "" {
		return fmt.Errorf("%w: a named call needs a name", ErrInvalid)
	}
	if d.Op == OpBarrier {
		if d.Count != 0 || d.Root != 0 || d.Reduce != ReduceNone || d.Extended() {
			return fmt.Errorf("%w: barrier takes no count, root, reduce op, shape, counts or scale", ErrInvalid)
		}
		return nil
	}
	if !d.DType.Valid() {
		return fmt.Errorf("%w: unknown dtype code %d (known: %s)", ErrInvalid, uint8(d.DType), DTypeNames())
	}
	if d.Op.Reduces() {
		if !d.Reduce.Valid() {
			return fmt.Errorf("%w: %s needs a reduce op (sum, prod, max, min, avg), got code %d", ErrInvalid, d.Op, uint8(d.Reduce))
		}
		if d.DType == Bytes {
			return fmt.Errorf("%w: %s cannot reduce untyped bytes", ErrInvalid, d.Op)
		}
		if d.Reduce == Avg && !d.DType.Float() {
			return fmt.Errorf("%w: avg needs a float dtype, got %s (sum the integers and divide yourself)", ErrInvalid, d.DType)
		}
	} else if d.Reduce != ReduceNone {
		return fmt.Errorf("%w: %s takes no reduce op, got %s", ErrInvalid, d.Op, d.Reduce)
	}
	if d.Count > maxCount {
		return fmt.Errorf("%w: count %d is beyond any buffer", ErrInvalid, d.Count)
	}
	if d.Op.Rooted() {
		if int64(d.Root) >= int64(worldSize) {
			return fmt.Errorf("%w: %s root %d outside world of %d", ErrInvalid, d.Op, d.Root, worldSize)
		}
	} else if d.Root != 0 {
		return fmt.Errorf("%w: %s takes no root, got %d", ErrInvalid, d.Op, d.Root)
	}
	if err := d.validateShape(); err != nil {
		return err
	}
	if err := d.validateCounts(worldSize); err != nil {
		return err
	}
	if d.Scaled() {
		if !d.Op.Reduces() || !d.DType.Float() || d.Reduce != Sum && d.Reduce != Avg {
			return fmt.Errorf("%w: prescale and postscale apply to a sum or avg of a float dtype, not %s of %s", ErrInvalid, d.Reduce, d.DType)
		}
		for _, f := range [2]struct {
			name string
			v    float64
		}{{"prescale", d.PreScale}, {"postscale", d.PostScale}} {
			if math.IsNaN(f.v) || math.IsInf(f.v, 0) {
				return fmt.Errorf("%w: %s %v must be finite", ErrInvalid, f.name, f.v)
			}
		}
	}
	if d.Op == OpReduceScatter && d.Counts == nil && worldSize > 0 && d.Count%uint64(worldSize) != 0 {
		return fmt.Errorf("%w: reduce_scatter count %d is not a multiple of the world size %d (use per-rank counts)", ErrInvalid, d.Count, worldSize)
	}
	return nil
}

func (d *Desc) validateShape() error {
	if d.Shape.N == 0 {
		return nil
	}
	if d.Shape.N > MaxDims {
		return fmt.Errorf("%w: shape has %d dimensions, limit %d", ErrInvalid, d.Shape.N, MaxDims)
	}
	for _, x := range d.Shape.Dims[d.Shape.N:] {
		if x != 0 {
			return fmt.Errorf("%w: shape has dimensions beyond its %d", ErrInvalid, d.Shape.N)
		}
	}
	p := uint64(1)
	for _, x := range d.Shape.Slice() {
		if x == 0 {
			p = 0
			break
		}
		if p > maxCount/x {
			return fmt.Errorf("%w: shape %s holds more than %d elements", ErrInvalid, d.Shape, uint64(maxCount))
		}
		p *= x
	}
	if p != d.Count {
		return fmt.Errorf("%w: shape %s holds %d elements, count is %d", ErrInvalid, d.Shape, p, d.Count)
	}
	return nil
}

func (d *Desc) validateCounts(worldSize int) error {
	if d.Counts == nil {
		return nil
	}
	if d.Op != OpAllGather && d.Op != OpReduceScatter {
		return fmt.Errorf("%w: %s takes no per-rank counts", ErrInvalid, d.Op)
	}
	if len(d.Counts) != worldSize {
		return fmt.Errorf("%w: %d per-rank counts for a world of %d", ErrInvalid, len(d.Counts), worldSize)
	}
	var t uint64
	for i, c := range d.Counts {
		if c > maxCount || t+c > maxCount {
			return fmt.Errorf("%w: counts[%d] = %d brings the total beyond any buffer", ErrInvalid, i, c)
		}
		t += c
	}
	if d.Op == OpReduceScatter && t != d.Count {
		return fmt.Errorf("%w: reduce_scatter counts sum to %d, count is %d", ErrInvalid, t, d.Count)
	}
	return nil
}

// CheckRank checks the fields that depend on the caller's world rank: a
// "v" allgather's count must be the caller's own entry of Counts.
func (d *Desc) CheckRank(rank int) error {
	if d.VCount() && rank < len(d.Counts) && d.Counts[rank] != d.Count {
		return fmt.Errorf("%w: allgather count %d but counts[%d] = %d (the caller's entry)", ErrInvalid, d.Count, rank, d.Counts[rank])
	}
	return nil
}

// Block is world rank w's block of an allgather's result or of a
// reduce_scatter's input, in elements: its offset and its length (Counts'
// entries, else Count each for allgather and Count/world for
// reduce_scatter). Offsets of the "v" forms take O(w).
func (d *Desc) Block(w, world int) (off, n uint64) {
	switch {
	case d.Counts != nil:
		for _, c := range d.Counts[:w] {
			off += c
		}
		return off, d.Counts[w]
	case d.Op == OpReduceScatter:
		n = d.Count / uint64(max(world, 1))
	default:
		n = d.Count
	}
	return uint64(w) * n, n
}

// Result is the number of elements of the caller's result: the input's
// count, except for allgather (every rank's block) and reduce_scatter (the
// caller's block). rank is the caller's world rank, worldSize the world's.
func (d *Desc) Result(rank, worldSize int) uint64 {
	switch d.Op {
	case OpAllGather:
		if d.Counts != nil {
			return d.Total()
		}
		return d.Count * uint64(worldSize)
	case OpReduceScatter:
		_, n := d.Block(rank, worldSize)
		return n
	}
	return d.Count
}

// String renders the description the way errors show it, e.g.
// `allreduce(float32, sum, count=1024, name="grad")`.
func (d Desc) String() string {
	s := d.Op.String() + "("
	switch {
	case d.Op == OpBarrier:
	case d.Op.Reduces():
		s += fmt.Sprintf("%s, %s, count=%d", d.DType, d.Reduce, d.Count)
	default:
		s += fmt.Sprintf("%s, count=%d", d.DType, d.Count)
	}
	if d.Op.Rooted() {
		s += fmt.Sprintf(", root=%d", d.Root)
	}
	if d.Shape.N > 0 {
		s += ", shape=" + d.Shape.String()
	}
	if d.Counts != nil {
		s += ", counts=["
		for i, c := range d.Counts {
			if i == 8 && len(d.Counts) > 10 {
				s += fmt.Sprintf(", ... %d more", len(d.Counts)-i)
				break
			}
			if i > 0 {
				s += ","
			}
			s += fmt.Sprint(c)
		}
		s += "]"
	}
	if d.PreScale != 0 {
		s += fmt.Sprintf(", prescale=%g", d.PreScale)
	}
	if d.PostScale != 0 {
		s += fmt.Sprintf(", postscale=%g", d.PostScale)
	}
	if d.Name != "" {
		if d.Op != OpBarrier {
			s += ", "
		}
		s += fmt.Sprintf("name=%q", d.Name)
		if d.Named {
			s += ", named"
		}
	}
	return s + ")"
}

// Fingerprint is a 64-bit FNV-1a digest of the matched description
// (Matched), name, shape, counts and scales included. Equal descriptions
// have equal fingerprints; ring frames carry it so that a receiver can
// tell a diverged peer from a matching one. It does not allocate.
func (d Desc) Fingerprint() uint64 {
	d = d.Matched()
	var b [20]byte
	b[0] = byte(d.Op)
	b[1] = byte(d.DType)
	b[2] = byte(d.Reduce)
	binary.LittleEndian.PutUint64(b[4:], d.Count)
	binary.LittleEndian.PutUint32(b[12:], d.Root)
	binary.LittleEndian.PutUint32(b[16:], uint32(len(d.Name)))
	const offset64, prime64 = 14695981039346656037, 1099511628211
	h := uint64(offset64)
	for _, c := range b {
		h = (h ^ uint64(c)) * prime64
	}
	for i := 0; i < len(d.Name); i++ {
		h = (h ^ uint64(d.Name[i])) * prime64
	}
	if d.Named {
		h = (h ^ 'N') * prime64
	}
	if !d.Extended() {
		return h // as before the extension existed
	}
	word := func(v uint64) {
		for i := 0; i < 8; i++ {
			h = (h ^ (v & 0xff)) * prime64
			v >>= 8
		}
	}
	word(uint64(d.Shape.N))
	for _, x := range d.Shape.Slice() {
		word(x)
	}
	if d.Counts != nil {
		word(uint64(len(d.Counts)) | 1<<63)
		for _, c := range d.Counts {
			word(c)
		}
	}
	word(math.Float64bits(d.PreScale))
	word(math.Float64bits(d.PostScale))
	return h
}
