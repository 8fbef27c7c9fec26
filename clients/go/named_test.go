package collectived_test

import (
	"encoding/binary"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	collectived "github.com/collectived/collectived/clients/go"
	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/ipc"
)

// arrived is a CALL as the scripted daemon of namedDaemon read it, and
// which way it came.
type arrived struct {
	id      uint64
	desc    collective.Desc
	viaLane bool
}

// namedDaemon speaks version 4, hands out a lane and reads calls from it
// and from the socket, reporting each on calls. It answers a call (a
// CALL_OK on the socket, an inline call's data as its result) only when
// its id is sent on answer.
func namedDaemon(t *testing.T) (path string, calls <-chan arrived, answer chan<- uint64) {
	t.Helper()
	callc, answerc := make(chan arrived, 16), make(chan uint64, 16)
	path = scriptedDaemon(t, 4, func(conn *ipc.Conn, _ net.Conn) {
		frames := make(chan ipc.Frame)
		go func() {
			defer close(frames)
			for {
				f, err := conn.ReadFrame()
				if err != nil {
					return
				}
				if f.Type == ipc.TypeCall {
					f.Payload = append([]byte(nil), f.Payload...) // the next read reuses it
				}
				frames <- f
			}
		}()
		var lane *ipc.Lane
		defer func() {
			if lane != nil {
				lane.Close()
			}
		}()
		buf := make([]byte, ipc.LaneFrameMax)
		results := map[uint64][]byte{}
		report := func(f ipc.Frame, viaLane bool) {
			var m ipc.Call
			if err := ipc.DecodeCall(f.Payload, &m, nil); err != nil {
				t.Errorf("scripted daemon: CALL id %d: %v", f.ID, err)
				return
			}
			results[f.ID] = append([]byte(nil), m.Data...)
			callc <- arrived{f.ID, m.Desc, viaLane}
		}
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case f, ok := <-frames:
				if !ok {
					return
				}
				switch f.Type {
				case ipc.TypeLane:
					fd, err := unix.MemfdCreate("lane", unix.MFD_CLOEXEC)
					if err != nil || unix.Ftruncate(fd, ipc.LaneSize) != nil {
						t.Errorf("scripted daemon: lane memfd: %v", err)
						return
					}
					if lane, err = ipc.OpenLane(fd, ipc.LaneSize, ipc.DaemonSide); err != nil {
						t.Errorf("scripted daemon: %v", err)
						return
					}
					conn.WriteFrame(ipc.LaneOK{Size: ipc.LaneSize}.Append(nil, f.ID), fd)
					unix.Close(fd)
				case ipc.TypeCall:
					report(f, false)
				}
			case <-tick.C:
				if lane != nil && lane.Rung() {
					f, err := lane.Take(buf, ipc.LaneFrameMax)
					if err != nil {
						t.Errorf("scripted daemon: lane: %v", err)
						return
					}
					report(f, true)
				}
			case id := <-answerc:
				conn.WriteFrame((&ipc.CallOK{Result: results[id]}).Encode(id), -1)
				delete(results, id)
			}
		}
	})
	return path, callc, answerc
}

// next is the next call the scripted daemon read.
func next(t *testing.T, calls <-chan arrived) arrived {
	t.Helper()
	select {
	case a := <-calls:
		return a
	case <-time.After(5 * time.Second):
		t.Fatal("the scripted daemon read no call in 5 s")
	}
	return arrived{}
}

