package rendezvous

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"strconv"
	"unicode/utf8"
)

// Wire constants. The 8-byte frame header keeps its layout in every
// protocol version, so peers of different versions can still tell each
// other which version they speak.
const (
	// ProtocolVersion 2: an allreduce of exactly ring.small_bytes takes
	// the whole-buffer path (version 1 sent it round the ring), so peers
	// of the two versions would not agree on its frames. Version 3: ops
	// stripe over every stream of a link from 4 segments (2 MiB by
	// default; version 2 from 8), so peers of versions 2 and 3 would not
	// agree on which stream carries the frames of a 2-4 MiB op. Version
	// 4: in a ring of two, the ops of short frames (Start, Barrier, a
	// small allreduce) travel both ways on the first stream rank 0 dialled
	// (ring/duplex.go), where version 3 sent rank 1's on its own link.
	// Version 5: ring frames carry CRC32C checksums of their header (a
	// 68-byte header) and of their payload (a trailer behind it): ring
	// frame version 2, ring/doc.go.
	ProtocolVersion = 5

	magic      = "CLVD"
	headerLen  = 8
	maxPayload = 512 // every frame of version 1 fits; larger lengths are refused unread
	nonceLen   = 32
	macLen     = sha256.Size

	helloFixedLen = 4 + 4 + 4 + 2 + 2 + 4 + 8 + 8 + 32 + nonceLen + 1
	maxReasonLen  = 200
)

type frameType uint8

const (
	frameHello  frameType = 1
	frameAuth   frameType = 2
	frameStatus frameType = 3
)

func (t frameType) String() string {
	switch t {
	case frameHello:
		return "hello"
	case frameAuth:
		return "auth"
	case frameStatus:
		return "status"
	}
	return "type " + strconv.Itoa(int(t))
}

// MAC labels keep the two proofs apart: a listener's proof can never be
// presented as a dialer's, so a listener is no signing oracle for strangers.
const (
	labelDialer   = "collectived rendezvous v1: dialer proof\x00"
	labelListener = "collectived rendezvous v1: listener proof\x00"
)

// nativeBOM is 0x01020304 as this machine stores it; ring frames carry
// numbers in native order, so both ends must store them alike.
var nativeBOM = func() (b [4]byte) {
	binary.NativeEndian.PutUint32(b[:], 0x01020304)
	return b
}()

// session orders formation attempts of one node: a later attempt replaces
// an earlier one on the peer. Epoch is the process's start time (so a
// restarted process outranks its predecessor), Seq counts attempts.
type session struct {
	Epoch, Seq uint64
}

func (s session) less(o session) bool {
	return s.Epoch < o.Epoch || (s.Epoch == o.Epoch && s.Seq < o.Seq)
}

// hello is the first frame each side sends.
type hello struct {
	ByteOrder  [4]byte
	Rank       uint32
	World      uint32
	Streams    uint16
	Stream     uint16
	Generation uint32
	Session    session
	Digest     [32]byte
	Nonce      [nonceLen]byte
	Job        string
}

// frame is one received frame; payload aliases the reader's buffer.
type frame struct {
	version uint8
	typ     frameType
	payload []byte
	raw     []byte // header and payload, as received, for the MAC transcript
}

// frameBuf holds the largest frame, so reading never allocates by peer's
// say-so.
type frameBuf [headerLen + maxPayload]byte

// readFrame reads one frame, refusing bad magic and over-long lengths before
// reading the payload. The version is returned, not checked: the caller
// decides how to answer a peer of another version.
func readFrame(r io.Reader, buf *frameBuf) (frame, error) {
	if _, err := io.ReadFull(r, buf[:headerLen]); err != nil {
		return frame{}, err
	}
	if string(buf[:4]) != magic {
		return frame{}, fmt.Errorf("%w: first bytes % x", ErrBadMagic, buf[:headerLen])
	}
	f := frame{version: buf[4], typ: frameType(buf[5])}
	n := int(binary.BigEndian.Uint16(buf[6:8]))
	if n > maxPayload {
		return frame{}, fmt.Errorf("%w: %v frame of %d bytes exceeds limit %d", ErrMalformed, f.typ, n, maxPayload)
	}
	if _, err := io.ReadFull(r, buf[headerLen:headerLen+n]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return frame{}, err
	}
	f.raw = buf[:headerLen+n]
	f.payload = buf[headerLen : headerLen+n]
	return f, nil
}

