package ipc

import (
	"github.com/collectived/collectived/collective"
)

// CallLimits is what the checks of a CALL depend on: the connection's
// protocol version, the caller's place in the world and the inline limit.
type CallLimits struct {
	Version, WorldSize, WorldRank, InlineLimit int
}

// CheckExtFlag refuses the call flags a connection's protocol version
// does not define (the extension before version 3, NAMED before 4),
// where they are undefined flags (fatal), before the payload is parsed.
func CheckExtFlag(payload []byte, version int) error {
	if len(payload) <= 3 {
		return nil
	}
	if version < 3 && payload[3]&CallFlagExt != 0 {
		return Fatalf(CodeBadFrame, "CALL: flags 0x%02x has undefined bits in protocol version %d (the extension needs 3)", payload[3], version)
	}
	if version < 4 && payload[3]&CallFlagNamed != 0 {
		return Fatalf(CodeBadFrame, "CALL: flags 0x%02x has undefined bits in protocol version %d (NAMED needs 4)", payload[3], version)
	}
	return nil
}

// CheckCall refuses a decoded call the connection cannot run, with the
// error the daemon answers (docs/PROTOCOL.md, CALL): version-3 codes on
// an older connection, an invalid description, a count that is not the
// caller's own, buffers and result spans that do not fit the op. It
// needs no segment: spans are checked against segments when acquired.
// It returns the caller's result size in bytes (Desc.Result).
func CheckCall(c *Call, lim CallLimits) (resultBytes uint64, err error) {
	d := &c.Desc
	if err := checkVersion(d, lim.Version); err != nil {
		return 0, err
	}
	if err := d.Validate(lim.WorldSize); err != nil {
		return 0, Errorf(CodeBadRequest, "CALL %s: %v", d.String(), err)
	}
	if err := d.CheckRank(lim.WorldRank); err != nil {
		return 0, Errorf(CodeBadRequest, "CALL %s: %v", d.String(), err)
	}
	if c.SHM && d.Op == collective.OpBarrier {
		return 0, Errorf(CodeBadRequest, "CALL %s: a barrier has no buffer; the SHM flag must be clear", d.String())
	}
	if !c.SHM && len(c.Data) > lim.InlineLimit {
		return 0, Errorf(CodeTooLarge, "CALL %s: %d bytes inline, the limit is %d; use shared memory", d.String(), len(c.Data), lim.InlineLimit)
	}
	outward := d.Op == collective.OpAllGather || d.Op == collective.OpReduceScatter
	es := uint64(d.DType.Size())
	result := d.Result(lim.WorldRank, lim.WorldSize) * es
	if !c.SHM {
		if outward && result > uint64(lim.InlineLimit) {
			return 0, Errorf(CodeTooLarge, "CALL %s: the result is %d bytes, over the inline limit %d; use shared memory", d.String(), result, lim.InlineLimit)
		}
		return result, nil
	}
	switch {
	case c.Offset%es != 0:
		return 0, Errorf(CodeBadRequest, "CALL %s: offset %d in segment %d is not a multiple of the %s size %d", d.String(), c.Offset, c.Segment, d.DType, es)
	case outward && !c.Out:
		return 0, Errorf(CodeBadRequest, "CALL %s: a shared-memory %s needs a result span (the extension's OUT)", d.String(), d.Op)
	case !outward && c.Out:
		return 0, Errorf(CodeBadRequest, "CALL %s: %s works in place and takes no result span (OUT)", d.String(), d.Op)
	case c.Out && c.OutOffset%es != 0:
		return 0, Errorf(CodeBadRequest, "CALL %s: out_offset %d in segment %d is not a multiple of the %s size %d", d.String(), c.OutOffset, c.OutSegment, d.DType, es)
	case c.Out:
		if err := checkOverlap(c, d.Bytes(), result, lim); err != nil {
			return 0, err
		}
	}
	return result, nil
}

// checkVersion refuses op, dtype and reduce codes of a later version than
// the connection's.
func checkVersion(d *collective.Desc, v int) error {
	if v >= 3 {
		return nil
	}
	switch {
	case d.Op == collective.OpAllGather:
		return Errorf(CodeUnsupported, "CALL: allgather needs protocol version 3; this connection speaks %d", v)
	case d.Op.Since() > v:
		return Errorf(CodeBadRequest, "CALL: op code %d (%s) needs protocol version %d; this connection speaks %d", uint8(d.Op), d.Op, d.Op.Since(), v)
	case d.DType.Since() > v && d.DType.Valid():
		return Errorf(CodeBadRequest, "CALL: dtype code %d (%s) needs protocol version %d; this connection speaks %d", uint8(d.DType), d.DType, d.DType.Since(), v)
	case d.Reduce.Since() > v && d.Reduce.Valid():
		return Errorf(CodeBadRequest, "CALL: reduce op code %d (%s) needs protocol version %d; this connection speaks %d", uint8(d.Reduce), d.Reduce, d.Reduce.Since(), v)
	}
	return nil
}

// checkOverlap refuses an input and a result span in one segment that
// overlap, except in place: an allgather whose input is exactly the
// caller's own block of the result, a reduce_scatter whose result is
// exactly the caller's own block of the input. Spans in different
// segments never overlap (a segment is one mapping of its own memfd).
func checkOverlap(c *Call, inBytes, outBytes uint64, lim CallLimits) error {
	const far = 1 << 62 // beyond any segment: Acquire refuses it, and no sum below wraps
	if c.Segment != c.OutSegment || inBytes == 0 || outBytes == 0 || c.Offset > far || c.OutOffset > far {
		return nil
	}
	a0, b0 := c.Offset, c.OutOffset
	a1, b1 := a0+inBytes, b0+outBytes
	if a1 <= b0 || b1 <= a0 {
		return nil
	}
	d := &c.Desc
	before, _ := d.Block(lim.WorldRank, lim.WorldSize) // elements of the ranks before the caller
	own := before * uint64(d.DType.Size())
	if d.Op == collective.OpAllGather && a0 == b0+own || d.Op == collective.OpReduceScatter && b0 == a0+own {
		return nil
	}
	what := "input"
	if d.Op == collective.OpAllGather {
		what = "result"
	}
	return Errorf(CodeBadRequest, "CALL %s: the input and result spans overlap, and not in place (the caller's own block at byte %d of the %s)", d.String(), own, what)
}
