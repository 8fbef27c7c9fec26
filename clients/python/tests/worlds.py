"""Real collectived worlds for tests: build the daemon, write a config, start
one daemon per node on loopback, run trainer processes against them.

Daemons are started with ``collectived run --config F --rank N --socket P``
and stopped by PID (terminate, then kill). Nothing here is faked.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Optional, Sequence

import collectived

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "scripts"))
import localports  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
JOB = "pytest-job"
TOKEN_ENV = "COLLECTIVED_TEST_TOKEN"
TOKEN = "pytest-token-0123456789abcdef"

_built: Optional[tuple[Optional[str], str]] = None


def daemon_binary() -> tuple[Optional[str], str]:
    """(path, "") of a collectived binary, or (None, reason) if there is none.

    $COLLECTIVED_BIN wins; else ``go build ./cmd/collectived`` from the repo root
    (once per test session)."""
    global _built
    if _built is not None:
        return _built
    env_bin = os.environ.get("COLLECTIVED_BIN")
    if env_bin:
        if os.access(env_bin, os.X_OK):
            _built = (env_bin, "")
        else:
            _built = (None, f"$COLLECTIVED_BIN={env_bin} is not an executable file")
        return _built
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not os.path.exists(go):
        _built = (None, "no Go toolchain to build the daemon and $COLLECTIVED_BIN is unset")
        return _built
    bindir = tempfile.mkdtemp(prefix="cvd-bin-")
    atexit.register(shutil.rmtree, bindir, True)
    out = os.path.join(bindir, "collectived")
    try:
        r = subprocess.run([go, "build", "-o", out, "./cmd/collectived"], cwd=REPO,
                           capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        _built = (None, "go build ./cmd/collectived took over 600 s")
        return _built
    if r.returncode != 0:
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
        _built = (None, f"daemon not buildable yet (go build ./cmd/collectived: {tail})")
    else:
        _built = (out, "")
    return _built


def _free_ports(n: int) -> list[int]:
    """Ports for the daemons, by the rule every harness here uses
    (scripts/localports.py: outside the kernel's ephemeral range)."""
    return localports.free_ports(n)


class World:
    """``nodes`` daemons on loopback, each serving ``local_size`` trainers."""

    def __init__(self, binary: str, nodes: int, local_size: int, *,
                 collective_timeout: str = "20s", first_call: str = "60s",
                 stall_warning: str = "5s", inline_bytes: str = "64KiB",
                 shm_quota: str = "4GiB", max_segments: int = 1024, extra: str = "",
                 job: str = JOB, max_in_flight: Optional[int] = None) -> None:
        self.binary = binary
        self.job = job
        self.nodes = nodes
        self.local_size = local_size
        self.size = nodes * local_size
        # Short paths: Unix socket paths are limited to 107 bytes.
        self.dir = tempfile.mkdtemp(prefix="cvd-")
        self.sockets = [os.path.join(self.dir, f"n{r}.sock") for r in range(nodes)]
        self.logs = [os.path.join(self.dir, f"n{r}.log") for r in range(nodes)]
        self.procs: list[subprocess.Popen] = []
        ports = _free_ports(nodes)
        self.config = os.path.join(self.dir, "config.yaml")
        peers = "\n".join(f"  - 127.0.0.1:{p}" for p in ports)
        with open(self.config, "w") as f:
            f.write(f"""job:
  name: {job}
  token_env: {TOKEN_ENV}
  local_size: {local_size}
peers:
{peers}
socket:
  path: {self.sockets[0]}
timeouts:
  connect: 30s
  collective: {collective_timeout}
  first_call: {first_call}
  stall_warning: {stall_warning}
limits:
  inline_bytes: {inline_bytes}
  shm_quota_bytes: {shm_quota}
  max_segments: {max_segments}
{"" if max_in_flight is None else f"  max_in_flight: {max_in_flight}{chr(10)}"}log:
  level: info
{extra}""")

    def start(self, ready_timeout: float = 60.0) -> "World":
        env = dict(os.environ, **{TOKEN_ENV: TOKEN})
        for r in range(self.nodes):
            log = open(self.logs[r], "wb")
            self.procs.append(subprocess.Popen(
                [self.binary, "run", "--config", self.config, "--rank", str(r),
                 "--socket", self.sockets[r]],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
            log.close()
        deadline = time.monotonic() + ready_timeout
        for r in range(self.nodes):
            self._wait_ready(r, deadline)
        return self

    def _wait_ready(self, r: int, deadline: float) -> None:
        last = "never attempted"
        while time.monotonic() < deadline:
            if self.procs[r].poll() is not None:
                raise RuntimeError(f"daemon {r} exited with {self.procs[r].returncode}:\n"
                                   f"{self.log(r)}")
            try:
                with collectived.Client(self.sockets[r], job=self.job, observer=True,
                                        connect_timeout=2.0):
                    return
            except (collectived.CollectivedError, OSError) as e:
                last = str(e)
            time.sleep(0.1)
        raise RuntimeError(f"daemon {r} not accepting HELLO on {self.sockets[r]}: {last}\n"
                           f"{self.log(r)}")

    def log(self, r: int) -> str:
        try:
            with open(self.logs[r], errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)

    def kill_node(self, r: int) -> None:
        os.kill(self.procs[r].pid, signal.SIGKILL)
        self.procs[r].wait(5)

    def trainer_args(self, world_rank: int) -> tuple[str, int]:
        """(socket, local_rank) of world rank ``world_rank``."""
        return self.sockets[world_rank // self.local_size], world_rank % self.local_size

    def run(self, fn: Callable[..., Any], args: Sequence[Any] = (), *,
            timeout: float = 120.0, client_kw: Optional[dict[str, Any]] = None) -> list[Any]:
        """Run ``fn(client, *args)`` in one spawned process per world rank; return
        the results by world rank. ``fn`` must be a module-level function.
        ``client_kw``: more keyword arguments for every Client."""
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(self.size) as pool:
            jobs = [pool.apply_async(_trainer, (self.trainer_args(i), fn, tuple(args),
                                                client_kw or {}))
                    for i in range(self.size)]
            out = []
            deadline = time.monotonic() + timeout
            for i, j in enumerate(jobs):
                try:
                    out.append(j.get(max(0.1, deadline - time.monotonic())))
                except multiprocessing.TimeoutError:
                    raise AssertionError(
                        f"trainer {i} did not finish in {timeout} s\n" +
                        "\n".join(f"--- daemon {r} ---\n{self.log(r)}" for r in range(self.nodes))
                    ) from None
            return out


def connect_trainer(sock: str, local_rank: int, label: str = "pytest trainer",
                    **kw: Any) -> collectived.Client:
    """Connect as ``local_rank``, retrying RANK_TAKEN for a few seconds: the
    previous test's trainer may have exited before its daemon noticed."""
    return collectived.Client(sock, job=JOB, local_rank=local_rank, label=label, rank_retry=5.0,
                              **kw)


def _trainer(where: tuple[str, int], fn: Callable[..., Any], args: tuple,
             client_kw: dict[str, Any]) -> Any:
    sock, local_rank = where
    with connect_trainer(sock, local_rank, **client_kw) as c:
        return fn(c, *args)


def on_every(cs: Sequence[Any], fn: Callable[[int, Any], Any], timeout: float = 90.0) -> list[Any]:
    """fn(i, c) for every client at once, in threads: the results, or the
    exception each raised."""
    out: list[Any] = [None] * len(cs)

    def run(i: int) -> None:
        try:
            out[i] = fn(i, cs[i])
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out[i] = e

    ts = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(cs))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout)
        assert not t.is_alive(), f"a trainer still waits after {timeout} s"
    return out
