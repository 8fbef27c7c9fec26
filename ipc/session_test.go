package ipc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/collectived/collectived/collective"
)

// Each version gets HELLO_OK in its own layout: versions 1 and 2 exactly
// the 60 bytes they always had (an older client checks the length), 3 the
// same followed by first_call_timeout_ms.
func TestHelloOKLayoutPerVersion(t *testing.T) {
	srv, h := startServer(t, nil)
	le := binary.LittleEndian
	for v := uint16(MinVersion); v <= Version; v++ {
		c := dial(t, srv.Path())
		f := c.roundTrip(Hello{Version: v, LocalRank: 0, Job: "job"}.Encode(7), -1)
		if f.Type != TypeHelloOK || f.ID != 7 {
			t.Fatalf("version %d: HELLO answered with %s id %d: %v", v, f.Type, f.ID, c.errorOf(f))
		}
		// Written out field by field, independently of HelloOK.Append.
		want := le.AppendUint16(nil, v)
		want = le.AppendUint16(want, 0)
		for _, x := range []uint32{0, 4, 0, 1, 0, 4, 4096, minMaxFrame, 8, 1} {
			want = le.AppendUint32(want, x)
		}
		want = le.AppendUint64(want, 16<<20)
		want = le.AppendUint64(want, 60000)
		if v >= 3 {
			want = le.AppendUint64(want, 600000)
		}
		if !bytes.Equal(f.Payload, want) {
			t.Errorf("version %d: HELLO_OK payload\n %x\nwant\n %x", v, f.Payload, want)
		}
		ok, err := DecodeHelloOK(f.Payload)
		if err != nil || ok.Version != v {
			t.Fatalf("version %d: %+v %v", v, ok, err)
		}
		c.c.Close()
		h.waitGone(t)
	}
}

