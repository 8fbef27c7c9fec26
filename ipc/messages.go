package ipc

import (
	"encoding/binary"
	"math"
	"time"

	"github.com/collectived/collectived/collective"
)

// Each message type has Append(b, id), which appends a complete frame
// (header and payload) to b and allocates only if b lacks capacity, and
// Encode(id), which returns a new frame. The Decode functions take a
// payload whose header has passed DecodeHeader.

// HelloFlagObserver is HELLO flag bit 0: the connection takes no rank and
// may only ask STATUS.
const HelloFlagObserver uint16 = 1

// Hello opens a connection (client to daemon).
type Hello struct {
	Version   uint16
	Observer  bool
	LocalRank int32 // -1: the lowest free one
	PID       uint32
	Job       string
	Label     string
}

// Hello payload: magic(4) version(2) flags(2) local_rank(4) pid(4) jlen(1) job llen(1) label.
const helloFixed = 4 + 2 + 2 + 4 + 4 + 1 + 1

// Append appends a HELLO frame. Job and Label longer than MaxStringLen are
// cut; a client should check them first (DecodeHello never sees more).
func (m Hello) Append(b []byte, id uint64) []byte {
	b, start := beginFrame(b, TypeHello, 0, id)
	b = append(b, Magic...)
	b = binary.LittleEndian.AppendUint16(b, m.Version)
	var flags uint16
	if m.Observer {
		flags |= HelloFlagObserver
	}
	b = binary.LittleEndian.AppendUint16(b, flags)
	b = binary.LittleEndian.AppendUint32(b, uint32(m.LocalRank))
	b = binary.LittleEndian.AppendUint32(b, m.PID)
	b = appendString8(b, m.Job)
	b = appendString8(b, m.Label)
	return endFrame(b, start)
}

func (m Hello) Encode(id uint64) []byte { return m.Append(nil, id) }

func appendString8(b []byte, s string) []byte {
	if len(s) > MaxStringLen {
		s = s[:MaxStringLen]
	}
	return append(append(b, byte(len(s))), s...)
}

// DecodeHello parses a HELLO payload. A wrong magic is BAD_FRAME; another
// version is VERSION (checked before the rest, whose layout may differ in
// that version); a job or label that is not UTF-8 is BAD_REQUEST; a local
// rank below -1 is RANK_RANGE. All are fatal.
func DecodeHello(p []byte) (Hello, error) {
	var m Hello
	if len(p) < 4 || string(p[:4]) != Magic {
		return m, Fatalf(CodeBadFrame, "HELLO: magic is %q, want %q", p[:min(len(p), 4)], Magic)
	}
	if len(p) < 6 {
		return m, Fatalf(CodeBadFrame, "HELLO: payload is %d bytes, too short for the version", len(p))
	}
	m.Version = binary.LittleEndian.Uint16(p[4:])
	if m.Version < MinVersion || m.Version > Version {
		return m, Fatalf(CodeVersion, "HELLO: client speaks protocol version %d, daemon speaks %d to %d", m.Version, MinVersion, Version)
	}
	if len(p) < helloFixed {
		return m, Fatalf(CodeBadFrame, "HELLO: payload is %d bytes, at least %d needed", len(p), helloFixed)
	}
	flags := binary.LittleEndian.Uint16(p[6:])
	if flags&^HelloFlagObserver != 0 {
		return m, Fatalf(CodeBadFrame, "HELLO: flags 0x%04x has undefined bits", flags)
	}
	m.Observer = flags&HelloFlagObserver != 0
	m.LocalRank = int32(binary.LittleEndian.Uint32(p[8:]))
	m.PID = binary.LittleEndian.Uint32(p[12:])
	rest := p[16:]
	job, rest, ok := cutString8(rest)
	if !ok {
		return m, Fatalf(CodeBadFrame, "HELLO: job length %d runs past the %d-byte payload", p[16], len(p))
	}
	label, rest, ok := cutString8(rest)
	if !ok {
		return m, Fatalf(CodeBadFrame, "HELLO: label length runs past the %d-byte payload", len(p))
	}
	if len(rest) != 0 {
		return m, Fatalf(CodeBadFrame, "HELLO: %d bytes after the label", len(rest))
	}
	// Well formed but invalid, as a CALL's name that is not UTF-8:
	// BAD_REQUEST, fatal only because HELLO refused ends the connection.
	if !validUTF8(job) {
		return m, Fatalf(CodeBadRequest, "HELLO: job name %q is not UTF-8", job)
	}
	if !validUTF8(label) {
		return m, Fatalf(CodeBadRequest, "HELLO: label %q is not UTF-8", label)
	}
	if !m.Observer && m.LocalRank < -1 {
		return m, Fatalf(CodeRankRange, "HELLO: local rank %d is negative (use -1 for any free rank)", m.LocalRank)
	}
	m.Job, m.Label = string(job), string(label)
	return m, nil
}

