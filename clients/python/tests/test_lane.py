"""The connection's lane (docs/PROTOCOL.md, LANE) in the Python client:
real daemons for what travels where, a scripted daemon for what a real one
cannot be made to do (answers that break the lane's rules, a call it never
takes)."""

from __future__ import annotations

import re
import time
from typing import Iterator

import numpy as np
import pytest

import collectived
from collectived import _lane
from collectived import _protocol as P

import trainer_fns as T
from scripted_daemon import ScriptedDaemon
from worlds import JOB, World

pytestmark = pytest.mark.skipif(
    not _lane.AVAILABLE, reason="the lane extension (collectived._lanewords) is not built: "
    "run scripts/setup.sh")


def _check_lane_use(results: list[dict], size: int) -> None:
    total = size * (size + 1) // 2  # sum of rank + 1
    for r in results:
        assert r["lane"] and r["version"] == 4, r
        assert r["4B"] == [total]
        assert r["8KiB"] == [total, total]
        assert r["segment64KiB"] == [total, total]
        assert r["broadcast"] == [size - 1] * 3
        assert r["two_in_flight"] == [[size * (size - 1) / 2] * 2, [10.0 * (size - 1)] * 2]
        assert r["mixed_in_flight"] == [[total, total], [total, total],
                                        [total + size, total + size],
                                        [total + 2 * size, total + 2 * size]]
        assert r["unwaited"] == [[True] * 3, [[total]] * 3]
        # What the lane answered: every call here (the 8 KiB one went
        # through a scratch segment: inline, its frame is over the slot's
        # 4 KiB). A small call made while another is in flight on the
        # lane is held until that one is answered, and then takes the
        # lane too, unless the 1 MiB call (the socket) is still in flight
        # then: it takes the socket.
        mixed = r["answered"].pop("mixed_in_flight")
        assert r["answered"] == {"4B": 1, "8KiB": 1, "segment64KiB": 1, "broadcast": 1,
                                 "barrier": 1, "two_in_flight": 2, "unwaited": 3}, r["answered"]
        assert 1 <= mixed <= 3, mixed
        # On the lane, at most a WAKE (16 bytes) crosses the socket.
        for key in ("4B", "segment64KiB", "broadcast", "barrier"):
            assert r["sent"][key] <= 16, (key, r["sent"])
        for key in ("two_in_flight", "unwaited"):
            assert r["sent"][key] <= 16 * r["answered"][key], (key, r["sent"])
        # The 8 KiB call's data never crossed the socket: only the ALLOC of
        # its scratch segment (24 bytes) and perhaps a WAKE did.
        assert r["sent"]["8KiB"] <= 24 + 16, r["sent"]


def test_lane_use_2x2(world_2x2: World) -> None:
    _check_lane_use(world_2x2.run(T.lane_use), 4)


def test_lane_use_2x1(fresh_world_2x1: World) -> None:
    # One trainer a node: the daemon runs small calls on its hot lane.
    _check_lane_use(fresh_world_2x1.run(T.lane_use), 2)


def test_no_lane_option_keeps_to_the_socket(world_1x1: World) -> None:
    sock, lr = world_1x1.trainer_args(0)
    with collectived.Client(sock, job=JOB, local_rank=lr, no_lane=True, rank_retry=5.0) as c:
        assert not c.lane and c.info.version == 4
        before = c.bytes_sent
        assert c.allreduce(np.ones(1, np.float32)).tolist() == [1.0]
        assert c.bytes_sent - before > 16 and c.lane_answers == 0


def test_spin_must_not_be_negative(world_1x1: World) -> None:
    sock, lr = world_1x1.trainer_args(0)
    with pytest.raises(ValueError, match=r"spin is -1 s"):
        collectived.Client(sock, job=JOB, local_rank=lr, spin=-1)


# ---------------------------------------------------------------- scripted


@pytest.fixture
def fake2(tmp_path) -> Iterator[ScriptedDaemon]:
    d = ScriptedDaemon(str(tmp_path / "d.sock"), version=2)
    yield d
    d.close()


@pytest.fixture
def laned(fake2: ScriptedDaemon) -> Iterator[collectived.Client]:
    with collectived.Client(fake2.path, job="demo", timeout=5.0) as c:
        assert c.lane
        yield c


def test_old_daemon_gets_version_2(tmp_path) -> None:
    # A daemon of protocol version 2 answers VERSION to 4 and 3; the client
    # asks again one version lower each time, and has its lane in 2.
    d = ScriptedDaemon(str(tmp_path / "d.sock"), version=2)
    try:
        with collectived.Client(d.path, job="demo") as c:
            assert c.info.version == 2 and c.lane
            assert c.allreduce(np.ones(2, np.float32)).tolist() == [2.0, 2.0]
        assert d.versions_asked == [4, 3, 2]
    finally:
        d.close()


