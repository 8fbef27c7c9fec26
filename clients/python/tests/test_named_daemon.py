"""Named calls (``ordered=False``, protocol version 4; /tmp/named_spec.md,
issue 27) against real daemons, 2 nodes x 2 trainers, each trainer a
thread with its own Client: every op, in a random order per trainer,
inline and through shared memory, results exact against NumPy; ordered
calls as fences between batches of them; a name whose calls differ gets
MISMATCH on every trainer and the world goes on; a second call of a name
in flight is refused by the client, and the first still completes."""

from __future__ import annotations

import threading
from typing import Any, Iterator

import numpy as np
import pytest

import collectived
from worlds import JOB, World, on_every


@pytest.fixture
def clients(world_2x2: World) -> Iterator[list[collectived.Client]]:
    cs = []
    try:
        for r in range(world_2x2.size):
            sock, lr = world_2x2.trainer_args(r)
            cs.append(collectived.Client(sock, job=JOB, local_rank=lr, rank_retry=5.0,
                                         timeout=60.0, label=f"test_named {r}"))
        yield cs
    finally:
        for c in cs:
            c.close()


def _ok(results: list[Any]) -> list[Any]:
    for i, r in enumerate(results):
        if isinstance(r, BaseException):
            raise AssertionError(f"trainer {i} raised {r!r}") from r
    return results


# A batch of named calls: (name, op, dtype, count). Counts over the
# daemon's inline limit (64 KiB here) go through a scratch segment.
BATCH = [(f"ar.{dt}.{n}", "allreduce", dt, n) for dt in ("float32", "float64", "int32", "int64")
         for n in (1, 5, 3000)] + [
    ("ar.big", "allreduce", "float32", 100_003),
    ("ar.max", "allreduce_max", "int64", 17),
    ("ar.avg", "allreduce_avg", "float64", 33),
    ("bc.0", "broadcast", "float32", 9),
    ("bc.3", "broadcast", "int8", 20_000),
    ("ag", "allgather", "int32", 7),
    ("rs", "reduce_scatter", "float64", 4 * 6),
    ("rd.2", "reduce", "int64", 11),
    ("bar", "barrier", "", 0),
]


def _input(rank: int, name: str, dtype: str, n: int) -> np.ndarray:
    """Small integers (as floats too): every sum is exact in any order."""
    rng = np.random.default_rng([rank, sum(name.encode())])
    return rng.integers(-50, 50, size=n).astype(dtype) if n else np.zeros(0, "float32")


def _want(size: int, rank: int, name: str, op: str, dtype: str, n: int) -> np.ndarray:
    xs = np.stack([_input(r, name, dtype, n) for r in range(size)])
    if op in ("allreduce", "reduce"):
        s = xs.sum(axis=0).astype(dtype)
        return s if op == "allreduce" or rank == 2 else xs[rank]
    if op == "allreduce_max":
        return xs.max(axis=0)
    if op == "allreduce_avg":
        return (xs.sum(axis=0) / size).astype(dtype)
    if op == "broadcast":
        return xs[int(name.split(".")[1])]
    if op == "allgather":
        return xs.reshape(-1)
    if op == "reduce_scatter":
        return xs.sum(axis=0).astype(dtype).reshape(size, -1)[rank]
    return np.zeros(0, "float32")


def _start(c: collectived.Client, name: str, op: str, x: np.ndarray) -> collectived.Handle:
    kw = {"name": name, "ordered": False}
    if op in ("allreduce", "allreduce_max", "allreduce_avg"):
        return c.allreduce_async(x, {"allreduce": "sum", "allreduce_max": "max",
                                     "allreduce_avg": "avg"}[op], **kw)
    if op == "broadcast":
        return c.broadcast_async(x, int(name.split(".")[1]), **kw)
    if op == "allgather":
        return c.allgather_async(x, **kw)
    if op == "reduce_scatter":
        return c.reduce_scatter_async(x, **kw)
    if op == "reduce":
        return c.reduce_async(x, 2, **kw)
    return c.barrier_async(**kw)


def _batch_in_random_order(c: collectived.Client, i: int, seed: int) -> list[str]:
    """Every call of BATCH, in an order of this trainer's own; the
    failures (empty: all exact)."""
    rng = np.random.default_rng([seed, c.rank])
    order = rng.permutation(len(BATCH))
    handles = []
    for k in order:
        name, op, dt, n = BATCH[k]
        x = _input(c.rank, name, dt, n)
        shm = rng.random() < 0.3 and n > 0  # some from the client's shared memory
        if shm:
            y = c.empty(n, dt)
            y[:] = x
            x = y
        handles.append((name, op, dt, n, x, _start(c, name, op, x)))
    fails = []
    for name, op, dt, n, x, h in reversed(handles):  # waited for in another order again
        got = h.wait()
        want = _want(c.size, c.rank, name, op, dt, n)
        got = x if got is None else got
        if op != "barrier" and not np.array_equal(np.asarray(got).reshape(-1), want.reshape(-1)):
            fails.append(f"{name} ({op} {dt} x{n}): got {np.asarray(got).reshape(-1)[:5]}..., "
                         f"want {want.reshape(-1)[:5]}...")
    return fails


