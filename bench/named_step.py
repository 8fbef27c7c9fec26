#!/usr/bin/env python3
"""Named calls and fusion (issue 27): a training step's gradients, the 161
tensors of ResNet-50 (bench/resnet50_shapes.txt, 102 MB in float32),
through collectived as named allreduces and through Gloo, taking turns.

    /usr/bin/python3 bench/named_step.py                 # 3 rounds, worlds 2 and 4
    /usr/bin/python3 bench/named_step.py --rounds 1 --no-doc
    /usr/bin/python3 bench/named_step.py --ordered --no-doc   # ordered calls instead (the harness alone)
    /usr/bin/python3 bench/named_step.py --report-only bench/.results/named_step.json

In every round and world (2 nodes x 1 trainer, 2 x 2) three runs, their
order rotated:

- collectived (`collectived bench --tensors FILE --named --concat`):
  each trainer starts an allreduce of every tensor as a named call (the
  tensor's name), in an order of its own, a fresh permutation every step,
  all in flight at once, and waits for all; step by step in turn, one
  ordered allreduce of all the tensors' bytes concatenated, through the
  same daemons.
- the same with fusion off (`--extra-config` fusion.threshold_bytes: 0;
  --no-unfused skips it): what fusion buys;
- Gloo (`bench/gloo_allreduce.py --tensors FILE`): dist.all_reduce on
  every tensor one by one in the file's order.

Each run makes `--warmup` untimed steps, then `--iters` timed ones, every
result checked on the first and last; a run's figure is its median step
(as world rank 0 timed it). Targets (issue 27), each round's own pair and
their median over rounds: fusion, the named step / the concatenated
allreduce (the same run) <= 1.15; against Gloo, the named step / Gloo's
step (adjacent runs) <= 0.35.

Writes the section "Named calls and fusion (ResNet-50 step)" of
docs/BENCHMARKS.md between its markers (bench/compare keeps it) and the
raw results, docs/bench/named_step.json (also bench/.results/). Needs
Debian's python3-torch; builds collectived into bench/.build/ unless
--bin is given.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import runners  # noqa: E402
import tensors as tensorfile  # noqa: E402

BEGIN, END = "<!-- named-step: begin (bench/named_step.py) -->", "<!-- named-step: end -->"
TITLE = "## Named calls and fusion (ResNet-50 step)"
TARGETS = {"fusion": 1.15, "gloo": 0.35}
WORLDS = {2: (2, 1), 4: (2, 2)}  # world: (nodes, local)
SYSTEMS = ("collectived", "gloo")
# The same collectived run with fusion off (fusion.threshold_bytes: 0),
# adjacent in every round: what fusion buys.
UNFUSED = "collectived-unfused"
UNFUSED_CONFIG = "fusion: {threshold_bytes: 0}"


def parse_worlds(s: str) -> list[int]:
    out = []
    for f in s.split(","):
        f = f.strip()
        if f not in ("2", "4"):
            raise SystemExit(f"named_step: --worlds: {f!r}: only 2 (2 nodes x 1) and 4 (2 nodes x 2) are defined")
        out.append(int(f))
    return out


def check_counts(a: argparse.Namespace) -> None:
    for name, v, lo in (("--rounds", a.rounds, 1), ("--iters", a.iters, 1), ("--warmup", a.warmup, 0),
                        ("--prewarm", a.prewarm, 0)):
        if v < lo:
            raise SystemExit(f"named_step: {name} {v}: want at least {lo}")


def order(rnd: int, wi: int, unfused: bool = False) -> list[str]:
    """The runs of round rnd's wi-th world, in the order run: rotated from
    round to round and world to world, so that none always goes first.
    unfused: collectived with fusion off too."""
    systems = [SYSTEMS[0], UNFUSED, SYSTEMS[1]] if unfused else list(SYSTEMS)
    k = (rnd + wi) % len(systems)
    return systems[k:] + systems[:k]


# ------------------------------------------------------------ measuring

def _out(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=REPO).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unavailable ({e})"


def measure(a: argparse.Namespace) -> dict:
    binary = a.bin
    if not binary:
        binary = os.path.join(HERE, ".build", "collectived")
        os.makedirs(os.path.dirname(binary), exist_ok=True)
        subprocess.run(["go", "build", "-o", binary, "./cmd/collectived"], cwd=REPO, check=True)
    ts = tensorfile.read(a.tensors)
    n = len(ts)
    worlds = parse_worlds(a.worlds)
    res: dict = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "machine": {"nproc": os.cpu_count(), "kernel": platform.release(),
                    "loadavg_start": open("/proc/loadavg").read().strip()},
        "settings": {"tensors": os.path.relpath(os.path.abspath(a.tensors), REPO), "n_tensors": n,
                     "bytes": 4 * sum(tensorfile.numel(s) for _, s in ts), "rounds": a.rounds, "worlds": worlds,
                     "iters": a.iters, "warmup": a.warmup, "prewarm": a.prewarm, "named": not a.ordered,
                     "order": "file" if a.ordered else "random", "seed": a.seed, "unfused": a.unfused,
                     "commit": _out(["git", "rev-parse", "--short", "HEAD"]),
                     "dirty": bool(_out(["git", "status", "--porcelain", "--", ".", ":!bench", ":!docs"])),
                     "torch": _out(["/usr/bin/python3", "-c", "import torch; print(torch.__version__)"])},
        "runs": [], "errors": []}
    t0 = time.monotonic()
    for rnd in range(a.rounds):
        for wi, w in enumerate(worlds):
            nodes, local = WORLDS[w]
            for system in order(rnd, wi, a.unfused):
                l0 = runners.loadavg()
                s0 = time.monotonic()
                try:
                    if system in ("collectived", UNFUSED):
                        rows = runners.collectived_step(binary, nodes, local, a.tensors, n, a.iters, a.warmup,
                                                        a.timeout, named=not a.ordered, concat=True,
                                                        prewarm=a.prewarm, seed=None if a.ordered else a.seed,
                                                        extra_config=UNFUSED_CONFIG if system == UNFUSED else None)
                    else:
                        rows = [runners.gloo_step("/usr/bin/python3", os.path.join(HERE, "gloo_allreduce.py"), w,
                                                  a.tensors, n, a.iters, a.warmup, a.timeout, a.prewarm)]
                except (runners.RunError, OSError, KeyError, ValueError) as e:
                    msg = f"round {rnd + 1}, world {w}, {system}: {e}"
                    res["errors"].append(msg)
                    print("FAILED: " + msg[:3000], file=sys.stderr, flush=True)
                    continue
                run = {"round": rnd + 1, "world": w, "system": system, "load_before": l0,
                       "load_after": runners.loadavg(), "took_s": round(time.monotonic() - s0, 1),
                       "rows": [{k: r.get(k) for k in ("bytes", "calls", "named", "order", "concat", "iters",
                                                       "median_us", "p99_us", "algbw_GBps", "busbw_GBps",
                                                       "daemon_named")
                                 if r.get(k) is not None} for r in rows]}
                res["runs"].append(run)
                print(f"round {rnd + 1}/{a.rounds}, world {w}, {system}: "
                      + ", ".join(f"{_label(r)} {r['median_us'] / 1e3:.1f} ms" for r in run["rows"])
                      + f" (load {l0:.1f}-{run['load_after']:.1f})", flush=True)
    res["took_s"] = round(time.monotonic() - t0)
    res["machine"]["loadavg_end"] = open("/proc/loadavg").read().strip()
    res["commands"] = [c.replace(REPO + "/", "") for c in runners.COMMANDS]
    return res


def _label(r: dict) -> str:
    if r.get("concat"):
        return "concatenated"
    if "named" in r or "order" in r:
        return "named step" if r.get("named") else "ordered step"
    return "step"


# ------------------------------------------------------------ summary

def _spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "rounds": xs}


def summarize(res: dict) -> dict:
    """Per world: the named (or ordered) step, the concatenated allreduce
    and Gloo's step (ms: the median over rounds of each run's median, with
    the range and every round's), and the two ratios, each round's pair
    and their median (the verdict's figure) beside the ratio of the
    medians."""
    out: dict = {}
    for w in res["settings"]["worlds"]:
        step, concat, gloo, fusion, vs_gloo = [], [], [], [], []
        by_round: dict = {}
        for run in res["runs"]:
            if run["world"] != w:
                continue
            by_round.setdefault(run["round"], {})[run["system"]] = run
        for rnd in sorted(by_round):
            c, g = by_round[rnd].get("collectived"), by_round[rnd].get("gloo")
            if c:
                s_ms, c_ms = c["rows"][0]["median_us"] / 1e3, c["rows"][1]["median_us"] / 1e3
                step.append(s_ms)
                concat.append(c_ms)
                fusion.append(s_ms / c_ms)
            if g:
                gloo.append(g["rows"][0]["median_us"] / 1e3)
            if c and g:
                vs_gloo.append(c["rows"][0]["median_us"] / g["rows"][0]["median_us"])
        if not step:
            continue
        row: dict = {"step_ms": _spread(step), "concat_ms": _spread(concat),
                     "fusion": {"pairs": fusion, "ratio": statistics.median(fusion),
                                "ratio_of_medians": statistics.median(step) / statistics.median(concat)}}
        if gloo:
            row["gloo_ms"] = _spread(gloo)
        if vs_gloo:
            row["vs_gloo"] = {"pairs": vs_gloo, "ratio": statistics.median(vs_gloo),
                              "ratio_of_medians": statistics.median(step) / statistics.median(gloo)}
        # Fusion off: its step, its own run's ratio to the concatenation,
        # and the fused step over it (adjacent runs).
        unf = [by_round[r][UNFUSED] for r in sorted(by_round) if UNFUSED in by_round[r]]
        if unf:
            u_step = [u["rows"][0]["median_us"] / 1e3 for u in unf]
            pairs = [by_round[r]["collectived"]["rows"][0]["median_us"] / by_round[r][UNFUSED]["rows"][0]["median_us"]
                     for r in sorted(by_round) if UNFUSED in by_round[r] and "collectived" in by_round[r]]
            row["unfused"] = {"step_ms": _spread(u_step),
                              "concat_ms": _spread([u["rows"][1]["median_us"] / 1e3 for u in unf]),
                              "fusion_pairs": [u["rows"][0]["median_us"] / u["rows"][1]["median_us"] for u in unf],
                              "fused_over_unfused": pairs}
            row["unfused"]["fusion_ratio"] = statistics.median(row["unfused"]["fusion_pairs"])
            if pairs:
                row["unfused"]["fused_over_unfused_ratio"] = statistics.median(pairs)
        out[w] = row
    return out


def verdict(res: dict, ratio: float | None, target: str) -> str:
    if ratio is None:
        return "not measured"
    if not res["settings"]["named"]:
        return "not the target (ordered calls)"
    return "PASS" if ratio <= TARGETS[target] else "FAIL"


def text(res: dict) -> str:
    st = res["settings"]
    kind = "named, each trainer its own random order" if st["named"] else "ordered, the file's order"
    lines = [f"{st['n_tensors']} tensors of {st['tensors']} ({st['bytes']:,} bytes), {kind}; "
             f"{st['rounds']} rounds, {st['iters']} timed steps a run"]
    for w, row in summarize(res).items():
        f, g = row["fusion"], row.get("vs_gloo")
        gloo = f"{row['gloo_ms']['median']:.1f} ms" if "gloo_ms" in row else "failed"
        line = (f"world {w}: step {row['step_ms']['median']:.1f} ms, concatenated "
                f"{row['concat_ms']['median']:.1f} ms, Gloo {gloo}; fusion {f['ratio']:.2f}x "
                f"(want <= {TARGETS['fusion']}) {verdict(res, f['ratio'], 'fusion')}")
        if g:
            line += f", vs Gloo {g['ratio']:.2f}x (want <= {TARGETS['gloo']}) {verdict(res, g['ratio'], 'gloo')}"
        if u := row.get("unfused"):
            line += (f"; fusion off: step {u['step_ms']['median']:.1f} ms, {u['fusion_ratio']:.2f}x its "
                     "concatenation" + (f", fused step / unfused {u['fused_over_unfused_ratio']:.2f}x"
                                        if "fused_over_unfused_ratio" in u else ""))
        lines.append(line)
    for e in res.get("errors") or []:
        lines.append("failed: " + e.splitlines()[0][:300])
    return "\n".join(lines)


def _ms(s: dict) -> str:
    return f"{s['median']:.1f} ms ({s['min']:.1f}-{s['max']:.1f})"


def markdown(res: dict) -> str:
    st, m = res["settings"], res["machine"]
    s = summarize(res)
    kind = ("named calls (`Desc.Named`, the tensor's name), each trainer in an order of its own, a fresh "
            "permutation every step (seeded by world rank)" if st["named"] else
            "**ordered** calls in the file's order on every trainer (the harness checked without named calls: "
            "not the target's measurement)")
    L = [BEGIN, TITLE, "",
         f"Generated by `bench/named_step.py` on {res['date']} ({res['took_s']} s; commit {st['commit']}"
         f"{' with uncommitted changes' if st.get('dirty') else ''}; {m['nproc']} CPUs shared with other work, "
         f"load average {m['loadavg_start'].split()[0]} at the start and {m['loadavg_end'].split()[0]} at the end). "
         f"A training step's gradients: the {st['n_tensors']} parameter tensors of ResNet-50 "
         f"(`{st['tensors']}`, {st['bytes']:,} bytes in float32). collectived (`collectived bench --tensors "
         f"--concat`): each trainer starts an allreduce of every tensor as {kind}, all in flight at once, and "
         "waits for all; step by step in turn with one ordered allreduce of all the tensors concatenated, "
         "through the same daemons (the fusion target's reference). Gloo (`bench/gloo_allreduce.py --tensors`, "
         f"torch {st['torch']}): `dist.all_reduce` on each tensor one by one in the file's order. "
         f"{st['rounds']} rounds, worlds {', '.join(f'{w} ({WORLDS[w][0]} nodes x {WORLDS[w][1]})' for w in st['worlds'])}, "
         f"the runs of a round and world adjacent ({'collectived, collectived with fusion off, Gloo' if st.get('unfused') else 'collectived, Gloo'}), "
         "their order rotated; a run makes "
         f"{st['warmup']} untimed and {st['iters']} timed steps (results checked), its figure the median step; "
         "below, the median over rounds (the range). A ratio is each round's own pair's (named and "
         "concatenated from the same run, collectived and Gloo from adjacent runs), the verdict on their "
         "median; the ratio of the medians beside it.", "",
         f"| world | {'named' if st['named'] else 'ordered'} step | concatenated | Gloo, one by one | "
         "step ÷ concatenated (rounds) | wanted | verdict | step ÷ Gloo (rounds) | wanted | verdict |",
         "|---|---:|---:|---:|---|---:|---|---|---:|---|"]
    for w, row in s.items():
        f, g = row["fusion"], row.get("vs_gloo")
        L.append(f"| {w} | {_ms(row['step_ms'])} | {_ms(row['concat_ms'])} | "
                 f"{_ms(row['gloo_ms']) if 'gloo_ms' in row else 'failed'} | "
                 f"**{f['ratio']:.2f}x** ({', '.join(f'{x:.2f}' for x in f['pairs'])}; of medians "
                 f"{f['ratio_of_medians']:.2f}) | <= {TARGETS['fusion']} | **{verdict(res, f['ratio'], 'fusion')}** | "
                 + (f"**{g['ratio']:.2f}x** ({', '.join(f'{x:.2f}' for x in g['pairs'])}; of medians "
                    f"{g['ratio_of_medians']:.2f}) | <= {TARGETS['gloo']} | **{verdict(res, g['ratio'], 'gloo')}** |"
                    if g else "| <= 0.35 | **not measured** |"))
    floor = [(w, row["concat_ms"]["median"] / row["gloo_ms"]["median"]) for w, row in s.items() if "gloo_ms" in row]
    if floor:
        L += ["", "Were fusion perfect (the named step as fast as the concatenated allreduce), the step ÷ Gloo "
              "would be the concatenated ÷ Gloo's step: " + ", ".join(f"{x:.2f}x in world {w}" for w, x in floor)
              + f" (medians; want <= {TARGETS['gloo']})."]
    if any("unfused" in row for row in s.values()):
        L += ["", f"The same named step with fusion off (`--extra-config '{UNFUSED_CONFIG}'`: every "
              "name a ring operation of its own), a run of its own adjacent to the others in every round, "
              "against its own run's concatenated allreduce; and the default (fused) step over it:", "",
              "| world | step, fusion off | its concatenated | step ÷ concatenated (rounds) | "
              "fused step ÷ fusion off (rounds) |", "|---|---:|---:|---|---|"]
        for w, row in s.items():
            u = row.get("unfused")
            if not u:
                continue
            fo = (f"**{u['fused_over_unfused_ratio']:.2f}x** ({', '.join(f'{x:.2f}' for x in u['fused_over_unfused'])})"
                  if "fused_over_unfused_ratio" in u else "not measured")
            L.append(f"| {w} | {_ms(u['step_ms'])} | {_ms(u['concat_ms'])} | **{u['fusion_ratio']:.2f}x** "
                     f"({', '.join(f'{x:.2f}' for x in u['fusion_pairs'])}) | {fo} |")
    L += ["", "Every run, in the order run (ms; load average before and after):", "",
          "| round | world | system | step | concatenated | load |", "|---:|---:|---|---:|---:|---|"]
    for run in res["runs"]:
        r = run["rows"]
        L.append(f"| {run['round']} | {run['world']} | {run['system']} | {r[0]['median_us'] / 1e3:.1f} | "
                 f"{r[1]['median_us'] / 1e3:.1f} |" if len(r) > 1 else
                 f"| {run['round']} | {run['world']} | {run['system']} | {r[0]['median_us'] / 1e3:.1f} | |")
        L[-1] += f" {run['load_before']:.1f}-{run['load_after']:.1f} |"
    dn = [(run["round"], run["world"], run["rows"][0]["daemon_named"]) for run in res["runs"]
          if run["system"] == "collectived" and run["rows"][0].get("daemon_named")]
    # (fusion off's runs fuse nothing by design: not listed)
    if dn:
        L += ["", "The daemon of node 0 after each collectived run with fusion on (`collectived status`'s \"named\"; the run's "
              "prewarm, checked, untimed and timed steps together):", "",
              "| round | world | negotiation rounds | executed | fused ring ops | cache hits | cache misses |",
              "|---:|---:|---:|---:|---:|---:|---:|"]
        for rnd, w, d in dn:
            c = d.get("cache") or {}
            L.append(f"| {rnd} | {w} | {d.get('rounds', '?')} | {d.get('executed', '?')} | {d.get('fused_ops', '?')} | "
                     f"{c.get('hits', '?')} | {c.get('misses', '?')} |")
        if all(d.get("fused_ops") == 0 for _, _, d in dn):
            L += ["", "No run fused anything: every named call ran as a ring operation of its own (the daemon "
                  "counted 0 fused ring ops)."]
    if res.get("errors"):
        L += ["", "Failed runs (left out above):", ""] + [f"- {e.splitlines()[0][:500]}" for e in res["errors"]]
    L += ["", "Commands (every round runs the same):", "", "```"]
    seen: list[str] = []
    for c in res.get("commands") or []:
        c = _unport(c)
        if c not in seen:
            seen.append(c)
    L += seen + ["```",
          "", "Raw figures: [`bench/named_step.json`](bench/named_step.json).", END]
    return "\n".join(L) + "\n"


def _unport(cmd: str) -> str:
    """A command with its Gloo store's port (different every run) as PORT."""
    return re.sub(r"tcp://127\.0\.0\.1:\d+", "tcp://127.0.0.1:PORT", cmd)


def write_doc(res: dict, doc: str) -> None:
    plots = os.path.join(os.path.dirname(doc), "bench")
    os.makedirs(plots, exist_ok=True)
    with open(os.path.join(plots, "named_step.json"), "w") as f:
        json.dump(res, f, indent=1)
    old = open(doc, encoding="utf-8").read() if os.path.exists(doc) else ""
    with open(doc, "w", encoding="utf-8") as f:
        f.write(splice(old, markdown(res)))
    print(f"wrote its section of {doc} and {os.path.join(plots, 'named_step.json')}", file=sys.stderr)


def splice(old: str, section: str) -> str:
    """old with section between its markers (replacing what was there), or
    appended."""
    if BEGIN in old and END in old:
        i, j = old.index(BEGIN), old.index(END) + len(END)
        return old[:i] + section.rstrip("\n") + old[j:]
    return old.rstrip("\n") + "\n\n" + section


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--worlds", default="2,4", help="2 (2 nodes x 1 trainer), 4 (2 x 2)")
    ap.add_argument("--iters", type=int, default=10, help="timed steps a run")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps a run, after the checked one")
    ap.add_argument("--prewarm", type=int, default=1000, help="untimed one-element allreduces a run starts with")
    ap.add_argument("--seed", type=int, default=1, help="the named steps' permutations' seed")
    ap.add_argument("--no-unfused", dest="unfused", action="store_false",
                    help="skip the run with fusion off (fusion.threshold_bytes: 0) in every round and world")
    ap.add_argument("--ordered", action="store_true",
                    help="ordered calls in the file's order instead of named ones (checks the harness on a "
                         "daemon without named calls; no verdicts)")
    ap.add_argument("--tensors", default=os.path.join(HERE, "resnet50_shapes.txt"))
    ap.add_argument("--bin", default="", help="collectived binary (default: build bench/.build/collectived)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds any one run may take")
    ap.add_argument("--doc", default=os.path.join(REPO, "docs", "BENCHMARKS.md"))
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--report-only", default="", help="rewrite the report from a results file")
    a = ap.parse_args()
    if a.report_only:
        with open(a.report_only) as f:
            res = json.load(f)
    else:
        check_counts(a)
        parse_worlds(a.worlds)
        res = measure(a)
        os.makedirs(os.path.join(HERE, ".results"), exist_ok=True)
        with open(os.path.join(HERE, ".results", "named_step.json"), "w") as f:
            json.dump(res, f, indent=1)
    print(text(res))
    if not a.no_doc:
        write_doc(res, a.doc)
    return 1 if res.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())
