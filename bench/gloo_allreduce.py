"""The torch.distributed Gloo side of bench/compare: one rank.

Times dist.all_reduce (float32, sum, in place, CPU tensors) the way
`collectived bench` times its allreduce: first `prewarm` untimed calls of
one element, then per size one checked call,
`warmup` untimed calls, then `iters` back-to-back timed calls (no barrier
between them), the tensor refilled before the last one and checked after
it. Rank 0 prints one JSON object per size with its per-call times; the
caller computes median and p99 from them, as for every other system.
With --in-flight K each timed call is K all_reduces started at once
(async_op=True), each on a tensor of its own, then waited for, as
`collectived bench --in-flight K` times them; every tensor is checked.
With --tensors FILE (bench/resnet50_shapes.txt) each timed call is a
training step instead: all_reduce of every tensor of FILE (float32, of
its shape), one by one in the file's order, as `collectived bench
--tensors` times its steps; one row, bytes all the tensors', calls their
number.

Run W copies with --rank 0..W-1 and the same --init (tcp://127.0.0.1:PORT).
Needs Debian's python3-torch, so run it with /usr/bin/python3.
"""

import argparse
import datetime
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tensors as tensorfile  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--init", required=True, help="tcp://127.0.0.1:PORT or file:///path")
    ap.add_argument("--sizes", help="comma-separated byte counts")
    ap.add_argument("--tensors", help="a file of named tensors (bench/resnet50_shapes.txt): time steps of all_reduce "
                    "on each, one by one in its order, instead of --sizes")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--prewarm", type=int, default=0, help="untimed one-element calls before the first size")
    ap.add_argument("--timeout", type=float, default=120, help="seconds Gloo may wait for the other ranks")
    ap.add_argument("--in-flight", type=int, default=1, help="all_reduces started at once per timed call")
    a = ap.parse_args()
    if a.iters < 1 or a.warmup < 0 or a.prewarm < 0:
        ap.error(f"--iters {a.iters} must be >= 1, --warmup {a.warmup} and --prewarm {a.prewarm} >= 0")
    if not 1 <= a.in_flight <= 64:
        ap.error(f"--in-flight {a.in_flight}: want 1 to 64")
    if (a.sizes is None) == (a.tensors is None):
        ap.error("give --sizes or --tensors")
    if a.tensors and a.in_flight != 1:
        ap.error("--in-flight and --tensors: a step's all_reduces are made one by one")
    step = None
    if a.tensors:
        try:
            step = tensorfile.read(a.tensors)
        except (OSError, ValueError) as e:
            ap.error(f"--tensors: {e}")
    sizes = []
    for f in a.sizes.split(",") if a.sizes else []:
        try:
            sizes.append(int(f))
        except ValueError:
            ap.error(f"--sizes: {f!r} is not a byte count")

    # Keep Gloo on loopback whatever the host name resolves to.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=a.init, rank=a.rank, world_size=a.world,
                            timeout=datetime.timedelta(seconds=a.timeout))
    tri = a.world * (a.world + 1) // 2
    one = torch.zeros(1, dtype=torch.float32)  # as collectived bench's prewarm: the sum stays 0
    for _ in range(a.prewarm):
        dist.all_reduce(one, op=dist.ReduceOp.SUM)
    if step is not None:
        return _step(a, step, tri, torch, dist)
    for size in sizes:
        n = max(1, size // 4)
        pattern = (torch.arange(n, dtype=torch.int64) % 7 + 1).to(torch.float32)
        bufs = [pattern * (a.rank + 1) for _ in range(a.in_flight)]
        want = pattern * tri

        def call() -> None:
            if len(bufs) == 1:
                dist.all_reduce(bufs[0], op=dist.ReduceOp.SUM)
                return
            for w in [dist.all_reduce(b, op=dist.ReduceOp.SUM, async_op=True) for b in bufs]:
                w.wait()

        def wrong() -> bool:
            return not all(torch.equal(b, want) for b in bufs)

        call()
        if wrong():
            print(f"gloo rank {a.rank}: {n * 4} bytes: wrong sum after the first call", file=sys.stderr)
            return 1
        for _ in range(a.warmup):
            call()
        times = []
        for i in range(a.iters):
            if i == a.iters - 1:
                for b in bufs:
                    b.copy_(pattern * (a.rank + 1))
            t0 = time.perf_counter_ns()
            call()
            times.append(time.perf_counter_ns() - t0)
        if wrong():
            print(f"gloo rank {a.rank}: {n * 4} bytes: wrong sum after the timed calls", file=sys.stderr)
            return 1
        if a.rank == 0:
            print(json.dumps({"bytes": n * 4, "in_flight": a.in_flight, "times_ns": times}), flush=True)
    dist.destroy_process_group()
    return 0


def _step(a, step, tri, torch, dist) -> int:
    """Steps of all_reduce on every tensor of step, one by one in order:
    one checked, `warmup` untimed, `iters` timed, the last refilled and
    checked. Each tensor holds (i mod 7 + 1) x (rank + 1) at element i."""
    bufs = [torch.empty(shape, dtype=torch.float32) for _, shape in step]
    pats = [(torch.arange(b.numel(), dtype=torch.int64) % 7 + 1).to(torch.float32).view(b.shape) for b in bufs]

    def fill() -> None:
        for b, p in zip(bufs, pats):
            torch.mul(p, a.rank + 1, out=b)

    def call() -> None:
        for b in bufs:
            dist.all_reduce(b, op=dist.ReduceOp.SUM)

    def wrong():
        for (name, _), b, p in zip(step, bufs, pats):
            if not torch.equal(b, p * tri):
                return name
        return None

    fill()
    call()
    if bad := wrong():
        print(f"gloo rank {a.rank}: tensor {bad}: wrong sum after the first step", file=sys.stderr)
        return 1
    for _ in range(a.warmup):
        call()
    times = []
    for i in range(a.iters):
        if i == a.iters - 1:
            fill()
        t0 = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - t0)
    if bad := wrong():
        print(f"gloo rank {a.rank}: tensor {bad}: wrong sum after the timed steps", file=sys.stderr)
        return 1
    if a.rank == 0:
        print(json.dumps({"bytes": 4 * sum(b.numel() for b in bufs), "calls": len(bufs),
                          "tensors": os.path.basename(a.tensors), "times_ns": times}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
