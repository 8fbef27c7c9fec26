//go:build purego

package ring

import (
	"reflect"
	"testing"
)

// With -tags purego (make test runs the ring so too) the ring runs the
// portable Go kernels alone, as on a CPU without AVX2.
func TestPuregoRunsPortableKernels(t *testing.T) {
	for dt := range kernels {
		for op := range kernels[dt] {
			got, want := reflect.ValueOf(kernels[dt][op]).Pointer(), reflect.ValueOf(portable[dt][op]).Pointer()
			if got != want {
				t.Errorf("dtype %d op %d: the ring runs kernel %#x, not the portable one %#x", dt, op, got, want)
			}
		}
	}
}
