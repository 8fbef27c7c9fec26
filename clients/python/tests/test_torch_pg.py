"""The "collectived" torch.distributed backend (collectived.torch) against
real daemons: every op, element type and async form against Gloo's results
on the same inputs (tests/torch_pg_fns.py runs the trainers' side, each with
a Gloo group of the same ranks beside it); errors as torch users expect
them, on every rank; a killed trainer. Runs in .venv-torch (make pytest)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import localports  # noqa: E402
from torch_worlds import run_torch  # noqa: E402
from worlds import World  # noqa: E402

M = "torch_pg_fns"


def test_torch_ops_against_gloo_2x2(world_2x2: World) -> None:
    port = localports.free_ports(1)[0]
    for rank, fails in enumerate(run_torch(world_2x2, M, "ops_vs_gloo", (port,), timeout=600)):
        assert fails == [], f"rank {rank}: {len(fails)} failures:\n" + "\n".join(fails)


def test_torch_errors_on_every_rank_2x2(world_2x2: World) -> None:
    res = run_torch(world_2x2, M, "errors")
    for rank, r in enumerate(res):
        name, runtime, msg = r["shapes"]
        assert (name, runtime) == ("MismatchError", True), (rank, r["shapes"])
        assert "(2,3)" in msg.replace(" ", "") and "(3,2)" in msg.replace(" ", ""), msg
        assert r["gather_wait"][:2] == ("MismatchError", True), (rank, r["gather_wait"])
        # through a torch future (C++ carries errors as text): torch's
        # RuntimeError, naming the class and the daemon's message
        name, runtime, msg = r["gather_future"]
        assert runtime and "MismatchError" in msg and "MISMATCH" in msg, r["gather_future"]
        assert r["after"] == [6.0] * 4  # 0 + 1 + 2 + 3: the world went on
        assert r["band"][:2] == ("UnsupportedError", True) and "BAND" in r["band"][2], r["band"]
        assert r["bool_sum"][:2] == ("DTypeError", True), r["bool_sum"]
        assert r["avg_int"][:2] == ("UsageError", True), r["avg_int"]
        assert r["all_to_all"][:2] == ("UnsupportedError", True), r["all_to_all"]
        for k in ("new_group_all", "new_group_some"):
            assert r[k] is not None, (rank, k)
            assert "subgroups" in r[k][2] and "not support" in r[k][2], (rank, k, r[k])
        assert r["after2"] == [4.0, 4.0]


def test_torch_killed_trainer_2x2(fresh_world_2x2: World) -> None:
    victim = 3
    res = run_torch(fresh_world_2x2, M, "killed", (victim,), timeout=120)
    assert res[victim] is None
    for rank, r in enumerate(res):
        if rank == victim:
            continue
        name, runtime, msg = r["error"]
        assert runtime and name in ("TrainerLostError", "PeerLostError", "AbortedError"), r
        assert "TRAINER_LOST" in msg or "PEER_LOST" in msg or "ABORTED" in msg, msg


def test_torch_killed_trainer_under_ddp_2x2(fresh_world_2x2: World) -> None:
    victim = 1
    res = run_torch(fresh_world_2x2, M, "killed_ddp", (victim,), timeout=120)
    assert res[victim] is None
    for rank, r in enumerate(res):
        if rank == victim:
            continue
        assert r["error"] is not None, r
        name, runtime, msg = r["error"]
        # torch's C++ rethrows it as a RuntimeError; the message keeps the
        # class's name and the daemon's words.
        assert runtime, r
        assert "TrainerLostError" in msg or name == "TrainerLostError", msg
        assert "TRAINER_LOST" in msg, msg
        assert r["step"] == 2, r


def test_torch_hooks_and_broadcasts_2x2(world_2x2: World) -> None:
    port = localports.free_ports(1)[0]
    res = run_torch(world_2x2, M, "hooks_and_broadcasts", (port,))
    for r in res:
        # the gradients of DDP on Gloo, averaged by collectived instead
        assert r["sent_gloo"] == []
        assert r["sent_allreduce_hook"] == ["torch.float32/avg"]
        assert r["hook_vs_gloo"] <= 1e-6 * r["scale"], r
        # bfloat16 on the wire, averaged to bfloat16's precision (8 bits)
        assert r["sent_bf16_compress_hook"] == ["torch.bfloat16/avg"]
        assert 0 < r["bf16_vs_gloo"] <= 2 ** -7 * r["scale"], r
        assert "state" in r["bad_state"]
        for k, v in r["params"].items():
            assert torch.equal(v, res[2]["params"][k]), (r["rank"], k)
        assert r["params"]["1.num_batches_tracked"].item() == 2
        assert r["opt_lr"] == 0.02  # rank 1's
        for k, st in r["opt_state"].items():
            for n, t in st.items():
                want = res[1]["opt_state"][k][n]
                assert torch.equal(t, want) if isinstance(t, torch.Tensor) else t == want
        assert r["object"]["rank"] == 3 and r["object"]["t"].tolist() == [0, 3, 6]
