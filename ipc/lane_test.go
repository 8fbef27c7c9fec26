package ipc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// attachV2 is attach in protocol version 2.
func (c *client) attachV2() HelloOK {
	c.t.Helper()
	return c.attachAt(2)
}

// attachAt is attach in protocol version v (2 or later: one with a lane).
func (c *client) attachAt(v uint16) HelloOK {
	c.t.Helper()
	f := c.roundTrip(Hello{Version: v, LocalRank: -1, PID: uint32(os.Getpid()), Job: "job", Label: "lane"}.Encode(1), -1)
	if f.Type != TypeHelloOK {
		c.t.Fatalf("HELLO answered with %s: %v", f.Type, c.errorOf(f))
	}
	ok, err := DecodeHelloOK(f.Payload)
	if err != nil {
		c.t.Fatal(err)
	}
	if ok.Version != v {
		c.t.Fatalf("HELLO_OK in version %d, want %d", ok.Version, v)
	}
	c.ok = ok
	c.c.SetMaxFrame(ok.MaxFrame)
	return ok
}

// openLane asks for the connection's lane and maps it; the client's Conn
// then polls it beside the socket.
func (c *client) openLane() *Lane {
	c.t.Helper()
	f := c.replyWithFD(AppendEmpty(nil, TypeLane, c.id()), TypeLaneOK)
	defer unix.Close(f.FD)
	m, err := DecodeLaneOK(f.Payload)
	if err != nil {
		c.t.Fatal(err)
	}
	seals, err := unix.FcntlInt(uintptr(f.FD), unix.F_GET_SEALS, 0)
	if err != nil || seals&(unix.F_SEAL_SHRINK|unix.F_SEAL_GROW) != unix.F_SEAL_SHRINK|unix.F_SEAL_GROW {
		c.t.Fatalf("lane memfd seals %#x, %v: want shrink and grow sealed", seals, err)
	}
	l, err := OpenLane(f.FD, m.Size, ClientSide)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { l.Close() })
	c.c.SetLane(l)
	return l
}

// put puts frame on the lane, ringing the daemon if it sleeps.
func (c *client) put(l *Lane, frame []byte) {
	c.t.Helper()
	if l.Put(frame) {
		c.send(WakeFrame, -1)
	}
}

// readAny reads the next frame from the socket or the lane, past the
// daemon's rings (WAKE_CLIENT).
func (c *client) readAny(l *Lane, buf []byte) Frame {
	c.t.Helper()
	for {
		f, err := c.c.ReadFrame()
		if err == ErrRung {
			f, err = l.Take(buf, c.c.MaxFrame())
		}
		if err != nil {
			c.t.Fatalf("read: %v", err)
		}
		if f.Type != TypeWakeClient {
			return f
		}
	}
}

// Calls and their answers cross the lane, with the daemon's reader
// polling (it finds the call itself) or asleep on the socket (the client
// rings it with WAKE), and the client's reader likewise.
func TestLaneCalls(t *testing.T) {
	for _, spin := range []time.Duration{0, 50 * time.Millisecond} {
		t.Run("daemon spin "+spin.String(), func(t *testing.T) {
			srv, _ := startServer(t, func(c *ServerConfig) { c.Spin = spin })
			c := dial(t, srv.Path())
			c.attachV2()
			l := c.openLane()
			buf := make([]byte, LaneFrameMax)
			for i := 0; i < 50; i++ {
				data := []byte{byte(i), 1, 2, 3, 4, 5, 6, 7}
				call := Call{Desc: descInt32(2, ""), Data: data}
				id := c.id()
				c.put(l, call.Encode(id))
				if i%2 == 1 {
					c.c.SetSpin(0) // the client's reader sleeps: the daemon rings it
				} else {
					c.c.SetSpin(50 * time.Millisecond)
				}
				f := c.readAny(l, buf)
				if f.Type != TypeCallOK || f.ID != id {
					t.Fatalf("call %d: got %s id %d, want CALL_OK id %d (%v)", i, f.Type, f.ID, id, c.errorOf(f))
				}
				var ok CallOK
				if err := DecodeCallOK(f.Payload, &ok); err != nil {
					t.Fatal(err)
				}
				want := []byte{byte(i) + 1, 2, 3, 4, 5, 6, 7, 8}
				if !bytes.Equal(ok.Result, want) {
					t.Fatalf("call %d: result %v, want %v", i, ok.Result, want)
				}
				if !l.Free() {
					t.Fatalf("call %d answered but the lane is not taken", i)
				}
			}
			// The socket still works beside the lane.
			if f := c.inlineCall(c.id(), []byte{9, 0, 0, 0}, ""); f.Type != TypeCallOK {
				t.Fatalf("socket call after lane calls: %s %v", f.Type, c.errorOf(f))
			}
		})
	}
}

