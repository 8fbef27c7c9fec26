package collective

import "fmt"

// Op is the kind of collective. The numeric values are wire codes.
type Op uint8

const (
	OpInvalid   Op = 0
	OpAllReduce Op = 1
	OpBroadcast Op = 2
	OpAllGather Op = 3
	OpBarrier   Op = 4
	// OpReduceScatter and OpReduce need protocol version 3.
	OpReduceScatter Op = 5
	OpReduce        Op = 6
)

var opNames = [...]string{"invalid", "allreduce", "broadcast", "allgather", "barrier", "reduce_scatter", "reduce"}

func (o Op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Valid reports whether o is a known collective.
func (o Op) Valid() bool { return o >= OpAllReduce && o <= OpReduce }

// Reduces reports whether the op combines values with a ReduceOp.
func (o Op) Reduces() bool { return o == OpAllReduce || o == OpReduceScatter || o == OpReduce }

// Rooted reports whether the op has a root rank.
func (o Op) Rooted() bool { return o == OpBroadcast || o == OpReduce }

// Since is the first protocol version that has the op.
func (o Op) Since() int {
	if o == OpAllGather || o > OpBarrier {
		return 3
	}
	return 1
}

// DType is the element type of a buffer. The numeric values are wire codes.
type DType uint8

const (
	DTypeInvalid DType = 0
	Float32      DType = 1
	Float64      DType = 2
	Int32        DType = 3
	Int64        DType = 4
	// Bytes is an untyped byte buffer (element size 1). It may be used by
	// broadcast, allgather and barrier, never by allreduce.
	Bytes DType = 5
	// Float16 is IEEE 754 binary16; BFloat16 is the upper half of a
	// binary32. Both are computed in float32 (docs/PROTOCOL.md,
	// Reductions). These and the 8-bit integers need protocol version 3.
	Float16  DType = 6
	BFloat16 DType = 7
	Int8     DType = 8
	Uint8    DType = 9
)

var dtypeNames = [...]string{"invalid", "float32", "float64", "int32", "int64", "bytes", "float16", "bfloat16", "int8", "uint8"}
var dtypeSizes = [...]int{0, 4, 8, 4, 8, 1, 2, 2, 1, 1}

func (d DType) String() string {
	if int(d) < len(dtypeNames) {
		return dtypeNames[d]
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// Valid reports whether d is a known element type.
func (d DType) Valid() bool { return d >= Float32 && d <= Uint8 }

// Float reports whether d is a floating-point type.
func (d DType) Float() bool {
	return d == Float32 || d == Float64 || d == Float16 || d == BFloat16
}

// Half reports whether d is a 16-bit float, computed in float32.
func (d DType) Half() bool { return d == Float16 || d == BFloat16 }

// Since is the first protocol version that has the type.
func (d DType) Since() int {
	if d > Bytes {
		return 3
	}
	return 1
}

// Size is the element size in bytes, 0 for an invalid type.
func (d DType) Size() int {
	if int(d) < len(dtypeSizes) {
		return dtypeSizes[d]
	}
	return 0
}

// ParseDType maps a name such as "float32" or "f32" to its DType.
func ParseDType(s string) (DType, error) {
	switch s {
	case "float32", "f32":
		return Float32, nil
	case "float64", "f64":
		return Float64, nil
	case "int32", "i32":
		return Int32, nil
	case "int64", "i64":
		return Int64, nil
	case "bytes":
		return Bytes, nil
	case "float16", "f16", "half":
		return Float16, nil
	case "bfloat16", "bf16":
		return BFloat16, nil
	case "int8", "i8":
		return Int8, nil
	case "uint8", "u8":
		return Uint8, nil
	}
	return DTypeInvalid, fmt.Errorf("unknown dtype %q (want one of %s)", s, DTypeNames())
}

// ReduceOp is how allreduce combines elements. The numeric values are wire
// codes. Operations other than allreduce carry ReduceNone.
type ReduceOp uint8

const (
	ReduceNone ReduceOp = 0
	Sum        ReduceOp = 1
	Prod       ReduceOp = 2
	Max        ReduceOp = 3
	Min        ReduceOp = 4
	// Avg is Sum followed by one division by the world size, for float
	// types only. It needs protocol version 3.
	Avg ReduceOp = 5
)

var reduceNames = [...]string{"none", "sum", "prod", "max", "min", "avg"}

func (r ReduceOp) String() string {
	if int(r) < len(reduceNames) {
		return reduceNames[r]
	}
	return fmt.Sprintf("reduce(%d)", uint8(r))
}

// Valid reports whether r is a known reduce operation other than ReduceNone.
func (r ReduceOp) Valid() bool { return r >= Sum && r <= Avg }

// Since is the first protocol version that has the op.
func (r ReduceOp) Since() int {
	if r == Avg {
		return 3
	}
	return 1
}

// ParseReduceOp maps "sum", "prod", "max", "min" or "avg" to its ReduceOp.
func ParseReduceOp(s string) (ReduceOp, error) {
	for i := Sum; i <= Avg; i++ {
		if reduceNames[i] == s {
			return i, nil
		}
	}
	return ReduceNone, fmt.Errorf("unknown reduce op %q (want sum, prod, max, min or avg)", s)
}

// DTypeNames lists the element types, for messages.
func DTypeNames() string {
	s := ""
	for d := Float32; d <= Uint8; d++ {
		if s != "" {
			s += ", "
		}
		s += d.String()
	}
	return s
}