// Named calls never take the lane, even small and with nothing else in
// flight, where an ordinary call does; and a name may be in flight only
// once: the client refuses a second call of a name whose first has not
// been answered, naming it, without sending anything, and takes it again
// once the answer came. Other names, and ordinary calls, go meanwhile.
func TestNamedCallsSkipTheLaneAndAreRefusedTwiceInFlight(t *testing.T) {
	path, calls, answer := namedDaemon(t)
	c, err := collectived.Dial(collectived.Options{Socket: path, Job: "x", LocalRank: -1, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Version() != 4 || !c.HasLane() {
		t.Fatalf("connection speaks %d, lane %v; want 4 with a lane", c.Version(), c.HasLane())
	}
	one := func() []byte { return binary.LittleEndian.AppendUint32(nil, 1) }
	desc := func(name string, named bool) collective.Desc {
		return collective.Desc{Op: collective.OpAllReduce, DType: collective.Int32, Reduce: collective.Sum, Count: 1, Name: name, Named: named}
	}

	// The control: an ordinary call with nothing in flight takes the lane.
	h, err := c.Start(desc("", false), one())
	if err != nil {
		t.Fatal(err)
	}
	if a := next(t, calls); !a.viaLane || a.desc.Named {
		t.Fatalf("an ordinary call came %+v, want it on the lane", a)
	} else {
		answer <- a.id
	}
	if err := h.Wait(); err != nil {
		t.Fatal(err)
	}

	ha, err := c.Start(desc("layer1", true), one())
	if err != nil {
		t.Fatal(err)
	}
	a := next(t, calls)
	if a.viaLane || !a.desc.Named || a.desc.Name != "layer1" {
		t.Fatalf("the named call came %+v (via lane %v), want named %q on the socket", a.desc, a.viaLane, "layer1")
	}
	_, err = c.Start(desc("layer1", true), one())
	if !errors.Is(err, ipc.ErrBadRequest) || !strings.Contains(err.Error(), `named call "layer1"`) || !strings.Contains(err.Error(), "still in flight") {
		t.Fatalf("a second call of a name in flight: %v, want BAD_REQUEST naming it", err)
	}
	// Through StartInto too.
	_, err = c.StartInto(collective.Desc{Op: collective.OpAllGather, DType: collective.Int32, Count: 1, Name: "layer1", Named: true}, one(), make([]byte, 4))
	if !errors.Is(err, ipc.ErrBadRequest) || !strings.Contains(err.Error(), `"layer1"`) {
		t.Fatalf("a second call of a name in flight, allgather: %v", err)
	}
	hb, err := c.Start(desc("layer2", true), one())
	if err != nil {
		t.Fatalf("another name: %v", err)
	}
	b := next(t, calls)
	if b.viaLane || b.desc.Name != "layer2" {
		t.Fatalf("the second name came %+v (via lane %v)", b.desc, b.viaLane)
	}
	ho, err := c.Start(desc("layer1", false), one()) // an ordinary call of the same name
	if err != nil {
		t.Fatalf("an ordinary call named like a named call in flight: %v", err)
	}
	o := next(t, calls)
	if o.desc.Named || o.desc.Name != "layer1" {
		t.Fatalf("the ordinary call came %+v", o)
	}
	if _, err := c.Start(desc("", true), one()); !errors.Is(err, ipc.ErrBadRequest) || !strings.Contains(err.Error(), "a named call needs a name") {
		t.Fatalf("a named call without a name: %v", err)
	}

	// Once layer1 is answered its name is free again.
	answer <- a.id
	if err := ha.Wait(); err != nil {
		t.Fatal(err)
	}
	ha2, err := c.Start(desc("layer1", true), one())
	if err != nil {
		t.Fatalf("layer1 again after its answer: %v", err)
	}
	a2 := next(t, calls)
	if a2.desc.Name != "layer1" || !a2.desc.Named || a2.viaLane {
		t.Fatalf("layer1 again came %+v", a2)
	}
	for i, h := range []*collectived.Handle{hb, ho, ha2} {
		answer <- []uint64{b.id, o.id, a2.id}[i]
		if err := h.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case a := <-calls:
		t.Fatalf("the refused calls reached the daemon: %+v", a)
	default:
	}
}

// A named call whose wait timed out keeps its name until the daemon
// answers it: the daemon still has it in flight, and would refuse another.
func TestNamedCallKeepsItsNameAfterATimeout(t *testing.T) {
	path, calls, answer := namedDaemon(t)
	c, err := collectived.Dial(collectived.Options{Socket: path, Job: "x", LocalRank: -1, Timeout: 200 * time.Millisecond, NoLane: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	d := collective.Desc{Op: collective.OpBarrier, Name: "epoch", Named: true}
	h, err := c.Start(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	late := next(t, calls)
	if err := h.Wait(); !errors.Is(err, ipc.ErrTimeout) {
		t.Fatalf("an unanswered call: %v, want the client's timeout", err)
	}
	if _, err := c.Start(d, nil); !errors.Is(err, ipc.ErrBadRequest) || !strings.Contains(err.Error(), `"epoch"`) {
		t.Fatalf("the name of a timed-out call before its answer: %v", err)
	}
	// The late answer, then an ordinary call's, which its Wait reads
	// after the late one.
	answer <- late.id
	ho, err := c.Start(collective.Desc{Op: collective.OpBarrier}, nil)
	if err != nil {
		t.Fatal(err)
	}
	answer <- next(t, calls).id
	if err := ho.Wait(); err != nil {
		t.Fatal(err)
	}
	h2, err := c.Start(d, nil)
	if err != nil {
		t.Fatalf("the name after the late answer came: %v", err)
	}
	answer <- next(t, calls).id
	if err := h2.Wait(); err != nil {
		t.Fatal(err)
	}
}

// Against a version-3 daemon a named call fails before it is sent.
func TestNamedCallsNeedVersion4(t *testing.T) {
	path, _ := oldDaemon(t, 3, nil, 0, nil)
	c, err := collectived.Dial(collectived.Options{Socket: path, Job: "x", LocalRank: -1, NoLane: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	err = c.Do(collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 1, Name: "w", Named: true}, make([]byte, 4))
	if !errors.Is(err, ipc.ErrUnsupported) || !strings.Contains(err.Error(), "needs protocol version 4") || !strings.Contains(err.Error(), "speaks 3") {
		t.Fatalf("a named call to a version-3 daemon: %v, want UNSUPPORTED naming versions 4 and 3", err)
	}
}

// Named calls of several names in flight at once, against the real
// daemon of TestMain (a world of one): each gets its own result.
func TestNamedCallsWithTheDaemon(t *testing.T) {
	c := dial(t)
	if c.Version() != ipc.Version {
		t.Fatalf("the daemon speaks %d", c.Version())
	}
	var hs []*collectived.Handle
	var bufs [][]byte
	for i, name := range []string{"a", "b", "c", "d"} {
		buf := binary.LittleEndian.AppendUint32(nil, uint32(10*i+1))
		h, err := c.Start(collective.Desc{Op: collective.OpAllReduce, DType: collective.Int32, Reduce: collective.Sum, Count: 1, Name: name, Named: true}, buf)
		if err != nil {
			t.Fatal(err)
		}
		hs, bufs = append(hs, h), append(bufs, buf)
	}
	for i := len(hs) - 1; i >= 0; i-- {
		if err := hs[i].Wait(); err != nil {
			t.Fatalf("named call %d: %v", i, err)
		}
		if got := binary.LittleEndian.Uint32(bufs[i]); got != uint32(10*i+1) {
			t.Fatalf("named call %d: %d, want %d", i, got, 10*i+1)
		}
	}
	if err := c.Barrier(); err != nil {
		t.Fatalf("an ordinary call after named ones: %v", err)
	}
}
