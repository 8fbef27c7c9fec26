package ring

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

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

// reseal gives a header the checksum of what it holds: a peer sending
// that header, rather than a header changed on the way.
func reseal(b []byte) []byte {
	if len(b) >= headerLen {
		binary.LittleEndian.PutUint32(b[headerSumAt:], checksum(b[:headerSumAt]))
	}
	return b
}

// TestDecodeHeaderRejects: headers a peer sent (their checksum matches)
// that break the rules are bad frames naming the rule; bytes that are no
// header of this protocol (another program, a peer of version 1, which
// had no checksum) are bad frames too.
func TestDecodeHeaderRejects(t *testing.T) {
	good := func() []byte {
		h := header{Kind: kindData, Length: 10}
		b := make([]byte, headerLen)
		h.encode(b)
		return b
	}
	v1 := func(b []byte) []byte { b[4] = 1; clear(b[64:]); return b } // a version 1 header and the first 8 bytes of its payload
	cases := map[string]func([]byte) []byte{
		"header is 10 bytes":      func(b []byte) []byte { return b[:10] },
		"bad magic 0x474e5258":    func(b []byte) []byte { b[0] = 'X'; return reseal(b) },
		"bad magic 0x20544547":    func(b []byte) []byte { return append([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), b...)[:headerLen] },
		"protocol version 3":      func(b []byte) []byte { b[4] = 3; return reseal(b) },
		"protocol version 1":      v1,
		"reserved header bytes":   func(b []byte) []byte { b[10] = 1; return reseal(b) },
		"unknown frame kind 0":    func(b []byte) []byte { b[5] = 0; return reseal(b) },
		"payload of 11 bytes":     func(b []byte) []byte { b[52] = 11; return reseal(b) },
		"heartbeat frame payload": func(b []byte) []byte { b[5] = byte(kindHeartbeat); return reseal(b) },
		"start frame payload":     func(b []byte) []byte { b[5] = byte(kindStart); return reseal(b) },
		"abort frame payload of 4294967295": func(b []byte) []byte {
			b[5] = byte(kindAbort)
			copy(b[52:], []byte{255, 255, 255, 255})
			return reseal(b)
		},
	}
	for want, mutate := range cases {
		_, err := decodeHeader(mutate(good()), 10)
		if !errors.Is(err, ErrBadFrame) || errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v", want, err)
		}
	}
}

// TestDecodeHeaderCorrupt: any bit of a header changed after the sender
// sealed it is ErrCorrupt (not a bad frame, and never a header taken as
// sent), including a bit of the magic or version, or of the checksum.
func TestDecodeHeaderCorrupt(t *testing.T) {
	d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 1 << 20}
	h := header{Kind: kindData, Seq: 3, Generation: 7, Sender: 2, Step: 1, Length: 4096, Aux: 9}
	h.setDesc(&d, d.Fingerprint())
	b := make([]byte, headerLen)
	for i := 0; i < headerLen*8; i++ {
		h.encode(b)
		b[i/8] ^= 1 << (i % 8)
		_, err := decodeHeader(b, 1<<20)
		if !errors.Is(err, ErrCorrupt) || errors.Is(err, ErrBadFrame) || !strings.Contains(err.Error(), "header checksum mismatch") {
			t.Fatalf("bit %d of byte %d flipped: %v, want ErrCorrupt", i%8, i/8, err)
		}
	}
}

// FuzzDecodeHeader: any bytes either decode to a header within the bounds
// for its kind, which re-encodes to the same bytes, or fail with
// ErrBadFrame or ErrCorrupt; nothing panics or allocates from the peer's
// length. The same bytes resealed (given the checksum of what they hold,
// as a peer sending them would) go through the checks behind the
// checksum, which fuzzed bytes would seldom pass.
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
	check := func(t *testing.T, b []byte) {
		h, err := decodeHeader(b, maxData)
		if err != nil {
			if !errors.Is(err, ErrBadFrame) && !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v wraps neither ErrBadFrame nor ErrCorrupt", err)
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
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		check(t, b)
		check(t, reseal(append([]byte(nil), b...)))
	})
}

// TestReadSummed: the payload's sum comes out the same however the reads
// cut it, the bytes behind it (the trailer) are read but not summed, and
// a stream that ends early is io.ErrUnexpectedEOF, as with io.ReadFull.
func TestReadSummed(t *testing.T) {
	payload := make([]byte, 3*sumPiece+1000) // summed in pieces and a rest
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	frame := binary.LittleEndian.AppendUint32(bytes.Clone(payload), checksum(payload))
	for name, r := range map[string]func() io.Reader{
		"whole":     func() io.Reader { return bytes.NewReader(frame) },
		"one byte":  func() io.Reader { return iotest.OneByteReader(bytes.NewReader(frame)) },
		"half":      func() io.Reader { return iotest.HalfReader(bytes.NewReader(frame)) },
		"data, EOF": func() io.Reader { return iotest.DataErrReader(bytes.NewReader(frame)) },
	} {
		got := make([]byte, len(frame))
		sum, err := readSummed(r(), got, len(payload), 0)
		if err != nil || sum != checksum(payload) || !bytes.Equal(got, frame) || trailerSum(got[len(payload):]) != sum {
			t.Errorf("%s: sum %#x, err %v; want %#x", name, sum, err, checksum(payload))
		}
		// The same in two calls, the sum carried over.
		sum, err = readSummed(r(), got[:sumPiece+300], sumPiece+300, 0)
		if err == nil {
			sum, err = readSummed(bytes.NewReader(frame[sumPiece+300:]), got[sumPiece+300:], len(payload)-sumPiece-300, sum)
		}
		if err != nil || sum != checksum(payload) {
			t.Errorf("%s, in two reads: sum %#x, err %v; want %#x", name, sum, err, checksum(payload))
		}
	}
	if _, err := readSummed(bytes.NewReader(frame[:10]), make([]byte, 20), 20, 0); err != io.ErrUnexpectedEOF {
		t.Errorf("short stream: %v, want io.ErrUnexpectedEOF", err)
	}
	if _, err := readSummed(bytes.NewReader(nil), make([]byte, 20), 20, 0); err != io.EOF {
		t.Errorf("empty stream: %v, want io.EOF", err)
	}
}
