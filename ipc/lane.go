package ipc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The lane (protocol version 2): a small call and its answer meet in a
// page of shared memory instead of crossing the socket. Each side polls a
// counter there between its polls of the socket, and a side that stops
// polling says so (its parked word) before it sleeps on the socket, so
// that the other rings it with a WAKE frame. On a machine with few CPUs a
// socket hop costs a poller two system calls per turn and a wake-up; the
// lane costs a load (docs/TUNING.md, section 20).
//
// Layout (LaneSize bytes, a sealed memfd made by the daemon):
//
//	0     u32 c2d_seq    frames the client has put in the c2d slot
//	64    u32 c2d_taken  frames the daemon has taken from it
//	128   u32 d2c_seq    frames the daemon has put in the d2c slot
//	192   u32 d_parked   1 while the daemon's reader sleeps on the socket
//	256   u32 c_parked   1 while the client's reader sleeps on the socket
//	4096  c2d slot       one frame, header and payload, at most LaneFrameMax bytes
//	8192  d2c slot       the same, daemon to client
//
// A side puts a frame in its slot and then increments its seq (a release);
// the other copies the frame out when it sees the seq move. Putting and
// then reading the other's parked word, against marking parked and then
// reading the seq, means one of the two always sees the other: either the
// poller finds the frame, or the putter finds it parked and rings.
const (
	LaneSize     = 3 * 4096
	LaneFrameMax = 4096

	laneC2DSeq   = 0
	laneC2DTaken = 64
	laneD2CSeq   = 128
	laneDParked  = 192
	laneCParked  = 256
	laneC2D      = 4096
	laneD2C      = 8192
)

// ErrRung is returned by a read that found a frame waiting on the
// connection's lane: take it with Lane.Take, then read on.
var ErrRung = errors.New("ipc: a frame waits on the lane")

// Lane is one side's view of a connection's lane.
type Lane struct {
	mem  []byte
	side Side
	// seen is the other side's seq as of the last frame taken.
	seen uint32
	// own is the number of frames this side has put.
	own uint32
}

// OpenLane maps a lane memfd of size bytes for side. The caller keeps fd.
func OpenLane(fd int, size uint64, side Side) (*Lane, error) {
	if size != LaneSize {
		return nil, fmt.Errorf("ipc: lane is %d bytes, want %d", size, LaneSize)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("ipc: lane fd %d: %w", fd, err)
	}
	if st.Size != LaneSize {
		return nil, fmt.Errorf("ipc: lane memfd is %d bytes, LANE_OK says %d", st.Size, size)
	}
	mem, err := unix.Mmap(fd, 0, LaneSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("ipc: mmap lane: %w", err)
	}
	return newLane(mem, side), nil
}

// newLane is a lane over mem, which the caller mapped (or, in tests, made).
func newLane(mem []byte, side Side) *Lane {
	return &Lane{mem: mem, side: side}
}

// Close unmaps the lane. The other side may still hold its mapping.
func (l *Lane) Close() error {
	if l == nil || l.mem == nil {
		return nil
	}
	err := unix.Munmap(l.mem)
	l.mem = nil
	return err
}

func (l *Lane) word(off int) *uint32 { return (*uint32)(unsafe.Pointer(&l.mem[off])) }

// slots: where this side puts and where it takes, and the seq words.
func (l *Lane) putSlot() (slot, seq int) {
	if l.side == ClientSide {
		return laneC2D, laneC2DSeq
	}
	return laneD2C, laneD2CSeq
}

func (l *Lane) takeSlot() (slot, seq int) {
	if l.side == ClientSide {
		return laneD2C, laneD2CSeq
	}
	return laneC2D, laneC2DSeq
}

func (l *Lane) parkedWord(self bool) int {
	if (l.side == DaemonSide) == self {
		return laneDParked
	}
	return laneCParked
}

// Rung reports whether the other side has put a frame not yet taken.
func (l *Lane) Rung() bool {
	_, seq := l.takeSlot()
	return atomic.LoadUint32(l.word(seq)) != l.seen
}

