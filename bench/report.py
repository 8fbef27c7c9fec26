"""What bench/compare prints and writes: ratio tables, target verdicts,
docs/BENCHMARKS.md and its plots, all from one run's results dict."""

import os
import random
import re
import statistics

import srcconfig

PEERS = ["gloo", "mpi-tcp", "mpi-shm"]
LABEL = {"collectived": "collectived", "gloo": "Gloo", "mpi-tcp": "OpenMPI TCP", "mpi-shm": "OpenMPI shm",
         "ring-only": "ring-only", "tcp": "TCP bidir", "collectived-py": "collectived, Python trainers"}
PYTHON_TRAINERS = "collectived-py"  # `collectived bench --trainer-cmd "PY bench/py_trainer.py"`
MIB64 = 64 << 20
RING_ONLY = "ring-only"  # `collectived bench --ring-only`: the sidecar's baseline, world 2 only
SIDECAR_TARGET = ("64 MiB, world 2: sidecar overhead (daemon median ÷ ring-only median − 1, the median over "
                  "back-to-back pairs of runs; same default ring config, both one process per node)")
SERVING_TARGET = ("daemon serving allreduces up to 64 MiB: RSS beyond the shared segments, growth over idle ÷ "
                  "the ring's pipeline buffers (largest daemon)")
REPO_PREFIX = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + "/"


def size_name(n: int) -> str:
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m} {unit}"
    return f"{n} B"


def row(res, system, world, size):
    for r in res["rows"]:
        if r["system"] == system and r["world"] == world and r["bytes"] == size:
            return r
    return None


def world_title(w):
    return f"world {w}: collectived 2 nodes x {w // 2} trainer{'s' if w > 2 else ''} vs {w} ranks"


def _ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None


def _fmt(x, spec=".2f", none="-"):
    return none if x is None else format(x, spec)


# --- the ratio table ----------------------------------------------------------

def ratio_rows(res, w):
    """Per size: collectived's busbw and median, and its ratios to each peer."""
    out = []
    tcp = (res.get("tcp_bidir") or {}).get("per_direction_GBps")
    for size in res["sizes"]:
        c = row(res, "collectived", w, size)
        if not c:
            continue
        ring = row(res, RING_ONLY, w, size) if w == 2 else None
        r = {"size": size, "busbw": c["busbw_GBps"], "median_us": c["median_us"], "bus": {}, "lat": {}}
        for p in PEERS:
            pr = row(res, p, w, size)
            r["bus"][p] = _ratio(c["busbw_GBps"], pr and pr["busbw_GBps"])
            r["lat"][p] = _ratio(c["median_us"], pr and pr["median_us"])
        r["bus"][RING_ONLY] = _ratio(c["busbw_GBps"], ring and ring["busbw_GBps"])
        r["lat"][RING_ONLY] = _ratio(c["median_us"], ring and ring["median_us"])
        r["bus"]["tcp"] = _ratio(c["busbw_GBps"], tcp) if w == 2 else None
        out.append(r)
    return out


def _ratio_table(res, w, md):
    """Two tables: busbw ratios, then latency ratios. ring-only is a column
    only in world 2, the one world where it is measured (one ring rank per
    node and no trainers is the daemons' topology only with 1 trainer)."""
    peers = PEERS + ([RING_ONLY] if w == 2 and any(r["system"] == RING_ONLY for r in res["rows"]) else [])
    rows = ratio_rows(res, w)
    bcols = ["size", "cvd busbw GB/s"] + [f"÷ {LABEL[p]}" for p in peers] + (["÷ TCP bidir"] if w == 2 else [])
    blines = []
    for r in rows:
        cells = [size_name(r["size"]), _fmt(r["busbw"], ".3g")] + [_fmt(r["bus"][p]) for p in peers]
        if w == 2:
            cells.append(_fmt(r["bus"]["tcp"]) if r["size"] >= 1 << 20 else "-")
        blines.append(cells)
    lcols = ["size", "cvd median µs"] + [f"÷ {LABEL[p]}" for p in peers]
    llines = [[size_name(r["size"]), _fmt(r["median_us"], ".1f")] + [_fmt(r["lat"][p]) for p in peers] for r in rows]
    if md:
        heads = ("**busbw ratio** (above 1: collectived faster)",
                 "**latency ratio** (median time; below 1: collectived faster)")
    else:
        heads = ("busbw ratio (above 1: collectived faster)", "latency ratio (median time; below 1: collectived faster)")
    return "\n\n".join([heads[0], _table(bcols, blines, md), heads[1], _table(lcols, llines, md)])


def _table(cols, lines, md):
    if md:
        out = ["| " + " | ".join(cols) + " |", "|" + "|".join("---:" for _ in cols) + "|"]
        out += ["| " + " | ".join(c) + " |" for c in lines]
        return "\n".join(out)
    widths = [max(len(c), *(len(l[i]) for l in lines)) if lines else len(c) for i, c in enumerate(cols)]
    def fmt(cells):  # first column (names) to the left, numbers to the right
        return "  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(cells))
    out = [fmt(cols)] + [fmt(l) for l in lines]
    return "\n".join(out)


def ratio_text(res) -> str:
    parts = ["", "collectived ÷ each peer"]
    for w in res["worlds"]:
        parts += ["", world_title(w), _ratio_table(res, w, md=False)]
    return "\n".join(parts)


# --- targets ------------------------------------------------------------------

def targets(res) -> list[dict]:
    """Issue 5's targets, each with the measured value and PASS/FAIL (n/a if
    this run did not measure what the target needs)."""
    out = []

    def add(name, value, op, limit, unit="x", aim=False):
        if value is None:
            verdict = "n/a"
        else:
            ok = value >= limit if op == ">=" else value <= limit
            verdict = "PASS" if ok else "FAIL"
        out.append({"target": name, "value": value, "op": op, "limit": limit, "unit": unit,
                    "verdict": verdict, "aim": aim})

    c2, c4 = row(res, "collectived", 2, MIB64), row(res, "collectived", 4, MIB64)
    bus = lambda r: r and r["busbw_GBps"]
    lat = lambda r: r and r["median_us"]
    add("64 MiB, world 2: busbw ÷ Gloo", _ratio(bus(c2), bus(row(res, "gloo", 2, MIB64))), ">=", 1.5)
    add("64 MiB, world 2: busbw ÷ OpenMPI TCP", _ratio(bus(c2), bus(row(res, "mpi-tcp", 2, MIB64))), ">=", 1.8)
    tcp = (res.get("tcp_bidir") or {}).get("per_direction_GBps")
    add("64 MiB, world 2: busbw ÷ bidirectional TCP loopback (per direction)", _ratio(bus(c2), tcp), ">=", 0.85)
    c2s = row(res, "collectived", 2, 4)
    add("4 B, world 2: latency ÷ Gloo", _ratio(lat(c2s), lat(row(res, "gloo", 2, 4))), "<=", 0.2)
    add("4 B, world 2: latency ÷ OpenMPI TCP (aim)", _ratio(lat(c2s), lat(row(res, "mpi-tcp", 2, 4))), "<=", 1.5,
        aim=True)
    add("64 MiB, world 4 (2x2): busbw ÷ Gloo (4 ranks)", _ratio(bus(c4), bus(row(res, "gloo", 4, MIB64))), ">=", 2.0)
    add("64 MiB, world 4 (2x2): busbw ÷ OpenMPI TCP (4 ranks)", _ratio(bus(c4), bus(row(res, "mpi-tcp", 4, MIB64))),
        ">=", 2.0)
    add(SIDECAR_TARGET, sidecar_overhead(res, MIB64), "<=", 5.0, unit="%")
    rs = res.get("rss")
    add("daemon RSS at idle (largest daemon, fresh and after work)",
        rs and rs["max_rss_bytes"] / (1 << 20), "<=", 30.0, unit=" MiB")
    add(SERVING_TARGET, (rs or {}).get("serving_growth_per_buffers"), "<=", 2.0)
    return out


def sidecar_overhead(res, size):
    """World 2 at size, in percent: at the size of the pairs, the median of
    the pairs' own overheads (paired_median over target_pairs); at other
    sizes, collectived's median ÷ ring-only's − 1 over the rounds. None
    unless both were measured.

    A pair's two runs are back to back, so they share the machine's slow or
    fast phase, which moves 64 MiB by tens of percent over seconds; each
    pair's own ratio cancels that, the ratio of the two sides' medians over
    the pairs does not. Over six full runs the paired figure ranged -0.6% to
    +4.7%, the ratio of medians -2.2% to +9.1% (TUNING.md section 23)."""
    sc = res.get("sidecar")
    if sc and sc["bytes"] == size:
        return paired_median(target_pairs(sc["pairs"]))
    return rounds_overhead(res, size)


def own_overhead(pair):
    """A pair's own overhead: its collectived median ÷ its ring-only
    median − 1, in percent."""
    return (pair["collectived_us"] / pair["ring_only_us"] - 1) * 100


