package collectived_test

import (
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"

	collectived "github.com/collectived/collectived/clients/go"
	"github.com/collectived/collectived/ipc"
)

// oldDaemon answers every connection's HELLO as a daemon that speaks
// protocol versions 1 to maxV would (maxV 0: none), or with refusal if
// set; it records the version each HELLO asked for. Its HELLO_OK is in the
// version asked, plus lie.
func oldDaemon(t *testing.T, maxV uint16, refusal *ipc.Error, lie uint16) (path string, asked func() []uint16) {
	t.Helper()
	path, l := scriptedListener(t)
	var mu sync.Mutex
	var versions []uint16
	go func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			conn := ipc.NewConn(nc.(*net.UnixConn), ipc.DaemonSide)
			f, err := conn.ReadFrame()
			if err != nil || f.Type != ipc.TypeHello || len(f.Payload) < 6 {
				nc.Close()
				continue
			}
			v := uint16(f.Payload[4]) | uint16(f.Payload[5])<<8
			mu.Lock()
			versions = append(versions, v)
			mu.Unlock()
			switch {
			case refusal != nil:
				conn.WriteFrame(refusal.Encode(f.ID), -1)
			case v > maxV:
				conn.WriteFrame(ipc.Fatalf(ipc.CodeVersion, "HELLO: client speaks protocol version %d, daemon speaks 1 to %d", v, maxV).Encode(f.ID), -1)
			default:
				ok := scriptedHelloOK(v + lie)
				conn.WriteFrame(ok.Encode(f.ID), -1)
				go func() { io.Copy(io.Discard, nc); nc.Close() }() // until the client's Close
				continue
			}
			nc.Close()
		}
	}()
	return path, func() []uint16 {
		mu.Lock()
		defer mu.Unlock()
		return append([]uint16(nil), versions...)
	}
}

// A daemon older than the client (version 1 only) refuses HELLO in
// version 2 with VERSION: the client asks again in version 1, on a new
// connection, and goes on without a lane.
func TestDialFallsBackToVersion1(t *testing.T) {
	path, asked := oldDaemon(t, 1, nil, 0)
	c, err := collectived.Dial(collectived.Options{Socket: path, Job: "x", LocalRank: -1})
	if err != nil {
		t.Fatalf("dial a version-1 daemon: %v", err)
	}
	defer c.Close()
	if got := asked(); len(got) != 2 || got[0] != 2 || got[1] != 1 {
		t.Fatalf("HELLO versions asked: %v, want [2 1]", got)
	}
	if c.HasLane() {
		t.Fatal("a version-1 connection has a lane")
	}

	// A daemon that speaks version 2 is asked once.
	path, asked = oldDaemon(t, 2, nil, 0)
	c2, err := collectived.Dial(collectived.Options{Socket: path, Job: "x", LocalRank: -1, NoLane: true})
	if err != nil {
		t.Fatal(err)
	}
	c2.Close()
	if got := asked(); len(got) != 1 || got[0] != 2 {
		t.Fatalf("HELLO versions asked of a version-2 daemon: %v, want [2]", got)
	}
}

// A daemon that speaks neither version fails Dial with its own VERSION
// message, naming the version last asked; another refusal (here JOB) is
// not retried.
func TestDialVersionRefusals(t *testing.T) {
	path, asked := oldDaemon(t, 0, nil, 0)
	_, err := collectived.Dial(collectived.Options{Socket: path, Job: "x", LocalRank: -1})
	if !errors.Is(err, ipc.ErrVersion) || !strings.Contains(err.Error(), "(protocol version 1)") ||
		!strings.Contains(err.Error(), "client speaks protocol version 1, daemon speaks 1 to 0") {
		t.Fatalf("a daemon refusing every version: %v", err)
	}
	if got := asked(); len(got) != 2 || got[0] != 2 || got[1] != 1 {
		t.Fatalf("HELLO versions asked: %v, want [2 1]", got)
	}

	path, asked = oldDaemon(t, 2, ipc.Fatalf(ipc.CodeJob, "HELLO: job \"x\", this daemon serves \"y\""), 0)
	_, err = collectived.Dial(collectived.Options{Socket: path, Job: "x", LocalRank: -1})
	if !errors.Is(err, ipc.ErrJob) || !strings.Contains(err.Error(), `this daemon serves "y"`) {
		t.Fatalf("a daemon refusing the job: %v", err)
	}
	if got := asked(); len(got) != 1 || got[0] != 2 {
		t.Fatalf("HELLO versions asked after JOB: %v, want [2]", got)
	}
}

// A HELLO_OK in a later version than asked is refused, and not asked
// again: only the daemon's own VERSION refusal is. After a fallback to 1,
// an answer in 2 would have the client open a lane it did not ask for.
func TestDialRefusesALaterAnswer(t *testing.T) {
	path, asked := oldDaemon(t, 2, nil, 1) // answers 3 to 2
	_, err := collectived.Dial(collectived.Options{Socket: path, Job: "x", LocalRank: -1})
	if !errors.Is(err, ipc.ErrVersion) || !strings.Contains(err.Error(), "daemon answers in protocol version 3") {
		t.Fatalf("a HELLO_OK in version 3: %v", err)
	}
	if got := asked(); len(got) != 1 {
		t.Fatalf("HELLO versions asked: %v, want only [2]", got)
	}
	path, asked = oldDaemon(t, 1, nil, 1) // refuses 2, answers 2 to 1
	_, err = collectived.Dial(collectived.Options{Socket: path, Job: "x", LocalRank: -1})
	if !errors.Is(err, ipc.ErrVersion) || !strings.Contains(err.Error(), "daemon answers in protocol version 2 to a HELLO in 1") {
		t.Fatalf("a HELLO_OK in version 2 to a HELLO in 1: %v", err)
	}
	if got := asked(); len(got) != 2 {
		t.Fatalf("HELLO versions asked: %v, want [2 1]", got)
	}
}
