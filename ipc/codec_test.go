package ipc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/collectived/collectived/collective"
)

// splitFrame decodes a frame's header with the post-hello bound and returns
// it with its payload, failing the test on any inconsistency.
func splitFrame(t *testing.T, b []byte) (Header, []byte) {
	t.Helper()
	h, err := DecodeHeader(b, 1<<30)
	if err != nil {
		t.Fatalf("DecodeHeader: %v", err)
	}
	if int(h.Length) != len(b)-HeaderSize {
		t.Fatalf("%s: header length %d, frame has %d payload bytes", h.Type, h.Length, len(b)-HeaderSize)
	}
	return h, b[HeaderSize:]
}

func TestRoundTrip(t *testing.T) {
	hello := Hello{Version: 1, LocalRank: -1, PID: 42, Job: "job", Label: "train.py worker"}
	h, p := splitFrame(t, hello.Encode(1))
	if h.Type != TypeHello || h.ID != 1 {
		t.Fatalf("header %+v", h)
	}
	if got, err := DecodeHello(p); err != nil || got != hello {
		t.Errorf("DecodeHello = %+v, %v; want %+v", got, err, hello)
	}
	obs := Hello{Version: 1, Observer: true, LocalRank: -1, Job: "j"}
	if _, p = splitFrame(t, obs.Encode(0)); true {
		if got, err := DecodeHello(p); err != nil || got != obs {
			t.Errorf("observer DecodeHello = %+v, %v", got, err)
		}
	}

	ok := HelloOK{Version: 1, WorldRank: 5, WorldSize: 8, NodeRank: 1, NodeCount: 2, LocalRank: 1, LocalSize: 4,
		InlineLimit: 65536, MaxFrame: 65536 + 4096, MaxInFlight: 16, Generation: 3, ShmQuota: 1 << 30, TimeoutMS: 90000}
	if ok.Timeout() != 90*time.Second || (HelloOK{TimeoutMS: 1 << 63}).Timeout() <= 0 {
		t.Errorf("Timeout() = %v", ok.Timeout())
	}
	if (HelloOK{FirstCallTimeoutMS: 1 << 63}).FirstCallTimeout() <= 0 {
		t.Error("FirstCallTimeout() overflows")
	}
	for v := uint16(MinVersion); v <= Version; v++ {
		m := ok
		m.Version, m.FirstCallTimeoutMS = v, 600000
		want := m
		size := HelloOKSizeV3
		if v < 3 {
			// Older layouts have no room for it: it is neither sent nor decoded.
			want.FirstCallTimeoutMS, size = 0, HelloOKSizeV1
		}
		_, p = splitFrame(t, m.Encode(1))
		if len(p) != size || HelloOKSize(v) != size {
			t.Fatalf("version %d: HELLO_OK payload %d bytes, HelloOKSize %d; want %d", v, len(p), HelloOKSize(v), size)
		}
		got, err := DecodeHelloOK(p)
		if err != nil || got != want {
			t.Errorf("version %d: DecodeHelloOK = %+v, %v; want %+v", v, got, err, want)
		}
		bound, stated := got.CallBound()
		if v >= 3 && (bound != 10*time.Minute || !stated) || v < 3 && (bound != 90*time.Second || stated) {
			t.Errorf("version %d: CallBound() = %v, %v", v, bound, stated)
		}
	}
	if HelloOKSize(0) != 0 || HelloOKSize(Version+1) != 0 {
		t.Errorf("HelloOKSize of unknown versions: %d, %d", HelloOKSize(0), HelloOKSize(Version+1))
	}

	_, p = splitFrame(t, Alloc{Size: 4096}.Encode(2))
	if got, err := DecodeAlloc(p); err != nil || got.Size != 4096 {
		t.Errorf("DecodeAlloc = %+v, %v", got, err)
	}
	_, p = splitFrame(t, AllocOK{Segment: 7, Size: 8192}.Encode(2))
	if got, err := DecodeAllocOK(p); err != nil || got != (AllocOK{7, 8192}) {
		t.Errorf("DecodeAllocOK = %+v, %v", got, err)
	}
	_, p = splitFrame(t, Register{Size: 100}.Encode(3))
	if got, err := DecodeRegister(p); err != nil || got.Size != 100 {
		t.Errorf("DecodeRegister = %+v, %v", got, err)
	}
	_, p = splitFrame(t, RegisterOK{Segment: 8, Size: 100}.Encode(3))
	if got, err := DecodeRegisterOK(p); err != nil || got != (RegisterOK{8, 100}) {
		t.Errorf("DecodeRegisterOK = %+v, %v", got, err)
	}
	_, p = splitFrame(t, Free{Segment: 7}.Encode(4))
	if got, err := DecodeFree(p); err != nil || got.Segment != 7 {
		t.Errorf("DecodeFree = %+v, %v", got, err)
	}
	h, p = splitFrame(t, AppendEmpty(nil, TypeStatus, 9))
	if h.Type != TypeStatus || DecodeEmpty(h.Type, p) != nil {
		t.Errorf("STATUS %+v", h)
	}
	_, p = splitFrame(t, StatusOK{JSON: []byte(`{"job":"x"}`)}.Encode(9))
	if got, err := DecodeStatusOK(p); err != nil || string(got.JSON) != `{"job":"x"}` {
		t.Errorf("DecodeStatusOK = %q, %v", got.JSON, err)
	}

	calls := []Call{
		{Desc: collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 3, Name: "grad"},
			Data: []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}},
		{Desc: collective.Desc{Op: collective.OpBroadcast, DType: collective.Int64, Count: 1 << 20, Root: 3},
			SHM: true, Segment: 2, Offset: 4096},
		{Desc: collective.Desc{Op: collective.OpBarrier}},
	}
	for _, c := range calls {
		_, p = splitFrame(t, c.Encode(10))
		var got Call
		if err := DecodeCall(p, &got, nil); err != nil {
			t.Errorf("DecodeCall(%v): %v", c.Desc, err)
			continue
		}
		if len(got.Data) == 0 {
			got.Data = c.Data
		}
		if !reflect.DeepEqual(got, c) {
			t.Errorf("DecodeCall = %+v, want %+v", got, c)
		}
	}

	cok := CallOK{Generation: 2, Seq: 99, Result: []byte("result")}
	_, p = splitFrame(t, cok.Encode(10))
	var gotOK CallOK
	if err := DecodeCallOK(p, &gotOK); err != nil || gotOK.Generation != 2 || gotOK.Seq != 99 || string(gotOK.Result) != "result" {
		t.Errorf("DecodeCallOK = %+v, %v", gotOK, err)
	}
	// The zero-copy prefix writer produces the same bytes as Append.
	buf := make([]byte, CallOKPrefix+6)
	copy(buf[CallOKPrefix:], "result")
	PutCallOKPrefix(buf, 10, 2, 99, 6)
	if !bytes.Equal(buf, cok.Encode(10)) {
		t.Errorf("PutCallOKPrefix frame %x differs from Append %x", buf, cok.Encode(10))
	}

	e := Fatalf(CodeMismatch, "ranks 1 and 2 disagree")
	h, p = splitFrame(t, e.Encode(10))
	if h.Flags != FlagFatal {
		t.Errorf("ERROR flags %d", h.Flags)
	}
	if got, err := DecodeError(h.Flags, p); err != nil || *got != *e {
		t.Errorf("DecodeError = %+v, %v", got, err)
	}
}

