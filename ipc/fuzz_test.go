package ipc

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/collectived/collectived/collective"
)

// decodeRequest decodes one client frame the way a session does. A frame
// that decodes is canonical: encoding what was decoded gives it back.
func decodeRequest(t *testing.T, h Header, p []byte, names *Names) {
	var out []byte
	var err error
	switch h.Type {
	case TypeHello:
		var m Hello
		if m, err = DecodeHello(p); err == nil {
			out = m.Encode(h.ID)
		}
	case TypeAlloc:
		var m Alloc
		if m, err = DecodeAlloc(p); err == nil {
			out = m.Encode(h.ID)
		}
	case TypeFree:
		var m Free
		if m, err = DecodeFree(p); err == nil {
			out = m.Encode(h.ID)
		}
	case TypeRegister:
		var m Register
		if m, err = DecodeRegister(p); err == nil {
			out = m.Encode(h.ID)
		}
	case TypeStatus, TypeLane, TypeWake:
		if err = DecodeEmpty(h.Type, p); err == nil {
			out = AppendEmpty(nil, h.Type, h.ID)
		}
	case TypeCall:
		var m Call
		if err = DecodeCall(p, &m, names); err == nil {
			out = m.Encode(h.ID)
			_ = m.Desc.Validate(8) // must not panic on anything decoded
			_ = m.Desc.String()
			for rank := 0; rank < 8; rank += 7 {
				_, _ = CheckCall(&m, CallLimits{Version: 3, WorldSize: 8, WorldRank: rank, InlineLimit: 1 << 16})
			}
		}
	default:
		if h.Type.IsRequest() {
			t.Fatalf("request type %s not covered", h.Type)
		}
		return
	}
	if err != nil {
		var e *Error
		if !errors.As(err, &e) || !e.Code.Known() || e.Message == "" {
			t.Fatalf("%s: error %v is not a coded *Error with a message", h.Type, err)
		}
		return
	}
	in := h.Append(nil)
	in = append(in, p...)
	if !bytes.Equal(out, in) {
		t.Fatalf("%s decodes but re-encodes differently:\n in %x\nout %x", h.Type, in, out)
	}
}

func FuzzDecodeFrame(f *testing.F) {
	if raw, err := os.ReadFile("../clients/testdata/vectors.json"); err == nil {
		var vs []vector
		if json.Unmarshal(raw, &vs) == nil {
			for _, v := range vs {
				if b, err := hex.DecodeString(v.Hex); err == nil && v.Direction == "c2d" {
					f.Add(b)
				}
			}
		}
	}
	f.Add(Hello{Version: 1, LocalRank: -1, Job: "job", Label: "x"}.Encode(1))
	f.Add((&Call{Desc: collective.Desc{Op: collective.OpAllReduce, DType: collective.Float64, Reduce: collective.Max, Count: 2, Name: "n"},
		Data: make([]byte, 16)}).Encode(3))
	f.Add((&Call{Desc: collective.Desc{Op: collective.OpBroadcast, DType: collective.Bytes, Count: 9, Root: 1}, SHM: true, Segment: 1, Offset: 3}).Encode(4))
	f.Add(append(Alloc{Size: 1}.Encode(2), Free{Segment: 1}.Encode(3)...))
	f.Add(Header{Type: TypeCall, Length: 0xffffffff, ID: 1}.Append(nil))
	f.Add(AppendEmpty(nil, TypeLane, 2))
	f.Add(WakeFrame)
	f.Fuzz(func(t *testing.T, b []byte) {
		// The codec alone, as the session applies it to one frame.
		var names Names
		if h, err := DecodeHeader(b, MaxHelloFrame); err == nil {
			if int(h.Length) <= len(b)-HeaderSize {
				decodeRequest(t, h, b[HeaderSize:HeaderSize+int(h.Length)], &names)
			}
		} else if e, ok := err.(*Error); !ok || e.Code != CodeBadFrame || !e.Fatal {
			t.Fatalf("DecodeHeader error %v is not a fatal BAD_FRAME", err)
		}
		// The same bytes through a Conn, as a stream of frames.
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		wf, rf := os.NewFile(uintptr(fds[0]), "w"), os.NewFile(uintptr(fds[1]), "r")
		defer wf.Close()
		rc, err := net.FileConn(rf)
		rf.Close()
		if err != nil {
			t.Fatal(err)
		}
		conn := NewConn(rc.(*net.UnixConn), DaemonSide)
		defer conn.Close()
		go func() {
			wf.Write(b)
			wf.Close()
		}()
		for i := 0; ; i++ {
			fr, err := conn.ReadFrame()
			if err != nil {
				break
			}
			if fr.FD >= 0 {
				t.Fatal("an fd appeared from nowhere")
			}
			decodeRequest(t, fr.Header, fr.Payload, &names)
			if i == 0 {
				conn.SetMaxFrame(minMaxFrame)
			}
		}
	})
}
