package collective

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// MaxNameLen bounds the optional name of a call, in bytes.
const MaxNameLen = 255

// ErrInvalid is wrapped by every error Validate returns.
var ErrInvalid = errors.New("invalid collective description")

// Desc describes one collective call. Two calls join the same collective
// only if their descriptions are Equal.
type Desc struct {
	Op     Op
	DType  DType
	Reduce ReduceOp
	// Count is the number of elements in the caller's buffer. For
	// allgather it is the count each rank contributes.
	Count uint64
	// Root is the source rank of a broadcast, 0 otherwise.
	Root uint32
	// Name is an optional label; it takes part in matching.
	Name string
}

// Bytes is the caller's buffer length in bytes.
func (d Desc) Bytes() uint64 { return d.Count * uint64(d.DType.Size()) }

// Equal reports whether two calls may join the same collective.
func (d Desc) Equal(o Desc) bool { return d == o }

// Validate checks that the description is well formed for a world of the
// given size (the number of ranks a broadcast root must fall within).
func (d Desc) Validate(worldSize int) error {
	if !d.Op.Valid() {
		return fmt.Errorf("%w: unknown op code %d", ErrInvalid, uint8(d.Op))
	}
	if len(d.Name) > MaxNameLen {
		return fmt.Errorf("%w: name is %d bytes, limit %d", ErrInvalid, len(d.Name), MaxNameLen)
	}
	switch d.Op {
	case OpBarrier:
		if d.Count != 0 || d.Root != 0 || d.Reduce != ReduceNone {
			return fmt.Errorf("%w: barrier takes no count, root or reduce op", ErrInvalid)
		}
		return nil
	case OpAllReduce:
		if !d.Reduce.Valid() {
			return fmt.Errorf("%w: allreduce needs a reduce op (sum, prod, max, min), got code %d", ErrInvalid, uint8(d.Reduce))
		}
		if d.DType == Bytes {
			return fmt.Errorf("%w: allreduce cannot reduce untyped bytes", ErrInvalid)
		}
	default:
		if d.Reduce != ReduceNone {
			return fmt.Errorf("%w: %s takes no reduce op, got %s", ErrInvalid, d.Op, d.Reduce)
		}
	}
	if !d.DType.Valid() {
		return fmt.Errorf("%w: unknown dtype code %d", ErrInvalid, uint8(d.DType))
	}
	if d.Count > 1<<40 {
		return fmt.Errorf("%w: count %d is beyond any buffer", ErrInvalid, d.Count)
	}
	if d.Op == OpBroadcast {
		if int64(d.Root) >= int64(worldSize) {
			return fmt.Errorf("%w: broadcast root %d outside world of %d", ErrInvalid, d.Root, worldSize)
		}
	} else if d.Root != 0 {
		return fmt.Errorf("%w: %s takes no root, got %d", ErrInvalid, d.Op, d.Root)
	}
	return nil
}

// String renders the description the way errors show it, e.g.
// `allreduce(float32, sum, count=1024, name="grad")`.
func (d Desc) String() string {
	s := d.Op.String() + "("
	switch d.Op {
	case OpBarrier:
	case OpAllReduce:
		s += fmt.Sprintf("%s, %s, count=%d", d.DType, d.Reduce, d.Count)
	case OpBroadcast:
		s += fmt.Sprintf("%s, count=%d, root=%d", d.DType, d.Count, d.Root)
	default:
		s += fmt.Sprintf("%s, count=%d", d.DType, d.Count)
	}
	if d.Name != "" {
		if d.Op != OpBarrier {
			s += ", "
		}
		s += fmt.Sprintf("name=%q", d.Name)
	}
	return s + ")"
}

// Fingerprint is a 64-bit FNV-1a digest of the whole description, name
// included. Equal descriptions have equal fingerprints; ring frames carry it
// so that a receiver can tell a diverged peer from a matching one. It does
// not allocate.
func (d Desc) Fingerprint() uint64 {
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
	return h
}
