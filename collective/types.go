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
)

var opNames = [...]string{"invalid", "allreduce", "broadcast", "allgather", "barrier"}

func (o Op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Valid reports whether o is a known collective.
func (o Op) Valid() bool { return o >= OpAllReduce && o <= OpBarrier }

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
)

var dtypeNames = [...]string{"invalid", "float32", "float64", "int32", "int64", "bytes"}
var dtypeSizes = [...]int{0, 4, 8, 4, 8, 1}

func (d DType) String() string {
	if int(d) < len(dtypeNames) {
		return dtypeNames[d]
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// Valid reports whether d is a known element type.
func (d DType) Valid() bool { return d >= Float32 && d <= Bytes }

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
	case "bytes", "u8":
		return Bytes, nil
	}
	return DTypeInvalid, fmt.Errorf("unknown dtype %q (want float32, float64, int32, int64 or bytes)", s)
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
)

var reduceNames = [...]string{"none", "sum", "prod", "max", "min"}

func (r ReduceOp) String() string {
	if int(r) < len(reduceNames) {
		return reduceNames[r]
	}
	return fmt.Sprintf("reduce(%d)", uint8(r))
}

// Valid reports whether r is a known reduce operation other than ReduceNone.
func (r ReduceOp) Valid() bool { return r >= Sum && r <= Min }

// ParseReduceOp maps "sum", "prod", "max" or "min" to its ReduceOp.
func ParseReduceOp(s string) (ReduceOp, error) {
	for i := Sum; i <= Min; i++ {
		if reduceNames[i] == s {
			return i, nil
		}
	}
	return ReduceNone, fmt.Errorf("unknown reduce op %q (want sum, prod, max or min)", s)
}
