#!/usr/bin/env python3
"""Data-parallel logistic regression in NumPy through collectived.

Run one copy per trainer (every trainer of the world), e.g. with a daemon
serving job "demo" and local_size 2 on this node:

    for i in 0 1; do
        COLLECTIVED_SOCKET=/run/collectived/collectived.sock COLLECTIVED_JOB=demo \
            python3 train_numpy.py --local-rank $i &
    done; wait

Every trainer builds the same synthetic data set (from --seed) and, at each
step, the same batch; it computes the gradient on its own shard of the
batch (every size-th example), the shards' gradient sums are allreduced
(summed) through collectived, and every trainer applies the same update.

Then each trainer also trains one model alone on whole batches and checks
that the two sets of weights agree to float64 rounding, and that every
trainer of the world ended with bit-identical weights. It prints the result
and exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import collectived


def make_data(seed: int, n: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    w_true = rng.standard_normal(d + 1)
    logits = x @ w_true[:-1] + w_true[-1]
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-logits))).astype(np.float64)
    return x, y


def grad_sum(w: np.ndarray, x: np.ndarray, y: np.ndarray, out: np.ndarray) -> float:
    """Sum over the examples of the log-loss gradient (weights then bias)
    into ``out``; returns the summed loss."""
    z = x @ w[:-1] + w[-1]
    p = 1 / (1 + np.exp(-z))
    out[:-1] = x.T @ (p - y)
    out[-1] = np.sum(p - y)
    eps = 1e-12
    return float(-np.sum(y * np.log(p + eps) + (1 - y) * np.log(1 - p + eps)))


def batches(seed: int, n: int, batch: int, steps: int):
    rng = np.random.default_rng(seed + 1)
    order = rng.permutation(n)
    for s in range(steps):
        start = (s * batch) % (n - batch + 1)
        yield order[start:start + batch]


def train_alone(x, y, args) -> np.ndarray:
    w = np.zeros(x.shape[1] + 1)
    g = np.zeros_like(w)
    for idx in batches(args.seed, len(x), args.batch, args.steps):
        grad_sum(w, x[idx], y[idx], g)
        w -= args.lr * g / len(idx)
    return w


def train_parallel(c: collectived.Client, x, y, args) -> tuple[np.ndarray, float]:
    w = np.zeros(x.shape[1] + 1)
    # gradient and loss live in one shared segment: the allreduce sends no data
    buf = c.zeros(x.shape[1] + 2, "float64")
    g, loss = buf[:-1], 0.0
    for idx in batches(args.seed, len(x), args.batch, args.steps):
        shard = idx[c.rank::c.size]
        buf[-1] = grad_sum(w, x[shard], y[shard], g)
        c.allreduce(buf, "sum", name="grad")
        loss = float(buf[-1]) / len(idx)
        w -= args.lr * g / len(idx)
    return w, loss


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--socket", default=None, help="daemon socket (default $COLLECTIVED_SOCKET)")
    ap.add_argument("--job", default=None, help="job name (default $COLLECTIVED_JOB)")
    ap.add_argument("--local-rank", type=int, default=-1)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=96)
    ap.add_argument("--features", type=int, default=16)
    ap.add_argument("--examples", type=int, default=4096)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    x, y = make_data(args.seed, args.examples, args.features)
    with collectived.Client(args.socket, job=args.job, local_rank=args.local_rank,
                            label="train_numpy.py", rank_retry=10.0) as c:
        w, loss = train_parallel(c, x, y, args)
        # every trainer must hold the very same weights: compare max and min
        hi, lo = w.copy(), w.copy()
        c.allreduce(hi, "max", name="check-max")
        c.allreduce(lo, "min", name="check-min")
        identical = bool(np.array_equal(hi, w) and np.array_equal(lo, w))
        rank, size = c.rank, c.size
    w_ref = train_alone(x, y, args)
    diff = float(np.max(np.abs(w - w_ref)))
    ok = identical and np.allclose(w, w_ref, rtol=1e-9, atol=1e-12)
    print(f"rank {rank}/{size}: loss {loss:.6f} after {args.steps} steps; "
          f"max |w - w_single_process| = {diff:.3e}; identical on all ranks: {identical}; "
          f"{'OK' if ok else 'FAILED'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
