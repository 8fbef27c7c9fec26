"""Running trainer functions that make their own torch.distributed group
(collectived.torch.init_process_group) in spawned processes, one per world
rank of a tests/worlds.py World. Unlike World.run, a trainer may die: its
result is then missing (None), and the others' are still collected."""

from __future__ import annotations

import multiprocessing
import pickle
import time
from typing import Any, Optional, Sequence

from worlds import World


def _child(conn: Any, module: str, fn: str, args: tuple) -> None:
    import importlib
    import pickle
    import traceback

    try:
        res: Any = ("ok", getattr(importlib.import_module(module), fn)(*args))
    except BaseException:
        res = ("raised", traceback.format_exc())
    # Plain pickle: multiprocessing's would share tensors' memory through
    # this process, which is about to exit.
    conn.send_bytes(pickle.dumps(res))
    conn.close()


def run_torch(world: World, module: str, fn: str, args: Sequence[Any] = (), *,
              timeout: float = 300.0, env: Optional[dict[str, str]] = None) -> list[Any]:
    """``module.fn(socket, local_rank, *args)`` in one spawned process per
    world rank; the results by world rank (None for a trainer that died).
    A trainer that raised fails the run with its traceback; one that has
    not finished within ``timeout`` too (with the daemons' logs)."""
    ctx = multiprocessing.get_context("spawn")
    procs, conns = [], []
    for i in range(world.size):
        sock, lr = world.trainer_args(i)
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, args=(child, module, fn, (sock, lr, *args)), daemon=True)
        p.start()
        child.close()
        procs.append(p)
        conns.append(parent)
    out: list[Any] = [None] * world.size
    deadline = time.monotonic() + timeout
    try:
        for i, (p, c) in enumerate(zip(procs, conns)):
            while True:
                if c.poll(0.1):
                    try:
                        status, val = pickle.loads(c.recv_bytes())
                    except EOFError:
                        break  # died without an answer
                    if status == "raised":
                        raise AssertionError(f"trainer {i} raised:\n{val}")
                    out[i] = val
                    break
                if not p.is_alive() and not c.poll(0):
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"trainer {i} did not finish in {timeout} s\n" +
                        "\n".join(f"--- daemon {r} ---\n{world.log(r)}" for r in range(world.nodes)))
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
    #: the trainers' exit codes, by world rank (for a test's messages)
    run_torch.exitcodes = [p.exitcode for p in procs]  # type: ignore[attr-defined]
    return out