def test_old_daemon_gets_version_1(tmp_path) -> None:
    # A daemon of protocol version 1 answers VERSION to 3 and 2; the
    # client asks again in version 1, without a lane.
    d = ScriptedDaemon(str(tmp_path / "d.sock"))
    try:
        with collectived.Client(d.path, job="demo") as c:
            assert c.info.version == 1 and not c.lane
            assert c.allreduce(np.ones(2, np.float32)).tolist() == [2.0, 2.0]
    finally:
        d.close()


@pytest.mark.parametrize("setting,value,message", [
    ("lane_size", 4096, "LANE_OK gives a lane of 4096 bytes, want 12288"),
    ("lane_fd", False, "LANE_OK (id 2) arrived without an fd"),
])
def test_bad_lane_ok_fails_the_connect(fake2: ScriptedDaemon, setting: str, value: object,
                                       message: str) -> None:
    setattr(fake2, setting, value)
    with pytest.raises(collectived.ProtocolError, match=re.escape(message)):
        collectived.Client(fake2.path, job="demo", timeout=5.0)


def test_wake_client_with_an_id_breaks_the_connection(laned: collectived.Client) -> None:
    with pytest.raises(collectived.CollectivedError,
                       match=re.escape("WAKE_CLIENT carries id 5, want 0")):
        laned.allreduce(np.ones(1, np.float32), name="wake-id", timeout=5.0)


def test_call_and_answer_on_the_lane(laned: collectived.Client, fake2: ScriptedDaemon) -> None:
    x = np.array([1.5, -2.0], np.float32)
    before = laned.bytes_sent
    assert laned.allreduce(x) is x
    assert x.tolist() == [3.0, -4.0]
    assert fake2.lane_calls == 1 and laned.lane_answers == 1
    # The scripted daemon sleeps on the socket: the client rang it, and
    # sent nothing else there.
    assert laned.bytes_sent - before == len(_lane.WAKE_FRAME)


def test_answer_on_the_socket_is_taken_too(laned: collectived.Client,
                                           fake2: ScriptedDaemon) -> None:
    x = np.ones(3, np.int32)
    laned.allreduce(x, name="lane-socket")
    assert x.tolist() == [2, 2, 2]
    assert fake2.lane_calls == 1 and laned.lane_answers == 0


def test_call_through_scratch_on_the_short_way(fake2: ScriptedDaemon) -> None:
    # 16 KiB does not fit the lane's slot: the data goes through a scratch
    # segment, the call on the lane; a slow answer (the reader thread takes
    # it) is copied back too, and the segment is reused, not made again.
    with collectived.Client(fake2.path, job="demo", timeout=5.0, spin=0.001) as c:
        x = np.arange(4096, dtype=np.float32)
        assert c.allreduce(x) is x and (x == 2 * np.arange(4096)).all()
        before = c.bytes_sent
        for k, name in enumerate(("", "lane-slow", "")):
            x[:] = k
            assert c.allreduce(x, name=name) is x
            assert (x == 2 * k).all(), name
        assert c.bytes_sent - before == 3 * len(_lane.WAKE_FRAME)  # nothing else on the socket
        assert fake2.lane_calls == 4 and c.lane_answers == 4
        assert all(m.flags & P.CALL_SHM and m.offset == 0 for m in fake2.calls)
        assert len({m.segment for m in fake2.calls}) == 1 and len(c._scratch) == 1
        assert not c._scratch[0].busy


def test_arrays_in_shared_segments_keep_to_zero_copy(fake2: ScriptedDaemon) -> None:
    # A client with segments of its own leaves calls too long for the slot
    # to the general path, which refers to such an array where it is.
    with collectived.Client(fake2.path, job="demo", timeout=5.0) as c:
        z = c.zeros(4096, "float32")
        z[:] = 3
        assert c.allreduce(z) is z and (z == 6).all()
        y = np.ones(4096, np.float32)  # not in a segment: copied through scratch
        assert c.allreduce(y) is y and (y == 2).all()
        zc, yc = fake2.calls[-2:]
        assert zc.flags & P.CALL_SHM and zc.segment in c._segments and zc.offset == 0
        assert yc.flags & P.CALL_SHM and yc.segment not in c._segments


def test_short_calls_beside_another_threads_requests_2x2(world_2x2: World) -> None:
    # A monitoring thread's STATUS requests (on the socket, back to back)
    # between the calling thread's small calls, against real daemons: every
    # result right and every status answered. A call made while a status
    # is in flight takes the general path (about half of them here), the
    # others the short way on the lane.
    n = 1500
    for r in world_2x2.run(T.calls_beside_status, (n,)):
        assert r["bad"] == [] and r["errors"] == [], r
        assert r["statuses"] > 0, r
        assert r["lane_answers"] >= n // 10, r