def paired_median(pairs):
    """The median of the pairs' own overheads."""
    return statistics.median(own_overhead(p) for p in pairs)


def medians_overhead(pairs):
    """The two sides' medians over the pairs, divided (− 1, in percent): the
    sidecar figure's rule before the paired one, shown beside it."""
    return (statistics.median(p["collectived_us"] for p in pairs)
            / statistics.median(p["ring_only_us"] for p in pairs) - 1) * 100


def rounds_overhead(res, size):
    """sidecar_overhead over the rounds alone."""
    c, ro = row(res, "collectived", 2, size), row(res, RING_ONLY, 2, size)
    over = _ratio(c and c["median_us"], ro and ro["median_us"])
    return None if over is None else (over - 1) * 100


def target_pairs(pairs):
    """The pairs the sidecar target's figure comes from: the separate runs
    (the rounds' own pairs and the extra back-to-back ones), not the
    interleaved ones (`collectived bench --sidecar`), which may flatter
    the daemon (TUNING.md section 21); those alone if there is nothing
    else."""
    sep = [p for p in pairs if not p.get("interleaved")]
    return sep or pairs


def paired_overheads(res):
    """Each pair's own overhead (collectived ÷ ring-only − 1, percent), in
    the order run: what the spread of the target's figure looks like."""
    return [own_overhead(p) for p in (res.get("sidecar") or {}).get("pairs", [])]


