package collectived_test

import (
	"errors"
	"io"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	collectived "github.com/collectived/collectived/clients/go"
	"github.com/collectived/collectived/ipc"
)

// oldDaemon answers every connection's HELLO as a daemon that speaks
// protocol versions 1 to maxV would (maxV 0: none), or with refusal if
// set; it records the version each HELLO asked for. Its HELLO_OK is
// scripted(v + lie) for a HELLO in version v.
func oldDaemon(t *testing.T, maxV uint16, refusal *ipc.Error, lie int, scripted func(uint16) ipc.HelloOK) (path string, asked func() []uint16) {
	t.Helper()
	if scripted == nil {
		scripted = scriptedHelloOK
	}
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
				ok := scripted(uint16(int(v) + lie))
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

// A daemon older than the client refuses HELLO in the newest version with VERSION:
// the client asks again one version lower, on a new connection each time,
// and speaks the version answered. (The scripted daemon answers no LANE:
// NoLane; a version-1 connection never asks for one.)
func TestDialFallsBackToOlderVersions(t *testing.T) {
	for _, c := range []struct {
		daemon uint16
		asked  []uint16
	}{
		{1, []uint16{4, 3, 2, 1}},
		{2, []uint16{4, 3, 2}},
		{3, []uint16{4, 3}},
		{4, []uint16{4}},
	} {
		path, asked := oldDaemon(t, c.daemon, nil, 0, nil)
		cl, err := collectived.Dial(collectived.Options{Socket: path, Job: "x", LocalRank: -1, NoLane: c.daemon > 1})
		if err != nil {
			t.Fatalf("dial a version-%d daemon: %v", c.daemon, err)
		}
		if got := asked(); !slices.Equal(got, c.asked) {
			t.Errorf("version-%d daemon: HELLO versions asked %v, want %v", c.daemon, got, c.asked)
		}
		if cl.Version() != int(c.daemon) || cl.HasLane() {
			t.Errorf("version-%d daemon: connection speaks %d, lane %v", c.daemon, cl.Version(), cl.HasLane())
		}
		cl.Close()
	}
}

// A daemon that speaks none of the versions fails Dial with its own
// VERSION message, naming the version last asked; another refusal (here
// JOB) is not retried.
func TestDialVersionRefusals(t *testing.T) {
	path, asked := oldDaemon(t, 0, nil, 0, nil)
	_, err := collectived.Dial(collectived.Options{Socket: path, Job: "x", LocalRank: -1})
	if !errors.Is(err, ipc.ErrVersion) || !strings.Contains(err.Error(), "(protocol version 1)") ||
		!strings.Contains(err.Error(), "client speaks protocol version 1, daemon speaks 1 to 0") {
		t.Fatalf("a daemon refusing every version: %v", err)
	}
	if got := asked(); !slices.Equal(got, []uint16{4, 3, 2, 1}) {
		t.Fatalf("HELLO versions asked: %v, want [4 3 2 1]", got)
	}

	path, asked = oldDaemon(t, 4, ipc.Fatalf(ipc.CodeJob, "HELLO: job \"x\", this daemon serves \"y\""), 0, nil)
	_, err = collectived.Dial(collectived.Options{Socket: path, Job: "x", LocalRank: -1})
	if !errors.Is(err, ipc.ErrJob) || !strings.Contains(err.Error(), `this daemon serves "y"`) {
		t.Fatalf("a daemon refusing the job: %v", err)
	}
	if got := asked(); !slices.Equal(got, []uint16{4}) {
		t.Fatalf("HELLO versions asked after JOB: %v, want [4]", got)
	}
}

// A HELLO_OK in a later version than asked is refused, and not asked
// again: only the daemon's own VERSION refusal is. After a fallback to 1,
// an answer in 2 would have the client open a lane it did not ask for.
// One in an earlier version is taken: the connection speaks that version.
func TestDialVersionOfTheAnswer(t *testing.T) {
	for _, c := range []struct {
		daemon uint16
		want   string
		asked  []uint16
	}{
		{4, "daemon answers in protocol version 5, client speaks 1 to 4", []uint16{4}},
		{3, "daemon answers in protocol version 4 to a HELLO in 3", []uint16{4, 3}},
		{2, "daemon answers in protocol version 3 to a HELLO in 2", []uint16{4, 3, 2}},
		{1, "daemon answers in protocol version 2 to a HELLO in 1", []uint16{4, 3, 2, 1}},
	} {
		path, asked := oldDaemon(t, c.daemon, nil, 1, nil)
		_, err := collectived.Dial(collectived.Options{Socket: path, Job: "x", LocalRank: -1})
		if !errors.Is(err, ipc.ErrVersion) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("version-%d daemon answering one version later: %v, want %q", c.daemon, err, c.want)
		}
		if got := asked(); !slices.Equal(got, c.asked) {
			t.Errorf("version-%d daemon answering one version later: HELLO versions asked %v, want %v", c.daemon, got, c.asked)
		}
	}
	path, asked := oldDaemon(t, 4, nil, -1, nil) // answers 3 to 4
	c, err := collectived.Dial(collectived.Options{Socket: path, Job: "x", LocalRank: -1, NoLane: true})
	if err != nil {
		t.Fatalf("a HELLO_OK in version 3 to a HELLO in 4: %v", err)
	}
	defer c.Close()
	if got := asked(); c.Version() != 3 || !slices.Equal(got, []uint16{4}) {
		t.Fatalf("answered in 3: connection speaks %d, asked %v", c.Version(), got)
	}
}

