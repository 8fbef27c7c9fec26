"""Daemon memory, for bench/compare.

Starts its own two-node world of `collectived run` daemons on loopback
(the same config `collectived bench` writes), reads each daemon's RSS
once the ring is up and no trainer has attached, then every few
milliseconds while trainers run allreduces up to 64 MiB through it (64
MiB through a shared-memory segment), then again a few seconds after they
have left. While serving, what matters is the RSS beyond the shared
segments (VmRSS - RssShmem: the trainers' memfds mapped into the daemon
are the trainers' memory, counted once in each process that maps them),
against the ring's pipeline buffers (`status --json`: ring.buffer_bytes).
The daemons are stopped by the PIDs this module started.
"""

import json
import os
import secrets
import shlex
import signal
import socket
import subprocess
import tempfile
import time

from runners import COMMANDS, RunError, free_port, run


def _proc_mem(pid: int) -> dict:
    """VmRSS and its parts (anonymous, file-backed, shared memory) in bytes."""
    want = {"VmRSS:": "vmrss_bytes", "RssAnon:": "rss_anon_bytes", "RssFile:": "rss_file_bytes",
            "RssShmem:": "rss_shmem_bytes"}
    got = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k = line.split(maxsplit=1)[0] if line.strip() else ""
            if k in want:
                got[want[k]] = int(line.split()[1]) * 1024
    if "vmrss_bytes" not in got:
        raise RunError(f"/proc/{pid}/status has no VmRSS line")
    # What the daemon itself holds: the trainers' segments it maps are
    # theirs (RssShmem).
    got["private_bytes"] = got["vmrss_bytes"] - got.get("rss_shmem_bytes", 0)
    return got


def _status(binary, sock, job, env) -> dict:
    return json.loads(run([binary, "status", "--socket", sock, "--job", job, "--json", "--timeout", "5s"],
                          timeout=15, env=env, log=False))


def measure(binary, settle_s=3.0, timeout=60, serving_iters=20, sample_every_s=0.01) -> dict:
    job, nodes = "rss", 2
    token = secrets.token_hex(24)
    env = dict(os.environ, COLLECTIVED_RSS_TOKEN=token)
    with tempfile.TemporaryDirectory(prefix="bench-rss-") as d:
        peers = "".join(f"  - 127.0.0.1:{free_port()}\n" for _ in range(nodes))
        cfg = os.path.join(d, "config.yaml")
        text = f"job:\n  name: {job}\n  token_env: COLLECTIVED_RSS_TOKEN\n  local_size: 1\npeers:\n{peers}rank: 0\n"
        with open(cfg, "w") as f:
            f.write(text)
        COMMANDS.append(f"cat > {cfg} <<'EOF'\n{text}EOF")
        daemons, socks, logs = [], [], []
        try:
            for i in range(nodes):
                sock = os.path.join(d, f"node{i}.sock")
                log = open(os.path.join(d, f"node{i}.log"), "w")
                argv = [binary, "run", "--config", cfg, "--rank", str(i), "--socket", sock]
                COMMANDS.append("COLLECTIVED_RSS_TOKEN=... " + shlex.join(argv) + " &")
                daemons.append(subprocess.Popen(argv, stdout=log, stderr=log, env=env, start_new_session=True))
                socks.append(sock)
                logs.append(log)
            deadline = time.monotonic() + timeout
            for i, sock in enumerate(socks):
                while True:
                    try:
                        if _status(binary, sock, job, env)["ring"]["state"] == "up":
                            break
                    except (RunError, json.JSONDecodeError, KeyError):
                        pass
                    if time.monotonic() > deadline or daemons[i].poll() is not None:
                        raise RunError(f"daemon {i} ring not up within {timeout}s; log: {_tail(d, i)}")
                    time.sleep(0.2)
            time.sleep(settle_s)
            fresh = _sample(binary, daemons, socks, job, env)

            trainers = []
            tr_argv = lambda i: [binary, "bench-trainer", "--socket", socks[i], "--job", job, "--local-rank", "0",
                                 "--sizes", "4,1048576,67108864", "--iters", str(serving_iters), "--warmup", "2"]
            COMMANDS.append(" & ".join(shlex.join(tr_argv(i)) for i in range(nodes)) + "; wait")
            errs = [tempfile.TemporaryFile("w+") for _ in range(nodes)]
            try:
                for i in range(nodes):
                    trainers.append(subprocess.Popen(tr_argv(i), stdout=subprocess.DEVNULL, stderr=errs[i],
                                                     text=True, start_new_session=True))
                serving = _watch(daemons, trainers, time.monotonic() + timeout, sample_every_s)
                for i, t in enumerate(trainers):
                    if t.returncode is None:
                        for u in trainers:
                            u.kill()
                            u.wait()
                        raise RunError(f"bench-trainer {i} still running after {timeout}s")
                    if t.returncode != 0:
                        errs[i].seek(0)
                        raise RunError(f"bench-trainer {i}: exit {t.returncode}: {errs[i].read()[-2000:]}")
            finally:
                for e in errs:
                    e.close()
            time.sleep(settle_s)
            after = _sample(binary, daemons, socks, job, env)
        finally:
            for p in daemons:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in daemons:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            for log in logs:
                log.close()
    return {"settle_s": settle_s, "fresh": fresh, "serving": serving, "after_work": after,
            "max_rss_bytes": max(s["vmrss_bytes"] for s in fresh + after),
            "serving_growth_per_buffers": growth_per_buffers(fresh, serving)}


