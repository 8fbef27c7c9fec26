package ring

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/collectived/collectived/collective"
)

func TestHeaderRoundTrip(t *testing.T) {
	d := collective.Desc{Op: collective.OpBroadcast, DType: collective.Int64, Count: 1 << 33, Root: 3, Name: "w"}
	h := header{Kind: kindData, Seq: 1<<40 + 5, Generation: 7, Sender: 2, Step: 9, Length: 4096, Aux: 1<<35 + 1}
	h.setDesc(&d, d.Fingerprint())
	b := make([]byte, headerLen)
	h.encode(b)
	if !bytes.Equal(b[:4], []byte("CRNG")) {
		t.Fatalf("magic bytes %q, doc.go says CRNG", b[:4])
	}
	g, err := decodeHeader(b, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if g != h {
		t.Fatalf("round trip: %+v, want %+v", g, h)
	}
	if !g.sameDesc(&d, d.Fingerprint()) || g.remoteDesc(&d) != d.String() {
		t.Fatalf("description lost: %s", g.remoteDesc(&d))
	}
	if n := testing.AllocsPerRun(100, func() { h.encode(b); _, _ = decodeHeader(b, 4096) }); n != 0 {
		t.Fatalf("encode+decode allocate %v times", n)
	}
}

func TestDecodeHeaderRejects(t *testing.T) {
	good := func() []byte {
		h := header{Kind: kindData, Length: 10}
		b := make([]byte, headerLen)
		h.encode(b)
		return b
	}
	cases := map[string]func([]byte) []byte{
		"header is 10 bytes":      func(b []byte) []byte { return b[:10] },
		"bad magic":               func(b []byte) []byte { b[0] = 'X'; return b },
		"protocol version 2":      func(b []byte) []byte { b[4] = 2; return b },
		"reserved header bytes":   func(b []byte) []byte { b[10] = 1; return b },
		"unknown frame kind 0":    func(b []byte) []byte { b[5] = 0; return b },
		"payload of 11 bytes":     func(b []byte) []byte { b[52] = 11; return b },
		"heartbeat frame payload": func(b []byte) []byte { b[5] = byte(kindHeartbeat); return b },
		"start frame payload":     func(b []byte) []byte { b[5] = byte(kindStart); return b },
		"abort frame payload of 4294967295": func(b []byte) []byte {
			b[5] = byte(kindAbort)
			copy(b[52:], []byte{255, 255, 255, 255})
			return b
		},
	}
	for want, mutate := range cases {
		_, err := decodeHeader(mutate(good()), 10)
		if !errors.Is(err, ErrBadFrame) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v", want, err)
		}
	}
}

// FuzzDecodeHeader: any bytes either decode to a header within the bounds
// for its kind, which re-encodes to the same bytes, or fail with
// ErrBadFrame; nothing panics or allocates from the peer's length.
func FuzzDecodeHeader(f *testing.F) {
	for _, h := range []header{
		{Kind: kindData, Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 10, Length: 40},
		{Kind: kindAbort, Length: 12, Aux: 3 | 5<<32},
		{Kind: kindHeartbeat, Sender: 4, Generation: 2},
		{Kind: kindStart, Generation: 1 << 31, Step: 6},
		{Kind: kindData, Length: 1 << 31},
	} {
		b := make([]byte, headerLen)
		h.encode(b)
		f.Add(b)
	}
	f.Add([]byte("GET / HTTP/1.1\r\nHost: example\r\n\r\n"))
	f.Add(make([]byte, headerLen))
	f.Add([]byte{})
	const maxData = 1 << 16
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := decodeHeader(b, maxData)
		if err != nil {
			if !errors.Is(err, ErrBadFrame) {
				t.Fatalf("error %v does not wrap ErrBadFrame", err)
			}
			return
		}
		limit := map[frameKind]uint32{kindData: maxData, kindAbort: maxReasonLen}[h.Kind]
		if h.Length > limit {
			t.Fatalf("%s frame of %d bytes accepted, limit %d", h.Kind, h.Length, limit)
		}
		out := make([]byte, headerLen)
		h.encode(out)
		if !bytes.Equal(out, b[:headerLen]) {
			t.Fatalf("re-encoding %x gave %x", b[:headerLen], out)
		}
	})
}