// The default wait comes from HELLO_OK: the daemon's bound on any call
// (the larger of its two timeouts) plus two margins, so the daemon's
// TIMEOUT, naming who has not called, comes first also on a generation's
// first call; from a version-2 daemon, which does not state the first
// call's timeout, twice timeout_ms plus two margins. An explicit
// Options.Timeout wins.
func TestDefaultTimeoutFromHelloOK(t *testing.T) {
	withFirst := func(v uint16) ipc.HelloOK {
		ok := scriptedHelloOK(v)
		ok.TimeoutMS, ok.FirstCallTimeoutMS = 1000, 60000
		return ok
	}
	for _, c := range []struct {
		daemon  uint16
		timeout time.Duration
		want    time.Duration
	}{
		{4, 0, 70 * time.Second},
		{3, 0, 70 * time.Second},
		{3, 3 * time.Second, 3 * time.Second},
		{2, 0, 12 * time.Second},
		{1, 0, 12 * time.Second},
	} {
		path, _ := oldDaemon(t, c.daemon, nil, 0, withFirst)
		cl, err := collectived.Dial(collectived.Options{Socket: path, Job: "x", LocalRank: -1, Timeout: c.timeout, NoLane: true})
		if err != nil {
			t.Fatalf("version-%d daemon: %v", c.daemon, err)
		}
		if cl.Timeout() != c.want {
			t.Errorf("version-%d daemon, Options.Timeout %v: Timeout() = %v, want %v", c.daemon, c.timeout, cl.Timeout(), c.want)
		}
		cl.Close()
	}

	// The real daemon of TestMain has the default settings: collective
	// 300 s, first call 10 min.
	cl, err := collectived.Dial(collectived.Options{LocalRank: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if cl.Version() != ipc.Version || cl.Timeout() != 10*time.Minute+2*ipc.TimeoutMargin {
		t.Fatalf("real daemon: version %d, Timeout() %v; want %d, %v", cl.Version(), cl.Timeout(), ipc.Version, 10*time.Minute+2*ipc.TimeoutMargin)
	}
}

// DefaultTimeout saturates rather than wrapping around on a daemon's
// huge timeouts.
func TestDefaultTimeoutSaturates(t *testing.T) {
	for _, ok := range []ipc.HelloOK{
		{Version: 3, TimeoutMS: math.MaxUint64, FirstCallTimeoutMS: 1},
		{Version: 3, TimeoutMS: 1, FirstCallTimeoutMS: math.MaxUint64},
		{Version: 2, TimeoutMS: math.MaxUint64},
		{Version: 2, TimeoutMS: uint64(math.MaxInt64/int64(time.Millisecond)) / 2},
	} {
		if got := collectived.DefaultTimeout(ok); got != math.MaxInt64 {
			t.Errorf("DefaultTimeout(%+v) = %v, want the largest Duration", ok, got)
		}
	}
}
