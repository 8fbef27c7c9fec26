package ipc

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// loadVector returns the shared vector called name, decoded.
func loadVector(t *testing.T, name string) (Header, *Error) {
	t.Helper()
	raw, err := os.ReadFile("../clients/testdata/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vs []vector
	if err := json.Unmarshal(raw, &vs); err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		if v.Name != name {
			continue
		}
		b, err := hex.DecodeString(v.Hex)
		if err != nil {
			t.Fatal(err)
		}
		h, err := DecodeHeader(b, MaxHelloFrame)
		if err != nil || h.Type != TypeError {
			t.Fatalf("vector %s: %s, %v; want an ERROR", name, h.Type, err)
		}
		e, err := DecodeError(h.Flags, b[HeaderSize:])
		if err != nil {
			t.Fatalf("vector %s: %v", name, err)
		}
		return h, e
	}
	t.Fatalf("no vector %s in clients/testdata/vectors.json", name)
	return Header{}, nil
}

// The daemon's fatal answers to frames at fault are the shared vectors'
// ERROR frames: the frame's own id, the code, FATAL. Each is provoked
// from a real server over a Unix socket; the request that caused it is
// not acted on (no reply of its own comes first), and the connection is
// closed after it.
func TestFatalErrorsMatchVectors(t *testing.T) {
	srv, h := startServer(t, nil)
	cases := []struct {
		vector string
		hello  bool
		send   func(c *client)
		names  string // what the message must name
	}{
		{"error_bad_fd_fatal", true, func(c *client) {
			fd := memfd(t, 4096, unix.F_SEAL_SHRINK)
			defer unix.Close(fd)
			c.send(AppendEmpty(nil, TypeStatus, 5), fd)
		}, "STATUS (id 5) arrived with 1 fd(s) and carries none"},
		{"error_bad_fd_two_fds_fatal", true, func(c *client) {
			a, b := memfd(t, 4096, unix.F_SEAL_SHRINK), memfd(t, 4096, unix.F_SEAL_SHRINK)
			defer unix.Close(a)
			defer unix.Close(b)
			if _, _, err := c.uc.WriteMsgUnix(Register{Size: 4096}.Encode(6), unix.UnixRights(a, b), nil); err != nil {
				t.Fatal(err)
			}
		}, "REGISTER (id 6) arrived with 2 fds; it carries exactly one"},
		{"error_bad_frame_request_fatal", true, func(c *client) {
			b := (&Call{Desc: descInt32(2, ""), Data: make([]byte, 8)}).Encode(7)
			binary.LittleEndian.PutUint64(b[HeaderSize+8:], 3)
			c.send(b, -1)
		}, "inline data is 8 bytes, count 3 of int32 implies 12"},
		{"error_job_fatal", false, func(c *client) {
			c.send(Hello{Version: 1, LocalRank: -1, Job: "a"}.Encode(1), -1)
		}, `names job "a"`},
		{"error_hello_job_not_utf8", false, func(c *client) {
			c.send(Hello{Version: 1, LocalRank: -1, Job: "\xff"}.Encode(1), -1)
		}, `job name "\xff" is not UTF-8`},
	}
	for _, tc := range cases {
		t.Run(tc.vector, func(t *testing.T) {
			wantH, wantE := loadVector(t, tc.vector)
			base := openFds(t)
			c := dial(t, srv.Path())
			if tc.hello {
				c.attach()
			}
			tc.send(c)
			f := c.read()
			if f.Type != TypeError || f.ID != wantH.ID || f.Flags != wantH.Flags {
				t.Fatalf("answer %s id %d flags %#x (%v), vector %s has ERROR id %d flags %#x",
					f.Type, f.ID, f.Flags, c.errorOf(f), tc.vector, wantH.ID, wantH.Flags)
			}
			c.expectError(f, wantE.Code, true, tc.names)
			c.c.Close()
			if tc.hello {
				h.waitGone(t)
			}
			waitFds(t, base)
		})
	}
}

// A CALL that comes with an fd fails itself, before it reaches the core:
// the core never sees the call, so it never joins a collective.
func TestCallWithFdNeverReachesTheCore(t *testing.T) {
	srv, h := startServer(t, nil)
	h.setHold()
	base := openFds(t)
	c := dial(t, srv.Path())
	c.attach()
	fd := memfd(t, 4096, unix.F_SEAL_SHRINK)
	c.send((&Call{Desc: descInt32(1, ""), Data: make([]byte, 4)}).Encode(9), fd)
	unix.Close(fd)
	f := c.read()
	if f.ID != 9 {
		t.Errorf("ERROR carries id %d, want the CALL's 9", f.ID)
	}
	c.expectError(f, CodeBadFD, true, "CALL (id 9) arrived with 1 fd(s) and carries none")
	if ev := h.waitGone(t); !strings.Contains(ev.cause.Error(), "CALL (id 9)") {
		t.Errorf("Disconnected cause %v", ev.cause)
	}
	h.mu.Lock()
	held := len(h.held)
	h.mu.Unlock()
	if held != 0 {
		t.Errorf("the core got %d call(s); a frame with a stray fd must not be acted on", held)
	}
	c.c.Close()
	waitFds(t, base)
}

