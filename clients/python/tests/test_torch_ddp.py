"""examples/train_ddp.py, a standard DDP script whose only collectived line
is its init line, trains a small CNN on scikit-learn's digits on 2 nodes x
2 trainers (real daemons): every rank ends with the same weights, bit for
bit, run after run, and they are those of one process training on whole
batches, to float tolerance. Runs in .venv-torch (make pytest)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

from worlds import JOB, REPO, World  # noqa: E402

SCRIPT = os.path.join(REPO, "clients", "python", "examples", "train_ddp.py")
SRC = os.path.join(REPO, "clients", "python", "src")


def _env(**kw: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [SRC] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update(kw)
    return env


def _train(world: World, out: str, steps: int = 40) -> list[str]:
    """The script, one process per trainer, as torchrun would start them
    ($LOCAL_RANK) with $COLLECTIVED_SOCKET naming each one's daemon."""
    procs = []
    for i in range(world.size):
        sock, lr = world.trainer_args(i)
        procs.append(subprocess.Popen(
            [sys.executable, SCRIPT, "--steps", str(steps), "--out", out],
            env=_env(COLLECTIVED_SOCKET=sock, COLLECTIVED_JOB=JOB, LOCAL_RANK=str(lr)),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p in procs:
            o, _ = p.communicate(timeout=300)
            assert p.returncode == 0, o
            outs.append(o)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


def _weights(path: str) -> dict[str, object]:
    return torch.load(path)


def test_train_ddp_example_2x2(world_2x2: World, tmp_path) -> None:
    runs = []
    for run in range(2):
        out = str(tmp_path / f"run{run}-rank{{rank}}.pt")
        outs = _train(world_2x2, out)
        assert all("accuracy" in o for o in outs), outs
        runs.append([_weights(out.replace("{rank}", str(r))) for r in range(world_2x2.size)])
    ref_path = str(tmp_path / "reference.pt")
    r = subprocess.run([sys.executable, SCRIPT, "--reference", "--steps", "40", "--out", ref_path],
                       env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    ref = _weights(ref_path)
    first = runs[0][0]
    changed = max(float((first[k] - v0).abs().max()) for k, v0 in _initial().items())
    assert changed > 1e-2, "training did not move the weights"
    for run in runs:
        for rank, w in enumerate(run):
            for k, v in w.items():
                # bit for bit: across ranks and across runs
                assert torch.equal(v, first[k]), (rank, k)
    for k, v in first.items():
        torch.testing.assert_close(v, ref[k], rtol=1e-4, atol=1e-5)


def _initial() -> dict[str, object]:
    sys.path.insert(0, os.path.dirname(SCRIPT))
    try:
        import train_ddp
    finally:
        sys.path.pop(0)
    torch.manual_seed(0)
    return train_ddp.Net().state_dict()