@pytest.mark.parametrize("fault,cause", [
    (ValueError("lane is closed"), "lane is closed"),               # closed under the call
    (BrokenPipeError(32, "Broken pipe"), r"\[Errno 32\] Broken pipe"),  # the socket, for its WAKE
])
def test_short_call_that_cannot_be_sent_ends_the_connection(fake2: ScriptedDaemon,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            fault: BaseException, cause: str) -> None:
    # A failure to put the call on the lane is the connection's, as a failed
    # send on the general path is: a ConnectionLostError naming the call,
    # the path and the cause; the calls after it fail as well, with no slot
    # left taken.
    def put(self: _lane.Lane, *a: object) -> int:
        raise fault

    with collectived.Client(fake2.path, job="demo", timeout=5.0) as c:
        monkeypatch.setattr(_lane.Lane, "put_call", put)
        with pytest.raises(collectived.ConnectionLostError,
                           match=rf"allreduce\(name='x', count=2\): sending allreduce\(name='x', count=2\) "
                                 rf"to {re.escape(fake2.path)}: {cause}"):
            c.allreduce(np.ones(2, np.float32), name="x")
        monkeypatch.undo()
        with pytest.raises(collectived.ConnectionLostError, match="connection unusable"):
            c.allreduce(np.ones(2, np.float32))
        assert c._inflight is None or c._inflight._used == 0


def test_rings_that_find_nothing_do_no_harm(laned: collectived.Client,
                                            fake2: ScriptedDaemon) -> None:
    # Every answer is followed by a ring the caller did not ask for: the
    # reader thread looks at the lane while the next calls are under way
    # there (taken by their callers, on the client's short way), and must
    # neither take their answers nor fail.
    x = np.ones(3, np.float32)
    for k in range(200):
        x[:] = k
        assert laned.allreduce(x, name="lane-ring") is x
        assert x.tolist() == [2.0 * k] * 3, k
    assert fake2.lane_calls == 200 and laned.lane_answers == 200


@pytest.mark.parametrize("where,spin,name", [
    ("put", 0.5, "p"),                  # the call is on the lane, its WAKE not sent yet
    ("taken", 0.5, "t"),                # its answer is in the caller's buffer
    ("watched", 0.001, "lane-slow"),    # the watch ended with no answer (it comes in 50 ms)
    ("entered", 0.001, "lane-slow"),    # and the call was entered among those in flight
])
@pytest.mark.parametrize("n", [2, 4096])  # inline, and through a scratch segment
def test_interrupted_short_call_leaves_the_client_in_order(fake2: ScriptedDaemon,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           where: str, spin: float,
                                                           name: str, n: int) -> None:
    # A KeyboardInterrupt, as a signal handled between two of the short
    # way's steps raises it: the interrupted call still ends (its answer
    # in its buffer), and the calls after it go on, in order, with no
    # in-flight slot or lane left taken.
    real_put, real_take = _lane.Lane.put_call, _lane.Lane.take_call_ok_held
    real_enter = collectived.Client._enter_short

    def put(self: _lane.Lane, *a: object) -> int:
        got = real_put(self, *a)  # type: ignore[arg-type]
        if where == "put":
            raise KeyboardInterrupt
        return got

    def take(self: _lane.Lane, rid: int, result: object, seconds: float) -> tuple[int, int, int]:
        got = real_take(self, rid, result, seconds)
        if where in ("taken", "watched"):
            assert got[0] == (1 if where == "taken" else 0), got
            raise KeyboardInterrupt
        return got

    def enter(self: collectived.Client, *a: object) -> object:
        h = real_enter(self, *a)  # type: ignore[arg-type]
        if where == "entered":
            raise KeyboardInterrupt
        return h

    with collectived.Client(fake2.path, job="demo", timeout=5.0, spin=spin) as c:
        monkeypatch.setattr(_lane.Lane, "put_call", put)
        monkeypatch.setattr(_lane.Lane, "take_call_ok_held", take)
        monkeypatch.setattr(collectived.Client, "_enter_short", enter)
        x = np.ones(n, np.float32)
        with pytest.raises(KeyboardInterrupt):
            c.allreduce(x, name=name)
        monkeypatch.undo()
        for k in range(3):
            y = np.full(3, k, np.int64)
            assert c.allreduce(y).tolist() == [2 * k] * 3, k
        assert (x == 2).all()
        assert [m.name for m in fake2.calls] == [name, "", "", ""]
        assert not c._pending and c._lane_rid == 0
        assert c._inflight is None or c._inflight._used == 0
        assert not any(s.busy for s in c._scratch)


