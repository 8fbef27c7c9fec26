"""The lane's C extension (collectived._lanewords) on its own, on a real
shared mapping: its checks of what it is given, and take_call_ok's three
answers (taken, left for the client's checks, nothing came)."""

from __future__ import annotations

import array
import json
import math
import mmap
import os
import struct
import threading
import time

import pytest

from collectived import _lane as L
from collectived import _protocol as P

lanewords = pytest.importorskip("collectived._lanewords",
                                reason="the lane extension is not built: run scripts/setup.sh")


@pytest.fixture
def lane() -> mmap.mmap:
    return mmap.mmap(-1, L.SIZE)


def call_ok(mm: mmap.mmap, rid: int, result: bytes, seq: int, gen: int = 7, cseq: int = 3) -> None:
    frame = P.encode(P.CallOk(rid, gen, cseq, result))
    mm[L.D2C:L.D2C + len(frame)] = frame
    struct.pack_into("<I", mm, L.D2C_SEQ, seq)


def test_bad_arguments_are_refused(lane: mmap.mmap) -> None:
    with pytest.raises(BufferError, match="not writable"):
        lanewords.Words(b"read-only bytes")
    with pytest.raises(ValueError, match="not 64-byte aligned"):
        lanewords.Words(memoryview(lane)[4:])
    w = lanewords.Words(lane)
    with pytest.raises(ValueError, match=r"lane word offset 3 is not an aligned u32 inside 12288 bytes"):
        w.load(3)
    with pytest.raises(ValueError, match=r"offset 12288 is not an aligned u32"):
        w.store(12288, 1)
    with pytest.raises(OverflowError, match=r"4294967296 does not fit in 32 bits"):
        w.store(0, 1 << 32)
    w.close()
    w.close()  # idempotent
    with pytest.raises(ValueError, match="lane is closed"):
        w.load(0)
    lane.close()  # the mapping was given back
    short = lanewords.Words(mmap.mmap(-1, 4096))
    with pytest.raises(ValueError, match="lane mapping too short for its d2c slot"):
        short.take_call_ok(1, bytearray(0), 0)


def test_store_load_and_poll(lane: mmap.mmap) -> None:
    w = lanewords.Words(lane)
    w.store(L.C2D_SEQ, 5)
    assert w.load(L.C2D_SEQ) == 5 == struct.unpack_from("<I", lane, L.C2D_SEQ)[0]
    t0 = time.monotonic()
    assert w.poll(L.D2C_SEQ, 0, 20_000_000) == 0  # nothing: back after 20 ms
    assert time.monotonic() - t0 >= 0.015
    threading.Timer(0.01, lambda: w.store(L.D2C_SEQ, 1)).start()
    assert w.poll(L.D2C_SEQ, 0, 5_000_000_000) == 1  # another thread's store ends it
    w.close()


def test_watch_answer(lane: mmap.mmap) -> None:
    w = lanewords.Words(lane)
    assert w.watch_answer(0, 1_000_000) == 0  # nothing came within 1 ms
    assert w.load(L.C_PARKED) == 1  # and the client said it sleeps
    threading.Timer(0.01, lambda: w.store(L.D2C_SEQ, 1)).start()
    assert w.watch_answer(0, 5_000_000_000) == 1
    w.close()
    with pytest.raises(ValueError, match="lane is closed"):
        w.watch_answer(1, 0)


