"""The Python codec against the shared vectors in clients/testdata."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import struct

import pytest

from collectived import _protocol as P

VECTORS = os.path.join(os.path.dirname(__file__), "..", "..", "testdata", "vectors.json")

with open(VECTORS, encoding="utf-8") as _f:
    ALL = json.load(_f)
VALID = [v for v in ALL if v.get("valid", True)]
INVALID = [v for v in ALL if not v.get("valid", True)]

_CLASSES = {
    "HELLO": P.Hello, "HELLO_OK": P.HelloOk, "ALLOC": P.Alloc, "ALLOC_OK": P.AllocOk,
    "FREE": P.Free, "FREE_OK": P.FreeOk, "REGISTER": P.Register, "REGISTER_OK": P.RegisterOk,
    "CALL": P.Call, "CALL_OK": P.CallOk, "STATUS": P.Status, "STATUS_OK": P.StatusOk,
    "LANE": P.Lane, "LANE_OK": P.LaneOk, "WAKE": P.Wake, "WAKE_CLIENT": P.WakeClient,
    "ERROR": P.Error,
}


def _as_decoded(msg: P.Message) -> dict:
    """The message in the vectors' `decoded` form."""
    d = {"type": P.TYPE_NAMES[P.type_code(msg)]}
    for f in dataclasses.fields(msg):
        v = getattr(msg, f.name)
        if isinstance(v, (bytes, bytearray, memoryview)):
            v = bytes(v).hex()
        d[f.name] = v
    if isinstance(msg, P.HelloOk) and msg.first_call_timeout_ms is None:
        del d["first_call_timeout_ms"]  # not on the wire before version 3
    if isinstance(msg, P.Call):
        # The vectors carry only the fields present on the wire: the
        # extension's (version 3) only with the EXT flag, and each of its
        # parts only when its xflag is set.
        for k in (("data",) if msg.flags & P.CALL_SHM else ("segment", "offset")):
            del d[k]
        ext = msg.flags & P.CALL_EXT
        present = {"xflags": ext, "dims": ext, "counts": ext and msg.xflags & P.XF_COUNTS,
                   "prescale": ext and msg.xflags & P.XF_SCALE,
                   "postscale": ext and msg.xflags & P.XF_SCALE,
                   "out_segment": msg.out is not None, "out_offset": msg.out is not None}
        for k, there in present.items():
            if not there:
                del d[k]
            elif k in ("dims", "counts"):
                d[k] = list(d[k])
    return d


def test_vectors_cover_the_brief() -> None:
    types = {v["decoded"]["type"] for v in VALID}
    assert types == set(_CLASSES), f"types without a vector: {set(_CLASSES) - types}"
    checks = {v["error"] for v in INVALID}
    for c in ("bad_magic", "frame_too_long", "reserved_nonzero", "payload_length",
              "unknown_type", "inline_data_length", "bad_version"):
        assert c in checks
    # Protocol versions 2 and 3: HELLO and HELLO_OK in every version, and
    # the lane's frames (LANE, LANE_OK, WAKE, WAKE_CLIENT; in the type set
    # above) also with a payload they must not have.
    for t in ("HELLO", "HELLO_OK"):
        assert {v["decoded"]["version"] for v in VALID if v["decoded"]["type"] == t} == {
            1, 2, 3, 4}, t
    names = {v["name"]: v for v in INVALID}
    for n in ("lane_nonempty", "lane_ok_short", "wake_nonempty"):
        assert names[n]["error"] == "payload_length", n
    # HELLO_OK's length is its version's: first_call_timeout_ms from 3 on.
    for n in ("hello_ok_v3_without_first_call", "hello_ok_v2_with_first_call",
              "hello_ok_v1_with_first_call", "hello_ok_v3_trailing_byte"):
        assert names[n]["error"] == "payload_length", n
    assert all(("first_call_timeout_ms" in v["decoded"]) == (v["decoded"]["version"] >= 3)
               for v in VALID if v["decoded"]["type"] == "HELLO_OK")