func TestHello(t *testing.T) {
	srv, h := startServer(t, nil)

	c := dial(t, srv.Path())
	ok := c.attach()
	if ok.Version != 1 || ok.InlineLimit != 4096 || ok.MaxFrame != minMaxFrame || ok.MaxInFlight != 8 ||
		ok.ShmQuota != 16<<20 || ok.LocalRank != 0 || ok.WorldSize != 4 || ok.TimeoutMS != 60000 {
		t.Errorf("HELLO_OK %+v", ok)
	}

	t.Run("version", func(t *testing.T) {
		c := dial(t, srv.Path())
		f := c.roundTrip(Hello{Version: 5, LocalRank: -1, Job: "job"}.Encode(1), -1)
		c.expectError(f, CodeVersion, true, "client speaks protocol version 5, daemon speaks 1 to 4")
	})
	t.Run("version 2 answered in 2", func(t *testing.T) {
		c := dial(t, srv.Path())
		f := c.roundTrip(Hello{Version: 2, LocalRank: -1, Job: "job"}.Encode(1), -1)
		if f.Type != TypeHelloOK {
			t.Fatalf("got %s, want HELLO_OK", f.Type)
		}
		ok, err := DecodeHelloOK(f.Payload)
		if err != nil || ok.Version != 2 {
			t.Fatalf("HELLO_OK version %d, %v; want 2", ok.Version, err)
		}
		// This client holds a rank: let it go before the next subtest, or
		// a later waitGone takes its Disconnected for someone else's.
		c.c.Close()
		h.waitGone(t)
	})
	t.Run("version 0", func(t *testing.T) {
		c := dial(t, srv.Path())
		f := c.roundTrip(Hello{Version: 0, LocalRank: -1, Job: "job"}.Encode(1), -1)
		c.expectError(f, CodeVersion, true, "client speaks protocol version 0, daemon speaks 1 to 4")
	})
	t.Run("job", func(t *testing.T) {
		c := dial(t, srv.Path())
		f := c.roundTrip(Hello{Version: 1, LocalRank: -1, Job: "other"}.Encode(1), -1)
		c.expectError(f, CodeJob, true, `HELLO names job "other", daemon serves job "job"`)
	})
	t.Run("rank taken", func(t *testing.T) {
		c := dial(t, srv.Path())
		f := c.roundTrip(Hello{Version: 1, LocalRank: 0, Job: "job"}.Encode(1), -1)
		c.expectError(f, CodeRankTaken, true, "local rank 0 is held by pid")
	})
	t.Run("bad magic", func(t *testing.T) {
		c := dial(t, srv.Path())
		b := Hello{Version: 1, LocalRank: -1, Job: "job"}.Encode(1)
		b[HeaderSize] = 'X'
		c.expectError(c.roundTrip(b, -1), CodeBadFrame, true, "magic")
	})
	t.Run("first frame not hello", func(t *testing.T) {
		c := dial(t, srv.Path())
		f := c.roundTrip(AppendEmpty(nil, TypeStatus, 1), -1)
		c.expectError(f, CodeBadFrame, true, "the first frame must be HELLO, got STATUS")
	})
	t.Run("second hello", func(t *testing.T) {
		c := dial(t, srv.Path())
		c.attach()
		f := c.roundTrip(Hello{Version: 1, LocalRank: -1, Job: "job"}.Encode(5), -1)
		c.expectError(f, CodeBadFrame, true, "second HELLO")
		h.waitGone(t)
	})
	t.Run("observer", func(t *testing.T) {
		c := dial(t, srv.Path())
		f := c.roundTrip(Hello{Version: 1, Observer: true, LocalRank: 3, Job: "job"}.Encode(1), -1)
		ok, err := DecodeHelloOK(f.Payload)
		if err != nil || ok.WorldRank != NoRank || ok.LocalRank != NoRank {
			t.Fatalf("observer HELLO_OK %+v %v", ok, err)
		}
		c.c.SetMaxFrame(ok.MaxFrame)
		f = c.roundTrip(AppendEmpty(nil, TypeStatus, 2), -1)
		if f.Type != TypeStatusOK || f.ID != 2 || !strings.Contains(string(f.Payload), `"trainers":1`) {
			t.Fatalf("STATUS answered %s %q", f.Type, f.Payload)
		}
		c.expectError(c.inlineCall(3, make([]byte, 4), ""), CodePermission, false, "an observer may only ask STATUS, not CALL")
		c.expectError(c.roundTrip(Alloc{Size: 1}.Encode(4), -1), CodePermission, false, "not ALLOC")
		c.expectError(c.roundTrip(Free{Segment: 1}.Encode(5), -1), CodePermission, false, "not FREE")
		c.expectError(c.roundTrip(Register{Size: 4096}.Encode(6), memfd(t, 4096, unix.F_SEAL_SHRINK)), CodePermission, false, "not REGISTER")
		if f = c.roundTrip(AppendEmpty(nil, TypeStatus, 7), -1); f.Type != TypeStatusOK {
			t.Fatalf("observer lost after refusals: %s", f.Type)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		srv, _ := startServer(t, func(c *ServerConfig) { c.HelloTimeout = 100 * time.Millisecond })
		c := dial(t, srv.Path())
		c.expectError(c.read(), CodeTimeout, true, "no HELLO within 100ms")
	})
	// The first client is unaffected by all of the above.
	if f := c.inlineCall(2, []byte{1, 2, 3, 4}, ""); f.Type != TypeCallOK {
		t.Fatalf("first client: %s %v", f.Type, c.errorOf(f))
	}
}

func TestInlineCall(t *testing.T) {
	srv, _ := startServer(t, nil)
	c := dial(t, srv.Path())
	c.attach()
	data := make([]byte, 4096)
	for i := range data {
		data[i] = byte(i)
	}
	for i := uint64(0); i < 3; i++ {
		f := c.inlineCall(10+i, data, "grad")
		if f.Type != TypeCallOK || f.ID != 10+i {
			t.Fatalf("got %s id %d: %v", f.Type, f.ID, c.errorOf(f))
		}
		var ok CallOK
		if err := DecodeCallOK(f.Payload, &ok); err != nil {
			t.Fatal(err)
		}
		if ok.Generation != 1 || ok.Seq != i || len(ok.Result) != len(data) {
			t.Fatalf("CALL_OK gen %d seq %d, %d bytes", ok.Generation, ok.Seq, len(ok.Result))
		}
		for j, b := range ok.Result {
			if b != data[j]+1 {
				t.Fatalf("result[%d] = %d, want %d", j, b, data[j]+1)
			}
		}
	}
	// A barrier has no data and gets no result.
	f := c.roundTrip((&Call{Desc: collective.Desc{Op: collective.OpBarrier, Name: "epoch"}}).Encode(20), -1)
	var ok CallOK
	if f.Type != TypeCallOK || DecodeCallOK(f.Payload, &ok) != nil || len(ok.Result) != 0 {
		t.Fatalf("barrier: %s", f.Type)
	}
	// Errors of well-formed calls are not fatal.
	c.expectError(c.inlineCall(21, make([]byte, 4100), ""), CodeTooLarge, false, "4100 bytes inline, the limit is 4096")
	c.expectError(c.inlineCall(22, make([]byte, 8), "fail"), CodeMismatch, false, "world rank 1 disagrees")
	c.expectError(c.inlineCall(23, make([]byte, 8), "boom"), CodeInternal, false, "core exploded")
	bad := Call{Desc: collective.Desc{Op: collective.OpBroadcast, DType: collective.Float32, Count: 1, Root: 4}, Data: make([]byte, 4)}
	c.expectError(c.roundTrip(bad.Encode(24), -1), CodeBadRequest, false, "broadcast root 4 outside world of 4")
	b := (&Call{Desc: collective.Desc{Op: collective.OpBarrier}, SHM: true, Segment: 1}).Encode(25)
	c.expectError(c.roundTrip(b, -1), CodeBadRequest, false, "a barrier has no buffer")
	if f := c.inlineCall(26, data[:8], ""); f.Type != TypeCallOK {
		t.Fatalf("after errors: %s", f.Type)
	}
}

func TestSharedMemoryCall(t *testing.T) {
	srv, h := startServer(t, nil)
	base := openFds(t)
	c := dial(t, srv.Path())
	c.attach()

	seg, mem := c.alloc(10000)
	pg := uint64(os.Getpagesize())
	if want := (10000 + pg - 1) / pg * pg; seg.Size != want || uint64(len(mem)) != want {
		t.Fatalf("ALLOC_OK size %d, mapped %d, want %d", seg.Size, len(mem), want)
	}
	for i := range mem {
		mem[i] = byte(i % 200)
	}
	call := Call{Desc: descInt32(1000, "shm"), SHM: true, Segment: seg.Segment, Offset: 4000}
	f := c.roundTrip(call.Encode(c.id()), -1)
	var ok CallOK
	if f.Type != TypeCallOK || DecodeCallOK(f.Payload, &ok) != nil || len(ok.Result) != 0 {
		t.Fatalf("shm call: %s %v", f.Type, c.errorOf(f))
	}
	for i := range mem {
		want := byte(i % 200)
		if i >= 4000 && i < 8000 {
			want++
		}
		if mem[i] != want {
			t.Fatalf("mem[%d] = %d, want %d (result in place, nothing outside the range)", i, mem[i], want)
		}
	}

	// Range and alignment checks.
	call.Offset = uint64(len(mem)) - 3996
	c.expectError(c.roundTrip(call.Encode(c.id()), -1), CodeBadSegment, false, "4000 bytes at offset")
	call.Offset = 2
	c.expectError(c.roundTrip(call.Encode(c.id()), -1), CodeBadRequest, false, "offset 2 in segment 1 is not a multiple of the int32 size 4")
	call.Segment, call.Offset = 99, 0
	c.expectError(c.roundTrip(call.Encode(c.id()), -1), CodeBadSegment, false, "segment 99")

	// A client-made sealed memfd.
	fd := memfd(t, 8192, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW)
	f = c.roundTrip(Register{Size: 8192}.Encode(c.id()), fd)
	reg, err := DecodeRegisterOK(f.Payload)
	if f.Type != TypeRegisterOK || err != nil || reg.Size != 8192 || reg.Segment == seg.Segment {
		t.Fatalf("REGISTER: %s %v %+v", f.Type, c.errorOf(f), reg)
	}
	rmem, err := unix.Mmap(fd, 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(rmem)
	unix.Close(fd)
	f = c.roundTrip((&Call{Desc: descInt32(2048, ""), SHM: true, Segment: reg.Segment}).Encode(c.id()), -1)
	if f.Type != TypeCallOK || rmem[0] != 1 || rmem[8191] != 1 {
		t.Fatalf("call on registered segment: %s, mem %d %d", f.Type, rmem[0], rmem[8191])
	}

	// FREE both; a second FREE is BAD_SEGMENT.
	for _, id := range []uint32{seg.Segment, reg.Segment} {
		if f := c.roundTrip(Free{Segment: id}.Encode(c.id()), -1); f.Type != TypeFreeOK {
			t.Fatalf("FREE %d: %s %v", id, f.Type, c.errorOf(f))
		}
	}
	c.expectError(c.roundTrip(Free{Segment: seg.Segment}.Encode(c.id()), -1), CodeBadSegment, false, "unknown segment")
	c.c.Close()
	h.waitGone(t)
	waitFds(t, base)
}

// A shared-memory call whose span (offset, count times the element size)
// does not lie within its segment is BAD_SEGMENT, not fatal, with a
// message naming the span and the segment's size; a span that ends at the
// segment's end, an empty one included, is in range.
func TestSegmentSpanOutOfRange(t *testing.T) {
	srv, _ := startServer(t, nil)
	c := dial(t, srv.Path())
	c.attach()
	seg, _ := c.alloc(8192)
	size := seg.Size
	cases := []struct {
		count, offset uint64
		want          string // "" : in range
	}{
		{size / 4, 0, ""},
		{1, size - 4, ""},
		{0, size, ""},
		{size/4 + 1, 0, fmt.Sprintf("%d bytes at offset 0, segment %d has %d bytes", size+4, seg.Segment, size)},
		{2, size - 4, fmt.Sprintf("8 bytes at offset %d, segment %d has %d bytes", size-4, seg.Segment, size)},
		{1, size, fmt.Sprintf("4 bytes at offset %d, segment %d has %d bytes", size, seg.Segment, size)},
		{0, size + 4, fmt.Sprintf("0 bytes at offset %d, segment %d has %d bytes", size+4, seg.Segment, size)},
		// offset + length wraps past 2^64: still outside, not a small span.
		{2, 1<<64 - 4, fmt.Sprintf("8 bytes at offset %d, segment %d has %d bytes", uint64(1<<64-4), seg.Segment, size)},
	}
	for _, tc := range cases {
		call := Call{Desc: descInt32(tc.count, ""), SHM: true, Segment: seg.Segment, Offset: tc.offset}
		f := c.roundTrip(call.Encode(c.id()), -1)
		if tc.want == "" {
			if f.Type != TypeCallOK {
				t.Fatalf("count %d at offset %d: %s (%v), want CALL_OK", tc.count, tc.offset, f.Type, c.errorOf(f))
			}
			continue
		}
		c.expectError(f, CodeBadSegment, false, tc.want)
	}
}

func TestQuotaAndBusy(t *testing.T) {
	pg := int64(os.Getpagesize())
	srv, h := startServer(t, func(c *ServerConfig) { c.ShmQuota = 4 * pg })
	c := dial(t, srv.Path())
	c.attach()
	seg, _ := c.alloc(uint64(2 * pg))
	c.expectError(c.roundTrip(Alloc{Size: uint64(3 * pg)}.Encode(c.id()), -1), CodeQuota, false,
		"request of 12288 bytes, 8192 held, quota 16384")
	c.expectError(c.roundTrip(Alloc{Size: 1 << 63}.Encode(c.id()), -1), CodeQuota, false, "ALLOC of 9223372036854775808 bytes")
	c.expectError(c.roundTrip(Alloc{}.Encode(c.id()), -1), CodeBadRequest, false, "size is 0")
	fd := memfd(t, 3*pg, unix.F_SEAL_SHRINK)
	c.expectError(c.roundTrip(Register{Size: uint64(3 * pg)}.Encode(c.id()), fd), CodeQuota, false, "REGISTER of 12288 bytes")
	unix.Close(fd)

	h.setHold()
	call := Call{Desc: descInt32(4, ""), SHM: true, Segment: seg.Segment}
	c.send(call.Encode(100), -1)
	c.expectError(c.roundTrip(Free{Segment: seg.Segment}.Encode(101), -1), CodeBusy, false, "used by 1 call(s) in flight")
	h.release()
	if f := c.read(); f.Type != TypeCallOK || f.ID != 100 {
		t.Fatalf("held call: %s id %d", f.Type, f.ID)
	}
	if f := c.roundTrip(Free{Segment: seg.Segment}.Encode(102), -1); f.Type != TypeFreeOK {
		t.Fatalf("FREE after the call: %s %v", f.Type, c.errorOf(f))
	}
}

// A connection holds at most MaxSegments segments, however small: one
// more ALLOC or REGISTER is refused (QUOTA, not fatal, naming the count)
// and the connection goes on; once one is freed, the next is made.
func TestSegmentLimit(t *testing.T) {
	srv, _ := startServer(t, func(c *ServerConfig) { c.MaxSegments = 2 })
	c := dial(t, srv.Path())
	c.attach()
	first, _ := c.alloc(1)
	c.alloc(1)
	c.expectError(c.roundTrip(Alloc{Size: 1}.Encode(c.id()), -1), CodeQuota, false,
		"ALLOC of 1 bytes: shared-memory quota exceeded: 2 segments held, the most one client may hold (the daemon's limits.max_segments)")
	fd := memfd(t, 4096, unix.F_SEAL_SHRINK)
	defer unix.Close(fd)
	c.expectError(c.roundTrip(Register{Size: 4096}.Encode(c.id()), fd), CodeQuota, false,
		"REGISTER of 4096 bytes: shared-memory quota exceeded: 2 segments held")
	if f := c.roundTrip(Free{Segment: first.Segment}.Encode(c.id()), -1); f.Type != TypeFreeOK {
		t.Fatalf("FREE: %s %v", f.Type, c.errorOf(f))
	}
	if f := c.roundTrip(Register{Size: 4096}.Encode(c.id()), fd); f.Type != TypeRegisterOK {
		t.Fatalf("REGISTER after a FREE: %s %v", f.Type, c.errorOf(f))
	}
}

func TestTooManyInFlight(t *testing.T) {
	srv, h := startServer(t, func(c *ServerConfig) { c.MaxInFlight = 2 })
	c := dial(t, srv.Path())
	c.attach()
	h.setHold()
	c.send((&Call{Desc: descInt32(1, ""), Data: make([]byte, 4)}).Encode(10), -1)
	c.send((&Call{Desc: descInt32(1, ""), Data: make([]byte, 4)}).Encode(11), -1)
	c.expectError(c.inlineCall(12, make([]byte, 4), ""), CodeTooMany, false, "2 calls in flight, the limit is 2")
	h.release()
	got := map[uint64]bool{}
	for range 2 {
		f := c.read()
		if f.Type != TypeCallOK {
			t.Fatalf("held call answered %s", f.Type)
		}
		got[f.ID] = true
	}
	if !got[10] || !got[11] {
		t.Fatalf("answers for %v", got)
	}
	// Slots are free as soon as the answers are read: fill them again at
	// once, many times, and never see TOO_MANY.
	for i := range 200 {
		id := uint64(1000 + 2*i)
		c.send((&Call{Desc: descInt32(1, ""), Data: make([]byte, 4)}).Encode(id), -1)
		c.send((&Call{Desc: descInt32(1, ""), Data: make([]byte, 4)}).Encode(id+1), -1)
		for range 2 {
			if f := c.read(); f.Type != TypeCallOK {
				t.Fatalf("round %d: %s %v", i, f.Type, c.errorOf(f))
			}
		}
	}
	// Reusing an id that is in flight is a protocol error.
	h.setHold()
	c.send((&Call{Desc: descInt32(1, ""), Data: make([]byte, 4)}).Encode(50), -1)
	c.expectError(c.inlineCall(50, make([]byte, 4), ""), CodeBadFrame, true, "CALL id 50 is already in flight")
	ev := h.waitGone(t)
	if !errors.Is(ev.cause, ErrBadFrame) {
		t.Errorf("Disconnected cause %v", ev.cause)
	}
	h.release() // answering after the session ended is harmless
}

func TestMalformedFrames(t *testing.T) {
	srv, _ := startServer(t, nil)
	other := dial(t, srv.Path())
	other.attach()
	cases := []struct {
		name  string
		hello bool
		frame []byte
		want  string
		id    uint64 // the ERROR's: the frame's once its header passed
	}{
		{"unknown type", true, Header{Type: 0x07, ID: 3}.Append(nil), "unknown frame type 0x07", 0},
		{"reply type", true, Header{Type: TypeCallOK, Length: 16, ID: 3}.Append(make([]byte, 0)), "CALL_OK (id 3) is a daemon frame", 0},
		{"reserved", true, func() []byte { b := AppendEmpty(nil, TypeStatus, 3); b[6] = 1; return b }(), "reserved header field", 0},
		{"flags", true, func() []byte { b := AppendEmpty(nil, TypeStatus, 3); b[5] = 1; return b }(), "flags 0x01", 0},
		{"short FREE", true, func() []byte {
			b := Header{Type: TypeFree, Length: 4, ID: 3}.Append(nil)
			return append(b, 1, 0, 0, 0)
		}(), "FREE: payload is 4 bytes, want 8", 3},
		{"id 0", true, AppendEmpty(nil, TypeStatus, 0), "STATUS uses id 0", 0},
		{"inline length", true, func() []byte {
			b := (&Call{Desc: descInt32(2, ""), Data: make([]byte, 8)}).Encode(3)
			binary.LittleEndian.PutUint64(b[HeaderSize+8:], 3)
			return b
		}(), "inline data is 8 bytes, count 3 of int32 implies 12", 3},
		{"over max_frame", true, Header{Type: TypeCall, Length: minMaxFrame + 1, ID: 3}.Append(nil), "length 65537 exceeds the limit of 65536", 0},
		{"over pre-hello bound", false, Header{Type: TypeHello, Length: MaxHelloFrame + 1, ID: 1}.Append(nil), "length 4097 exceeds the limit of 4096", 0},
		{"second HELLO", true, Hello{Version: 1, LocalRank: -1, Job: "job"}.Encode(4), "second HELLO (id 4)", 4},
		{"frame of a later version", true, AppendEmpty(nil, TypeLane, 6), "LANE (id 6) needs protocol version 2", 6},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, srv.Path())
			if tc.hello {
				c.attach()
			}
			f := c.roundTrip(tc.frame, -1)
			if f.ID != tc.id {
				t.Errorf("ERROR carries id %d, want %d", f.ID, tc.id)
			}
			c.expectError(f, CodeBadFrame, true, tc.want)
			if f := other.inlineCall(other.id(), make([]byte, 4), ""); f.Type != TypeCallOK {
				t.Fatalf("other client: %s", f.Type)
			}
		})
	}
}

