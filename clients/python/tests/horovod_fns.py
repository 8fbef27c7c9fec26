"""Trainer bodies for test_horovod_torch.py, run by torch_worlds.run_torch
in spawned processes (module level so that they pickle): each calls
``hvd.init`` on its daemon and returns observations for the test."""

from __future__ import annotations

import time
import traceback
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

import collectived
import collectived.horovod.torch as hvd

JOB = "pytest-job"


def _init(sock: str, local_rank: int) -> None:
    hvd.init(socket=sock, job=JOB, local_rank=local_rank)


def _raised(fn: Callable[[], Any]) -> tuple[str, str]:
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - reported to the test
        return type(e).__name__, str(e)
    return "", ""


def api(sock: str, local_rank: int) -> dict[str, Any]:
    _init(sock, local_rank)
    r, s = hvd.rank(), hvd.size()
    out: dict[str, Any] = {"world": (r, s, hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),
                                     hvd.cross_size(), hvd.is_initialized())}
    base = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    t = base * (r + 1)
    keep = t.clone()
    out["avg"] = hvd.allreduce(t, name="avg")                   # default op: Average
    out["avg_unnamed"] = hvd.allreduce(t)                       # an ordered call
    out["sum"] = hvd.allreduce(t, op=hvd.Sum, name="sum")
    out["average_false"] = hvd.allreduce(t, average=False, name="avg_false")
    out["max"] = hvd.allreduce(t, op=hvd.Max, name="max")
    out["scaled"] = hvd.allreduce(t, op=hvd.Sum, name="scaled", prescale_factor=0.5,
                                  postscale_factor=4.0)
    out["scaled_avg"] = hvd.allreduce(t, name="scaled_avg", prescale_factor=2.0)
    out["int_avg"] = hvd.allreduce(torch.tensor([r, -r, 7], dtype=torch.int64), name="int_avg")
    out["f16_compressed"] = hvd.allreduce(t, name="f16", compression=hvd.Compression.fp16)
    out["input_kept"] = torch.equal(t, keep)
    inplace = t.clone()
    out["inplace_is_same"] = hvd.allreduce_(inplace, op=hvd.Sum, name="inplace") is inplace
    out["inplace"] = inplace
    # A non-contiguous tensor in place: the result lands in it.
    wide = (base * (r + 1)).t()
    hvd.allreduce_(wide, op=hvd.Sum, name="transposed")
    out["transposed"] = wide
    out["scalar"] = hvd.allreduce(torch.tensor(float(r)), name="scalar")
    # Several in flight at once, synchronized in another order.
    hs = [hvd.allreduce_async(torch.full((5,), float(r * k)), name=f"async.{k}", op=hvd.Sum)
          for k in range(6)]
    out["async"] = [hvd.synchronize(h) for h in reversed(hs)]
    h = hvd.allreduce_async_(torch.ones(3), name="poll", op=hvd.Sum)
    while not hvd.poll(h):
        pass
    out["poll"] = hvd.synchronize(h)
    out["sync_twice"] = _raised(lambda: hvd.synchronize(h))
    # A second call of a name in flight: refused by the client. (The
    # others call it a second later, so that rank 0's first is in flight.)
    if r != 0:
        time.sleep(1.0)
    first = hvd.allreduce_async(torch.ones(2), name="twice")
    out["twice"] = _raised(lambda: hvd.allreduce_async(torch.ones(2), name="twice"))
    hvd.synchronize(first)
    # Allgather: first dimensions of each rank's own.
    g = torch.full((r + 1, 2), float(r))
    out["allgather"] = hvd.allgather(g, name="gather")
    out["allgather_unnamed"] = hvd.allgather(torch.tensor([r, 10 * r], dtype=torch.int32))
    out["allgather_bool"] = hvd.allgather(torch.tensor([r % 2 == 0]), name="gather_bool")
    # Broadcast.
    b = torch.full((3,), float(r))
    out["broadcast"] = hvd.broadcast(b, root_rank=1, name="bcast")
    out["broadcast_input_kept"] = b.tolist() == [float(r)] * 3
    b2 = torch.full((2, 2), r, dtype=torch.int16)  # a type the daemon moves as bytes
    out["broadcast_inplace_is_same"] = hvd.broadcast_(b2, 3, name="bcast_i16") is b2
    out["broadcast_int16"] = b2
    hb = hvd.broadcast_async(torch.tensor([r]), 2)
    out["broadcast_async"] = hvd.synchronize(hb)
    out["object"] = hvd.broadcast_object({"from": r}, root_rank=2)
    # What is refused, on every rank alike.
    out["adasum"] = _raised(lambda: hvd.allreduce(t, op=hvd.Adasum, name="adasum"))
    opt = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    out["adasum_opt"] = _raised(lambda: hvd.DistributedOptimizer(opt, op=hvd.Adasum))
    out["op_and_average"] = _raised(lambda: hvd.allreduce(t, average=True, op=hvd.Sum))
    hvd.barrier()
    hvd.shutdown()
    out["after_shutdown"] = _raised(hvd.rank)
    return out


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.fc1 = nn.Linear(4 * 16, 16)
        self.fc2 = nn.Linear(16, 10)
        self.unused = nn.Linear(3, 3)  # no gradient reaches it: synchronize() starts it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def data(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return torch.rand(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)