func cutString8(p []byte) (s, rest []byte, ok bool) {
	if len(p) < 1 || len(p)-1 < int(p[0]) {
		return nil, p, false
	}
	n := int(p[0])
	return p[1 : 1+n], p[1+n:], true
}

// HelloOK accepts a connection (daemon to client). For an observer,
// WorldRank and LocalRank are NoRank. Its layout depends on Version:
// FirstCallTimeoutMS travels only in version 3 and later (it is 0 when
// decoded from an older HELLO_OK, and left out when encoding one).
type HelloOK struct {
	Version            uint16
	WorldRank          uint32
	WorldSize          uint32
	NodeRank           uint32
	NodeCount          uint32
	LocalRank          uint32
	LocalSize          uint32
	InlineLimit        uint32
	MaxFrame           uint32
	MaxInFlight        uint32
	Generation         uint32
	ShmQuota           uint64
	TimeoutMS          uint64 // the daemon's collective timeout
	FirstCallTimeoutMS uint64 // version 3: its timeout for the first collective of a generation
}

// Timeout is TimeoutMS as a Duration, saturating at the largest Duration.
func (m HelloOK) Timeout() time.Duration { return millis(m.TimeoutMS) }

// FirstCallTimeout is FirstCallTimeoutMS as a Duration, saturating at the
// largest Duration; 0 before version 3.
func (m HelloOK) FirstCallTimeout() time.Duration { return millis(m.FirstCallTimeoutMS) }

// CallBound is the daemon's bound on a call of unknown place in its
// generation, max(timeout_ms, first_call_timeout_ms), and whether the
// HELLO_OK states it (version 3): an older one states only timeout_ms,
// which does not bound the first call of a generation.
func (m HelloOK) CallBound() (time.Duration, bool) {
	return max(m.Timeout(), m.FirstCallTimeout()), m.Version >= 3
}

func millis(ms uint64) time.Duration {
	if ms > uint64(math.MaxInt64/int64(time.Millisecond)) {
		return math.MaxInt64
	}
	return time.Duration(ms) * time.Millisecond
}

// HELLO_OK payload lengths: versions 1 and 2 end with timeout_ms, version 3
// adds first_call_timeout_ms.
const (
	HelloOKSizeV1 = 60
	HelloOKSizeV3 = HelloOKSizeV1 + 8
)

// HelloOKSize is the HELLO_OK payload length in protocol version v, 0 for
// a version this package does not speak.
func HelloOKSize(v uint16) int {
	switch {
	case v < MinVersion || v > Version:
		return 0
	case v >= 3:
		return HelloOKSizeV3
	}
	return HelloOKSizeV1
}

// Append appends a HELLO_OK frame in the layout of m.Version.
func (m HelloOK) Append(b []byte, id uint64) []byte {
	b, start := beginFrame(b, TypeHelloOK, 0, id)
	le := binary.LittleEndian
	b = le.AppendUint16(b, m.Version)
	b = le.AppendUint16(b, 0)
	for _, v := range [...]uint32{m.WorldRank, m.WorldSize, m.NodeRank, m.NodeCount, m.LocalRank,
		m.LocalSize, m.InlineLimit, m.MaxFrame, m.MaxInFlight, m.Generation} {
		b = le.AppendUint32(b, v)
	}
	b = le.AppendUint64(b, m.ShmQuota)
	b = le.AppendUint64(b, m.TimeoutMS)
	if m.Version >= 3 {
		b = le.AppendUint64(b, m.FirstCallTimeoutMS)
	}
	return endFrame(b, start)
}

