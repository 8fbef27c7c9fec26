package rendezvous

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

func sampleHello() hello {
	h := hello{
		ByteOrder:  nativeBOM,
		Rank:       3,
		World:      8,
		Streams:    2,
		Stream:     1,
		Generation: 42,
		Session:    session{Epoch: 1 << 60, Seq: 7},
		Digest:     testDigest,
		Job:        "job-ü",
	}
	for i := range h.Nonce {
		h.Nonce[i] = byte(i)
	}
	return h
}

func TestHelloRoundTrip(t *testing.T) {
	h := sampleHello()
	b := appendHello(nil, &h)
	var buf frameBuf
	f, err := readFrame(bytes.NewReader(b), &buf)
	if err != nil || f.typ != frameHello || f.version != ProtocolVersion {
		t.Fatalf("readFrame: %+v %v", f, err)
	}
	got, err := decodeHello(f.payload)
	if err != nil {
		t.Fatal(err)
	}
	if got != h {
		t.Fatalf("round trip: got %+v, want %+v", got, h)
	}
	if !bytes.Equal(f.raw, b) {
		t.Fatal("raw frame differs from what was sent")
	}
}

func TestDecodeErrors(t *testing.T) {
	h := sampleHello()
	good := appendHello(nil, &h)
	payload := good[headerLen:]
	cases := []struct {
		name string
		in   []byte
		want error
		text string
	}{
		{"short", payload[:50], ErrMalformed, "hello of 50 bytes, need at least 101"},
		{"job length beyond payload", append(bytes.Clone(payload[:helloFixedLen-1]), 200, 'x'), ErrMalformed, "does not match job name length 200"},
		{"trailing bytes", append(bytes.Clone(payload), 0), ErrMalformed, "does not match job name length"},
		{"empty job", bytes.Clone(payload[:helloFixedLen-1]), ErrMalformed, "need at least"},
		{"empty job name", append(bytes.Clone(payload[:helloFixedLen-1]), 0), ErrMalformed, "empty job name"},
	}
	for _, c := range cases {
		_, err := decodeHello(c.in)
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.text) {
			t.Errorf("%s: %v, want %v containing %q", c.name, err, c.want, c.text)
		}
	}
	var buf frameBuf
	if _, err := readFrame(bytes.NewReader(good[:5]), &buf); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("truncated header: %v", err)
	}
	if _, err := readFrame(bytes.NewReader(good[:20]), &buf); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("truncated payload: %v", err)
	}
	if err := decodeStatus(nil); !errors.Is(err, ErrMalformed) {
		t.Errorf("empty status: %v", err)
	}
	if err := decodeStatus([]byte{99}); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "unknown reject code 99") {
		t.Errorf("unknown code: %v", err)
	}
	err := decodeStatus([]byte{byte(codeDigest), 'a', '\n', 0xff})
	if !errors.Is(err, ErrDigest) || !strings.Contains(err.Error(), "its view: a??") {
		t.Errorf("status with control bytes: %v", err)
	}
}

// Every sentinel a listener can refuse with survives the trip to the
// dialer as the same sentinel.
func TestRejectCodesRoundTrip(t *testing.T) {
	for c := codeMalformed; int(c) < len(codeErrs); c++ {
		sent := codeErrs[c]
		if got := codeOf(sent); got != c {
			t.Fatalf("codeOf(%v) = %d, want %d", sent, got, c)
		}
		b := appendStatus(nil, codeOf(sent), strings.Repeat("r", 300))
		var buf frameBuf
		f, err := readFrame(bytes.NewReader(b), &buf)
		if err != nil {
			t.Fatal(err)
		}
		if err := decodeStatus(f.payload); !errors.Is(err, sent) {
			t.Fatalf("code %d: got %v, want %v", c, err, sent)
		}
	}
}

func TestProofBindsEverything(t *testing.T) {
	h := sampleHello()
	a := appendHello(nil, &h)
	h2 := h
	h2.Nonce[0] ^= 1
	b := appendHello(nil, &h2)
	base := proof(testToken, labelDialer, a, b)
	variants := map[string][]byte{
		"other role":         proof(testToken, labelListener, a, b),
		"other token":        proof([]byte("x-token-0123456789abcdef"), labelDialer, a, b),
		"swapped hellos":     proof(testToken, labelDialer, b, a),
		"other dialer hello": proof(testToken, labelDialer, b, b),
		"other listener one": proof(testToken, labelDialer, a, a),
	}
	for name, v := range variants {
		if bytes.Equal(v, base) {
			t.Errorf("%s gives the same proof", name)
		}
	}
}

// FuzzDecodeHello feeds arbitrary bytes to the frame reader and the hello
// and status decoders: they must never panic, never read past the limit,
// and whatever decodes must re-encode to the same bytes.
func FuzzDecodeHello(f *testing.F) {
	h := sampleHello()
	good := appendHello(nil, &h)
	f.Add(good)
	f.Add(good[:headerLen])
	f.Add(good[:len(good)-1])
	f.Add(append(bytes.Clone(good), 1, 2, 3))
	f.Add(appendStatus(nil, codeDigest, "peer x, ours y"))
	f.Add(appendAuth(nil, make([]byte, macLen)))
	f.Add([]byte("CLVD\x01\x01\xff\xff"))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var buf frameBuf
		fr, err := readFrame(bytes.NewReader(data), &buf)
		if err != nil {
			return
		}
		if len(fr.payload) > maxPayload {
			t.Fatalf("payload of %d bytes read", len(fr.payload))
		}
		switch fr.typ {
		case frameHello:
			h, err := decodeHello(fr.payload)
			if err != nil {
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("decode error %v is not ErrMalformed", err)
				}
				return
			}
			again := appendHello(nil, &h)
			again[4] = fr.version
			if !bytes.Equal(again, fr.raw) {
				t.Fatalf("re-encoded hello differs:\n got % x\nwant % x", again, fr.raw)
			}
		case frameStatus:
			decodeStatus(fr.payload)
		}
	})
}
