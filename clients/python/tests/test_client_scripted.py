"""Client behaviour against a scripted peer (real socket, real memfds):
the paths a real daemon cannot be made to take on demand."""

from __future__ import annotations

import array
import gc
import os
import re
import subprocess
import sys
import time
from typing import Iterator

import numpy as np
import pytest

import collectived
from collectived import _protocol as P

from scripted_daemon import ScriptedDaemon


@pytest.fixture
def fake(tmp_path) -> Iterator[ScriptedDaemon]:
    d = ScriptedDaemon(str(tmp_path / "d.sock"))
    yield d
    d.close()


@pytest.fixture
def client(fake: ScriptedDaemon) -> Iterator[collectived.Client]:
    with collectived.Client(fake.path, job="demo", label="pytest") as c:
        yield c


def test_status_past_max_frame(fake: ScriptedDaemon, client: collectived.Client) -> None:
    # The status of the largest worlds is megabytes: a STATUS_OK past
    # max_frame (4096 here) is taken whole, up to MAX_STATUS_FRAME, and the
    # connection goes on; one past that bound breaks it.
    fake.status_pad = 3 << 20
    st = client.status()
    assert st["job"] == "demo" and len(st["pad"]) == 3 << 20
    x = np.ones(4, dtype=np.float32)
    client.allreduce(x)
    assert x[0] == 2
    fake.status_pad = P.MAX_STATUS_FRAME
    with pytest.raises(collectived.ProtocolError, match="over the bound of 8388608"):
        client.status()


def test_hello_fields(client: collectived.Client) -> None:
    assert (client.rank, client.size, client.local_rank, client.local_size) == (0, 2, 0, 2)
    assert (client.node_rank, client.node_count, client.generation) == (0, 1, 7)
    assert client.inline_limit == 64
    # A version-1 daemon states only timeout_ms (1000): twice it plus two
    # 5 s margins.
    assert client.info.version == 1
    assert client.timeout == pytest.approx(12.0)


@pytest.mark.parametrize("version,want", [(3, 70.0), (2, 12.0), (1, 12.0)])
def test_default_wait_from_hello_ok(tmp_path, version: int, want: float) -> None:
    # A daemon with a 1 s collective timeout and a 60 s first-call one: in
    # version 3 the client's default wait outlasts the larger (plus two
    # 5 s margins), so the daemon's TIMEOUT naming who has not called
    # comes first on a generation's first call too. An older daemon does
    # not state the first call's timeout: twice timeout_ms plus 10 s.
    d = ScriptedDaemon(str(tmp_path / "d.sock"), version=version, first_call_timeout_ms=60000)
    try:
        with collectived.Client(d.path, job="demo", no_lane=True) as c:
            assert c.info.version == version
            assert c.info.first_call_timeout_ms == (60000 if version >= 3 else None)
            assert c.timeout == pytest.approx(want)
            if version >= 3:
                assert c.timeout > 60.0
        # An explicit timeout wins.
        with collectived.Client(d.path, job="demo", no_lane=True, timeout=2.5) as c:
            assert c.timeout == 2.5
    finally:
        d.close()


def test_default_wait_timeout_rules() -> None:
    assert collectived.TIMEOUT_MARGIN == 5.0
    assert collectived.default_wait_timeout(300000, 600000) == 610.0
    assert collectived.default_wait_timeout(600000, 300000) == 610.0
    assert collectived.default_wait_timeout(300000) == 610.0
    # What the client waited before version 3 (timeout + 10%, at least
    # 5 s) never exceeds 2 * timeout + 10 s; it stays the floor anyway.
    assert collectived.default_wait_timeout(1) == pytest.approx(10.002)
    # No timeout stated at all: the fallback.
    assert collectived.default_wait_timeout(0) == 600.0
    assert collectived.default_wait_timeout(0, 0) == 600.0


def test_fallback_asks_one_version_lower_each_time(tmp_path) -> None:
    for version, asked in ((1, [4, 3, 2, 1]), (2, [4, 3, 2]), (3, [4, 3]), (4, [4])):
        d = ScriptedDaemon(str(tmp_path / f"d{version}.sock"), version=version)
        try:
            with collectived.Client(d.path, job="demo", no_lane=True) as c:
                assert c.info.version == version
            assert d.versions_asked == asked
        finally:
            d.close()
    d = ScriptedDaemon(str(tmp_path / "none.sock"), version=0)
    try:
        with pytest.raises(collectived.VersionError, match="HELLO speaks protocol version 1, "
                                                           "daemon speaks 0"):
            collectived.Client(d.path, job="demo")
        assert d.versions_asked == [4, 3, 2, 1]
    finally:
        d.close()


