"""A trainer of `collectived bench` written with the Python client:
`collectived bench --trainer-cmd "PYTHON bench/py_trainer.py"` starts one per
trainer in place of its Go `bench-trainer`, with the same flags, and reads
the same rows from world rank 0's stdout (one JSON object per size:
bytes, times_ns, path, lane). What a Python trainer waits for a collective,
measured as the Go one is: per size a checked call on known values, warmup
calls, then the timed calls, the last on known values and checked again.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import Any, Callable, Optional

import numpy as np

import collectived

_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
_DURATION = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_size(s: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*(B|KiB|MiB|GiB)?\s*", s)
    if not m:
        raise ValueError(f"size {s!r}: want bytes, optionally with KiB, MiB or GiB")
    return int(m.group(1)) * _UNITS[m.group(2) or ""]


def parse_duration(s: str) -> float:
    """A Go duration string (what `collectived bench` passes: "0s",
    "200µs", "-1ns", "1m30s") in seconds."""
    if s in ("0", ""):
        return 0.0
    sign, rest = (-1.0, s[1:]) if s.startswith("-") else (1.0, s)
    parts = re.findall(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)", rest)
    if not parts or "".join(n + u for n, u in parts) != rest:
        raise ValueError(f"duration {s!r}: want a Go duration such as 200us or 1.5ms")
    return sign * sum(float(n) * _DURATION[u] for n, u in parts)


def value(i: np.ndarray, rank: int, op: str) -> np.ndarray:
    """What rank contributes at elements i (cmd/collectived's value)."""
    if op == "prod":
        return np.where((i + rank) % 3 == 0, -1.0, 1.0)
    return ((rank + 1) * (i % 7 + 1)).astype(np.float64)


def expected(i: np.ndarray, size: int, op: str) -> np.ndarray:
    k = (i % 7 + 1).astype(np.float64)
    if op == "sum":
        return k * (size * (size + 1) // 2)
    if op == "max":
        return k * size
    if op == "min":
        return k
    p = np.ones(len(i))
    for w in range(size):
        p *= value(i, w, op)
    return p


def one_size(c: collectived.Client, size: int, dtype: str, op: str, iters: int, warmup: int,
             prewarm: Optional[Callable[[], None]],
             between: Optional[Callable[[], None]], in_flight: int = 1) -> dict[str, Any]:
    item = np.dtype(dtype).itemsize
    count = max(size // item, 1)
    path = "inline"
    if count * item > c.inline_limit:
        # Daemon segments: zero copy, as the Go trainer's Alloc.
        xs = [c.zeros(count, dtype) for _ in range(in_flight)]
        path = "shm"
    else:
        xs = [np.zeros(count, dtype) for _ in range(in_flight)]
    idx = np.arange(count)
    if prewarm is not None:
        prewarm()

    def fill() -> None:
        for x in xs:
            x[:] = value(idx, c.rank, op).astype(dtype)

    def check() -> None:
        want = expected(idx, c.size, op).astype(dtype)
        for i, x in enumerate(xs):
            if not np.array_equal(x, want):
                bad = int(np.flatnonzero(x != want)[0])
                which = f"buffer {i + 1} of {in_flight} in flight: " if in_flight > 1 else ""
                raise RuntimeError(f"{which}wrong result at element {bad}: got {x[bad]}, "
                                   f"want {want[bad]}")

    if in_flight == 1:
        x = xs[0]

        def call() -> None:
            c.allreduce(x, op)
    else:
        def call() -> None:
            # --in-flight: start them all, then wait for each.
            for h in [c.allreduce_async(x, op) for x in xs]:
                h.wait()

    fill()
    call()
    check()
    for _ in range(warmup):
        if between is not None:
            between()
        call()
    times = []
    for k in range(iters):
        if k == iters - 1:
            fill()
        if between is not None:
            between()
        t0 = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - t0)
    check()
    return {"bytes": count * item, "times_ns": times, "path": path,
            "lane": getattr(c, "lane", False)}  # clients before the lane have no such property


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--local-rank", type=int, default=-1)
    ap.add_argument("--sizes", required=True)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64", "int32", "int64"])
    ap.add_argument("--op", default="sum", choices=["sum", "prod", "max", "min"])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--prewarm", type=int, default=0)
    ap.add_argument("--between", default="")
    ap.add_argument("--in-flight", type=int, default=1,
                    help="calls started at once per timed iteration, then waited for (bench --in-flight)")
    ap.add_argument("--spin", default="0s", help="Client spin as a Go duration (0: the client's "
                    "default; negative: never watch the lane)")
    ap.add_argument("--inline-max", type=int, default=0)
    ap.add_argument("--no-lane", default="false", choices=["true", "false"])
    a = ap.parse_args(argv)
    if a.inline_max != 0:
        ap.error("--inline-max: the Python client has no such option; give 0")
    if not 1 <= a.in_flight <= 64:
        ap.error(f"--in-flight {a.in_flight}: want 1 to 64")
    try:
        sizes = [parse_size(s) for s in a.sizes.split(",")]
        spin = parse_duration(a.spin)
        if a.between:
            parse_size(a.between)
    except ValueError as e:
        ap.error(str(e))
    kw: dict[str, Any] = {} if spin == 0 else {"spin": max(spin, 0.0)}
    if a.no_lane == "true":
        kw["no_lane"] = True
    with collectived.Client(a.socket, job=a.job, local_rank=a.local_rank, label="py_trainer",
                            **kw) as c:
        between = None
        if a.between:
            bn = max(parse_size(a.between) // np.dtype(a.dtype).itemsize, 1)
            bx = c.zeros(bn, a.dtype) if bn * np.dtype(a.dtype).itemsize > c.inline_limit \
                else np.zeros(bn, a.dtype)

            def between() -> None:
                c.allreduce(bx, a.op)
        one = np.zeros(1, a.dtype)

        def prewarm() -> None:
            for _ in range(a.prewarm):
                c.allreduce(one, a.op)
        for i, size in enumerate(sizes):
            try:
                row = one_size(c, size, a.dtype, a.op, a.iters, a.warmup,
                               prewarm if i == 0 and a.prewarm else None, between, a.in_flight)
            except Exception as e:
                print(f"py_trainer: world rank {c.rank}, size {size}: {e}", file=sys.stderr)
                return 1
            if c.rank == 0:
                print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