// A lane call's answer that does not fit the lane (a long ERROR) comes on
// the socket; the daemon's validation errors for a lane call too.
func TestLaneAnswersOnTheSocket(t *testing.T) {
	srv, _ := startServer(t, func(c *ServerConfig) { c.Spin = 10 * time.Millisecond })
	c := dial(t, srv.Path())
	c.attachV2()
	l := c.openLane()
	buf := make([]byte, LaneFrameMax)

	bad := Call{Desc: descInt32(2, ""), Data: []byte{1, 2, 3, 4, 5, 6, 7, 8}}
	bad.Desc.Reduce = 99 // not a reduction
	id := c.id()
	c.put(l, bad.Encode(id))
	f := c.readAny(l, buf)
	c.expectError(f, CodeBadRequest, false, "CALL")
	if f.ID != id {
		t.Fatalf("error for id %d, want %d", f.ID, id)
	}
	// The lane is free again: a good call goes through it.
	good := Call{Desc: descInt32(1, "fail"), Data: []byte{1, 0, 0, 0}}
	id = c.id()
	c.put(l, good.Encode(id))
	f = c.readAny(l, buf)
	c.expectError(f, CodeMismatch, false, "disagrees")
}

// Every misuse of the lane gets an error naming it; the daemon goes on
// serving other connections.
func TestLaneErrors(t *testing.T) {
	srv, h := startServer(t, func(c *ServerConfig) { c.Spin = 10 * time.Millisecond })

	t.Run("LANE in version 1", func(t *testing.T) {
		c := dial(t, srv.Path())
		c.attach()
		f := c.roundTrip(AppendEmpty(nil, TypeLane, c.id()), -1)
		c.expectError(f, CodeBadFrame, true, "LANE (id 2) needs protocol version 2; this connection speaks 1")
	})
	t.Run("WAKE in version 1", func(t *testing.T) {
		c := dial(t, srv.Path())
		c.attach()
		f := c.roundTrip(WakeFrame, -1)
		c.expectError(f, CodeBadFrame, true, "WAKE (id 0) needs protocol version 2")
	})
	t.Run("second LANE", func(t *testing.T) {
		c := dial(t, srv.Path())
		c.attachV2()
		c.openLane()
		f := c.roundTrip(AppendEmpty(nil, TypeLane, c.id()), -1)
		c.expectError(f, CodeBadRequest, false, "has its lane already")
	})
	t.Run("LANE with a payload", func(t *testing.T) {
		c := dial(t, srv.Path())
		c.attachV2()
		b, start := beginFrame(nil, TypeLane, 0, c.id())
		f := c.roundTrip(endFrame(append(b, 1, 2), start), -1)
		c.expectError(f, CodeBadFrame, true, "LANE: payload is 2 bytes, want 0")
	})
	t.Run("LANE from an observer", func(t *testing.T) {
		c := dial(t, srv.Path())
		f := c.roundTrip(Hello{Version: 2, Observer: true, LocalRank: -1, Job: "job"}.Encode(1), -1)
		if f.Type != TypeHelloOK {
			t.Fatalf("observer HELLO: %s", f.Type)
		}
		f = c.roundTrip(AppendEmpty(nil, TypeLane, c.id()), -1)
		c.expectError(f, CodePermission, false, "observer may only ask STATUS, not LANE")
	})
	t.Run("WAKE with an id", func(t *testing.T) {
		c := dial(t, srv.Path())
		c.attachV2()
		f := c.roundTrip(AppendEmpty(nil, TypeWake, 7), -1)
		c.expectError(f, CodeBadFrame, true, "WAKE has id 7, want 0")
	})
	t.Run("not a CALL on the lane", func(t *testing.T) {
		c := dial(t, srv.Path())
		c.attachV2()
		l := c.openLane()
		c.put(l, AppendEmpty(nil, TypeStatus, c.id()))
		c.expectError(c.read(), CodeBadFrame, true, "lane: STATUS (id 3): only CALL may travel the lane")
	})
	t.Run("two frames at once", func(t *testing.T) {
		c := dial(t, srv.Path())
		c.attachV2()
		l := c.openLane()
		call := Call{Desc: descInt32(1, ""), Data: []byte{1, 0, 0, 0}}
		l.own++ // as if a frame went unseen before this one
		c.put(l, call.Encode(c.id()))
		c.expectError(c.read(), CodeBadFrame, true, "lane: 2 frames put since the last taken, want 1")
	})
	t.Run("length beyond the lane", func(t *testing.T) {
		c := dial(t, srv.Path())
		c.attachV2()
		l := c.openLane()
		var hdr [HeaderSize]byte
		Header{Length: LaneFrameMax, Type: TypeCall, ID: c.id()}.Put(hdr[:])
		c.put(l, hdr[:])
		c.expectError(c.read(), CodeBadFrame, true, "does not fit the lane's 4080")
	})
	t.Run("a named call on the lane", func(t *testing.T) {
		c := dial(t, srv.Path())
		c.attachAt(4)
		l := c.openLane()
		d := descInt32(1, "grad")
		d.Named = true
		call := Call{Desc: d, Data: []byte{1, 0, 0, 0}}
		c.put(l, call.Encode(c.id()))
		c.expectError(c.read(), CodeBadRequest, false, "a named call came on the lane, which carries ordered calls only")
	})
	t.Run("a second call before the first is answered", func(t *testing.T) {
		h.setHold()
		defer h.release()
		c := dial(t, srv.Path())
		c.attachV2()
		l := c.openLane()
		call := Call{Desc: descInt32(1, ""), Data: []byte{1, 0, 0, 0}}
		c.put(l, call.Encode(c.id()))
		waitFor(t, "the daemon to take the first call", l.Free)
		c.put(l, call.Encode(c.id()))
		c.expectError(c.read(), CodeBadFrame, true, "came on the lane before the lane's last call was answered")
	})

	// The daemon still serves a well-behaved client.
	c := dial(t, srv.Path())
	c.attachV2()
	l := c.openLane()
	call := Call{Desc: descInt32(1, ""), Data: []byte{1, 0, 0, 0}}
	id := c.id()
	c.put(l, call.Encode(id))
	if f := c.readAny(l, make([]byte, LaneFrameMax)); f.Type != TypeCallOK || f.ID != id {
		t.Fatalf("after the misuses: %s id %d, want CALL_OK id %d", f.Type, f.ID, id)
	}
}

