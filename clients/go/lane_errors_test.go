package collectived_test

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	collectived "github.com/collectived/collectived/clients/go"
	"github.com/collectived/collectived/ipc"
)

// laneDaemon accepts one client, answers HELLO in version 2 and LANE with
// a memfd of laneBytes bytes (LANE_OK saying size), then answers the first
// CALL with a WAKE_CLIENT of id wakeID; it is a daemon gone wrong, for the
// client's checks.
func laneDaemon(t *testing.T, laneBytes int64, size uint64, wakeID uint64) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "cvd-lane-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "l.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		nc, err := l.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		conn := ipc.NewConn(nc.(*net.UnixConn), ipc.DaemonSide)
		for {
			f, err := conn.ReadFrame()
			if err != nil {
				return
			}
			switch f.Type {
			case ipc.TypeHello:
				ok := ipc.HelloOK{Version: 2, WorldSize: 1, NodeCount: 1, LocalSize: 1, InlineLimit: 1024, MaxFrame: 4096, MaxInFlight: 8, TimeoutMS: 1000}
				conn.WriteFrame(ok.Encode(f.ID), -1)
				conn.SetMaxFrame(4096)
			case ipc.TypeLane:
				fd, err := unix.MemfdCreate("lane", unix.MFD_CLOEXEC)
				if err != nil || unix.Ftruncate(fd, laneBytes) != nil {
					return
				}
				conn.WriteFrame(ipc.LaneOK{Size: size}.Append(nil, f.ID), fd)
				unix.Close(fd)
				// The client's calls now come on the lane: answer the first
				// with a ring that is not one.
				var hdr [ipc.HeaderSize]byte
				ipc.Header{Type: ipc.TypeWakeClient, ID: wakeID}.Put(hdr[:])
				time.Sleep(100 * time.Millisecond)
				conn.WriteFrame(hdr[:], -1)
			}
		}
	}()
	return path
}

// A lane of the wrong size, or a memfd smaller than LANE_OK says, fails
// Dial naming it.
func TestDialRefusesABadLane(t *testing.T) {
	for _, tc := range []struct {
		bytes int64
		size  uint64
		want  string
	}{
		{4096, 4096, "lane is 4096 bytes, want 12288"},
		{4096, ipc.LaneSize, "lane memfd is 4096 bytes, LANE_OK says 12288"},
	} {
		path := laneDaemon(t, tc.bytes, tc.size, 0)
		_, err := collectived.Dial(collectived.Options{Socket: path, Job: "x", LocalRank: -1})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("lane memfd of %d bytes, LANE_OK size %d: %v, want an error saying %q", tc.bytes, tc.size, err, tc.want)
		}
	}
}

// A WAKE_CLIENT with an id is a protocol fault: the call in flight fails
// with BAD_FRAME naming it, and the connection with it.
func TestWakeClientWithAnID(t *testing.T) {
	path := laneDaemon(t, ipc.LaneSize, ipc.LaneSize, 7)
	c, err := collectived.Dial(collectived.Options{Socket: path, Job: "x", LocalRank: -1, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	err = collectived.AllReduce(c, []float32{1}, collectived.Sum)
	if !errors.Is(err, ipc.ErrBadFrame) || !strings.Contains(err.Error(), "WAKE_CLIENT with id 7") {
		t.Fatalf("call answered by a WAKE_CLIENT of id 7: %v", err)
	}
}