def test_named_calls_in_random_orders(clients: list[collectived.Client]) -> None:
    assert all(c.info.version == 4 for c in clients)
    assert len(BATCH) < clients[0].info.max_in_flight  # every call of a batch in flight at once
    for seed in range(3):
        fails = _ok(on_every(clients, lambda i, c: _batch_in_random_order(c, i, seed)))
        assert fails == [[]] * len(clients), f"seed {seed}: {fails}"


def test_ordered_calls_fence_named_batches(clients: list[collectived.Client]) -> None:
    # Batches of the same names, each in its own random order, with
    # ordered calls between them: the k-th call of a name meets the k-th.
    def run(i: int, c: collectived.Client) -> list[str]:
        fails = []
        for b in range(3):
            fails += _batch_in_random_order(c, i, 100 + b)
            s = c.allreduce(np.array([c.rank + b], np.int64))  # ordered: a fence
            if int(s[0]) != 6 + 4 * b:
                fails.append(f"fence {b}: {s}")
        return fails
    assert _ok(on_every(clients, run)) == [[]] * len(clients)
    status = clients[0].status()
    named = status.get("named")
    assert named is not None, sorted(status)
    assert named["executed"] >= 3 * len(BATCH) and not named.get("pending"), named


def test_same_name_other_desc_is_a_mismatch(clients: list[collectived.Client]) -> None:
    # Rank 0's "m" has another count than the others': MISMATCH for all.
    def run(i: int, c: collectived.Client) -> Any:
        x = np.ones(4 if c.rank else 5, np.float32)
        other = c.allreduce_async(np.ones(3, np.float32), name="fine", ordered=False)
        try:
            c.allreduce(x, name="m", ordered=False)
            err: Any = None
        except collectived.CollectivedError as e:
            err = e
        try:
            other.wait()
        except collectived.CollectivedError:
            pass  # may fail with the failure: a named call until the next ordered call
        return err
    errs = on_every(clients, run)
    for i, e in enumerate(errs):
        assert isinstance(e, collectived.MismatchError), f"trainer {i}: {e!r}"
        assert "count=5" in str(e) or "count=4" in str(e), str(e)

    # The world goes on: an ordered call (which may itself report the
    # failure), then named calls afresh.
    def after(i: int, c: collectived.Client) -> list[float]:
        try:
            c.barrier()
        except collectived.MismatchError:
            c.barrier()
        return c.allreduce(np.full(2, c.rank, np.float32), name="m", ordered=False).tolist()
    assert _ok(on_every(clients, after)) == [[6.0, 6.0]] * len(clients)


def test_second_call_of_a_name_in_flight_is_refused(clients: list[collectived.Client]) -> None:
    # Rank 0's first "x" waits for the others, who call it only once rank 0
    # has tried a second one.
    tried = threading.Event()

    def run(i: int, c: collectived.Client) -> Any:
        x = np.full(3, c.rank + 1, np.int32)
        if c.rank == 0:
            h = c.allreduce_async(x, name="x", ordered=False)
            try:
                c.allreduce_async(np.zeros(3, np.int32), name="x", ordered=False)
                refused: Any = None
            except ValueError as e:
                refused = e
            finally:
                tried.set()
            return refused, h.wait().tolist()
        assert tried.wait(30)
        return None, c.allreduce(x, name="x", ordered=False).tolist()
    res = _ok(on_every(clients, run))
    refused = res[0][0]
    assert isinstance(refused, collectived.UsageError), refused
    assert "a named call of name 'x' is already in flight on this client" in str(refused)
    assert [r[1] for r in res] == [[10, 10, 10]] * len(clients)
    # The refused call took no place in matching: the world goes on.
    assert _ok(on_every(clients, lambda i, c: c.allreduce(
        np.ones(1, np.int64), name="x", ordered=False).tolist())) == [[4]] * len(clients)


def test_named_calls_do_not_take_the_lane(clients: list[collectived.Client]) -> None:
    assert all(c.lane for c in clients)
    before = [c.lane_answers for c in clients]
    got = _ok(on_every(clients, lambda i, c: [
        c.allreduce(np.ones(2, np.float32), name=f"small.{k}", ordered=False).tolist()
        for k in range(5)]))
    assert got == [[[4.0, 4.0]] * 5] * len(clients)
    assert [c.lane_answers for c in clients] == before
    # Ordered calls still do.
    _ok(on_every(clients, lambda i, c: c.allreduce(np.ones(2, np.float32))))
    assert all(c.lane_answers > b for c, b in zip(clients, before))