def sidecar_interval(res, level=0.95, resamples=2000, seed=1):
    """How far the pairs' noise moves the target's figure: the central
    `level` range, in percent, of sidecar_overhead recomputed on its pairs
    (target_pairs) resampled with replacement (a percentile bootstrap; each pair keeps
    both of its sides, and the fixed seed makes a report reproducible from
    its results). None with fewer than two pairs."""
    pairs = target_pairs((res.get("sidecar") or {}).get("pairs", []))
    if len(pairs) < 2:
        return None
    rng = random.Random(seed)
    est = []
    for _ in range(resamples):
        est.append(paired_median([pairs[rng.randrange(len(pairs))] for _ in pairs]))
    est.sort()
    lo = est[int((1 - level) / 2 * resamples)]
    hi = est[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return lo, hi


def _tval(t):
    if t["value"] is None:
        return "not measured"
    v = t["value"]
    if t["unit"] == "x":
        return f"{v:.2f}x"
    if t["unit"] == "%":
        return f"{v:+.1f}%"
    return f"{v:.1f}{t['unit']}"


def _tlimit(t):
    return f"{t['op']} {t['limit']:g}{t['unit']}"


def targets_text(res) -> str:
    ts = targets(res)
    lines = [[t["target"], _tval(t), _tlimit(t), t["verdict"] + (" (aim)" if t["aim"] else "")] for t in ts]
    return ("\ntargets (issue 5)\n" + _table(["target", "measured", "wanted", "verdict"], lines, md=False)
            + "\n" + _summary(ts))


def _summary(ts) -> str:
    req = [t for t in ts if not t["aim"]]
    n = lambda v: sum(t["verdict"] == v for t in req)
    s = f"{n('PASS')} of {len(req)} targets pass, {n('FAIL')} fail"
    if n("n/a"):
        s += f", {n('n/a')} not measured"
    aims = [t for t in ts if t["aim"]]
    if aims:
        s += "; aim" + ("s" if len(aims) > 1 else "") + ": " + ", ".join(t["verdict"] for t in aims)
    return s


# --- plots --------------------------------------------------------------------

STYLE = {"collectived": ("tab:red", "o"), "gloo": ("tab:blue", "s"), "mpi-tcp": ("tab:green", "^"),
         "mpi-shm": ("tab:olive", "v"), "ring-only": ("tab:purple", "D"), "collectived-py": ("tab:orange", "P")}


def plots(res, d):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    collectives_plots(res, d)
    worlds = res["worlds"]
    if not worlds:
        return
    for kind in ("busbw", "latency"):
        fig, axes = plt.subplots(1, len(worlds), figsize=(6.5 * len(worlds), 4.6), squeeze=False)
        for ax, w in zip(axes[0], worlds):
            for s in ["collectived", PYTHON_TRAINERS] + PEERS + [RING_ONLY]:
                rs = sorted((r for r in res["rows"] if r["system"] == s and r["world"] == w), key=lambda r: r["bytes"])
                if not rs:
                    continue
                col, mk = STYLE[s]
                ls = "--" if s == RING_ONLY else "-"  # a baseline, not a peer
                x = [r["bytes"] for r in rs]
                if kind == "busbw":
                    ax.plot(x, [r["busbw_GBps"] for r in rs], color=col, marker=mk, ls=ls, label=LABEL[s])
                else:
                    ax.plot(x, [r["median_us"] for r in rs], color=col, marker=mk, ls=ls, label=f"{LABEL[s]} median")
                    ax.plot(x, [r["p99_us"] for r in rs], color=col, ls=":", lw=1, label=f"{LABEL[s]} p99")
            tcp = (res.get("tcp_bidir") or {}).get("per_direction_GBps")
            if kind == "busbw" and w == 2 and tcp:
                ax.axhline(tcp, color="gray", ls="--", lw=1, label=f"TCP loopback bidir, per direction ({tcp:.2f} GB/s)")
            ax.set_xscale("log", base=2)
            ax.set_xticks(res["sizes"], [size_name(x) for x in res["sizes"]], fontsize=8)
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_yscale("log")
            ax.set_xlabel("buffer size (bytes, float32 sum)")
            ax.set_ylabel("busbw (GB/s)" if kind == "busbw" else "time per allreduce (µs)")
            ax.set_title(world_title(w), fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        m = res["meta"]
        fig.suptitle(f"allreduce {'bus bandwidth' if kind == 'busbw' else 'latency'} on loopback, "
                     f"{m['nproc']} cores, {m['date_utc'][:10]}", fontsize=11)
        fig.tight_layout()
        fig.savefig(os.path.join(d, f"{kind}.png"), dpi=110)
        plt.close(fig)


# --- the other collectives and bfloat16 (issue 25) ------------------------------

COLL_LABEL = {"allgather": "allgather", "reducescatter": "reduce-scatter", "reduce": "reduce", "broadcast": "broadcast"}
COLL_PEER_CALL = {
    ("mpi-tcp", "allgather"): "MPI_Allgather", ("mpi-tcp", "reducescatter"): "MPI_Reduce_scatter_block",
    ("mpi-tcp", "reduce"): "MPI_Reduce", ("mpi-tcp", "broadcast"): "MPI_Bcast",
    ("gloo", "allgather"): "all_gather", ("gloo", "reducescatter"): "reduce_scatter",
    ("gloo", "reduce"): "reduce", ("gloo", "broadcast"): "broadcast",
}
COLL_PEERS = ["mpi-tcp", "gloo"]
COLL_TARGET_RATIO = 1.5
BF16_TARGET = 0.6


def coll_row(c, system, op, size):
    for r in c.get("rows") or []:
        if r["system"] == system and r["op"] == op and r["bytes"] == size:
            return r
    return None


def coll_unsupported(c, system, op):
    """What the system said when asked for the call it does not offer, or
    None."""
    return ((c.get("unsupported") or {}).get(system) or {}).get(op)


def coll_sizes(c, op):
    """The sizes measured for op, as the rows have them (a reduce-scatter's
    rounded to the world)."""
    return sorted({r["bytes"] for r in c.get("rows") or [] if r["op"] == op})


def coll_size_name(op, size, world):
    if op == "allgather":
        return f"{size_name(size)} (x{world})"
    return size_name(size)


def targets25(res) -> list[dict]:
    """Issue 25's speed targets, each with the measured value and a verdict:
    PASS/FAIL, n/a when not measured, or "not offered" when the peer has no
    such call (with its own words)."""
    c = res.get("collectives") or {}
    out = []

    def add(name, value, op, limit, note=None, verdict=None):
        if verdict is None:
            if value is None:
                verdict = "n/a"
            else:
                verdict = "PASS" if (value >= limit if op == ">=" else value <= limit) else "FAIL"
        out.append({"target": name, "value": value, "op": op, "limit": limit, "unit": "x", "verdict": verdict,
                    "aim": False, "note": note})

    for op in ("allgather", "reducescatter"):
        size = MIB64  # allgather: each rank's block; reduce-scatter: the whole input
        cv = coll_row(c, "collectived", op, size)
        for peer in COLL_PEERS:
            what = f"{COLL_LABEL[op]} 64 MiB{' per rank' if op == 'allgather' else ''}, world 2: busbw ÷ " \
                   f"{LABEL[peer]} (`{COLL_PEER_CALL[(peer, op)]}`)"
            why = coll_unsupported(c, peer, op)
            if why:
                add(what, None, ">=", COLL_TARGET_RATIO, note=f"{LABEL[peer]} has no {COLL_LABEL[op]}: \"{why}\"",
                    verdict="not offered")
                continue
            pr = coll_row(c, peer, op, size)
            add(what, _ratio(cv and cv["busbw_GBps"], pr and pr["busbw_GBps"]), ">=", COLL_TARGET_RATIO)
    b = c.get("bf16")
    add(f"bfloat16 allreduce of {((b or {}).get('elements') or 16 << 20) >> 20} Mi elements, world 2: time ÷ float32's "
        "(the same elements, call by call in turn; median of the runs)", b and b["ratio"], "<=", BF16_TARGET)
    return out


def _t25val(t):
    if t["verdict"] == "not offered":
        return t["note"]
    return _tval(t)


def targets25_text(res) -> str:
    ts = targets25(res)
    lines = [[t["target"].replace("`", ""), "-" if t.get("note") else _tval(t), _tlimit(t), t["verdict"]] for t in ts]
    notes = [f"  {t['target'].split(':')[0]}: {t['note']}" for t in ts if t.get("note")]
    return "\ntargets (issue 25)\n" + _table(["target", "measured", "wanted", "verdict"], lines, md=False) + \
        ("\n" + "\n".join(notes) if notes else "") + "\n" + _summary25(ts)


def _summary25(ts) -> str:
    n = lambda v: sum(t["verdict"] == v for t in ts)
    s = f"{n('PASS')} of {len(ts)} targets pass, {n('FAIL')} fail"
    if n("not offered"):
        s += f", {n('not offered')} not offered by the peer"
    if n("n/a"):
        s += f", {n('n/a')} not measured"
    return s


def coll_table(res, op, md):
    """One collective's table: per size, each system's busbw and median
    time (with the rounds' range in the Markdown), and collectived's busbw
    ratio to each peer."""
    c = res["collectives"]
    w = c.get("world", 2)
    systems = [s for s in ["collectived"] + COLL_PEERS if s in c.get("systems", [])]
    cols = ["size"] + [f"{LABEL[s]} busbw GB/s" for s in systems] + \
        [f"÷ {LABEL[p]}" for p in systems if p != "collectived"] + [f"{LABEL[s]} median µs" for s in systems]
    lines = []
    for size in coll_sizes(c, op):
        rs = {s: coll_row(c, s, op, size) for s in systems}
        cells = [coll_size_name(op, size, w)]
        for s in systems:
            if coll_unsupported(c, s, op):
                cells.append("not offered")
            else:
                cells.append(_spread(rs[s], "busbw_GBps", ".3g") if md else _fmt(rs[s] and rs[s]["busbw_GBps"], ".3g"))
        cv = rs.get("collectived")
        for p in systems:
            if p == "collectived":
                continue
            cells.append("-" if coll_unsupported(c, p, op) else
                         _fmt(_ratio(cv and cv["busbw_GBps"], rs[p] and rs[p]["busbw_GBps"])))
        for s in systems:
            if coll_unsupported(c, s, op):
                cells.append("-")
            else:
                cells.append(_spread(rs[s], "median_us", ".1f") if md else _fmt(rs[s] and rs[s]["median_us"], ".1f"))
        lines.append(cells)
    return _table(cols, lines, md)


def bf16_lines(res, md):
    b = (res.get("collectives") or {}).get("bf16")
    if not b:
        return ""
    cols = ["round", "--dtype", "float32 median µs", "bfloat16 median µs", "bfloat16 ÷ float32", "load (1 min)"]
    lines = [[str(p["round"]), p["first"], f"{p['float32_us']:.1f}", f"{p['bfloat16_us']:.1f}", f"{p['ratio']:.3f}",
              "-" if not p.get("load") or p["load"][0] is None else f"{p['load'][0]:.2f}"] for p in b["pairs"]]
    return _table(cols, lines, md)


def collectives_text(res) -> str:
    c = res.get("collectives")
    if not c:
        return ""
    parts = []
    for op in c.get("ops") or []:
        parts += ["", f"{COLL_LABEL[op]}, world {c.get('world', 2)} (2 nodes x 1 trainer vs 2 ranks), float32"
                  + (" sum" if op in ("reducescatter", "reduce") else "") + "; " + _coll_sizes_mean(op),
                  coll_table(res, op, md=False)]
        for s in COLL_PEERS:
            why = coll_unsupported(c, s, op)
            if why:
                parts.append(f"{LABEL[s]} does not offer {COLL_LABEL[op]}: {why}")
    t = bf16_lines(res, md=False)
    if t:
        b = c["bf16"]
        parts += ["", f"bfloat16 vs float32 allreduce, {b['elements'] >> 20} Mi elements, world 2, call by call in turn: "
                  f"median of the runs' ratios {b['ratio']:.3f} (ratio of medians {b['ratio_of_medians']:.3f})", t]
    return "\n".join(parts) + "\n" + targets25_text(res)


def _coll_sizes_mean(op):
    return {"allgather": "size = each rank's block (the result is 2 x size); algbw = 2 x size / time, "
                         "busbw = algbw x (W-1)/W",
            "reducescatter": "size = the whole input (each rank gets half); algbw = size / time, "
                             "busbw = algbw x (W-1)/W",
            "reduce": "size = each rank's buffer, root 0; times are the root's; busbw = algbw = size / time",
            "broadcast": "size = the buffer, root 0; times are the root's; busbw = algbw = size / time"}[op]


def collectives_plots(res, d):
    """docs/bench/coll_OP.png per collective (busbw and median time against
    size, each system) and bf16_allreduce.png (each pair's two times)."""
    c = res.get("collectives")
    if not c:
        return []
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    m, written = res["meta"], []
    for op in c.get("ops") or []:
        sizes = coll_sizes(c, op)
        if not sizes:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
        for ax, key in zip(axes, ("busbw_GBps", "median_us")):
            for s in ["collectived"] + COLL_PEERS:
                rs = sorted((r for r in c["rows"] if r["system"] == s and r["op"] == op), key=lambda r: r["bytes"])
                col, mk = STYLE[s]
                if coll_unsupported(c, s, op):
                    ax.plot([], [], color=col, marker=mk, ls="none", label=f"{LABEL[s]}: not offered")
                    continue
                if not rs:
                    continue
                x = [r["bytes"] for r in rs]
                lo = [min(q[key] for q in r["rounds"] if q.get(key) is not None) for r in rs]
                hi = [max(q[key] for q in r["rounds"] if q.get(key) is not None) for r in rs]
                y = [r[key] for r in rs]
                call = COLL_PEER_CALL.get((s, op))
                ax.plot(x, y, color=col, marker=mk, label=LABEL[s] + (f" ({call})" if call else ""))
                ax.fill_between(x, lo, hi, color=col, alpha=0.15, lw=0)
            ax.set_xscale("log", base=2)
            ax.set_xticks(sizes, [coll_size_name(op, x, c.get("world", 2)) for x in sizes], fontsize=8)
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_yscale("log")
            ax.set_xlabel("size (float32; allgather: each rank's block)" if op == "allgather" else "size (float32)")
            ax.set_ylabel("busbw (GB/s)" if key == "busbw_GBps" else "median time per call (µs)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle(f"{COLL_LABEL[op]}, world 2 (2 nodes x 1 trainer vs 2 ranks) on loopback, {m['nproc']} cores, "
                     f"{m['date_utc'][:10]}; shaded: range over rounds", fontsize=10)
        fig.tight_layout()
        name = f"coll_{op}.png"
        fig.savefig(os.path.join(d, name), dpi=110)
        plt.close(fig)
        written.append(name)
    b = c.get("bf16")
    if b:
        fig, ax = plt.subplots(figsize=(8, 4.2))
        x = list(range(1, len(b["pairs"]) + 1))
        ax.plot(x, [p["float32_us"] / 1e3 for p in b["pairs"]], "o-", color="tab:blue", label="float32 (64 MiB)")
        ax.plot(x, [p["bfloat16_us"] / 1e3 for p in b["pairs"]], "s-", color="tab:red", label="bfloat16 (32 MiB)")
        ax2 = ax.twinx()
        ax2.plot(x, [p["ratio"] for p in b["pairs"]], "d:", color="gray", label="bfloat16 ÷ float32")
        ax2.axhline(BF16_TARGET, color="gray", lw=1, ls="--")
        ax2.set_ylim(0, 1.2)
        ax2.set_ylabel("bfloat16 ÷ float32")
        ax.set_xticks(x, [f"r{p['round']}" for p in b["pairs"]], fontsize=8)
        ax.set_xlabel("run (round)")
        ax.set_ylabel("median time per allreduce (ms)")
        ax.set_ylim(bottom=0)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="lower right")
        ax.grid(True, alpha=0.3)
        fig.suptitle(f"allreduce of {b['elements'] >> 20} Mi elements, world 2, call by call in turn: each run; "
                     f"median ratio {b['ratio']:.3f} (target <= {BF16_TARGET})", fontsize=10)
        fig.tight_layout()
        fig.savefig(os.path.join(d, "bf16_allreduce.png"), dpi=110)
        plt.close(fig)
        written.append("bf16_allreduce.png")
    return written


def _targets25_md(res) -> list[str]:
    if not res.get("collectives"):
        return []
    ts = targets25(res)
    L = ["## Targets (issue 25)", "", "| target | measured | wanted | verdict |", "|---|---:|---:|---|"]
    for t in ts:
        L.append(f"| {t['target']} | {_t25val(t)} | {_tlimit(t)} | **{t['verdict']}** |")
    L += ["", f"In this run: {_summary25(ts)}. The measurements are in \"Other collectives\" and \"bfloat16 "
          "allreduce\" below.", ""]
    return L


def _collectives_md(res, plot_rel) -> list[str]:
    c = res.get("collectives")
    if not c:
        return []
    it = c["iters"]
    rounds = len(c.get("per_round") or [])
    of = "" if res.get("only") == "collectives" or rounds == res.get("rounds", rounds) else \
        f" (the first {rounds} of the run's {res.get('rounds')})"
    L = ["## Other collectives (world 2)", "",
         f"collectived (`collectived bench --op OP`, 2 daemons x 1 trainer) against OpenMPI over TCP "
         "(`bench/mpi_collectives.c`: `--mca pml ob1 --mca btl tcp,self` on `lo`, as for allreduce) and Gloo "
         "(`bench/gloo_collectives.py`, torch.distributed, CPU tensors), 2 ranks each, float32, sum, root 0. "
         f"Each of {rounds} round(s){of} measures them"
         + ("" if res.get("only") == "collectives" else " after the allreduce ones") + ", in an order rotated each round; "
         "each figure is the median of the rounds' medians, the lowest and highest round in brackets (busbw's "
         "range is the rounds' own busbw). "
         f"Each system's processes start once per collective and round, first make {it.get('prewarm', 0)} "
         f"untimed smallest calls, then per size one checked call on known values, {it['warmup']} untimed and "
         f"{it['iters']} timed calls, the last checked again (the same protocol for every system). "
         "Times are rank 0's per-call wall times. busbw follows NCCL: algbw = the full vector's bytes / median "
         "time (allgather: the gathered result, 2 x size; reduce-scatter: the input), busbw = algbw x (W-1)/W for "
         "both; reduce and broadcast, busbw = algbw.", ""]
    for op in c.get("ops") or []:
        mean = _coll_sizes_mean(op)
        L += [f"### {COLL_LABEL[op]}", "", mean[0].upper() + mean[1:] + ".", ""]
        for s in COLL_PEERS:
            why = coll_unsupported(c, s, op)
            if why:
                L += [f"**{LABEL[s]} does not offer {COLL_LABEL[op]}**: torch {res['meta'].get('torch', '?')}'s "
                      f"`dist.{COLL_PEER_CALL[(s, op)]}` on the gloo backend raises \"{why}\" (as do "
                      "`reduce_scatter_tensor` and `_reduce_scatter_base`), so its column says \"not offered\".", ""]
        if op == "allgather" and "gloo" in c.get("systems", []) and not coll_unsupported(c, "gloo", op):
            L += ["Gloo's is the list form, `dist.all_gather(list of views of one tensor, x)`: this torch's Gloo "
                  "has no `all_gather_into_tensor` (\"no support for _allgather_base in Gloo process group\").", ""]
        if op in ("reduce", "broadcast"):
            L += ["Calls follow each other without a barrier and the times are the root's, so at small sizes "
                  "they show how fast the root can issue calls back to back rather than one call's latency, "
                  "for every system alike.", ""]
        L += [coll_table(res, op, md=True), "", f"![{COLL_LABEL[op]}]({plot_rel}/coll_{op}.png)", ""]
    b = c.get("bf16")
    if b or c.get("bf16_pairs_per_round"):
        L += ["## bfloat16 allreduce against float32", ""]
    if b:
        bi = c.get("bf16_iters") or {}
        L += [f"collectived only: `collectived bench --dtype float32 --alternate-dtype bfloat16 --sizes "
              f"{b['elements'] * 4}` (or the other way round): {b['elements'] >> 20} Mi elements, 64 MiB of "
              "float32 against 32 MiB of bfloat16 (half the bytes on the wire), world 2, in one world of daemons "
              "and trainers: every timed iteration makes one allreduce of each, alternating which goes first, so "
              f"both see the machine at the same moments; {bi.get('warmup', '?')} untimed and "
              f"{bi.get('iters', '?')} timed calls of each, {c.get('bf16_pairs_per_round')} run(s) per round, "
              "alternating which dtype is `--dtype`. The figure is the median of the runs' own ratios "
              "(bfloat16's median ÷ float32's): "
              f"**{b['ratio']:.3f}** (target ≤ {BF16_TARGET}); the runs range from "
              f"{min(p['ratio'] for p in b['pairs']):.3f} to {max(p['ratio'] for p in b['pairs']):.3f}, and the "
              f"median of bfloat16's medians ÷ the median of float32's is {b['ratio_of_medians']:.3f}.", "",
              bf16_lines(res, md=True), "", f"![bfloat16 against float32]({plot_rel}/bf16_allreduce.png)", ""]
    return L


# --- the Markdown report --------------------------------------------------------

def _spread(r, key, spec):
    """The figure, with the lowest and highest of the rounds' own figures."""
    if r is None:
        return "-"
    rounds = r.get("rounds") or []
    vals = [x[key] if isinstance(x, dict) else x for x in rounds]
    vals = [v for v in vals if v is not None]
    if len(vals) < 2:
        return format(r[key], spec)
    return f"{format(r[key], spec)} ({format(min(vals), spec)}–{format(max(vals), spec)})"


def python_rows(res, w):
    """Per size: Python trainers' median and busbw through collectived,
    and their ratios to Gloo (Python to Python) and to Go trainers."""
    out = []
    for size in res["sizes"]:
        p = row(res, PYTHON_TRAINERS, w, size)
        if not p:
            continue
        g, c = row(res, "gloo", w, size), row(res, "collectived", w, size)
        out.append({"size": size, "median_us": p["median_us"], "busbw": p["busbw_GBps"],
                    "lat_gloo": _ratio(p["median_us"], g and g["median_us"]),
                    "bus_gloo": _ratio(p["busbw_GBps"], g and g["busbw_GBps"]),
                    "lat_go": _ratio(p["median_us"], c and c["median_us"])})
    return out


def _python_section(res):
    """The figures a PyTorch user weighing collectived against Gloo asks
    for: Python trainers on both sides. Empty if none were measured."""
    if not any(r["system"] == PYTHON_TRAINERS for r in res["rows"]):
        return []
    L = ["## Python trainers", "",
         "The targets and the tables above are for trainers written with the Go client (`collectived bench`). "
         "Here the trainers use the Python client (`collectived bench --trainer-cmd \"PY bench/py_trainer.py\"`, "
         "the same measurement in Python, NumPy arrays; buffers above the inline limit allocated with "
         "`Client.zeros`, zero copy), against Gloo, which is Python too. Its small calls take the lane "
         "(docs/PROTOCOL.md, LANE); Python's own steps around each call are most of what separates it from Go "
         "trainers ([TUNING.md section 29](TUNING.md#29-the-python-clients-lane)). Latency ratio below 1 and busbw "
         "ratio above 1 mean collectived's Python trainers are faster.", ""]
    for w in res["worlds"]:
        t = _python_table(res, w, md=True)
        if t:
            L += [f"### {world_title(w)}", "", t, ""]
    return L


def _python_table(res, w, md):
    rows = python_rows(res, w)
    if not rows:
        return ""
    cols = ["size", "Python median µs", "÷ Gloo (latency)", "÷ Go trainers (latency)", "busbw GB/s",
            "÷ Gloo (busbw)"]
    lines = [[size_name(r["size"]), _fmt(r["median_us"], ".1f"), _fmt(r["lat_gloo"]), _fmt(r["lat_go"]),
              _fmt(r["busbw"], ".3g"), _fmt(r["bus_gloo"])] for r in rows]
    return _table(cols, lines, md)


def python_text(res) -> str:
    """The Python trainers' figures for the terminal; empty if none."""
    parts = []
    for w in res["worlds"]:
        t = _python_table(res, w, md=False)
        if t:
            parts += ["", f"Python trainers, {world_title(w)}", t]
    return "\n".join(parts)


def in_flight_name(system, k):
    """The rows of `system` measured with k calls in flight together."""
    return f"{system} x{k}"


def in_flight_rows(res):
    """Per size of the in-flight measurement (world 2): the time of the k
    calls together for collectived's Go and Python trainers, for Gloo and
    for OpenMPI over TCP; collectived's ratios to each peer, and to k calls
    of its own one at a time (k times its median in the main tables, when
    that size is there)."""
    f = res.get("in_flight")
    if not f:
        return []
    k, out = f["k"], []
    for size in f["sizes"]:
        g, m = row(res, in_flight_name("gloo", k), 2, size), row(res, in_flight_name("mpi-tcp", k), 2, size)
        r = {"size": size, "gloo": g and g["median_us"], "mpi-tcp": m and m["median_us"]}
        for s in ("collectived", PYTHON_TRAINERS):
            x, one = row(res, in_flight_name(s, k), 2, size), row(res, s, 2, size)
            r[s] = {"us": x and x["median_us"], "gloo": _ratio(x and x["median_us"], r["gloo"]),
                    "mpi-tcp": _ratio(x and x["median_us"], r["mpi-tcp"]),
                    "one": _ratio(x and x["median_us"], one and one["median_us"] * k)}
        if any(r[s]["us"] for s in ("collectived", PYTHON_TRAINERS)) or r["gloo"] or r["mpi-tcp"]:
            out.append(r)
    return out


def _in_flight_table(res, md):
    rows = in_flight_rows(res)
    if not rows:
        return ""
    k = res["in_flight"]["k"]
    cols = ["size"] + sum(([f"{who}, {k} calls µs", "÷ Gloo", "÷ OpenMPI TCP", f"÷ {k} one at a time"]
                           for who in ("Go trainers", "Python trainers")), []) + \
        [f"Gloo, {k} calls µs", f"OpenMPI TCP, {k} calls µs"]
    lines = [[size_name(r["size"])]
             + sum(([_fmt(r[s]["us"], ".1f"), _fmt(r[s]["gloo"]), _fmt(r[s]["mpi-tcp"]), _fmt(r[s]["one"])]
                    for s in ("collectived", PYTHON_TRAINERS)), [])
             + [_fmt(r["gloo"], ".1f"), _fmt(r["mpi-tcp"], ".1f")]
             for r in rows]
    return _table(cols, lines, md)


def _in_flight_section(res):
    """Calls in flight together: what a trainer overlapping its gradient
    buckets (torch DDP) sees. Empty if not measured."""
    t = _in_flight_table(res, md=True)
    if not t:
        return []
    f = res["in_flight"]
    return ["## Calls in flight together", "",
            f"World 2. Each timed iteration starts {f['k']} allreduces at once, each on a buffer of its own, and "
            f"waits for all of them (`collectived bench --in-flight {f['k']}`; Gloo `all_reduce(async_op=True)` "
            "and `wait()`; OpenMPI `MPI_Iallreduce` and `MPI_Waitall`, `bench/mpi_allreduce.c` with its IN_FLIGHT "
            "argument), as a trainer overlapping its gradient buckets with its backward pass makes them; the "
            f"{f['k']} calls are timed as one ({f['iters']} timed iterations after {f['warmup']} untimed, "
            "median over rounds). \"÷ one at a time\" compares with "
            f"{f['k']} times the same system's median in the tables above: below 1, calls in flight together "
            "finish sooner than one after another (the tables above reuse one buffer, warm in the caches, and "
            f"the {f['k']} calls use {f['k']}: at 1 MiB that alone is about half the difference; "
            "[TUNING.md section 30](TUNING.md#30-calls-in-flight-together-"
            "bench---in-flight-and-what-did-not-lower-the-4-byte-call)).", "", t, ""]


def in_flight_text(res) -> str:
    """The in-flight figures for the terminal; empty if none."""
    t = _in_flight_table(res, md=False)
    return f"\nCalls in flight together ({res['in_flight']['k']}), world 2\n{t}" if t else ""


def _abs_tables(res, w):
    systems = ["collectived"] + [p for p in [PYTHON_TRAINERS] + PEERS + [RING_ONLY]
                                 if any(r["system"] == p and r["world"] == w for r in res["rows"])]
    out = []
    for title, key, spec in (("busbw, GB/s (higher is better)", "busbw_GBps", ".3g"),
                             ("median time per allreduce, µs (lower is better)", "median_us", ".1f"),
                             ("p99 time per allreduce, µs", "p99_us", ".1f")):
        cols = ["size"] + [LABEL[s] for s in systems]
        lines = []
        for size in res["sizes"]:
            cells = [size_name(size)]
            for s in systems:
                r = row(res, s, w, size)
                cells.append(_spread(r, key, spec))
            lines.append(cells)
        out += [f"**{title}**", "", _table(cols, lines, md=True), ""]
    return "\n".join(out)


def _tcp_streams(res) -> str:
    n = (res.get("tcp_bidir") or {}).get("streams", 1)
    return "one TCP stream" if n == 1 else f"{n} TCP streams"


def _cfg(res, who) -> str:
    rc = res["meta"].get("ring_config") or {}
    return srcconfig.describe(rc.get(f"{who}_streams"), rc.get(f"{who}_segment_bytes"))


SIDECAR_SIDES = (
    "Both sides run the same float32 sum allreduce on 2 nodes over the same loopback TCP links, with the same "
    "ring settings (the daemon's defaults: {cfg}), one process per node, in the same rounds, on the same sizes "
    "and iterations. **ring-only** (`collectived bench --ring-only`) is each node's ring engine called directly "
    "in its own process: no daemon, no trainer, no Unix socket, no shared memory. **collectived** "
    "(`collectived bench`) adds everything the sidecar puts around that engine: a trainer process per node, its "
    "Unix socket calls to the daemon, the buffer in a memfd shared with the daemon, the daemon's engine loop and "
    "its local fold of the trainers' buffers. The overhead is collectived's median ÷ ring-only's median − 1, "
    "each the median of the rounds' own medians (the ranges in brackets are the lowest and highest round); "
    "a negative overhead means the daemon measured faster than its baseline in this run (noise).")


def sidecar_rows(res) -> list[dict]:
    """World 2, every size both collectived and ring-only measured: the two
    rows and the overhead in percent."""
    out = []
    for size in res["sizes"]:
        ro, c = row(res, RING_ONLY, 2, size), row(res, "collectived", 2, size)
        if ro and c:
            out.append({"size": size, "ring_only": ro, "collectived": c, "overhead": rounds_overhead(res, size)})
    return out


def _sidecar(res) -> list[str]:
    """World 2: the daemon path against ring-only, per size."""
    rows = sidecar_rows(res)
    if not rows:
        return ["## Sidecar cost (world 2)", "", "not measured in this run (it needs collectived and ring-only "
                "in world 2)", ""]
    cols = ["size", "ring-only, median µs", "collectived, median µs", "overhead"]
    lines = [[size_name(r["size"]), _spread(r["ring_only"], "median_us", ".1f"),
              _spread(r["collectived"], "median_us", ".1f"), _fmt(r["overhead"], "+.1f") + "%"] for r in rows]
    return ["## Sidecar cost (world 2)", "", SIDECAR_SIDES.format(cfg=_cfg(res, "daemon")), "",
            _table(cols, lines, md=True), ""] + _sidecar_pairs(res)


def _sidecar_pairs(res) -> list[str]:
    """The pairs the target's figure comes from, when the run has extra
    ones."""
    sc = res.get("sidecar")
    if not sc or (len(sc["pairs"]) < 2 and not any(p["extra"] for p in sc["pairs"])):
        return []
    pairs, over = sc["pairs"], paired_overheads(res)

    def kind(p):
        if p.get("interleaved"):
            return "interleaved, one run"
        return "extra, " + LABEL[p["first"]] + " first" if p["extra"] else "the round's own"
    lines = [[str(p["round"]), kind(p), f"{p['ring_only_us']:.1f}", f"{p['collectived_us']:.1f}", f"{o:+.1f}%"]
             for p, o in zip(pairs, over)]
    cols = ["round", "pair", "ring-only, median µs", "collectived, median µs", "overhead"]
    figure = sidecar_overhead(res, sc["bytes"])
    use = target_pairs(pairs)
    if all(p.get("interleaved") for p in use):  # a run with interleaved pairs only
        return [f"At {size_name(sc['bytes'])} this run has only interleaved runs; the target's figure comes from "
                f"them: **{figure:+.1f}%**.{_interval_text(res)}", "", _table(cols, lines, md=True), ""]
    over_use = [own_overhead(p) for p in use]
    extra = sum(p["extra"] for p in use)
    which = (f"each round's own and {extra} extra pairs run after the rounds' other measurements, alternating which "
             "side goes first" if extra else "each round's own (the two side by side in the round)")
    text = (f"At {size_name(sc['bytes'])} the target's figure comes from {len(use)} back-to-back pairs: "
            f"{which}. The overhead is the median of the pairs' own overheads (each pair's collectived "
            f"median ÷ its ring-only median − 1) = **{figure:+.1f}%**; they range from {min(over_use):+.1f}% to "
            f"{max(over_use):+.1f}%.{_interval_text(res)} A pair's two runs share the machine's slow or fast "
            "phase, which its own ratio cancels; the median of collectived's medians over the pairs ÷ the median "
            f"of ring-only's − 1, which does not (the rule until TUNING.md section 23), gives "
            f"{medians_overhead(use):+.1f}%. The table above gives the rounds alone.")
    inter = [p for p in pairs if p.get("interleaved")]
    if inter:
        own = [own_overhead(p) for p in inter]
        text += (f" Beside them, {len(inter)} interleaved runs (`collectived bench --sidecar`: the daemons' world and "
                 "the ring engines' world up together, taking turns; in each turn one world makes an untimed call "
                 f"and then {res.get('sidecar_block', 1)} timed one(s), so both see the machine as it is from one "
                 f"moment to the next) give {paired_median(inter):+.1f}% by the target's rule (their own overheads "
                 f"{min(own):+.1f}% to {max(own):+.1f}%). They do not count: taking turns seems to slow the ring "
                 "engines alone by a few percent more than the daemon (TUNING.md section 21), so they may flatter "
                 "the daemon.")
    return [text, "", _table(cols, lines, md=True), ""]


def _interval_text(res) -> str:
    iv = sidecar_interval(res)
    if iv is None:
        return ""
    return (f" Resampling the pairs (a bootstrap of 2000 draws, fixed seed) moves the figure between "
            f"{iv[0]:+.1f}% and {iv[1]:+.1f}% (the central 95%): a verdict near the 5% line is that noise's.")


def _commands(res) -> list[str]:
    """Round 1's commands in full, then a line for the repeated rounds,
    then what ran after them."""
    cmds, marks = res.get("commands") or [], res.get("command_marks")
    if not marks or res.get("rounds", 1) < 2:
        return cmds
    i, j = marks["round1_end"], marks["rounds_end"]
    which = "round 2" if res["rounds"] == 2 else f"rounds 2 to {res['rounds']}"
    return cmds[:i] + [f"# {which}: the same measurements again, each round in rotated order, "
                       "on other free ports"] + cmds[j:]


def _load_range(res) -> str:
    loads = [r[k] for rnd in res.get("per_round") or [] for r in rnd["rows"] for k in ("load_before", "load_after")
             if r.get(k) is not None]
    return f", between {min(loads):.2f} and {max(loads):.2f} around the measurements" if loads else ""


def _dirty(m) -> str:
    d = m.get("dirty_paths") or []
    if not d:
        return " (work tree clean)"
    shown = ", ".join(f"`{x[3:]}`" for x in d[:8]) + (f" and {len(d) - 8} more" if len(d) > 8 else "")
    return f", built from the work tree with uncommitted changes in {shown}"


# What each optimisation gained, in the order they were made: a summary of
# docs/TUNING.md, whose sections have the side-by-side runs (world 2 unless
# said; ranges over alternating runs on this 2-vCPU machine).
GAINS = [
    "## What each change gained", "",
    "A summary of [TUNING.md](TUNING.md), which has every side-by-side measurement "
    "(world 2 unless said; ranges over alternating runs, so read them as ranges):", "",
    "| change (TUNING.md section) | before | after |",
    "|---|---:|---:|",
    "| 1. no allocation per call (pooled client handles, status rendered lazily) | 5 allocs/call | 0 (daemon: 0.02-0.04 per collective) |",
    "| 3. poll quiet sockets 200 µs before sleeping, yielding CPU and P | 4 B 131-154 µs | 40-77 µs |",
    "| 4. 512 KiB segments x 2 streams per link | 64 MiB 1.55-1.58 GB/s | 2.10-2.91 GB/s |",
    "| 5. stripe only ops of 4 MiB and more (2 MiB since 19) | 64 KiB 358-368 µs (striped) | 109-158 µs |",
    "| 6. the Go client polls for its reply in `Wait` | 4 B 44.7-84.6 µs | 25.3-41.2 µs |",
    "| 8. local buffers folded inside the ring (`AllReduceLocal`), 2 x 2 | 64 MiB 50.4-52.7 ms | 42.5-50.1 ms |",
    "| 9. no client polling around calls over 256 KiB | 1 MiB 1136-1546 µs | 611-842 µs |",
    "| 10. the waiting goroutine reads its own reply (no reader goroutine) | 4 B 39.8 µs (median of 6) | 32.8 µs |",
    "| 10. the hot lane: one goroutine per small call in the daemon | 4 B 32.0-34.9 µs | 14.9-16.3 µs |",
    "| 11. the daemon re-arms its session reader's poll after a call of 4 MiB+, without allocating | 64 MiB 25.1 ms (ring engines alone 23.9), 4 MiB 2.14 ms (1.25) | 24.0 ms, 1.50 ms |",
    "| 13. allgather segments received straight into the caller's buffer | 64 MiB, ring engines alone 29.0-39.7 ms, daemon 27.6-38.4 ms (three sittings); 16 MiB 5.75 / 5.71 ms | 26.4-37.0 ms, 28.2-35.6 ms; 5.10 / 5.14 ms |",
    "| 14. AVX2 reduce kernels (one 512 KiB float32 fold: 10.8 → 44.5 GB/s) | 64 MiB, ring engines alone 31.8 / 29.5 ms, daemon 33.0 / 33.9 ms (two sets); 16 MiB 7.23 / 5.93 ms; 4 MiB daemon 1.93 ms | 28.7 / 30.6 ms, 31.4 / 28.8 ms; 4.69 / 5.84 ms; 1.69 ms |",
    "| 15. nodes with several trainers re-arm the session's poll after every answer (world 2 x 2) | 4 B 292 µs, 4 KiB 378, 64 KiB 455, 1 MiB 897 | 65 µs, 208, 210, 689 |",
    "| 16. buffers up to 16 KiB circulate whole (`ring.small_bytes` 4096 → 16KiB, inclusive) | 4 KiB 40 µs, 16 KiB 56 µs; 2 x 2 16 KiB 102 µs | 23 µs, 24 µs; 76 µs |",
    "| 17. the op writes frames up to 64 KiB itself (writev), and buffers up to 64 KiB circulate whole | 32 KiB 64.9 µs, 64 KiB 115.0 µs | 33.6 µs, 57.4 µs |",
    "| 18. the Go client copies calls on plain memory over 2 KiB through shared memory (inline before, up to 64 KiB) | 16 KiB 26.7 µs, 64 KiB 53.8 µs; 2 x 2 64 KiB 122.4 µs | 22.5 µs, 42.2 µs; 71.6 µs |",
    "| 19. ops stripe over both streams from 2 MiB (4 MiB before) | 2 MiB 1099 µs, 3 MiB 2168 µs; 2 x 2 3 MiB 3042 µs | 1004 µs, 1661 µs; 2199 µs |",
    "| 20. (AMD EPYC machine) the lane: small calls through shared memory | 4 B 60.1 µs | 53.4 µs |",
    "| 20. pollers with a lane read their socket every 20 µs; session pollers yield their P every 20 µs | 4 B 56.2 µs | 49.3 µs |",
    "| 20. one P while the link is lent, instead of a companion goroutine | 4 B 48.1 µs | 43.1 µs |",
    "| 21. (how it is measured, not a speed-up) the sidecar's two sides take turns in one run "
    "(`bench --sidecar`), a call each | sidecar overhead at 64 MiB from separate runs: -0.2%, "
    "+6.3%, +9.1%, -2.2%, +3.7% (five full runs) | from interleaved runs: -0.4%, -4.7%, -8.8% (the last three); "
    "shown beside the target, which keeps to separate runs: taking turns seems to slow the ring engines alone "
    "more |",
    "| 22. (how it is measured) each start of a world first makes 5000 one-element calls, on every system alike "
    "| 4 B at compare's settings 57.8 µs (timed inside the first ~0.2 s after the start) | 31.4 µs |",
    "| 23. (how it is measured) the sidecar target is the median of the back-to-back pairs' own overheads, "
    "not the ratio of the two sides' medians | six full runs, ratio of medians: -0.2%, +6.3%, +9.1%, -2.2%, "
    "+3.7%, -0.7% | the same runs, paired: +1.7%, +2.6%, +4.7%, +0.6%, +2.0%, -0.6% |",
    "| 24. a ring of two's short ops travel both ways on one connection, so no bare TCP ACKs "
    "| 4 B, processes pinned node-wise 41.3 µs (5 runs), not pinned 32.3 µs (16 runs); 2 x 2 4 B 92.2 µs "
    "| 33.6 µs, 30.5 µs; 78.7 µs |",
    "| 25. a lent op keeps the other lent link (rank 0 of a ring of two lends the duplex stream and stream 0) "
    "| a 16 KiB + 4 B pair of calls 144.6 µs (6 runs); `bench --sizes 4 --between 16KiB` 72.7 µs "
    "| 73.2 µs (67.2 µs before section 24); 29.9 µs |",
    "| 27. pollers wake the readers parked beside them in the netpoller (`internal/parked`); "
    "a borrower wakes the reader of the link it asks for "
    "| `bench --between`, 4 runs: 4 B after 256 KiB 249.0 µs, 256 KiB after 4 B 360.8 µs, 4 B after 1 MiB 248.6 µs "
    "| 100.8 µs, 285.7 µs, 153.9 µs (4 B alone 30.4 → 30.8 µs) |",
    "| 28. a small call right after a larger one runs on the engine, not the hot lane "
    "| `bench --between`, 4 runs: 4 B after 256 KiB 114.1 µs, 4 B after 1 MiB 133.7 µs "
    "| 81.2 µs, 106.1 µs (4 B alone 37.0 → 33.5 µs) |",
    "| 29. the Python client opens the lane (a C extension for its atomics) and its caller watches for the "
    "answer; fewer, cheaper steps per call (Python trainers: `bench --trainer-cmd`) "
    "| Python trainers, 4 runs: 4 B 254.5 µs; 2 x 2 4 B 558-716 µs (Gloo 191-242 µs at 4 B that hour) "
    "| 89.2 µs (paired 0.38); 299-325 µs; then the caller's wait in one step in C: 107.7 → 77.2 µs (paired 0.76) |",
    "| 30. the Python client holds a small call made while another is on the lane, and whoever takes that "
    "one's answer sends it on the lane (calls in flight together: `bench --in-flight 4`) "
    "| Python trainers, four calls in flight, 6 runs: 4 B 549.2 µs; 64 KiB 946.9 µs "
    "| 351.5 µs (paired 0.63); 609.2 µs (paired 0.60); one call at a time unchanged (1.01, 1.04) |",
    "",
]


SPLICED = re.compile(r"<!-- ([a-z0-9-]+): begin \(.*?\) -->\n.*?<!-- \1: end -->\n?", re.S)


def keep_spliced(old: str, new: str) -> str:
    """new, with the sections other programs splice into the report
    between their markers (`<!-- NAME: begin (PROGRAM) -->` to
    `<!-- NAME: end -->`, such as bench/ddp_step.py's) carried over from
    old, at the end: this report rewrites the file, they are not its."""
    blocks = [m.group(0) for m in SPLICED.finditer(old) if m.group(0) not in new]
    if not blocks:
        return new
    return new.rstrip("\n") + "\n\n" + "\n".join(b if b.endswith("\n") else b + "\n" for b in blocks)


def markdown(res, plot_rel) -> str:
    m, it = res["meta"], res["iters"]
    ts = targets(res)
    L = []
    L += ["# Benchmarks: collectived vs OpenMPI and Gloo", "",
          "Generated by `bench/compare` (do not edit by hand; run it again). "
          "Every number below comes from the one run described here; the raw figures are in "
          f"[`{plot_rel}/results.json`]({plot_rel}/results.json).", ""]
    L += ["## Targets (issue 5)", "",
          "| target | measured | wanted | verdict |", "|---|---:|---:|---|"]
    for t in ts:
        L.append(f"| {t['target']} | {_tval(t)} | {_tlimit(t)} | **{t['verdict']}**{' (aim)' if t['aim'] else ''} |")
    L += ["", f"In this run: {_summary(ts)}.", "",
          f"\"Bidirectional TCP loopback\" is {_tcp_streams(res)} each way at the same time on 127.0.0.1 (the "
          "daemon's default streams per link), which is what a 2-node ring's links carry during an allreduce, "
          "measured with iperf3 `--bidir`, `bench/tcp_bidir.py` and `bench/tcp_bidir.c` "
          "(the highest is used; see below). Its *per-direction* rate is the reference, "
          "because in a 2-rank ring allreduce each rank sends the whole buffer once (half in reduce-scatter, half in "
          "all-gather), so busbw equals the bytes each direction carries per second. "
          "The sidecar overhead compares `collectived bench`'s median with `collectived bench --ring-only`'s "
          "(each node's ring engine alone in its own process, no daemon or trainer), both one process per node on "
          f"the daemon's default ring config ({_cfg(res, 'daemon')}); at 64 MiB, interleaved runs "
          "(`collectived bench --sidecar`: both worlds up together, taking turns call by call) are shown beside the "
          "target and do not count; "
          "see \"Sidecar cost\" below. "
          "Verdicts on a loaded 2-core machine move between runs: read them with the ranges in the tables below.", ""]
    L += _targets25_md(res)
    tcp_t = [t for t in ts if "bidirectional TCP" in t["target"]]
    if tcp_t and tcp_t[0]["value"] is not None and tcp_t[0]["value"] > 1:
        L += [f"collectived measured {tcp_t[0]['value']:.2f}x the loopback probe in this run: the probe is a practical "
              "reference (plain send/recv threads, measured in the same run), not a strict ceiling, so this target "
              "shows that the daemon reaches what simple TCP code reaches here, not how far below a hard limit it "
              "is.", ""]

    L += ["## Machine and conditions", "",
          f"- date: {m['date_utc']}, run took {m.get('duration_s', '?')} s",
          f"- CPU: {m['cpu']}, `nproc` = {m['nproc']}; memory {m['mem_bytes'] / (1 << 30):.1f} GiB",
          f"- kernel {m['kernel']}, {m['os']}",
          f"- {m['go']}; OpenMPI: {m['openmpi']}; torch {m['torch']} (Debian python3-torch, Gloo backend); "
          f"{m['iperf3']}",
          f"- collectived at commit {m['commit']}" + (" (built from the committed tree, `--from-head`)" if m.get("from_head")
                                                      else _dirty(m)),
          f"- load average (1 min) at start: {m['loadavg_start'].split()[0]}, at end: "
          f"{m.get('loadavg_end', '? ').split()[0]}{_load_range(res)}",
          "",
          f"**This machine has {m['nproc']} cores and other work was running on it at the same time** (other "
          "developers' builds and tests). Every system ran in the same run, one after the other, with the same sizes "
          "and iteration counts, so they saw comparable conditions, but absolute figures are noisy and lower than on an "
          "idle machine, and a world of 4 ranks on 2 cores is oversubscribed for every system alike. The 1-minute load "
          "average before and after each measurement is in results.json (`load_before`, `load_after`).", ""]

    L += ["## Method", "",
          "- Operation: allreduce, float32, sum, in place, on every rank at once; all traffic on loopback (127.0.0.1 or "
          "Unix sockets and shared memory).",
          "- Worlds: **world 2** = collectived with 2 daemons (ring ranks) x 1 trainer each, against 2 ranks of each "
          "peer; **world 4** = collectived with 2 daemons x 2 trainers each (local reduction on the node, then the "
          "2-node ring), against 4 ranks of each peer.",
          f"- Rounds: the whole set of measurements ran {res.get('rounds', 1)} time(s), the order of the systems "
          f"rotated each round{' (ring-only always right next to collectived)' if res.get('sidecar_pair_adjacent') else ''}; each figure is the median of the rounds' own figures (median of the per-round medians, "
          "of the per-round p99s), and the tables show the lowest and highest round in brackets." + (
              f" After each round, {res['sidecar_pairs_per_round']} extra back-to-back pair(s) of collectived and "
              "ring-only in world 2 at 64 MiB, for the sidecar target (see \"Sidecar cost\")."
              if res.get("sidecar_pairs_per_round") else ""),
          (f"- Each start of a system's processes (one per size group, world and round) first makes "
           f"{it['prewarm']} untimed allreduces of one float, the same for every system: collectived's processes run "
           "up to twice as slow for the first ~0.2 s after they start, MPI's and Gloo's do not "
           "([TUNING.md section 22](TUNING.md#22-the-first-fraction-of-a-second-after-a-start-and-the-prewarm)).\n"
           if it.get("prewarm") else "") +
          f"- Per size and system: one checked call, then {it.get('warmup_small', it['warmup'])} untimed warm-up calls "
          f"and {it['small']} timed calls for sizes up to {size_name(it['small_max_bytes'])}, "
          f"{it['warmup']} and {it['large']} above, "
          "back to back without barriers; the result is checked exactly after the last call. Times are rank 0's "
          "per-call wall times; median and p99 are over those calls (p99 = the largest value when there are fewer than "
          "100 calls).",
          "- algbw = bytes / median time; busbw = algbw x 2(W-1)/W (the NCCL convention, W = world size).",
          "- collectived: `collectived bench` (daemons and trainers as separate processes, default config: "
          f"{_cfg(res, 'daemon')}; buffers up to the daemon's inline limit (64 KiB) in the trainer's own memory, which "
          "the Go client sends inline up to 2 KiB and copies through its scratch segment above; larger buffers "
          "allocated in memfd shared memory, zero copy).",
          "- OpenMPI TCP: `--mca pml ob1 --mca btl tcp,self` on `lo` (every rank pair over TCP, as between machines). "
          "OpenMPI shm: `--mca pml ob1 --mca btl self,vader` (OpenMPI's shared-memory transport, with its default CMA "
          "single copy for large messages; named explicitly because this build also has UCX, which OpenMPI might pick "
          "on its own). "
          "Both run `bench/mpi_allreduce.c` (MPI_Allreduce with MPI_IN_PLACE, OpenMPI's default algorithm selection).",
          "- Gloo: `torch.distributed` with the gloo backend, CPU tensors, `dist.all_reduce`, tcp:// store on "
          "127.0.0.1, `GLOO_SOCKET_IFNAME=lo` (`bench/gloo_allreduce.py`).",
          "- collectived, Python trainers: `collectived bench --trainer-cmd \"PY bench/py_trainer.py\"`, the same "
          "daemons with trainers written with the Python client (installed with its lane extension into "
          "`bench/.build/pyvenv`, on Debian's python3 as Gloo); see \"Python trainers\".",
          "- ring-only (world 2 only, the sidecar's baseline): `collectived bench --ring-only`: one process per node "
          "running its ring engine directly, on the ring settings a daemon with the same (default) config uses, "
          "over the same loopback TCP links; no daemon, trainers, Unix socket or shared memory. Timed and reported "
          "exactly like `collectived bench` (rank 0's per-call times, median and p99).",
          ""]

    L += ["## collectived ÷ each peer", "",
          "busbw ratio above 1 and latency ratio below 1 mean collectived is faster. \"ring-only\" (world 2) is the "
          "ring engine without the sidecar (see \"Sidecar cost\"), \"TCP bidir\" the per-direction loopback limit.",
          ""]
    for w in res["worlds"]:
        L += [f"### {world_title(w)}", "", _ratio_table(res, w, md=True), ""]

    L += _python_section(res)
    L += _in_flight_section(res)
    L += _collectives_md(res, plot_rel)

    L += ["## Figures", "", f"![busbw against size]({plot_rel}/busbw.png)", "",
          f"![latency against size]({plot_rel}/latency.png)", ""]
    for w in res["worlds"]:
        L += [f"### {world_title(w)}", "", _abs_tables(res, w)]

    L += _sidecar(res)
    tb = res.get("tcp_bidir")
    L += ["## Loopback TCP limit", ""]
    if tb:
        L += [f"Both directions at once on 127.0.0.1 for {tb['seconds']} s, {_tcp_streams(res)} each way, in each of "
              f"{tb.get('rounds', 1)} round(s) (median of rounds; range of the per-direction rate in brackets):", "",
              "| tool | one way GB/s | other way GB/s | per direction GB/s |", "|---|---:|---:|---:|"]
        for k, what in (("iperf3", "iperf3 `--bidir` (one thread per process sends and receives)"),
                        ("threads", "`bench/tcp_bidir.py` (two processes, a sending and a receiving thread per "
                                    "connection, 64 MiB `sendall`)"),
                        ("c", "`bench/tcp_bidir.c` (the same in C with pthreads, 64 MiB `send`/`recv`)")):
            if k in tb:
                t = tb[k]
                rr = t.get("rounds") or []
                rng = f" ({min(rr):.2f}–{max(rr):.2f})" if len(rr) > 1 else ""
                L.append(f"| {what} | {t['forward_GBps']:.2f} | {t['reverse_GBps']:.2f} | "
                         f"{t['per_direction_GBps']:.2f}{rng} |")
        L += ["", f"The reference for the targets is the highest per-direction figure: **{tb['per_direction_GBps']:.2f} "
              f"GB/s** ({tb['reference']}).", ""]
        L += [f"- failed once: {e}" for e in tb.get("errors") or []]
        if tb.get("errors"):
            L.append("")
    else:
        L += ["not measured in this run", ""]

    rs = res.get("rss")
    L += ["## Daemon memory", ""]
    if rs:
        L += ["Two `collectived run` daemons (ring of 2 on loopback, local_size 1) started by bench/compare; RSS from "
              "`/proc/PID/status` (and the daemon's own `status --json` `process.rss_bytes`), first with the ring up "
              f"and no trainer yet, then {rs['settle_s']:g} s after one trainer per node ran 4 B, 1 MiB and 64 MiB "
              "allreduces through them (64 MiB via shared memory) and detached.", "",
              "| when | node | VmRSS MiB | anon MiB | file MiB | shmem MiB | status rss MiB | goroutines | memfds |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        mib = lambda v: "-" if v is None else f"{v / (1 << 20):.1f}"
        for when in ("fresh", "after_work"):
            for s in rs[when]:
                L.append(f"| {when.replace('_', ' ')} | {s['node']} | {mib(s['vmrss_bytes'])} | "
                         f"{mib(s.get('rss_anon_bytes'))} | {mib(s.get('rss_file_bytes'))} | "
                         f"{mib(s.get('rss_shmem_bytes'))} | {mib(s.get('status_rss_bytes'))} | "
                         f"{s.get('goroutines', '-')} | {s.get('memfds', '-')} |")
        L.append("")
        if rs.get("serving"):
            L += ["While the trainers ran, each daemon's `/proc/PID/status` was read every few milliseconds. The "
                  "trainers' shared-memory segments are mapped into the daemon and count in its RSS (RssShmem); "
                  "they are the trainers' buffers, not the daemon's. What the daemon adds is its RSS beyond them "
                  "(VmRSS − RssShmem): its growth over idle is set against the ring's pipeline buffers (`status "
                  "--json`: `ring.buffer_bytes`, the receive and write buffers the ring allocates when it forms).",
                  "",
                  "| node | samples | largest shmem MiB | RSS beyond shmem: idle MiB | while serving, peak MiB | "
                  "growth MiB | pipeline buffers MiB | growth ÷ buffers |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for f, sv in zip(rs["fresh"], rs["serving"]):
                L.append(f"| {sv['node']} | {sv['samples']} | {mib(sv['max_shmem_bytes'])} | "
                         f"{mib(f['private_bytes'])} | {mib(sv['max_private_bytes'])} | {mib(sv['growth_bytes'])} | "
                         f"{mib(f['buffer_bytes'])} | {sv['growth_bytes'] / f['buffer_bytes']:.2f} |")
            L.append("")
    else:
        L += ["not measured in this run", ""]

    if res.get("errors"):
        L += ["## Failures in this run", "",
              "Each failed measurement is left out; the figures it would have given come from the other rounds "
              "(the tables' ranges span only the rounds that finished). What each one printed, shortened:", ""]
        for e in res["errors"]:
            e = e.replace(REPO_PREFIX, "")
            L += ["```", e if len(e) <= 2500 else e[:1500] + "\n[...]\n" + e[-1000:], "```", ""]

    L += GAINS
    L += ["## Reproduce", "",
          "On Debian 12 as root; it installs the Debian packages it lacks (openmpi-bin, libopenmpi-dev, "
          "python3-torch, python3-matplotlib, iperf3), builds `collectived`, `bench/mpi_allreduce.c` and "
          "`bench/tcp_bidir.c` into "
          "`bench/.build/`, and runs everything with Debian's `/usr/bin/python3`:", "", "```sh",
          "bench/compare               # full run: 5 rounds, 15-20 minutes on 2 cores (by load), and 3-7 more for the "
          "other collectives and the bfloat16 runs; writes this file",
          "bench/compare --from-head   # the same, measuring the committed HEAD rather than the work tree",
          "bench/compare --quick       # sizes 4 B, 64 KiB, 64 MiB, fewer calls, 1 round: about 1 minute",
          "bench/compare --sizes 4,1MiB,64MiB --worlds 2 --rounds 3 --no-doc   # print only",
          "bench/compare --systems collectived,ring-only --worlds 2 --no-extras --no-doc   # the sidecar cost alone",
          "bench/compare --only collectives   # allgather, reduce-scatter and the bfloat16 pairs alone (prints; "
          "--doc FILE to write a report of them)",
          "# one collective by hand, each system (sizes: allgather each rank's block, reducescatter the input):",
          "bench/.build/collectived bench --op allgather --sizes 64KiB,1MiB,16MiB,64MiB --iters 20 --warmup 3",
          "mpirun --allow-run-as-root -np 2 --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo "
          "bench/.build/mpi_collectives allgather 65536,1048576,16777216,67108864 20 3 5000",
          "bench/.build/collectived bench --dtype bf16 --sizes 32MiB --iters 30   # vs --dtype float32 --sizes 64MiB",
          "# the sidecar's baseline by hand (what the ring-only rows run):",
          "bench/.build/collectived bench --ring-only --nodes 2 --local 1 --sizes 4,65536,1048576,67108864 "
          "--iters 30 --warmup 5 --prewarm 5000 --json",
          "# both sides in one run, taking turns a call at a time (the interleaved runs shown beside the target):",
          "bench/.build/collectived bench --sidecar --sizes 64MiB --iters 30 --warmup 5",
          "```", "",
          f"This run: `bench/compare {' '.join(res.get('argv') or [])}`. The commands it executed, in order:", "",
          "```sh"] + _commands(res) + ["```", ""]
    return "\n".join(L)