def growth_per_buffers(fresh, serving) -> float:
    """The largest daemon's growth of RSS beyond the shared segments, from
    idle to its peak while serving, over the ring's pipeline buffers it
    reports; each serving sample gets its growth_bytes."""
    ratios = []
    for f, sv in zip(fresh, serving):
        if not f.get("buffer_bytes"):
            raise RunError(f"daemon {f['node']} (pid {f['pid']}) reports no ring.buffer_bytes in status --json "
                           f"(got {f.get('buffer_bytes')!r}): a collectived older than the memory-while-serving "
                           "measurement, or its ring is not up")
        sv["growth_bytes"] = sv["max_private_bytes"] - f["private_bytes"]
        ratios.append(sv["growth_bytes"] / f["buffer_bytes"])
    return max(ratios)


def _watch(daemons, trainers, deadline, every_s) -> list[dict]:
    """Samples each daemon's memory until the trainers have exited (or the
    deadline): per daemon, the sample with the most RSS beyond the shared
    segments, the largest shared RSS seen and the number of samples."""
    peak = [None] * len(daemons)
    max_shmem = [0] * len(daemons)
    n = 0
    while time.monotonic() < deadline:
        running = any(t.poll() is None for t in trainers)
        for i, p in enumerate(daemons):
            m = _proc_mem(p.pid)
            max_shmem[i] = max(max_shmem[i], m.get("rss_shmem_bytes", 0))
            if peak[i] is None or m["private_bytes"] > peak[i]["private_bytes"]:
                peak[i] = m
        n += 1
        if not running:
            break
        time.sleep(every_s)
    return [{"node": i, "pid": p.pid, "samples": n, "max_private_bytes": peak[i]["private_bytes"],
             "at_max": peak[i], "max_shmem_bytes": max_shmem[i]} for i, p in enumerate(daemons)]


def _sample(binary, daemons, socks, job, env) -> list[dict]:
    out = []
    for i, (p, sock) in enumerate(zip(daemons, socks)):
        st = _status(binary, sock, job, env)
        proc = st.get("process", {})
        out.append({"node": i, "pid": p.pid, **_proc_mem(p.pid), "status_rss_bytes": proc.get("rss_bytes"), "goroutines": proc.get("goroutines"),
                    "memfds": proc.get("memfds"), "buffer_bytes": st.get("ring", {}).get("buffer_bytes")})
    return out


def _tail(d, i) -> str:
    try:
        with open(os.path.join(d, f"node{i}.log")) as f:
            return f.read()[-1500:]
    except OSError as e:
        return str(e)
