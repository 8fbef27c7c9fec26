"""Handles' futures against real daemons: add_done_callback, as_future and
exception(), with no thread waiting; errors keep their class and are
RuntimeErrors (tests/future_fns.py runs the trainers' side)."""

from __future__ import annotations

import pytest

import collectived
import future_fns as F
from worlds import World


def test_callbacks_2x2(world_2x2: World) -> None:
    size = world_2x2.size
    res = world_2x2.run(F.callbacks)
    total = float(sum(range(1, size + 1)))
    for r in res:
        assert r["called"]
        # called once, done then, and the value is there
        assert r["seen"] == [(True, [total] * 5)]
        assert r["late_here"]
        assert r["order"] == [1, 3]
        assert r["broadcast"] == [0, 2, 4, 6]  # world rank 1's, (rank 1 + 1) * arange
        assert r["many"]
        assert r["many_values"] == [float(i * size) for i in range(len(r["many_values"]))]


def test_futures_and_error_classes_2x2(world_2x2: World) -> None:
    res = world_2x2.run(F.futures)
    for r in res:
        assert r["is_future"] and r["same"]
        assert r["value"] == [2.0 ** world_2x2.size] * 3
        assert r["cancel"] is False
        assert r["error"] == "MismatchError" and r["runtime"]
        assert r["exception_none"]
        assert r["handle_exception"] == "MismatchError"
        assert r["wait_raises"] == "MismatchError"


def test_every_error_is_a_runtime_error() -> None:
    for name in collectived.__all__:
        obj = getattr(collectived, name)
        if isinstance(obj, type) and issubclass(obj, BaseException) and obj is not collectived.FrameError:
            assert issubclass(obj, RuntimeError), name
    # and keeps its other bases
    assert issubclass(collectived.CollectiveTimeoutError, TimeoutError)
    assert issubclass(collectived.UsageError, ValueError)
    assert issubclass(collectived.DTypeError, TypeError)
    import pickle
    e = collectived.errors.error_for(18, "trainer 3 of node 1 lost", request="allreduce")
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is collectived.TrainerLostError and isinstance(e2, RuntimeError)
    assert str(e2) == str(e)


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
