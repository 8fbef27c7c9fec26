"""Protocol version 3's CALL (docs/PROTOCOL.md, "CALL (0x05)"): the new op,
dtype and reduce codes, and the extension (EXT flag: shape, per-rank
COUNTS, SCALE, OUT span), byte for byte against frames written out by
hand from the document's layout, and the decoder's checks of each field.
(The shared vectors in clients/testdata have no version-3 CALL yet.)"""

from __future__ import annotations

import dataclasses
import struct

import pytest

from collectived import _protocol as P


def h(s: str) -> bytes:
    """Hex with spaces and line breaks for reading."""
    return bytes.fromhex("".join(s.split()))


# Each case: the Call, and its frame as the document lays it out.
CASES = {
    # allgather of two float16 (1.0, 2.0) inline, name "g", shape (2,).
    "allgather_f16_inline_shape": (
        P.Call(7, P.OP_ALLGATHER, P.DT_FLOAT16, P.RED_NONE, 2, name="g", flags=P.CALL_EXT,
               data=h("003c 0040"), dims=(2,)),
        h("""22000000 05 00 0000 0700000000000000
             03 06 00 02 00000000 0200000000000000 01 67
             01 00 0000 0200000000000000
             003c 0040""")),
    # reduce_scatterv of bfloat16, avg, in shared memory: shape (3, 2),
    # counts [4, 2], prescale 0.5 and postscale 2.0, the input at segment
    # 3 offset 64 and the result at segment 4 offset 8 (every xflag).
    "reduce_scatterv_bf16_avg_shm_all": (
        P.Call(9, P.OP_REDUCE_SCATTER, P.DT_BFLOAT16, P.RED_AVG, 6,
               flags=P.CALL_SHM | P.CALL_EXT, segment=3, offset=64, dims=(3, 2),
               xflags=P.XF_COUNTS | P.XF_SCALE | P.XF_OUT, counts=(4, 2), prescale=0.5,
               postscale=2.0, out_segment=4, out_offset=8),
        h("""6d000000 05 00 0000 0900000000000000
             05 07 05 03 00000000 0600000000000000 00
             02 07 0000 0300000000000000 0200000000000000
             02000000 00000000 0400000000000000 0200000000000000
             000000000000e03f 0000000000000040
             03000000 00000000 4000000000000000
             04000000 00000000 0800000000000000""")),
    # allreduce of float32 with a scale only: ndim 0 (no shape), SCALE.
    "allreduce_f32_scale_only": (
        P.Call(1, P.OP_ALLREDUCE, P.DT_FLOAT32, P.RED_SUM, 1, flags=P.CALL_EXT,
               data=h("0000803f"), xflags=P.XF_SCALE, prescale=0.25, postscale=1.0),
        h("""29000000 05 00 0000 0100000000000000
             01 01 01 02 00000000 0100000000000000 00
             00 02 0000
             000000000000d03f 000000000000f03f
             0000803f""")),
    # reduce of three int8 to root 2, sum, without the extension.
    "reduce_int8_root": (
        P.Call(2, P.OP_REDUCE, P.DT_INT8, P.RED_SUM, 3, root=2, data=h("ff 01 7f")),
        h("""14000000 05 00 0000 0200000000000000
             06 08 01 00 02000000 0300000000000000 00
             ff 01 7f""")),
    # allgatherv of uint8 inline: counts [1, 0, 2] (this rank gives 1).
    "allgatherv_u8_counts": (
        P.Call(3, P.OP_ALLGATHER, P.DT_UINT8, P.RED_NONE, 1, flags=P.CALL_EXT,
               data=h("aa"), xflags=P.XF_COUNTS, counts=(1, 0, 2)),
        h("""36000000 05 00 0000 0300000000000000
             03 09 00 02 00000000 0100000000000000 00
             00 01 0000
             03000000 00000000 0100000000000000 0000000000000000 0200000000000000
             aa""")),
    # allgather in shared memory of a shape of three dimensions, one of
    # them 0 (so count 0), with its OUT span.
    "allgather_shm_zero_dim_out": (
        P.Call(4, P.OP_ALLGATHER, P.DT_FLOAT64, P.RED_NONE, 0,
               flags=P.CALL_SHM | P.CALL_EXT, segment=1, offset=0, dims=(4, 0, 2),
               xflags=P.XF_OUT, out_segment=1, out_offset=4096),
        h("""4d000000 05 00 0000 0400000000000000
             03 02 00 03 00000000 0000000000000000 00
             03 04 0000 0400000000000000 0000000000000000 0200000000000000
             01000000 00000000 0000000000000000
             01000000 00000000 0010000000000000""")),
}


@pytest.mark.parametrize("name", list(CASES))
def test_encode_is_the_documents_layout(name: str) -> None:
    call, frame = CASES[name]
    assert P.encode(call).hex() == frame.hex()
    # The prefix and the inline data are the frame, as the client sends them.
    assert P.encode_call_prefix(call) + (b"" if call.flags & P.CALL_SHM else bytes(call.data)) == frame


