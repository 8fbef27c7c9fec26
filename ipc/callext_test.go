package ipc

import (
	"encoding/binary"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/collectived/collectived/collective"
)

func shapeOf(dims ...uint64) collective.Shape {
	s := collective.Shape{N: uint8(len(dims))}
	copy(s.Dims[:], dims)
	return s
}

// TestCallExtensionBytes pins the extension's layout to docs/PROTOCOL.md,
// field by field, and decodes it back.
func TestCallExtensionBytes(t *testing.T) {
	m := Call{
		Desc: collective.Desc{Op: collective.OpAllGather, DType: collective.BFloat16, Count: 6, Name: "g",
			Shape: shapeOf(2, 3), Counts: []uint64{6, 0}},
		SHM: true, Segment: 3, Offset: 64, Out: true, OutSegment: 4, OutOffset: 128, Ext: true,
	}
	b := m.Encode(9)
	le := binary.LittleEndian
	p := b[HeaderSize:]
	want := []byte{3, 7, 0, CallFlagSHM | CallFlagExt}
	want = le.AppendUint32(want, 0)
	want = le.AppendUint64(want, 6)
	want = append(want, 1, 'g')
	want = append(want, 2, extCounts|extOut, 0, 0)
	want = le.AppendUint64(le.AppendUint64(want, 2), 3)
	want = le.AppendUint32(le.AppendUint32(want, 2), 0)
	want = le.AppendUint64(le.AppendUint64(want, 6), 0)
	want = le.AppendUint64(le.AppendUint32(le.AppendUint32(want, 3), 0), 64)
	want = le.AppendUint64(le.AppendUint32(le.AppendUint32(want, 4), 0), 128)
	if string(p) != string(want) {
		t.Fatalf("payload\n% x\nwant\n% x", p, want)
	}
	var got Call
	if err := DecodeCall(p, &got, nil); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Errorf("decoded %+v\nwant %+v", got, m)
	}

	// Scales: a missing factor is sent as 1, and 1 matches none.
	s := Call{Desc: collective.Desc{Op: collective.OpAllReduce, DType: collective.Float16, Reduce: collective.Avg, Count: 1, PreScale: 0.5}, Data: []byte{0, 0x3c}}
	b = s.Encode(1)
	p = b[HeaderSize:]
	ext := p[callFixed:]
	if ext[0] != 0 || ext[1] != extScale || le.Uint64(ext[4:]) != math.Float64bits(0.5) || le.Uint64(ext[12:]) != math.Float64bits(1) || string(ext[20:]) != "\x00\x3c" {
		t.Fatalf("scaled inline call extension % x", ext)
	}
	if err := DecodeCall(p, &got, nil); err != nil || got.Desc.PreScale != 0.5 || got.Desc.PostScale != 1 {
		t.Fatalf("decoded %+v, %v", got.Desc, err)
	}
	if !got.Desc.Equal(s.Desc) || got.Desc.Fingerprint() != s.Desc.Fingerprint() {
		t.Errorf("%v does not match %v", got.Desc, s.Desc)
	}
	// A call without extension fields sends none: older daemons read it.
	plain := Call{Desc: collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 0}}
	if f := plain.Encode(1); f[HeaderSize+3] != 0 {
		t.Errorf("plain call flags %#x", f[HeaderSize+3])
	}
}

func TestCallExtensionErrors(t *testing.T) {
	le := binary.LittleEndian
	base := func(flags byte, ext []byte, tail []byte) []byte {
		p := []byte{1, 1, 1, flags}
		p = le.AppendUint32(p, 0)
		p = le.AppendUint64(p, 0)
		p = append(p, 0)
		return append(append(p, ext...), tail...)
	}
	shmTail := make([]byte, 16)
	cases := []struct {
		name string
		p    []byte
		code Code
		want string
	}{
		{"undefined flag", base(8, nil, nil), CodeBadFrame, "undefined bits"},
		{"short extension", base(CallFlagExt, []byte{0, 0}, nil), CodeBadFrame, "runs past the payload: 2 bytes, at least 4"},
		{"xflags", base(CallFlagExt, []byte{0, 8, 0, 0}, nil), CodeBadFrame, "extension flags 0x08"},
		{"reserved", base(CallFlagExt, []byte{0, 0, 1, 0}, nil), CodeBadFrame, "extension reserved"},
		{"nine dims", base(CallFlagExt, []byte{9, 0, 0, 0}, nil), CodeBadFrame, "9 dimensions"},
		{"dims past the end", base(CallFlagExt, []byte{2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0}, nil), CodeBadFrame, "runs past"},
		{"counts past the end", base(CallFlagExt, append([]byte{0, extCounts, 0, 0}, le.AppendUint32(le.AppendUint32(nil, 3), 0)...), nil), CodeBadFrame, "3 per-rank counts runs past"},
		{"out inline", base(CallFlagExt, []byte{0, extOut, 0, 0}, nil), CodeBadRequest, "inline call has the extension's OUT"},
		{"out short", base(CallFlagExt|CallFlagSHM, []byte{0, extOut, 0, 0}, shmTail), CodeBadFrame, "want 32"},
		{"zero scale", base(CallFlagExt, append([]byte{0, extScale, 0, 0}, make([]byte, 16)...), nil), CodeBadRequest, "prescale 0 must be finite and nonzero"},
	}
	for _, c := range cases {
		var m Call
		err := DecodeCall(c.p, &m, nil)
		var e *Error
		if !errors.As(err, &e) || e.Code != c.code || !strings.Contains(e.Message, c.want) {
			t.Errorf("%s: %v, want %s saying %q", c.name, err, c.code, c.want)
		}
		if c.code == CodeBadFrame && !e.Fatal || c.code == CodeBadRequest && e.Fatal {
			t.Errorf("%s: fatal = %v", c.name, e.Fatal)
		}
	}
}
