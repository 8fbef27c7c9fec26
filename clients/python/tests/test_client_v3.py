"""The client's version-3 calls (allgather, allgatherv, reduce_scatter,
reduce_scatterv, reduce; float16, bfloat16, int8, uint8; avg, prescale,
postscale; shapes) against the scripted peer: what each sends, byte for
byte where it matters, which way its data goes (inline, zero copy, a
scratch segment), where its result lands, and what the client refuses
before sending anything. A world of 2 identical trainers (this one is
rank 0): see scripted_daemon.py for what it answers."""

from __future__ import annotations

import array
from typing import Iterator

import numpy as np
import pytest

import collectived
from collectived import _protocol as P

from scripted_daemon import ScriptedDaemon


@pytest.fixture(params=["lane", "socket"])
def fake3(request: pytest.FixtureRequest, tmp_path) -> Iterator[ScriptedDaemon]:
    d = ScriptedDaemon(str(tmp_path / "d.sock"), version=3, inline_limit=4096)
    d.no_lane = request.param == "socket"  # type: ignore[attr-defined]
    yield d
    d.close()


@pytest.fixture
def c3(fake3: ScriptedDaemon) -> Iterator[collectived.Client]:
    with collectived.Client(fake3.path, job="demo", timeout=10.0, shapes=True,
                            no_lane=fake3.no_lane) as c:  # type: ignore[attr-defined]
        assert c.info.version == 3
        yield c


def test_allreduce_sends_the_shape(c3: collectived.Client, fake3: ScriptedDaemon) -> None:
    x = np.ones((2, 3), np.float32)
    c3.allreduce(x)  # the short way, on the lane
    c3.allreduce_async(x).wait()  # the general way
    y = np.ones((), np.float64)
    c3.allreduce(y)  # 0-d: no shape, no extension
    z = array.array("i", [1, 2, 3])
    c3.allreduce(z)  # a Python buffer: one dimension
    seg = c3.zeros((4, 2, 200), "int64")  # shared memory (and over the lane's slot)
    c3.allreduce(seg, "max")
    got = [(m.flags, m.shape, m.count) for m in fake3.calls]
    assert got == [(P.CALL_EXT, (2, 3), 6), (P.CALL_EXT, (2, 3), 6), (0, (), 1),
                   (P.CALL_EXT, (3,), 3), (P.CALL_EXT | P.CALL_SHM, (4, 2, 200), 1600)]
    assert (x == 4).all() and float(y) == 2.0 and list(z) == [2, 4, 6]


def test_without_shapes_none_is_sent(fake3: ScriptedDaemon) -> None:
    # The default: calls match by count, as the Go client's do.
    with collectived.Client(fake3.path, job="demo",
                            no_lane=fake3.no_lane) as c:  # type: ignore[attr-defined]
        c.allreduce(np.ones((2, 3), np.float32))
        c.broadcast(np.ones((2, 2), np.int8), 1)
        c.allgather(np.ones((2, 2), np.float32))
    assert [(m.flags & P.CALL_EXT, m.shape) for m in fake3.calls] == [(0, ()), (0, ()),
                                                                      (P.CALL_EXT, ())]


def test_more_than_eight_dimensions_is_refused(c3: collectived.Client,
                                               fake3: ScriptedDaemon) -> None:
    x = np.ones((1,) * 9, np.float32)
    with pytest.raises(collectived.UsageError, match=r"9 dimensions; the protocol carries at "
                                                     r"most 8: reshape it, or make the Client "
                                                     r"without shapes=True"):
        c3.allreduce(x)
    assert fake3.calls == []


@pytest.mark.parametrize("n", [0, 1, 3, 2000])  # 2000 x 4 bytes x 2: over the inline limit
def test_allgather_paths(c3: collectived.Client, fake3: ScriptedDaemon, n: int) -> None:
    x = np.arange(n, dtype=np.float32)
    out = c3.allgather(x)
    assert out.shape == (2 * n,) and out.dtype == np.float32
    assert (out == np.concatenate([x, x])).all()
    m = fake3.calls[-1]
    assert (m.op, m.dtype, m.count, m.shape, m.counts) == (P.OP_ALLGATHER, P.DT_FLOAT32, n, (n,),
                                                           None)
    assert bool(m.flags & P.CALL_SHM) == (2 * n * 4 > 4096)  # through a scratch segment
    if m.flags & P.CALL_SHM:
        assert m.segment == m.out[0] and m.out[1] >= n * 4  # two spans, apart
    # Zero copy: both in the client's shared memory.
    xs, outs = c3.zeros(n, "float32"), c3.zeros(2 * n, "float32")
    xs[:] = x
    before = c3.bytes_sent
    assert c3.allgather(xs, outs) is outs
    assert (outs == np.concatenate([x, x])).all()
    m = fake3.calls[-1]
    if n:
        assert m.flags == P.CALL_SHM | P.CALL_EXT and m.out is not None
        assert c3.bytes_sent - before < 128  # a description, not the data
    else:
        assert not m.flags & P.CALL_SHM