def train(rank: int, size: int, model: nn.Module, opt: Any, steps: int, passes: int = 1) -> None:
    x, y = data()
    per = len(x) // size // passes
    for step in range(steps):
        opt.zero_grad()
        for p in range(passes):
            at = (rank * passes + p) * per
            F.cross_entropy(model(x[at:at + per]), y[at:at + per]).backward()
        opt.step()


def optimizer(sock: str, local_rank: int, steps: int, variant: str) -> dict[str, Any]:
    """Train with DistributedOptimizer from per-rank initial weights (made
    equal by broadcast_parameters); the final weights."""
    _init(sock, local_rank)
    try:
        r, s = hvd.rank(), hvd.size()
        torch.manual_seed(100 + r)  # every rank different: the broadcast must fix it
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        initial = {k: v.clone() for k, v in model.state_dict().items()}
        kw: dict[str, Any] = {}
        passes = 1
        if variant == "sum":
            kw["op"] = hvd.Sum
        elif variant == "fp16":
            kw["compression"] = hvd.Compression.fp16
        elif variant == "passes":
            passes = kw["backward_passes_per_step"] = 2
        elif variant == "predivide":
            kw["gradient_predivide_factor"] = 2.0
        dopt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), **kw)
        isa = isinstance(dopt, torch.optim.SGD)
        train(r, s, model, dopt, steps, passes)
        zero_grad_early = ""
        if variant == "plain":
            # zero_grad between backward and step is refused, as Horovod does
            F.cross_entropy(model(data()[0][:4]), data()[1][:4]).backward()
            zero_grad_early = _raised(dopt.zero_grad)[1]
            dopt.step()
        return {"initial": initial, "final": model.state_dict(), "isa": isa,
                "zero_grad_early": zero_grad_early}
    except BaseException:
        return {"error": traceback.format_exc()}
    finally:
        hvd.shutdown()


def hook_calls(sock: str, local_rank: int) -> list[tuple[str, bool]]:
    """The (name, ordered) of every allreduce a DistributedOptimizer's
    step makes, in the order its hooks made them (recorded on the way to
    the real client)."""
    _init(sock, local_rank)
    try:
        c: collectived.Client = hvd._c()
        seen: list[tuple[str, bool]] = []
        real = c.allreduce_async

        def recording(x: Any, op: str = "sum", **kw: Any) -> Any:
            seen.append((kw.get("name", ""), kw.get("ordered", True)))
            return real(x, op, **kw)
        c.allreduce_async = recording  # type: ignore[method-assign]
        model = Net()
        dopt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                        named_parameters=model.named_parameters())
        x, y = data(8)
        F.cross_entropy(model(x), y).backward()
        dopt.step()
        return seen
    finally:
        hvd.shutdown()