func (m HelloOK) Encode(id uint64) []byte { return m.Append(nil, id) }

// DecodeHelloOK parses a HELLO_OK payload and checks that its numbers are
// consistent with each other (a client relies on them for its bounds). The
// version comes first: it decides the length the rest must have.
func DecodeHelloOK(p []byte) (HelloOK, error) {
	var m HelloOK
	if len(p) < 2 {
		return m, Fatalf(CodeBadFrame, "HELLO_OK: payload is %d bytes, too short for the version", len(p))
	}
	le := binary.LittleEndian
	m.Version = le.Uint16(p[0:])
	want := HelloOKSize(m.Version)
	if want == 0 {
		return m, Fatalf(CodeVersion, "HELLO_OK: daemon answers in protocol version %d, client speaks %d to %d", m.Version, MinVersion, Version)
	}
	if len(p) != want {
		return m, Fatalf(CodeBadFrame, "HELLO_OK: payload is %d bytes, want %d in protocol version %d", len(p), want, m.Version)
	}
	if r := le.Uint16(p[2:]); r != 0 {
		return m, Fatalf(CodeBadFrame, "HELLO_OK: reserved field is %d, must be 0", r)
	}
	v := [10]*uint32{&m.WorldRank, &m.WorldSize, &m.NodeRank, &m.NodeCount, &m.LocalRank,
		&m.LocalSize, &m.InlineLimit, &m.MaxFrame, &m.MaxInFlight, &m.Generation}
	for i, f := range v {
		*f = le.Uint32(p[4+4*i:])
	}
	m.ShmQuota = le.Uint64(p[44:])
	m.TimeoutMS = le.Uint64(p[52:])
	if m.Version >= 3 {
		m.FirstCallTimeoutMS = le.Uint64(p[60:])
	}
	if uint64(m.MaxFrame) < uint64(m.InlineLimit)+FrameOverhead || m.MaxFrame < MaxHelloFrame {
		return m, Fatalf(CodeBadFrame, "HELLO_OK: max_frame %d is below max(inline_limit %d + %d, %d)", m.MaxFrame, m.InlineLimit, FrameOverhead, MaxHelloFrame)
	}
	if m.MaxInFlight == 0 {
		return m, Fatalf(CodeBadFrame, "HELLO_OK: max_in_flight is 0")
	}
	if m.LocalSize == 0 || m.NodeCount == 0 {
		return m, Fatalf(CodeBadFrame, "HELLO_OK: local_size %d and node_count %d must be positive", m.LocalSize, m.NodeCount)
	}
	if uint64(m.WorldSize) != uint64(m.NodeCount)*uint64(m.LocalSize) {
		return m, Fatalf(CodeBadFrame, "HELLO_OK: world_size %d != node_count %d * local_size %d", m.WorldSize, m.NodeCount, m.LocalSize)
	}
	if m.NodeRank >= m.NodeCount {
		return m, Fatalf(CodeBadFrame, "HELLO_OK: node_rank %d outside node_count %d", m.NodeRank, m.NodeCount)
	}
	observer := m.LocalRank == NoRank
	if observer != (m.WorldRank == NoRank) {
		return m, Fatalf(CodeBadFrame, "HELLO_OK: world_rank %d and local_rank %d disagree on being an observer", m.WorldRank, m.LocalRank)
	}
	if !observer {
		if m.LocalRank >= m.LocalSize {
			return m, Fatalf(CodeBadFrame, "HELLO_OK: local_rank %d outside local_size %d", m.LocalRank, m.LocalSize)
		}
		if uint64(m.WorldRank) != uint64(m.NodeRank)*uint64(m.LocalSize)+uint64(m.LocalRank) {
			return m, Fatalf(CodeBadFrame, "HELLO_OK: world_rank %d != node_rank %d * local_size %d + local_rank %d", m.WorldRank, m.NodeRank, m.LocalSize, m.LocalRank)
		}
	}
	return m, nil
}

// Alloc asks the daemon for a segment of at least Size bytes.
type Alloc struct{ Size uint64 }