// Free reports, on the client, whether the daemon has taken every frame
// the client put: only then may a frame follow on the socket, or another
// go in the slot.
func (l *Lane) Free() bool {
	return atomic.LoadUint32(l.word(laneC2DTaken)) == l.own
}

// Put copies frame into this side's slot and publishes it. It reports
// whether the other side was asleep on the socket and must be rung (a
// WAKE frame). frame must fit: at most LaneFrameMax bytes.
func (l *Lane) Put(frame []byte) (ring bool) {
	slot, seq := l.putSlot()
	copy(l.mem[slot:slot+LaneFrameMax], frame)
	l.own++
	atomic.StoreUint32(l.word(seq), l.own)
	return atomic.LoadUint32(l.word(l.parkedWord(false))) != 0
}

// Take copies the waiting frame into buf (at least LaneFrameMax bytes)
// and checks it as Conn would: its header against max, its type against
// the side (on the daemon only CALL travels the lane; on the client only
// CALL_OK and ERROR). The frame's Payload aliases buf.
func (l *Lane) Take(buf []byte, max uint32) (Frame, error) {
	slot, seq := l.takeSlot()
	n := atomic.LoadUint32(l.word(seq))
	if n != l.seen+1 {
		return Frame{}, Fatalf(CodeBadFrame, "lane: %d frames put since the last taken, want 1", n-l.seen)
	}
	l.seen = n
	copy(buf[:LaneFrameMax], l.mem[slot:slot+LaneFrameMax])
	if l.side == DaemonSide {
		atomic.StoreUint32(l.word(laneC2DTaken), n)
	}
	h, err := DecodeHeader(buf[:HeaderSize], max)
	if err != nil {
		return Frame{}, err
	}
	if int(h.Length) > LaneFrameMax-HeaderSize {
		return Frame{}, &frameFault{h.ID, Fatalf(CodeBadFrame, "lane: %s (id %d) of %d bytes does not fit the lane's %d", h.Type, h.ID, h.Length, LaneFrameMax-HeaderSize)}
	}
	switch {
	case l.side == DaemonSide && h.Type != TypeCall:
		return Frame{}, &frameFault{h.ID, Fatalf(CodeBadFrame, "lane: %s (id %d): only CALL may travel the lane", h.Type, h.ID)}
	case l.side == ClientSide && h.Type != TypeCallOK && h.Type != TypeError:
		return Frame{}, &frameFault{h.ID, Fatalf(CodeBadFrame, "lane: %s (id %d): only CALL_OK and ERROR may travel the lane", h.Type, h.ID)}
	}
	end := HeaderSize + int(h.Length)
	return Frame{Header: h, Payload: buf[HeaderSize:end:end], FD: -1}, nil
}

// park marks this side asleep on the socket; false means a frame came
// meanwhile and the reader must not sleep.
func (l *Lane) park() bool {
	atomic.StoreUint32(l.word(l.parkedWord(true)), 1)
	if l.Rung() {
		atomic.StoreUint32(l.word(l.parkedWord(true)), 0)
		return false
	}
	return true
}

func (l *Lane) unpark() { atomic.StoreUint32(l.word(l.parkedWord(true)), 0) }

// LaneOK is the payload of LANE_OK: the lane's size (its memfd comes with
// the frame).
type LaneOK struct{ Size uint64 }

func (m LaneOK) Append(b []byte, id uint64) []byte {
	b, start := beginFrame(b, TypeLaneOK, 0, id)
	return endFrame(binary.LittleEndian.AppendUint64(b, m.Size), start)
}

// DecodeLaneOK parses a LANE_OK payload.
func DecodeLaneOK(p []byte) (LaneOK, error) {
	if len(p) != 8 {
		return LaneOK{}, Fatalf(CodeBadFrame, "LANE_OK: payload is %d bytes, want 8", len(p))
	}
	return LaneOK{Size: binary.LittleEndian.Uint64(p)}, nil
}

// WakeFrame is the WAKE frame a client sends to ring its daemon;
// WakeClientFrame the daemon's to its client. Both are empty with id 0.
var (
	WakeFrame       = AppendEmpty(nil, TypeWake, 0)
	WakeClientFrame = AppendEmpty(nil, TypeWakeClient, 0)
)
