package collective

import (
	"encoding/binary"
	"math"
)

// Put stores v as one element of type d at the start of b, in the wire's
// little-endian layout (converting as Go converts float64 to the type).
// It is for tools and tests that fill buffers; the reduce kernels in ring/
// never go through float64.
func (d DType) Put(b []byte, v float64) {
	switch d {
	case Float32:
		binary.LittleEndian.PutUint32(b, math.Float32bits(float32(v)))
	case Float64:
		binary.LittleEndian.PutUint64(b, math.Float64bits(v))
	case Int32:
		binary.LittleEndian.PutUint32(b, uint32(int32(v)))
	case Int64:
		binary.LittleEndian.PutUint64(b, uint64(int64(v)))
	case Bytes, Uint8:
		b[0] = byte(v)
	case Int8:
		b[0] = byte(int8(v))
	case Float16:
		binary.LittleEndian.PutUint16(b, Float32ToFloat16(float32(v)))
	case BFloat16:
		binary.LittleEndian.PutUint16(b, Float32ToBFloat16(float32(v)))
	}
}

// Get reads the element of type d at the start of b as a float64 (NaN for
// an invalid type).
func (d DType) Get(b []byte) float64 {
	switch d {
	case Float32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b)))
	case Float64:
		return math.Float64frombits(binary.LittleEndian.Uint64(b))
	case Int32:
		return float64(int32(binary.LittleEndian.Uint32(b)))
	case Int64:
		return float64(int64(binary.LittleEndian.Uint64(b)))
	case Bytes, Uint8:
		return float64(b[0])
	case Int8:
		return float64(int8(b[0]))
	case Float16:
		return float64(Float16ToFloat32(binary.LittleEndian.Uint16(b)))
	case BFloat16:
		return float64(BFloat16ToFloat32(binary.LittleEndian.Uint16(b)))
	}
	return math.NaN()
}