func TestErrorIs(t *testing.T) {
	var err error = Errorf(CodeMismatch, "x")
	if !errors.Is(err, ErrMismatch) || !errors.Is(err, CodeMismatch) {
		t.Error("*Error with MISMATCH does not match ErrMismatch")
	}
	if errors.Is(err, ErrTimeout) {
		t.Error("MISMATCH matches ErrTimeout")
	}
	wrapped := errors.Join(errors.New("call 3"), err)
	var e *Error
	if !errors.As(wrapped, &e) || e.Code != CodeMismatch || !errors.Is(wrapped, ErrMismatch) {
		t.Error("wrapped *Error not found")
	}
	if fmt.Sprint(CodeMismatch) != "MISMATCH" || fmt.Sprintf("%v", ErrBusy) != "BUSY" {
		t.Errorf("Code prints as %q", fmt.Sprint(CodeMismatch))
	}
	if CodeMismatch.String() != "MISMATCH" || Code(99).String() != "CODE(99)" || CodeInternal.String() != "INTERNAL" {
		t.Error("Code.String")
	}
	if s := Fatalf(CodeJob, "want a, got b").Error(); !strings.Contains(s, "JOB: want a, got b") {
		t.Errorf("Error() = %q", s)
	}
}

func TestErrorMessageBounded(t *testing.T) {
	long := strings.Repeat("é", 5000) // 10000 bytes, 2-byte runes
	b := (&Error{Code: CodeInternal, Message: long + "\xff"}).Encode(0)
	if len(b)-HeaderSize > MaxHelloFrame {
		t.Fatalf("ERROR frame payload %d bytes exceeds %d", len(b)-HeaderSize, MaxHelloFrame)
	}
	h, p := splitFrame(t, b)
	e, err := DecodeError(h.Flags, p)
	if err != nil {
		t.Fatalf("truncated message does not decode: %v", err)
	}
	if len(e.Message) > MaxErrorMessage || !strings.HasPrefix(long, e.Message) {
		t.Errorf("message cut badly: %d bytes", len(e.Message))
	}
}

