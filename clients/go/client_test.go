package collectived_test

import (
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	collectived "github.com/collectived/collectived/clients/go"
	"github.com/collectived/collectived/ipc"
)

func dial(t *testing.T) *collectived.Client {
	t.Helper()
	c, err := collectived.Dial(collectived.Options{LocalRank: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A buffer over the inline limit that is not in a segment goes through a
// scratch segment and still lands in place; broadcast and barrier work.
func TestScratchBroadcastBarrier(t *testing.T) {
	c := dial(t)
	big := make([]float32, 300_000) // 1.2 MB > 64 KiB inline
	for i := range big {
		big[i] = float32(i)
	}
	for k := 0; k < 3; k++ {
		if err := collectived.AllReduce(c, big, collectived.Sum); err != nil {
			t.Fatal(err)
		}
	}
	if big[299_999] != 299_999 {
		t.Fatalf("scratch path result %v", big[299_999])
	}
	x := []float64{3, 4}
	if err := collectived.Broadcast(c, x, 0); err != nil || x[1] != 4 {
		t.Fatalf("broadcast: %v %v", x, err)
	}
	if err := c.Barrier(); err != nil {
		t.Fatal(err)
	}
	st, err := c.Status()
	if err != nil || st["job"] != "example" {
		t.Fatalf("status: %v %v", st, err)
	}
}

// Bad calls get errors that say what is wrong.
func TestCallErrors(t *testing.T) {
	c := dial(t)
	d := collectived.Desc{Op: 1, DType: collectived.Float32, Reduce: collectived.Sum, Count: 4}
	if _, err := c.Start(d, make([]byte, 12)); err == nil || !strings.Contains(err.Error(), "buffer is 12 bytes, the description needs 16") {
		t.Fatalf("short buffer: %v", err)
	}
	err := collectived.Broadcast(c, []float32{1}, 5)
	if !errors.Is(err, collectived.ErrBadRequest) || !strings.Contains(err.Error(), "root 5") {
		t.Fatalf("broadcast from a rank outside the world: %v", err)
	}
	if _, err := c.Alloc(0); err == nil {
		t.Fatal("Alloc(0) succeeded")
	}
	if _, err := c.Alloc(1 << 40); !errors.Is(err, collectived.ErrQuota) {
		t.Fatalf("Alloc(1 TiB): %v, want QUOTA", err)
	}
	c.Close()
	if err := collectived.AllReduce(c, []float32{1}, collectived.Sum); err == nil {
		t.Fatal("a call after Close succeeded")
	}
}

// Dial errors name what was wrong.
func TestDialErrors(t *testing.T) {
	_, err := collectived.Dial(collectived.Options{Job: "other", LocalRank: -1})
	if !errors.Is(err, ipc.ErrJob) || !strings.Contains(err.Error(), `"other"`) {
		t.Fatalf("other job: %v", err)
	}
	_, err = collectived.Dial(collectived.Options{Socket: "/nonexistent/x.sock", LocalRank: -1})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/x.sock") {
		t.Fatalf("missing socket: %v", err)
	}
	c := dial(t)
	_, err = collectived.Dial(collectived.Options{LocalRank: c.LocalRank()})
	if !errors.Is(err, collectived.ErrRankTaken) {
		t.Fatalf("rank taken: %v", err)
	}
}

// scriptedDaemon accepts one client, answers its HELLO in protocol
// version v, then hands the connection to serve: a daemon that misbehaves
// on cue, for the client's own checks.
func scriptedDaemon(t *testing.T, v uint16, serve func(conn *ipc.Conn, nc net.Conn)) string {
	t.Helper()
	path, l := scriptedListener(t)
	go func() {
		nc, err := l.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		conn := ipc.NewConn(nc.(*net.UnixConn), ipc.DaemonSide)
		f, err := conn.ReadFrame()
		if err != nil || f.Type != ipc.TypeHello {
			return
		}
		ok := scriptedHelloOK(v)
		conn.WriteFrame(ok.Encode(f.ID), -1)
		conn.SetMaxFrame(ok.MaxFrame)
		serve(conn, nc)
	}()
	return path
}

// scriptedListener listens on a Unix socket of its own (a short path:
// sun_path is small), closed and removed when the test ends.
func scriptedListener(t *testing.T) (string, net.Listener) {
	t.Helper()
	dir, err := os.MkdirTemp("", "cvd-scripted-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "s.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return path, l
}

// scriptedHelloOK is a scripted daemon's HELLO_OK in version v: a world of
// one, small bounds, a 1 s collective timeout.
func scriptedHelloOK(v uint16) ipc.HelloOK {
	return ipc.HelloOK{Version: v, WorldSize: 1, NodeCount: 1, LocalSize: 1, InlineLimit: 1024, MaxFrame: 4096, MaxInFlight: 8, TimeoutMS: 1000}
}

// silentDaemon answers HELLO, then reads and never answers; closing done
// makes it drop the connection.
func silentDaemon(t *testing.T, done <-chan struct{}) string {
	return scriptedDaemon(t, 1, func(_ *ipc.Conn, nc net.Conn) {
		go io.Copy(io.Discard, nc)
		<-done
	})
}

// A daemon that never answers cannot hang a call: it fails with TIMEOUT
// after Options.Timeout; a daemon that goes away fails calls in flight.
func TestNoHang(t *testing.T) {
	done := make(chan struct{})
	path := silentDaemon(t, done)
	c, err := collectived.Dial(collectived.Options{Socket: path, Job: "x", LocalRank: -1, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t0 := time.Now()
	err = collectived.AllReduce(c, []float32{1}, collectived.Sum)
	if !errors.Is(err, collectived.ErrTimeout) || !strings.Contains(err.Error(), "no reply from daemon") {
		t.Fatalf("silent daemon: %v", err)
	}
	if d := time.Since(t0); d < 250*time.Millisecond || d > 5*time.Second {
		t.Fatalf("timed out after %v, configured 300ms", d)
	}
	h, err := collectived.AllReduceAsync(c, []float32{1}, collectived.Sum)
	if err != nil {
		t.Fatal(err)
	}
	close(done)
	if err := h.Wait(); err == nil || !strings.Contains(err.Error(), "connection to "+path+" lost") {
		t.Fatalf("daemon gone: %v", err)
	}
}

// A trainer that drops its connection without a graceful Close and
// reconnects at once still gets its rank: the daemon waits a moment for
// the old connection's end instead of answering RANK_TAKEN.
func TestReconnectAtOnce(t *testing.T) {
	for i := 0; i < 20; i++ {
		nc, err := net.Dial("unix", os.Getenv("COLLECTIVED_SOCKET"))
		if err != nil {
			t.Fatal(err)
		}
		conn := ipc.NewConn(nc.(*net.UnixConn), ipc.ClientSide)
		conn.WriteFrame(ipc.Hello{Version: ipc.Version, LocalRank: 0, PID: 1, Job: "example"}.Encode(1), -1)
		if f, err := conn.ReadFrame(); err != nil || f.Type != ipc.TypeHelloOK {
			t.Fatalf("round %d: raw hello: %v %v", i, f.Type, err)
		}
		nc.Close() // abrupt: no half-close, no wait
		c, err := collectived.Dial(collectived.Options{LocalRank: 0})
		if err != nil {
			t.Fatalf("round %d: reconnect right after an abrupt close: %v", i, err)
		}
		c.Close()
	}
}

// Calls keep working long after DialTimeout has passed (the HELLO's write
// deadline used to stay on the socket and fail every later write).
func TestCallsOutliveDialTimeout(t *testing.T) {
	c, err := collectived.Dial(collectived.Options{LocalRank: -1, DialTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(400 * time.Millisecond)
	for i := 0; i < 3; i++ {
		if err := collectived.AllReduce(c, []float32{1}, collectived.Sum); err != nil {
			t.Fatalf("call %d, after DialTimeout passed: %v", i, err)
		}
	}
}

// A call allocates nothing in the steady state, whichever way its data
// travels: inline, copied through the client's scratch segment, or in a
// segment of the caller's. The daemon runs in this process, so its
// allocations count too.
func TestCallsDoNotAllocate(t *testing.T) {
	c := dial(t)
	seg, _, err := collectived.AllocSlice[float32](c, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		buf  []float32
	}{
		{"inline 1KiB", make([]float32, 256)},
		{"copied 16KiB", make([]float32, 4096)},
		{"segment 256KiB", seg},
	} {
		call := func() {
			if err := collectived.AllReduce(c, tc.buf, collectived.Sum); err != nil {
				t.Fatal(err)
			}
		}
		for k := 0; k < 50; k++ {
			call() // warm up: scratch segment, pools, read buffer
		}
		if n := testing.AllocsPerRun(200, call); n > 0.05 {
			t.Errorf("%s: %.2f allocations per call, want 0", tc.name, n)
		}
	}
}

// A fatal ERROR carries the id of the request that caused it, and ends the
// connection: that request and every other one in flight fail with the
// daemon's error, not with the end of the stream that follows it.
func TestFatalErrorWithAnIDFailsEveryCall(t *testing.T) {
	fatal := ipc.Fatalf(ipc.CodeBadFD, "CALL (id 3) arrived with 1 fd(s) and carries none")
	path := scriptedDaemon(t, 1, func(conn *ipc.Conn, _ net.Conn) {
		var ids []uint64
		for len(ids) < 2 {
			f, err := conn.ReadFrame()
			if err != nil {
				return
			}
			ids = append(ids, f.ID)
		}
		conn.WriteFinal(fatal.Encode(ids[1]))
	})
	c, err := collectived.Dial(collectived.Options{Socket: path, Job: "x", LocalRank: -1, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var hs []*collectived.Handle
	for range 2 {
		h, err := collectived.AllReduceAsync(c, []float32{1}, collectived.Sum)
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	for i, h := range hs {
		err := h.Wait()
		var e *ipc.Error
		if !errors.As(err, &e) || e.Code != ipc.CodeBadFD || !e.Fatal || e.Message != fatal.Message {
			t.Errorf("call %d: %v, want the daemon's fatal BAD_FD", i, err)
		}
	}
	if err := c.Err(); !errors.Is(err, ipc.ErrBadFD) {
		t.Errorf("Err() = %v, want the fatal BAD_FD", err)
	}
}
