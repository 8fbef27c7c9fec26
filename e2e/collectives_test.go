package e2e

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	cvd "github.com/collectived/collectived/clients/go"
	"github.com/collectived/collectived/collective"
)

// The version-3 collectives through daemon processes and the Go client,
// on a world of 2 nodes x 2 trainers: every result is checked exactly
// (integer-valued data, so that float sums are exact in any order).

func TestVersion3Collectives(t *testing.T) {
	w := startWorld(t, 2, 2, "")
	cs := everyTrainer(t, w)
	W := len(cs)
	for _, n := range []int{0, 1, 3, W - 1, 1<<20 + 3} {
		// allgather, equal blocks: trainer i contributes i*1000 + k.
		errs := onEvery(t, cs, func(i int, c *cvd.Client) error {
			x := make([]int32, n)
			for k := range x {
				x[k] = int32(i*1000 + k%1000)
			}
			out := make([]int32, n*W)
			if err := cvd.AllGather(c, x, out); err != nil {
				return err
			}
			for j := 0; j < W; j++ {
				for k := 0; k < n; k++ {
					if out[j*n+k] != int32(j*1000+k%1000) {
						return fmt.Errorf("allgather n=%d: out[%d] = %d, want rank %d's element %d", n, j*n+k, out[j*n+k], j, k)
					}
				}
			}
			return nil
		})
		noErrs(t, fmt.Sprintf("allgather n=%d", n), errs)

		// reduce_scatter of bfloat16 sum: small integers are exact.
		if n*W <= 1<<20+3*W {
			errs = onEvery(t, cs, func(i int, c *cvd.Client) error {
				x := make([]cvd.BFloat16, n*W)
				for k := range x {
					x[k] = cvd.ToBFloat16(float32(k%7 + i))
				}
				out := make([]cvd.BFloat16, n)
				if err := cvd.ReduceScatter(c, x, out, cvd.Sum); err != nil {
					return err
				}
				for k := range out {
					e := i*n + k
					want := float32(W*(e%7) + W*(W-1)/2)
					if got := out[k].Float32(); got != want {
						return fmt.Errorf("reduce_scatter n=%d: element %d = %v, want %v", n, e, got, want)
					}
				}
				return nil
			})
			noErrs(t, fmt.Sprintf("reduce_scatter n=%d", n), errs)
		}
	}

	// The v forms, zero counts included, and blocks smaller than the world.
	counts := []int{3, 0, 1, 5}
	total := 9
	errs := onEvery(t, cs, func(i int, c *cvd.Client) error {
		x := make([]float64, counts[i])
		for k := range x {
			x[k] = float64(100*i + k)
		}
		out := make([]float64, total)
		if err := cvd.AllGatherV(c, x, counts, out); err != nil {
			return err
		}
		o := 0
		for j, cn := range counts {
			for k := 0; k < cn; k++ {
				if out[o] != float64(100*j+k) {
					return fmt.Errorf("allgatherv: out[%d] = %v, want rank %d's element %d", o, out[o], j, k)
				}
				o++
			}
		}
		v := make([]int8, total)
		for k := range v {
			v[k] = int8(60 + i) // the sum wraps: 4 x ~61 > 127
		}
		mine := make([]int8, counts[i])
		if err := cvd.ReduceScatterV(c, v, counts, mine, cvd.Sum); err != nil {
			return err
		}
		want := int8(0)
		for j := 0; j < W; j++ {
			want += int8(60 + j)
		}
		for k, got := range mine {
			if got != want {
				return fmt.Errorf("reduce_scatterv int8: element %d = %d, want %d (wrapped)", k, got, want)
			}
		}
		return nil
	})
	noErrs(t, "v forms", errs)

	// reduce to every root: the root gets the max, the others keep theirs.
	for root := 0; root < W; root++ {
		errs := onEvery(t, cs, func(i int, c *cvd.Client) error {
			x := []uint8{uint8(10 * i), 200, uint8(i)}
			if err := cvd.Reduce(c, x, root, cvd.Max); err != nil {
				return err
			}
			want := []uint8{uint8(10 * (W - 1)), 200, uint8(W - 1)}
			if i != root {
				want = []uint8{uint8(10 * i), 200, uint8(i)}
			}
			if string(x) != string(want) {
				return fmt.Errorf("reduce to %d: rank %d has %v, want %v", root, i, x, want)
			}
			return nil
		})
		noErrs(t, fmt.Sprintf("reduce root %d", root), errs)
	}

	// avg of float16 with a postscale: (sum of 1..W)/W*2 is exact.
	errs = onEvery(t, cs, func(i int, c *cvd.Client) error {
		x := make([]cvd.Float16, 1000)
		for k := range x {
			x[k] = cvd.ToFloat16(float32(i + 1))
		}
		d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float16, Reduce: collective.Avg, Count: 1000, PostScale: 2}
		b := f16Bytes(x)
		if err := c.Do(d, b); err != nil {
			return err
		}
		for k := range x {
			x[k] = cvd.Float16(uint16(b[2*k]) | uint16(b[2*k+1])<<8)
		}
		want := float32(W*(W+1)/2) / float32(W) * 2
		for k := range x {
			if x[k].Float32() != want {
				return fmt.Errorf("avg: element %d = %v, want %v", k, x[k].Float32(), want)
			}
		}
		return nil
	})
	noErrs(t, "avg", errs)
}

