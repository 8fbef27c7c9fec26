package collectived

import (
	"unsafe"

	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/ipc"
)

// Element types and reduce operations, re-exported so that a trainer needs
// one import.
type (
	DType    = collective.DType
	ReduceOp = collective.ReduceOp
	Desc     = collective.Desc
	// Error is an error reported by the daemon: Code for programs,
	// Message for people.
	Error = ipc.Error
)

const (
	Float32 = collective.Float32
	Float64 = collective.Float64
	Int32   = collective.Int32
	Int64   = collective.Int64
	Bytes   = collective.Bytes
	// Version 3 types.
	DTypeFloat16  = collective.Float16
	DTypeBFloat16 = collective.BFloat16
	Int8          = collective.Int8
	Uint8         = collective.Uint8

	Sum  = collective.Sum
	Prod = collective.Prod
	Max  = collective.Max
	Min  = collective.Min
	// Avg is Sum divided once by the world size, for float types.
	Avg = collective.Avg
)

// BFloat16 and Float16 are the 16-bit float element types, held as their
// bits: the daemon computes with them in float32 and rounds to nearest
// even (docs/PROTOCOL.md, Reductions).
type (
	BFloat16 uint16
	Float16  uint16
)

// ToBFloat16 rounds f to the nearest bfloat16.
func ToBFloat16(f float32) BFloat16 { return BFloat16(collective.Float32ToBFloat16(f)) }

// Float32 widens b exactly.
func (b BFloat16) Float32() float32 { return collective.BFloat16ToFloat32(uint16(b)) }

// ToFloat16 rounds f to the nearest IEEE binary16.
func ToFloat16(f float32) Float16 { return Float16(collective.Float32ToFloat16(f)) }

// Float32 widens h exactly.
func (h Float16) Float32() float32 { return collective.Float16ToFloat32(uint16(h)) }

// Sentinel errors for errors.Is, one per daemon error code.
var (
	ErrMismatch    = ipc.ErrMismatch
	ErrTimeout     = ipc.ErrTimeout
	ErrPeerLost    = ipc.ErrPeerLost
	ErrTrainerLost = ipc.ErrTrainerLost
	ErrAborted     = ipc.ErrAborted
	ErrShutdown    = ipc.ErrShutdown
	ErrQuota       = ipc.ErrQuota
	ErrBadRequest  = ipc.ErrBadRequest
	ErrRankTaken   = ipc.ErrRankTaken
	ErrCorrupt     = ipc.ErrCorrupt
)

// Elem is an element type the daemon reduces.
type Elem interface {
	~float32 | ~float64 | ~int32 | ~int64 | ~int8 | ~uint8 | BFloat16 | Float16
}

func dtypeOf[T Elem]() DType {
	var z T
	switch any(z).(type) {
	case float32:
		return Float32
	case float64:
		return Float64
	case int32:
		return Int32
	case int64:
		return Int64
	case int8:
		return Int8
	case uint8:
		return Uint8
	case BFloat16:
		return DTypeBFloat16
	case Float16:
		return DTypeFloat16
	}
	// A named type with one of those underlying types.
	switch unsafe.Sizeof(z) {
	case 1:
		if z-1 < 0 {
			return Int8
		}
		return Uint8
	case 4:
		if isFloat[T]() {
			return Float32
		}
		return Int32
	default:
		if isFloat[T]() {
			return Float64
		}
		return Int64
	}
}

func isFloat[T Elem]() bool {
	var half T = 1
	half /= 2
	return half != 0
}

func asBytes[T Elem](x []T) []byte {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), len(x)*int(unsafe.Sizeof(x[0])))
}
