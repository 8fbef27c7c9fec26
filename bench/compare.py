"""bench/compare: collectived against OpenMPI (TCP and shared memory) and
torch.distributed Gloo, in one run, on the same sizes and worlds, plus the
sidecar's own cost (daemon vs the ring engine alone, one process per node:
`collectived bench --ring-only`, and both in one run taking turns:
`collectived bench --sidecar`), the loopback TCP limit and the daemons'
idle memory. Prints a ratio table and the targets'
verdicts; writes docs/BENCHMARKS.md and its plots.

Run it through bench/compare (the shell wrapper), which installs the
Debian packages, builds the binaries and runs this with /usr/bin/python3.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import report  # noqa: E402
import rss  # noqa: E402
import runners  # noqa: E402
import srcconfig  # noqa: E402

REPO = os.path.dirname(HERE)
DEFAULT_SIZES = "4,4KiB,64KiB,1MiB,16MiB,64MiB"
QUICK_SIZES = "4,64KiB,64MiB"
SMALL = 1 << 20  # sizes up to this get the "small" iteration count
# ring-only runs right next to collectived in every round, whatever the
# rotation (keep_pair), so the sidecar's two sides see the same machine.
SYSTEMS = ["collectived", "ring-only", "collectived-py", "mpi-tcp", "mpi-shm", "gloo"]
# collectived with trainers written with the Python client
# (`collectived bench --trainer-cmd "PY bench/py_trainer.py"`), the other
# side of a comparison with Gloo for a PyTorch user. The wrapper installs
# the client into bench/.build/pyvenv.
PYTHON_TRAINERS = "collectived-py"
# The sidecar's baseline: `collectived bench --ring-only`, one process per
# node running its ring engine directly with the daemon's default ring
# settings. It has the daemons' topology only in world 2 (2 nodes x 1).
RING_ONLY = "ring-only"
# The size of the sidecar target: extra collectived/ring-only pairs run at it
# (separate runs back to back, which count), and interleaved runs
# (`collectived bench --sidecar`, a call of each in turn), shown beside.
SIDECAR_SIZE = report.MIB64
SIDECAR_BLOCK = 1
WORLD2_ONLY = {RING_ONLY}
# Calls in flight together (`collectived bench --in-flight K`, Gloo's
# async_op=True, OpenMPI's MPI_Iallreduce), as a trainer overlapping its
# gradient buckets makes them: world 2, these systems, a few sizes, fewer
# iterations (each is K calls).
IN_FLIGHT_SYSTEMS = ["collectived", PYTHON_TRAINERS, "mpi-tcp", "gloo"]
IN_FLIGHT_SIZES = "4,64KiB,1MiB"
IN_FLIGHT_ITERS = (200, 50)  # timed, warmup; quick: a quarter
IN_FLIGHT_TAG = "@in-flight"
# The other collectives (issue 25): allgather and reduce-scatter (and on
# request reduce and broadcast), float32 sum, root 0, world 2 only,
# collectived (`bench --op`) against OpenMPI TCP (bench/mpi_collectives.c)
# and Gloo (bench/gloo_collectives.py), in every round after the
# allreduce measurements, in rotated order. Sizes are `collectived bench
# --op`'s: each rank's block for allgather (the result is 2 x size), the
# whole input for reduce-scatter. Fewer calls than allreduce's, to keep the
# addition to a full run to a few minutes.
COLL_OPS = "allgather,reducescatter,reduce,broadcast"
COLL_ALL_OPS = ("allgather", "reducescatter", "reduce", "broadcast")
COLL_SIZES = "64KiB,1MiB,16MiB,64MiB"
COLL_SYSTEMS = ("collectived", "mpi-tcp", "gloo")
# One start of each system's processes per collective and round, all
# sizes alike: a start of Gloo's (torch's import) or OpenMPI's costs more
# than the calls at the small sizes, which only shape the plots.
COLL_ITERS = (10, 3)  # (timed, warmup) at every size; quick (3, 1)
COLL_ROUNDS = 3  # at most --rounds; quick 1
COLL_WORLD = 2
# bfloat16 allreduce against float32's, the same element count (half the
# bytes), collectived alone: runs of `collectived bench --alternate-dtype`,
# which times a call of each in turn in the same world, so that both see
# the machine at the same moments (separate runs back to back, the first
# way tried, left whichever ran first of a pair 0.2-1.0x slower on a
# machine loaded 6-12); each run's own ratio, and their median over the
# runs, as the sidecar's pairs (TUNING.md section 23).
BF16_ELEMENTS = 16 << 20
BF16_PAIRS = 2
BF16_ITERS = (20, 3)  # timed, warmup; quick (5, 1)


def parse_sizes(s: str, flag: str = "--sizes") -> list[int]:
    out = []
    for f in s.split(","):
        f = f.strip()
        mult = 1
        for suf, m in (("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("K", 1 << 10), ("M", 1 << 20)):
            if f.endswith(suf):
                f, mult = f[: -len(suf)], m
                break
        try:
            v = int(f) * mult
        except ValueError:
            raise SystemExit(f"compare: {flag}: {f!r} is not a size (bytes, or a number with KiB/MiB)")
        if v < 1 or v > 1 << 30:
            raise SystemExit(f"compare: {flag}: {v} is out of range 1 B to 1 GiB")
        out.append(v)
    return out


def parse_worlds(s: str) -> list[int]:
    out = []
    for f in s.split(","):
        if f.strip() not in ("2", "4"):
            raise SystemExit(f"compare: --worlds: {f!r}: only 2 (2 nodes x 1) and 4 (2 nodes x 2) are defined")
        out.append(int(f))
    return out


def machine() -> dict:
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) * 1024

    def out(argv):
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=REPO).stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"unavailable ({e})"

    torch_v = out(["/usr/bin/python3", "-c", "import torch; print(torch.__version__)"])
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "nproc": os.cpu_count(), "cpu": cpu, "mem_bytes": mem, "kernel": platform.release(),
        "os": out(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]),
        "go": out(["go", "version"]),
        "openmpi": out(["sh", "-c", "mpirun --allow-run-as-root --version | head -1"]),
        "torch": torch_v, "iperf3": out(["sh", "-c", "iperf3 --version | head -1"]),
        "commit": out(["git", "rev-parse", "--short", "HEAD"]),
        "dirty_paths": out(["git", "status", "--porcelain", "--", ".", ":!bench", ":!docs"]).splitlines(),
        "loadavg_start": open("/proc/loadavg").read().strip(),
    }


def groups(sizes, iters_small, iters_large, warmup_small, warmup_large, prewarm):
    """Sizes split by iteration and warm-up counts: small buffers get more
    calls of both. A few hundred microseconds of small calls decide
    nothing on a shared 2-core machine. Each group is one start of a
    world's processes, and each start first makes `prewarm` one-element
    calls, on every system alike: collectived's processes run up to twice
    as slow for the first ~0.2 s after they start, whatever the size
    (TUNING.md section 22; 4 B world 2, 8 alternating runs after 1000
    warm-up calls: median 57.8 us without, 31.4 us after 5000), which a
    per-size count large enough would make every size pay."""
    small = [s for s in sizes if s <= SMALL]
    large = [s for s in sizes if s > SMALL]
    return [(g, n, w, prewarm) for g, n, w in ((small, iters_small, warmup_small), (large, iters_large, warmup_large))
            if g]


def measure_system(system, world, sizes_groups, bins, timeout, in_flight=1):
    """One system's rows in one world. in_flight above 1: calls started
    together per timed iteration; the rows then carry the system's
    in-flight name (report.in_flight_name)."""
    rows = []
    if in_flight > 1 and system not in IN_FLIGHT_SYSTEMS:
        raise ValueError(f"{system}: no in-flight measurement (only {', '.join(IN_FLIGHT_SYSTEMS)})")
    for sizes, iters, warmup, prewarm in sizes_groups:
        l0 = runners.loadavg()
        t0 = time.monotonic()
        if system == "collectived":
            got = runners.collectived(bins["collectived"], 2, world // 2, sizes, iters, warmup, timeout,
                                      prewarm=prewarm, in_flight=in_flight)
        elif system == PYTHON_TRAINERS:
            got = runners.collectived(bins["collectived"], 2, world // 2, sizes, iters, warmup, timeout,
                                      prewarm=prewarm, trainer_cmd=f"{bins['python']} {HERE}/py_trainer.py",
                                      in_flight=in_flight)
        elif system == RING_ONLY:
            if world != 2:
                raise ValueError(f"{system}: only world 2 (2 nodes x 1) is defined, not {world}")
            got = runners.collectived(bins["collectived"], 2, 1, sizes, iters, warmup, timeout, ring_only=True,
                                      prewarm=prewarm)
        elif system in ("mpi-tcp", "mpi-shm"):
            got = runners.mpi(bins["mpi"], system, world, sizes, iters, warmup, timeout, prewarm,
                              in_flight=in_flight)
        elif system == "gloo":
            got = runners.gloo("/usr/bin/python3", os.path.join(HERE, "gloo_allreduce.py"), world, sizes,
                               iters, warmup, timeout, prewarm, in_flight=in_flight)
        else:
            raise ValueError(system)
        took = time.monotonic() - t0
        name = report.in_flight_name(system, in_flight) if in_flight > 1 else system
        for r in got:
            r.update(system=name, world=world, load_before=l0, load_after=runners.loadavg(), group_s=round(took, 1))
        rows += got
    return rows


def measure_collective(system, op, sizes_groups, bins, timeout):
    """One system's rows of one collective other than allreduce, world 2.
    Raises runners.Unsupported for a call the system does not offer."""
    rows = []
    for sizes, iters, warmup, prewarm in sizes_groups:
        l0 = runners.loadavg()
        t0 = time.monotonic()
        if system == "collectived":
            got = runners.collectived_op(bins["collectived"], op, 2, COLL_WORLD // 2, sizes, iters, warmup, timeout,
                                         prewarm=prewarm)
        elif system == "mpi-tcp":
            got = runners.mpi_op(bins["mpi_collectives"], "mpi-tcp", op, COLL_WORLD, sizes, iters, warmup, timeout,
                                 prewarm)
        elif system == "gloo":
            got = runners.gloo_op("/usr/bin/python3", os.path.join(HERE, "gloo_collectives.py"), op, COLL_WORLD,
                                  sizes, iters, warmup, timeout, prewarm)
        else:
            raise ValueError(f"{system}: no {op} measurement (only {', '.join(COLL_SYSTEMS)})")
        took = time.monotonic() - t0
        for r in got:
            r.update(system=system, op=op, world=COLL_WORLD, load_before=l0, load_after=runners.loadavg(),
                     group_s=round(took, 1))
        rows += got
    return rows


def bf16_pair(step, name, order, bins, timeout, iters, warmup, prewarm):
    """One run of `collectived bench --dtype A --alternate-dtype B` at
    BF16_ELEMENTS elements, A and B float32 and bfloat16 in the order
    given: each timed iteration makes one allreduce of each, alternating
    which goes first, so both see the machine at the same moments. None if
    it failed."""
    first, second = order
    size = BF16_ELEMENTS * (4 if first == "float32" else 2)

    def run():
        return runners.collectived_op(bins["collectived"], "allreduce", 2, 1, [size], iters, warmup, timeout,
                                      prewarm=prewarm, dtype=first, alternate=second)
    rows = step(name, run)
    if not rows:
        return None
    load = runners.loadavg()
    pair = {"first": first}
    for r in rows:
        r.update(load=load)
        pair[r["dtype"]] = r
    return pair


def collective_items(ops, systems, rnd, unsupported):
    """One round's collective measurements, (system, op), rotated by round
    so that no system always runs first; those a system was found not to
    offer are left out."""
    items = [(s, op) for op in ops for s in systems if op not in unsupported.get(s, {})]
    if not items:
        return items
    k = rnd % len(items)
    return items[k:] + items[:k]


def bf16_order(rnd, j):
    """Which dtype of bf16 run j of round rnd is --dtype (its call goes
    first in the first timed iteration): alternating."""
    return ["float32", "bfloat16"] if (rnd + j) % 2 == 0 else ["bfloat16", "float32"]


def aggregate_collectives(c):
    """c["rows"]: one figure per (system, op, size), the median over rounds
    of each round's median (and p99), with every round's own; busbw from
    the median by the collective's factor. c["bf16"]: the pairs and their
    ratios."""
    by = {}
    for rnd in c["per_round"]:
        for r in rnd["rows"]:
            by.setdefault((r["system"], r["op"], r["bytes"]), []).append(r)
    c["rows"] = []
    for (system, op, size), rs in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
        med = statistics.median(r["median_us"] for r in rs)
        total = rs[0]["total_bytes"]
        alg = total / (med * 1e3)
        c["rows"].append({"system": system, "op": op, "world": COLL_WORLD, "bytes": size, "total_bytes": total,
                          "iters": rs[0]["iters"], "median_us": med,
                          "p99_us": statistics.median(r["p99_us"] for r in rs), "algbw_GBps": alg,
                          "busbw_GBps": alg * runners.bus_factor(op, COLL_WORLD), "path": rs[0].get("path"),
                          "rounds": [dict({k: r.get(k) for k in ("median_us", "p99_us", "load_before", "load_after")},
                                          busbw_GBps=total / (r["median_us"] * 1e3)
                                          * runners.bus_factor(op, COLL_WORLD)) for r in rs]})
    pairs = []
    for i, rnd in enumerate(c["per_round"]):
        for p in rnd.get("bf16_pairs") or []:
            f, b = p["float32"], p["bfloat16"]
            pairs.append({"round": i + 1, "first": p["first"], "float32_us": f["median_us"],
                          "bfloat16_us": b["median_us"], "ratio": b["median_us"] / f["median_us"],
                          "load": [f.get("load"), b.get("load")]})
    c.pop("bf16", None)
    if pairs:
        c["bf16"] = {"elements": BF16_ELEMENTS, "pairs": pairs,
                     "ratio": statistics.median(p["ratio"] for p in pairs),
                     "ratio_of_medians": statistics.median(p["bfloat16_us"] for p in pairs)
                     / statistics.median(p["float32_us"] for p in pairs)}


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench/compare", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES}, fewer iterations (a few minutes)")
    ap.add_argument("--sizes", help=f"comma-separated sizes (default {DEFAULT_SIZES})")
    ap.add_argument("--worlds", default="2,4", help="2 (2 nodes x 1 trainer vs 2 ranks), 4 (2 x 2 vs 4 ranks)")
    ap.add_argument("--iters", type=int, help="timed calls per size for every size (default 1000 up to 1 MiB, 30 above; quick 50/10)")
    ap.add_argument("--warmup", type=int, help="untimed calls per size for every size (default 1000 up to 1 MiB, 5 above; quick 50/2)")
    ap.add_argument("--prewarm", type=int, help="untimed one-element calls before the first size of each run, on every "
                    "system (default 5000, quick too): collectived's first ~0.2 s after its processes start runs slower")
    ap.add_argument("--rounds", type=int, help="times every measurement is repeated, order rotated (default 5; quick 1)")
    ap.add_argument("--sidecar-pairs", type=int,
                    help="extra back-to-back collectived and ring-only runs at 64 MiB in world 2 after each round, "
                         "for the sidecar overhead (default 4; quick 0)")
    ap.add_argument("--sidecar-interleaved", type=int,
                    help="interleaved runs of both at 64 MiB after each round (`collectived bench --sidecar`: both "
                         "worlds up, a call of each in turn), shown beside the target (default 1; quick 0)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="subset of " + ",".join(SYSTEMS))
    ap.add_argument("--in-flight", type=int, default=4,
                    help="calls in flight together for the in-flight measurement of "
                         f"{', '.join(IN_FLIGHT_SYSTEMS)} in world 2 (default 4; 1: skip it)")
    ap.add_argument("--in-flight-sizes", default=IN_FLIGHT_SIZES, help="its sizes")
    ap.add_argument("--no-extras", action="store_true", help="skip the TCP loopback and RSS measurements")
    ap.add_argument("--only", choices=["collectives"],
                    help="collectives: only the other collectives and the bfloat16 pairs (issue 25), none of the "
                         "allreduce measurements; prints them and writes bench/.results/collectives.json, and "
                         "docs/BENCHMARKS.md only if --doc is given")
    ap.add_argument("--collectives", default=COLL_OPS,
                    help=f"the other collectives measured in world 2 against OpenMPI TCP and Gloo, each round: a "
                         f"subset of {','.join(COLL_ALL_OPS)}, or none (default {COLL_OPS})")
    ap.add_argument("--collective-sizes", default=COLL_SIZES,
                    help=f"their sizes: each rank's block for allgather, the whole input for reducescatter "
                         f"(default {COLL_SIZES})")
    ap.add_argument("--collective-rounds", type=int,
                    help=f"rounds that measure the other collectives and the bfloat16 pairs: the first N of --rounds "
                         f"(default {COLL_ROUNDS}, at most --rounds; quick 1); with --only collectives, the rounds")
    ap.add_argument("--bf16-pairs", type=int,
                    help=f"runs per round of {BF16_ELEMENTS >> 20} Mi-element allreduces, float32 and bfloat16 call by "
                         f"call in turn (`collectived bench --alternate-dtype`) (default {BF16_PAIRS}; quick 1; 0: none)")
    ap.add_argument("--doc", default=os.path.join(REPO, "docs", "BENCHMARKS.md"), help="report to write")
    ap.add_argument("--no-doc", action="store_true", help="print only; write no report or plots")
    ap.add_argument("--report-only", metavar="RESULTS_JSON", help="rewrite report and plots from a saved run")
    ap.add_argument("--timeout", type=int, default=600, help="seconds any one benchmark command may take")
    ap.add_argument("--from-head", action="store_true",
                    help="measure the committed HEAD (built by the wrapper in bench/.build/src), not the work tree")
    ap.add_argument("--collectived", default=os.path.join(HERE, ".build", "collectived"))
    ap.add_argument("--mpi-binary", default=os.path.join(HERE, ".build", "mpi_allreduce"))
    ap.add_argument("--mpi-collectives-binary", default=os.path.join(HERE, ".build", "mpi_collectives"))
    ap.add_argument("--python-client", default=os.path.join(HERE, ".build", "pyvenv", "bin", "python"),
                    help="a Python with the collectived client (and its lane extension) installed, for "
                         "the collectived-py system")
    a = ap.parse_args()

    if a.report_only:
        with open(a.report_only) as f:
            res = json.load(f)
        return finish(res, a)

    sizes = parse_sizes(a.sizes or (QUICK_SIZES if a.quick else DEFAULT_SIZES))
    worlds = parse_worlds(a.worlds)
    systems = [s.strip() for s in a.systems.split(",")]
    for s in systems:
        if s not in SYSTEMS:
            raise SystemExit(f"compare: --systems: {s!r} is not one of {','.join(SYSTEMS)}")
    if "collectived" not in systems:
        raise SystemExit("compare: --systems must include collectived: every ratio is collectived's")
    it_small, it_large = (a.iters, a.iters) if a.iters is not None else ((50, 10) if a.quick else (1000, 30))
    wu_small, wu_large = (a.warmup, a.warmup) if a.warmup is not None else ((50, 2) if a.quick else (1000, 5))
    if it_small < 1:
        raise SystemExit(f"compare: --iters {a.iters}: want at least 1")
    if wu_small < 0:
        raise SystemExit(f"compare: --warmup {a.warmup}: want 0 or more")
    prewarm = a.prewarm if a.prewarm is not None else 5000
    if prewarm < 0:
        raise SystemExit(f"compare: --prewarm {a.prewarm}: want 0 or more")
    if a.rounds is None:
        a.rounds = 1 if a.quick else 5
    if a.rounds < 1:
        raise SystemExit(f"compare: --rounds {a.rounds}: want at least 1")
    if a.sidecar_pairs is None:
        a.sidecar_pairs = 0 if a.quick else 4
    if a.sidecar_pairs < 0:
        raise SystemExit(f"compare: --sidecar-pairs {a.sidecar_pairs}: want 0 or more")
    if a.sidecar_interleaved is None:
        a.sidecar_interleaved = 0 if a.quick else 1
    if a.sidecar_interleaved < 0:
        raise SystemExit(f"compare: --sidecar-interleaved {a.sidecar_interleaved}: want 0 or more")
    if not 1 <= a.in_flight <= 64:
        raise SystemExit(f"compare: --in-flight {a.in_flight}: want 1 (skip) to 64")
    if_sizes = parse_sizes(a.in_flight_sizes, "--in-flight-sizes")
    if_iters, if_warmup = (x // 4 for x in IN_FLIGHT_ITERS) if a.quick else IN_FLIGHT_ITERS
    if_groups = [(if_sizes, if_iters, if_warmup, prewarm)]
    coll_ops = [] if a.collectives.strip() == "none" else [o.strip() for o in a.collectives.split(",")]
    for o in coll_ops:
        if o not in COLL_ALL_OPS:
            raise SystemExit(f"compare: --collectives: {o!r} is not one of {','.join(COLL_ALL_OPS)} (or none)")
    coll_sizes = parse_sizes(a.collective_sizes, "--collective-sizes")
    if a.bf16_pairs is None:
        a.bf16_pairs = 1 if a.quick else BF16_PAIRS
    if a.bf16_pairs < 0:
        raise SystemExit(f"compare: --bf16-pairs {a.bf16_pairs}: want 0 or more")
    coll_systems = [x for x in COLL_SYSTEMS if x in systems]
    if a.iters is not None:
        ci, cw = a.iters, wu_large
    else:
        ci, cw = (3, 1) if a.quick else COLL_ITERS
    coll_groups = [(coll_sizes, ci, cw, prewarm)]
    bf_iters, bf_warmup = (a.iters, wu_large) if a.iters is not None else ((5, 1) if a.quick else BF16_ITERS)
    coll_rounds = a.collective_rounds
    if coll_rounds is None:
        coll_rounds = min(a.rounds, 1 if a.quick else COLL_ROUNDS)
    if coll_rounds < 0:
        raise SystemExit(f"compare: --collective-rounds {coll_rounds}: want 0 or more")
    if a.only == "collectives":
        a.rounds = max(coll_rounds, 1)
    if a.only == "collectives" and not coll_ops and not a.bf16_pairs:
        raise SystemExit("compare: --only collectives with --collectives none and --bf16-pairs 0 measures nothing")
    if not (2 in worlds and RING_ONLY in systems and SIDECAR_SIZE in sizes):
        # nothing to pair: the overhead is not measured in this run
        a.sidecar_pairs = a.sidecar_interleaved = 0
    sg = groups(sizes, it_small, it_large, wu_small, wu_large, prewarm)
    bins = {"collectived": a.collectived, "mpi": a.mpi_binary, "tcp_bidir": os.path.join(HERE, ".build", "tcp_bidir"),
            "python": a.python_client, "mpi_collectives": a.mpi_collectives_binary}
    only = a.only == "collectives"
    if PYTHON_TRAINERS in systems and not only and not os.access(a.python_client, os.X_OK):
        raise SystemExit(f"compare: --python-client {a.python_client}: not an executable; run through "
                         f"bench/compare, which installs the client there, or leave {PYTHON_TRAINERS} out of --systems")

    started = time.monotonic()
    src = os.path.join(HERE, ".build", "src") if a.from_head else REPO
    if a.from_head and not os.path.isdir(os.path.join(src, "ring")):
        raise SystemExit(f"compare: --from-head: {src} holds no source tree; run through bench/compare")
    # The daemon's default ring settings, for the report to state (both
    # collectived and ring-only run on them).
    rc = {k: v for k, v in srcconfig.read(src).items() if k.startswith("daemon_")}
    res = {"meta": dict(machine(), ring_config=rc), "argv": sys.argv[1:], "sizes": sizes, "worlds": worlds,
           "rounds": a.rounds, "sidecar_pair_adjacent": True, "sidecar_pairs_per_round": a.sidecar_pairs,
           "sidecar_interleaved_per_round": a.sidecar_interleaved, "sidecar_block": SIDECAR_BLOCK,
           "iters": {"small": it_small, "large": it_large, "small_max_bytes": SMALL,
                     "warmup": wu_large, "warmup_small": wu_small, "prewarm": prewarm},
           "rows": [], "tcp_bidir": None, "rss": None, "errors": [], "per_round": []}
    if a.in_flight > 1 and 2 in worlds and not only:
        res["in_flight"] = {"k": a.in_flight, "sizes": if_sizes, "iters": if_iters, "warmup": if_warmup}
    if only:
        res.update(sizes=[], worlds=[], sidecar_pairs_per_round=0, sidecar_interleaved_per_round=0, only="collectives")
        a.no_extras = True
    coll = None
    if (coll_ops or a.bf16_pairs) and coll_rounds > 0:
        coll = res["collectives"] = {
            "ops": coll_ops, "sizes": coll_sizes, "world": COLL_WORLD, "systems": coll_systems,
            "iters": {"iters": ci, "warmup": cw, "prewarm": prewarm},
            "rounds": min(coll_rounds, a.rounds),
            "bf16_pairs_per_round": a.bf16_pairs, "bf16_iters": {"iters": bf_iters, "warmup": bf_warmup},
            "per_round": [], "unsupported": {}}

    def step(name, fn):
        log(f"{name} ...")
        t0 = time.monotonic()
        try:
            out = fn()
            log(f"{name}: done in {time.monotonic() - t0:.0f}s")
            return out
        except (runners.RunError, OSError, KeyError, ValueError, json.JSONDecodeError) as e:
            log(f"{name}: FAILED: {e}")
            res["errors"].append(f"{name}: {e}")
            return None

    # ring-only and the loopback limit are compared with world 2's
    # collectived, so they run in its rounds, on its sizes and iterations.
    for rnd in range(a.rounds):
        got = {"rows": [], "tcp_bidir": None}
        for w in ([] if only else worlds):
            items = round_items(systems, w, not a.no_extras, a.in_flight)
            k = rnd % len(items)  # rotate the order each round, so no system always runs first or last
            for item in keep_pair(items[k:] + items[:k], rnd):
                name = f"round {rnd + 1}/{a.rounds}, world {w}: {item}"
                if item.endswith(IN_FLIGHT_TAG):
                    base = item[:-len(IN_FLIGHT_TAG)]
                    got["rows"] += step(name, lambda: measure_system(base, w, if_groups, bins, a.timeout,
                                                                     in_flight=a.in_flight)) or []
                elif item == "tcp":
                    got["tcp_bidir"] = step(name, lambda: runners.tcp_bidir(
                        3 if a.quick else 5, 60, os.path.join(HERE, "tcp_bidir.py"), rc.get("daemon_streams") or 1,
                        bins["tcp_bidir"] if os.access(bins["tcp_bidir"], os.X_OK) else None))
                else:
                    got["rows"] += step(name, lambda: measure_system(item, w, sg, bins, a.timeout)) or []
        # The sidecar overhead is a few percent on runs that swing by tens:
        # more back-to-back pairs at its size, cheap next to a round; and
        # interleaved runs, shown beside (TUNING.md section 21).
        got["sidecar_pairs"] = []
        sg64 = groups([SIDECAR_SIZE], it_small, it_large, wu_small, wu_large, prewarm)
        for j in range(a.sidecar_pairs):
            pair = separate_pair(step, f"round {rnd + 1}/{a.rounds}, sidecar pair {j + 1}", pair_order(rnd, j),
                                 sg64, bins, a.timeout)
            if pair:
                got["sidecar_pairs"].append(pair)
        for j in range(a.sidecar_interleaved):
            pair = interleaved_pair(step, f"round {rnd + 1}/{a.rounds}, interleaved sidecar run {j + 1}",
                                    sg64, bins, a.timeout)
            if pair:
                got["sidecar_pairs"].append(pair)
        res["per_round"].append(got)
        if coll is not None and rnd < coll_rounds:
            crnd = {"rows": [], "bf16_pairs": []}
            for system, op in collective_items(coll_ops, coll_systems, rnd, coll["unsupported"]):
                name = f"round {rnd + 1}/{a.rounds}, {op}, world {COLL_WORLD}: {system}"
                try:
                    crnd["rows"] += step(name, lambda: measure_collective(system, op, coll_groups, bins,
                                                                          a.timeout)) or []
                except runners.Unsupported as e:
                    log(f"{name}: not offered: {e}")
                    coll["unsupported"].setdefault(system, {})[op] = str(e)
            for j in range(a.bf16_pairs):
                pair = bf16_pair(step, f"round {rnd + 1}/{a.rounds}, bf16 run {j + 1}", bf16_order(rnd, j), bins,
                                 a.timeout, bf_iters, bf_warmup, prewarm)
                if pair:
                    crnd["bf16_pairs"].append(pair)
            coll["per_round"].append(crnd)
        if rnd == 0:
            marks = {"round1_end": len(runners.COMMANDS)}
    marks["rounds_end"] = len(runners.COMMANDS)
    aggregate(res)
    if coll is not None:
        aggregate_collectives(coll)
    if not a.no_extras:
        res["rss"] = step("daemon RSS at idle", lambda: rss.measure(a.collectived))
    res["meta"]["from_head"] = a.from_head
    if a.from_head:
        res["meta"]["dirty_paths"] = []
        try:  # the commit the wrapper archived, not whatever HEAD is by now
            with open(os.path.join(src, ".commit")) as f:
                res["meta"]["commit"] = f.read().strip()
        except OSError:
            pass
    res["meta"]["loadavg_end"] = open("/proc/loadavg").read().strip()
    res["meta"]["duration_s"] = round(time.monotonic() - started)
    if a.from_head:
        build = ["git archive HEAD | tar -x -C bench/.build/src",
                 "(cd bench/.build/src && go build -o ../collectived ./cmd/collectived)"]
    else:
        build = ["go build -o bench/.build/collectived ./cmd/collectived"]
    build.append("mpicc -O2 -Wall -o bench/.build/mpi_allreduce bench/mpi_allreduce.c")
    build.append("mpicc -O2 -Wall -o bench/.build/mpi_collectives bench/mpi_collectives.c")
    build.append("gcc -O2 -Wall -pthread -o bench/.build/tcp_bidir bench/tcp_bidir.c")
    if PYTHON_TRAINERS in systems and not only:
        client = "bench/.build/src/clients/python" if a.from_head else "clients/python"
        build += ["/usr/bin/python3 -m venv --system-site-packages bench/.build/pyvenv",
                  "bench/.build/pyvenv/bin/python -m pip install 'setuptools>=77' 'packaging>=24.2'",
                  f"bench/.build/pyvenv/bin/python -m pip install --no-deps --no-build-isolation --force-reinstall {client}"]
    res["commands"] = build + [c.replace(REPO + "/", "") for c in runners.COMMANDS]
    res["command_marks"] = {k: v + len(build) for k, v in marks.items()}

    os.makedirs(os.path.join(HERE, ".results"), exist_ok=True)
    with open(os.path.join(HERE, ".results", "collectives.json" if only else "latest.json"), "w") as f:
        json.dump(res, f, indent=1)
    if only and not doc_given():
        a.no_doc = True
    return finish(res, a)


def doc_given() -> bool:
    """Whether --doc was on the command line (--only collectives writes no
    report otherwise: it would replace the full one with a part)."""
    return any(x == "--doc" or x.startswith("--doc=") for x in sys.argv[1:])


def round_items(systems, world, extras, in_flight=1):
    """What one round measures in one world, before rotation: the chosen
    systems (ring-only only in world 2), and in world 2 the TCP loopback
    probe right after the sidecar's pair, and (in_flight above 1) the
    in-flight measurement of those of IN_FLIGHT_SYSTEMS chosen."""
    items = [s for s in systems if world == 2 or s not in WORLD2_ONLY]
    if world == 2 and extras:
        items.insert(items.index(RING_ONLY) + 1 if RING_ONLY in items else 1, "tcp")
    if world == 2 and in_flight > 1:
        items += [s + IN_FLIGHT_TAG for s in IN_FLIGHT_SYSTEMS if s in systems]
    return items


def keep_pair(order, rnd):
    """The rotated order with ring-only moved next to collectived (after it
    in even rounds, before it in odd ones): the sidecar's two sides then
    always run back to back, so the machine's slow drift between them does
    not enter the overhead, whatever the rotation did to the rest."""
    if "collectived" not in order or RING_ONLY not in order:
        return order
    rest = [x for x in order if x != RING_ONLY]
    i = rest.index("collectived")
    pair = ["collectived", RING_ONLY] if rnd % 2 == 0 else [RING_ONLY, "collectived"]
    return rest[:i] + pair + rest[i + 1:]


def pair_order(rnd, j):
    """Which side of extra pair j of round rnd runs first: alternating, so
    that neither always follows the other."""
    return ["collectived", RING_ONLY] if (rnd + j) % 2 == 0 else [RING_ONLY, "collectived"]


def separate_pair(step, name, order, sizes_groups, bins, timeout):
    """One extra pair: collectived and ring-only in world 2, back to back,
    at the sidecar target's size. None if either failed (step has recorded
    why)."""
    pair = {"order": order}
    for system in order:
        rows = step(f"{name}: {system}", lambda: measure_system(system, 2, sizes_groups, bins, timeout))
        if not rows:
            return None
        pair[system] = rows[0]
    return pair


def interleaved_pair(step, name, sizes_groups, bins, timeout):
    """One interleaved run: `collectived bench --sidecar` in world 2 at the
    sidecar target's size, both sides from the same run. None if it failed
    (step has recorded why)."""
    def run():
        (sizes, iters, warmup, prewarm), = sizes_groups
        return runners.collectived_sidecar(bins["collectived"], sizes, iters, warmup, timeout, SIDECAR_BLOCK, prewarm)
    got = step(name, run)
    if not got:
        return None
    c, r = got
    for x, system in ((c[0], "collectived"), (r[0], RING_ONLY)):
        x.update(system=system, world=2)
    return {"interleaved": True, "block": SIDECAR_BLOCK, "collectived": c[0], RING_ONLY: r[0]}


def sidecar_pairs(res):
    """Every measurement of the sidecar's two sides at SIDECAR_SIZE: each
    round's own pair (collectived and ring-only in world 2, separate runs
    adjacent in the round) and the extra pairs run after the round
    (separate runs back to back, or interleaved in one run)."""
    pairs = []
    for i, rnd in enumerate(res["per_round"]):
        def med(rows, system):
            got = [r["median_us"] for r in rows
                   if r["system"] == system and r["world"] == 2 and r["bytes"] == SIDECAR_SIZE]
            return got[0] if got else None
        c, ro = med(rnd["rows"], "collectived"), med(rnd["rows"], RING_ONLY)
        if c is not None and ro is not None:
            pairs.append({"round": i + 1, "extra": False, "collectived_us": c, "ring_only_us": ro})
        for p in rnd.get("sidecar_pairs") or []:
            q = {"round": i + 1, "extra": True,
                 "collectived_us": p["collectived"]["median_us"], "ring_only_us": p[RING_ONLY]["median_us"]}
            if p.get("interleaved"):
                q["interleaved"] = True
            else:
                q["first"] = p["order"][0]
            pairs.append(q)
    return pairs


def sidecar_summary(res):
    """res["sidecar"]: every pair at SIDECAR_SIZE, from which the report
    derives the target's figure (report.sidecar_overhead)."""
    pairs = sidecar_pairs(res)
    res.pop("sidecar", None)
    if pairs:
        res["sidecar"] = {"bytes": SIDECAR_SIZE, "pairs": pairs}


