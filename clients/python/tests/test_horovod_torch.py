"""collectived.horovod.torch, Horovod's PyTorch API over collectived,
against real daemons (2 nodes x 2 trainers; trainers in horovod_fns.py):
allreduce (Average, Sum, scale factors, in place, async with poll and
synchronize), allgather of first dimensions that differ, broadcast, the
refusals (Adasum, a name in flight twice); DistributedOptimizer keeps the
replicas identical bit for bit and matches one process training on whole
batches; examples/horovod_mnist.py, a Horovod script but for its import
line, trains to a good accuracy. Runs in .venv-torch (make pytest)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from torch_worlds import run_torch  # noqa: E402
from worlds import JOB, REPO, World  # noqa: E402

M = "horovod_fns"
EXAMPLE = os.path.join(REPO, "clients", "python", "examples", "horovod_mnist.py")
SRC = os.path.join(REPO, "clients", "python", "src")


def test_horovod_api_2x2(world_2x2: World) -> None:
    res = run_torch(world_2x2, M, "api")
    base = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    for r, o in enumerate(res):
        assert o["world"] == (r, 4, r % 2, 2, r // 2, 2, True)
        assert torch.equal(o["avg"], base * 2.5), o["avg"]
        assert torch.equal(o["avg_unnamed"], base * 2.5)
        assert torch.equal(o["sum"], base * 10) and torch.equal(o["average_false"], base * 10)
        assert torch.equal(o["max"], base * 4)
        assert torch.equal(o["scaled"], base * 20) and torch.equal(o["scaled_avg"], base * 5)
        assert o["int_avg"].tolist() == [1, -1, 7]  # (0+1+2+3)/4 and 28/4, truncated
        assert o["f16_compressed"].dtype == torch.float32
        assert torch.equal(o["f16_compressed"], base * 2.5)
        assert o["input_kept"] and o["inplace_is_same"]
        assert torch.equal(o["inplace"], base * 10)
        assert torch.equal(o["transposed"], (base * 10).t())
        assert o["scalar"].shape == () and float(o["scalar"]) == 1.5
        assert [t.tolist() for t in o["async"]] == [[6.0 * k] * 5 for k in reversed(range(6))]
        assert o["poll"].tolist() == [4.0] * 3
        assert o["sync_twice"][0] == "UsageError" and "not a call in flight" in o["sync_twice"][1]
        if r == 0:
            kind, msg = o["twice"]
            assert kind == "UsageError", o["twice"]
            assert "a named call of name 'allreduce.twice' is already in flight" in msg, msg
        assert o["allgather"].tolist() == [[float(i)] * 2 for i in range(4) for _ in range(i + 1)]
        assert o["allgather_unnamed"].tolist() == [0, 0, 1, 10, 2, 20, 3, 30]
        assert o["allgather_bool"].tolist() == [True, False, True, False]
        assert o["broadcast"].tolist() == [1.0] * 3 and o["broadcast_input_kept"]
        assert o["broadcast_inplace_is_same"]
        assert o["broadcast_int16"].dtype == torch.int16
        assert o["broadcast_int16"].tolist() == [[3, 3], [3, 3]]
        assert o["broadcast_async"].tolist() == [2] and o["object"] == {"from": 2}
        for k in ("adasum", "adasum_opt"):
            assert o[k][0] == "NotImplementedError" and "Adasum" in o[k][1], o[k]
        assert o["op_and_average"][0] == "ValueError", o["op_and_average"]
        assert o["after_shutdown"] == ("UsageError",
                                       "Horovod has not been initialized; use hvd.init().")


def test_optimizer_hooks_make_named_calls(world_2x2: World) -> None:
    import horovod_fns

    names = sorted(f"allreduce.{k}" for k, _ in horovod_fns.Net().named_parameters())
    for calls in run_torch(world_2x2, M, "hook_calls"):
        assert sorted(n for n, _ in calls) == names, calls
        assert all(ordered is False for _, ordered in calls), calls


def _reference(steps: int, lr: float, extra: bool) -> dict:
    """One process, whole batches: what averaging over equal shards gives."""
    import horovod_fns as H

    torch.manual_seed(100)  # rank 0's, which broadcast_parameters gave everyone
    model = H.Net()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    x, y = H.data()
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    if extra:
        x, y = H.data()
        F.cross_entropy(model(x[:4]), y[:4]).backward()
        opt.step()
    return model.state_dict()


@pytest.mark.parametrize("variant,lr", [("plain", 0.1), ("sum", 0.4), ("passes", 0.2),
                                        ("predivide", 0.1), ("fp16", None)])
def test_distributed_optimizer_keeps_replicas_identical(world_2x2: World, variant: str,
                                                        lr: float) -> None:
    steps = 8
    res = run_torch(world_2x2, M, "optimizer", (steps, variant))
    for r, o in enumerate(res):
        assert "error" not in o, f"rank {r}:\n{o.get('error')}"
        assert o["isa"]  # a subclass of the wrapped optimizer's class, as Horovod's
    first = res[0]
    for r, o in enumerate(res):
        for k, v in o["initial"].items():
            assert torch.equal(v, first["initial"][k]), (r, k)  # broadcast_parameters
        for k, v in o["final"].items():
            assert torch.equal(v, first["final"][k]), (r, k)    # bit for bit
    moved = max(float((first["final"][k] - v).abs().max()) for k, v in first["initial"].items())
    assert moved > 1e-2, "training did not move the weights"
    if variant == "plain":
        assert "zero_grad() was called after loss.backward()" in first["zero_grad_early"]
    if lr is not None:
        ref = _reference(steps, lr, variant == "plain")
        for k, v in ref.items():
            assert torch.allclose(first["final"][k], v, rtol=1e-4, atol=1e-5), (
                k, float((first["final"][k] - v).abs().max()))


def _env(**kw: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [SRC] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update(kw)
    return env


def _run_example(world: World, *args: str) -> list[tuple[int, str]]:
    procs = []
    for i in range(world.size):
        sock, lr = world.trainer_args(i)
        procs.append(subprocess.Popen(
            [sys.executable, EXAMPLE, *args],
            env=_env(COLLECTIVED_SOCKET=sock, COLLECTIVED_JOB=JOB, LOCAL_RANK=str(lr)),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p in procs:
            o, _ = p.communicate(timeout=300)
            outs.append((p.returncode, o))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


def test_example_is_horovods_but_for_its_import_line() -> None:
    with open(EXAMPLE, encoding="utf-8") as f:
        src = f.read()
    code = src.split('"""', 2)[2]  # past the docstring
    assert [ln for ln in code.splitlines() if "collectived" in ln] == [
        "import collectived.horovod.torch as hvd"]


