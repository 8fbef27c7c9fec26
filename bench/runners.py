"""How bench/compare runs each system and turns its output into rows.

Every runner returns rows shaped like `collectived bench --json` prints
them: bytes, world, median_us, p99_us, algbw_GBps, busbw_GBps (plus
system-specific fields). Each subprocess is started in a session of its
own and, if it overruns its timeout, ended by killing that session's
process group by the id of the process this module started.
"""

import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import localports  # noqa: E402

# Every command this run executed, in order, for the report.
COMMANDS: list[str] = []


class RunError(RuntimeError):
    """A benchmark command failed; the message names it and its output."""


def loadavg() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def run(argv, *, timeout, env=None, cwd=None, log=True) -> str:
    """Runs argv to completion and returns its stdout, or raises RunError."""
    if log:
        cmd = shlex.join(str(a) for a in argv)
        if cwd and os.path.abspath(cwd) != os.getcwd():
            cmd = f"(cd {shlex.quote(str(cwd))} && {cmd})"
        COMMANDS.append(cmd)
    p = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env, cwd=cwd, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(p)
        out, err = p.communicate()
        raise RunError(f"{shlex.join(map(str, argv))}: still running after {timeout}s, killed; "
                       f"stderr tail:\n{err[-2000:]}")
    if p.returncode != 0:
        raise RunError(f"{shlex.join(map(str, argv))}: exit status {p.returncode}; "
                       f"stderr:\n{_shorten(err, 3000)}\nstdout tail:\n{out[-1000:]}")
    return out


