package ipc

import (
	"encoding/binary"
	"fmt"
	"time"
)

// Protocol constants (docs/PROTOCOL.md).
const (
	// Magic opens every HELLO payload.
	Magic = "CLVD"
	// Version is the newest protocol version this package speaks; a
	// daemon also serves clients of every version from MinVersion.
	Version = 4
	// MinVersion is the oldest protocol version a daemon still serves.
	MinVersion = 1
	// HeaderSize is the length of every frame header.
	HeaderSize = 16
	// MaxHelloFrame bounds a payload until HELLO_OK has been sent.
	MaxHelloFrame = 4096
	// MaxErrorMessage bounds an ERROR message so that an ERROR frame
	// (4 bytes + message) fits MaxHelloFrame and every max_frame.
	MaxErrorMessage = MaxHelloFrame - 4
	// MaxStringLen bounds job, label and call names (one length byte).
	MaxStringLen = 255
	// FrameOverhead is what max_frame must exceed inline_limit by: room for
	// a CALL's fixed fields and longest name, and for CALL_OK's fixed fields.
	FrameOverhead = 512
	// MaxStatusFrame bounds a STATUS_OK payload, whatever max_frame is: the
	// status document lists every local rank and peer, and at the largest
	// legal configurations (1024 local ranks with 255-byte labels, 4096
	// peers with 253-byte host names) it is megabytes, far over any
	// max_frame. Clients accept STATUS_OK up to this length, and only
	// STATUS_OK; the daemon never sends a longer one (docs/PROTOCOL.md,
	// STATUS).
	MaxStatusFrame = 8 << 20
	// NoRank is the world and local rank of an observer.
	NoRank = 0xffffffff
)

// TimeoutMargin is the slack on a daemon's bound for a collective
// (docs/PROTOCOL.md, "Timeouts"): its TIMEOUT reaches a waiting trainer
// within the bound plus this. Clients wait two margins past the bound by
// default, so that the daemon's error, which names who has not called,
// always comes before their own. Every client uses the same number.
const TimeoutMargin = 5 * time.Second

// Type is a frame type. Requests are 0x01-0x7f; a successful reply is the
// request's type with the high bit set; ERROR is 0xff.
type Type uint8

const (
	TypeHello      Type = 0x01
	TypeAlloc      Type = 0x02
	TypeFree       Type = 0x03
	TypeRegister   Type = 0x04
	TypeCall       Type = 0x05
	TypeStatus     Type = 0x06
	TypeLane       Type = 0x10 // version 2
	TypeWake       Type = 0x11 // version 2: the client rings a parked daemon
	TypeHelloOK    Type = 0x81
	TypeAllocOK    Type = 0x82
	TypeFreeOK     Type = 0x83
	TypeRegisterOK Type = 0x84
	TypeCallOK     Type = 0x85
	TypeStatusOK   Type = 0x86
	TypeLaneOK     Type = 0x90 // version 2
	TypeWakeClient Type = 0x91 // version 2: the daemon rings a parked client
	TypeError      Type = 0xff
)

func (t Type) String() string {
	switch t {
	case TypeHello:
		return "HELLO"
	case TypeAlloc:
		return "ALLOC"
	case TypeFree:
		return "FREE"
	case TypeRegister:
		return "REGISTER"
	case TypeCall:
		return "CALL"
	case TypeStatus:
		return "STATUS"
	case TypeLane:
		return "LANE"
	case TypeWake:
		return "WAKE"
	case TypeHelloOK:
		return "HELLO_OK"
	case TypeAllocOK:
		return "ALLOC_OK"
	case TypeFreeOK:
		return "FREE_OK"
	case TypeRegisterOK:
		return "REGISTER_OK"
	case TypeCallOK:
		return "CALL_OK"
	case TypeStatusOK:
		return "STATUS_OK"
	case TypeLaneOK:
		return "LANE_OK"
	case TypeWakeClient:
		return "WAKE_CLIENT"
	case TypeError:
		return "ERROR"
	}
	return fmt.Sprintf("type(0x%02x)", uint8(t))
}

