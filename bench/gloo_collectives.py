"""The torch.distributed Gloo side of bench/compare's collectives other than
allreduce (bench/gloo_allreduce.py has that one): one rank.

Times dist.all_gather, dist.reduce_scatter, dist.reduce and dist.broadcast
(float32 CPU tensors; sum; root 0) the way `collectived bench --op OP`
times its calls: first `prewarm` untimed calls of the smallest size, then
per size one checked call on known values, `warmup` untimed calls, then
`iters` back-to-back timed calls (no barrier between them), the inputs
refilled before the last one and its result checked after it. Rank 0
prints one JSON object per size with its per-call times.

Sizes and known values are `collectived bench --op`'s (and
bench/mpi_collectives.c's): each rank's block for allgather, the whole
input for reducescatter (rounded down to a multiple of world x 4 bytes),
each rank's buffer for reduce and broadcast.

all_gather is the list form (one output tensor per rank, here views of
one tensor): torch 1.13's Gloo has no all_gather_into_tensor ("no support
for _allgather_base in Gloo process group"). It has no reduce_scatter in
any form either ("ProcessGroupGloo does not support reduce_scatter"): for
a call Gloo does not offer, rank 0 prints {"op": OP, "unsupported": the
error} and every rank exits 0, so that the caller can say so.

Run W copies with --rank 0..W-1 and the same --init (tcp://127.0.0.1:PORT),
with Debian's /usr/bin/python3 (python3-torch).
"""

import argparse
import datetime
import json
import os
import sys
import time

OPS = ("allgather", "reducescatter", "reduce", "broadcast")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", required=True, choices=OPS)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--init", required=True, help="tcp://127.0.0.1:PORT or file:///path")
    ap.add_argument("--sizes", required=True, help="comma-separated byte counts")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--prewarm", type=int, default=0, help="untimed smallest calls before the first size")
    ap.add_argument("--timeout", type=float, default=120, help="seconds Gloo may wait for the other ranks")
    a = ap.parse_args()
    if a.iters < 1 or a.warmup < 0 or a.prewarm < 0:
        ap.error(f"--iters {a.iters} must be >= 1, --warmup {a.warmup} and --prewarm {a.prewarm} >= 0")
    sizes = []
    for f in a.sizes.split(","):
        try:
            sizes.append(int(f))
        except ValueError:
            ap.error(f"--sizes: {f!r} is not a byte count")

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=a.init, rank=a.rank, world_size=a.world,
                            timeout=datetime.timedelta(seconds=a.timeout))
    W, r = a.world, a.rank

    def buffers(size):
        n = max(1, size // 4)
        if a.op == "reducescatter":
            n = max(n // W * W, W)
        i = torch.arange(n, dtype=torch.int64)
        if a.op == "allgather":
            inp = ((i + 7 * r) % 127 + 1).to(torch.float32)
            out = torch.zeros(n * W, dtype=torch.float32)
            want = torch.cat([((i + 7 * b) % 127 + 1).to(torch.float32) for b in range(W)])
        elif a.op == "broadcast":
            inp = (i % 127 + 1).to(torch.float32) if r == 0 else torch.zeros(n, dtype=torch.float32)
            out, want = None, (i % 127 + 1).to(torch.float32)
        else:
            k = (i % 7 + 1).to(torch.float32)
            inp = k * (r + 1)
            total = k * (W * (W + 1) // 2)
            if a.op == "reducescatter":
                m = n // W
                out, want = torch.zeros(m, dtype=torch.float32), total[r * m:(r + 1) * m].clone()
            else:
                # Gloo's reduce leaves the other ranks' tensors in no
                # stated state (it reduces in them): only the root's is
                # checked.
                out, want = None, total if r == 0 else None
        return n, inp, out, want

    def caller(n, inp, out):
        if a.op == "allgather":
            outs = list(out.chunk(W))
            return lambda: dist.all_gather(outs, inp)
        if a.op == "reducescatter":
            ins = list(inp.chunk(W))
            return lambda: dist.reduce_scatter(out, ins, op=dist.ReduceOp.SUM)
        if a.op == "reduce":
            return lambda: dist.reduce(inp, 0, op=dist.ReduceOp.SUM)
        return lambda: dist.broadcast(inp, 0)

    try:
        if a.prewarm:
            _, inp, out, _ = buffers(4)
            inp.zero_()  # zeros, as collectived bench's prewarm
            call = caller(1, inp, out)
            for _ in range(a.prewarm):
                call()
        for size in sizes:
            n, inp, out, want = buffers(size)
            fresh = inp.clone()
            call = caller(n, inp, out)

            def refill():
                inp.copy_(fresh)
                if out is not None:
                    out.zero_()

            def wrong() -> bool:
                return want is not None and not torch.equal(out if out is not None else inp, want)

            call()
            if wrong():
                print(f"gloo rank {r}: {a.op} of {n * 4} bytes: wrong result after the first call", file=sys.stderr)
                return 1
            for _ in range(a.warmup):
                call()
            times = []
            for j in range(a.iters):
                if j == a.iters - 1:
                    refill()
                t0 = time.perf_counter_ns()
                call()
                times.append(time.perf_counter_ns() - t0)
            if wrong():
                print(f"gloo rank {r}: {a.op} of {n * 4} bytes: wrong result after the timed calls", file=sys.stderr)
                return 1
            if r == 0:
                total = n * 4 * (W if a.op == "allgather" else 1)
                print(json.dumps({"op": a.op, "bytes": n * 4, "total_bytes": total, "times_ns": times}), flush=True)
    except RuntimeError as e:
        if "not support" not in str(e):
            raise
        # Raised on every rank before anything is sent.
        if r == 0:
            print(json.dumps({"op": a.op, "unsupported": str(e).splitlines()[0]}), flush=True)
        dist.destroy_process_group()
        return 0
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