def test_answer_in_an_older_version_is_taken(tmp_path) -> None:
    # A daemon may answer HELLO in an older version than asked: the
    # connection speaks that one. A later one is refused.
    d = ScriptedDaemon(str(tmp_path / "d.sock"), version=3)
    try:
        d.answer_version = 2
        with collectived.Client(d.path, job="demo", no_lane=True) as c:
            assert c.info.version == 2 and c.info.first_call_timeout_ms is None
            assert c.timeout == pytest.approx(12.0)
        d.version, d.answer_version = 2, 3
        with pytest.raises(collectived.ProtocolError, match="daemon answered HELLO of protocol "
                                                            "version 2 in version 3"):
            collectived.Client(d.path, job="demo", no_lane=True)
    finally:
        d.close()


def test_env_defaults(fake: ScriptedDaemon, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLLECTIVED_SOCKET", fake.path)
    monkeypatch.setenv("COLLECTIVED_JOB", "demo")
    with collectived.Client() as c:
        assert c.path == fake.path and c.job == "demo"
    monkeypatch.delenv("COLLECTIVED_JOB")
    with pytest.raises(collectived.JobError) as ei:
        collectived.Client()
    assert ei.value.code == 3 and ei.value.fatal
    assert '"default"' in ei.value.message and '"demo"' in ei.value.message


def test_socket_argument_then_env_then_default(fake: ScriptedDaemon, tmp_path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLLECTIVED_SOCKET", str(tmp_path / "elsewhere.sock"))
    with collectived.Client(fake.path, job="demo") as c:  # the argument beats the env
        assert c.path == fake.path
    # Without either, the daemon's own default path (config.DefaultSocketPath).
    config_go = os.path.join(os.path.dirname(__file__), "..", "..", "..", "config", "config.go")
    with open(config_go, encoding="utf-8") as f:
        m = re.search(r'DefaultSocketPath\s*=\s*"([^"]+)"', f.read())
    assert m and collectived.DEFAULT_SOCKET == m.group(1), m
    monkeypatch.delenv("COLLECTIVED_SOCKET")
    if not os.path.exists(collectived.DEFAULT_SOCKET):  # no system daemon to reach by accident
        with pytest.raises(collectived.ConnectionLostError,
                           match=re.escape(collectived.DEFAULT_SOCKET)):
            collectived.Client(job="demo", connect_timeout=1.0)


def test_rank_retry(fake: ScriptedDaemon) -> None:
    fake.rank_taken_times = 1
    with pytest.raises(collectived.RankTakenError, match="held by pid 1"):
        collectived.Client(fake.path, job="demo", local_rank=0)
    fake.rank_taken_times = 3
    with collectived.Client(fake.path, job="demo", local_rank=0, rank_retry=5.0) as c:
        assert c.rank == 0
    assert fake.rank_taken_times == 0


def test_refused_credentials(fake: ScriptedDaemon) -> None:
    fake.refuse = True
    for _ in range(5):  # whether or not our HELLO went out before the close
        with pytest.raises(collectived.AccessDeniedError, match="uid 1000 is not allowed") as ei:
            collectived.Client(fake.path, job="demo")
        assert ei.value.fatal and ei.value.code == 7


def test_connect_failure_names_path(tmp_path) -> None:
    with pytest.raises(collectived.ConnectionLostError, match="nope.sock"):
        collectived.Client(str(tmp_path / "nope.sock"), job="x")


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
def test_inline_allreduce(client: collectived.Client, fake: ScriptedDaemon, dtype: str) -> None:
    x = np.arange(1, 5, dtype=dtype)
    assert client.allreduce(x) is x
    np.testing.assert_array_equal(x, np.arange(1, 5, dtype=dtype) * 2)
    c = fake.calls[-1]
    assert (c.op, c.reduce, c.count, c.flags) == (P.OP_ALLREDUCE, P.RED_SUM, 4, 0)


def test_scratch_path_for_large_plain_arrays(client: collectived.Client,
                                            fake: ScriptedDaemon) -> None:
    x = np.arange(100, dtype=np.float64)  # 800 bytes > inline limit 64
    client.allreduce(x, op="prod")
    np.testing.assert_array_equal(x, np.arange(100, dtype=np.float64) ** 2)
    assert fake.calls[-1].flags == P.CALL_SHM
    client.allreduce(x, op="max")  # reuses the idle scratch segment
    assert {c.segment for c in fake.calls} == {1}


def test_zero_copy_segment_sends_no_data(client: collectived.Client,
                                         fake: ScriptedDaemon) -> None:
    x = client.zeros((64, 64), "float32")
    x[:] = 1.5
    before = client.bytes_sent
    client.allreduce(x)
    assert client.bytes_sent - before < 64  # header + description only, no 16 KiB of data
    assert (x == 3.0).all()
    c = fake.calls[-1]
    assert (c.flags, c.offset, c.count) == (P.CALL_SHM, 0, 64 * 64)
    # a slice at an offset travels as (segment, offset) too
    client.allreduce(x[10:12])
    assert (fake.calls[-1].segment, fake.calls[-1].offset) == (c.segment, 10 * 64 * 4)
    assert (x[10:12] == 6.0).all() and (x[12:] == 3.0).all()


def test_segment_freed_when_array_dropped(client: collectived.Client,
                                          fake: ScriptedDaemon) -> None:
    x = client.empty(1000, "int64")
    y = x[5:]  # a view keeps the segment alive
    del x
    gc.collect()
    client.barrier()
    assert fake.frees == []
    del y
    gc.collect()
    client.barrier()  # the queued FREE goes out with the next request
    deadline = time.monotonic() + 5
    while not fake.frees and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fake.frees == [1]


def test_register_path(client: collectived.Client, fake: ScriptedDaemon) -> None:
    x = client.empty(300, "int32", register=True)
    x[:] = 7
    client.allreduce(x)
    assert fake.registered == [fake.calls[-1].segment]
    assert (x == 14).all()


def test_stdlib_buffers(client: collectived.Client, fake: ScriptedDaemon) -> None:
    a = array.array("d", [1.0, -2.0])
    client.allreduce(a)
    assert list(a) == [2.0, -4.0]
    mv = client.buffer(16).cast("i")
    mv[0], mv[3] = 5, 9
    client.allreduce(mv, op="sum")
    assert list(mv) == [10, 0, 0, 18]
    assert fake.calls[-1].flags == P.CALL_SHM


def test_core_runs_without_numpy_or_torch(fake: ScriptedDaemon) -> None:
    # The core is standard library only: with NumPy and PyTorch unimportable,
    # a trainer still connects and reduces Python buffers inline and in a
    # shared segment.
    code = (
        "import sys\n"
        "sys.modules['numpy'] = sys.modules['torch'] = None  # importing them fails\n"
        "import array, collectived\n"
        "with collectived.Client(sys.argv[1], job='demo') as c:\n"
        "    a = array.array('f', [1.0, 2.5])\n"
        "    assert c.allreduce(a) is a and list(a) == [2.0, 5.0], list(a)\n"
        "    b = c.buffer(8).cast('i')\n"
        "    b[0], b[1] = 3, -4\n"
        "    c.allreduce(b, op='sum')\n"
        "    assert list(b) == [6, -8], list(b)\n"
        "print('stdlib only: OK')\n")
    src = os.path.join(os.path.dirname(__file__), "..", "src")
    r = subprocess.run([sys.executable, "-c", code, fake.path], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, PYTHONPATH=src))
    assert r.returncode == 0 and "stdlib only: OK" in r.stdout, r.stdout + r.stderr


def test_broadcast_and_barrier_descriptions(client: collectived.Client,
                                            fake: ScriptedDaemon) -> None:
    x = np.array([1, 2, 3], dtype=np.int32)
    client.broadcast(x, root=1, name="w")
    client.barrier(name="end")
    b, bar = fake.calls[-2:]
    assert (b.op, b.dtype, b.reduce, b.root, b.name) == (P.OP_BROADCAST, P.DT_INT32, 0, 1, "w")
    assert (bar.op, bar.dtype, bar.count, bar.flags, bar.name) == (P.OP_BARRIER, 0, 0, 0, "end")
    with pytest.raises(ValueError, match="root 2 outside world of 2"):
        client.broadcast(x, root=2)


def test_out_of_order_replies(client: collectived.Client) -> None:
    a = np.ones(2, dtype=np.float32)
    b = np.full(2, 3, dtype=np.float32)
    ha = client.allreduce_async(a, name="hold")
    time.sleep(0.05)
    assert not ha.done()
    hb = client.allreduce_async(b)
    assert hb.wait() is b
    assert ha.wait() is a
    assert ha.seq == 0 and hb.seq == 1
    assert (a == 2).all() and (b == 6).all()


def test_mismatch_error(client: collectived.Client) -> None:
    with pytest.raises(collectived.MismatchError) as ei:
        client.allreduce(np.ones(3, np.float32), name="mismatch")
    assert ei.value.code == 15 and ei.value.code_name == "MISMATCH"
    assert "world rank 1" in ei.value.message and not ei.value.fatal
    client.barrier()  # the connection goes on


def test_wait_timeout_never_hangs(client: collectived.Client) -> None:
    h = client.allreduce_async(np.ones(2, np.float32), name="silent")
    t0 = time.monotonic()
    with pytest.raises(collectived.WaitTimeoutError) as ei:
        h.wait(0.2)
    assert isinstance(ei.value, TimeoutError)
    assert 0.15 < time.monotonic() - t0 < 5
    assert "still in flight" in str(ei.value) and not h.done()


def test_fatal_error_fails_everything(client: collectived.Client) -> None:
    pending = client.allreduce_async(np.ones(2, np.float32), name="silent")
    with pytest.raises(collectived.ProtocolError, match="scripted fatal error") as ei:
        client.allreduce(np.ones(2, np.float32), name="fatal")
    assert ei.value.fatal
    with pytest.raises(collectived.ProtocolError):
        pending.wait(2)
    with pytest.raises(collectived.ConnectionLostError, match="unusable"):
        client.barrier()


def test_unknown_frame_from_daemon(client: collectived.Client) -> None:
    with pytest.raises(collectived.ProtocolError, match="unknown_type"):
        client.allreduce(np.ones(2, np.float32), name="garbage")


def test_version2_frame_on_version1_connection(client: collectived.Client) -> None:
    # The codec knows WAKE_CLIENT (for the shared vectors), but this
    # connection speaks version 1: the frame is refused as such, by name.
    with pytest.raises(collectived.ProtocolError,
                       match=r"WAKE_CLIENT \(type 0x91, id 0\) is a protocol version 2 frame; "
                             r"this connection speaks version 1"):
        client.allreduce(np.ones(2, np.float32), name="wake")


def test_close_fails_pending_and_is_idempotent(fake: ScriptedDaemon) -> None:
    c = collectived.Client(fake.path, job="demo")
    h = c.allreduce_async(np.ones(2, np.float32), name="silent")
    c.close()
    c.close()
    with pytest.raises(collectived.ConnectionLostError, match="client closed"):
        h.wait(1)


def test_bad_buffers(client: collectived.Client, fake: ScriptedDaemon) -> None:
    # An element type the protocol does not carry: our TypeError, naming it
    # and what is supported.
    for dt in (np.complex64, np.bool_, np.int16):
        with pytest.raises(collectived.DTypeError,
                           match=rf"has {np.dtype(dt).name} .*supported: float32, float64, "
                                 r"float16, bfloat16 .*int32, int64, int8, uint8") as ei:
            client.allreduce(np.ones(2, dt))
        assert isinstance(ei.value, TypeError) and ei.value.code is None
    # Version 3's types and ops on this version-1 connection: said as such.
    with pytest.raises(collectived.NeedsVersionError,
                       match=r"dtype float16 needs protocol version 3; the daemon at .* speaks "
                             r"version 1 on this connection"):
        client.allreduce(np.ones(2, np.float16))
    with pytest.raises(collectived.NeedsVersionError, match="dtype uint8 needs protocol version 3"):
        client.allreduce(np.ones(2, np.uint8))
    with pytest.raises(collectived.UnsupportedError, match="reduce op avg needs protocol version 3"):
        client.allreduce(np.ones(2, np.float32), op="avg")
    with pytest.raises(ValueError, match="not C-contiguous"):
        client.allreduce(np.ones((4, 4), np.float32)[:, 1])
    with pytest.raises(ValueError, match="read-only"):
        client.allreduce(np.frombuffer(b"\0" * 8, np.float32))
    with pytest.raises(ValueError, match="unknown reduce op 'median'"):
        client.allreduce(np.ones(2, np.float32), op="median")
    assert fake.calls == []  # none of them was sent
    with pytest.raises(TypeError, match="not a NumPy array"):
        client.allreduce([1.0, 2.0])
    with pytest.raises(ValueError, match="call name is 256 bytes"):
        client.barrier(name="n" * 256)


def test_zero_count_and_status(client: collectived.Client, fake: ScriptedDaemon) -> None:
    x = np.zeros(0, np.float32)
    client.allreduce(x)
    assert fake.calls[-1].count == 0 and fake.calls[-1].flags == 0
    assert client.status()["job"] == "demo"


def test_no_fd_leak(fake: ScriptedDaemon) -> None:
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with collectived.Client(fake.path, job="demo") as c:
            c.allreduce(np.arange(100, dtype=np.float32))
            x = c.zeros(10)
            c.allreduce(x)
            del x
    gc.collect()
    deadline = time.monotonic() + 5  # the scripted peer's threads close their side
    while len(os.listdir("/proc/self/fd")) > before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(os.listdir("/proc/self/fd")) <= before


def test_use_after_fork_is_refused(client: collectived.Client) -> None:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            client.barrier()
            msg = b"no error"
        except collectived.CollectivedError as e:
            msg = str(e).encode()
        os.write(w, msg)
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    msg = os.read(r, 1000).decode()
    os.close(r)
    assert "make a new one in process" in msg, msg
    client.barrier()  # the parent's connection is untouched