def test_slow_answer_reaches_a_caller_that_stopped_watching(fake2: ScriptedDaemon) -> None:
    # The answer comes 50 ms after the call, long after the caller's 1 ms
    # watch: the daemon rings the socket and the reader thread takes it.
    with collectived.Client(fake2.path, job="demo", spin=0.001) as c:
        x = np.ones(2, np.float64)
        t0 = time.monotonic()
        c.allreduce(x, name="lane-slow")
        assert time.monotonic() - t0 >= 0.04
        assert x.tolist() == [2.0, 2.0] and c.lane_answers == 1
        c.allreduce(x)  # and the lane goes on
        assert x.tolist() == [4.0, 4.0] and c.lane_answers == 2


def test_error_on_the_lane_fails_only_its_call(laned: collectived.Client) -> None:
    with pytest.raises(collectived.MismatchError, match="count=3"):
        laned.allreduce(np.ones(4, np.float32), name="mismatch")
    assert laned.allreduce(np.ones(1, np.float32)).tolist() == [2.0]


@pytest.mark.parametrize("script,message", [
    ("lane-skip", "lane: 2 answers put since the last taken, want 1"),
    ("lane-type", "lane: STATUS_OK (id 0): only CALL_OK and ERROR may travel the lane"),
    ("lane-long", "lane: CALL_OK of 4106 bytes does not fit the lane's 4096"),
    ("lane-short", "CALL_OK result is 0 bytes, the call sent 4"),
    ("lane-id", "CALL_OK carries id 99, which matches no request in flight"),
])
def test_answer_breaking_the_lane_rules_breaks_the_connection(
        laned: collectived.Client, script: str, message: str) -> None:
    with pytest.raises(collectived.ProtocolError, match=re.escape(message)):
        laned.allreduce(np.ones(1, np.float32), name=script)
    with pytest.raises(collectived.ConnectionLostError, match=re.escape(message)):
        laned.allreduce(np.ones(1, np.float32))


def test_call_made_while_the_lane_is_busy_waits_for_it(laned: collectived.Client,
                                                       fake2: ScriptedDaemon) -> None:
    # The first call's answer comes late ("lane-slow", 50 ms): the second,
    # made meanwhile, stays in the client until it is answered, then takes
    # the lane in its turn; no call crosses the socket, only WAKEs.
    a, b = np.ones(2, np.float32), np.full(2, 3, np.int64)
    received = fake2.bytes_received
    ha = laned.allreduce_async(a, name="lane-slow")
    hb = laned.allreduce_async(b, name="second")
    assert not ha.done() and not hb.done()
    assert hb.wait().tolist() == [6, 6] and ha.wait().tolist() == [2.0, 2.0]
    assert [c.name for c in fake2.calls[-2:]] == ["lane-slow", "second"]
    assert fake2.lane_calls == 2 and laned.lane_answers == 2
    assert fake2.bytes_received - received == 2 * len(_lane.WAKE_FRAME)


def test_held_calls_fail_when_the_client_closes(fake2: ScriptedDaemon) -> None:
    # Calls held behind one the daemon never answers ("silent") fail, with
    # it, when the client closes; nothing of them was sent.
    c = collectived.Client(fake2.path, job="demo", timeout=5)
    hs = [c.allreduce_async(np.ones(1, np.float32), name=n) for n in ("silent", "b", "c")]
    c.close()
    for h in hs:
        with pytest.raises(collectived.ConnectionLostError, match="client closed"):
            h.wait()
    assert [m.name for m in fake2.calls] == ["silent"]


def test_held_call_wait_times_out(fake2: ScriptedDaemon) -> None:
    # A held call's wait ends at its timeout like any other (the call ahead
    # of it is never answered), and the call stays in flight.
    with collectived.Client(fake2.path, job="demo", timeout=5) as c:
        c.allreduce_async(np.ones(1, np.float32), name="silent")
        h = c.allreduce_async(np.ones(1, np.float32), name="b")
        t0 = time.monotonic()
        with pytest.raises(collectived.WaitTimeoutError, match="still in flight"):
            h.wait(timeout=0.2)
        assert 0.2 <= time.monotonic() - t0 < 2
        assert not h.done()


def test_call_the_daemon_never_takes_times_out(fake2: ScriptedDaemon) -> None:
    # Nothing may follow a call on the lane on the socket before the daemon
    # has taken it; a daemon that never does is waited for `timeout`, not
    # forever.
    fake2.ignore_wakes = True
    with collectived.Client(fake2.path, job="demo", timeout=0.5) as c:
        h = c.allreduce_async(np.ones(1, np.float32))
        with pytest.raises(collectived.WaitTimeoutError,
                           match=r"did not take the call on the lane within 0\.5 s"):
            c.status()
        with pytest.raises(collectived.CollectivedError):
            h.wait()
