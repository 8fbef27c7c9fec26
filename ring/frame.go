package ring

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"strconv"

	"github.com/collectived/collectived/collective"
)

// Frame layout constants; doc.go draws the header.
const (
	headerLen    = 68
	frameMagic   = 0x474e5243 // "CRNG" as little-endian bytes
	frameVersion = 2          // 2: the checksums (version 1 had none, and a 64-byte header)
	// headerSumAt is where the header's CRC32C sits, over the bytes
	// before it.
	headerSumAt = 64
	// trailerLen: a payload is followed by its CRC32C (none when empty).
	trailerLen = 4
	// maxReasonLen bounds the reason text of an abort frame.
	maxReasonLen = 1024
)

// castagnoli is the CRC32C table; hash/crc32 computes it with the CPU's
// CRC32 instruction (SSE 4.2 on amd64, the CRC extension on arm64).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// checksum is the CRC32C of p.
func checksum(p []byte) uint32 { return crc32.Update(0, castagnoli, p) }

// sumUpdate extends the CRC32C sum of the bytes before p with p.
func sumUpdate(sum uint32, p []byte) uint32 { return crc32.Update(sum, castagnoli, p) }

// putTrailer writes the trailer of a payload whose checksum is sum.
func putTrailer(b []byte, sum uint32) { binary.LittleEndian.PutUint32(b, sum) }

// trailerSum reads a payload's trailer.
func trailerSum(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }

// trailerFor is the trailer's length after a payload of n bytes.
func trailerFor(n int) int {
	if n == 0 {
		return 0
	}
	return trailerLen
}

type frameKind uint8

const (
	kindData      frameKind = 1
	kindAbort     frameKind = 2
	kindHeartbeat frameKind = 3
	kindStart     frameKind = 4
)