def test_horovod_mnist_example_trains_2x2(world_2x2: World) -> None:
    outs = _run_example(world_2x2)  # 10 epochs of the 1500 first digits; the rest to test
    for rc, o in outs:
        assert rc == 0, o
    accs = [float(a) for a in re.findall(r"Accuracy: ([0-9.]+)%", outs[0][1])]
    assert len(accs) == 10, outs[0][1]
    assert accs[-1] > 75.0 and accs[-1] > accs[0] + 20, accs
    assert all("Accuracy" not in o for _, o in outs[1:])  # rank 0 prints the test set's


def test_horovod_mnist_example_refuses_adasum(world_2x2: World) -> None:
    for rc, o in _run_example(world_2x2, "--epochs", "1", "--use-adasum"):
        assert rc != 0 and "NotImplementedError: op=Adasum" in o, o


def test_every_public_name_has_a_docstring() -> None:
    import inspect

    import collectived.horovod.torch as hvd

    missing = []
    for name in hvd.__all__:
        obj = getattr(hvd, name)
        if not callable(obj):
            continue  # the reduce ops
        if not (obj.__doc__ or "").strip():
            missing.append(name)
        if inspect.isclass(obj):
            for k, v in vars(obj).items():
                f = getattr(v, "__func__", v)
                if not k.startswith("_") and callable(f) and not (f.__doc__ or "").strip():
                    missing.append(f"{name}.{k}")
    for k, v in vars(hvd._DistributedOptimizer).items():
        if not k.startswith("_") and callable(v) and not (v.__doc__ or "").strip():
            missing.append(f"DistributedOptimizer.{k}")
    assert missing == [], missing