// A header claiming 4 GiB is refused from the header alone: no payload is
// awaited and nothing near its size is allocated.
func TestHugeLengthRejectedBeforeAllocation(t *testing.T) {
	srv, _ := startServer(t, nil)
	for _, hello := range []bool{false, true} {
		c := dial(t, srv.Path())
		if hello {
			c.attach()
		}
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		b := Header{Type: TypeCall, Length: 0xffffffff, ID: 7}.Append(nil)
		c.expectError(c.roundTrip(b, -1), CodeBadFrame, true, "length 4294967295 exceeds the limit")
		runtime.ReadMemStats(&after)
		if grown := after.TotalAlloc - before.TotalAlloc; grown > 16<<20 {
			t.Errorf("hello=%v: %d bytes allocated while refusing the frame", hello, grown)
		}
	}
}

func TestTruncatedFrame(t *testing.T) {
	srv, h := startServer(t, nil)
	c := dial(t, srv.Path())
	c.attach()
	b := (&Call{Desc: descInt32(4, ""), Data: make([]byte, 16)}).Encode(5)
	if _, err := c.uc.Write(b[:HeaderSize+10]); err != nil {
		t.Fatal(err)
	}
	c.uc.CloseWrite()
	ev := h.waitGone(t)
	if ev.cause == nil || !strings.Contains(ev.cause.Error(), "unexpected EOF") {
		t.Errorf("cause %v, want unexpected EOF", ev.cause)
	}
	c.expectClosed()
}

