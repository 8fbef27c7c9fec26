#!/usr/bin/env python3
"""A standard PyTorch DistributedDataParallel script: a small CNN learns
scikit-learn's bundled digits (8x8 images, no download).

The one line that makes it run on collectived is the init line:

    collectived.torch.init_process_group()   # instead of dist.init_process_group("gloo")

Everything else is plain torch.distributed and DDP. Start one copy per
trainer, as torchrun does (it sets $LOCAL_RANK; $COLLECTIVED_SOCKET names the
node's daemon):

    torchrun --nproc_per_node 2 examples/train_ddp.py         # on each node
    COLLECTIVED_SOCKET=/tmp/cvd/n0.sock LOCAL_RANK=0 python3 examples/train_ddp.py  # by hand

``--backend gloo`` runs the same script on Gloo (torchrun's env:// rendezvous),
``--reference`` in one process without torch.distributed, on whole batches:
with equal shards DDP's averaged gradients are the whole batch's, so every
run ends with the reference's weights, to float tolerance. ``--out F`` saves
the final weights (``{rank}`` in F is replaced by the rank).
"""

from __future__ import annotations

import argparse
import hashlib
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits

import collectived.torch


class Net(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.fc1 = nn.Linear(2 * width * 16, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    x, y = load_digits(return_X_y=True)
    return (torch.tensor(x / 16.0, dtype=torch.float32).reshape(-1, 1, 8, 8),
            torch.tensor(y, dtype=torch.int64))


def digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for v in model.state_dict().values():
        h.update(v.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="collectived", help="collectived, or gloo (env://)")
    ap.add_argument("--reference", action="store_true", help="one process, whole batches")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=64, help="global batch (split over the ranks)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--out", default="", help="save the final weights here ({rank}: the rank)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # the same arithmetic every run
    torch.use_deterministic_algorithms(True)

    if args.reference:
        rank, world = 0, 1
    elif args.backend == "collectived":
        collectived.torch.init_process_group()
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        dist.init_process_group(args.backend)
        rank, world = dist.get_rank(), dist.get_world_size()

    x, y = digits()
    torch.manual_seed(0)
    model = Net()
    if not args.reference:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(1))
    per = args.batch // world
    n = len(x) // args.batch * args.batch
    t0 = time.monotonic()
    for step in range(args.steps):
        start = step * args.batch % n
        batch = order[start:start + args.batch]
        mine = batch[rank * per:(rank + 1) * per]  # this rank's shard of the global batch
        opt.zero_grad()
        loss = F.cross_entropy(model(x[mine]), y[mine])
        loss.backward()  # DDP averages the gradients over the world
        opt.step()
    took = time.monotonic() - t0

    net = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    with torch.no_grad():
        acc = (net(x).argmax(1) == y).float().mean().item()
    print(f"rank {rank}/{world}: {args.steps} steps in {took:.2f} s, last loss {loss.item():.4f}, "
          f"accuracy {acc:.3f}, weights {digest(net)}", flush=True)
    if args.out:
        torch.save(net.state_dict(), args.out.replace("{rank}", str(rank)))
    if not args.reference:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
