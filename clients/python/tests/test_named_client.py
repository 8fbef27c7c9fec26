"""Named calls (``ordered=False``, protocol version 4) in the client,
against the scripted peer: the NAMED flag on every op, whichever way the
data goes (inline, shared memory, a scratch segment); never on the lane;
held in order behind a call on the lane; and what the client refuses
before sending: a named call without a name, a second call of a name in
flight, a named call on a connection of version 3. (Named calls against
real daemons: test_named_daemon.py.)"""

from __future__ import annotations

import time
from typing import Iterator

import numpy as np
import pytest

import collectived
from collectived import _protocol as P

from scripted_daemon import ScriptedDaemon


def _until(cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


@pytest.fixture
def fake4(tmp_path) -> Iterator[ScriptedDaemon]:
    d = ScriptedDaemon(str(tmp_path / "d.sock"), version=4, inline_limit=4096)
    yield d
    d.close()


@pytest.fixture
def c4(fake4: ScriptedDaemon) -> Iterator[collectived.Client]:
    with collectived.Client(fake4.path, job="demo", timeout=10.0) as c:
        assert c.info.version == 4 and c.lane
        yield c


def test_every_op_sends_the_flag(c4: collectived.Client, fake4: ScriptedDaemon) -> None:
    x = np.ones(4, np.float32)
    c4.allreduce(x, name="ar", ordered=False)
    c4.allreduce_async(x, name="ar.async", ordered=False).wait()
    c4.broadcast(x, 1, name="bc", ordered=False)
    c4.broadcast_async(x, 1, name="bc.async", ordered=False).wait()
    c4.reduce(x, 0, name="rd", ordered=False)
    c4.reduce_async(x, 0, name="rd.async", ordered=False).wait()
    c4.allgather(x, name="ag", ordered=False)
    c4.allgatherv(x, [4, 2], name="agv", ordered=False)
    c4.reduce_scatter(x, name="rs", ordered=False)
    c4.reduce_scatterv(x, [3, 1], name="rsv", ordered=False)
    c4.barrier(name="b", ordered=False)
    c4.barrier_async(name="b.async", ordered=False).wait()
    names = ["ar", "ar.async", "bc", "bc.async", "rd", "rd.async", "ag", "agv", "rs", "rsv",
             "b", "b.async"]
    assert [m.name for m in fake4.calls] == names
    assert all(m.named and m.flags & P.CALL_NAMED for m in fake4.calls)
    # None went on the lane, small as they are; results as ordered calls'.
    assert fake4.lane_calls == 0 and c4.lane_answers == 0
    assert (x == 2 ** 4).all()  # four sums (allreduce, reduce) in a world of two


def test_ordered_calls_have_no_flag_and_take_the_lane(c4: collectived.Client,
                                                      fake4: ScriptedDaemon) -> None:
    x = np.ones(4, np.float32)
    c4.allreduce(x, name="a")                      # ordered=True, the default
    c4.allreduce(x, name="b", ordered=True)
    c4.allreduce(x, name="c", ordered=False)
    c4.allreduce(x, name="d")
    assert [(m.name, m.named) for m in fake4.calls] == [
        ("a", False), ("b", False), ("c", True), ("d", False)]
    assert fake4.lane_calls == 3  # a, b, d: the named one took the socket
    assert (x == 16).all()


def test_named_in_shared_memory_and_through_scratch(c4: collectived.Client,
                                                    fake4: ScriptedDaemon) -> None:
    seg = c4.zeros(8, "float64")
    seg += 1.5
    c4.allreduce(seg, name="seg", ordered=False)
    big = np.ones(5000, np.float32)  # over the inline limit (4096 bytes): a scratch segment
    c4.allreduce_async(big, name="big", ordered=False).wait()
    out = c4.zeros(16, "float64")
    c4.allgather(seg, out, name="gather.seg", ordered=False)
    flags = [m.flags for m in fake4.calls]
    assert flags == [P.CALL_NAMED | P.CALL_SHM, P.CALL_NAMED | P.CALL_SHM,
                     P.CALL_NAMED | P.CALL_SHM | P.CALL_EXT]
    assert (seg == 3.0).all() and (big == 2.0).all() and (out == 3.0).all()
    assert fake4.lane_calls == 0


def test_a_named_call_needs_a_name(c4: collectived.Client, fake4: ScriptedDaemon) -> None:
    x = np.ones(4, np.float32)
    for call in (lambda: c4.allreduce(x, ordered=False),
                 lambda: c4.allreduce_async(x, ordered=False),
                 lambda: c4.broadcast_async(x, 0, ordered=False),
                 lambda: c4.allgather(x, ordered=False),
                 lambda: c4.barrier(ordered=False)):
        with pytest.raises(ValueError, match="ordered=False makes a named call, matched across "
                                             "the world by its name: give it a name="):
            call()
    with pytest.raises(collectived.UsageError):
        c4.reduce_scatter_async(x, ordered=False)
    assert fake4.calls == []
    c4.allreduce(x)  # the client goes on
    assert (x == 2).all()


def test_second_call_of_a_name_in_flight_is_refused(c4: collectived.Client,
                                                    fake4: ScriptedDaemon) -> None:
    x, y = np.ones(4, np.float32), np.ones(2, np.float64)
    h = c4.allreduce_async(x, name="hold", ordered=False)  # answered after the next call
    for again in (lambda: c4.allreduce_async(y, name="hold", ordered=False),
                  lambda: c4.allreduce(y, name="hold", ordered=False),
                  lambda: c4.broadcast_async(y, 0, name="hold", ordered=False),
                  lambda: c4.allgather(y, name="hold", ordered=False)):
        with pytest.raises(ValueError, match=r"a named call of name 'hold' is already in flight "
                                             r"on this client \(allreduce\(name='hold', "
                                             r"count=4\)\): wait for it") as ei:
            again()
        assert isinstance(ei.value, collectived.UsageError)
    _until(lambda: len(fake4.calls) >= 1)
    time.sleep(0.05)
    assert [m.name for m in fake4.calls] == ["hold"]  # none of them was sent
    assert not h.done()
    # An ordered call of that name is no named call: it goes.
    c4.allreduce_async(y, name="hold2").wait()
    h.wait()
    # Once answered, the name is free again.
    h = c4.allreduce_async(y, name="hold", ordered=False)
    c4.allreduce(x, name="other", ordered=False)
    h.wait()
    assert [m.name for m in fake4.calls] == ["hold", "hold2", "hold", "other"]
    assert (x == 4).all() and (y == 4).all()


def test_name_freed_after_an_error(c4: collectived.Client, fake4: ScriptedDaemon) -> None:
    x = np.ones(4, np.float32)
    for _ in range(2):
        with pytest.raises(collectived.MismatchError):
            c4.allreduce(x, name="mismatch", ordered=False)
    h = c4.allreduce_async(x, name="mismatch", ordered=False)
    assert isinstance(h.exception(), collectived.MismatchError)
    assert len(fake4.calls) == 3


def test_name_freed_before_callbacks_run(c4: collectived.Client) -> None:
    # A done callback (or a waiter) may call the same name at once.
    x = np.ones(4, np.float32)
    again: list[collectived.Handle] = []
    h = c4.allreduce_async(x, name="n", ordered=False)
    h.add_done_callback(lambda _h: again.append(
        c4.allreduce_async(np.ones(1, np.float32), name="n", ordered=False)))
    h.wait()
    _until(lambda: bool(again))
    assert again[0].wait().tolist() == [2.0]


def test_name_freed_when_the_connection_ends(fake4: ScriptedDaemon) -> None:
    c = collectived.Client(fake4.path, job="demo", timeout=10.0)
    h = c.allreduce_async(np.ones(1, np.float32), name="silent", ordered=False)
    c.close()
    assert isinstance(h.exception(), collectived.ConnectionLostError)
    assert c._names == {}


def test_named_call_waits_for_the_lane_call_before_it(c4: collectived.Client,
                                                      fake4: ScriptedDaemon) -> None:
    # A call on the lane, answered late; a named call made meanwhile goes
    # on the socket only after the daemon took the lane's call: the daemon
    # reads them in the order they were made (an ordered call fences the
    # named ones).
    x, y = np.ones(2, np.float32), np.ones(3, np.float32)
    h1 = c4.allreduce_async(x, name="lane-slow")
    h2 = c4.allreduce_async(y, name="named", ordered=False)
    h3 = c4.allreduce_async(x, name="after")
    for h in (h1, h2, h3):
        h.wait()
    assert [(m.name, m.named) for m in fake4.calls] == [
        ("lane-slow", False), ("named", True), ("after", False)]
    assert fake4.lane_calls == 1
    assert (x == 4).all() and (y == 2).all()


@pytest.mark.parametrize("version", [3, 2])
def test_named_calls_need_version_4(tmp_path, version: int) -> None:
    d = ScriptedDaemon(str(tmp_path / "d.sock"), version=version, inline_limit=4096)
    try:
        with collectived.Client(d.path, job="demo", timeout=10.0) as c:
            assert c.info.version == version
            x = np.ones(4, np.float32)
            with pytest.raises(collectived.NeedsVersionError,
                               match=rf"named calls \(ordered=False\) need protocol version 4; "
                                     rf"the daemon at .* speaks version {version} on this "
                                     rf"connection"):
                c.allreduce_async(x, name="g", ordered=False)
            with pytest.raises(collectived.NeedsVersionError):
                c.barrier(name="g", ordered=False)
            assert d.calls == []
            c.allreduce(x, name="g")  # ordered: as ever
            assert (x == 2).all()
    finally:
        d.close()