def test_take_call_ok(lane: mmap.mmap) -> None:
    w = lanewords.Words(lane)
    res = bytearray(4)
    assert w.take_call_ok(5, res, 1_000_000) == (0, 0, 0)  # nothing came
    assert w.load(L.C_PARKED) == 1  # and the client said it sleeps
    call_ok(lane, 5, b"\x01\x02\x03\x04", seq=1)
    assert w.take_call_ok(5, res, 0) == (1, 7, 3) and bytes(res) == b"\x01\x02\x03\x04"
    assert w.seen == 1  # moved with the answer taken
    w.seen = 0
    # Not the plain answer expected: left for the client's checks, the
    # buffer untouched.
    res[:] = b"\x00" * 4
    for rid, seq, result, buf in ((6, 1, b"\x09" * 4, res),       # another request's
                                  (5, 2, b"\x09" * 4, res),       # seq moved by two
                                  (5, 1, b"\x09" * 8, res)):      # longer than the call's data
        call_ok(lane, rid, result, seq)
        assert w.take_call_ok(5, buf, 0) == (2, 0, 0), (rid, seq, result)
        assert bytes(res) == b"\x00" * 4 and w.seen == 0
    err = P.encode(P.Error(5, 15, "mismatch"))
    lane[L.D2C:L.D2C + len(err)] = err
    assert w.take_call_ok(5, res, 0) == (2, 0, 0)
    w.close()


# --- put_call: a small call's frame built in C ------------------------------

VECTORS = os.path.join(os.path.dirname(__file__), "..", "..", "testdata", "vectors.json")
# Each wire dtype as an array typecode put_call reads the dtype from.
_TYPECODES = {P.DT_FLOAT32: "f", P.DT_FLOAT64: "d", P.DT_INT32: "i", P.DT_INT64: "q",
              P.DT_BYTES: "B"}


def _inline_call_vectors() -> list[dict]:
    with open(VECTORS, encoding="utf-8") as f:
        vs = json.load(f)
    # The short way builds calls of version 1's dtypes, inline, with at
    # most a shape in the extension (version 3), and ordered calls only
    # (named ones, version 4, never take the lane).
    return [v for v in vs if v.get("valid", True) and v["decoded"]["type"] == "CALL"
            and not v["decoded"]["flags"] & (P.CALL_SHM | P.CALL_NAMED)
            and v["decoded"]["dtype"] in _TYPECODES
            and not v["decoded"].get("xflags") and v["decoded"]["count"]
            and not v["decoded"]["frame_flags"]
            # a shape is sent only when there is one, and it is the array's
            and (not v["decoded"]["flags"] & P.CALL_EXT or v["decoded"]["dims"]
                 and math.prod(v["decoded"]["dims"]) == v["decoded"]["count"])]


@pytest.mark.parametrize("v", _inline_call_vectors(), ids=lambda v: v["name"])
def test_put_call_builds_the_vectors_frame(lane: mmap.mmap, v: dict) -> None:
    # The frame put_call builds is byte for byte the shared vector's (the
    # Go and C clients' encoders are checked against the same vectors).
    d = v["decoded"]
    want = bytes.fromhex(v["hex"])
    data: object = array.array(_TYPECODES[d["dtype"]], bytes.fromhex(d["data"]))
    ext = bool(d["flags"] & P.CALL_EXT)
    if ext:  # the shape is the array's
        np = pytest.importorskip("numpy")
        data = np.frombuffer(bytearray(bytes.fromhex(d["data"])),
                             _TYPECODES[d["dtype"]]).reshape(d["dims"])
    w = lanewords.Words(lane)
    w.store(L.C_PARKED, 1)
    assert w.put_call(d["id"], d["op"], d["reduce"], d["root"], d["name"].encode("utf-8"),
                      data, d["dtype"] != P.DT_BYTES, 1 << 20, None, 0, ext) == 0
    assert bytes(lane[L.C2D:L.C2D + len(want)]) == want
    assert w.load(L.C2D_SEQ) == 1 == w.own  # published, and counted
    assert w.load(L.C_PARKED) == 0  # and the client said it watches for the answer
    w.close()


def test_put_call_of_numpy_arrays(lane: mmap.mmap) -> None:
    np = pytest.importorskip("numpy")
    w = lanewords.Words(lane)
    for k, (dtype, code) in enumerate((("float32", P.DT_FLOAT32), ("float64", P.DT_FLOAT64),
                                       ("int32", P.DT_INT32), ("int64", P.DT_INT64),
                                       ("<f4", P.DT_FLOAT32), ("uint8", P.DT_BYTES))):
        x = np.arange(6, dtype=dtype).reshape(2, 3)  # any shape, if C-contiguous
        numeric = code != P.DT_BYTES
        assert w.put_call(40 + k, P.OP_BROADCAST, P.RED_NONE, 1, b"n", x, numeric, 4096) == 0
        assert w.own == w.load(L.C2D_SEQ) == k + 1
        want = P.encode_call_head(P.CALL_FIXED_SIZE + 1 + x.nbytes, 40 + k, P.OP_BROADCAST, code,
                                  P.RED_NONE, 0, 1, 6, b"n") + x.tobytes()
        assert bytes(lane[L.C2D:L.C2D + len(want)]) == want, dtype
    w.close()