func (m Alloc) Append(b []byte, id uint64) []byte {
	b, start := beginFrame(b, TypeAlloc, 0, id)
	return endFrame(binary.LittleEndian.AppendUint64(b, m.Size), start)
}

func (m Alloc) Encode(id uint64) []byte { return m.Append(nil, id) }

// DecodeAlloc parses an ALLOC payload; size 0 is a non-fatal BAD_REQUEST.
func DecodeAlloc(p []byte) (Alloc, error) {
	if len(p) != 8 {
		return Alloc{}, Fatalf(CodeBadFrame, "ALLOC: payload is %d bytes, want 8", len(p))
	}
	m := Alloc{Size: binary.LittleEndian.Uint64(p)}
	if m.Size == 0 {
		return m, Errorf(CodeBadRequest, "ALLOC: size is 0")
	}
	return m, nil
}

// AllocOK answers ALLOC; the segment's fd travels with the frame.
type AllocOK struct {
	Segment uint32
	Size    uint64
}

func (m AllocOK) Append(b []byte, id uint64) []byte {
	return appendSegmentReply(b, TypeAllocOK, id, m.Segment, m.Size)
}

func (m AllocOK) Encode(id uint64) []byte { return m.Append(nil, id) }

func DecodeAllocOK(p []byte) (AllocOK, error) {
	seg, size, err := decodeSegmentReply(TypeAllocOK, p)
	return AllocOK{Segment: seg, Size: size}, err
}

// Register offers a client-made memfd of exactly Size bytes; the fd travels
// with the frame.
type Register struct{ Size uint64 }

func (m Register) Append(b []byte, id uint64) []byte {
	b, start := beginFrame(b, TypeRegister, 0, id)
	return endFrame(binary.LittleEndian.AppendUint64(b, m.Size), start)
}

func (m Register) Encode(id uint64) []byte { return m.Append(nil, id) }

// DecodeRegister parses a REGISTER payload; size 0 is a non-fatal
// BAD_REQUEST.
func DecodeRegister(p []byte) (Register, error) {
	if len(p) != 8 {
		return Register{}, Fatalf(CodeBadFrame, "REGISTER: payload is %d bytes, want 8", len(p))
	}
	m := Register{Size: binary.LittleEndian.Uint64(p)}
	if m.Size == 0 {
		return m, Errorf(CodeBadRequest, "REGISTER: size is 0")
	}
	return m, nil
}

// RegisterOK answers REGISTER.
type RegisterOK struct {
	Segment uint32
	Size    uint64
}

func (m RegisterOK) Append(b []byte, id uint64) []byte {
	return appendSegmentReply(b, TypeRegisterOK, id, m.Segment, m.Size)
}

func (m RegisterOK) Encode(id uint64) []byte { return m.Append(nil, id) }

func DecodeRegisterOK(p []byte) (RegisterOK, error) {
	seg, size, err := decodeSegmentReply(TypeRegisterOK, p)
	return RegisterOK{Segment: seg, Size: size}, err
}

func appendSegmentReply(b []byte, t Type, id uint64, seg uint32, size uint64) []byte {
	b, start := beginFrame(b, t, 0, id)
	b = binary.LittleEndian.AppendUint32(b, seg)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, size)
	return endFrame(b, start)
}

func decodeSegmentReply(t Type, p []byte) (uint32, uint64, error) {
	if len(p) != 16 {
		return 0, 0, Fatalf(CodeBadFrame, "%s: payload is %d bytes, want 16", t, len(p))
	}
	seg := binary.LittleEndian.Uint32(p)
	if r := binary.LittleEndian.Uint32(p[4:]); r != 0 {
		return 0, 0, Fatalf(CodeBadFrame, "%s: reserved field is %d, must be 0", t, r)
	}
	size := binary.LittleEndian.Uint64(p[8:])
	if seg == 0 {
		return 0, 0, Fatalf(CodeBadFrame, "%s: segment id is 0", t)
	}
	if size == 0 {
		return 0, 0, Fatalf(CodeBadFrame, "%s: size is 0", t)
	}
	return seg, size, nil
}

// Free drops a segment.
type Free struct{ Segment uint32 }