// The client's side refuses what a daemon must not put on the lane, and a
// lane of the wrong size.
func TestLaneClientChecks(t *testing.T) {
	mem := make([]byte, LaneSize)
	d, cl := newLane(mem, DaemonSide), newLane(mem, ClientSide)
	buf := make([]byte, LaneFrameMax)
	d.Put(AppendEmpty(nil, TypeStatusOK, 3))
	if !cl.Rung() {
		t.Fatal("a frame put by the daemon did not ring the client")
	}
	if _, err := cl.Take(buf, 1<<20); err == nil || !bytes.Contains([]byte(err.Error()), []byte("only CALL_OK and ERROR may travel the lane")) {
		t.Fatalf("STATUS_OK taken from the lane: %v", err)
	}

	fd, err := unix.MemfdCreate("lane", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, 4096); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenLane(fd, 4096, ClientSide); err == nil || !bytes.Contains([]byte(err.Error()), []byte("lane is 4096 bytes, want 12288")) {
		t.Fatalf("OpenLane of 4096 bytes: %v", err)
	}
	if _, err := OpenLane(fd, LaneSize, ClientSide); err == nil || !bytes.Contains([]byte(err.Error()), []byte("lane memfd is 4096 bytes, LANE_OK says 12288")) {
		t.Fatalf("OpenLane of a memfd smaller than LANE_OK says: %v", err)
	}
}

