"""Fixtures: real collectived worlds (see worlds.py). Tests that need a
daemon are skipped, with the reason, when none can be built."""

from __future__ import annotations

from typing import Iterator

import pytest

from worlds import World, daemon_binary


@pytest.fixture(scope="session")
def collectived_bin() -> str:
    path, reason = daemon_binary()
    if path is None:
        pytest.skip(reason)
    return path


def _world(binary: str, nodes: int, local: int, **kw: str) -> Iterator[World]:
    w = World(binary, nodes, local, **kw)
    try:
        w.start()
        yield w
    finally:
        w.stop()


@pytest.fixture(scope="module")
def world_1x1(collectived_bin: str) -> Iterator[World]:
    yield from _world(collectived_bin, 1, 1)


@pytest.fixture(scope="module")
def world_2x2(collectived_bin: str) -> Iterator[World]:
    yield from _world(collectived_bin, 2, 2)


@pytest.fixture
def fresh_world_2x1(collectived_bin: str) -> Iterator[World]:
    """A world a test may break (kill a node)."""
    yield from _world(collectived_bin, 2, 1, collective_timeout="10s")


@pytest.fixture
def fresh_world_2x2(collectived_bin: str) -> Iterator[World]:
    """A 2x2 world a test may put through failures of its own."""
    yield from _world(collectived_bin, 2, 2)


@pytest.fixture
def timeout_world_2x1(collectived_bin: str) -> Iterator[World]:
    """2x1 whose collectives (the first included) time out after 3 s."""
    yield from _world(collectived_bin, 2, 1, collective_timeout="3s", first_call="3s",
                      stall_warning="1s")


@pytest.fixture
def few_segments_world(collectived_bin: str) -> Iterator[World]:
    """1x2 whose trainers may hold 16 segments each."""
    yield from _world(collectived_bin, 1, 2, max_segments=16)


@pytest.fixture
def small_quota_world(collectived_bin: str) -> Iterator[World]:
    """1x1 with a 10 MiB shared-memory quota."""
    yield from _world(collectived_bin, 1, 1, shm_quota="10MiB")