def test_allgather_shapes_and_types(c3: collectived.Client) -> None:
    out = c3.allgather(np.arange(6, dtype=np.int8).reshape(3, 2))  # one-byte: as bytes
    assert out.shape == (6, 2) and out.dtype == np.int8
    assert out.tolist() == [[0, 1], [2, 3], [4, 5]] * 2
    s = c3.allgather(np.full((), 7, np.int64))  # 0-d: one element a rank
    assert s.shape == (2,) and s.tolist() == [7, 7]
    b = c3.allgather(bytearray(b"ab"))
    assert isinstance(b, bytearray) and b == b"abab"
    a = c3.allgather(array.array("f", [1.0, 2.0]))  # no NumPy: a memoryview of the format
    assert isinstance(a, memoryview) and a.format == "f" and a.tolist() == [1.0, 2.0] * 2
    h = c3.allgather(np.array([1.5, -2.0], np.float16))
    assert h.dtype == np.float16 and h.tolist() == [1.5, -2.0, 1.5, -2.0]


def test_allgather_in_place(c3: collectived.Client, fake3: ScriptedDaemon) -> None:
    # x is this rank's own block of out, both in shared memory: the one
    # overlap the protocol allows, and no copy.
    out = c3.zeros(8, "float64")
    out[:4] = [1, 2, 3, 4]
    c3.allgather(out[:4], out)
    assert out.tolist() == [1, 2, 3, 4] * 2
    m = fake3.calls[-1]
    assert m.flags & P.CALL_SHM and m.segment == m.out[0] and m.offset == m.out[1]


def test_allgatherv(c3: collectived.Client, fake3: ScriptedDaemon) -> None:
    x = np.array([5, 6, 7], np.int32)
    out = c3.allgatherv(x, [3, 2])
    assert out.tolist() == [5, 6, 7, 0, 0]
    m = fake3.calls[-1]
    assert (m.count, m.counts, m.shape) == (3, (3, 2), (3,))
    # A 2-d x: rows of the inner dimension when every count is whole rows.
    y = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert c3.allgatherv(y, [6, 4]).shape == (5, 2)
    assert c3.allgatherv(y, [6, 3]).shape == (9,)
    # This rank gives nothing: an empty input span, at its own block of
    # the (shared) output.
    out = c3.zeros(4, "int32")
    c3.allgatherv(np.zeros(0, np.int32), [0, 4], out)
    m = fake3.calls[-1]
    assert m.count == 0 and m.flags & P.CALL_SHM and (m.segment, m.offset) == m.out
    assert out.tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("n", [2, 6, 4000])