func (m Free) Append(b []byte, id uint64) []byte {
	b, start := beginFrame(b, TypeFree, 0, id)
	b = binary.LittleEndian.AppendUint32(b, m.Segment)
	return endFrame(binary.LittleEndian.AppendUint32(b, 0), start)
}

func (m Free) Encode(id uint64) []byte { return m.Append(nil, id) }

func DecodeFree(p []byte) (Free, error) {
	if len(p) != 8 {
		return Free{}, Fatalf(CodeBadFrame, "FREE: payload is %d bytes, want 8", len(p))
	}
	if r := binary.LittleEndian.Uint32(p[4:]); r != 0 {
		return Free{}, Fatalf(CodeBadFrame, "FREE: reserved field is %d, must be 0", r)
	}
	return Free{Segment: binary.LittleEndian.Uint32(p)}, nil
}

// AppendEmpty appends a frame with an empty payload: FREE_OK or STATUS.
func AppendEmpty(b []byte, t Type, id uint64) []byte {
	return Header{Type: t, ID: id}.Append(b)
}

// DecodeEmpty checks that a FREE_OK or STATUS payload is empty.
func DecodeEmpty(t Type, p []byte) error {
	if len(p) != 0 {
		return Fatalf(CodeBadFrame, "%s: payload is %d bytes, want 0", t, len(p))
	}
	return nil
}

// StatusOK carries the daemon's JSON status document.
type StatusOK struct{ JSON []byte }

func (m StatusOK) Append(b []byte, id uint64) []byte {
	b, start := beginFrame(b, TypeStatusOK, 0, id)
	return endFrame(append(b, m.JSON...), start)
}

func (m StatusOK) Encode(id uint64) []byte { return m.Append(nil, id) }

// DecodeStatusOK returns the document (aliasing p) after checking it is
// UTF-8; its fields are the reader's to interpret.
func DecodeStatusOK(p []byte) (StatusOK, error) {
	if !validUTF8(p) {
		return StatusOK{}, Fatalf(CodeBadFrame, "STATUS_OK: document is not UTF-8")
	}
	return StatusOK{JSON: p}, nil
}

// Call flags (CALL payload byte 3).
const (
	CallFlagSHM uint8 = 1
	// CallFlagExt (version 3): the extension follows the name.
	CallFlagExt uint8 = 2
	// CallFlagNamed (version 4): the call matches by its name, in any
	// order (collective.Desc.Named).
	CallFlagNamed uint8 = 4
)

// Extension flags (the extension's byte 1).
const (
	extCounts uint8 = 1
	extScale  uint8 = 2
	extOut    uint8 = 4
)

// callFixed is the CALL payload before the name: op dtype reduce flags root count name_len.
const callFixed = 17

// Call is one collective call. If SHM, the buffer is Desc.Bytes() bytes at
// Offset in Segment; otherwise Data holds it inline. Out, if set, is the
// result's span (OutSegment, OutOffset) of a shared-memory allgather or
// reduce_scatter. The extension (version 3) is sent when the description
// has a shape, counts or scales, or when Out is set.
type Call struct {
	Desc       collective.Desc
	SHM        bool
	Segment    uint32
	Offset     uint64
	Out        bool
	OutSegment uint32
	OutOffset  uint64
	Data       []byte
	// Ext sends the extension even when it is empty (a decoded call that
	// had the flag re-encodes to the same bytes).
	Ext bool
}

