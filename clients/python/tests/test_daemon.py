"""The Python client against real collectived daemons (skipped, with the
reason, when no daemon binary can be built)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import collectived

import trainer_fns as T
from worlds import JOB, REPO, World

EXAMPLES = os.path.join(REPO, "clients", "python", "examples")


def _check_every_dtype_op(world: World) -> None:
    results = world.run(T.every_dtype_op)
    assert [r["rank"] for r in results] == list(range(world.size))
    for path in T.PATHS:
        for dtype in T.DTYPES:
            for op in T.OPS:
                key = (path, dtype, op)
                n = len(results[0][key])
                ref = T.reference(world.size, dtype, op, n)
                got = results[0][key]
                assert got.dtype == np.dtype(dtype)
                if "float" in dtype:
                    # summation order differs from NumPy's: allow rounding (with
                    # cancellation, relative to the inputs' scale, not the result's)
                    tol = 1e-5 if dtype == "float32" else 1e-12
                    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol, err_msg=str(key))
                else:
                    np.testing.assert_array_equal(got, ref, err_msg=str(key))
                for r in results[1:]:  # every rank gets bit-identical results
                    np.testing.assert_array_equal(r[key], got, err_msg=f"{key} rank {r['rank']}")
                if path in ("segment", "registered"):
                    # zero copy: a header and a description, not the buffer
                    assert max(r["sent"][key] for r in results) < 128, key


def test_info_1x1(world_1x1: World) -> None:
    (i,) = world_1x1.run(T.info)
    assert i == {"rank": 0, "size": 1, "local_rank": 0, "local_size": 1, "node_rank": 0,
                 "node_count": 1, "generation": i["generation"]}


def test_every_dtype_op_1x1(world_1x1: World) -> None:
    _check_every_dtype_op(world_1x1)


def test_info_2x2(world_2x2: World) -> None:
    infos = world_2x2.run(T.info)
    for r, i in enumerate(infos):
        assert (i["rank"], i["size"], i["local_rank"], i["local_size"]) == (r, 4, r % 2, 2)
        assert (i["node_rank"], i["node_count"]) == (r // 2, 2)


def test_every_dtype_op_2x2(world_2x2: World) -> None:
    _check_every_dtype_op(world_2x2)


def test_async_2x2(world_2x2: World) -> None:
    k, n = 8, 50_000
    results = world_2x2.run(T.many_async, (k, n))
    for res in results:
        arrays, ids = res[:-1], res[-1]
        for i, a in enumerate(arrays):
            assert (a == sum(r + i for r in range(4))).all()
        seqs = [s for _, s in ids]
        assert seqs == sorted(seqs) and len(set(seqs)) == k
    assert len({tuple(r[-1]) for r in results}) == 1  # same (generation, seq) everywhere


def test_more_calls_than_max_in_flight_2x2(collectived_bin: str) -> None:
    # 100 calls with max_in_flight 64: the client waits for a free slot
    # instead of earning TOO_MANY. (The daemon's default is 1024.)
    w = World(collectived_bin, 2, 2, max_in_flight=64)
    try:
        w.start()
        results = w.run(T.many_async, (100, 10))
    finally:
        w.stop()
    for res in results:
        for i, a in enumerate(res[:-1]):
            assert (a == sum(r + i for r in range(4))).all()


def test_mismatch_2x2(world_2x2: World) -> None:
    results = world_2x2.run(T.mismatch)
    for res in results:
        assert res["error"] is not None, "a mismatched call succeeded"
        cls, code, name, msg = res["error"]
        assert (cls, code, name) == ("MismatchError", 15, "MISMATCH")
        assert "count=3" in msg and "count=4" in msg, msg
        assert res["after"] == [4.0, 4.0]


def test_mismatch_right_after_a_collective_2x2(collectived_bin: str) -> None:
    # DESIGN.md: a mismatch fails collective k on every trainer; the next call
    # joins the next collective. Here each mismatch directly follows a barrier.
    w = World(collectived_bin, 2, 2, collective_timeout="8s")
    try:
        w.start()
        results = w.run(T.mismatch_rounds, (5,), timeout=200)
    finally:
        w.stop()
    want = ["barrier ok", "mismatch", "after 4.0"] * 5
    for r, got in enumerate(results):
        assert got == want, f"world rank {r}: {got}"


def test_broadcast_barrier_2x2(world_2x2: World) -> None:
    for res in world_2x2.run(T.broadcast_and_barrier):
        assert res["x"] == [3.0] * 5
        assert res["big"] == (0, 0)


def test_status_and_wrong_job(world_2x2: World) -> None:
    with collectived.Client(world_2x2.sockets[0], job=JOB, observer=True) as c:
        st = c.status()
        assert isinstance(st, dict) and st
        assert c.rank == -1
    with pytest.raises(collectived.JobError) as ei:
        collectived.Client(world_2x2.sockets[0], job="not-" + JOB)
    assert JOB in ei.value.message and ei.value.fatal


def test_rank_taken_and_range(world_2x2: World) -> None:
    with collectived.Client(world_2x2.sockets[1], job=JOB, local_rank=1) as c:
        assert c.rank == 3
        with pytest.raises(collectived.RankTakenError):
            collectived.Client(world_2x2.sockets[1], job=JOB, local_rank=1)
    with pytest.raises(collectived.RankRangeError):
        collectived.Client(world_2x2.sockets[1], job=JOB, local_rank=2)


def _run_example(world: World, script: str) -> list[str]:
    procs = []
    src = os.path.join(REPO, "clients", "python", "src")  # works installed or not
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [src] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    for i in range(world.size):
        sock, lr = world.trainer_args(i)
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(EXAMPLES, script), "--socket", sock, "--job", JOB,
             "--local-rank", str(lr)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env=env))
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=180)
            outs.append(out)
            assert p.returncode == 0, out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


def test_train_numpy_example_2x2(world_2x2: World) -> None:
    outs = _run_example(world_2x2, "train_numpy.py")
    for o in outs:
        assert "OK" in o and "identical on all ranks: True" in o, o


def test_train_torch_example_2x2(world_2x2: World) -> None:
    pytest.importorskip("torch")
    for o in _run_example(world_2x2, "train_torch.py"):
        assert "OK" in o, o


def test_torch_tensors_2x2(world_2x2: World) -> None:
    pytest.importorskip("torch")
    for t, zmax, sent in world_2x2.run(T.torch_allreduce):
        assert t == [6.0] * 10 and zmax == 3.0 and sent < 128


def test_peer_lost(fresh_world_2x1: World) -> None:
    w = fresh_world_2x1
    sock, lr = w.trainer_args(0)
    with collectived.Client(sock, job=JOB, local_rank=lr) as c:
        h = c.allreduce_async(np.ones(4, np.float32))  # rank 1 never calls
        w.kill_node(1)
        # Killed before the ring formed, node 1 leaves the call waiting for
        # a ring that cannot form, up to the first-call bound (60 s here),
        # then PEER_LOST: wait past it.
        with pytest.raises(collectived.CollectivedError) as ei:
            h.wait(80)
        assert isinstance(ei.value, (collectived.PeerLostError, collectived.AbortedError,
                                     collectived.CollectiveTimeoutError)), ei.value


def test_collective_timeout_names_who_never_called(timeout_world_2x1: World) -> None:
    # World rank 1 is attached but never calls: rank 0's call fails with the
    # daemon's TIMEOUT, its message verbatim, before the client's own wait
    # (timeout plus margin) runs out.
    w = timeout_world_2x1
    (s0, lr0), (s1, lr1) = w.trainer_args(0), w.trainer_args(1)
    with collectived.Client(s0, job=JOB, local_rank=lr0) as c, \
            collectived.Client(s1, job=JOB, local_rank=lr1) as idle:
        assert idle.rank == 1
        t0 = time.monotonic()
        with pytest.raises(collectived.CollectiveTimeoutError) as ei:
            c.allreduce(np.ones(16, np.float32), name="late")
        took = time.monotonic() - t0
    e = ei.value
    assert isinstance(e, TimeoutError) and (e.code, e.code_name) == (16, "TIMEOUT")
    # The idle node times out itself and names its trainer with its pid.
    assert "not called by world rank 1 (node 1, local rank 0, pid" in e.message, e.message
    assert e.message in str(e)
    assert 2.5 < took < c.timeout, took


def test_own_daemon_lost(fresh_world_2x1: World) -> None:
    w = fresh_world_2x1
    sock, lr = w.trainer_args(0)
    with collectived.Client(sock, job=JOB, local_rank=lr) as c:
        h = c.allreduce_async(np.ones(4, np.float32))  # rank 1 never calls
        w.kill_node(0)
        with pytest.raises(collectived.ConnectionLostError, match="daemon at .*n0.sock"):
            h.wait(30)
        with pytest.raises(collectived.ConnectionLostError, match="unusable"):
            c.barrier()


def test_dropped_arrays_are_freed(small_quota_world: World) -> None:
    sock, lr = small_quota_world.trainer_args(0)
    with collectived.Client(sock, job=JOB, local_rank=lr) as c:
        assert c.info.shm_quota == 10 << 20
        for i in range(10):  # 40 MiB in all: only fits if each FREE went out
            x = c.zeros(1 << 20, "float32")
            x[:] = i
            c.allreduce(x)
            assert x[0] == i
            del x
        keep = c.zeros(1 << 20, "float32")
        with pytest.raises(collectived.QuotaError) as ei:
            c.zeros(2 << 20, "float32")  # 4 + 8 MiB > 10 MiB
        assert ei.value.code == 8 and not ei.value.fatal
        # big plain arrays go through a scratch segment; on QUOTA the client
        # drops idle scratch and retries with the exact size
        for n in (600_000, 1_400_000):
            y = np.arange(n, dtype=np.float32)
            c.allreduce(y)
            assert y[-1] == n - 1
        del keep


def test_segment_limit_is_per_trainer(few_segments_world: World) -> None:
    # A trainer that makes segments without end is refused at its own
    # limit (QUOTA, naming the setting) and goes on once it frees them; the
    # other trainer of the node makes its own meanwhile, unaffected.
    (made0, msg0, x0), (made1, msg1, x1) = few_segments_world.run(T.segments_until_refused)
    assert made0 == 16, (made0, msg0)
    assert "16 segments held" in msg0 and "limits.max_segments" in msg0, msg0
    assert (made1, msg1) == (8, "")
    assert x0 == x1 == 3.0


def test_back_to_back_phases_2x2(world_2x2: World) -> None:
    # Fresh trainer processes per phase, each phase starting as soon as the
    # last one returned: close() waits until the daemon has released the
    # rank, so a clean exit is never taken for a trainer lost mid-collective
    # by the next phase's first call (a race the C suite hit before).
    want = float(sum(range(1, world_2x2.size + 1)))
    for phase in range(8):
        assert world_2x2.run(T.one_allreduce) == [want] * world_2x2.size, f"phase {phase}"


def _run_python(code: str) -> str:
    """Runs code in a Python process of its own; returns what it printed."""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_without_the_lane_extension(world_1x1: World) -> None:
    # Installed without a C compiler, the package has no _lanewords: the
    # client still speaks protocol version 4, keeps to the socket, and works.
    code = (
        "import sys\n"
        "sys.modules['collectived._lanewords'] = None  # as if it was never built\n"
        "import numpy as np, collectived\n"
        "from collectived import _lane\n"
        f"with collectived.Client({world_1x1.sockets[0]!r}, job={JOB!r}, local_rank=0,"
        " rank_retry=5.0) as c:\n"
        "    x = np.ones(2, np.float32)\n"
        "    c.allreduce(x)\n"
        "    print(_lane.AVAILABLE, c.info.version, c.lane, x.tolist())\n")
    out = _run_python(code)
    assert out.split() == ["False", "4", "False", "[1.0,", "1.0]"], out


def test_default_wait_outlasts_the_first_call_timeout(world_1x1: World) -> None:
    # The world's daemon: collective timeout 20 s, first call 60 s. The
    # default wait outlasts the larger by two margins, so a trainer
    # waiting on a generation's first call gets the daemon's TIMEOUT
    # (naming who has not called), not its own WaitTimeoutError.
    with collectived.Client(world_1x1.sockets[0], job=JOB, local_rank=0, rank_retry=5.0) as c:
        assert c.info.version == collectived.PROTOCOL_VERSION == 4
        assert (c.info.timeout_ms, c.info.first_call_timeout_ms) == (20000, 60000)
        assert c.timeout == 60.0 + 2 * collectived.TIMEOUT_MARGIN > 60.0


def test_client_out_of_fds_says_so(world_1x1: World) -> None:
    # A trainer whose fd table is full cannot receive ALLOC_OK's fd (the
    # kernel truncates the control message): the call fails saying this
    # process is out of file descriptors, not that the daemon sent too many.
    code = (
        "import errno, os, resource\n"
        "import numpy as np, collectived\n"
        f"with collectived.Client({world_1x1.sockets[0]!r}, job={JOB!r}, local_rank=0,"
        " rank_retry=5.0) as c:\n"
        "    x = np.ones(1 << 20, np.float32)  # over the inline limit: a segment\n"
        "    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))\n"
        "    held = []\n"
        "    try:\n"
        "        while True:\n"
        "            held.append(os.open('/dev/null', os.O_RDONLY))\n"
        "    except OSError as e:\n"
        "        assert e.errno == errno.EMFILE, e\n"
        "    try:\n"
        "        c.allreduce(x)\n"
        "        print('no error')\n"
        "    except collectived.CollectivedError as e:\n"
        "        print(type(e).__name__, e)\n"
        "    for fd in held:\n"
        "        os.close(fd)\n")
    out = _run_python(code)
    assert out.startswith("ProtocolError"), out
    assert "could not be received: this process is out of file descriptors" in out, out