func appendHeader(b []byte, t frameType, n int) []byte {
	b = append(b, magic...)
	b = append(b, ProtocolVersion, byte(t))
	return binary.BigEndian.AppendUint16(b, uint16(n))
}

// appendHello encodes h as a complete frame.
func appendHello(b []byte, h *hello) []byte {
	b = appendHeader(b, frameHello, helloFixedLen+len(h.Job))
	b = append(b, h.ByteOrder[:]...)
	b = binary.BigEndian.AppendUint32(b, h.Rank)
	b = binary.BigEndian.AppendUint32(b, h.World)
	b = binary.BigEndian.AppendUint16(b, h.Streams)
	b = binary.BigEndian.AppendUint16(b, h.Stream)
	b = binary.BigEndian.AppendUint32(b, h.Generation)
	b = binary.BigEndian.AppendUint64(b, h.Session.Epoch)
	b = binary.BigEndian.AppendUint64(b, h.Session.Seq)
	b = append(b, h.Digest[:]...)
	b = append(b, h.Nonce[:]...)
	b = append(b, byte(len(h.Job)))
	return append(b, h.Job...)
}

// decodeHello parses a version-1 hello payload. Every length is checked
// against what is present before it is used.
func decodeHello(p []byte) (hello, error) {
	var h hello
	if len(p) < helloFixedLen {
		return h, fmt.Errorf("%w: hello of %d bytes, need at least %d", ErrMalformed, len(p), helloFixedLen)
	}
	copy(h.ByteOrder[:], p[0:4])
	h.Rank = binary.BigEndian.Uint32(p[4:8])
	h.World = binary.BigEndian.Uint32(p[8:12])
	h.Streams = binary.BigEndian.Uint16(p[12:14])
	h.Stream = binary.BigEndian.Uint16(p[14:16])
	h.Generation = binary.BigEndian.Uint32(p[16:20])
	h.Session.Epoch = binary.BigEndian.Uint64(p[20:28])
	h.Session.Seq = binary.BigEndian.Uint64(p[28:36])
	copy(h.Digest[:], p[36:68])
	copy(h.Nonce[:], p[68:100])
	jl := int(p[100])
	if len(p) != helloFixedLen+jl {
		return h, fmt.Errorf("%w: hello of %d bytes does not match job name length %d", ErrMalformed, len(p), jl)
	}
	if jl == 0 {
		return h, fmt.Errorf("%w: empty job name", ErrMalformed)
	}
	h.Job = string(p[helloFixedLen:])
	return h, nil
}

func appendAuth(b []byte, mac []byte) []byte {
	b = appendHeader(b, frameAuth, len(mac))
	return append(b, mac...)
}

func appendStatus(b []byte, c rejectCode, reason string) []byte {
	if len(reason) > maxReasonLen {
		reason = reason[:maxReasonLen]
	}
	b = appendHeader(b, frameStatus, 1+len(reason))
	b = append(b, byte(c))
	return append(b, reason...)
}

// decodeStatus returns nil for OK and a *rejectedError otherwise.
func decodeStatus(p []byte) error {
	if len(p) < 1 || len(p) > 1+maxReasonLen {
		return fmt.Errorf("%w: status frame of %d bytes", ErrMalformed, len(p))
	}
	if rejectCode(p[0]) == codeOK {
		return nil
	}
	return &rejectedError{code: rejectCode(p[0]), reason: sanitize(p[1:])}
}

// sanitize renders peer-supplied text safe for logs: printable UTF-8 only.
func sanitize(b []byte) string {
	out := make([]rune, 0, len(b))
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		b = b[n:]
		if r == utf8.RuneError || r < 0x20 || r == 0x7f {
			r = '?'
		}
		out = append(out, r)
	}
	return string(out)
}

// proof is the MAC one side presents: keyed by the job token, over a role
// label and both hello frames exactly as sent. Both nonces and every
// field are inside, so no part can be spliced from another handshake.
func proof(token []byte, label string, dialerHello, listenerHello []byte) []byte {
	m := hmac.New(sha256.New, token)
	m.Write([]byte(label))
	m.Write(dialerHello)
	m.Write(listenerHello)
	return m.Sum(nil)
}
