package e2e

import (
	"fmt"
	"math"
	"testing"

	cvd "github.com/collectived/collectived/clients/go"
	"github.com/collectived/collectived/collective"
)

// TestVersion3Matrix runs every collective on every element type and
// reduce op, on worlds with one and several trainers per node, and
// checks every trainer's result exactly. The inputs are small integers,
// so that every sum and product is exact in every type and order; avg's
// one division is then the only rounding, done here as the daemon does it
// (in float32 for the 16-bit types). Float rounding points and orders
// are checked bit for bit by ring's TestReductionsFollowTheDocumentedOrder.
func TestVersion3Matrix(t *testing.T) {
	dtypes := []collective.DType{collective.Float32, collective.Float64, collective.Int32, collective.Int64,
		collective.Float16, collective.BFloat16, collective.Int8, collective.Uint8, collective.Bytes}
	ops := []collective.ReduceOp{collective.Sum, collective.Prod, collective.Max, collective.Min, collective.Avg}
	for _, shape := range [][2]int{{1, 1}, {1, 3}, {2, 1}, {3, 2}} {
		t.Run(fmt.Sprintf("%dx%d", shape[0], shape[1]), func(t *testing.T) {
			w := startWorld(t, shape[0], shape[1], "")
			cs := everyTrainer(t, w)
			W := len(cs)
			counts := []int{0, 1, 3, W - 1, 5000}
			for _, dt := range dtypes {
				for _, n := range counts {
					m := matrixCase{dt: dt, n: n, world: W}
					if dt != collective.Bytes {
						for _, op := range ops {
							if op == collective.Avg && !dt.Float() {
								continue
							}
							m.op = op
							m.run(t, cs, collective.OpAllReduce, 0)
							m.run(t, cs, collective.OpReduce, (n+1)%W)
							m.run(t, cs, collective.OpReduceScatter, 0)
						}
					}
					m.op = collective.ReduceNone
					m.run(t, cs, collective.OpAllGather, 0)
					m.run(t, cs, collective.OpBroadcast, n%W)
				}
			}
		})
	}
}

type matrixCase struct {
	dt       collective.DType
	op       collective.ReduceOp
	n, world int
}

// input is world rank r's element k: small, and for prod in {-1, 1, 2}
// (or {1, 2} unsigned), so that results stay exact.
func (m matrixCase) input(r, k int) float64 {
	signed := m.dt != collective.Uint8 && m.dt != collective.Bytes
	switch {
	case m.op == collective.Prod && signed:
		return []float64{-1, 1, 2}[(r+k)%3]
	case m.op == collective.Prod:
		return []float64{1, 2}[(r+k)%2]
	case signed:
		return float64((r*3+k)%5 - 2)
	}
	return float64((r*3 + k) % 5)
}

// reduced is element k of the reduction over all ranks.
func (m matrixCase) reduced(k int) float64 {
	v := m.input(0, k)
	for r := 1; r < m.world; r++ {
		x := m.input(r, k)
		switch m.op {
		case collective.Sum, collective.Avg:
			v += x
		case collective.Prod:
			v *= x
		case collective.Max:
			v = math.Max(v, x)
		case collective.Min:
			v = math.Min(v, x)
		}
	}
	if m.op == collective.Avg {
		switch m.dt {
		case collective.Float64:
			v /= float64(m.world)
		default: // float32, and the 16-bit types computed in float32
			v = float64(float32(v) / float32(m.world))
		}
	}
	return v
}

func (m matrixCase) buf(n int, fill func(k int) float64) []byte {
	es := m.dt.Size()
	b := make([]byte, n*es)
	for k := 0; k < n; k++ {
		m.dt.Put(b[k*es:], fill(k))
	}
	return b
}

func (m matrixCase) run(t *testing.T, cs []*cvd.Client, op collective.Op, root int) {
	t.Helper()
	W, n, es := m.world, m.n, m.dt.Size()
	total := n
	if op == collective.OpReduceScatter {
		total = n * W // every rank's block is n elements
	}
	name := fmt.Sprintf("%s %s %s n=%d root=%d world=%d", op, m.dt, m.op, n, root, W)
	errs := onEvery(t, cs, func(i int, c *cvd.Client) error {
		d := collective.Desc{Op: op, DType: m.dt, Reduce: m.op, Count: uint64(total)}
		in := m.buf(total, func(k int) float64 { return m.input(i, k) })
		var got []byte
		var want func(k int) float64
		switch op {
		case collective.OpAllReduce:
			got, want = in, m.reduced
		case collective.OpReduce:
			d.Root = uint32(root)
			got, want = in, func(k int) float64 { return m.input(i, k) }
			if i == root {
				want = m.reduced
			}
		case collective.OpBroadcast:
			d.Root = uint32(root)
			got, want = in, func(k int) float64 { return m.input(root, k) }
		case collective.OpReduceScatter:
			got = make([]byte, n*es)
			want = func(k int) float64 { return m.reduced(i*n + k) }
		case collective.OpAllGather:
			got = make([]byte, n*W*es)
			want = func(k int) float64 { return m.input(k/max(n, 1), k%max(n, 1)) }
		}
		var err error
		if op == collective.OpAllGather || op == collective.OpReduceScatter {
			err = c.DoInto(d, in, got)
		} else {
			err = c.Do(d, in)
		}
		if err != nil {
			return err
		}
		for k := 0; k < len(got)/es; k++ {
			g, w := m.dt.Get(got[k*es:]), want(k)
			if m.dt == collective.Float16 || m.dt == collective.BFloat16 {
				// want is exact in float32; the daemon rounds it once.
				w = m.dt.Get(m.buf(1, func(int) float64 { return w }))
			}
			if g != w {
				return fmt.Errorf("%s: element %d = %v, want %v", name, k, g, w)
			}
		}
		return nil
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("trainer %d: %v", i, err)
		}
	}
}
