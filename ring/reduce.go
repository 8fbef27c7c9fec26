package ring

import (
	"fmt"

	"github.com/collectived/collectived/collective"
)

// Reduce folds src into dst in place, dst[i] = dst[i] (op) src[i], with
// the same kernels and semantics as AllReduce (native little-endian
// elements, wrapping integers, NaN-propagating max and min): it is the
// fold AllReduceLocal applies to a rank's local buffers, left to right.
// It allocates nothing.
func Reduce(dst, src []byte, dt collective.DType, op collective.ReduceOp) error {
	k := kernelFor(dt, op)
	if k == nil {
		return fmt.Errorf("ring: no reduce kernel for %s %s: %w", dt, op, collective.ErrInvalid)
	}
	if len(dst) != len(src) || len(dst)%dt.Size() != 0 {
		return fmt.Errorf("ring: reduce of %d bytes into %d bytes of %s: %w", len(src), len(dst), dt, collective.ErrInvalid)
	}
	k(dst, dst, src)
	return nil
}