// Known reports whether t is a frame type of the protocol (of any version
// up to Version; Session refuses those newer than the connection's).
func (t Type) Known() bool {
	switch t {
	case TypeHello, TypeAlloc, TypeFree, TypeRegister, TypeCall, TypeStatus, TypeLane, TypeWake,
		TypeHelloOK, TypeAllocOK, TypeFreeOK, TypeRegisterOK, TypeCallOK, TypeStatusOK, TypeLaneOK,
		TypeWakeClient, TypeError:
		return true
	}
	return false
}

// Since is the protocol version that introduced t.
func (t Type) Since() uint16 {
	switch t {
	case TypeLane, TypeWake, TypeLaneOK, TypeWakeClient:
		return 2
	}
	return 1
}

// IsRequest reports whether t travels from client to daemon.
func (t Type) IsRequest() bool { return t.Known() && t < 0x80 }

// Reply is the type of a successful reply to request type t.
func (t Type) Reply() Type { return t | 0x80 }

// CarriesFD reports whether a frame of type t comes with exactly one fd.
func (t Type) CarriesFD() bool {
	return t == TypeAllocOK || t == TypeRegister || t == TypeLaneOK
}

// FlagFatal is header flag bit 0 of an ERROR frame: the daemon closes the
// connection after it. No other type defines header flags.
const FlagFatal uint8 = 1

// Header is the 16-byte frame header.
type Header struct {
	Length uint32 // payload bytes after the header
	Type   Type
	Flags  uint8
	ID     uint64
}

// Put writes h into b[:HeaderSize].
func (h Header) Put(b []byte) {
	_ = b[HeaderSize-1]
	binary.LittleEndian.PutUint32(b[0:], h.Length)
	b[4] = byte(h.Type)
	b[5] = h.Flags
	b[6], b[7] = 0, 0
	binary.LittleEndian.PutUint64(b[8:], h.ID)
}

// Append appends h to b.
func (h Header) Append(b []byte) []byte {
	var a [HeaderSize]byte
	h.Put(a[:])
	return append(b, a[:]...)
}

// DecodeHeader parses a header and checks everything it can on its own:
// the length against max (before anyone allocates or reads the payload),
// the type, the reserved field and the flags. Errors are fatal BAD_FRAME
// *Errors naming the field.
func DecodeHeader(b []byte, max uint32) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, Fatalf(CodeBadFrame, "frame header is %d bytes, want %d", len(b), HeaderSize)
	}
	h := Header{
		Length: binary.LittleEndian.Uint32(b[0:]),
		Type:   Type(b[4]),
		Flags:  b[5],
		ID:     binary.LittleEndian.Uint64(b[8:]),
	}
	if !h.Type.Known() {
		return h, Fatalf(CodeBadFrame, "unknown frame type 0x%02x (id %d)", uint8(h.Type), h.ID)
	}
	if r := binary.LittleEndian.Uint16(b[6:]); r != 0 {
		return h, Fatalf(CodeBadFrame, "%s (id %d): reserved header field is 0x%04x, must be 0", h.Type, h.ID, r)
	}
	if h.Length > max {
		return h, Fatalf(CodeBadFrame, "%s (id %d): length %d exceeds the limit of %d bytes", h.Type, h.ID, h.Length, max)
	}
	allowed := uint8(0)
	if h.Type == TypeError {
		allowed = FlagFatal
	}
	if h.Flags&^allowed != 0 {
		return h, Fatalf(CodeBadFrame, "%s (id %d): header flags 0x%02x not defined for this type", h.Type, h.ID, h.Flags)
	}
	return h, nil
}

// beginFrame appends a header with a zero length; endFrame fills the length
// once the payload has been appended after it.
func beginFrame(b []byte, t Type, flags uint8, id uint64) ([]byte, int) {
	start := len(b)
	return Header{Type: t, Flags: flags, ID: id}.Append(b), start
}

func endFrame(b []byte, start int) []byte {
	binary.LittleEndian.PutUint32(b[start:], uint32(len(b)-start-HeaderSize))
	return b
}