// A status document longer than max_frame goes out whole, up to
// MaxStatusFrame (issue 29: at the largest legal configurations it is
// megabytes); only a longer one fails, INTERNAL.
func TestStatusPastMaxFrame(t *testing.T) {
	srv, h := startServer(t, nil)
	for _, n := range []int{minMaxFrame + 1, MaxStatusFrame} {
		doc := bytes.Repeat([]byte("x"), n)
		h.mu.Lock()
		h.status = doc
		h.mu.Unlock()
		c := dial(t, srv.Path())
		c.attach()
		f := c.roundTrip(AppendEmpty(nil, TypeStatus, 2), -1)
		if f.Type != TypeStatusOK || !bytes.Equal(f.Payload, doc) {
			t.Fatalf("a %d-byte document: %s of %d bytes %v", n, f.Type, len(f.Payload), c.errorOf(f))
		}
		// The connection goes on, its frame bound as before.
		if f := c.inlineCall(3, make([]byte, 4), ""); f.Type != TypeCallOK {
			t.Fatalf("after a %d-byte STATUS_OK: %s", n, f.Type)
		}
	}
	h.mu.Lock()
	h.status = bytes.Repeat([]byte("x"), MaxStatusFrame+1)
	h.mu.Unlock()
	c := dial(t, srv.Path())
	c.attach()
	c.expectError(c.roundTrip(AppendEmpty(nil, TypeStatus, 2), -1), CodeInternal, false, "over the STATUS_OK bound of 8388608")
}

