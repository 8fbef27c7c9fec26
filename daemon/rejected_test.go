package daemon_test

import (
	"encoding/binary"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/ipc"
)

// rawTrainer is a trainer speaking the protocol itself, to send calls the
// clients would refuse before sending.
type rawTrainer struct {
	t    *testing.T
	conn *ipc.Conn
	ok   ipc.HelloOK
}

func attachRaw(t *testing.T, sock string, rank int32) *rawTrainer {
	t.Helper()
	return attachRawV(t, sock, rank, 1)
}

// attachRawV attaches in protocol version v.
func attachRawV(t *testing.T, sock string, rank int32, v uint16) *rawTrainer {
	t.Helper()
	uc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	uc.SetDeadline(time.Now().Add(30 * time.Second))
	tr := &rawTrainer{t: t, conn: ipc.NewConn(uc, ipc.ClientSide)}
	t.Cleanup(func() { tr.conn.Close() })
	f := tr.roundTrip(ipc.Hello{Version: v, LocalRank: rank, PID: 1, Job: "bench"}.Encode(1))
	if f.Type != ipc.TypeHelloOK {
		t.Fatalf("local rank %d: HELLO answered %s", rank, f.Type)
	}
	ok, err := ipc.DecodeHelloOK(f.Payload)
	if err != nil {
		t.Fatal(err)
	}
	tr.conn.SetMaxFrame(ok.MaxFrame)
	tr.ok = ok
	return tr
}

func (tr *rawTrainer) send(b []byte) {
	tr.t.Helper()
	if err := tr.conn.WriteFrame(b, -1); err != nil {
		tr.t.Fatal(err)
	}
}

func (tr *rawTrainer) read() ipc.Frame {
	tr.t.Helper()
	f, err := tr.conn.ReadFrame()
	if err != nil {
		tr.t.Fatal(err)
	}
	return f
}

func (tr *rawTrainer) roundTrip(b []byte) ipc.Frame {
	tr.t.Helper()
	tr.send(b)
	return tr.read()
}

// callOK reads the answer to call id and returns its seq and the int32
// result.
func (tr *rawTrainer) callOK(id uint64) (uint64, int32) {
	tr.t.Helper()
	f := tr.read()
	if f.Type != ipc.TypeCallOK || f.ID != id {
		e, _ := ipc.DecodeError(f.Flags, f.Payload)
		tr.t.Fatalf("call %d answered %s id %d (%v)", id, f.Type, f.ID, e)
	}
	var ok ipc.CallOK
	if err := ipc.DecodeCallOK(f.Payload, &ok); err != nil {
		tr.t.Fatal(err)
	}
	return ok.Seq, int32(binary.LittleEndian.Uint32(ok.Result))
}

func sumCall(name string, v int32) *ipc.Call {
	data := binary.LittleEndian.AppendUint32(nil, uint32(v))
	return &ipc.Call{Desc: collective.Desc{Op: collective.OpAllReduce, DType: collective.Int32, Reduce: collective.Sum, Count: 1, Name: name}, Data: data}
}

