"""Trainers in Go, C and Python in one world: on each of two nodes, local
rank 0 is the Go client (`collectived bench-trainer`), 1 the C client
(clients/c/tests/mixed_trainer.c) and 2 the Python client
(mixed_trainer.py). They make the same calls, every one checks its results,
and all three take their connection's lane (protocol version 2), then all
keep to the socket."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Iterator

import pytest

from worlds import World

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
C_DIR = os.path.join(REPO, "clients", "c")
SIZES = "4,4096,65536,1048576"  # the lane, inline, copied through scratch, a segment
WARMUP, ITERS = 2, 3


@pytest.fixture(scope="module")
def c_trainer() -> str:
    out = subprocess.run(["make", "-C", C_DIR, "build/mixed_trainer"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, f"cannot build the C trainer:\n{out.stdout}\n{out.stderr}"
    return os.path.join(C_DIR, "build", "mixed_trainer")


@pytest.fixture(scope="module")
def world(collectived_bin: str) -> Iterator[World]:
    w = World(collectived_bin, 2, 3)
    try:
        w.start()
        yield w
    finally:
        w.stop()


@pytest.mark.parametrize("no_lane", [False, True], ids=["lanes", "sockets"])
def test_go_c_python_in_one_world(world: World, collectived_bin: str, c_trainer: str,
                                  no_lane: bool) -> None:
    procs = []
    for rank in range(world.size):
        sock, local = world.trainer_args(rank)
        if local == 0:
            cmd = [collectived_bin, "bench-trainer", "--socket", sock, "--job", world.job,
                   "--local-rank", "0", "--sizes", SIZES, "--warmup", str(WARMUP),
                   "--iters", str(ITERS), f"--no-lane={str(no_lane).lower()}"]
        elif local == 1:
            cmd = [c_trainer, sock, world.job, "1", SIZES, str(WARMUP), str(ITERS),
                   "1" if no_lane else "0"]
        else:
            cmd = [sys.executable, os.path.join(HERE, "mixed_trainer.py"), sock, world.job, "2",
                   SIZES, str(WARMUP), str(ITERS), "1" if no_lane else "0"]
        procs.append((rank, local, subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                                    stderr=subprocess.PIPE, text=True)))
    outs = {}
    for rank, local, p in procs:
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for _, _, q in procs:
                q.kill()
            raise AssertionError(f"world rank {rank} did not finish in 120 s\n"
                                 + "\n".join(world.log(r) for r in range(world.nodes)))
        assert p.returncode == 0, f"world rank {rank} (local {local}) failed: {err}{out}"
        outs[rank] = out
    # World rank 0 is a Go trainer: it reports every size, verified, and its lane.
    rows = [json.loads(line) for line in outs[0].splitlines() if line.startswith("{")]
    assert [r["bytes"] for r in rows] == [int(s) for s in SIZES.split(",")], outs[0]
    assert all(r["lane"] is (not no_lane) for r in rows), rows
    for rank in range(world.size):
        local = rank % world.local_size
        if local == 1:
            assert outs[rank].split() == ["ok", "0" if no_lane else "1"], outs[rank]
        elif local == 2:
            # The lane answered every call up to 256 KiB (4 B inline, 4 KiB
            # and 64 KiB through scratch segments), not the 1 MiB ones.
            want = 0 if no_lane else 3 * (1 + WARMUP + ITERS)
            assert outs[rank].split() == ["ok", str(want)], outs[rank]