func (m *Call) Append(b []byte, id uint64) []byte {
	b, start := beginFrame(b, TypeCall, 0, id)
	le := binary.LittleEndian
	d := &m.Desc
	var flags uint8
	if m.SHM {
		flags |= CallFlagSHM
	}
	ext := m.Ext || d.Extended() || m.Out
	if ext {
		flags |= CallFlagExt
	}
	if d.Named {
		flags |= CallFlagNamed
	}
	b = append(b, byte(d.Op), byte(d.DType), byte(d.Reduce), flags)
	b = le.AppendUint32(b, d.Root)
	b = le.AppendUint64(b, d.Count)
	b = appendString8(b, d.Name)
	if ext {
		var xf uint8
		if d.Counts != nil {
			xf |= extCounts
		}
		if d.Scaled() {
			xf |= extScale
		}
		if m.Out {
			xf |= extOut
		}
		b = append(b, d.Shape.N, xf, 0, 0)
		for _, x := range d.Shape.Slice() {
			b = le.AppendUint64(b, x)
		}
		if d.Counts != nil {
			b = le.AppendUint32(b, uint32(len(d.Counts)))
			b = le.AppendUint32(b, 0)
			for _, c := range d.Counts {
				b = le.AppendUint64(b, c)
			}
		}
		if d.Scaled() {
			b = le.AppendUint64(b, math.Float64bits(orOne(d.PreScale)))
			b = le.AppendUint64(b, math.Float64bits(orOne(d.PostScale)))
		}
	}
	if m.SHM {
		b = le.AppendUint32(b, m.Segment)
		b = le.AppendUint32(b, 0)
		b = le.AppendUint64(b, m.Offset)
		if m.Out {
			b = le.AppendUint32(b, m.OutSegment)
			b = le.AppendUint32(b, 0)
			b = le.AppendUint64(b, m.OutOffset)
		}
	} else {
		b = append(b, m.Data...)
	}
	return endFrame(b, start)
}

// orOne is a scale factor as the wire carries it: 1 for none.
func orOne(f float64) float64 {
	if f == 0 {
		return 1
	}
	return f
}

func (m *Call) Encode(id uint64) []byte { return m.Append(nil, id) }

// DecodeCall parses a CALL payload into m. Data aliases p. The name is
// looked up in names (which may be nil) so that a loop repeating the same
// names does not allocate; m.Desc.Counts reuses its storage. Structural
// faults (flags, lengths, reserved) are fatal BAD_FRAME; an unknown dtype,
// a non-UTF-8 name, a scale that is not finite and nonzero, or the OUT flag
// on an inline call, which leave the frame well formed, are non-fatal
// BAD_REQUEST. The description is not
// validated against a world size here: that is the receiver's job
// (collective.Desc.Validate).
func DecodeCall(p []byte, m *Call, names *Names) error {
	counts := m.Desc.Counts[:0]
	*m = Call{Desc: collective.Desc{Name: m.Desc.Name}}
	if len(p) < callFixed {
		return Fatalf(CodeBadFrame, "CALL: payload is %d bytes, at least %d needed", len(p), callFixed)
	}
	le := binary.LittleEndian
	m.Desc.Op = collective.Op(p[0])
	m.Desc.DType = collective.DType(p[1])
	m.Desc.Reduce = collective.ReduceOp(p[2])
	flags := p[3]
	m.Desc.Root = le.Uint32(p[4:])
	m.Desc.Count = le.Uint64(p[8:])
	if flags&^(CallFlagSHM|CallFlagExt|CallFlagNamed) != 0 {
		return Fatalf(CodeBadFrame, "CALL: flags 0x%02x has undefined bits", flags)
	}
	m.Desc.Named = flags&CallFlagNamed != 0
	m.SHM = flags&CallFlagSHM != 0
	m.Ext = flags&CallFlagExt != 0
	name, rest, ok := cutString8(p[16:])
	if !ok {
		return Fatalf(CodeBadFrame, "CALL: name length %d runs past the %d-byte payload", p[16], len(p))
	}
	var badScale error
	if flags&CallFlagExt != 0 {
		var err error
		if rest, badScale, err = m.decodeExt(rest, counts); err != nil {
			return err
		}
	}
	if m.SHM {
		want := 16
		if m.Out {
			want = 32
		}
		if len(rest) != want {
			return Fatalf(CodeBadFrame, "CALL: shared-memory call has %d bytes after the name and extension, want %d", len(rest), want)
		}
		m.Segment = le.Uint32(rest)
		m.Offset = le.Uint64(rest[8:])
		if r := le.Uint32(rest[4:]); r != 0 {
			return Fatalf(CodeBadFrame, "CALL: reserved field is %d, must be 0", r)
		}
		if m.Out {
			m.OutSegment = le.Uint32(rest[16:])
			m.OutOffset = le.Uint64(rest[24:])
			if r := le.Uint32(rest[20:]); r != 0 {
				return Fatalf(CodeBadFrame, "CALL: reserved field after out_segment is %d, must be 0", r)
			}
		}
	} else {
		size := uint64(m.Desc.DType.Size())
		if size == 0 && m.Desc.Count != 0 {
			return Errorf(CodeBadRequest, "CALL: unknown dtype code %d (known: %s)", uint8(m.Desc.DType), collective.DTypeNames())
		}
		// Compare by division: count*size may overflow.
		if size != 0 && (uint64(len(rest))%size != 0 || uint64(len(rest))/size != m.Desc.Count) ||
			size == 0 && len(rest) != 0 {
			return Fatalf(CodeBadFrame, "CALL: inline data is %d bytes, count %d of %s implies %d", len(rest), m.Desc.Count, m.Desc.DType, m.Desc.Count*size)
		}
		m.Data = rest
	}
	if !validUTF8(name) {
		return Errorf(CodeBadRequest, "CALL: name is not UTF-8")
	}
	m.Desc.Name = names.intern(m.Desc.Name, name)
	if m.Out && !m.SHM {
		m.Out = false
		return Errorf(CodeBadRequest, "CALL %s: an inline call has the extension's OUT flag; its result comes in CALL_OK", m.Desc.String())
	}
	return badScale
}

