"""The Python trainer of the mixed-language world (test_languages.py): per
size, the calls `collectived bench-trainer` makes (float32 sums of
x[i] = (rank + 1) * (i % 7 + 1); one checked call, warmup + iters more, the
last on fresh values and checked again). Prints "ok" and how many answers
its lane carried when every check passed; NO_LANE 1 keeps to the socket.

    python mixed_trainer.py SOCKET JOB LOCAL_RANK SIZES WARMUP ITERS NO_LANE
"""

from __future__ import annotations

import sys

import numpy as np

import collectived


def main() -> int:
    sock, job, local_rank, sizes, warmup, iters, no_lane = sys.argv[1:8]
    with collectived.Client(sock, job=job, local_rank=int(local_rank),
                            label="mixed_trainer (Python)", rank_retry=5.0,
                            no_lane=no_lane == "1") as c:
        rank, size = c.rank, c.size
        for nbytes in (int(s) for s in sizes.split(",")):
            n = max(nbytes // 4, 1)
            pattern = (np.arange(n) % 7 + 1).astype(np.float32)
            want = pattern * np.float32(size * (size + 1) // 2)
            x = pattern * np.float32(rank + 1)
            calls = 1 + int(warmup) + int(iters)
            for k in range(calls):
                if k == calls - 1:
                    x[:] = pattern * np.float32(rank + 1)
                c.allreduce(x, "sum")
                if (k == 0 or k == calls - 1) and not np.array_equal(x, want):
                    bad = int(np.flatnonzero(x != want)[0])
                    print(f"mixed_trainer: {nbytes} bytes, call {k}: element {bad} = {x[bad]}, "
                          f"want {want[bad]}", file=sys.stderr)
                    return 1
        lane = c.lane_answers
    print("ok", lane)
    return 0


if __name__ == "__main__":
    sys.exit(main())