def test_hello_ok_errors_name_the_version() -> None:
    ok = P.HelloOk(1, 3, 0, 1, 0, 1, 0, 1, 1024, 4096, 4, 1, 0, 1000, 5000)
    frame = P.encode(ok)
    with pytest.raises(P.FrameError, match=r"payload_length: HELLO_OK payload is 60 bytes, must "
                                           r"be 68 in protocol version 3"):
        P.decode(_with_payload(frame, frame[P.HEADER_SIZE:P.HEADER_SIZE + 60]))
    v2 = P.encode(dataclasses.replace(ok, version=2, first_call_timeout_ms=None))
    with pytest.raises(P.FrameError, match=r"HELLO_OK payload is 68 bytes, must be 60 in "
                                           r"protocol version 2"):
        P.decode(_with_payload(v2, v2[P.HEADER_SIZE:] + bytes(8)))
    with pytest.raises(P.FrameError, match=r"bad_version: HELLO_OK is in protocol version 5, "
                                           r"whose layout this client does not know \(it "
                                           r"speaks 1 to 4\)"):
        P.decode(_with_payload(frame, b"\x05\x00" + frame[P.HEADER_SIZE + 2:]))
    # Version 4's HELLO_OK is version 3's layout.
    v4 = P.encode(dataclasses.replace(ok, version=4))
    assert v4[P.HEADER_SIZE + 2:] == frame[P.HEADER_SIZE + 2:]
    assert P.decode(v4) == dataclasses.replace(ok, version=4)
    with pytest.raises(P.FrameError, match=r"payload_length: HELLO_OK payload is 1 bytes, too "
                                           r"short for the version"):
        P.decode(_with_payload(frame, b"\x03"))
    # Encoding refuses a layout the version does not have.
    with pytest.raises(ValueError, match="HELLO_OK of protocol version 3 needs "
                                         "first_call_timeout_ms"):
        P.encode(dataclasses.replace(ok, first_call_timeout_ms=None))
    with pytest.raises(ValueError, match="HELLO_OK of protocol version 2 has no "
                                         "first_call_timeout_ms"):
        P.encode(dataclasses.replace(ok, version=2))


def _with_payload(frame: bytes, payload: bytes) -> bytes:
    """``frame``'s header with ``payload`` in place of its own."""
    return len(payload).to_bytes(4, "little") + frame[4:P.HEADER_SIZE] + payload


def test_committed_vectors_are_the_generators() -> None:
    # vectors.json (Go, Python) and vectors.txt (C) must be one set: both
    # exactly what gen_vectors.py writes, so no codec checks a stale copy.
    spec = importlib.util.spec_from_file_location("gen_vectors", os.path.join(
        os.path.dirname(VECTORS), "gen_vectors.py"))
    assert spec and spec.loader
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    gen.build()
    with open(VECTORS, encoding="utf-8") as f:
        assert json.load(f) == gen.valid + gen.invalid
    with open(os.path.join(os.path.dirname(VECTORS), "vectors.txt"), encoding="utf-8") as f:
        assert f.read() == "\n".join(gen.txt_lines()) + "\n"


# The frames that carry an fd (SCM_RIGHTS), as PROTOCOL.md lists them. This
# client sends REGISTER and expects ALLOC_OK; it never asks for a lane, so
# never gets LANE_OK.
_FD_TYPES = {"ALLOC_OK", "REGISTER", "LANE_OK"}


def _version(vec: dict) -> int:
    """The protocol version of the connection the vector's frame travels
    on (its context; without one, 4, the newest, as
    clients/testdata/README.md says)."""
    return int(vec.get("context", {}).get("connection_version", 4))


@pytest.mark.parametrize("vec", VALID, ids=[v["name"] for v in VALID])
def test_decode_valid(vec: dict) -> None:
    try:
        msg = P.decode(bytes.fromhex(vec["hex"]), version=_version(vec))
    except P.FrameError as e:
        # A request the daemon refuses may be refused by a codec that checks
        # that rule while decoding (clients/testdata/README.md), as ours
        # does an unknown dtype: under the request's code, never as a frame.
        assert vec.get("refused") and e.check == "bad_dtype", str(e)
        return
    assert _as_decoded(msg) == vec["decoded"]
    for k in ("prescale", "postscale"):  # bit for bit: -0.0 is not 0.0
        if k in vec["decoded"]:
            assert struct.pack("<d", getattr(msg, k)) == struct.pack("<d", vec["decoded"][k]), k
    assert (vec["direction"] == "d2c") == bool(P.type_code(msg) & 0x80)
    assert vec["fd"] == (vec["decoded"]["type"] in _FD_TYPES)