// decodeExt parses the version-3 extension at the start of p and
// returns what follows it. A scale that is not finite and nonzero is
// returned as badScale (BAD_REQUEST) after the frame has been parsed.
func (m *Call) decodeExt(p []byte, counts []uint64) (rest []byte, badScale, err error) {
	le := binary.LittleEndian
	if len(p) < 4 {
		return nil, nil, Fatalf(CodeBadFrame, "CALL: extension runs past the payload: %d bytes, at least 4 needed", len(p))
	}
	ndim, xf := p[0], p[1]
	if xf&^(extCounts|extScale|extOut) != 0 {
		return nil, nil, Fatalf(CodeBadFrame, "CALL: extension flags 0x%02x have undefined bits", xf)
	}
	if r := le.Uint16(p[2:]); r != 0 {
		return nil, nil, Fatalf(CodeBadFrame, "CALL: extension reserved field is %d, must be 0", r)
	}
	if ndim > collective.MaxDims {
		return nil, nil, Fatalf(CodeBadFrame, "CALL: shape of %d dimensions, at most %d", ndim, collective.MaxDims)
	}
	p = p[4:]
	if len(p) < 8*int(ndim) {
		return nil, nil, Fatalf(CodeBadFrame, "CALL: shape of %d dimensions runs past the payload", ndim)
	}
	m.Desc.Shape.N = ndim
	for i := 0; i < int(ndim); i++ {
		m.Desc.Shape.Dims[i] = le.Uint64(p[8*i:])
	}
	p = p[8*int(ndim):]
	if xf&extCounts != 0 {
		if len(p) < 8 {
			return nil, nil, Fatalf(CodeBadFrame, "CALL: the per-rank counts header runs past the payload")
		}
		n := le.Uint32(p)
		if r := le.Uint32(p[4:]); r != 0 {
			return nil, nil, Fatalf(CodeBadFrame, "CALL: reserved field after ncounts is %d, must be 0", r)
		}
		p = p[8:]
		if uint64(len(p))/8 < uint64(n) {
			return nil, nil, Fatalf(CodeBadFrame, "CALL: the list of %d per-rank counts runs past the payload", n)
		}
		for i := 0; i < int(n); i++ {
			counts = append(counts, le.Uint64(p[8*i:]))
		}
		if counts == nil {
			counts = []uint64{}
		}
		m.Desc.Counts = counts
		p = p[8*int(n):]
	}
	if xf&extScale != 0 {
		if len(p) < 16 {
			return nil, nil, Fatalf(CodeBadFrame, "CALL: the scale factors block runs past the payload")
		}
		for i, f := range [2]*float64{&m.Desc.PreScale, &m.Desc.PostScale} {
			v := math.Float64frombits(le.Uint64(p[8*i:]))
			if (v == 0 || math.IsNaN(v) || math.IsInf(v, 0)) && badScale == nil {
				badScale = Errorf(CodeBadRequest, "CALL: %s %v must be finite and nonzero", [2]string{"prescale", "postscale"}[i], v)
			}
			*f = v
		}
		p = p[16:]
	}
	m.Out = xf&extOut != 0
	return p, badScale, nil
}