// Marking parked and then looking, against putting and then looking at
// the parked word: whichever order the two sides run in, either the
// sleeper finds the frame or the putter finds the sleeper.
func TestLaneParkOrRing(t *testing.T) {
	mem := make([]byte, LaneSize)
	d, cl := newLane(mem, DaemonSide), newLane(mem, ClientSide)
	frame := (&Call{Desc: descInt32(1, ""), Data: []byte{1, 0, 0, 0}}).Encode(2)
	buf := make([]byte, LaneFrameMax)
	for i := 0; i < 2000; i++ {
		var parked, rang atomic.Bool
		done := make(chan struct{})
		go func() {
			parked.Store(d.park())
			close(done)
		}()
		rang.Store(cl.Put(frame))
		<-done
		if parked.Load() && !rang.Load() {
			t.Fatalf("round %d: the daemon sleeps and the client did not ring it", i)
		}
		d.unpark()
		if _, err := d.Take(buf, 1<<20); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
	}
}

// Whatever a peer leaves in the lane's slot, Take returns a frame that
// passed the checks or a coded *Error, on both sides, and never reads past
// the slot.
func FuzzLaneTake(f *testing.F) {
	f.Add((&Call{Desc: descInt32(1, "x"), Data: []byte{1, 2, 3, 4}}).Encode(5))
	f.Add(AppendEmpty(nil, TypeStatus, 3))
	f.Add(Header{Type: TypeCall, Length: LaneFrameMax, ID: 1}.Append(nil))
	f.Add((&Error{Code: CodeMismatch, Message: "m"}).Encode(9))
	f.Fuzz(func(t *testing.T, slot []byte) {
		for _, side := range []Side{DaemonSide, ClientSide} {
			mem := make([]byte, LaneSize)
			l := newLane(mem, side)
			at, seq := l.takeSlot()
			copy(mem[at:at+LaneFrameMax], slot)
			binary.LittleEndian.PutUint32(mem[seq:], 1)
			buf := make([]byte, LaneFrameMax)
			fr, err := l.Take(buf, 1<<20)
			if err != nil {
				var e *Error
				if !errors.As(err, &e) || !e.Code.Known() || !e.Fatal || e.Message == "" {
					t.Fatalf("side %d: error %v is not a fatal coded *Error with a message", side, err)
				}
				continue
			}
			if HeaderSize+len(fr.Payload) > LaneFrameMax || int(fr.Length) != len(fr.Payload) {
				t.Fatalf("side %d: %s of %d bytes taken from a %d-byte slot", side, fr.Type, len(fr.Payload), LaneFrameMax)
			}
			if side == DaemonSide && fr.Type != TypeCall || side == ClientSide && fr.Type != TypeCallOK && fr.Type != TypeError {
				t.Fatalf("side %d: %s taken from the lane", side, fr.Type)
			}
		}
	})
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
