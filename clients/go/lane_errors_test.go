package collectived_test

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	collectived "github.com/collectived/collectived/clients/go"
	"github.com/collectived/collectived/ipc"
)

// laneDaemon speaks version 2 and answers LANE with a memfd of laneBytes
// bytes (LANE_OK saying size); 100 ms later, when the client's first call
// waits on the lane, it sends a WAKE_CLIENT of id wakeID. It never answers
// a call: a daemon gone wrong, for the client's checks.
func laneDaemon(t *testing.T, laneBytes int64, size uint64, wakeID uint64) string {
	return scriptedDaemon(t, 2, func(conn *ipc.Conn, _ net.Conn) {
		for {
			f, err := conn.ReadFrame()
			if err != nil {
				return
			}
			if f.Type != ipc.TypeLane {
				continue
			}
			fd, err := unix.MemfdCreate("lane", unix.MFD_CLOEXEC)
			if err != nil || unix.Ftruncate(fd, laneBytes) != nil {
				return
			}
			conn.WriteFrame(ipc.LaneOK{Size: size}.Append(nil, f.ID), fd)
			unix.Close(fd)
			var hdr [ipc.HeaderSize]byte
			ipc.Header{Type: ipc.TypeWakeClient, ID: wakeID}.Put(hdr[:])
			time.Sleep(100 * time.Millisecond)
			conn.WriteFrame(hdr[:], -1)
		}
	})
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
