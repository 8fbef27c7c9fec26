package ring

import "github.com/collectived/collectived/collective"

// Reduce folds src into dst element by element (dst = dst op src) with the
// same kernels the ring uses, so that a caller's local reduction follows
// the ring's arithmetic exactly (NaN through max and min, wrapping integer
// sums). dst and src hold elements of dt and have the same length.
func Reduce(dst, src []byte, dt collective.DType, op collective.ReduceOp) {
	kernelFor(dt, op)(dst, dst, src)
}
