"""Trainer bodies for the version-3 collectives against real daemons
(test_v3_daemon.py): each trainer runs the whole matrix of collectives x
dtypes x reduce ops x counts in one process, and checks every result bit
for bit against v3ref, which it computes itself from every rank's
(deterministic) inputs. Only failures travel back to the test."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

import collectived
from collectived import _protocol as P

import v3ref as R

try:
    import ml_dtypes

    BF16: Any = ml_dtypes.bfloat16
except ImportError:  # pragma: no cover - setup.sh installs it in .venv
    BF16 = None

#: The large count: 1 MiB + 3 elements (the ring's large path, with a
#: remainder over 2 and 3 nodes).
LARGE = (1 << 20) + 3
OPS = ("sum", "prod", "max", "min", "avg")


def cases(world: int) -> list[dict]:
    """Every call of the matrix, in the order every trainer makes them."""
    small = sorted({0, 1, 3, max(world - 1, 0)})
    out: list[dict] = []
    for coll in ("allreduce", "reduce", "reduce_scatter"):
        for dt in R.DTYPES:
            for op in OPS:
                if op == "avg" and dt in R.INTS:
                    continue
                for n in small:
                    out.append(dict(coll=coll, dtype=dt, op=op, n=n))
        for dt in R.FLOATS:
            out.append(dict(coll=coll, dtype=dt, op="sum", n=3, pre=0.5, post=3.0))
            out.append(dict(coll=coll, dtype=dt, op="avg", n=5, pre=3.0, post=0.25))
    odd = [w % 2 for w in range(world)]  # blocks smaller than the world, some zero
    mixed = [(3 * w) % 4 for w in range(world)]
    for dt in R.DTYPES:
        for op in ("sum", "min"):
            out.append(dict(coll="reduce_scatterv", dtype=dt, op=op, counts=odd))
            out.append(dict(coll="reduce_scatterv", dtype=dt, op=op, counts=mixed))
        for n in small:
            out.append(dict(coll="allgather", dtype=dt, n=n))
        out.append(dict(coll="allgatherv", dtype=dt, counts=odd))
        out.append(dict(coll="allgatherv", dtype=dt, counts=mixed))
        out.append(dict(coll="broadcast", dtype=dt, n=3, root=world - 1))
    # Shared memory: zero copy both ways.
    for dt in ("float16", "bfloat16", "int8", "float64"):
        out.append(dict(coll="allgather", dtype=dt, n=1000, shm=True))
        out.append(dict(coll="reduce_scatter", dtype=dt, op="max", n=1000, shm=True))
        out.append(dict(coll="allreduce", dtype=dt, op="sum", n=5000, shm=True))
    # Overflow to infinity, and NaN through max (docs/PROTOCOL.md, Reductions).
    for dt in ("float16", "bfloat16"):
        out.append(dict(coll="allreduce", dtype=dt, op="sum", n=4, special="big"))
        out.append(dict(coll="allreduce", dtype=dt, op="max", n=4, special="nan"))
    # The large path: 16-bit floats rounded at every hop.
    out.append(dict(coll="allreduce", dtype="float16", op="sum", n=40001))
    out.append(dict(coll="allreduce", dtype="float16", op="sum", n=LARGE))
    out.append(dict(coll="allreduce", dtype="bfloat16", op="avg", n=LARGE, pre=2.0, post=0.5))
    out.append(dict(coll="allreduce", dtype="float32", op="sum", n=LARGE))
    out.append(dict(coll="allreduce", dtype="int8", op="sum", n=LARGE))
    out.append(dict(coll="reduce", dtype="bfloat16", op="sum", n=LARGE))
    big = [LARGE // world + (1 if w < LARGE % world else 0) for w in range(world)]
    big[0] += big[-1] if world > 1 else 0  # uneven, one rank with nothing
    if world > 1:
        big[-1] = 0
    out.append(dict(coll="reduce_scatterv", dtype="float16", op="sum", counts=big))
    out.append(dict(coll="allgather", dtype="bfloat16", n=LARGE // world))
    return out


def _key(i: int, case: dict) -> str:
    return f"{i}:" + ",".join(f"{k}={case[k]}" for k in sorted(case) if k != "counts")


def _input(key: str, rank: int, case: dict, n: int) -> np.ndarray:
    dt, op = case["dtype"], case.get("op", "sum")
    special = case.get("special")
    if special == "big":  # the sum of every rank's overflows the dtype
        v = np.array([65504.0 if dt == "float16" else 3e38, 1.0, -2.0, 60000.0], np.float32)
    elif special == "nan":
        v = np.array([1.0, -1.0, np.nan if rank == 0 else 2.0, 0.5 * rank], np.float32)
    else:
        return R.make_input(key, rank, dt, op, n)
    return R.bf16_from_f32(v) if dt == "bfloat16" else v.astype(dt)


def _as_given(c: collectived.Client, st: np.ndarray, dt: str, shm: bool) -> np.ndarray:
    """The array handed to the client: a copy of the storage array ``st``
    (bfloat16 as ml_dtypes' type), in shared memory with ``shm``."""
    if shm:
        a = c.empty(st.shape, np.uint16 if dt == "bfloat16" else st.dtype)
        a[:] = st
    else:
        a = st.copy()
    return a.view(BF16) if dt == "bfloat16" else a


def _store(a: Any, dt: str) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.uint16) if dt == "bfloat16" else a


