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

	Sum  = collective.Sum
	Prod = collective.Prod
	Max  = collective.Max
	Min  = collective.Min
)

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
	~float32 | ~float64 | ~int32 | ~int64
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
	}
	// A named type with one of those underlying types.
	switch unsafe.Sizeof(z) {
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