def _shorten(s: str, n: int) -> str:
    """Head and tail: a failing command's first lines say what failed, its
    last ones what it was doing."""
    return s if len(s) <= n else s[: n // 2] + "\n[...]\n" + s[-n // 2:]


def _kill_group(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)  # the group led by the process we started
    except ProcessLookupError:
        pass


def free_port() -> int:
    """A port for a daemon, a Gloo store or an iperf3 server to bind, by
    the rule every harness here uses (scripts/localports.py)."""
    try:
        return localports.free_ports(1)[0]
    except localports.PortError as e:
        raise RunError(str(e)) from e


def stats(bytes_: int, times_ns: list[int], world: int, in_flight: int = 1) -> dict:
    """Median and p99 of per-call times, the same arithmetic as collectived's
    bench. in_flight: each time is that many calls of bytes_ together, and
    the bandwidths count all their bytes (as `collectived bench --in-flight`
    does)."""
    ts = sorted(times_ns)
    n = len(ts)
    med = ts[n // 2] if n % 2 else (ts[n // 2 - 1] + ts[n // 2]) / 2
    p99 = ts[min(n - 1, int(n * 0.99))]
    alg = bytes_ * in_flight / med  # bytes per ns = GB/s
    bus = alg * 2 * (world - 1) / world if world > 1 else 0.0
    out = {"bytes": bytes_, "world": world, "iters": n, "median_us": med / 1e3, "p99_us": p99 / 1e3,
           "algbw_GBps": alg, "busbw_GBps": bus}
    if in_flight != 1:
        out["in_flight"] = in_flight
    return out


def _json_lines(out: str, what: str):
    """The JSON objects a benchmark printed one per line, in order; other
    lines are progress. A garbled object is an error naming its printer."""
    for line in out.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as e:
            raise RunError(f"{what}: printed {line[:200]!r}: {e}") from e


def _parse_times(out: str, world: int, what: str) -> list[dict]:
    return [stats(r["bytes"], r["times_ns"], world, r.get("in_flight", 1))
            for r in _json_lines(out, f"{what}: rank 0")]


def _expect(rows, sizes, what, in_flight=1):
    """The rows are the sizes asked for, each timing in_flight calls
    together (as the program says it did: a program that ignored the
    request would be timing something else)."""
    got = [r["bytes"] for r in rows]
    want = [max(4, s // 4 * 4) for s in sizes]
    if got != want:
        raise RunError(f"{what}: reported sizes {got}, want {want}")
    calls = [r.get("in_flight", 1) for r in rows]
    if any(k != in_flight for k in calls):
        raise RunError(f"{what}: reported {calls} calls in flight, want {in_flight}")


# --- collectived -----------------------------------------------------------

def collectived(binary, nodes, local, sizes, iters, warmup, timeout, extra_config=None, ring_only=False,
                prewarm=0, trainer_cmd=None, in_flight=1) -> list[dict]:
    """`collectived bench --json`: daemons and trainers as processes. With
    ring_only, `--ring-only`: one process per node calling its ring engine
    directly, on the ring settings a daemon with the same config uses (the
    sidecar's baseline); it prints the same rows with "path": "ring".
    --prewarm is always given, so the command shown is what ran (bench's
    own default is not 0). trainer_cmd: `--trainer-cmd`, trainers of
    another client (bench/py_trainer.py: the Python client). in_flight:
    `--in-flight`, that many calls started at once per timed iteration."""
    argv = [binary, "bench"] + (["--ring-only"] if ring_only else []) + [
        "--nodes", nodes, "--local", local, "--sizes", ",".join(map(str, sizes)),
        "--iters", iters, "--warmup", warmup, "--prewarm", prewarm, "--json"]
    if extra_config:
        argv += ["--extra-config", extra_config]
    if trainer_cmd:
        argv += ["--trainer-cmd", trainer_cmd]
    if in_flight != 1:
        argv += ["--in-flight", in_flight]
    what = "collectived bench --ring-only" if ring_only else "collectived bench"
    out = run(argv, timeout=timeout)
    rows = parse_collectived(out, nodes * local, what)
    if ring_only:
        bad = [r["bytes"] for r in rows if r.get("path") != "ring"]
        if bad:
            raise RunError(f"{what}: sizes {bad} did not report \"path\": \"ring\"")
    _expect(rows, sizes, what, in_flight)
    return rows


def collectived_sidecar(binary, sizes, iters, warmup, timeout, block=1, prewarm=0) -> tuple[list[dict], list[dict]]:
    """`collectived bench --sidecar --json` in world 2: the daemons' world
    and the ring engines alone up together, taking turns `block` calls at a
    time. Returns the collectived rows and the ring-only rows, one per
    size each, measured over the same stretch of time."""
    argv = [binary, "bench", "--sidecar", "--sidecar-block", block, "--nodes", 2, "--local", 1,
            "--sizes", ",".join(map(str, sizes)), "--iters", iters, "--warmup", warmup, "--prewarm", prewarm, "--json"]
    what = "collectived bench --sidecar"
    rows = parse_collectived(run(argv, timeout=timeout), 2, what)
    c, r = rows[0::2], rows[1::2]
    if any(x.get("path") == "ring" for x in c) or any(x.get("path") != "ring" for x in r):
        raise RunError(f"{what}: rows do not alternate daemon path and \"path\": \"ring\": "
                       f"{[x.get('path') for x in rows]}")
    _expect(c, sizes, what)
    _expect(r, sizes, what)
    return c, r


def parse_collectived(out: str, world: int, what: str) -> list[dict]:
    """The JSON lines of `collectived bench --json` (with or without
    --ring-only); a size whose result was not verified is an error."""
    rows = []
    for r in _json_lines(out, what):
        if not r.get("verified"):
            raise RunError(f"{what}: size {r.get('bytes')} not verified")
        r["world"] = world
        rows.append(r)
    return rows


# --- OpenMPI ---------------------------------------------------------------

MPI_TRANSPORTS = {
    # TCP between every pair of ranks, loopback only (OpenMPI leaves lo out
    # of btl_tcp by default, so it is named explicitly).
    "mpi-tcp": ["--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"],
    # OpenMPI's own shared-memory transport, named explicitly: Debian's build
    # also has UCX, which the defaults might choose instead.
    "mpi-shm": ["--mca", "pml", "ob1", "--mca", "btl", "self,vader"],
}


def mpi(binary, transport, world, sizes, iters, warmup, timeout, prewarm=0, in_flight=1) -> list[dict]:
    """bench/mpi_allreduce.c under mpirun. in_flight: that many
    MPI_Iallreduce started together per timed iteration, timed as one."""
    argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", world,
            "--mca", "oob_tcp_if_include", "lo", *MPI_TRANSPORTS[transport],
            binary, ",".join(map(str, sizes)), iters, warmup, prewarm] + ([in_flight] if in_flight != 1 else [])
    rows = _parse_times(run(argv, timeout=timeout), world, transport)
    _expect(rows, sizes, transport, in_flight)
    return rows


# --- torch.distributed Gloo ------------------------------------------------

def gloo(python, script, world, sizes, iters, warmup, timeout, prewarm=0, in_flight=1) -> list[dict]:
    init = f"tcp://127.0.0.1:{free_port()}"
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
    base = [python, script, "--world", world, "--init", init, "--sizes", ",".join(map(str, sizes)),
            "--iters", iters, "--warmup", warmup, "--prewarm", prewarm]
    if in_flight != 1:
        base += ["--in-flight", in_flight]
    COMMANDS.append(f"for r in $(seq 0 {world - 1}); do {shlex.join(map(str, base))} --rank $r & done; wait")
    rows = _parse_times(_gloo_world(base, world, env, timeout), world, "gloo")
    _expect(rows, sizes, "gloo", in_flight)
    return rows


def _gloo_world(base, world, env, timeout) -> str:
    """Runs the ranks of a Gloo program (base, then --rank r) and returns
    rank 0's stdout."""
    procs = []
    with tempfile.TemporaryDirectory(prefix="bench-gloo-") as tmp:
        try:
            return _gloo_ranks(tmp, base, world, env, timeout, procs)
        finally:
            for _, out, err in procs:
                out.close()
                err.close()


def _gloo_ranks(tmp, base, world, env, timeout, procs) -> str:
    """Starts the ranks (appending to procs, whose files the caller closes)
    and returns rank 0's stdout."""
    for r in range(world):
        out = open(os.path.join(tmp, f"out{r}"), "w+")
        err = open(os.path.join(tmp, f"err{r}"), "w+")
        p = subprocess.Popen([str(a) for a in base + ["--rank", r]], stdout=out, stderr=err, env=env,
                             start_new_session=True)
        procs.append((p, out, err))
    # Poll all ranks: one that dies leaves the others blocked in Gloo, so
    # end them all at once rather than waiting out the deadline.
    deadline = time.monotonic() + timeout
    failed = []
    while not failed and any(p.poll() is None for p, _, _ in procs):
        if time.monotonic() > deadline:
            failed.append(f"still running after {timeout}s, killed")
        for r, (p, _, err) in enumerate(procs):
            if p.poll() not in (None, 0):
                err.seek(0)
                failed.append(f"rank {r}: exit {p.returncode}: {err.read()[-2000:]}")
        time.sleep(0.2)
    for r, (p, _, err) in enumerate(procs):
        if not failed and p.returncode != 0:
            err.seek(0)
            failed.append(f"rank {r}: exit {p.returncode}: {err.read()[-2000:]}")
    if failed:
        for q, _, _ in procs:
            if q.poll() is None:
                _kill_group(q)
                q.wait()
        raise RunError("gloo: " + "\n".join(failed))
    procs[0][1].seek(0)
    return procs[0][1].read()


# --- a training step of named tensors (bench --tensors, gloo_allreduce.py --tensors) ---

def _step_rows(rows, what, want_calls):
    """The rows, each of the calls a step made (want_calls, row by row)."""
    got = [r.get("calls") for r in rows]
    if got != want_calls:
        raise RunError(f"{what}: rows of {got} calls, want {want_calls}")
    return rows


def collectived_step(binary, nodes, local, tensors, n_tensors, iters, warmup, timeout, named=True, concat=True,
                     prewarm=0, order=None, seed=None, extra_config=None) -> list[dict]:
    """`collectived bench --tensors FILE --json`: each timed iteration a
    step, an allreduce of every one of the n_tensors tensors of FILE, all
    in flight, then waited for; named (each trainer its own random order
    unless order says otherwise) or ordered (the file's order). concat:
    `--concat`, one allreduce of them all concatenated, a step of each in
    turn, its row second. The rows' bytes are all the tensors'."""
    argv = [binary, "bench", "--nodes", nodes, "--local", local, "--tensors", tensors,
            "--iters", iters, "--warmup", warmup, "--prewarm", prewarm, "--json"]
    if named:
        argv.append("--named")
    if order:
        argv += ["--order", order]
    if seed is not None:
        argv += ["--seed", seed]
    if concat:
        argv.append("--concat")
    if extra_config:
        argv += ["--extra-config", extra_config]
    what = "collectived bench --tensors" + (" --named" if named else "")
    rows = parse_collectived(run(argv, timeout=timeout), nodes * local, what)
    _step_rows(rows, what, [n_tensors] + ([1] if concat else []))
    if rows[0].get("named", False) != named or rows[0].get("concat") or concat and not rows[1].get("concat"):
        raise RunError(f"{what}: rows say named {rows[0].get('named', False)}, concat "
                       f"{[r.get('concat', False) for r in rows]}; want named {named}, the concatenation second")
    if len({r["bytes"] for r in rows}) != 1:
        raise RunError(f"{what}: rows of {[r['bytes'] for r in rows]} bytes, want one size")
    return rows


def gloo_step(python, script, world, tensors, n_tensors, iters, warmup, timeout, prewarm=0) -> dict:
    """bench/gloo_allreduce.py --tensors FILE, one process per rank: steps
    of dist.all_reduce on every tensor, one by one in the file's order."""
    init = f"tcp://127.0.0.1:{free_port()}"
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
    base = [python, script, "--world", world, "--init", init, "--tensors", tensors,
            "--iters", iters, "--warmup", warmup, "--prewarm", prewarm]
    COMMANDS.append(f"for r in $(seq 0 {world - 1}); do {shlex.join(map(str, base))} --rank $r & done; wait")
    rows = []
    for r in _json_lines(_gloo_world(base, world, env, timeout), "gloo --tensors: rank 0"):
        row = stats(r["bytes"], r["times_ns"], world)
        row.update(calls=r.get("calls"), tensors=r.get("tensors"))
        rows.append(row)
    return _step_rows(rows, "gloo --tensors", [n_tensors])[0]


# --- the other collectives (bench --op, mpi_collectives.c, gloo_collectives.py) ---

# The collectives other than allreduce, by the name `collectived bench
# --op`, bench/mpi_collectives.c and bench/gloo_collectives.py take, and
# the name collectived's rows give them.
COLLECTIVES = {"allgather": "allgather", "reducescatter": "reduce_scatter", "reduce": "reduce",
               "broadcast": "broadcast"}


class Unsupported(Exception):
    """The system does not offer the collective; the message is its own
    words."""


def bus_factor(op: str, world: int) -> float:
    """algbw to busbw by NCCL's conventions, as `collectived bench` does:
    2(W-1)/W for allreduce, (W-1)/W for allgather and reduce_scatter, 1 for
    reduce and broadcast (0 in a world of one)."""
    if world <= 1:
        return 0.0
    if op == "allreduce":
        return 2 * (world - 1) / world
    if op in ("allgather", "reducescatter"):
        return (world - 1) / world
    return 1.0


def coll_bytes(op: str, size: int, world: int, elem: int = 4) -> tuple[int, int]:
    """A size as every system takes it: (bytes, total_bytes). Whole
    elements, at least one; reducescatter's input a multiple of world
    elements (rounded down, at least one each); allgather's total the
    gathered vector, world x bytes."""
    n = max(1, size // elem)
    if op == "reducescatter":
        n = max(n // world * world, world)
    b = n * elem
    return b, b * world if op == "allgather" else b


def coll_stats(op: str, bytes_: int, total: int, times_ns: list[int], world: int) -> dict:
    """stats for a collective: algbw over the full vector (total), busbw
    by its own factor."""
    out = stats(bytes_, times_ns, world)
    alg = total / (out["median_us"] * 1e3)
    out.update(total_bytes=total, algbw_GBps=alg, busbw_GBps=alg * bus_factor(op, world))
    return out


def _expect_coll(rows, op, sizes, world, what, elem=4):
    want = [coll_bytes(op, s, world, elem) for s in sizes]
    got = [(r.get("bytes"), r.get("total_bytes")) for r in rows]
    if got != want:
        raise RunError(f"{what}: reported (bytes, total_bytes) {got}, want {want}")


def _elem(dtype: str) -> int:
    return 2 if dtype in ("bfloat16", "bf16", "float16", "f16") else 4


def collectived_op(binary, op, nodes, local, sizes, iters, warmup, timeout, prewarm=0, dtype="float32",
                   reduce=None, alternate=None) -> list[dict]:
    """`collectived bench --op OP --json`: any collective (allreduce too,
    with `dtype` and `reduce`). Its rows carry bytes, total_bytes and the
    bandwidths by NCCL's conventions, as bench computes them. alternate:
    `--alternate-dtype`, a second dtype at the same element count, call by
    call in turn; every size then has two rows, dtype's then alternate's."""
    argv = [binary, "bench", "--op", op, "--dtype", dtype]
    if reduce:
        argv += ["--reduce", reduce]
    if alternate:
        argv += ["--alternate-dtype", alternate]
    argv += ["--nodes", nodes, "--local", local, "--sizes", ",".join(map(str, sizes)),
             "--iters", iters, "--warmup", warmup, "--prewarm", prewarm, "--json"]
    what = f"collectived bench --op {op} --dtype {dtype}" + (f" --alternate-dtype {alternate}" if alternate else "")
    rows = parse_collectived(run(argv, timeout=timeout), nodes * local, what)
    world = nodes * local
    if alternate:
        main, alt = rows[0::2], rows[1::2]
        _expect_coll(main, op, sizes, world, what, _elem(dtype))
        counts = [coll_bytes(op, s, world, _elem(dtype))[0] // _elem(dtype) for s in sizes]
        _expect_coll(alt, op, [n * _elem(alternate) for n in counts], world, what, _elem(alternate))
    else:
        _expect_coll(rows, op, sizes, world, what, _elem(dtype))
    want = "reduce_scatter" if op == "reducescatter" else op
    bad = [r.get("collective") for r in rows if r.get("collective") != want]
    if bad:
        raise RunError(f"{what}: rows say collective {bad}, want {want}")
    return rows


def mpi_op(binary, transport, op, world, sizes, iters, warmup, timeout, prewarm=0) -> list[dict]:
    """bench/mpi_collectives.c under mpirun: MPI_Allgather,
    MPI_Reduce_scatter_block, MPI_Reduce or MPI_Bcast."""
    argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", world,
            "--mca", "oob_tcp_if_include", "lo", *MPI_TRANSPORTS[transport],
            binary, op, ",".join(map(str, sizes)), iters, warmup, prewarm]
    what = f"{transport} {op}"
    rows = [coll_stats(op, r["bytes"], r["total_bytes"], r["times_ns"], world)
            for r in _json_lines(run(argv, timeout=timeout), f"{what}: rank 0")]
    _expect_coll(rows, op, sizes, world, what)
    return rows


def gloo_op(python, script, op, world, sizes, iters, warmup, timeout, prewarm=0) -> list[dict]:
    """bench/gloo_collectives.py, one process per rank. A collective Gloo
    does not offer raises Unsupported with what torch said."""
    init = f"tcp://127.0.0.1:{free_port()}"
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
    base = [python, script, "--op", op, "--world", world, "--init", init, "--sizes", ",".join(map(str, sizes)),
            "--iters", iters, "--warmup", warmup, "--prewarm", prewarm]
    COMMANDS.append(f"for r in $(seq 0 {world - 1}); do {shlex.join(map(str, base))} --rank $r & done; wait")
    what = f"gloo {op}"
    rows = []
    for r in _json_lines(_gloo_world(base, world, env, timeout), f"{what}: rank 0"):
        if "unsupported" in r:
            raise Unsupported(r["unsupported"])
        rows.append(coll_stats(op, r["bytes"], r["total_bytes"], r["times_ns"], world))
    _expect_coll(rows, op, sizes, world, what)
    return rows


# --- TCP loopback, both directions at once ------------------------------------

PROBES = ("iperf3", "threads", "c")


def tcp_bidir(seconds, timeout, script, streams=1, cprog=None) -> dict:
    """Both loopback measurements with `streams` connections (the daemon's
    streams per link); the higher per-direction rate is the reference (the
    limit a 2-node ring could reach)."""
    out = {"seconds": seconds, "streams": streams}
    errs = []
    probes = [("iperf3", lambda: iperf3_bidir(seconds, timeout, streams)),
              ("threads", lambda: threaded_bidir(["/usr/bin/python3", script], seconds, timeout, streams))]
    if cprog:
        probes.append(("c", lambda: threaded_bidir([cprog], seconds, timeout, streams)))
    for name, fn in probes:
        try:
            out[name] = fn()
        except (RunError, OSError, KeyError, ValueError, json.JSONDecodeError) as e:
            errs.append(f"{name}: {e}")
    got = [(out[k]["per_direction_GBps"], k) for k in PROBES if k in out]
    if not got:
        raise RunError("; ".join(errs))
    out["per_direction_GBps"], out["reference"] = max(got)
    out["errors"] = errs
    return out


def iperf3_bidir(seconds, timeout, streams=1, attempts=3) -> dict:
    """iperf3 --bidir on 127.0.0.1: one stream each way at the same time,
    which is what a 2-node ring's links carry during an allreduce. A fresh
    one-off server per attempt, started and stopped by its PID."""
    errs = []
    for attempt in range(attempts):
        port = free_port()
        srv_argv = ["iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", str(port)]
        cli_argv = ["iperf3", "-c", "127.0.0.1", "-p", port, "--bidir", "-P", streams, "-t", seconds, "-J"]
        if attempt == 0:
            COMMANDS.append(shlex.join(srv_argv) + " &")
        srv = subprocess.Popen(srv_argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
        try:
            time.sleep(0.5)  # let it listen; a probe connection would use up its one test
            try:
                out = run(cli_argv, timeout=timeout, log=attempt == 0)
            except RunError as e:
                errs.append(str(e)[-300:])
                continue
        finally:
            if srv.poll() is None:
                srv.terminate()  # by the PID we started
                try:
                    srv.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    srv.kill()
                    srv.wait()
        d = json.loads(out)
        end = d.get("end", {})
        if d.get("error") or "sum_received" not in end or "sum_received_bidir_reverse" not in end:
            errs.append(f"iperf3 -J reported: {d.get('error') or 'no bidirectional sums'}")
            continue
        fwd = end["sum_received"]["bits_per_second"] / 8e9
        rev = end["sum_received_bidir_reverse"]["bits_per_second"] / 8e9
        return {"forward_GBps": fwd, "reverse_GBps": rev, "per_direction_GBps": (fwd + rev) / 2}
    raise RunError(f"iperf3 --bidir failed {attempts} times: " + " | ".join(errs))


def threaded_bidir(prog, seconds, timeout, streams=1) -> dict:
    """bench/tcp_bidir.py or bench/tcp_bidir.c (prog is the argv prefix):
    two processes, a sending and a receiving thread per connection, 64 MiB
    buffers both ways at once."""
    port = free_port()
    la = [*prog, "--listen", port, "--seconds", seconds, "--streams", streams]
    ca = [*prog, "--connect", port, "--seconds", seconds, "--streams", streams]
    COMMANDS.append(f"{shlex.join(map(str, la))} & {shlex.join(map(str, ca))}; wait")
    lp = subprocess.Popen([str(x) for x in la], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True)
    try:
        cout = run(ca, timeout=timeout, log=False)
        lout, lerr = lp.communicate(timeout=timeout)
    finally:
        if lp.poll() is None:
            _kill_group(lp)
            lp.wait()
    if lp.returncode != 0:
        raise RunError(f"{shlex.join(map(str, la))}: exit {lp.returncode}: {lerr[-1000:]}")
    a, b = json.loads(lout), json.loads(cout)
    fwd = a["recv_bytes"] / a["recv_s"] / 1e9  # connector -> listener
    rev = b["recv_bytes"] / b["recv_s"] / 1e9
    return {"forward_GBps": fwd, "reverse_GBps": rev, "per_direction_GBps": (fwd + rev) / 2}
