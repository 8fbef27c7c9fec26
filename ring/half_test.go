package ring

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/collectived/collectived/collective"
)

// TestHalfVectorsMatchPortable holds the vector conversions to the bits
// of package collective's: every 16-bit pattern widened, and float32
// values around every rounding case narrowed (ties, subnormals, overflow,
// NaN payloads), on every length that leaves a scalar tail.
func TestHalfVectorsMatchPortable(t *testing.T) {
	if !halfVec.bf16 && !halfVec.f16 {
		t.Skip("no vector conversions on this CPU")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, dt := range []collective.DType{collective.BFloat16, collective.Float16} {
		f := folder{dt: dt}
		widen, narrow := collective.BFloat16ToFloat32, collective.Float32ToBFloat16
		if dt == collective.Float16 {
			widen, narrow = collective.Float16ToFloat32, collective.Float32ToFloat16
		}
		all := make([]byte, 2<<16)
		for h := 0; h < 1<<16; h++ {
			binary.LittleEndian.PutUint16(all[2*h:], uint16(h))
		}
		var got [block]float32
		for lo := 0; lo < 1<<16; lo += block {
			f.widen(got[:], all[2*lo:2*(lo+block)])
			for i, v := range got {
				if want := widen(uint16(lo + i)); math.Float32bits(v) != math.Float32bits(want) {
					t.Fatalf("%s: widen %#04x = %#08x, want %#08x", dt, lo+i, math.Float32bits(v), math.Float32bits(want))
				}
			}
		}
		in := make([]float32, 0, 1<<16)
		for h := 0; h < 1<<16; h++ {
			x := math.Float32bits(widen(uint16(h)))
			// The value, its neighbours, and the midpoints around it.
			for _, d := range []int32{0, 1, -1, 0x7fff, 0x8000, 0x8001, 0xfff, 0x1000, 0x1001} {
				in = append(in, math.Float32frombits(uint32(int32(x)+d)))
			}
		}
		for i := 0; i < 1<<16; i++ {
			in = append(in, math.Float32frombits(rng.Uint32()))
		}
		for n := 1; n <= 17; n++ { // tails of every length
			out := make([]byte, 2*n)
			f.narrow(out, in[:n])
			for i := 0; i < n; i++ {
				if g, w := binary.LittleEndian.Uint16(out[2*i:]), narrow(in[i]); g != w {
					t.Fatalf("%s: narrow of %d: %#08x -> %#04x, want %#04x", dt, n, math.Float32bits(in[i]), g, w)
				}
			}
		}
		out := make([]byte, 2*block)
		for lo := 0; lo+block <= len(in); lo += block {
			f.narrow(out, in[lo:lo+block])
			for i := 0; i < block; i++ {
				if g, w := binary.LittleEndian.Uint16(out[2*i:]), narrow(in[lo+i]); g != w {
					t.Fatalf("%s: narrow %#08x = %#04x, want %#04x", dt, math.Float32bits(in[lo+i]), g, w)
				}
			}
		}
	}
}