// CallOK answers CALL. Result is the result of an inline call, empty
// otherwise.
type CallOK struct {
	Generation uint32
	Seq        uint64
	Result     []byte
}

// CallOKPrefix is the length of a CALL_OK frame before its result: a sender
// may put the result at b[CallOKPrefix:] and fill the rest with
// PutCallOKPrefix, so that the result is never copied.
const CallOKPrefix = HeaderSize + 16

// PutCallOKPrefix writes the header and fixed fields of a CALL_OK frame
// whose result of resultLen bytes follows at b[CallOKPrefix:].
func PutCallOKPrefix(b []byte, id uint64, generation uint32, seq uint64, resultLen int) {
	_ = b[CallOKPrefix-1]
	Header{Length: uint32(16 + resultLen), Type: TypeCallOK, ID: id}.Put(b)
	binary.LittleEndian.PutUint32(b[16:], generation)
	binary.LittleEndian.PutUint32(b[20:], 0)
	binary.LittleEndian.PutUint64(b[24:], seq)
}

func (m *CallOK) Append(b []byte, id uint64) []byte {
	b, start := beginFrame(b, TypeCallOK, 0, id)
	b = binary.LittleEndian.AppendUint32(b, m.Generation)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, m.Seq)
	return endFrame(append(b, m.Result...), start)
}

func (m *CallOK) Encode(id uint64) []byte { return m.Append(nil, id) }

// DecodeCallOK parses a CALL_OK payload into m; Result aliases p.
func DecodeCallOK(p []byte, m *CallOK) error {
	if len(p) < 16 {
		return Fatalf(CodeBadFrame, "CALL_OK: payload is %d bytes, at least 16 needed", len(p))
	}
	if r := binary.LittleEndian.Uint32(p[4:]); r != 0 {
		return Fatalf(CodeBadFrame, "CALL_OK: reserved field is %d, must be 0", r)
	}
	m.Generation = binary.LittleEndian.Uint32(p)
	m.Seq = binary.LittleEndian.Uint64(p[8:])
	m.Result = p[16:]
	return nil
}

// Append appends an ERROR frame for request id (0: connection-level). The
// message is cut to MaxErrorMessage bytes and made valid UTF-8.
func (e *Error) Append(b []byte, id uint64) []byte {
	var flags uint8
	if e.Fatal {
		flags = FlagFatal
	}
	b, start := beginFrame(b, TypeError, flags, id)
	b = binary.LittleEndian.AppendUint16(b, uint16(e.Code))
	b = binary.LittleEndian.AppendUint16(b, 0)
	return endFrame(append(b, truncateMessage(e.Message)...), start)
}

func (e *Error) Encode(id uint64) []byte { return e.Append(nil, id) }

// DecodeError parses an ERROR payload; flags are the header's. Codes this
// version does not know are kept (a newer daemon may send them).
func DecodeError(flags uint8, p []byte) (*Error, error) {
	if len(p) < 4 {
		return nil, Fatalf(CodeBadFrame, "ERROR: payload is %d bytes, at least 4 needed", len(p))
	}
	code := Code(binary.LittleEndian.Uint16(p))
	if code == 0 {
		return nil, Fatalf(CodeBadFrame, "ERROR: code is 0")
	}
	if r := binary.LittleEndian.Uint16(p[2:]); r != 0 {
		return nil, Fatalf(CodeBadFrame, "ERROR: reserved field is %d, must be 0", r)
	}
	msg := p[4:]
	if len(msg) > MaxErrorMessage {
		return nil, Fatalf(CodeBadFrame, "ERROR: message is %d bytes, limit %d", len(msg), MaxErrorMessage)
	}
	if !validUTF8(msg) {
		return nil, Fatalf(CodeBadFrame, "ERROR: message is not UTF-8")
	}
	return &Error{Code: code, Message: string(msg), Fatal: flags&FlagFatal != 0}, nil
}
