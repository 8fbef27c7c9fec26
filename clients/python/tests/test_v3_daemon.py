"""Version 3's collectives through the Python client against real daemons:
every (collective x dtype x reduce op) on worlds of 1x1, 2x1, 1x3, 2x2 and
3x2 (nodes x trainers a node), checked bit for bit against v3ref (the
order and roundings of docs/PROTOCOL.md and ring/doc.go); then what a
bad call earns, from the client and from the daemon, and that the world
goes on after it."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import collectived
from collectived import _protocol as P
from collectived._client import _Ext

import trainer_v3 as T3
from worlds import JOB, World, on_every


@pytest.mark.parametrize("nodes,local", [(1, 1), (2, 1), (1, 3), (2, 2), (3, 2)],
                         ids=["1x1", "2x1", "1x3", "2x2", "3x2"])
def test_every_collective_dtype_op(collectived_bin: str, nodes: int, local: int) -> None:
    pytest.importorskip("ml_dtypes", reason="NumPy's bfloat16 (ml_dtypes) is not installed: run "
                                            "scripts/setup.sh")
    w = World(collectived_bin, nodes, local, collective_timeout="60s")
    try:
        w.start()
        # Shapes on (Client(shapes=True)): every call carries its array's.
        results = w.run(T3.run_matrix, timeout=900, client_kw={"shapes": True})
    finally:
        w.stop()
    want = len(T3.cases(nodes * local))
    assert want > 100
    for r, res in enumerate(results):
        assert res["rank"] == r and res["version"] == 4
        assert res["done"] == want, res
        assert res["nfails"] == 0, f"world rank {r}: {res['nfails']} failed:\n" + "\n".join(
            res["fails"])


# ------------------------------------------------------------ bad calls


def _clients(w: World) -> list[collectived.Client]:
    out = []
    for r in range(w.size):
        sock, lr = w.trainer_args(r)
        out.append(collectived.Client(sock, job=JOB, local_rank=lr, label=f"test_v3 {r}",
                                      rank_retry=5.0, timeout=60.0, shapes=True))
    return out


_on_every = on_every


@pytest.fixture(scope="module")
def world22(collectived_bin: str):
    w = World(collectived_bin, 2, 2, collective_timeout="20s")
    w.start()
    cs = _clients(w)
    try:
        yield w, cs
    finally:
        for c in cs:
            c.close()
        w.stop()


def _gather_step(cs: list[collectived.Client], step: int) -> None:
    """An allgather every trainer makes: the world goes on."""
    got = _on_every(cs, lambda i, c: c.allgather(np.array([step, i], np.int32)).tolist())
    want = [v for i in range(len(cs)) for v in (step, i)]
    assert got == [want] * len(cs), got


def test_client_refuses_bad_calls_and_the_world_goes_on(world22) -> None:
    w, cs = world22
    _gather_step(cs, 1)
    # Trainer 1 makes each bad call before its good one; the others make
    # only the good one. A refused call is not sent: it joins nothing.
    bad: list[tuple[Callable[[collectived.Client], Any], type, str]] = [
        (lambda c: c.allgatherv(np.ones(3, np.float32), [1, 2, 1, 1]), collectived.UsageError,
         r"allgatherv: counts\[1\] \(this rank's\) is 2, but x holds 3 elements"),
        (lambda c: c.allgatherv(np.ones(3, np.float32), [3, 3, 1]), collectived.UsageError,
         "counts has 3 entries; the world has 4 ranks"),
        (lambda c: c.reduce(np.ones(2, np.float32), 4), collectived.UsageError,
         r"reduce root 4 outside world of 4 \(world ranks 0 to 3\)"),
        (lambda c: c.allreduce(np.ones(2, np.int64), "avg"), collectived.UsageError,
         "reduce op avg needs a float dtype .* got int64"),
        (lambda c: c.allreduce(np.ones(2, np.complex64)), collectived.DTypeError,
         "has complex64 .*supported: float32"),
        (lambda c: c.allgather(np.ones(2, np.bool_)), collectived.DTypeError, "has bool"),
    ]

    def step(i: int, c: collectived.Client) -> list:
        errs = []
        if i == 1:
            for call, _, _ in bad:
                try:
                    call(c)
                    errs.append(None)
                except collectived.CollectivedError as e:
                    errs.append(e)
        x = np.full(2, float(i), np.float32)
        c.allreduce(x, "avg")
        return errs + [x.tolist()]

    got = _on_every(cs, step)
    for i, res in enumerate(got):
        assert not isinstance(res, BaseException), f"trainer {i}: {res!r}"
        assert res[-1] == [1.5, 1.5], (i, res)
    for e, (_, kind, words) in zip(got[1][:-1], bad):
        assert isinstance(e, kind) and e.code is None, repr(e)
        import re
        assert re.search(words, str(e)), str(e)
    _gather_step(cs, 2)


def _raw(c: collectived.Client, op: int, red: int, root: int, x: np.ndarray, dtype: int,
         counts: Any = None) -> Any:
    """A call as the client's checks would never send it: straight to the
    daemon, whose refusal it returns."""
    from collectived._buffers import as_buffer

    buf = as_buffer(x, numeric=True)
    buf.dtype = dtype
    ext = _Ext(buf.shape, counts)
    try:
        if op in (P.OP_ALLGATHER, P.OP_REDUCE_SCATTER):
            out = as_buffer(np.zeros(64, x.dtype))
            out.count = P.result_count(op, buf.count, c.size, c.rank, counts)
            out.view = out.view[:out.count * x.itemsize]
            c._collective_out(op, red, "", buf, out, out.owner, ext, 0).wait(30)
        else:
            c._collective(op, red, root, "", buf, x, ext).wait(30)
        return None
    except collectived.CollectivedError as e:
        return e


def test_daemon_refuses_what_the_client_would_not_send(world22) -> None:
    # The same bad calls as raw frames: the daemon answers BAD_REQUEST
    # naming the field, the call joins no collective, and the world goes on.
    w, cs = world22
    _gather_step(cs, 3)
    raws = [
        (lambda c: _raw(c, P.OP_ALLREDUCE, P.RED_AVG, 0, np.ones(2, np.int32), P.DT_INT32),
         "avg needs a float dtype, got int32"),
        (lambda c: _raw(c, P.OP_REDUCE, P.RED_SUM, 7, np.ones(2, np.float32), P.DT_FLOAT32),
         "reduce root 7 outside world of 4"),
        (lambda c: _raw(c, P.OP_ALLGATHER, 0, 0, np.ones(3, np.float32), P.DT_FLOAT32,
                        (1, 2, 1, 1)),
         r"allgather count 3 but counts\[1\] = 2"),
        (lambda c: _raw(c, P.OP_ALLREDUCE, P.RED_SUM, 0, np.ones(2, np.float32), 10),
         "unknown dtype code 10"),
    ]

    def step(i: int, c: collectived.Client) -> list:
        errs = [f(c) for f, _ in raws] if i == 1 else []
        x = np.full(3, i, np.int8)
        c.allreduce(x)
        return errs + [x.tolist()]

    got = _on_every(cs, step)
    for i, res in enumerate(got):
        assert not isinstance(res, BaseException), f"trainer {i}: {res!r}"
        assert res[-1] == [6, 6, 6], (i, res)
    import re
    for e, (_, words) in zip(got[1][:-1], raws):
        assert isinstance(e, collectived.BadRequestError), repr(e)
        assert not e.fatal and re.search(words, e.message), e.message
    _gather_step(cs, 4)


def test_shapes_are_matched(world22) -> None:
    w, cs = world22
    _gather_step(cs, 5)

    # The same count in other shapes: MISMATCH naming both shapes.
    def shaped(i: int, c: collectived.Client) -> Any:
        x = np.ones((2, 3) if i == 0 else (3, 2), np.float32)
        return c.allreduce(x)

    for e in _on_every(cs, shaped):
        assert isinstance(e, collectived.MismatchError), repr(e)
        assert "(2,3)" in e.message and "(3,2)" in e.message, e.message

    # A v allgather's first dimension is each rank's own; the rest must agree.
    def rows(i: int, c: collectived.Client) -> Any:
        x = np.full((i, 2), i, np.int64)
        return c.allgatherv(x, [0, 2, 4, 6]).tolist()

    want = [[v, v] for v in (1, 2, 2, 3, 3, 3)]
    assert _on_every(cs, rows) == [want] * 4
    # A NumPy 1-d array and a Python buffer of the same count send the same shape.
    import array

    def mixed(i: int, c: collectived.Client) -> Any:
        x: Any = array.array("f", [1.0] * 4) if i % 2 else np.ones(4, np.float32)
        c.allreduce(x)
        return list(x)

    assert _on_every(cs, mixed) == [[4.0] * 4] * 4
    _gather_step(cs, 6)


def test_torch_half_types(world22) -> None:
    torch = pytest.importorskip("torch")
    w, cs = world22

    def step(i: int, c: collectived.Client) -> Any:
        h = torch.full((2, 3), float(i + 1), dtype=torch.float16)
        b = torch.full((4,), 0.5 * (i + 1), dtype=torch.bfloat16)
        c.allreduce(h, "avg")
        g = c.allgather(b)
        s = c.reduce_scatter(torch.arange(8, dtype=torch.bfloat16), op="sum")
        u = c.reduce(torch.full((3,), i, dtype=torch.uint8), 0, "max")
        return (h.tolist(), g.dtype == torch.bfloat16, g.float().tolist(), s.float().tolist(),
                u.tolist())

    got = _on_every(cs, step)
    for i, (h, is_bf16, g, s, u) in enumerate(got):
        assert h == [[2.5] * 3] * 2 and is_bf16
        assert g == [0.5 * (r + 1) for r in range(4) for _ in range(4)]
        assert s == [4.0 * (2 * i), 4.0 * (2 * i + 1)]
        assert u == ([3, 3, 3] if i == 0 else [i] * 3)