def test_put_call_says_whether_the_daemon_sleeps(lane: mmap.mmap) -> None:
    w = lanewords.Words(lane)
    w.store(L.D_PARKED, 1)
    assert w.put_call(3, P.OP_ALLREDUCE, P.RED_SUM, 0, b"", array.array("f", [1.0]), True, 64) == 1
    w.store(L.D_PARKED, 0)
    assert w.put_call(4, P.OP_ALLREDUCE, P.RED_SUM, 0, b"", array.array("f", [1.0]), True, 64) == 0
    w.close()
    with pytest.raises(ValueError, match="lane is closed"):
        w.put_call(5, P.OP_ALLREDUCE, P.RED_SUM, 0, b"", array.array("f", [1.0]), True, 64)


def test_put_call_leaves_other_calls_to_the_client(lane: mmap.mmap) -> None:
    # -1 and nothing put, nothing published: the client's general path
    # takes these calls, and names what is wrong with each.
    np = pytest.importorskip("numpy")
    f4 = array.array("f", [1.0, 2.0])
    room = L.FRAME_MAX - P.HEADER_SIZE - P.CALL_FIXED_SIZE
    cases = {
        "not a buffer": (b"", object(), True, 4096),
        "read-only": (b"", b"\x01\x02\x03\x04", False, 4096),
        "not C-contiguous": (b"", np.zeros((4, 4), np.float32)[:, 1], True, 4096),
        "float16": (b"", np.zeros(2, np.float16), True, 4096),
        "big-endian": (b"", np.zeros(2, ">f4"), True, 4096),
        "bytes in an allreduce": (b"", bytearray(4), True, 4096),
        "empty": (b"", array.array("f"), True, 4096),
        "over the inline limit": (b"", f4, True, 7),
        "over the slot": (b"", bytearray(room + 1), False, 1 << 20),
        "name and data over the slot": (b"n", bytearray(room), False, 1 << 20),
        "name over 255 bytes": (b"n" * 256, f4, True, 4096),
    }
    w = lanewords.Words(lane)
    w.store(L.C_PARKED, 1)
    for what, (name, data, numeric, max_data) in cases.items():
        assert w.put_call(9, P.OP_ALLREDUCE, P.RED_SUM, 0, name, data, numeric, max_data) == -1, what
        assert w.load(L.C2D_SEQ) == 0 == w.own and w.load(L.C_PARKED) == 1, what
        assert bytes(lane[L.C2D:L.C2D + 16]) == b"\x00" * 16, what
    # The largest that fits does go.
    assert w.put_call(9, P.OP_BROADCAST, P.RED_NONE, 0, b"", bytearray(room), False, 1 << 20) == 0
    with pytest.raises(ValueError, match="does not fit its wire width"):
        w.put_call(9, 256, P.RED_SUM, 0, b"", f4, True, 4096)
    w.close()