// A CALL the daemon refuses without matching it (BAD_REQUEST,
// TOO_LARGE, BAD_SEGMENT, UNSUPPORTED, whether the session or the core
// refuses it) uses up no collective number: the trainer's next call joins
// the collective its other trainers are in. Trainer 1's call waits while
// trainer 0's refused calls come and go; trainer 0's next call must
// complete it, and the collective after it must be numbered next.
func TestRefusedCallsTakeNoCollectiveNumber(t *testing.T) {
	sock := startOne(t, 2)
	a, b := attachRaw(t, sock, 0), attachRaw(t, sock, 1)
	b.send(sumCall("k0", 5).Encode(10))

	seg := a.roundTrip(ipc.Alloc{Size: 4096}.Encode(2))
	if seg.Type != ipc.TypeAllocOK {
		t.Fatalf("ALLOC answered %s", seg.Type)
	}
	alloc, err := ipc.DecodeAllocOK(seg.Payload)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(seg.FD)

	badReduce := sumCall("k0", 1)
	badReduce.Desc.Reduce = 9
	refused := []struct {
		what string
		call *ipc.Call
		code ipc.Code
	}{
		{"unknown reduce op", badReduce, ipc.CodeBadRequest},
		{"unknown segment", &ipc.Call{Desc: sumCall("k0", 0).Desc, SHM: true, Segment: alloc.Segment + 7}, ipc.CodeBadSegment},
		{"span past the segment's end", &ipc.Call{Desc: sumCall("k0", 0).Desc, SHM: true, Segment: alloc.Segment, Offset: alloc.Size}, ipc.CodeBadSegment},
		{"broadcast root outside the world", &ipc.Call{Desc: collective.Desc{Op: collective.OpBroadcast, DType: collective.Int32, Count: 1, Root: 99, Name: "k0"}, Data: make([]byte, 4)}, ipc.CodeBadRequest},
		{"allgather", &ipc.Call{Desc: collective.Desc{Op: collective.OpAllGather, DType: collective.Int32, Count: 1, Name: "k0"}, Data: make([]byte, 4)}, ipc.CodeUnsupported},
		// Version-3 codes from a version-1 client.
		{"bfloat16 before version 3", &ipc.Call{Desc: collective.Desc{Op: collective.OpAllReduce, DType: collective.BFloat16, Reduce: collective.Sum, Count: 1, Name: "k0"}, Data: make([]byte, 2)}, ipc.CodeBadRequest},
		{"avg before version 3", &ipc.Call{Desc: collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Avg, Count: 1, Name: "k0"}, Data: make([]byte, 4)}, ipc.CodeBadRequest},
		{"reduce before version 3", &ipc.Call{Desc: collective.Desc{Op: collective.OpReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 1, Name: "k0"}, Data: make([]byte, 4)}, ipc.CodeBadRequest},
	}
	over := uint64(a.ok.InlineLimit) + 4
	refused = append(refused, struct {
		what string
		call *ipc.Call
		code ipc.Code
	}{"inline data over the limit", &ipc.Call{Desc: collective.Desc{Op: collective.OpBroadcast, DType: collective.Bytes, Count: over, Name: "k0"}, Data: make([]byte, over)}, ipc.CodeTooLarge})
	for i, r := range refused {
		id := uint64(100 + i)
		f := a.roundTrip(r.call.Encode(id))
		e, err := ipc.DecodeError(f.Flags, f.Payload)
		if f.Type != ipc.TypeError || f.ID != id || err != nil || e.Code != r.code || e.Fatal {
			t.Fatalf("%s: answered %s id %d (%v, %v), want a non-fatal %s for id %d", r.what, f.Type, f.ID, e, err, r.code, id)
		}
	}

	a.send(sumCall("k0", 7).Encode(20))
	seqA, resA := a.callOK(20)
	seqB, resB := b.callOK(10)
	if seqA != seqB || resA != 12 || resB != 12 {
		t.Fatalf("first call after the refused ones: trainer 0 seq %d result %d, trainer 1 seq %d result %d; want one collective, 5+7", seqA, resA, seqB, resB)
	}
	a.send(sumCall("k1", 1).Encode(21))
	b.send(sumCall("k1", 2).Encode(11))
	seqA2, resA2 := a.callOK(21)
	seqB2, resB2 := b.callOK(11)
	if seqA2 != seqA+1 || seqB2 != seqA+1 || resA2 != 3 || resB2 != 3 {
		t.Fatalf("next collective: seqs %d and %d, results %d and %d; want seq %d and 3", seqA2, seqB2, resA2, resB2, seqA+1)
	}
}

