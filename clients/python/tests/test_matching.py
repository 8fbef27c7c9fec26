"""The desyncs of issue 24 through the Python client, against real daemons:
each gave a silent wrong answer or the wrong error before its fix
(docs/MATCHING.md has the rules). Trainers are threads, each with its own
Client (its own connection and rank)."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

import numpy as np
import pytest

import collectived
from worlds import JOB, World, on_every


def _clients(w: World) -> list[collectived.Client]:
    out = []
    for r in range(w.size):
        sock, lr = w.trainer_args(r)
        out.append(collectived.Client(sock, job=JOB, local_rank=lr, label=f"test_matching {r}",
                                      rank_retry=5.0, timeout=60.0))
    return out


_on_every = on_every


def _sum_step(cs: list[collectived.Client], step: int) -> None:
    want = sum(step * (i + 1) for i in range(len(cs)))
    got = _on_every(cs, lambda i, c: int(c.allreduce(np.array([step * (i + 1)], np.int32))[0]))
    assert got == [want] * len(cs), f"step {step}: {got}, want {want} everywhere"


def _expect(errs: list[Any], kind: type, *words: str) -> None:
    for i, e in enumerate(errs):
        assert isinstance(e, kind), f"trainer {i}: {e!r}, want {kind.__name__}"
        for w in words:
            assert w in str(e), f"trainer {i}: {e} does not name {w!r}"


@pytest.mark.parametrize("calls,words", [
    ((("b", 0, 4, ""), ("b", 1, 4, "")), ("root=0", "root=1")),
    ((("b", 0, 4, ""), ("a", 0, 4, "")), ("broadcast(", "allreduce(")),
    ((("b", 0, 4, ""), ("b", 0, 3, "")), ("count=4", "count=3")),
    ((("b", 0, 4, "a"), ("b", 0, 4, "b")), ()),
], ids=["roots differ", "root against allreduce", "counts differ", "names differ"])
def test_broadcast_mismatch_every_trainer(fresh_world_2x1: World, calls: tuple, words: tuple) -> None:
    cs = _clients(fresh_world_2x1)
    try:
        _sum_step(cs, 1)
        bufs = [np.full(calls[i][2], i + 1, np.float32) for i in range(2)]

        def call(i: int, c: collectived.Client) -> None:
            op, root, _, name = calls[i]
            if op == "b":
                c.broadcast(bufs[i], root, name=name)
            else:
                c.allreduce(bufs[i], name=name)

        _expect(_on_every(cs, call), collectived.MismatchError, *words)
        for i, b in enumerate(bufs):
            assert (b == i + 1).all(), f"trainer {i}'s buffer changed: {b}"
        for step in (2, 3, 4):
            _sum_step(cs, step)
    finally:
        for c in cs:
            c.close()


def test_late_starters_mix_no_steps(collectived_bin: str) -> None:
    w = World(collectived_bin, 2, 2, collective_timeout="2s", first_call="2s", stall_warning="1s")
    w.start()
    try:
        steps = 6
        results: list[list[Any]] = [[None] * steps for _ in range(4)]

        def trainer(rank: int) -> None:
            if rank:
                time.sleep(5)
            sock, lr = w.trainer_args(rank)
            with collectived.Client(sock, job=JOB, local_rank=lr, timeout=60.0) as c:
                for s in range(1, steps + 1):
                    try:
                        results[rank][s - 1] = int(c.allreduce(np.array([s], np.int32))[0])
                    except collectived.CollectivedError as e:
                        results[rank][s - 1] = e

        ts = [threading.Thread(target=trainer, args=(r,), daemon=True) for r in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
            assert not t.is_alive()
        ok = 0
        for s in range(steps):
            col = [results[r][s] for r in range(4)]
            failed = [isinstance(x, Exception) for x in col]
            assert all(failed) or not any(failed), f"step {s + 1}: {col}"
            if not any(failed):
                assert col == [4 * (s + 1)] * 4, f"step {s + 1}: sums of other steps: {col}"
                ok += 1
            else:
                for x in col:
                    assert isinstance(x, collectived.CollectiveTimeoutError), f"step {s + 1}: {x!r}"
        assert isinstance(results[0][0], Exception), "step 1 cannot succeed: the others came 5 s late"
        assert ok > 0, f"no step succeeded: {results}"
    finally:
        w.stop()


def test_local_mismatch_first_of_generation(fresh_world_2x2: World) -> None:
    cs = _clients(fresh_world_2x2)
    try:
        _sum_step(cs, 1)
        for rnd in range(3):
            errs = _on_every(cs, lambda i, c: c.allreduce(np.zeros(5 if i == 3 else 4, np.float32)))
            _expect(errs, collectived.MismatchError, "count=5")
            vals = [np.array([10 * (i + 1)], np.int32) for i in range(4)]

            def two(i: int, c: collectived.Client) -> Any:
                h = c.allreduce_async(np.zeros(8 if i == 1 else 4, np.float32))
                q = c.allreduce_async(vals[i])
                try:
                    h.wait()
                    first: Any = None
                except collectived.CollectivedError as e:
                    first = e
                q.wait()
                return first

            _expect(_on_every(cs, two), collectived.MismatchError, "count=8")
            assert [int(v[0]) for v in vals] == [100] * 4, f"round {rnd}: queued calls gave {vals}"
        _sum_step(cs, 2)
    finally:
        for c in cs:
            c.close()


@pytest.mark.parametrize("warm,bound", [(False, 4.0), (True, 2.0)], ids=["first call", "later call"])
def test_cross_node_timeout_within_bound(collectived_bin: str, warm: bool, bound: float) -> None:
    margin = collectived.TIMEOUT_MARGIN
    w = World(collectived_bin, 2, 1, collective_timeout="2s", first_call="4s", stall_warning="1s")
    w.start()
    cs = _clients(w)
    try:
        if warm:
            _sum_step(cs, 1)
        late: list[Optional[BaseException]] = [None]

        def late_call() -> None:
            time.sleep(bound + margin + 3)
            try:
                cs[1].allreduce(np.array([1], np.int32))
            except BaseException as e:  # noqa: BLE001
                late[0] = e

        t = threading.Thread(target=late_call, daemon=True)
        t.start()
        t0 = time.monotonic()
        with pytest.raises(collectived.CollectiveTimeoutError) as ei:
            cs[0].allreduce(np.array([1], np.int32))
        took = time.monotonic() - t0
        assert "not called by world rank 1 (node 1, local rank 0, pid" in str(ei.value), ei.value
        assert bound - 0.1 <= took <= bound + margin, f"TIMEOUT after {took:.2f} s, bound {bound} s"
        t.join(60)
        assert isinstance(late[0], collectived.CollectiveTimeoutError), repr(late[0])
        _sum_step(cs, 2)
    finally:
        for c in cs:
            c.close()
        w.stop()