@pytest.mark.parametrize("name", list(CASES))
def test_decode_gives_the_call_back(name: str) -> None:
    call, frame = CASES[name]
    got = P.decode(frame, 1 << 16)
    assert isinstance(got, P.Call)
    assert dataclasses.replace(got, data=bytes(got.data)) == dataclasses.replace(
        call, data=bytes(call.data))


def test_codes() -> None:
    # The numbers of the document's tables.
    assert (P.OP_ALLREDUCE, P.OP_BROADCAST, P.OP_ALLGATHER, P.OP_BARRIER, P.OP_REDUCE_SCATTER,
            P.OP_REDUCE) == (1, 2, 3, 4, 5, 6)
    assert (P.DT_FLOAT16, P.DT_BFLOAT16, P.DT_INT8, P.DT_UINT8) == (6, 7, 8, 9)
    assert [P.DTYPE_SIZES[d] for d in range(10)] == [0, 4, 8, 4, 8, 1, 2, 2, 1, 1]
    assert P.RED_AVG == 5 and (P.CALL_SHM, P.CALL_EXT) == (1, 2)
    assert (P.XF_COUNTS, P.XF_SCALE, P.XF_OUT) == (1, 2, 4) and P.MAX_DIMS == 8
    assert P.OP_SINCE == {3: 3, 5: 3, 6: 3} and set(P.DTYPE_SINCE) == {6, 7, 8, 9}


def test_ext_size() -> None:
    for name, (call, frame) in CASES.items():
        if call.flags & P.CALL_EXT:
            want = len(P.encode_call_ext(call.dims, call.counts, call.scale, call.out is not None))
            assert P.call_ext_size(len(call.shape), None if call.counts is None else
                                   len(call.counts), call.scale is not None) == want, name


def test_result_count() -> None:
    # The op table: what CALL_OK carries for an inline call.
    assert P.result_count(P.OP_ALLGATHER, 3, 4, 1) == 12
    assert P.result_count(P.OP_ALLGATHER, 1, 3, 0, (1, 0, 2)) == 3
    assert P.result_count(P.OP_REDUCE_SCATTER, 12, 4, 3) == 3
    assert P.result_count(P.OP_REDUCE_SCATTER, 6, 3, 1, (4, 0, 2)) == 0
    assert P.result_count(P.OP_REDUCE_SCATTER, 6, 3, 2, (4, 0, 2)) == 2
    for op in (P.OP_ALLREDUCE, P.OP_BROADCAST, P.OP_REDUCE):
        assert P.result_count(op, 5, 4, 2) == 5
    assert P.result_count(P.OP_BARRIER, 0, 4, 2) == 0


def test_call_ok_of_an_allgather() -> None:
    # CALL_OK's result is the op table's size, not the request's.
    frame = h("""1c000000 85 00 0000 0700000000000000
                 01000000 00000000 0500000000000000
                 003c 0040 0042 0044 0045 0046""")
    ok = P.decode(frame, 1 << 16)
    assert isinstance(ok, P.CallOk) and (ok.generation, ok.seq) == (1, 5)
    assert bytes(ok.result) == h("003c 0040 0042 0044 0045 0046")
    assert P.encode(P.CallOk(7, 1, 5, bytes(ok.result))) == frame


def _patched(frame: bytes, at: int, new: bytes) -> bytes:
    return frame[:at] + new + frame[at + len(new):]


_ALL = CASES["reduce_scatterv_bf16_avg_shm_all"][1]
_EXT_AT = P.HEADER_SIZE + P.CALL_FIXED_SIZE  # no name


@pytest.mark.parametrize("frame,check,words", [
    (_patched(_ALL, P.HEADER_SIZE + 3, b"\x0b"), "bad_flags", "CALL flags 0x0b not defined"),
    (_patched(_ALL, _EXT_AT + 1, b"\x0f"), "bad_flags", "xflags 0x0f not defined"),
    (_patched(_ALL, _EXT_AT + 2, b"\x01"), "reserved_nonzero", "extension reserved field is 1"),
    (_patched(_ALL, _EXT_AT + 4 + 16 + 4, b"\x02"), "reserved_nonzero",
     "counts reserved field is 2"),
    (_patched(_ALL, len(_ALL) - 32 + 4, b"\x01"), "reserved_nonzero",
     "segment reserved field is 1"),
    (_patched(_ALL, len(_ALL) - 16 + 4, b"\x01"), "reserved_nonzero",
     "out segment reserved field is 1"),
], ids=["undefined CALL flag", "undefined xflag", "ext reserved", "counts reserved",
        "segment reserved", "out reserved"])
def test_decode_checks_each_field(frame: bytes, check: str, words: str) -> None:
    with pytest.raises(P.FrameError) as ei:
        P.decode(frame, 1 << 16)
    assert ei.value.check == check and words in str(ei.value), str(ei.value)


