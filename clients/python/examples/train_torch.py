#!/usr/bin/env python3
"""Data-parallel training of a tiny MLP in PyTorch through collectived.

Run one copy per trainer, as train_numpy.py. Each trainer takes its shard of
every batch, the gradients (flattened into one tensor in a shared segment,
so the allreduce copies nothing through the socket) are summed across the
world, and every trainer applies the same SGD step. At the end each trainer
trains the same model alone on whole batches and checks that the weights
agree to float64 rounding; it prints the result and exits 1 on failure.
Exits 0 with a message where torch is not installed.
"""

from __future__ import annotations

import argparse
import sys

try:
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    print("train_torch.py: torch is not importable here; nothing to do")
    sys.exit(0)

import collectived
import collectived.torch as ct


def make_model(seed: int, d: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(d, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 1)).double()


def make_data(seed: int, n: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.sin(x.sum(dim=1, keepdim=True)) + 0.1 * torch.randn(n, 1, generator=g,
                                                                  dtype=torch.float64)
    return x, y


def batches(seed: int, n: int, batch: int, steps: int):
    g = torch.Generator().manual_seed(seed + 1)
    order = torch.randperm(n, generator=g)
    for s in range(steps):
        start = (s * batch) % (n - batch + 1)
        yield order[start:start + batch]


def step(model: torch.nn.Module, x, y, scale: float) -> float:
    """Backward pass of the summed squared error times ``scale``."""
    model.zero_grad()
    loss = ((model(x) - y) ** 2).sum() * scale
    loss.backward()
    return float(loss)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", default=None)
    ap.add_argument("--job", default=None)
    ap.add_argument("--local-rank", type=int, default=-1)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    d = 8
    x, y = make_data(args.seed, 2048, d)

    with collectived.Client(args.socket, job=args.job, local_rank=args.local_rank,
                            label="train_torch.py", rank_retry=10.0) as c:
        model = make_model(args.seed, d)
        params = list(model.parameters())
        flat = ct.zeros(c, sum(p.numel() for p in params), torch.float64)
        for idx in batches(args.seed, len(x), args.batch, args.steps):
            shard = idx[c.rank::c.size]
            step(model, x[shard], y[shard], 1.0 / len(idx))
            torch.cat([p.grad.reshape(-1) for p in params], out=flat)
            c.allreduce(flat, "sum", name="grad")
            with torch.no_grad():
                off = 0
                for p in params:
                    p -= args.lr * flat[off:off + p.numel()].view_as(p)
                    off += p.numel()
        rank, size = c.rank, c.size

    alone = make_model(args.seed, d)
    for idx in batches(args.seed, len(x), args.batch, args.steps):
        step(alone, x[idx], y[idx], 1.0 / len(idx))
        with torch.no_grad():
            for p in alone.parameters():
                p -= args.lr * p.grad
    diff = max(float((a - b).abs().max()) for a, b in zip(model.parameters(),
                                                          alone.parameters()))
    ok = diff < 1e-9
    print(f"rank {rank}/{size}: max |w - w_single_process| = {diff:.3e}; "
          f"{'OK' if ok else 'FAILED'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