def _same(got: np.ndarray, want: np.ndarray, dt: str) -> Optional[str]:
    if got.shape != want.shape:
        return f"shape {got.shape}, want {want.shape}"
    gb, wb = R.bits(got), R.bits(want)
    if dt in R.FLOATS:  # a NaN is a NaN, whatever its payload
        f = R.f32_from_bf16 if dt == "bfloat16" else (lambda a: np.asarray(a, np.float64))
        nan = np.isnan(f(got)) & np.isnan(f(want))
        gb, wb = gb[~nan], wb[~nan]
    bad = np.flatnonzero(gb != wb)
    if not len(bad):
        return None
    i = int(bad[0])
    return (f"{len(bad)} of {gb.size} elements differ; first at {i}: got "
            f"{got.reshape(-1)[i]!r}, want {want.reshape(-1)[i]!r}")


def _one(c: collectived.Client, i: int, case: dict) -> Optional[str]:
    W, N, L, r = c.size, c.node_count, c.local_size, c.rank
    key = _key(i, case)
    coll, dt, op = case["coll"], case["dtype"], case.get("op", "sum")
    pre, post = case.get("pre", 1.0), case.get("post", 1.0)
    shm = case.get("shm", False)
    scale = {} if (pre, post) == (1.0, 1.0) else {"prescale": pre, "postscale": post}
    if coll in ("allreduce", "reduce"):
        xs = [_input(key, w, case, case["n"]) for w in range(W)]
        x = _as_given(c, xs[r], dt, shm)
        ref = R.allreduce(xs, dt, op, N, L, pre, post)
        if coll == "allreduce":
            before = c.bytes_sent
            assert c.allreduce(x, op, name=key[:200], **scale) is x
            if shm and c.bytes_sent - before > 256:
                return f"{c.bytes_sent - before} bytes sent for a call in shared memory"
            return _same(_store(x, dt), ref, dt)
        root = i % W
        assert c.reduce(x, root, op, **scale) is x
        return _same(_store(x, dt), ref if r == root else xs[r], dt)
    if coll in ("reduce_scatter", "reduce_scatterv"):
        counts = case.get("counts")
        n = sum(counts) if counts is not None else case["n"] * W
        xs = [_input(key, w, case, n) for w in range(W)]
        x = _as_given(c, xs[r], dt, shm)
        want = R.reduce_scatter(xs, dt, op, N, L, counts, pre, post)[r]
        if coll == "reduce_scatter":
            out = _as_given(c, np.zeros(case["n"], xs[r].dtype), dt, True) if shm else None
            before = c.bytes_sent
            got = c.reduce_scatter(x, out, op, **scale)
            if shm and (got is not out or c.bytes_sent - before > 256):
                return f"shared memory: {c.bytes_sent - before} bytes sent"
        else:
            got = c.reduce_scatterv(x, counts, op=op, **scale)
        return _same(_store(x, dt), xs[r], dt) or _same(_store(got, dt), want, dt)
    if coll in ("allgather", "allgatherv"):
        counts = case.get("counts")
        ns = counts if counts is not None else [case["n"]] * W
        xs = [_input(key, w, case, ns[w]) for w in range(W)]
        x = _as_given(c, xs[r], dt, shm)
        want = np.concatenate(xs)
        if coll == "allgather":
            out = _as_given(c, np.zeros(W * case["n"], xs[r].dtype), dt, True) if shm else None
            before = c.bytes_sent
            got = c.allgather(x, out)
            if shm and (got is not out or c.bytes_sent - before > 256):
                return f"shared memory: {c.bytes_sent - before} bytes sent"
        else:
            got = c.allgatherv(x, counts)
        return _same(_store(x, dt), xs[r], dt) or _same(_store(got, dt), want, dt)
    if coll == "broadcast":
        xs = [_input(key, w, case, case["n"]) for w in range(W)]
        x = _as_given(c, xs[r], dt, shm)
        c.broadcast(x, case["root"])
        return _same(_store(x, dt), xs[case["root"]], dt)
    raise AssertionError(coll)


def run_matrix(c: collectived.Client) -> dict:
    """Every case of :func:`cases`; returns how many ran and what failed."""
    fails: list[str] = []
    cs = cases(c.size)
    for i, case in enumerate(cs):
        try:
            why = _one(c, i, case)
        except collectived.CollectivedError as e:
            why = f"{type(e).__name__}: {e}"
        if why is not None:
            fails.append(f"{_key(i, case)}: {why}")
    return {"rank": c.rank, "done": len(cs), "fails": fails[:30], "nfails": len(fails),
            "version": c.info.version}
