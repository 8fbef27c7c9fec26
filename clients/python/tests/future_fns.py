"""Trainer bodies for test_futures.py (module-level so that they pickle):
handles' done callbacks and futures against real daemons."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from typing import Any

import numpy as np

import collectived


def callbacks(c: collectived.Client) -> dict[str, Any]:
    """Callbacks of calls no one waits for, of one already done, and of
    more calls in flight than the daemon's max_in_flight."""
    out: dict[str, Any] = {}
    me = threading.get_ident()
    # No one waits: the reader thread completes the handle and calls back.
    x = np.full(5, float(c.rank + 1), dtype=np.float32)
    h = c.allreduce_async(x)
    seen: list[tuple[bool, Any]] = []
    ev = threading.Event()

    def cb(handle: collectived.Handle) -> None:
        seen.append((handle.done(), handle.wait(0).tolist()))
        ev.set()
    h.add_done_callback(cb)
    # This thread only waits on the event: the call ends through the
    # client's own threads (or, had it ended already, the add called back).
    out["called"] = ev.wait(60)
    out["seen"] = seen
    # Added after the end: called at once, in this thread.
    late: list[int] = []
    h.add_done_callback(lambda hh: late.append(threading.get_ident()))
    out["late_here"] = late == [me]
    # Several callbacks, in the order added; one that raises is logged and
    # the others still run.
    order: list[int] = []
    ev2 = threading.Event()
    h2 = c.broadcast_async(np.arange(4, dtype=np.int64) * (c.rank + 1), root=1)
    h2.add_done_callback(lambda hh: order.append(1))
    h2.add_done_callback(lambda hh: 1 // 0)
    h2.add_done_callback(lambda hh: (order.append(3), ev2.set()))
    ev2.wait(60)
    out["order"] = order
    out["broadcast"] = h2.wait().tolist()
    # Many calls in flight, none waited for: every callback comes.
    n = 3 * max(c.info.max_in_flight, 1) + 5
    done = threading.Semaphore(0)
    arrays = [np.full(3, float(i), dtype=np.float64) for i in range(n)]
    for a in arrays:
        c.allreduce_async(a).add_done_callback(lambda hh: done.release())
    out["many"] = all(done.acquire(timeout=60) for _ in range(n))
    out["many_values"] = [float(a[0]) for a in arrays]
    return out


def futures(c: collectived.Client) -> dict[str, Any]:
    """as_future: result, the error's own class, and a failed call."""
    out: dict[str, Any] = {}
    x = np.full(3, 2.0, dtype=np.float32)
    f = c.allreduce_async(x, op="prod").as_future()
    out["is_future"] = isinstance(f, concurrent.futures.Future)
    out["same"] = f.result(60) is x
    out["value"] = x.tolist()
    out["cancel"] = f.cancel()
    # A mismatch (rank 0 sends 3 elements, the others 4): every rank's
    # future fails with MismatchError, which is also a RuntimeError.
    y = np.ones(3 if c.rank == 0 else 4, dtype=np.float32)
    g = c.allreduce_async(y, name="mismatched").as_future()
    e = g.exception(60)
    out["error"] = type(e).__name__
    out["runtime"] = isinstance(e, RuntimeError)
    h = c.allreduce_async(np.ones(2, dtype=np.float32), name="after")
    out["exception_none"] = h.exception(60) is None
    # The handle's own exception() on a failed call returns the error.
    z = np.ones(1 if c.rank == 0 else 2, dtype=np.int32)
    hz = c.allreduce_async(z, name="mismatched-again")
    ez = hz.exception(60)
    out["handle_exception"] = type(ez).__name__
    try:
        hz.wait(0)
    except RuntimeError as err:  # what torch-style code catches
        out["wait_raises"] = type(err).__name__
    return out


def logging_setup() -> None:
    logging.basicConfig(level=logging.ERROR)
