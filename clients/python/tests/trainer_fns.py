"""Trainer bodies run in spawned processes by tests/worlds.py (module-level so
that they pickle). Each takes a connected Client first."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import collectived

DTYPES = ("float32", "float64", "int32", "int64")
OPS = ("sum", "prod", "max", "min")
PATHS = ("inline", "segment", "registered", "scratch")


def make_input(rank: int, dtype: str, op: str, n: int) -> np.ndarray:
    """Deterministic per-rank data; products stay small enough not to overflow."""
    rng = np.random.default_rng(rank * 1000 + DTYPES.index(dtype) * 10 + OPS.index(op))
    if op == "prod":
        v = rng.choice([-2, -1, 1, 2], size=n) if "int" in dtype else rng.uniform(0.5, 1.5, n)
    elif "int" in dtype:
        v = rng.integers(-1000, 1000, size=n)
    else:
        v = rng.standard_normal(n)
    return np.asarray(v).astype(dtype)


def reference(size: int, dtype: str, op: str, n: int) -> np.ndarray:
    stack = np.stack([make_input(r, dtype, op, n) for r in range(size)])
    f = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[op]
    return f(stack, axis=0).astype(dtype)


def count_for(path: str, dtype: str, inline_limit: int) -> int:
    item = np.dtype(dtype).itemsize
    if path == "scratch":
        return inline_limit // item + 1000  # just over the inline limit
    if path in ("segment", "registered"):
        # Over the lane's 4 KiB slot at every dtype: smaller arrays, shared
        # or not, go inline on the client's short way.
        return 2000
    return 1000


def every_dtype_op(c: collectived.Client) -> dict:
    out: dict = {"rank": c.rank, "size": c.size, "sent": {}}
    for path in PATHS:
        for dtype in DTYPES:
            for op in OPS:
                n = count_for(path, dtype, c.inline_limit)
                src = make_input(c.rank, dtype, op, n)
                if path in ("segment", "registered"):
                    x = c.empty(n, dtype, register=path == "registered")
                else:
                    x = src.copy()
                x[:] = src
                before = c.bytes_sent
                r = c.allreduce(x, op, name=f"{path}/{dtype}/{op}")
                assert r is x
                out["sent"][(path, dtype, op)] = c.bytes_sent - before
                out[(path, dtype, op)] = np.array(x)
    return out


def many_async(c: collectived.Client, k: int, n: int) -> list:
    assert k <= 64 or c.info.max_in_flight < k, "raise k above max_in_flight"
    xs = [np.full(n, c.rank + i, dtype=np.int64) for i in range(k)]
    xs[k // 2] = c.zeros(n, "int64")
    xs[k // 2][:] = c.rank + k // 2
    hs = [c.allreduce_async(x) for x in xs]
    for h in reversed(hs):
        h.wait()
    assert all(h.done() for h in hs)
    return [np.array(x) for x in xs] + [[(h.generation, h.seq) for h in hs]]


def mismatch(c: collectived.Client) -> dict:
    n = 3 if c.rank == 0 else 4
    out: dict = {}
    try:
        c.allreduce(np.ones(n, np.float32), name="grads")
        out["error"] = None
    except collectived.MismatchError as e:
        out["error"] = (type(e).__name__, e.code, e.code_name, e.message)
    # the connection and the world go on: the next collective works
    x = np.ones(2, np.float32)
    c.allreduce(x)
    out["after"] = x.tolist()
    return out


def broadcast_and_barrier(c: collectived.Client) -> dict:
    root = c.size - 1
    x = np.full(5, c.rank, dtype=np.float64)
    c.broadcast(x, root, name="w")
    big = c.zeros(100_000, "int32")
    big[:] = c.rank
    c.broadcast(big, 0)
    t0 = time.monotonic()
    c.barrier(name="end")
    return {"x": x.tolist(), "big": (int(big.min()), int(big.max())),
            "barrier_s": time.monotonic() - t0}


def info(c: collectived.Client) -> dict:
    return {k: getattr(c, k) for k in ("rank", "size", "local_rank", "local_size",
                                       "node_rank", "node_count", "generation")}


def torch_allreduce(c: collectived.Client) -> Any:
    import torch

    import collectived.torch as ct

    t = torch.full((10,), float(c.rank))
    assert c.allreduce(t) is t  # in place, the tensor itself returned
    # A leaf that requires grad (a parameter) is reduced in place too, its
    # data through a detached view.
    g = torch.full((2,), float(c.rank), requires_grad=True)
    c.allreduce(g)
    assert g.detach().tolist() == [float(sum(range(c.size)))] * 2, g
    h = c.allreduce_async(torch.ones(3, dtype=torch.int64), op="max")
    assert h.wait().tolist() == [1, 1, 1]
    z = ct.zeros(c, 1000, torch.float64)
    assert float(z.abs().max()) == 0.0, "collectived.torch.zeros gave non-zero memory"
    e = ct.empty(c, 10, torch.int32)
    assert e.dtype == torch.int32 and e.shape == (10,)
    # The 16-bit floats in shared memory too: bfloat16 through its bits.
    for dt in (torch.bfloat16, torch.float16, torch.uint8):
        s = ct.zeros(c, (3, 5), dt)
        assert s.dtype == dt and s.shape == (3, 5) and float(s.float().abs().max()) == 0.0
        s += 1
        c.allreduce(s, "max")
        assert float(s.float().min()) == float(s.float().max()) == 1.0
    try:
        ct.empty(c, 3, torch.complex64)
        raise AssertionError("collectived.torch.empty took complex64")
    except collectived.DTypeError as err:
        assert "complex64" in str(err) and "bfloat16" in str(err)
    z += c.rank
    before = c.bytes_sent
    c.allreduce(z, op="max")
    sent = c.bytes_sent - before
    # as_tensor over an array from Client.empty shares its segment too
    a = ct.as_tensor(c.empty(1000, "float32"))
    a.fill_(1.0)
    before = c.bytes_sent
    c.allreduce(a)
    sent = max(sent, c.bytes_sent - before)
    assert float(a.min()) == float(a.max()) == float(c.size)
    # refused before anything is sent: a strided view, unsupported dtypes
    for bad, want in ((torch.ones(4, 4)[:, 1], ValueError),
                      (torch.ones(4, dtype=torch.complex64), collectived.DTypeError),
                      (torch.ones(4, dtype=torch.bool), collectived.DTypeError),
                      (torch.ones(4, dtype=torch.int16), TypeError)):
        try:
            c.allreduce(bad)
            raise AssertionError(f"allreduce took a {bad.dtype} tensor of stride {bad.stride()}")
        except want:
            pass
    return t.tolist(), float(z.max()), sent


def mismatch_rounds(c: collectived.Client, rounds: int) -> list:
    """barrier, a mismatched allreduce, an allreduce: several times over."""
    out = []
    for _ in range(rounds):
        try:
            c.barrier(name="before")
            out.append("barrier ok")
        except collectived.CollectivedError as e:
            out.append(f"barrier {e.code_name}")
        try:
            c.allreduce(np.ones(3 if c.rank == 0 else 4, np.float32))
            out.append("mismatch not detected")
        except collectived.MismatchError:
            out.append("mismatch")
        x = np.ones(1, np.float32)
        try:
            c.allreduce(x)
            out.append(f"after {x[0]}")
        except collectived.CollectivedError as e:
            out.append(f"after {e.code_name}: {e.message[:200]}")
    return out


def segments_until_refused(c: collectived.Client) -> tuple[int, str, float]:
    """Rank 0 makes small arrays in shared memory until the daemon refuses
    one, then drops them; rank 1 makes a few meanwhile. Then both allreduce
    1 MiB (through a scratch segment). Returns how many rank 0 made, the
    refusal's message, and the allreduce's result."""
    import gc
    made, message = 0, ""
    arrays = []
    if c.rank == 0:
        try:
            while made < 10_000:
                arrays.append(c.empty(1, "float32"))
                made += 1
        except collectived.QuotaError as e:
            message = str(e)
    else:
        for _ in range(8):
            arrays.append(c.empty(1, "float32"))
            made += 1
    del arrays
    gc.collect()  # the arrays' segments are freed (FREE) with the next request
    x = np.full(1 << 18, float(c.rank + 1), np.float32)
    c.allreduce(x)
    assert (x == x[0]).all()
    return made, message, float(x[0])


def one_allreduce(c: collectived.Client) -> float:
    x = np.full(8, float(c.rank + 1), np.float32)
    c.allreduce(x)
    return float(x[0])


def lane_use(c: collectived.Client) -> dict:
    """Which calls the lane answered (docs/PROTOCOL.md, LANE), and their
    results: a small inline call, one too big for the lane's 4 KiB slot,
    a shared-memory call, a broadcast, a barrier, and calls in flight at
    once (each small one takes the lane once the one before is answered)."""
    out: dict = {"lane": c.lane, "version": c.info.version, "answered": {}, "sent": {}}

    def step(key: str, f: Any) -> None:
        a, s = c.lane_answers, c.bytes_sent
        out[key] = f()
        out["answered"][key] = c.lane_answers - a
        out["sent"][key] = c.bytes_sent - s

    step("4B", lambda: c.allreduce(np.full(1, c.rank + 1, np.float32)).tolist())
    step("8KiB", lambda: c.allreduce(np.full(2048, c.rank + 1, np.float32))[:2].tolist())
    seg = c.zeros(16384, "float32")

    def in_segment() -> list:
        seg[:] = c.rank + 1
        return c.allreduce(seg)[[0, -1]].tolist()

    step("segment64KiB", in_segment)
    step("broadcast", lambda: c.broadcast(np.full(3, c.rank, np.int64), root=c.size - 1).tolist())
    step("barrier", lambda: c.barrier())

    def two_in_flight() -> list:
        a, b = np.full(2, c.rank, np.float64), np.full(2, 10 * c.rank, np.float64)
        ha, hb = c.allreduce_async(a), c.allreduce_async(b, "max")
        return [ha.wait().tolist(), hb.wait().tolist()]

    step("two_in_flight", two_in_flight)

    def mixed_in_flight() -> list:
        # Small calls behind the lane's are held, and a large one (1 MiB:
        # the socket) behind them, in order: a reordering would mismatch
        # across ranks. Waited for last to first.
        xs = [np.full(1, c.rank + 1, np.float32), np.full(1 << 18, c.rank + 1, np.float32),
              np.full(2, c.rank + 2, np.float32), np.full(4096, c.rank + 3, np.float32)]
        hs = [c.allreduce_async(x) for x in xs]
        got = [h.wait() for h in reversed(hs)][::-1]
        return [[float(x[0]), float(x[-1])] for x in got]

    step("mixed_in_flight", mixed_in_flight)

    def unwaited() -> list:
        # Nobody waits: the reader thread takes each answer the daemon
        # rings for, and sends the call held behind it.
        hs = [c.allreduce_async(np.full(1, c.rank + 1, np.float32)) for _ in range(3)]
        deadline = time.monotonic() + 10
        while not all(h.done() for h in hs) and time.monotonic() < deadline:
            time.sleep(0.01)
        done = [h.done() for h in hs]
        return [done, [h.wait().tolist() for h in hs]]

    step("unwaited", unwaited)
    return out


def calls_beside_status(c: collectived.Client, n: int) -> dict:
    """Small calls on the short way in this thread while another thread
    asks the daemon for its status (a request on the socket, which must
    wait for the lane's call to be taken and never take its answer)."""
    import threading

    stop = threading.Event()
    statuses: list = []
    errors: list = []

    def ask() -> None:
        try:
            while not stop.is_set():
                statuses.append(c.status()["job"])
        except Exception as e:  # reported below, not lost in the thread
            errors.append(repr(e))

    t = threading.Thread(target=ask)
    t.start()
    x = np.zeros(4, np.float32)
    bad = []
    try:
        for k in range(n):
            x[:] = k + c.rank
            c.allreduce(x)
            want = sum(k + r for r in range(c.size))
            if not (x == want).all():
                bad.append((k, x.tolist(), want))
    finally:
        stop.set()
        t.join(30)
    return {"bad": bad[:3], "errors": errors, "statuses": len(statuses),
            "lane_answers": c.lane_answers}