@pytest.mark.parametrize("vec", VALID, ids=[v["name"] for v in VALID])
def test_encode_valid(vec: dict) -> None:
    d = dict(vec["decoded"])
    cls = _CLASSES[d.pop("type")]
    for k in ("data", "result"):
        if k in d:
            d[k] = bytes.fromhex(d[k])
    assert P.encode(cls(**d)).hex() == vec["hex"]


@pytest.mark.parametrize("vec", INVALID, ids=[v["name"] for v in INVALID])
def test_decode_invalid(vec: dict) -> None:
    with pytest.raises(P.FrameError) as ei:
        P.decode(bytes.fromhex(vec["hex"]), version=_version(vec))
    assert ei.value.check == vec["error"], str(ei.value)
    assert str(ei.value).startswith(vec["error"] + ":")


def test_header_bound_checked_before_payload() -> None:
    # A header alone claiming 1 MiB must fail on the bound, not on a short read.
    hdr = bytes.fromhex("00001000" "85000000" "0100000000000000")
    with pytest.raises(P.FrameError, match="frame_too_long"):
        P.parse_header(hdr, 4096)
    assert P.parse_header(hdr, 1 << 20)[0] == 1 << 20


def test_encode_rejects_long_strings() -> None:
    with pytest.raises(ValueError, match="call name is 256 bytes"):
        P.encode(P.Call(1, P.OP_BARRIER, 0, 0, 0, name="n" * 256))
    with pytest.raises(ValueError, match="label is 300 bytes"):
        P.encode(P.Hello(1, job="j", label="x" * 300))


def test_call_prefix_plus_data_is_the_frame() -> None:
    c = P.Call(9, P.OP_ALLREDUCE, P.DT_INT32, P.RED_SUM, 2, data=b"\x01\0\0\0\x02\0\0\0")
    assert P.encode_call_prefix(c) + bytes(c.data) == P.encode(c)
    assert P.decode(P.encode(c)) == dataclasses.replace(c, data=memoryview(bytes(c.data)))


def test_request_level_checks() -> None:
    # Not in the shared vectors: the daemon answers these with a non-fatal
    # BAD_REQUEST, so the checks have their own names.
    unknown = P.encode(P.Call(3, P.OP_ALLREDUCE, 10, P.RED_SUM, 2, data=b"\0" * 8))
    with pytest.raises(P.FrameError, match="bad_dtype: CALL dtype code 10 unknown"):
        P.decode(unknown)
    empty = P.decode(P.encode_call_prefix(P.Call(3, P.OP_ALLREDUCE, 10, P.RED_SUM, 0)))
    assert isinstance(empty, P.Call) and empty.dtype == 10 and empty.count == 0
    bad_name = bytearray(P.encode(P.Call(3, P.OP_BARRIER, 0, 0, 0, name="ab")))
    bad_name[-1] = 0xFF
    with pytest.raises(P.FrameError, match="bad_utf8: CALL name is not UTF-8"):
        P.decode(bytes(bad_name))


def test_examples_and_torch_helpers_compile() -> None:
    # train_torch.py, collectived/torch.py and the Horovod API run only
    # where torch is installed; at least they must compile everywhere.
    import py_compile

    here = os.path.dirname(__file__)
    for f in ("../examples/train_numpy.py", "../examples/train_torch.py",
              "../examples/train_ddp.py", "../src/collectived/torch.py",
              "../src/collectived/_torch_pg.py", "../src/collectived/_torch_ddp.py",
              "../examples/horovod_mnist.py", "../src/collectived/horovod/torch.py"):
        py_compile.compile(os.path.join(here, f), doraise=True)