func (k frameKind) String() string {
	switch k {
	case kindData:
		return "data"
	case kindAbort:
		return "abort"
	case kindHeartbeat:
		return "heartbeat"
	case kindStart:
		return "start"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// header is the fixed part of every frame.
type header struct {
	Kind       frameKind
	Op         collective.Op
	DType      collective.DType
	Reduce     collective.ReduceOp
	Root       uint32
	Count      uint64
	NameFP     uint64
	Seq        uint64
	Generation uint32
	Sender     uint32
	Step       uint32
	Length     uint32
	// Aux is kind specific: allgather data frames carry the sender's
	// block length, abort frames the origin rank (low 32 bits) and the
	// original failure's code (bits 32..39).
	Aux uint64
}

// encode lays the header out in b, sealed with its checksum.
func (h *header) encode(b []byte) {
	_ = b[headerLen-1]
	binary.LittleEndian.PutUint32(b[0:], frameMagic)
	b[4] = frameVersion
	b[5] = byte(h.Kind)
	b[6] = byte(h.Op)
	b[7] = byte(h.DType)
	b[8] = byte(h.Reduce)
	b[9] = 0
	b[10] = 0
	b[11] = 0
	binary.LittleEndian.PutUint32(b[12:], h.Root)
	binary.LittleEndian.PutUint64(b[16:], h.Count)
	binary.LittleEndian.PutUint64(b[24:], h.NameFP)
	binary.LittleEndian.PutUint64(b[32:], h.Seq)
	binary.LittleEndian.PutUint32(b[40:], h.Generation)
	binary.LittleEndian.PutUint32(b[44:], h.Sender)
	binary.LittleEndian.PutUint32(b[48:], h.Step)
	binary.LittleEndian.PutUint32(b[52:], h.Length)
	binary.LittleEndian.PutUint64(b[56:], h.Aux)
	binary.LittleEndian.PutUint32(b[headerSumAt:], checksum(b[:headerSumAt]))
}

// decodeHeader parses and checks a header: its checksum first, so that
// no field of a header changed on the way is used, then its structure:
// magic, version, kind, reserved bytes and the payload length against the
// bound for its kind (maxData for data frames). Whether the frame belongs
// to the op under way is checked later, by the op. A checksum that does
// not match is ErrCorrupt, unless the bytes are not a header of this
// protocol at all (another program, another version, a stream out of
// step), which like every other violation is ErrBadFrame.
func decodeHeader(b []byte, maxData int) (header, error) {
	var h header
	if len(b) < headerLen {
		return h, fmt.Errorf("%w: header is %d bytes, want %d", ErrBadFrame, len(b), headerLen)
	}
	if sum, want := checksum(b[:headerSumAt]), binary.LittleEndian.Uint32(b[headerSumAt:]); sum != want && !foreignHeader(b, want) {
		return h, fmt.Errorf("%w: header checksum mismatch (CRC32C %#08x computed, %#08x sent)", ErrCorrupt, sum, want)
	}
	if m := binary.LittleEndian.Uint32(b[0:]); m != frameMagic {
		return h, fmt.Errorf("%w: bad magic %#08x (not a collectived ring peer, or the stream lost sync)", ErrBadFrame, m)
	}
	if b[4] != frameVersion {
		return h, fmt.Errorf("%w: protocol version %d, want %d", ErrBadFrame, b[4], frameVersion)
	}
	if b[9] != 0 || b[10] != 0 || b[11] != 0 {
		return h, fmt.Errorf("%w: reserved header bytes are not zero", ErrBadFrame)
	}
	h.Kind = frameKind(b[5])
	h.Op = collective.Op(b[6])
	h.DType = collective.DType(b[7])
	h.Reduce = collective.ReduceOp(b[8])
	h.Root = binary.LittleEndian.Uint32(b[12:])
	h.Count = binary.LittleEndian.Uint64(b[16:])
	h.NameFP = binary.LittleEndian.Uint64(b[24:])
	h.Seq = binary.LittleEndian.Uint64(b[32:])
	h.Generation = binary.LittleEndian.Uint32(b[40:])
	h.Sender = binary.LittleEndian.Uint32(b[44:])
	h.Step = binary.LittleEndian.Uint32(b[48:])
	h.Length = binary.LittleEndian.Uint32(b[52:])
	h.Aux = binary.LittleEndian.Uint64(b[56:])
	var limit uint32
	switch h.Kind {
	case kindData:
		limit = uint32(maxData)
	case kindAbort:
		limit = maxReasonLen
	case kindHeartbeat, kindStart:
		limit = 0
	default:
		return h, fmt.Errorf("%w: unknown frame kind %d", ErrBadFrame, b[5])
	}
	if h.Length > limit {
		hint := ""
		if h.Kind == kindData {
			hint = " (segment_bytes and small_bytes must be the same on every rank)"
		}
		return h, fmt.Errorf("%w: %s frame payload of %d bytes exceeds the limit of %d%s", ErrBadFrame, h.Kind, h.Length, limit, hint)
	}
	return h, nil
}

// foreignHeader tells, for a header whose checksum failed, whether it is
// not one of this protocol at all (its magic or version is another's, and
// stays so: the checksum does not match with ours in their place either),
// rather than one of ours corrupted on the way.
func foreignHeader(b []byte, want uint32) bool {
	if binary.LittleEndian.Uint32(b[0:]) == frameMagic && b[4] == frameVersion {
		return false
	}
	var ours [5]byte
	binary.LittleEndian.PutUint32(ours[:], frameMagic)
	ours[4] = frameVersion
	return sumUpdate(checksum(ours[:]), b[5:headerSumAt]) != want
}

// setDesc stamps a call description into the header.
func (h *header) setDesc(d *collective.Desc, fp uint64) {
	h.Op, h.DType, h.Reduce, h.Root, h.Count, h.NameFP = d.Op, d.DType, d.Reduce, d.Root, d.Count, fp
}

// sameDesc reports whether the header describes the call d (fingerprint fp).
func (h *header) sameDesc(d *collective.Desc, fp uint64) bool {
	return h.Op == d.Op && h.DType == d.DType && h.Reduce == d.Reduce &&
		h.Root == d.Root && h.Count == d.Count && h.NameFP == fp
}

// sameCall reports whether two headers describe the same call.
func (h *header) sameCall(o *header) bool {
	return h.Op == o.Op && h.DType == o.DType && h.Reduce == o.Reduce &&
		h.Root == o.Root && h.Count == o.Count && h.NameFP == o.NameFP
}

// remoteDesc renders the description a header carries. Names do not
// travel, only the fingerprint over all fields and the name: if the
// remote fields with the local name give the remote fingerprint, the names
// agree; otherwise the name is shown as differing.
func (h *header) remoteDesc(local *collective.Desc) string {
	d := collective.Desc{Op: h.Op, DType: h.DType, Reduce: h.Reduce, Count: h.Count, Root: h.Root, Name: local.Name,
		Shape: local.Shape, Counts: local.Counts, PreScale: local.PreScale, PostScale: local.PostScale}
	if d.Fingerprint() == h.NameFP {
		return d.String()
	}
	// Only the fingerprint travels: say what may differ.
	what := "name differs"
	if local.Extended() {
		what = "name, shape, per-rank counts or scales differ"
		d.Shape, d.Counts, d.PreScale, d.PostScale = collective.Shape{}, nil, 0, 0
	}
	d.Name = ""
	s := d.String()
	if s[len(s)-2] == '(' {
		return s[:len(s)-1] + what + ")"
	}
	return s[:len(s)-1] + ", " + what + ")"
}