// A client's Conn accepts STATUS_OK up to MaxStatusFrame whatever
// max_frame is, and no other frame past max_frame; the daemon's Conn
// nothing past max_frame.
func TestStatusOKBound(t *testing.T) {
	for _, tc := range []struct {
		side   Side
		typ    Type
		length uint32
		ok     bool
	}{
		{ClientSide, TypeStatusOK, MaxStatusFrame, true},
		{ClientSide, TypeStatusOK, MaxStatusFrame + 1, false},
		{ClientSide, TypeCallOK, minMaxFrame + 1, false},
		{ClientSide, TypeError, minMaxFrame + 1, false},
		{DaemonSide, TypeStatus, minMaxFrame + 1, false},
	} {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		b, mine := os.NewFile(uintptr(fds[0]), "peer"), os.NewFile(uintptr(fds[1]), "mine")
		nc, err := net.FileConn(mine)
		mine.Close()
		if err != nil {
			t.Fatal(err)
		}
		a := nc.(*net.UnixConn)
		c := NewConn(a, tc.side)
		c.SetMaxFrame(minMaxFrame)
		go func() {
			h := Header{Length: tc.length, Type: tc.typ, ID: 2}
			buf := make([]byte, HeaderSize+int(tc.length))
			h.Put(buf)
			b.Write(buf)
		}()
		a.SetReadDeadline(time.Now().Add(10 * time.Second))
		f, err := c.ReadFrame()
		if tc.ok && (err != nil || len(f.Payload) != int(tc.length)) {
			t.Fatalf("%v side, %s of %d bytes: %v", tc.side, tc.typ, tc.length, err)
		}
		if !tc.ok && (err == nil || !strings.Contains(err.Error(), "exceeds the limit")) {
			t.Fatalf("%v side, %s of %d bytes: accepted (%v)", tc.side, tc.typ, tc.length, err)
		}
		c.Close()
		b.Close()
	}
}