def test_put_call_through_a_scratch_segment(lane: mmap.mmap) -> None:
    # Data too long for the slot goes through the client's scratch segment:
    # copied there, and the CALL refers to it (SHM, offset 0), byte for byte
    # what the client's encoder makes of the same call.
    np = pytest.importorskip("numpy")
    w = lanewords.Words(lane)
    scratch = mmap.mmap(-1, 1 << 16)
    x = np.arange(2000, dtype=np.float64)  # 16000 bytes
    assert w.put_call(21, P.OP_ALLREDUCE, P.RED_MAX, 0, b"bucket", x, True, 1 << 18,
                      memoryview(scratch), 7) == 0
    call = P.Call(21, P.OP_ALLREDUCE, P.DT_FLOAT64, P.RED_MAX, 2000, 0, "bucket",
                  flags=P.CALL_SHM, segment=7, offset=0)
    want = P.encode_call_prefix(call)
    assert bytes(lane[L.C2D:L.C2D + len(want)]) == want
    assert bytes(scratch[:x.nbytes]) == x.tobytes()
    assert w.own == w.load(L.C2D_SEQ) == 1
    # Longer than the scratch segment, or than max_data: left to the client.
    assert w.put_call(22, P.OP_ALLREDUCE, P.RED_MAX, 0, b"", np.zeros(9000), True, 1 << 18,
                      memoryview(scratch), 7) == -1
    assert w.put_call(22, P.OP_ALLREDUCE, P.RED_MAX, 0, b"", x, True, 8192,
                      memoryview(scratch), 7) == -1
    assert w.own == 1
    # The scratch segment is the client's own: one it cannot write is a bug, said.
    with pytest.raises(BufferError):
        w.put_call(22, P.OP_ALLREDUCE, P.RED_MAX, 0, b"", x, True, 1 << 18, b"read-only", 7)
    w.close()
    scratch.close()


def test_put_call_with_the_shape(lane: mmap.mmap) -> None:
    # Version 3: with shape, the frame carries data's shape in the CALL
    # extension, byte for byte what the client's encoder makes of the
    # call, inline and through a scratch segment; a 0-d array has none.
    np = pytest.importorskip("numpy")
    w = lanewords.Words(lane)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert w.put_call(5, P.OP_ALLREDUCE, P.RED_SUM, 0, b"s", x, True, 4096, None, 0, True) == 0
    want = P.encode(P.Call(5, P.OP_ALLREDUCE, P.DT_FLOAT32, P.RED_SUM, 6, name="s",
                           flags=P.CALL_EXT, data=x.tobytes(), dims=(2, 3)))
    assert bytes(lane[L.C2D:L.C2D + len(want)]) == want
    s = np.full((), 2.5)  # 0-d
    assert w.put_call(6, P.OP_BROADCAST, P.RED_NONE, 1, b"", s, False, 4096, None, 0, True) == 0
    want = P.encode(P.Call(6, P.OP_BROADCAST, P.DT_FLOAT64, P.RED_NONE, 1, root=1,
                           data=s.tobytes()))
    assert bytes(lane[L.C2D:L.C2D + len(want)]) == want
    scratch = mmap.mmap(-1, 1 << 16)
    y = np.arange(2 * 3 * 400, dtype=np.int64).reshape(2, 3, 400)
    assert w.put_call(7, P.OP_ALLREDUCE, P.RED_MAX, 0, b"", y, True, 1 << 18,
                      memoryview(scratch), 9, True) == 0
    want = P.encode_call_prefix(P.Call(7, P.OP_ALLREDUCE, P.DT_INT64, P.RED_MAX, 2400,
                                       flags=P.CALL_SHM | P.CALL_EXT, segment=9, offset=0,
                                       dims=(2, 3, 400)))
    assert bytes(lane[L.C2D:L.C2D + len(want)]) == want
    assert bytes(scratch[:y.nbytes]) == y.tobytes()
    assert w.own == w.load(L.C2D_SEQ) == 3
    # More than 8 dimensions: left to the client, which says what is wrong.
    z = np.zeros((1,) * 9, np.float32)
    assert w.put_call(8, P.OP_ALLREDUCE, P.RED_SUM, 0, b"", z, True, 4096, None, 0, True) == -1
    # The shape counts against the slot: data that fits without it may not with it.
    room = L.FRAME_MAX - P.HEADER_SIZE - P.CALL_FIXED_SIZE
    big = bytearray(room)
    assert w.put_call(9, P.OP_BROADCAST, P.RED_NONE, 0, b"", big, False, 1 << 20, None, 0,
                      True) == -1
    assert w.own == 3
    w.close()
    scratch.close()