func f16Bytes(x []cvd.Float16) []byte {
	b := make([]byte, 0, 2*len(x))
	for _, v := range x {
		b = append(b, byte(v), byte(v>>8))
	}
	return b[:len(b):len(b)]
}

func noErrs(t *testing.T, what string, errs []error) {
	t.Helper()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s: trainer %d: %v", what, i, err)
		}
	}
}

// TestShapeMismatch: (3,4) against (4,3) is a MISMATCH on every trainer,
// not a silently wrong result; each names its own shape. (Ring frames
// carry the other's shape only in a fingerprint: when both nodes find the
// mismatch at once, neither learns the other's; MATCHING.md, Limits.)
// The world goes on.
func TestShapeMismatch(t *testing.T) {
	w := startWorld(t, 2, 1, "")
	cs := everyTrainer(t, w)
	errs := onEvery(t, cs, func(i int, c *cvd.Client) error {
		d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 12,
			Shape: collective.Shape{N: 2, Dims: [collective.MaxDims]uint64{3, 4}}}
		if i == 1 {
			d.Shape.Dims[0], d.Shape.Dims[1] = 4, 3
		}
		return c.Do(d, make([]byte, 48))
	})
	for i, err := range errs {
		own := [2]string{"shape=(3,4)", "shape=(4,3)"}[i]
		if !errors.Is(err, cvd.ErrMismatch) || !strings.Contains(err.Error(), own) || !strings.Contains(err.Error(), "shape") {
			t.Errorf("trainer %d: %v, want MISMATCH naming its %s", i, err, own)
		}
	}
	sumStep(t, cs, 1)
}

// TestBadVersion3Calls: bad inputs are refused before they join a
// collective, naming the field; the next good call works.
func TestBadVersion3Calls(t *testing.T) {
	w := startWorld(t, 2, 1, "")
	cs := everyTrainer(t, w)
	c := cs[0]
	for _, tc := range []struct {
		err  error
		want string
	}{
		{cvd.AllGatherV(c, make([]int32, 2), []int{3, 1}, make([]int32, 4)), "counts[0] = 3"},
		{cvd.Reduce(c, []float32{1}, 2, cvd.Sum), "root 2 outside world of 2"},
		{cvd.AllReduce(c, []int32{1}, cvd.Avg), "avg needs a float dtype, got int32"},
		{cvd.ReduceScatter(c, make([]float32, 3), make([]float32, 1), cvd.Sum), "not a multiple of the world size 2"},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("got %v, want an error saying %q", tc.err, tc.want)
		}
	}
	sumStep(t, cs, 2)
}

// TestRootsOnOneNodeDifferAcrossNodes: on 2 nodes x 2 trainers, node 0's
// trainers name root 0 and node 1's name root 1, both world ranks of node
// 0. The ring rank of either root is 0, so a ring comparing ring ranks
// alone would find the calls equal: node 1's trainers would get world
// rank 0's data while they asked for rank 1's, with no error. Every
// trainer must get MISMATCH instead, for broadcast and for reduce.
func TestRootsOnOneNodeDifferAcrossNodes(t *testing.T) {
	w := startWorld(t, 2, 2, "")
	cs := everyTrainer(t, w)
	for _, op := range []collective.Op{collective.OpBroadcast, collective.OpReduce} {
		errs := onEvery(t, cs, func(i int, c *cvd.Client) error {
			d := collective.Desc{Op: op, DType: collective.Int32, Count: 4, Root: uint32(i / 2)}
			if op == collective.OpReduce {
				d.Reduce = collective.Sum
			}
			x := []byte{byte(i), 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0}
			return c.Do(d, x)
		})
		for i, err := range errs {
			if !errors.Is(err, cvd.ErrMismatch) || !strings.Contains(err.Error(), "root=") {
				t.Errorf("%s: trainer %d: %v, want MISMATCH naming the roots", op, i, err)
			}
		}
		sumStep(t, cs, 3) // the world goes on
	}
}