func TestDecodeHeaderErrors(t *testing.T) {
	mk := func(length uint32, typ, flags byte, reserved uint16) []byte {
		b := make([]byte, HeaderSize)
		binary.LittleEndian.PutUint32(b, length)
		b[4], b[5] = typ, flags
		binary.LittleEndian.PutUint16(b[6:], reserved)
		return b
	}
	cases := []struct {
		b    []byte
		want string
	}{
		{mk(0, 0x07, 0, 0), "unknown frame type 0x07"},
		{mk(0, 0x00, 0, 0), "unknown frame type 0x00"},
		{mk(0, 0x05, 0, 1), "reserved header field"},
		{mk(4097, 0x01, 0, 0), "length 4097 exceeds the limit of 4096"},
		{mk(0xffffffff, 0x05, 0, 0), "length 4294967295 exceeds"},
		{mk(0, 0x05, 1, 0), "flags 0x01 not defined"},
		{mk(0, 0xff, 2, 0), "flags 0x02 not defined"},
		{make([]byte, 3), "header is 3 bytes"},
	}
	for _, c := range cases {
		_, err := DecodeHeader(c.b, MaxHelloFrame)
		checkErr(t, err, CodeBadFrame, true, c.want)
	}
	if h, err := DecodeHeader(mk(4, 0xff, 1, 0), MaxHelloFrame); err != nil || h.Flags != FlagFatal {
		t.Errorf("fatal ERROR header: %+v %v", h, err)
	}
}

func checkErr(t *testing.T, err error, code Code, fatal bool, want string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Errorf("error %v is not an *Error (want %s %q)", err, code, want)
		return
	}
	if e.Code != code || e.Fatal != fatal || !strings.Contains(e.Message, want) {
		t.Errorf("error %v, want %s fatal=%v containing %q", err, code, fatal, want)
	}
}