// lockedLog is a log sink goroutines may share.
type lockedLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Connections refused before they are admitted (here: no HELLO in time)
// cost a few log lines per reason and uid, not one each, and are counted
// by reason and uid (issue 29).
func TestRefusalsRateLimited(t *testing.T) {
	var buf lockedLog
	srv, _ := startServer(t, func(c *ServerConfig) {
		c.HelloTimeout = 50 * time.Millisecond
		c.Logger = slog.New(slog.NewTextHandler(&buf, nil))
	})
	const n = 40
	for range n {
		c := dial(t, srv.Path())
		c.expectError(c.read(), CodeTimeout, true, "no HELLO within 50ms")
	}
	uid := fmt.Sprintf("uid %d", os.Getuid())
	deadline := time.Now().Add(10 * time.Second)
	for srv.Refusals().Total < n && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	got := srv.Refusals()
	if got.Total != n || got.Reasons["TIMEOUT"] != n || len(got.Sources) != 1 || got.Sources[0].Source != uid {
		t.Fatalf("counts %+v, want %d TIMEOUT from %s", got, n, uid)
	}
	if lines := strings.Count(buf.String(), "msg=\"connection refused\""); lines != 5 {
		t.Fatalf("%d refusals logged %d lines in full, want 5:\n%s", n, lines, buf.String())
	}
	if strings.Contains(buf.String(), "closing connection") || strings.Contains(buf.String(), "client detached") {
		t.Fatalf("a refused connection logged more than its refusal:\n%s", buf.String())
	}
}

