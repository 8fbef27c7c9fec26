"""The lane's C extension (collectived._lanewords) on its own, on a real
shared mapping: its checks of what it is given, and take_call_ok's three
answers (taken, left for the client's checks, nothing came)."""

from __future__ import annotations

import mmap
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
        short.take_call_ok(0, 1, bytearray(0), 0)


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
    assert w.take_call_ok(0, 5, res, 1_000_000) == (0, 0, 0)  # nothing came
    assert w.load(L.C_PARKED) == 1  # and the client said it sleeps
    call_ok(lane, 5, b"\x01\x02\x03\x04", seq=1)
    assert w.take_call_ok(0, 5, res, 0) == (1, 7, 3) and bytes(res) == b"\x01\x02\x03\x04"
    # Not the plain answer expected: left for the client's checks, the
    # buffer untouched.
    res[:] = b"\x00" * 4
    for rid, seq, result, buf in ((6, 1, b"\x09" * 4, res),       # another request's
                                  (5, 2, b"\x09" * 4, res),       # seq moved by two
                                  (5, 1, b"\x09" * 8, res)):      # longer than the call's data
        call_ok(lane, rid, result, seq)
        assert w.take_call_ok(0, 5, buf, 0) == (2, 0, 0), (rid, seq, result)
        assert bytes(res) == b"\x00" * 4
    err = P.encode(P.Error(5, 15, "mismatch"))
    lane[L.D2C:L.D2C + len(err)] = err
    assert w.take_call_ok(0, 5, res, 0) == (2, 0, 0)
    w.close()
