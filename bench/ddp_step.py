#!/usr/bin/env python3
"""DDP training-step benchmark: the same model and data under
DistributedDataParallel on 2 nodes x 2 trainers, on the "collectived"
torch.distributed backend and on Gloo, taking turns in one run.

    /usr/bin/python3 bench/ddp_step.py                 # 3 rounds (about 5 minutes on 2 cores)
    /usr/bin/python3 bench/ddp_step.py --rounds 1 --no-doc
    /usr/bin/python3 bench/ddp_step.py --report-only bench/.results/ddp.json

Each round starts both systems' trainers once per model, in turn (the
order alternates between rounds): collectived's 4 trainers attach to a
world that `collectived up` keeps running for the whole run (2 daemons on
127.0.0.1), Gloo's to a TCPStore; every trainer uses one CPU thread. A
step is forward, backward (DDP's gradient averaging) and an SGD step on a
fixed batch; after `--warmup` untimed steps, `--steps` are timed on every
rank, and a step's time is the slowest rank's. The result of a run is the
median step; of a system, the median over rounds (with the rounds' range).

Models: "10M", an MLP of 9.97 M parameters (1024-2048-2048-1024-1024-512,
4 samples a rank, little compute: the step is mostly DDP's communication of
40 MB of gradients, in buckets of at most 25 MiB, the first 1 MiB, as DDP
cuts them by default), and "30K", an MLP of 29.5 K parameters
(64-256-48-10, 32 samples a rank: one bucket of 115 KiB). Targets (issue
26): step time collectived / Gloo <= 0.75 for 10M, <= 0.6 for 30K.

Writes the section "DDP training step" of docs/BENCHMARKS.md (replacing
it, between its markers, or appending it), docs/bench/ddp_step.png and
the raw results, docs/bench/ddp_step.json (also bench/.results/ddp.json). Needs Debian's
python3-torch and the repository's collectived (bin/collectived, built
if missing) and Python client (clients/python/src, imported in place).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SRC = os.path.join(REPO, "clients", "python", "src")
JOB = "ddp-bench"
NODES, LOCAL = 2, 2
BEGIN, END = "<!-- ddp-step: begin (bench/ddp_step.py) -->", "<!-- ddp-step: end -->"
TARGETS = {"10M": 0.75, "30K": 0.6}
MODELS = {
    # name: (layer widths, samples per rank)
    "10M": ([1024, 2048, 2048, 1024, 1024, 512], 4),
    "30K": ([64, 256, 48, 10], 32),
}


# ------------------------------------------------------------ one trainer

def _worker(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if a.backend == "collectived":
        sys.path.insert(0, SRC)
        import collectived.torch as ct

        ct.init_process_group(a.socket, job=JOB, local_rank=a.local_rank)
    else:
        store = dist.TCPStore("127.0.0.1", a.port, a.world, a.rank == 0,
                              datetime.timedelta(seconds=120))
        dist.init_process_group("gloo", store=store, rank=a.rank, world_size=a.world)
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for name in a.models.split(","):
        widths, batch = MODELS[name]
        torch.manual_seed(0)
        layers = []
        for i in range(len(widths) - 1):
            layers += [torch.nn.Linear(widths[i], widths[i + 1]), torch.nn.ReLU()]
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers[:-1]))
        params = sum(p.numel() for p in model.parameters())
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(rank)
        x, y = torch.randn(batch, widths[0], generator=g), torch.randn(batch, widths[-1], generator=g)
        steps = a.steps_10m if name == "10M" else a.steps_30k
        times = []
        for s in range(a.warmup + steps):
            t0 = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            if s >= a.warmup:
                times.append(time.perf_counter() - t0)
        # every rank's times, to rank 0: a step is its slowest rank's
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        out[name] = {"params": params, "step_s": t.tolist()}
        del model, opt
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


# ------------------------------------------------------------ a run of 4

def _run(system: str, sockets: list[str], models: str, a: argparse.Namespace) -> dict:
    import socket as _s

    port = 0
    if system == "gloo":
        with _s.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    procs = []
    for r in range(NODES * LOCAL):
        cmd = [sys.executable, os.path.abspath(__file__), "worker", "--backend", system,
               "--rank", str(r), "--world", str(NODES * LOCAL), "--port", str(port),
               "--socket", sockets[r // LOCAL], "--local-rank", str(r % LOCAL),
               "--models", models, "--warmup", str(a.warmup),
               "--steps-10m", str(a.steps_10m), "--steps-30k", str(a.steps_30k)]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(k, None)
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=env))
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    for r, (p, o) in enumerate(zip(procs, outs)):
        if p.returncode != 0:
            raise SystemExit(f"ddp_step: {system} trainer {r} failed ({p.returncode}):\n{o[-3000:]}")
    m = re.search(r"^RESULT (.*)$", outs[0], re.M)
    if not m:
        raise SystemExit(f"ddp_step: {system} rank 0 printed no result:\n{outs[0][-3000:]}")
    return json.loads(m.group(1))


def _up(binary: str) -> tuple[subprocess.Popen, list[str]]:
    """`collectived up`: the daemons, for the whole run."""
    p = subprocess.Popen([binary, "up", "--nodes", str(NODES), "--local", str(LOCAL), "--job", JOB],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sockets, lines = [], []
    assert p.stdout is not None
    for line in p.stdout:
        lines.append(line)
        m = re.match(r"^node (\d+): socket (\S+)", line)
        if m:
            sockets.append(m.group(2))
        if line.startswith("ready;"):
            return p, sockets
    p.wait()
    raise SystemExit("ddp_step: collectived up failed:\n" + "".join(lines))


def measure(a: argparse.Namespace) -> dict:
    binary = a.bin or os.path.join(REPO, "bin", "collectived")
    if not a.bin:
        subprocess.run(["go", "build", "-o", binary, "./cmd/collectived"], cwd=REPO, check=True)
    up, sockets = _up(binary)
    runs: dict = {"collectived": [], "gloo": []}
    t0 = time.monotonic()
    try:
        for rnd in range(a.rounds):
            order = ["collectived", "gloo"] if rnd % 2 == 0 else ["gloo", "collectived"]
            for system in order:
                res = _run(system, sockets, ",".join(MODELS), a)
                runs[system].append(res)
                print(f"round {rnd + 1}/{a.rounds} {system}: " + ", ".join(
                    f"{k} {statistics.median(v['step_s']) * 1e3:.2f} ms" for k, v in res.items()),
                    flush=True)
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(30)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "took_s": round(time.monotonic() - t0),
        "machine": {"nproc": os.cpu_count(), "kernel": platform.release(),
                    "load": os.getloadavg()},
        "settings": {"nodes": NODES, "local": LOCAL, "rounds": a.rounds, "warmup": a.warmup,
                     "steps_10m": a.steps_10m, "steps_30k": a.steps_30k,
                     "torch": _torch_version()},
        "runs": runs,
    }


def _torch_version() -> str:
    try:
        import torch
        return str(torch.__version__)
    except ImportError:  # pragma: no cover
        return "?"


# ------------------------------------------------------------ report

def summarize(res: dict) -> dict:
    out: dict = {}
    for model in MODELS:
        row: dict = {}
        for system, runs in res["runs"].items():
            meds = [statistics.median(r[model]["step_s"]) for r in runs]
            row[system] = {"median": statistics.median(meds), "min": min(meds), "max": max(meds),
                           "params": runs[0][model]["params"]}
        # the ratio of the medians, and of each round's pair
        row["ratio"] = row["collectived"]["median"] / row["gloo"]["median"]
        row["pairs"] = [statistics.median(c[model]["step_s"]) / statistics.median(g[model]["step_s"])
                        for c, g in zip(res["runs"]["collectived"], res["runs"]["gloo"])]
        out[model] = row
    return out


def markdown(res: dict, plot: str) -> str:
    s = summarize(res)
    st = res["settings"]
    lines = [BEGIN, "## DDP training step (issue 26)", "",
             f"Generated by `bench/ddp_step.py` on {res['date']} ({res['took_s']} s; "
             f"load average {', '.join(f'{x:.1f}' for x in res['machine']['load'])} at the end, "
             f"{res['machine']['nproc']} CPUs; torch {st['torch']}). "
             f"DistributedDataParallel on {NODES} nodes x {LOCAL} trainers (4 processes, one "
             "CPU thread each), the same model and batch on the `\"collectived\"` backend "
             "(`collectived.torch.init_process_group()`, daemons of `collectived up`) and on "
             f"Gloo, taking turns in {st['rounds']} rounds (the order alternating). A step is "
             "forward, backward (DDP's gradient averaging) and an SGD step, its time the "
             f"slowest rank's; {st['warmup']} untimed steps, then {st['steps_10m']} (10M) or "
             f"{st['steps_30k']} (30K) timed; each round's median step, the median over "
             "rounds and its range.", "",
             "| model | parameters | collectived step | Gloo step | collectived ÷ Gloo | "
             "rounds' ratios | wanted | verdict |",
             "|---|---:|---:|---:|---:|---|---:|---|"]
    for model, row in s.items():
        c, g = row["collectived"], row["gloo"]
        ok = row["ratio"] <= TARGETS[model]
        lines.append(
            f"| {model} | {c['params']:,} | {c['median'] * 1e3:.2f} ms "
            f"({c['min'] * 1e3:.2f}-{c['max'] * 1e3:.2f}) | {g['median'] * 1e3:.2f} ms "
            f"({g['min'] * 1e3:.2f}-{g['max'] * 1e3:.2f}) | {row['ratio']:.2f}x | "
            f"{', '.join(f'{p:.2f}' for p in row['pairs'])} | <= {TARGETS[model]}x | "
            f"**{'PASS' if ok else 'FAIL'}** |")
    lines += ["", f"![DDP step time]({plot})", "",
              "10M: an MLP 1024-2048-2048-1024-1024-512, 4 samples a rank (little compute: "
              "the step is mostly DDP's communication); its 40 MB of gradients go in buckets "
              "of at most 25 MiB (the first 1 MiB), each an allreduce through the daemons "
              "(through a scratch segment: two copies of the bucket) or Gloo's ring. 30K: an "
              "MLP 64-256-48-10, 32 samples a rank: one bucket of 115 KiB, which collectived "
              "carries on the connection's lane. Every step's time is in "
              "[`bench/ddp_step.json`](bench/ddp_step.json).", END]
    return "\n".join(lines) + "\n"


def plot(res: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = summarize(res)
    fig, axes = plt.subplots(1, len(s), figsize=(8, 3.2))
    for ax, (model, row) in zip(axes, s.items()):
        names = ["collectived", "gloo"]
        meds = [row[n]["median"] * 1e3 for n in names]
        errs = [[row[n]["median"] * 1e3 - row[n]["min"] * 1e3 for n in names],
                [row[n]["max"] * 1e3 - row[n]["median"] * 1e3 for n in names]]
        ax.bar(names, meds, yerr=errs, color=["tab:blue", "tab:orange"], capsize=4)
        ax.set_title(f"{model} parameters: {row['ratio']:.2f}x (want <= {TARGETS[model]}x)")
        ax.set_ylabel("DDP step (ms), median over rounds")
    fig.suptitle("DDP training step, 2 nodes x 2 trainers")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def write_doc(res: dict, doc: str) -> None:
    plots = os.path.join(os.path.dirname(doc), "bench")
    os.makedirs(plots, exist_ok=True)
    plot(res, os.path.join(plots, "ddp_step.png"))
    with open(os.path.join(plots, "ddp_step.json"), "w") as f:
        json.dump(res, f)
    section = markdown(res, "bench/ddp_step.png")
    text = open(doc, encoding="utf-8").read() if os.path.exists(doc) else ""
    if BEGIN in text and END in text:
        i, j = text.index(BEGIN), text.index(END) + len(END)
        text = text[:i] + section.rstrip("\n") + text[j:]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    with open(doc, "w", encoding="utf-8") as f:
        f.write(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", nargs="?", default="run", choices=["run", "worker"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps-10m", type=int, default=20)
    ap.add_argument("--steps-30k", type=int, default=300)
    ap.add_argument("--bin", default="", help="collectived binary (default: build bin/collectived)")
    ap.add_argument("--doc", default=os.path.join(REPO, "docs", "BENCHMARKS.md"))
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--report-only", default="", help="rewrite the report from a results file")
    # worker
    ap.add_argument("--backend", default="collectived")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=NODES * LOCAL)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--socket", default="")
    ap.add_argument("--local-rank", type=int, default=0)
    ap.add_argument("--models", default=",".join(MODELS))
    a = ap.parse_args()
    if a.mode == "worker":
        _worker(a)
        return 0
    if a.report_only:
        with open(a.report_only) as f:
            res = json.load(f)
    else:
        res = measure(a)
        os.makedirs(os.path.join(HERE, ".results"), exist_ok=True)
        with open(os.path.join(HERE, ".results", "ddp.json"), "w") as f:
            json.dump(res, f)
    for model, row in summarize(res).items():
        verdict = "PASS" if row["ratio"] <= TARGETS[model] else "FAIL"
        print(f"{model}: collectived {row['collectived']['median'] * 1e3:.2f} ms, Gloo "
              f"{row['gloo']['median'] * 1e3:.2f} ms: {row['ratio']:.2f}x (want <= "
              f"{TARGETS[model]}x) {verdict}")
    if not a.no_doc:
        write_doc(res, a.doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