// A steady stream of calls costs no allocations on either side: the codec,
// the Conn's reads and writes, the session's requests and replies.
func TestSteadyStateCallsDoNotAllocate(t *testing.T) {
	srv, h := startServer(t, nil)
	h.mu.Lock()
	h.inline = true
	h.mu.Unlock()
	c := dial(t, srv.Path())
	c.attach()
	seg, _ := c.alloc(1 << 16)
	inline := (&Call{Desc: descInt32(256, "grad"), Data: make([]byte, 1024)}).Encode(7)
	shmCall := (&Call{Desc: descInt32(4096, "grad"), SHM: true, Segment: seg.Segment}).Encode(8)
	var ok CallOK
	roundTrip := func(frame []byte) {
		f := c.roundTrip(frame, -1)
		if f.Type != TypeCallOK {
			panic(f.Type.String())
		}
		if err := DecodeCallOK(f.Payload, &ok); err != nil {
			panic(err)
		}
	}
	for range 50 { // warm the request pool and buffers
		roundTrip(inline)
		roundTrip(shmCall)
	}
	if n := testing.AllocsPerRun(300, func() { roundTrip(inline) }); n != 0 {
		t.Errorf("inline call round trip allocates %v times", n)
	}
	if n := testing.AllocsPerRun(300, func() { roundTrip(shmCall) }); n != 0 {
		t.Errorf("shared-memory call round trip allocates %v times", n)
	}
}