def aggregate(res):
    """One figure per (system, world, size): the median over rounds of each
    round's median (and of its p99), so one disturbed round does not decide
    a ratio; every round's own figures stay in the row. The bandwidths of
    calls in flight together count all their bytes, as each round's do."""
    by = {}
    for rnd in res["per_round"]:
        for r in rnd["rows"]:
            by.setdefault((r["system"], r["world"], r["bytes"]), []).append(r)
    for (system, w, size), rs in by.items():
        med = statistics.median(r["median_us"] for r in rs)
        k = rs[0].get("in_flight") or 1
        alg = size * k / (med * 1e3)
        res["rows"].append({"system": system, "world": w, "bytes": size, "iters": rs[0]["iters"],
                            "median_us": med, "p99_us": statistics.median(r["p99_us"] for r in rs),
                            "algbw_GBps": alg, "busbw_GBps": alg * 2 * (w - 1) / w if w > 1 else 0.0,
                            "path": rs[0].get("path"), **({"in_flight": k} if k != 1 else {}),
                            "rounds": [{k: r.get(k) for k in ("median_us", "p99_us", "busbw_GBps", "load_before",
                                                              "load_after")} for r in rs]})
    sidecar_summary(res)
    tcp = [rnd["tcp_bidir"] for rnd in res["per_round"] if rnd["tcp_bidir"]]
    if tcp:
        out = {"seconds": tcp[0]["seconds"], "streams": tcp[0].get("streams", 1), "rounds": len(tcp),
               "errors": sum((t["errors"] for t in tcp), [])}
        for tool in runners.PROBES:
            ts = [t[tool] for t in tcp if tool in t]
            if ts:
                out[tool] = {k: statistics.median(t[k] for t in ts)
                             for k in ("forward_GBps", "reverse_GBps", "per_direction_GBps")}
                out[tool]["rounds"] = [t["per_direction_GBps"] for t in ts]
        out["per_direction_GBps"], out["reference"] = max(
            (out[k]["per_direction_GBps"], k) for k in runners.PROBES if k in out)
        res["tcp_bidir"] = out