// Version 3's result spans and version checks: each refusal names what
// was wrong, is not fatal, and takes no collective number.
func TestVersion3Refusals(t *testing.T) {
	sock := startOne(t, 2)
	a, b := attachRawV(t, sock, 0, 3), attachRawV(t, sock, 1, 3)
	b.send(sumCall("k0", 5).Encode(10))
	seg := a.roundTrip(ipc.Alloc{Size: 4096}.Encode(2))
	alloc, err := ipc.DecodeAllocOK(seg.Payload)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(seg.FD)
	gather := collective.Desc{Op: collective.OpAllGather, DType: collective.Int32, Count: 4, Name: "k0"}
	scatter := collective.Desc{Op: collective.OpReduceScatter, DType: collective.Int32, Reduce: collective.Sum, Count: 8, Name: "k0"}
	big := uint64(a.ok.InlineLimit)/8 + 1
	cases := []struct {
		what string
		call ipc.Call
		code ipc.Code
		want string
	}{
		{"no result span", ipc.Call{Desc: gather, SHM: true, Segment: alloc.Segment}, ipc.CodeBadRequest, "needs a result span"},
		{"result span on allreduce", ipc.Call{Desc: sumCall("k0", 0).Desc, SHM: true, Segment: alloc.Segment, Out: true, OutSegment: alloc.Segment, OutOffset: 64}, ipc.CodeBadRequest, "takes no result span"},
		{"result past the segment", ipc.Call{Desc: gather, SHM: true, Segment: alloc.Segment, Out: true, OutSegment: alloc.Segment, OutOffset: 4096 - 16}, ipc.CodeBadSegment, "segment"},
		{"overlap not in place", ipc.Call{Desc: gather, SHM: true, Segment: alloc.Segment, Offset: 4, Out: true, OutSegment: alloc.Segment}, ipc.CodeBadRequest, "overlap"},
		{"scatter overlap not in place", ipc.Call{Desc: scatter, SHM: true, Segment: alloc.Segment, Out: true, OutSegment: alloc.Segment, OutOffset: 4}, ipc.CodeBadRequest, "overlap"},
		{"inline result over the limit", ipc.Call{Desc: collective.Desc{Op: collective.OpAllGather, DType: collective.Int32, Count: big, Name: "k0"}, Data: make([]byte, 4*big)}, ipc.CodeTooLarge, "the result is"},
		{"v count not the caller's", ipc.Call{Desc: collective.Desc{Op: collective.OpAllGather, DType: collective.Int32, Count: 2, Counts: []uint64{1, 2}, Name: "k0"}, Data: make([]byte, 8)}, ipc.CodeBadRequest, "counts[0] = 1"},
		{"counts of another world", ipc.Call{Desc: collective.Desc{Op: collective.OpAllGather, DType: collective.Int32, Count: 1, Counts: []uint64{1}, Name: "k0"}, Data: make([]byte, 4)}, ipc.CodeBadRequest, "1 per-rank counts for a world of 2"},
		{"root out of range", ipc.Call{Desc: collective.Desc{Op: collective.OpReduce, DType: collective.Int32, Reduce: collective.Sum, Count: 1, Root: 2, Name: "k0"}, Data: make([]byte, 4)}, ipc.CodeBadRequest, "reduce root 2 outside world of 2"},
		{"avg of ints", ipc.Call{Desc: collective.Desc{Op: collective.OpAllReduce, DType: collective.Int64, Reduce: collective.Avg, Count: 1, Name: "k0"}, Data: make([]byte, 8)}, ipc.CodeBadRequest, "avg needs a float dtype, got int64"},
	}
	for i, c := range cases {
		id := uint64(100 + i)
		f := a.roundTrip(c.call.Encode(id))
		e, err := ipc.DecodeError(f.Flags, f.Payload)
		if f.Type != ipc.TypeError || f.ID != id || err != nil || e.Code != c.code || e.Fatal || !strings.Contains(e.Message, c.want) {
			t.Fatalf("%s: answered %s id %d (%v, %v), want a non-fatal %s saying %q", c.what, f.Type, f.ID, e, err, c.code, c.want)
		}
	}
	// None of them took a collective number: this call is collective 0.
	a.send((&ipc.Call{Desc: sumCall("k0", 7).Desc, Data: binary.LittleEndian.AppendUint32(nil, 7)}).Encode(20))
	if seqA, resA := a.callOK(20); seqA != 0 || resA != 12 {
		t.Fatalf("the call after the refusals: seq %d result %d, want collective 0 with 12", seqA, resA)
	}
	b.callOK(10)
}

// The extension flag on a version-2 connection is an undefined flag:
// fatal, as before version 3.
func TestExtensionBeforeVersion3IsFatal(t *testing.T) {
	sock := startOne(t, 1)
	a := attachRawV(t, sock, 0, 2)
	call := ipc.Call{Desc: collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 1,
		Shape: collective.Shape{N: 1, Dims: [collective.MaxDims]uint64{1}}}, Data: make([]byte, 4)}
	f := a.roundTrip(call.Encode(5))
	e, err := ipc.DecodeError(f.Flags, f.Payload)
	if f.Type != ipc.TypeError || err != nil || e.Code != ipc.CodeBadFrame || !e.Fatal || !strings.Contains(e.Message, "the extension needs 3") {
		t.Fatalf("answered %s (%v, %v), want a fatal BAD_FRAME naming the extension", f.Type, e, err)
	}
}