// loadVectors returns every shared vector.
func loadVectors(t *testing.T) []vector {
	t.Helper()
	raw, err := os.ReadFile("../clients/testdata/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vs []vector
	if err := json.Unmarshal(raw, &vs); err != nil {
		t.Fatal(err)
	}
	return vs
}

// attachIn sends HELLO in protocol version v and expects HELLO_OK in it.
func (c *client) attachIn(v uint16) {
	c.t.Helper()
	f := c.roundTrip(Hello{Version: v, LocalRank: -1, PID: uint32(os.Getpid()), Job: "job", Label: "vectors"}.Encode(1), -1)
	if f.Type != TypeHelloOK {
		c.t.Fatalf("HELLO in version %d answered with %s: %v", v, f.Type, c.errorOf(f))
	}
	ok, err := DecodeHelloOK(f.Payload)
	if err != nil || ok.Version != v {
		c.t.Fatalf("HELLO in version %d: HELLO_OK in version %d, %v", v, ok.Version, err)
	}
	c.ok = ok
	c.c.SetMaxFrame(ok.MaxFrame)
}

// The flags of a later protocol version (EXT before 3, NAMED before 4)
// on a connection of an older one: each such vector, sent to a real
// server on a connection of its context's version, fails itself with a
// fatal BAD_FRAME carrying its id. On a connection of the newest version
// the same frame is a call like any other.
func TestLaterVersionFlagsAreFatalOnOlderConnections(t *testing.T) {
	srv, h := startServer(t, nil)
	n := 0
	for _, v := range loadVectors(t) {
		if v.Valid == nil || *v.Valid || v.Error != "bad_flags" || v.Context.ConnectionVersion == 0 {
			continue
		}
		n++
		b, err := hex.DecodeString(v.Hex)
		if err != nil {
			t.Fatal(err)
		}
		id := binary.LittleEndian.Uint64(b[8:])
		for _, version := range []int{v.Context.ConnectionVersion, Version} {
			c := dial(t, srv.Path())
			c.attachIn(uint16(version))
			c.send(b, -1)
			f := c.read()
			if version == Version {
				// A world of four answers the call (or refuses it as a
				// request: the SHM vectors name segments it has not).
				if f.ID != id || (f.Type == TypeError && c.errorOf(f).Fatal) {
					t.Errorf("%s on version %d: answered %s id %d (%v), want an answer to id %d", v.Name, version, f.Type, f.ID, c.errorOf(f), id)
				}
			} else {
				if f.Type != TypeError || f.ID != id {
					t.Fatalf("%s: answered %s id %d (%v), want ERROR id %d", v.Name, f.Type, f.ID, c.errorOf(f), id)
				}
				c.expectError(f, CodeBadFrame, true, "undefined bits in protocol version")
			}
			c.c.Close()
			h.waitGone(t)
		}
	}
	if n < 3 {
		t.Fatalf("%d vectors of later flags on older connections, want EXT and NAMED ones", n)
	}
}

// A named call without a name (the refused vectors of rule
// named_without_name) is a request the daemon refuses, not a broken
// frame: BAD_REQUEST with the call's id, and the connection goes on.
func TestNamedWithoutNameIsRefused(t *testing.T) {
	srv, _ := startServer(t, nil)
	c := dial(t, srv.Path())
	c.attachIn(Version)
	n := 0
	for _, v := range loadVectors(t) {
		if v.Rule != "named_without_name" {
			continue
		}
		n++
		b, err := hex.DecodeString(v.Hex)
		if err != nil {
			t.Fatal(err)
		}
		f := c.roundTrip(b, -1)
		if id := binary.LittleEndian.Uint64(b[8:]); f.ID != id {
			t.Fatalf("%s: answered id %d, want %d", v.Name, f.ID, id)
		}
		c.expectError(f, CodeBadRequest, false, "a named call needs a name")
	}
	if n < 2 {
		t.Fatalf("%d vectors of rule named_without_name, want 2", n)
	}
	if f := c.inlineCall(c.id(), []byte{1, 2, 3, 4}, "after"); f.Type != TypeCallOK {
		t.Fatalf("the call after the refusals: %s (%v)", f.Type, c.errorOf(f))
	}
}