def finish(res, a) -> int:
    if res.get("per_round"):
        sidecar_summary(res)  # again, for --report-only on results of older rules
    if res.get("only") != "collectives":
        print(report.ratio_text(res))
        if report.python_text(res):
            print(report.python_text(res))
        if report.in_flight_text(res):
            print(report.in_flight_text(res))
        print(report.targets_text(res))
    if res.get("collectives"):
        print(report.collectives_text(res))
    if res.get("errors"):
        # The first lines say what failed; the whole text is in results.json
        # and the report.
        print(f"{len(res['errors'])} measurement(s) failed and were left out:")
        for e in res["errors"]:
            print("  " + "\n    ".join(e.splitlines()[:3]))
    if not a.no_doc:
        docs = os.path.dirname(os.path.abspath(a.doc))
        plots = os.path.join(docs, "bench")
        os.makedirs(plots, exist_ok=True)
        if not a.report_only:
            with open(os.path.join(plots, "results.json"), "w") as f:
                json.dump(res, f, indent=1)
        report.plots(res, plots)
        try:
            with open(a.doc) as f:
                old = f.read()
        except FileNotFoundError:
            old = ""
        with open(a.doc, "w") as f:
            f.write(report.keep_spliced(old, report.markdown(res, os.path.relpath(plots, docs))))
        log(f"wrote {a.doc} and the plots in {plots}" + ("" if a.report_only else ", results.json"))
    return 1 if res.get("errors") else 0


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
