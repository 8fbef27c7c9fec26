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


# torch 1.13's torchrun on Python 3.11 (Debian 12's) fails at its default
# --redirects 0 and --tee 0 ("'NoneType' object has no attribute 'get'": its
# Std.from_str finds no member 0 of a 3.11 IntFlag); 1 works.
TORCHRUN_FIX = (["--redirects", "1", "--tee", "1"]
                if torch.__version__.startswith("1.") and sys.version_info >= (3, 11) else [])


def test_train_ddp_under_torchrun_2x2(world_2x2: World, tmp_path) -> None:
    """As clients/python/README.md tells: one torchrun per node
    (--nproc-per-node 2), each with its daemon's $COLLECTIVED_SOCKET."""
    import localports

    out = str(tmp_path / "tr-rank{rank}.pt")
    procs = []
    for node, port in enumerate(localports.free_ports(world_2x2.nodes)):
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", *TORCHRUN_FIX, "--nproc_per_node",
             str(world_2x2.local_size), "--master_port", str(port), SCRIPT, "--steps", "10",
             "--out", out],
            env=_env(COLLECTIVED_SOCKET=world_2x2.sockets[node], COLLECTIVED_JOB=JOB,
                     OMP_NUM_THREADS="1"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        for p in procs:
            o, _ = p.communicate(timeout=300)
            assert p.returncode == 0, o
            assert "warn" not in o.lower() or "$RANK" not in o, o
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    ws = [_weights(out.replace("{rank}", str(r))) for r in range(world_2x2.size)]
    for w in ws[1:]:
        for k, v in w.items():
            assert torch.equal(v, ws[0][k]), k


def test_readme_pytorch_snippet(collectived_bin: str) -> None:
    """The ```py snippet of clients/python/README.md's "PyTorch" section runs
    as printed (a 1x1 world of job "demo")."""
    import re

    with open(os.path.join(REPO, "clients", "python", "README.md"), encoding="utf-8") as f:
        (code,) = re.findall(r"^```py\n(.*?)^```", f.read(), re.S | re.M)
    assert "collectived.torch.init_process_group()" in code
    w = World(collectived_bin, 1, 1, job="demo")
    try:
        w.start()
        r = subprocess.run([sys.executable, "-c", code],
                           env=_env(COLLECTIVED_SOCKET=w.sockets[0], COLLECTIVED_JOB="demo"),
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        w.stop()