// A client that stops reading is dropped after the write timeout; replies
// to it queue without blocking the core.
func TestClientNotReadingIsDropped(t *testing.T) {
	srv, h := startServer(t, func(c *ServerConfig) {
		c.WriteTimeout = 200 * time.Millisecond
		c.MaxInFlight = 4096
	})
	h.mu.Lock()
	h.inline = true // replies are queued from the reader goroutine itself
	h.mu.Unlock()
	c := dial(t, srv.Path())
	c.attach()
	frame := (&Call{Desc: descInt32(1024, ""), Data: make([]byte, 4096)}).Encode(1)
	go func() {
		for i := uint64(1); i < 4096; i++ {
			binary.LittleEndian.PutUint64(frame[8:], i)
			if _, err := c.uc.Write(frame); err != nil {
				return
			}
		}
	}()
	ev := h.waitGone(t)
	if ev.cause == nil || !strings.Contains(ev.cause.Error(), "timeout") {
		t.Errorf("cause %v, want a write timeout", ev.cause)
	}
}

// A client that disconnects with a shared-memory call in flight: the
// handler is told, the request stays valid (its segment mapped) until the
// core answers it, and then everything is released.
func TestDisconnectWithCallInFlight(t *testing.T) {
	srv, h := startServer(t, nil)
	base := openFds(t)
	c := dial(t, srv.Path())
	c.attach()
	seg, _ := c.alloc(8192)
	h.setHold()
	c.send((&Call{Desc: descInt32(2048, "held"), SHM: true, Segment: seg.Segment}).Encode(9), -1)
	for {
		h.mu.Lock()
		n := len(h.held)
		h.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	c.c.Close()
	h.waitGone(t)
	h.mu.Lock()
	r := h.held[0]
	h.mu.Unlock()
	if r.Session().ID() == 0 || r.Inline || len(r.Buf) != 8192 {
		t.Fatalf("held request %+v", r)
	}
	r.Buf[8191] = 1 // still mapped after Disconnected
	waitFds(t, base+1)
	h.release()
	waitFds(t, base)
}