def test_reduce_scatter(c3: collectived.Client, fake3: ScriptedDaemon, n: int) -> None:
    x = np.arange(n, dtype=np.float64)
    out = c3.reduce_scatter(x)
    assert out.shape == (n // 2,) and (out == 2 * x[:n // 2]).all()
    m = fake3.calls[-1]
    assert (m.op, m.reduce, m.count, m.shape) == (P.OP_REDUCE_SCATTER, P.RED_SUM, n, (n,))
    # Zero copy, into a given out; and avg with scale factors.
    xs, outs = c3.zeros(n, "float64"), c3.zeros(n // 2, "float64")
    xs[:] = x
    assert c3.reduce_scatter(xs, outs, "avg", prescale=0.5, postscale=3.0) is outs
    assert (outs == 1.5 * x[:n // 2]).all()
    m = fake3.calls[-1]
    assert m.flags & P.CALL_SHM and m.reduce == P.RED_AVG and m.scale == (0.5, 3.0)


def test_reduce_scatterv(c3: collectived.Client, fake3: ScriptedDaemon) -> None:
    x = np.arange(5, dtype=np.int64)
    assert c3.reduce_scatterv(x, [2, 3], op="sum").tolist() == [0, 2]
    assert fake3.calls[-1].counts == (2, 3)
    # This rank's block is empty: its empty out span lies at its own block
    # of the input.
    xs = c3.zeros(5, "int64")
    got = c3.reduce_scatterv(xs, [0, 5])
    assert got.shape == (0,)
    m = fake3.calls[-1]
    assert m.flags & P.CALL_SHM and m.out == (m.segment, m.offset)


def test_reduce(c3: collectived.Client, fake3: ScriptedDaemon) -> None:
    x = np.array([1.0, 2.0], np.float32)
    assert c3.reduce(x, root=1, op="sum") is x
    m = fake3.calls[-1]
    assert (m.op, m.root, m.reduce, m.shape) == (P.OP_REDUCE, 1, P.RED_SUM, (2,))
    h = c3.reduce_async(np.ones(3, np.uint8), 0, "max")
    assert h.wait().tolist() == [1, 1, 1] and fake3.calls[-1].dtype == P.DT_UINT8


def test_allreduce_avg_and_scale(c3: collectived.Client, fake3: ScriptedDaemon) -> None:
    x = np.ones(3, np.float32)
    c3.allreduce(x, "avg")
    assert fake3.calls[-1].reduce == P.RED_AVG and fake3.calls[-1].scale is None
    c3.allreduce(x, prescale=2.0)
    assert fake3.calls[-1].scale == (2.0, 1.0)
    c3.allreduce(x, prescale=1.0, postscale=1.0)  # no scaling: no SCALE
    assert fake3.calls[-1].scale is None


def test_dtypes_on_the_wire(c3: collectived.Client, fake3: ScriptedDaemon) -> None:
    cases = [(np.float16, "allreduce", P.DT_FLOAT16), (np.int8, "allreduce", P.DT_INT8),
             (np.uint8, "allreduce", P.DT_UINT8), (np.uint8, "broadcast", P.DT_BYTES),
             (np.int8, "allgather", P.DT_BYTES), (np.float16, "broadcast", P.DT_FLOAT16)]
    for dt, op, code in cases:
        x = np.ones(4, dt)
        if op == "broadcast":
            c3.broadcast(x, 0)
        else:
            getattr(c3, op)(x)
        assert fake3.calls[-1].dtype == code, (dt, op)


def test_bfloat16_from_ml_dtypes(c3: collectived.Client, fake3: ScriptedDaemon) -> None:
    ml = pytest.importorskip("ml_dtypes")
    x = np.array([1.0, -2.5, 3.0], dtype=ml.bfloat16)
    c3.allreduce(x, "max")
    m = fake3.calls[-1]
    assert m.dtype == P.DT_BFLOAT16 and m.count == 3 and m.shape == (3,)
    assert bytes(m.data) == x.tobytes()
    g = c3.allgather(x)
    assert g.dtype == x.dtype and g.astype(np.float32).tolist() == [1.0, -2.5, 3.0] * 2


def test_refused_before_sending(c3: collectived.Client, fake3: ScriptedDaemon) -> None:
    f4 = np.ones(4, np.float32)
    i4 = np.ones(4, np.int32)
    cases = [
        (lambda: c3.allgatherv(f4, [4]), collectived.UsageError,
         "allgatherv: counts has 1 entries; the world has 2 ranks"),
        (lambda: c3.allgatherv(f4, [3, 4]), collectived.UsageError,
         r"allgatherv: counts\[0\] \(this rank's\) is 3, but x holds 4 elements"),
        (lambda: c3.allgatherv(f4, [4, -1]), collectived.UsageError, r"counts\[1\] is -1"),
        (lambda: c3.allgatherv(f4, ["a", 1]), collectived.UsageError,
         "counts must be a sequence of integers"),
        (lambda: c3.reduce_scatterv(f4, [1, 2]), collectived.UsageError,
         "reduce_scatterv: counts sum to 3, but x holds 4 elements"),
        (lambda: c3.reduce_scatter(np.ones(3, np.float32)), collectived.UsageError,
         "x holds 3 elements, not a multiple of the world size 2"),
        (lambda: c3.reduce(f4, root=2), collectived.UsageError,
         r"reduce root 2 outside world of 2 \(world ranks 0 to 1\)"),
        (lambda: c3.reduce(f4, root=-1), collectived.UsageError, "reduce root -1 outside"),
        (lambda: c3.broadcast(f4, root=5), collectived.UsageError, "broadcast root 5 outside"),
        (lambda: c3.allreduce(i4, "avg"), collectived.UsageError,
         "reduce op avg needs a float dtype .* got int32: sum the integers and divide"),
        (lambda: c3.reduce_scatter(np.ones(4, np.uint8), op="avg"), collectived.UsageError,
         "avg needs a float dtype .* got uint8"),
        (lambda: c3.allreduce(i4, prescale=2.0), collectived.UsageError,
         "prescale and postscale apply to a sum or avg of a float dtype, not sum of int32"),
        (lambda: c3.allreduce(f4, "max", postscale=2.0), collectived.UsageError,
         "not max of float32"),
        (lambda: c3.allreduce(f4, prescale=0.0), collectived.UsageError,
         "prescale is 0.0; it must be finite and nonzero"),
        (lambda: c3.allreduce(f4, postscale=float("inf")), collectived.UsageError,
         "postscale is inf"),
        (lambda: c3.allgather(f4, np.ones(7, np.float32)), collectived.UsageError,
         "out holds 7 elements; the result has 8"),
        (lambda: c3.allgather(f4, np.ones(8, np.float64)), collectived.DTypeError,
         "out has float64 elements, x has float32"),
        (lambda: c3.allreduce(np.ones(2, np.complex64)), collectived.DTypeError,
         "has complex64 .*supported: float32, float64, float16, bfloat16"),
        (lambda: c3.allgather(np.ones(2, np.bool_)), collectived.DTypeError, "has bool"),
        (lambda: c3.allreduce(memoryview(bytearray(2)).cast("c")), collectived.DTypeError,
         r"holds untyped bytes \(element format 'c'\), which cannot be reduced"),
        (lambda: c3.allreduce(np.ones(2, "S1")), collectived.DTypeError, r"has \|S1"),
    ]
    for i, (call, kind, words) in enumerate(cases):
        with pytest.raises(kind, match=words) as ei:
            call()
        assert ei.value.code is None, i
    assert fake3.calls == [], "a refused call was sent"
    # Refused calls join no collective: the next goes on as the first.
    c3.allreduce(f4)
    assert len(fake3.calls) == 1 and (f4 == 2).all()


def test_reduce_of_bytes_is_numbers(c3: collectived.Client, fake3: ScriptedDaemon) -> None:
    # A bytearray in a reduction is uint8, not refused (NumPy would agree).
    b = bytearray(b"\x01\x02")
    c3.reduce(b, 0, "max")
    assert fake3.calls[-1].dtype == P.DT_UINT8


@pytest.mark.parametrize("version", [1, 2])
def test_older_daemon_needs_version_3(tmp_path, version: int) -> None:
    d = ScriptedDaemon(str(tmp_path / "d.sock"), version=version)
    try:
        with collectived.Client(d.path, job="demo") as c:
            assert c.info.version == version
            f4 = np.ones(4, np.float32)
            for call, words in [
                (lambda: c.allgather(f4), "allgather needs protocol version 3"),
                (lambda: c.allgather_async(f4), "allgather needs protocol version 3"),
                (lambda: c.allgatherv(f4, [4, 4]), "allgatherv needs protocol version 3"),
                (lambda: c.reduce_scatter(f4), "reduce_scatter needs protocol version 3"),
                (lambda: c.reduce_scatterv(f4, [2, 2]), "reduce_scatterv needs protocol version 3"),
                (lambda: c.reduce(f4, 0), "reduce needs protocol version 3"),
                (lambda: c.reduce_async(f4, 0), "reduce needs protocol version 3"),
                (lambda: c.allreduce(f4, "avg"), "reduce op avg needs protocol version 3"),
                (lambda: c.allreduce(f4, prescale=0.5), "prescale and postscale need protocol "
                                                        "version 3"),
                (lambda: c.allreduce(np.ones(2, np.float16)), "dtype float16 needs protocol version 3"),
                (lambda: c.allreduce(np.ones(2, np.int8)), "dtype int8 needs protocol version 3"),
                (lambda: c.broadcast(np.ones(2, np.float16), 0), "dtype float16 needs protocol "
                                                                 "version 3"),
            ]:
                with pytest.raises(collectived.NeedsVersionError,
                                   match=words + rf"; the daemon at .* speaks version {version} "
                                                 "on this connection") as ei:
                    call()
                assert isinstance(ei.value, collectived.UnsupportedError)
            # What version 1 and 2 have goes on, without the extension.
            x = np.ones((2, 2), np.float32)
            c.allreduce(x)
            c.broadcast(np.ones(3, np.uint8), 1)  # one-byte: bytes, as before
            assert [(m.flags, m.shape) for m in d.calls] == [(0, ()), (0, ())]
            assert d.calls[1].dtype == P.DT_BYTES and (x == 2).all()
    finally:
        d.close()


def test_result_of_the_wrong_length_is_a_protocol_error(tmp_path) -> None:
    # An allgather's inline CALL_OK must carry the op table's size (here
    # 2 x 3 elements): one 4 bytes short fails the call, naming both.
    d = ScriptedDaemon(str(tmp_path / "d.sock"), version=3, inline_limit=4096)
    try:
        with collectived.Client(d.path, job="demo", timeout=10.0) as c:
            assert c.lane
            with pytest.raises(collectived.ProtocolError,
                               match=r"allgather\(name='lane-short', count=3\): CALL_OK result "
                                     r"is 20 bytes, the call's result has 24"):
                c.allgather(np.ones(3, np.float32), name="lane-short")
    finally:
        d.close()