func TestDecodeErrors(t *testing.T) {
	hello := func(mut func([]byte) []byte) []byte {
		_, p := splitFrame(t, Hello{Version: 1, LocalRank: -1, Job: "j", Label: "l"}.Encode(1))
		return mut(append([]byte(nil), p...))
	}
	helloCases := []struct {
		p     []byte
		code  Code
		fatal bool
		want  string
	}{
		{hello(func(p []byte) []byte { p[0] = 'X'; return p }), CodeBadFrame, true, "magic"},
		{hello(func(p []byte) []byte { p[4] = 5; return p }), CodeVersion, true, "version 5, daemon speaks 1 to 4"},
		{hello(func(p []byte) []byte { p[4] = 0; return p }), CodeVersion, true, "version 0, daemon speaks 1 to 4"},
		{hello(func(p []byte) []byte { p[6] = 2; return p }), CodeBadFrame, true, "flags 0x0002"},
		{hello(func(p []byte) []byte { p[16] = 200; return p }), CodeBadFrame, true, "job length 200"},
		{hello(func(p []byte) []byte { return append(p, 0) }), CodeBadFrame, true, "after the label"},
		{hello(func(p []byte) []byte { return p[:len(p)-1] }), CodeBadFrame, true, "label length"},
		{hello(func(p []byte) []byte { p[17] = 0xff; return p }), CodeBadRequest, true, `job name "\xff" is not UTF-8`},
		{hello(func(p []byte) []byte { p[len(p)-1] = 0xc3; return p }), CodeBadRequest, true, `label "\xc3" is not UTF-8`},
		{hello(func(p []byte) []byte { binary.LittleEndian.PutUint32(p[8:], 0xfffffffe); return p }), CodeRankRange, true, "local rank -2"},
		{[]byte("CLVD\x01"), CodeBadFrame, true, "too short"},
		{[]byte("CLVD\x01\x00\x00"), CodeBadFrame, true, "at least 18"},
	}
	for _, c := range helloCases {
		_, err := DecodeHello(c.p)
		checkErr(t, err, c.code, c.fatal, c.want)
	}

	_, err := DecodeAlloc(make([]byte, 8))
	checkErr(t, err, CodeBadRequest, false, "ALLOC: size is 0")
	_, err = DecodeAlloc(make([]byte, 9))
	checkErr(t, err, CodeBadFrame, true, "ALLOC: payload is 9 bytes")
	_, err = DecodeRegister(make([]byte, 8))
	checkErr(t, err, CodeBadRequest, false, "REGISTER: size is 0")
	_, err = DecodeRegister(nil)
	checkErr(t, err, CodeBadFrame, true, "REGISTER: payload is 0 bytes")
	_, err = DecodeFree([]byte{1, 0, 0, 0, 1, 0, 0, 0})
	checkErr(t, err, CodeBadFrame, true, "FREE: reserved")
	_, err = DecodeFree(make([]byte, 4))
	checkErr(t, err, CodeBadFrame, true, "FREE: payload is 4")
	checkErr(t, DecodeEmpty(TypeStatus, []byte{1}), CodeBadFrame, true, "STATUS: payload is 1 bytes")
	_, err = DecodeAllocOK(make([]byte, 16))
	checkErr(t, err, CodeBadFrame, true, "ALLOC_OK: segment id is 0")
	_, err = DecodeRegisterOK([]byte{1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0})
	checkErr(t, err, CodeBadFrame, true, "REGISTER_OK: reserved")
	_, err = DecodeStatusOK([]byte{0xff})
	checkErr(t, err, CodeBadFrame, true, "STATUS_OK: document is not UTF-8")
	_, err = DecodeError(0, []byte{0, 0, 0, 0})
	checkErr(t, err, CodeBadFrame, true, "ERROR: code is 0")
	_, err = DecodeError(0, append([]byte{1, 0, 0, 0}, make([]byte, MaxErrorMessage+1)...))
	checkErr(t, err, CodeBadFrame, true, "ERROR: message is 4093 bytes")
	if e, err := DecodeError(0, []byte{99, 0, 0, 0}); err != nil || e.Code != 99 || e.Fatal {
		t.Errorf("unknown code not kept: %v %v", e, err)
	}
	var cok CallOK
	checkErr(t, DecodeCallOK(make([]byte, 15), &cok), CodeBadFrame, true, "CALL_OK: payload is 15")
	checkErr(t, DecodeCallOK([]byte{0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, &cok), CodeBadFrame, true, "CALL_OK: reserved")

	good := HelloOK{Version: 1, WorldRank: 1, WorldSize: 2, NodeCount: 1, LocalRank: 1, LocalSize: 2,
		InlineLimit: 1024, MaxFrame: 4096, MaxInFlight: 1}
	okCases := []struct {
		mut  func(*HelloOK)
		want string
	}{
		{func(m *HelloOK) { m.Version = 5 }, "daemon answers in protocol version 5, client speaks 1 to 4"},
		{func(m *HelloOK) { m.Version = 0 }, "daemon answers in protocol version 0, client speaks 1 to 4"},
		{func(m *HelloOK) { m.MaxFrame = 1024 }, "max_frame 1024"},
		{func(m *HelloOK) { m.InlineLimit = 4000 }, "inline_limit 4000"},
		{func(m *HelloOK) { m.MaxInFlight = 0 }, "max_in_flight is 0"},
		{func(m *HelloOK) { m.WorldSize = 3 }, "world_size 3"},
		{func(m *HelloOK) { m.NodeRank = 1 }, "node_rank 1 outside"},
		{func(m *HelloOK) { m.LocalRank = NoRank }, "disagree on being an observer"},
		{func(m *HelloOK) { m.LocalRank, m.WorldRank = 2, 2 }, "local_rank 2 outside"},
		{func(m *HelloOK) { m.WorldRank = 0 }, "world_rank 0 !="},
		{func(m *HelloOK) { m.LocalSize, m.WorldSize = 0, 0 }, "must be positive"},
	}
	for _, c := range okCases {
		m := good
		c.mut(&m)
		_, p := splitFrame(t, m.Encode(1))
		_, err := DecodeHelloOK(p)
		code := CodeBadFrame
		if m.Version != 1 {
			code = CodeVersion
		}
		checkErr(t, err, code, true, c.want)
	}
	// The length is checked against the version's layout, and the error
	// names both.
	v3 := good
	v3.Version, v3.FirstCallTimeoutMS = 3, 5000
	_, p3 := splitFrame(t, v3.Encode(1))
	_, p1 := splitFrame(t, good.Encode(1))
	v2 := good
	v2.Version = 2
	_, p2 := splitFrame(t, v2.Encode(1))
	for _, c := range []struct {
		p    []byte
		want string
	}{
		{p1[:59], "HELLO_OK: payload is 59 bytes, want 60 in protocol version 1"},
		{append(p1[:60:60], make([]byte, 8)...), "HELLO_OK: payload is 68 bytes, want 60 in protocol version 1"},
		{append(p2[:60:60], make([]byte, 8)...), "HELLO_OK: payload is 68 bytes, want 60 in protocol version 2"},
		{p3[:60], "HELLO_OK: payload is 60 bytes, want 68 in protocol version 3"},
		{append(p3[:68:68], 0), "HELLO_OK: payload is 69 bytes, want 68 in protocol version 3"},
		{p3[:1], "HELLO_OK: payload is 1 bytes, too short for the version"},
	} {
		_, err := DecodeHelloOK(c.p)
		checkErr(t, err, CodeBadFrame, true, c.want)
	}
	_, err = DecodeHelloOK(append([]byte{5, 0}, make([]byte, 66)...))
	checkErr(t, err, CodeVersion, true, "daemon answers in protocol version 5")
}

func TestDecodeCallErrors(t *testing.T) {
	inline := Call{Desc: collective.Desc{Op: collective.OpAllReduce, DType: collective.Int32, Reduce: collective.Sum, Count: 2, Name: "n"},
		Data: make([]byte, 8)}
	shm := Call{Desc: inline.Desc, SHM: true, Segment: 1, Offset: 8}
	payload := func(c Call, mut func([]byte) []byte) []byte {
		_, p := splitFrame(t, c.Encode(1))
		return mut(append([]byte(nil), p...))
	}
	cases := []struct {
		p     []byte
		code  Code
		fatal bool
		want  string
	}{
		{make([]byte, 16), CodeBadFrame, true, "CALL: payload is 16 bytes"},
		{payload(inline, func(p []byte) []byte { p[3] = 8; return p }), CodeBadFrame, true, "flags 0x08"},
		{payload(inline, func(p []byte) []byte { p[16] = 100; return p }), CodeBadFrame, true, "name length 100"},
		{payload(inline, func(p []byte) []byte { return p[:len(p)-1] }), CodeBadFrame, true, "inline data is 7 bytes, count 2 of int32 implies 8"},
		{payload(inline, func(p []byte) []byte { return append(p, 1, 2, 3, 4) }), CodeBadFrame, true, "inline data is 12 bytes"},
		{payload(inline, func(p []byte) []byte { binary.LittleEndian.PutUint64(p[8:], 1<<62+2); return p }), CodeBadFrame, true, "count 4611686018427387906"},
		{payload(inline, func(p []byte) []byte { p[1] = 99; return p }), CodeBadRequest, false, "unknown dtype code 99"},
		{payload(inline, func(p []byte) []byte { p[17] = 0xff; return p }), CodeBadRequest, false, "name is not UTF-8"},
		{payload(shm, func(p []byte) []byte { return p[:len(p)-1] }), CodeBadFrame, true, "15 bytes after the name and extension, want 16"},
		{payload(shm, func(p []byte) []byte { p[len(p)-9] = 1; return p }), CodeBadFrame, true, "CALL: reserved field"},
		{payload(Call{Desc: collective.Desc{Op: collective.OpBarrier}}, func(p []byte) []byte { return append(p, 0) }), CodeBadFrame, true, "inline data is 1 bytes"},
	}
	for _, c := range cases {
		var m Call
		checkErr(t, DecodeCall(c.p, &m, nil), c.code, c.fatal, c.want)
	}
}

func TestCallCodecDoesNotAllocate(t *testing.T) {
	call := Call{Desc: collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 256, Name: "grad"},
		Data: make([]byte, 1024)}
	buf := make([]byte, 0, 4096)
	var names Names
	var got Call
	var frame []byte
	n := testing.AllocsPerRun(200, func() {
		frame = call.Append(buf[:0], 7)
		h, err := DecodeHeader(frame, 1<<20)
		if err != nil {
			panic(err)
		}
		if err := DecodeCall(frame[HeaderSize:HeaderSize+int(h.Length)], &got, &names); err != nil {
			panic(err)
		}
	})
	if n != 0 {
		t.Errorf("CALL encode+decode allocates %v times per run", n)
	}
	if !got.Desc.Equal(call.Desc) || len(got.Data) != 1024 {
		t.Errorf("decoded %+v", got.Desc)
	}
	// Alternating names are served from the cache.
	other := call
	other.Desc.Name = "other"
	f2 := other.Append(nil, 8)
	n = testing.AllocsPerRun(200, func() {
		if err := DecodeCall(frame[HeaderSize:], &got, &names); err != nil {
			panic(err)
		}
		if err := DecodeCall(f2[HeaderSize:], &got, &names); err != nil {
			panic(err)
		}
	})
	if n != 0 || got.Desc.Name != "other" {
		t.Errorf("alternating names allocate %v times per run (name %q)", n, got.Desc.Name)
	}

	ok := CallOK{Generation: 1, Seq: 2, Result: make([]byte, 1024)}
	var gotOK CallOK
	n = testing.AllocsPerRun(200, func() {
		frame = ok.Append(buf[:0], 7)
		if err := DecodeCallOK(frame[HeaderSize:], &gotOK); err != nil {
			panic(err)
		}
		PutCallOKPrefix(buf[:cap(buf)], 7, 1, 2, 1024)
	})
	if n != 0 {
		t.Errorf("CALL_OK encode+decode allocates %v times per run", n)
	}
}