def _with_payload(payload: bytes, fid: int = 5) -> bytes:
    return struct.pack("<IBBHQ", len(payload), P.CALL, 0, 0, fid) + payload


_FIXED_EXT = h("03 01 00 02 00000000 0100000000000000 00")  # allgather f32 count 1, EXT


@pytest.mark.parametrize("payload,check,words", [
    (_FIXED_EXT, "payload_length", "too short for the extension's ndim"),
    (_FIXED_EXT + h("02 00 0000 0100000000000000"), "payload_length", "a shape of 2 dimensions"),
    (_FIXED_EXT + h("00 01 0000 03000000"), "payload_length", "ncounts and reserved"),
    (_FIXED_EXT + h("00 01 0000 03000000 00000000 0100000000000000"), "payload_length",
     "3 per-rank counts"),
    (_FIXED_EXT + h("00 02 0000 000000000000f03f"), "payload_length", "prescale and postscale"),
    (_FIXED_EXT + h("00 00 0000 0000803f 00"), "inline_data_length",
     "CALL inline data is 5 bytes, count 1 x element size 4 needs 4"),
    (_FIXED_EXT + h("00 04 0000 0000803f") + bytes(16), "inline_data_length",
     "CALL inline data is 20 bytes"),
    (_FIXED_EXT + h("09 00 0000"), "bad_ndim", "shape has 9 dimensions, limit 8"),
    (h("03 01 00 03 00000000 0100000000000000 00 00 04 0000")
     + h("01000000 00000000 0000000000000000"), "payload_length", "must be"),
], ids=["no ext", "short shape", "short counts head", "short counts", "short scale",
        "data too long", "an out span on an inline call is data", "9 dimensions",
        "shm without its out span"])
def test_decode_lengths_and_request_checks(payload: bytes, check: str, words: str) -> None:
    with pytest.raises(P.FrameError) as ei:
        P.decode(_with_payload(payload), 1 << 16)
    assert ei.value.check == check and words in str(ei.value), str(ei.value)


def test_encode_refuses_what_the_layout_cannot_say() -> None:
    with pytest.raises(ValueError, match="set flags CALL_EXT"):
        P.encode(P.Call(1, P.OP_ALLREDUCE, P.DT_FLOAT32, P.RED_SUM, 1, data=bytes(4), dims=(1,)))
    with pytest.raises(ValueError, match="set flags CALL_EXT"):
        P.encode(P.Call(1, P.OP_ALLREDUCE, P.DT_FLOAT32, P.RED_SUM, 1, data=bytes(4),
                        xflags=P.XF_SCALE, prescale=2.0, postscale=1.0))
    with pytest.raises(ValueError, match="xflags COUNTS needs counts"):
        P.encode(P.Call(1, P.OP_ALLGATHER, P.DT_FLOAT32, 0, 1, flags=P.CALL_EXT, data=bytes(4),
                        xflags=P.XF_COUNTS))
    with pytest.raises(ValueError, match="shape has 9 dimensions, limit 8"):
        P.encode(P.Call(1, P.OP_ALLREDUCE, P.DT_FLOAT32, P.RED_SUM, 1, flags=P.CALL_EXT,
                        data=bytes(4), dims=(1,) * 9))


def test_inline_call_with_out_has_no_span() -> None:
    # OUT on an inline call (the daemon refuses it as a request): no span
    # follows; every byte after the extension is data.
    c = P.Call(8, P.OP_ALLGATHER, P.DT_FLOAT32, 0, 1, flags=P.CALL_EXT, xflags=P.XF_OUT,
               data=h("0000803f"))
    frame = _with_payload(_FIXED_EXT + h("00 04 0000 0000803f"), 8)
    assert P.encode(c) == frame
    got = P.decode(frame, 1 << 16)
    assert isinstance(got, P.Call) and got.xflags == P.XF_OUT and got.out is None
    assert bytes(got.data) == h("0000803f")


@pytest.mark.parametrize("version", [1, 2])
def test_ext_is_undefined_before_version_3(version: int) -> None:
    frame = CASES["allgather_f16_inline_shape"][1]
    with pytest.raises(P.FrameError, match=rf"bad_flags: CALL flag EXT on a connection of "
                                           rf"protocol version {version}"):
        P.decode(frame, 1 << 16, version)
    assert isinstance(P.decode(frame, 1 << 16, 3), P.Call)


def test_empty_extension_is_four_bytes() -> None:
    # EXT with nothing in it is legal (ndim 0, no xflags): 4 bytes.
    c = P.Call(6, P.OP_BROADCAST, P.DT_BYTES, 0, 1, flags=P.CALL_EXT, data=b"z")
    assert P.encode(c) == _with_payload(h("02 05 00 02 00000000 0100000000000000 00 00000000 7a"), 6)
