package ipc

import (
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/collectived/collectived/internal/parked"
)

// A session's reader parked in the netpoller, while this process's one P
// is held by a poller yielding it with Gosched (which keeps the scheduler
// from looking at the netpoller; docs/TUNING.md, sections 11 and 26), is
// woken by the poller's parked.Poll once the client's frame has come,
// through Rearm, and reads it; a reader that does not poll is never put
// on the set (Rearm could not wake it).
func TestPollerWakesParkedSession(t *testing.T) {
	a, b, onPark := rearmPair(t, 20*time.Microsecond)
	got := make(chan error, 1)
	read := func(id uint64) {
		f, err := a.ReadFrame()
		if err == nil && f.ID != id {
			err = errors.New("read the wrong frame")
		}
		got <- err
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	woken := parked.Woken()
	for id := uint64(1); id <= 20; id++ {
		go read(id)
		waitParked(t, onPark, "before the frame was sent")
		for end := time.Now().Add(10 * time.Second); !a.park.Asleep(); runtime.Gosched() {
			if time.Now().After(end) {
				t.Fatal("the parked reader is not on the set of parked readers")
			}
		}
		if err := b.WriteFrame(AppendEmpty(nil, TypeStatus, id), -1); err != nil {
			t.Fatal(err)
		}
		var err error
	wait:
		for end := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
			parked.Poll(time.Now().UnixNano())
			select {
			case err = <-got:
				break wait
			default:
			}
			if time.Now().After(end) {
				t.Fatalf("frame %d not read within 10s", id)
			}
		}
		if err != nil {
			t.Fatalf("frame %d: %v", id, err)
		}
	}
	if parked.Woken() == woken {
		t.Fatal("no frame was read after a poller woke the reader: the netpoller woke it every time, so the test did not exercise the wake")
	}

	a.SetSpin(0)
	go read(21)
	time.Sleep(20 * time.Millisecond) // long enough to have parked
	if a.park.Asleep() {
		t.Fatal("a reader that does not poll went on the set")
	}
	if err := b.WriteFrame(AppendEmpty(nil, TypeStatus, 21), -1); err != nil {
		t.Fatal(err)
	}
	if err := readEnded(t, got, "frame 21"); err != nil {
		t.Fatal(err)
	}
}
