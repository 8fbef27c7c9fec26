"""Tests for bench/compare's own logic: argument checks, the statistics
every system shares, output parsing, aggregation over rounds, target
verdicts and the report; plus the MPI and Gloo programs' input checks and
the loopback probe, run for real where their tools are installed.

  /usr/bin/python3 -m unittest bench/test_bench.py     (or pytest)
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import compare  # noqa: E402
import named_step  # noqa: E402
import report  # noqa: E402
import resnet50_shapes  # noqa: E402
import rss  # noqa: E402
import runners  # noqa: E402
import srcconfig  # noqa: E402
import tensors  # noqa: E402

MIB64 = 64 << 20


class ArgsTest(unittest.TestCase):
    def test_sizes_with_units(self):
        self.assertEqual(compare.parse_sizes("4, 4KiB,1MiB,64M"), [4, 4096, 1 << 20, MIB64])

    def test_bad_sizes_name_the_field(self):
        for bad, want in (("4,abc", "'abc' is not a size"), ("0", "0 is out of range"), ("2GiB", "out of range")):
            with self.assertRaises(SystemExit) as cm:
                compare.parse_sizes(bad)
            self.assertIn("--sizes", str(cm.exception))
            self.assertIn(want, str(cm.exception))

    def test_worlds(self):
        self.assertEqual(compare.parse_worlds("2,4"), [2, 4])
        with self.assertRaises(SystemExit) as cm:
            compare.parse_worlds("2,3")
        self.assertIn("--worlds: '3'", str(cm.exception))

    def test_groups_split_small_and_large(self):
        self.assertEqual(compare.groups([4, 1 << 20, 16 << 20], 1000, 30, 1000, 5, 5000),
                         [([4, 1 << 20], 1000, 1000, 5000), ([16 << 20], 30, 5, 5000)])
        self.assertEqual(compare.groups([MIB64], 1000, 30, 1000, 5, 0), [([MIB64], 30, 5, 0)])


class StatsTest(unittest.TestCase):
    def test_median_p99_busbw_like_collectived(self):
        # Even count: the mean of the two middle values, as collectived's summarize does.
        s = runners.stats(1000, [4000, 1000, 3000, 2000], 4)
        self.assertEqual(s["median_us"], 2.5)
        self.assertEqual(s["p99_us"], 4.0)  # index min(n-1, int(n*0.99)) = 3
        self.assertAlmostEqual(s["algbw_GBps"], 1000 / 2500)
        self.assertAlmostEqual(s["busbw_GBps"], 1000 / 2500 * 2 * 3 / 4)

    def test_calls_in_flight_count_all_their_bytes(self):
        # As `collectived bench --in-flight` counts them: 4 calls of 1000 bytes in 2 µs.
        s = runners.stats(1000, [2000, 2000, 2000], 2, in_flight=4)
        self.assertAlmostEqual(s["algbw_GBps"], 4000 / 2000)
        self.assertEqual((s["in_flight"], s["median_us"]), (4, 2.0))
        self.assertNotIn("in_flight", runners.stats(1000, [2000], 2))
        rows = runners._parse_times('{"bytes": 8, "in_flight": 3, "times_ns": [10]}\n', 2, "x")
        self.assertAlmostEqual(rows[0]["busbw_GBps"], 24 / 10)
        runners._expect(rows, [8], "x", 3)
        # A program that timed another number of calls than asked is caught, by name.
        with self.assertRaisesRegex(runners.RunError, r"gloo: reported \[3\] calls in flight, want 4"):
            runners._expect(rows, [8], "gloo", 4)
        with self.assertRaisesRegex(runners.RunError, r"mpi-tcp: reported \[1\] calls in flight, want 3"):
            runners._expect(runners._parse_times('{"bytes": 8, "times_ns": [10]}', 2, "x"), [8], "mpi-tcp", 3)

    def test_p99_of_200_calls_is_second_largest(self):
        s = runners.stats(4, list(range(1, 201)), 2)
        self.assertEqual(s["p99_us"], 199 / 1e3)
        self.assertEqual(s["busbw_GBps"], s["algbw_GBps"])  # 2(W-1)/W = 1 for W = 2

    def test_rank0_output_parsing(self):
        rows = runners._parse_times('noise\n{"bytes": 8, "times_ns": [10, 30, 20]}\n', 2, "x")
        self.assertEqual([(r["bytes"], r["median_us"]) for r in rows], [(8, 0.02)])
        with self.assertRaises(runners.RunError) as cm:
            runners._parse_times('{"bytes": 8, "times_ns": [1,', 2, "mpi-tcp")
        self.assertIn("mpi-tcp: rank 0: printed", str(cm.exception))

    def test_missing_sizes_are_an_error(self):
        runners._expect([{"bytes": 4}, {"bytes": 4096}], [1, 4096], "gloo")  # 1 B is sent as one float
        with self.assertRaises(runners.RunError) as cm:
            runners._expect([{"bytes": 4}], [4, 4096], "gloo")
        self.assertIn("gloo: reported sizes [4], want [4, 4096]", str(cm.exception))


def fake_res(cvd2=1.0, gloo2=0.5, mpi2=0.5, tcp=1.0, ring_us=None, cvd4=1.0, peer4=0.4, lat4b=(30.0, 200.0, 20.0),
             rss_mib=12.0, serving=1.0):
    """A results dict as compare.py builds it, from busbw figures at 64 MiB
    (GB/s) and 4 B latencies (collectived, Gloo, OpenMPI TCP, in µs);
    ring-only's 64 MiB median is ring_us (default: collectived's)."""
    def r(system, w, size, busbw=None, median_us=None):
        if median_us is None:
            median_us = size / (busbw / (2 * (w - 1) / w)) / 1e3
        alg = size / (median_us * 1e3)
        return {"system": system, "world": w, "bytes": size, "median_us": median_us, "p99_us": median_us * 2,
                "algbw_GBps": alg, "busbw_GBps": alg * 2 * (w - 1) / w, "iters": 30}
    rows = [r("collectived", 2, MIB64, cvd2), r("gloo", 2, MIB64, gloo2), r("mpi-tcp", 2, MIB64, mpi2),
            r("collectived", 4, MIB64, cvd4), r("gloo", 4, MIB64, peer4), r("mpi-tcp", 4, MIB64, peer4),
            r("collectived", 2, 4, median_us=lat4b[0]), r("gloo", 2, 4, median_us=lat4b[1]),
            r("mpi-tcp", 2, 4, median_us=lat4b[2])]
    rows.append(r(report.RING_ONLY, 2, MIB64, median_us=ring_us or rows[0]["median_us"]))
    return {"sizes": [4, MIB64], "worlds": [2, 4], "rows": rows, "rounds": 1,
            "tcp_bidir": {"per_direction_GBps": tcp, "seconds": 5, "reference": "threads",
                          "threads": {"forward_GBps": tcp, "reverse_GBps": tcp, "per_direction_GBps": tcp}},
            "rss": {"max_rss_bytes": int(rss_mib * (1 << 20)), "settle_s": 3, "fresh": [], "after_work": [],
                    "serving_growth_per_buffers": serving},
            "iters": {"small": 200, "large": 30, "small_max_bytes": 1 << 20, "warmup": 5},
            "meta": {"date_utc": "2026-01-01 00:00:00 UTC", "nproc": 2, "cpu": "x", "mem_bytes": 1 << 30,
                     "kernel": "k", "os": "o", "go": "g", "openmpi": "m", "torch": "t", "iperf3": "i",
                     "commit": "abc", "dirty_paths": [], "loadavg_start": "1 1 1 1/1 1"},
            "errors": [], "per_round": [], "commands": ["bench/compare"]}


def rounds_res(medians, sizes=(MIB64,)):
    """fake_res's frame with world 2 rows aggregated by compare from rounds:
    medians maps a system to its per-round medians (µs), the same at every
    size."""
    res = fake_res()
    res["sizes"], res["worlds"] = list(sizes), [2]
    res["rows"], res["per_round"] = [], []
    for i in range(len(next(iter(medians.values())))):
        res["per_round"].append({"tcp_bidir": None, "rows": [
            {"system": s, "world": 2, "bytes": size, "iters": 30, "median_us": m[i], "p99_us": m[i] * 2}
            for s, m in medians.items() for size in sizes]})
    compare.aggregate(res)
    return res


def sidecar_pair(collectived_us, ring_only_us, first):
    """One extra pair as compare.sidecar_pair returns it."""
    def r(system, us):
        return {"system": system, "world": 2, "bytes": MIB64, "iters": 30, "median_us": us, "p99_us": us * 2}
    return {"order": [first, report.RING_ONLY if first == "collectived" else "collectived"],
            "collectived": r("collectived", collectived_us), report.RING_ONLY: r(report.RING_ONLY, ring_only_us)}


def verdicts(res):
    return {t["target"]: t["verdict"] for t in report.targets(res)}


class TargetsTest(unittest.TestCase):
    def test_all_pass(self):
        v = verdicts(fake_res(cvd2=1.0, gloo2=0.6, mpi2=0.5, tcp=1.1, cvd4=1.0, peer4=0.49, lat4b=(30, 200, 21)))
        self.assertEqual(set(v.values()), {"PASS"}, v)

    def test_each_threshold_fails_on_its_own_side(self):
        v = verdicts(fake_res(cvd2=1.0, gloo2=0.7, mpi2=0.56, tcp=1.2, cvd4=1.0, peer4=0.51, lat4b=(41, 200, 27),
                              ring_us=MIB64 / 1e3 / 1.1, rss_mib=31, serving=2.01))
        self.assertEqual(set(v.values()), {"FAIL"}, v)

    def test_sidecar_interval(self):
        pair = lambda c, r: {"collectived_us": c, "ring_only_us": r}
        # Pairs that all say +10% leave nothing for resampling to move,
        # though their sides' medians would (the old rule: 110 / 100 on
        # these, but 55 / 100 or 220 / 50 on some draws).
        res = {"sidecar": {"pairs": [pair(110.0, 100.0), pair(220.0, 200.0), pair(55.0, 50.0)]}}
        lo, hi = report.sidecar_interval(res)
        self.assertAlmostEqual(lo, 10.0, places=6)
        self.assertAlmostEqual(hi, 10.0, places=6)
        # One pair is no spread to resample; no pairs, no figure.
        self.assertIsNone(report.sidecar_interval({"sidecar": {"pairs": [pair(110.0, 100.0)]}}))
        self.assertIsNone(report.sidecar_interval({}))

    def test_sidecar_overhead_is_percent_over_ring_only(self):
        res = fake_res(cvd2=1.0)
        c2 = res["rows"][0]["median_us"]
        res = fake_res(cvd2=1.0, ring_us=c2 / 1.04)  # daemon 4% slower than its baseline: within 5%
        (t,) = [t for t in report.targets(res) if "sidecar" in t["target"]]
        self.assertEqual(t["target"], report.SIDECAR_TARGET)
        self.assertIn("daemon median ÷ ring-only median − 1", t["target"])
        self.assertAlmostEqual(t["value"], 4.0, places=6)
        self.assertEqual((t["verdict"], t["unit"]), ("PASS", "%"))
        res = fake_res(cvd2=1.0, ring_us=c2 / 1.06)
        self.assertEqual(verdicts(res)[report.SIDECAR_TARGET], "FAIL")

    def test_sidecar_target_is_the_median_of_the_pairs_own_overheads(self):
        # Round 2 caught both sides in a slow phase, round 3 ring-only alone
        # in a fast one. Each pair's own ratio (1.0, 300/290, 110/50) cancels
        # the phase it shared: the median is +3.4% (PASS). Dividing the
        # sides' medians (110 / 100, +10%) would not; the report gives that
        # beside, and the rounds' table (every size) keeps to it.
        res = rounds_res({"collectived": [100.0, 300.0, 110.0], report.RING_ONLY: [100.0, 290.0, 50.0]})
        (t,) = [t for t in report.targets(res) if t["target"] == report.SIDECAR_TARGET]
        self.assertAlmostEqual(t["value"], (300 / 290 - 1) * 100, places=6)
        self.assertEqual(t["verdict"], "PASS")
        self.assertIn("the median over back-to-back pairs of runs", t["target"])
        self.assertAlmostEqual(report.medians_overhead(res["sidecar"]["pairs"]), 10.0, places=6)
        (r,) = report.sidecar_rows(res)
        self.assertAlmostEqual(r["overhead"], 10.0, places=6)

    def test_sidecar_target_counts_the_extra_pairs(self):
        # Rounds alone: pairs of +0%, +188.5% and +120%, median +120% (FAIL).
        # With two extra pairs (+1.0%, +4.0%) the target is the median of
        # all five pairs' own overheads, +4.0% (PASS); the rounds' table
        # stays at 110 / 100, +10%.
        res = rounds_res({"collectived": [100.0, 300.0, 110.0], report.RING_ONLY: [100.0, 104.0, 50.0]})
        res["per_round"][0]["sidecar_pairs"] = [sidecar_pair(101.0, 100.0, "collectived")]
        res["per_round"][1]["sidecar_pairs"] = [sidecar_pair(103.0, 99.0, report.RING_ONLY)]
        res["rows"] = []
        compare.aggregate(res)
        sc = res["sidecar"]
        self.assertEqual([(p["round"], p["extra"]) for p in sc["pairs"]],
                         [(1, False), (1, True), (2, False), (2, True), (3, False)])
        self.assertEqual(set(sc), {"bytes", "pairs"})  # the figures are derived from the pairs
        (t,) = [t for t in report.targets(res) if t["target"] == report.SIDECAR_TARGET]
        self.assertAlmostEqual(t["value"], (103 / 99 - 1) * 100, places=6)
        self.assertEqual(t["verdict"], "PASS")
        (r,) = report.sidecar_rows(res)
        self.assertAlmostEqual(r["overhead"], 10.0, places=6)
        md = report.markdown(res, "bench")
        self.assertIn("comes from 5 back-to-back pairs: each round's own and 2 extra pairs", md)
        self.assertIn("the median of the pairs' own overheads (each pair's collectived median ÷ its ring-only "
                      "median − 1) = **+4.0%**; they range from +0.0% to +188.5%", md)
        self.assertIn("(the rule until TUNING.md section 23), gives +3.0%", md)
        self.assertIn("| 2 | extra, ring-only first | 99.0 | 103.0 | +4.0% |", md)
        self.assertIn("| 1 | the round's own | 100.0 | 100.0 | +0.0% |", md)
        over = report.paired_overheads(res)
        self.assertEqual([round(o, 1) for o in over], [0.0, 1.0, 188.5, 4.0, 120.0])
        lo, hi = report.sidecar_interval(res)
        self.assertLessEqual(lo, 4.0)
        self.assertGreaterEqual(hi, 4.0)
        self.assertLess(lo, hi)  # the pairs differ, so resampling moves the figure
        self.assertEqual(report.sidecar_interval(res), (lo, hi))  # fixed seed: the same report twice
        self.assertIn(f"moves the figure between {lo:+.1f}% and {hi:+.1f}% (the central 95%)", md)
        # A sixth pair (+122.2%): even counts take the middle two, (+4.0%
        # and +120%) / 2.
        res["per_round"][2]["sidecar_pairs"] = [sidecar_pair(200.0, 90.0, "collectived")]
        res["rows"] = []
        compare.aggregate(res)
        (t,) = [t for t in report.targets(res) if t["target"] == report.SIDECAR_TARGET]
        self.assertAlmostEqual(t["value"], ((103 / 99 - 1) * 100 + 120.0) / 2, places=6)
        self.assertEqual(t["verdict"], "FAIL")

    def test_interleaved_pairs_are_shown_not_counted(self):
        # The rounds' own pairs (separate runs) say +0%, +188.5% and +120%;
        # two interleaved runs say 102/100 (+2%) and 99/50 (+98%).
        # Interleaving may flatter the daemon, so the target keeps to the
        # separate runs (+120%, FAIL) and the interleaved figure is given
        # beside, by the target's rule: the median of +2% and +98%, +50%
        # (dividing their medians would say 100.5 / 75, +34%).
        res = rounds_res({"collectived": [100.0, 300.0, 110.0], report.RING_ONLY: [100.0, 104.0, 50.0]})
        res["sidecar_block"] = 1
        for i, (c, r) in enumerate(((102.0, 100.0), (99.0, 50.0))):
            p = sidecar_pair(c, r, "collectived")
            del p["order"]
            p.update(interleaved=True, block=1)
            res["per_round"][i]["sidecar_pairs"] = [p]
        res["rows"] = []
        compare.aggregate(res)
        sc = res["sidecar"]
        self.assertNotIn("interleaved", sc)  # derived from the pairs, not stored
        self.assertEqual(len(sc["pairs"]), 5)
        (t,) = [t for t in report.targets(res) if t["target"] == report.SIDECAR_TARGET]
        self.assertAlmostEqual(t["value"], 120.0, places=6)
        self.assertEqual(t["verdict"], "FAIL")
        md = report.markdown(res, "bench")
        self.assertIn("comes from 3 back-to-back pairs: each round's own (the two side by side in the round)", md)
        self.assertIn("median − 1) = **+120.0%**", md)
        self.assertIn("Beside them, 2 interleaved runs (`collectived bench --sidecar`", md)
        self.assertIn("give +50.0% by the target's rule (their own overheads +2.0% to +98.0%). They do not count", md)
        self.assertIn("| 1 | interleaved, one run | 100.0 | 102.0 | +2.0% |", md)
        self.assertIn("| 3 | the round's own | 50.0 | 110.0 | +120.0% |", md)
        # A run of interleaved pairs only (no ring-only in its rounds) has
        # them decide, and says so.
        only = {"sidecar": {"bytes": MIB64,
                            "pairs": [dict(round=1, extra=True, interleaved=True, collectived_us=99.0,
                                           ring_only_us=100.0)]}}
        self.assertEqual(report.target_pairs(only["sidecar"]["pairs"]), only["sidecar"]["pairs"])
        self.assertIn("this run has only interleaved runs; the target's figure comes from them: **-1.0%**",
                      "\n".join(report._sidecar_pairs(only)))

    def test_rounds_own_pairs_are_explained_too(self):
        # Without extra pairs the target still comes from the rounds' own
        # pairs, by the paired rule (+120%), while the rounds' table divides
        # the medians (+10%): the report says which is which.
        res = rounds_res({"collectived": [100.0, 300.0, 110.0], report.RING_ONLY: [100.0, 104.0, 50.0]})
        self.assertEqual(len(res["sidecar"]["pairs"]), 3)
        (t,) = [t for t in report.targets(res) if t["target"] == report.SIDECAR_TARGET]
        self.assertAlmostEqual(t["value"], 120.0, places=6)
        md = report.markdown(res, "bench")
        self.assertIn("the target's figure comes from 3 back-to-back pairs: each round's own (the two side by side "
                      "in the round)", md)
        self.assertIn("= **+120.0%**", md)
        self.assertIn("(the rule until TUNING.md section 23), gives +10.0%", md)
        self.assertIn("| 3 | the round's own | 50.0 | 110.0 | +120.0% |", md)
        # One pair alone is no table.
        one = rounds_res({"collectived": [100.0], report.RING_ONLY: [90.0]})
        self.assertNotIn("the target's figure comes from", report.markdown(one, "bench"))

    def test_serving_memory_target(self):
        self.assertEqual(verdicts(fake_res(serving=2.0))[report.SERVING_TARGET], "PASS")
        self.assertEqual(verdicts(fake_res(serving=2.01))[report.SERVING_TARGET], "FAIL")
        res = fake_res()
        del res["rss"]["serving_growth_per_buffers"]  # a run from before it was measured
        self.assertEqual(verdicts(res)[report.SERVING_TARGET], "n/a")

    def test_serving_memory_table(self):
        res = fake_res()
        mib = 1 << 20
        res["rss"]["fresh"] = [{"node": 0, "vmrss_bytes": 11 * mib, "private_bytes": 10 * mib, "buffer_bytes": 4 * mib}]
        res["rss"]["serving"] = [{"node": 0, "samples": 40, "max_private_bytes": 15 * mib, "growth_bytes": 5 * mib,
                                  "max_shmem_bytes": 64 * mib}]
        md = report.markdown(res, "bench")
        self.assertIn("| 0 | 40 | 64.0 | 10.0 | 15.0 | 5.0 | 4.0 | 1.25 |", md)

    def test_sidecar_without_ring_only_is_not_measured(self):
        res = fake_res()
        res["rows"] = [r for r in res["rows"] if r["system"] != report.RING_ONLY]
        self.assertEqual(verdicts(res)[report.SIDECAR_TARGET], "n/a")
        md = report.markdown(res, "bench")
        self.assertIn("## Sidecar cost (world 2)\n\nnot measured in this run", md)
        self.assertNotIn("÷ ring-only", report.ratio_text(res))

    def test_sidecar_section_lists_every_size_both_measured(self):
        res = rounds_res({"collectived": [100.0, 300.0, 110.0], report.RING_ONLY: [100.0, 104.0, 50.0]},
                         sizes=(4, 64 << 10, 1 << 20, MIB64))
        res["sizes"].append(16 << 20)  # collectived only: no sidecar row
        res["meta"]["ring_config"] = {"daemon_streams": 1, "daemon_segment_bytes": 512 << 10}
        res["rows"].append(dict(res["rows"][0], system="collectived", bytes=16 << 20, rounds=[]))
        got = report.sidecar_rows(res)
        self.assertEqual([r["size"] for r in got], [4, 64 << 10, 1 << 20, MIB64])
        self.assertAlmostEqual(got[-1]["overhead"], 10.0, places=6)
        md = report.markdown(res, "bench")
        sec = md[md.index("## Sidecar cost (world 2)"):]
        sec = sec[:sec.index("\n## ", 5)]
        self.assertIn("| size | ring-only, median µs | collectived, median µs | overhead |", sec)
        for name in ("4 B", "64 KiB", "1 MiB", "64 MiB"):
            self.assertIn(f"| {name} | 100.0 (50.0–104.0) | 110.0 (100.0–300.0) | +10.0% |", sec)
        # Runs before the pair was kept together do not claim it.
        self.assertNotIn("ring-only always right next to collectived", md)
        res["sidecar_pair_adjacent"] = True
        self.assertIn("ring-only always right next to collectived", report.markdown(res, "bench"))
        self.assertNotIn("16 MiB", sec)
        for side in ("`collectived bench --ring-only`", "its own process", "Unix socket", "memfd", "local fold",
                     "1 TCP stream per link, 512 KiB segments"):
            self.assertIn(side, sec)
        self.assertNotIn("go test", md)

    def test_ring_only_is_a_world2_column(self):
        res = fake_res(ring_us=None)
        text = report.ratio_text(res)
        w2, w4 = text.split(report.world_title(4))
        self.assertIn("÷ ring-only", w2)
        self.assertNotIn("÷ ring-only", w4)
        (r,) = [r for r in report.ratio_rows(res, 2) if r["size"] == MIB64]
        self.assertAlmostEqual(r["lat"][report.RING_ONLY], 1.0)
        md = report.markdown(res, "bench")
        self.assertIn("| size | collectived | Gloo | OpenMPI TCP | ring-only |", md)

    def test_reproduce_shows_the_ring_only_command(self):
        md = report.markdown(fake_res(), "bench")
        self.assertIn("collectived bench --ring-only --nodes 2 --local 1", md[md.index("## Reproduce"):])

    def test_unmeasured_is_not_a_pass(self):
        res = fake_res()
        res["rows"] = [r for r in res["rows"] if r["system"] != "gloo"]
        res["tcp_bidir"] = res["rss"] = None
        v = verdicts(res)
        self.assertEqual(v["64 MiB, world 2: busbw ÷ Gloo"], "n/a")
        self.assertEqual(v["daemon RSS at idle (largest daemon, fresh and after work)"], "n/a")
        self.assertEqual(v["64 MiB, world 2: busbw ÷ OpenMPI TCP"], "PASS")

    def test_commands_of_repeated_rounds_are_listed_once(self):
        res = fake_res()
        res.update(rounds=3, commands=["build", "a", "b", "a2", "b2", "a3", "b3", "rss"],
                   command_marks={"round1_end": 3, "rounds_end": 7})
        got = report._commands(res)
        self.assertEqual(got[:3], ["build", "a", "b"])
        self.assertIn("rounds 2 to 3: the same measurements again", got[3])
        self.assertEqual(got[4:], ["rss"])

    def test_text_and_markdown_render(self):
        res = fake_res()
        self.assertIn("busbw ratio", report.ratio_text(res))
        md = report.markdown(res, "bench")
        for want in ("## Targets (issue 5)", "## Machine and conditions", "![busbw against size](bench/busbw.png)",
                     "other work was running", "## Reproduce"):
            self.assertIn(want, md)
        self.assertNotIn("untimed allreduces of one float", md)  # results from before --prewarm
        res["iters"]["prewarm"] = 5000
        self.assertIn("first makes 5000 untimed allreduces of one float, the same for every system",
                      report.markdown(res, "bench"))


class AggregateTest(unittest.TestCase):
    def test_median_of_round_medians(self):
        def row(med, p99):
            return {"system": "gloo", "world": 2, "bytes": 1000, "iters": 5, "median_us": med, "p99_us": p99}
        res = {"rows": [], "tcp_bidir": None, "per_round": [
            {"rows": [row(10.0, 50.0)], "tcp_bidir": None},
            {"rows": [row(30.0, 40.0)], "tcp_bidir": None},
            {"rows": [row(20.0, 90.0)], "tcp_bidir": None}]}
        compare.aggregate(res)
        (r,) = res["rows"]
        self.assertEqual((r["median_us"], r["p99_us"]), (20.0, 50.0))
        self.assertAlmostEqual(r["busbw_GBps"], 1000 / 20e3)
        self.assertEqual([x["median_us"] for x in r["rounds"]], [10.0, 30.0, 20.0])

    def test_calls_in_flight_count_all_their_bytes(self):
        # Every system's in-flight rows, collectived's (from its bench) and
        # a peer's (from runners.stats), on one definition: the k calls' bytes.
        rounds = []
        for med in (10.0, 20.0, 30.0):
            rows = [{"system": report.in_flight_name(s, 4), "world": 2, "bytes": 1000, "iters": 5,
                     "median_us": med, "p99_us": med, "in_flight": 4} for s in ("collectived", "gloo")]
            rounds.append({"rows": rows, "tcp_bidir": None})
        res = {"rows": [], "tcp_bidir": None, "per_round": rounds}
        compare.aggregate(res)
        for r in res["rows"]:
            self.assertAlmostEqual(r["busbw_GBps"], 4 * 1000 / 20e3, msg=r["system"])
            self.assertEqual(r["in_flight"], 4)


class RoundsTest(unittest.TestCase):
    def test_ring_only_runs_next_to_collectived_in_world2_only(self):
        self.assertEqual(compare.round_items(compare.SYSTEMS, 2, True),
                         ["collectived", "ring-only", "tcp", "collectived-py", "mpi-tcp", "mpi-shm", "gloo"])
        self.assertEqual(compare.round_items(compare.SYSTEMS, 4, True),
                         ["collectived", "collectived-py", "mpi-tcp", "mpi-shm", "gloo"])
        self.assertEqual(compare.round_items(["collectived", "ring-only"], 2, False), ["collectived", "ring-only"])
        self.assertEqual(compare.round_items(["collectived", "gloo"], 2, True), ["collectived", "tcp", "gloo"])

    def test_in_flight_items_in_world2_only(self):
        base = ["collectived", "ring-only", "tcp", "collectived-py", "mpi-tcp", "mpi-shm", "gloo"]
        self.assertEqual(compare.round_items(compare.SYSTEMS, 2, True, 4),
                         base + ["collectived@in-flight", "collectived-py@in-flight", "mpi-tcp@in-flight",
                                 "gloo@in-flight"])
        self.assertEqual(compare.round_items(compare.SYSTEMS, 4, True, 4),
                         ["collectived", "collectived-py", "mpi-tcp", "mpi-shm", "gloo"])
        self.assertEqual(compare.round_items(["collectived", "mpi-shm"], 2, False, 4),
                         ["collectived", "mpi-shm", "collectived@in-flight"])
        with self.assertRaisesRegex(ValueError, "mpi-shm: no in-flight measurement"):
            compare.measure_system("mpi-shm", 2, [([4], 1, 0, 0)], {}, 10, in_flight=4)

    def test_sidecar_pair_runs_back_to_back_in_every_rotation(self):
        items = compare.round_items(compare.SYSTEMS, 2, True)
        for rnd in range(2 * len(items)):
            k = rnd % len(items)
            order = compare.keep_pair(items[k:] + items[:k], rnd)
            self.assertEqual(sorted(order), sorted(items))
            i = order.index("collectived")
            want = ["collectived", compare.RING_ONLY] if rnd % 2 == 0 else [compare.RING_ONLY, "collectived"]
            self.assertEqual(order[i:i + 2] if rnd % 2 == 0 else order[i - 1:i + 1], want, (rnd, order))
        self.assertEqual(compare.keep_pair(["gloo", "collectived"], 1), ["gloo", "collectived"])

    def test_extra_pairs_alternate_which_side_runs_first(self):
        firsts = [compare.pair_order(rnd, j)[0] for rnd in range(3) for j in range(2)]
        self.assertEqual(firsts, ["collectived", "ring-only", "ring-only", "collectived", "collectived", "ring-only"])
        for rnd in range(3):
            for j in range(2):
                self.assertEqual(sorted(compare.pair_order(rnd, j)), ["collectived", "ring-only"])

    def test_a_failed_side_drops_its_pair(self):
        calls = []

        def step(name, fn):
            calls.append(name)
            return None if name.endswith("ring-only") else [{"median_us": 1.0}]
        self.assertIsNone(compare.separate_pair(step, "p", ["collectived", "ring-only"], [], {}, 1))
        self.assertEqual(calls, ["p: collectived", "p: ring-only"])

    def test_a_failed_interleaved_run_drops_its_pair(self):
        calls = []

        def step(name, fn):
            calls.append(name)
            return None
        self.assertIsNone(compare.interleaved_pair(step, "p", [([MIB64], 30, 5, 0)], {}, 1))
        self.assertEqual(calls, ["p"])

    def test_interleaved_pair_is_one_run(self):
        row = lambda path, us: {"bytes": MIB64, "path": path, "median_us": us, "iters": 30}
        pair = compare.interleaved_pair(lambda name, fn: ([row("shm", 101.0)], [row("ring", 100.0)]), "p",
                                        [([MIB64], 30, 5, 0)], {}, 1)
        self.assertEqual(pair["interleaved"], True)
        self.assertEqual(pair["block"], compare.SIDECAR_BLOCK)
        self.assertEqual((pair["collectived"]["system"], pair["collectived"]["median_us"]), ("collectived", 101.0))
        self.assertEqual((pair[report.RING_ONLY]["system"], pair[report.RING_ONLY]["median_us"]),
                         (report.RING_ONLY, 100.0))

    def test_ring_only_refuses_world4(self):
        with self.assertRaises(ValueError) as cm:
            compare.measure_system("ring-only", 4, [([4], 5, 1, 0)], {"collectived": "/nonexistent"}, 10)
        self.assertIn("ring-only: only world 2", str(cm.exception))


class CollectivedRunnerTest(unittest.TestCase):
    def fake(self, d, line):
        """A stand-in binary printing one JSON row and the argv it got."""
        path = os.path.join(d, "fake_collectived")
        with open(path, "w") as f:
            f.write(f"#!{sys.executable}\nimport sys\nprint(' '.join(sys.argv[1:]), file=sys.stderr)\n"
                    f"print({line!r})\n")
        os.chmod(path, 0o755)
        return path

    def test_ring_only_row_must_say_path_ring(self):
        with tempfile.TemporaryDirectory() as d:
            b = self.fake(d, '{"bytes": 4, "path": "inline", "median_us": 1, "verified": true}')
            with self.assertRaises(runners.RunError) as cm:
                runners.collectived(b, 2, 1, [4], 5, 1, 30, ring_only=True)
            self.assertIn('collectived bench --ring-only: sizes [4] did not report "path": "ring"', str(cm.exception))
            self.assertEqual(len(runners.collectived(b, 2, 1, [4], 5, 1, 30)), 1)  # the daemon's path is its own

    def test_sidecar_rows_alternate_daemon_and_ring(self):
        c = '{"bytes": 4, "path": "inline", "median_us": 2, "verified": true}'
        r = '{"bytes": 4, "path": "ring", "median_us": 1, "verified": true}'
        with tempfile.TemporaryDirectory() as d:
            n = len(runners.COMMANDS)
            got = runners.collectived_sidecar(self.fake(d, c + "\n" + r), [4], 5, 1, 30)
            self.assertEqual([[x["median_us"] for x in side] for side in got], [[2], [1]])
            self.assertIn("bench --sidecar --sidecar-block 1 --nodes 2 --local 1 --sizes 4", runners.COMMANDS[n])
            with self.assertRaises(runners.RunError) as cm:
                runners.collectived_sidecar(self.fake(d, r + "\n" + c), [4], 5, 1, 30)
            self.assertIn('collectived bench --sidecar: rows do not alternate daemon path and "path": "ring": '
                          "['ring', 'inline']", str(cm.exception))
            with self.assertRaises(runners.RunError) as cm:
                runners.collectived_sidecar(self.fake(d, c), [4], 5, 1, 30)
            self.assertIn("collectived bench --sidecar: reported sizes [], want [4]", str(cm.exception))

    def test_unverified_and_garbled_rows_are_errors(self):
        with tempfile.TemporaryDirectory() as d:
            b = self.fake(d, '{"bytes": 4, "path": "ring", "median_us": 1, "verified": false}')
            with self.assertRaises(runners.RunError) as cm:
                runners.collectived(b, 2, 1, [4], 5, 1, 30, ring_only=True)
            self.assertIn("collectived bench --ring-only: size 4 not verified", str(cm.exception))
        with self.assertRaises(runners.RunError) as cm:
            runners.parse_collectived('{"bytes": 4, "pa', 2, "collectived bench")
        self.assertIn("collectived bench: printed", str(cm.exception))


def _collectived_bin(flag="--ring-only"):
    """The checkout's bin/collectived (make build), if its bench has flag."""
    b = os.environ.get("COLLECTIVED_BIN") or os.path.join(os.path.dirname(HERE), "bin", "collectived")
    if not os.access(b, os.X_OK):
        return None
    try:
        h = subprocess.run([b, "bench", "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return b if flag in h.stdout + h.stderr else None


@unittest.skipUnless(_collectived_bin(), "bin/collectived with bench --ring-only not built (make build)")
class RingOnlyRealTest(unittest.TestCase):
    def test_real_ring_only_rows(self):
        n = len(runners.COMMANDS)
        rows = runners.collectived(_collectived_bin(), 2, 1, [4, 65536], 5, 1, 120, ring_only=True)
        self.assertEqual([(r["bytes"], r["world"], r["path"], r["iters"]) for r in rows],
                         [(4, 2, "ring", 5), (65536, 2, "ring", 5)])
        self.assertTrue(all(r["median_us"] > 0 and r["verified"] for r in rows))
        self.assertIn("bench --ring-only --nodes 2 --local 1 --sizes 4,65536 --iters 5 --warmup 1 --prewarm 0 --json",
                      runners.COMMANDS[n])

    @unittest.skipUnless(_collectived_bin("--sidecar"), "bin/collectived with bench --sidecar not built (make build)")
    def test_real_sidecar_rows(self):
        c, r = runners.collectived_sidecar(_collectived_bin(), [4, 65536], 3, 1, 120)
        self.assertEqual([(x["bytes"], x["path"], x["iters"], len(x["block_medians_us"])) for x in c + r],
                         [(4, "inline", 3, 3), (65536, "copied", 3, 3), (4, "ring", 3, 3), (65536, "ring", 3, 3)])
        self.assertTrue(all(x["median_us"] > 0 and x["verified"] for x in c + r))


def _torch_python() -> bool:
    """Whether the Python bench/compare runs Gloo with (Debian's, with
    python3-torch) can import torch."""
    return subprocess.run(["/usr/bin/python3", "-c", "import torch"], capture_output=True).returncode == 0


@unittest.skipUnless(_torch_python(), "no torch in /usr/bin/python3 (scripts/setup.sh installs python3-torch)")
class GlooProgramTest(unittest.TestCase):
    def test_calls_in_flight_are_timed_together_and_said(self):
        # gloo_allreduce.py --in-flight 3: the rows say 3, and the
        # bandwidths count the three calls' bytes, as collectived's do.
        rows = runners.gloo("/usr/bin/python3", os.path.join(HERE, "gloo_allreduce.py"), 2, [4, 4096], 3, 1, 300,
                            in_flight=3)
        self.assertEqual([(r["bytes"], r["in_flight"], r["iters"]) for r in rows], [(4, 3, 3), (4096, 3, 3)])
        for r in rows:
            self.assertAlmostEqual(r["algbw_GBps"], 3 * r["bytes"] / (r["median_us"] * 1e3))


@unittest.skipUnless(shutil.which("mpirun") and shutil.which("mpicc"), "OpenMPI not installed")
class MPIProgramTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.bin = os.path.join(HERE, ".build", "mpi_allreduce_test")
        os.makedirs(os.path.dirname(cls.bin), exist_ok=True)
        subprocess.run(["mpicc", "-O2", "-Wall", "-o", cls.bin, os.path.join(HERE, "mpi_allreduce.c")], check=True)

    def test_real_run_is_checked_and_parsed(self):
        n = len(runners.COMMANDS)
        rows = runners.mpi(self.bin, "mpi-shm", 2, [4, 4096], 5, 1, 120, prewarm=20)
        self.assertEqual([r["bytes"] for r in rows], [4, 4096])
        self.assertTrue(all(r["iters"] == 5 and r["median_us"] > 0 for r in rows))
        self.assertTrue(runners.COMMANDS[n].endswith("mpi_allreduce_test 4,4096 5 1 20"), runners.COMMANDS[n])

    def test_calls_in_flight_are_checked_and_timed_together(self):
        # IN_FLIGHT 3: three MPI_Iallreduce per timed iteration, each buffer
        # checked after the last (the program aborts on a wrong sum).
        n = len(runners.COMMANDS)
        rows = runners.mpi(self.bin, "mpi-tcp", 2, [4, 65536], 4, 1, 120, prewarm=10, in_flight=3)
        self.assertEqual([r["bytes"] for r in rows], [4, 65536])
        self.assertTrue(all(r["iters"] == 4 and r["median_us"] > 0 and r["in_flight"] == 3 for r in rows))
        for r in rows:  # the three calls' bytes, as collectived's bench counts them
            self.assertAlmostEqual(r["algbw_GBps"], 3 * r["bytes"] / (r["median_us"] * 1e3))
        self.assertTrue(runners.COMMANDS[n].endswith("mpi_allreduce_test 4,65536 4 1 10 3"), runners.COMMANDS[n])

    def test_bad_counts_are_refused_by_name(self):
        for args, want in ((["4", "0", "1"], 'ITERS "0": want a whole number from 1 to 100000000'),
                           (["4", "5", "x"], 'WARMUP "x": want a whole number from 0 to 100000000'),
                           (["4", "5", "1", "-3"], 'PREWARM "-3": want a whole number from 0 to 100000000'),
                           (["4", "100000001", "1"], 'ITERS "100000001": want a whole number from 1 to 100000000'),
                           (["4", "5", "1", "0", "65"], 'IN_FLIGHT "65": want a whole number from 1 to 64'),
                           (["4", "5", "1", "0", "0"], 'IN_FLIGHT "0": want a whole number from 1 to 64')):
            p = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "1", self.bin] + args,
                               capture_output=True, text=True, timeout=60)
            self.assertNotEqual(p.returncode, 0, args)
            self.assertIn(want, p.stderr, args)

    def test_bad_size_is_refused(self):
        with self.assertRaises(runners.RunError) as cm:
            runners.mpi(self.bin, "mpi-tcp", 2, ["12x"], 5, 1, 120)
        self.assertIn('size "12x" is not a byte count', str(cm.exception))


class SrcConfigTest(unittest.TestCase):
    def write_config(self, d, config_go):
        os.makedirs(os.path.join(d, "config"), exist_ok=True)
        with open(os.path.join(d, "config", "config.go"), "w") as f:
            f.write(config_go)

    def test_reads_the_daemon_defaults(self):
        with tempfile.TemporaryDirectory() as d:
            self.write_config(d, "\tDefaultStreams      = 2\n\tDefaultSegmentBytes = 512 * KiB\n")
            self.assertEqual(srcconfig.read(d), {"daemon_streams": 2, "daemon_segment_bytes": 512 << 10})

    def test_reads_them_where_their_packages_declare_them(self):
        with tempfile.TemporaryDirectory() as d:
            self.write_config(d, "\tDefaultStreams = rendezvous.DefaultStreams\n"
                                 "\tDefaultSegmentBytes int64 = ring.DefaultSegmentBytes\n")
            for pkg, decl in (("ring", "const DefaultSegmentBytes = 512 << 10\n"),
                              ("rendezvous", "const DefaultStreams = 2\n")):
                os.makedirs(os.path.join(d, pkg))
                with open(os.path.join(d, pkg, "config.go"), "w") as f:
                    f.write(decl)
            self.assertEqual(srcconfig.read(d), {"daemon_streams": 2, "daemon_segment_bytes": 512 << 10})

    def test_missing_values_are_none_and_said_so(self):
        with tempfile.TemporaryDirectory() as d:
            self.write_config(d, "DefaultSegmentBytes = 1048576\n")
            got = srcconfig.read(d)
            self.assertEqual(got["daemon_segment_bytes"], 1 << 20)
            self.assertIsNone(got["daemon_streams"])
            self.assertEqual(srcconfig.describe(None, None), "? streams, ? segments")

    def test_this_tree_parses(self):
        # compare uses the daemon's defaults (stated in the report, streams
        # for the TCP probe); they must be found in this tree.
        got = srcconfig.read(os.path.dirname(HERE))
        self.assertIsNotNone(got["daemon_streams"], got)
        self.assertIsNotNone(got["daemon_segment_bytes"], got)
        self.assertEqual(srcconfig.describe(1, 64 << 10), "1 TCP stream per link, 64 KiB segments")


class ProcessTest(unittest.TestCase):
    def test_overrun_is_killed_and_named(self):
        t0 = time.monotonic()
        with self.assertRaises(runners.RunError) as cm:
            runners.run(["sleep", "30"], timeout=1, log=False)
        self.assertLess(time.monotonic() - t0, 10)
        self.assertIn("sleep 30: still running after 1s, killed", str(cm.exception))

    def test_failure_shows_head_and_tail_of_stderr(self):
        script = "import sys; sys.stderr.write('FIRST ' + 'x' * 5000 + ' LAST'); sys.exit(3)"
        with self.assertRaises(runners.RunError) as cm:
            runners.run([sys.executable, "-c", script], timeout=30, log=False)
        msg = str(cm.exception)
        self.assertIn("exit status 3", msg)
        self.assertIn("FIRST", msg)
        self.assertIn("LAST", msg)
        self.assertIn("[...]", msg)

    def test_one_gloo_rank_dying_ends_the_others(self):
        # A stand-in for gloo_allreduce.py: rank 1 fails at once, rank 0
        # would wait (as in Gloo) for a minute.
        fake = os.path.join(HERE, ".build", "fake_rank.py")
        os.makedirs(os.path.dirname(fake), exist_ok=True)
        with open(fake, "w") as f:
            f.write("import sys, time\nrank = int(sys.argv[sys.argv.index('--rank') + 1])\n"
                    "if rank == 1:\n    sys.exit('rank 1 gives up')\ntime.sleep(60)\n")
        t0 = time.monotonic()
        with self.assertRaises(runners.RunError) as cm:
            runners.gloo(sys.executable, fake, 2, [4], 5, 1, 120)
        self.assertLess(time.monotonic() - t0, 20)
        self.assertIn("rank 1: exit 1: rank 1 gives up", str(cm.exception))


class WorkerArgsTest(unittest.TestCase):
    def test_compare_refuses_bad_counts(self):
        for args, want in ((["--iters", "0"], "--iters 0: want at least 1"),
                           (["--warmup", "-1"], "--warmup -1: want 0 or more"),
                           (["--prewarm", "-1"], "--prewarm -1: want 0 or more"),
                           (["--sidecar-pairs", "-1"], "--sidecar-pairs -1: want 0 or more"),
                           (["--sidecar-interleaved", "-1"], "--sidecar-interleaved -1: want 0 or more"),
                           (["--in-flight", "0"], "--in-flight 0: want 1 (skip) to 64"),
                           (["--in-flight", "65"], "--in-flight 65: want 1 (skip) to 64"),
                           (["--in-flight-sizes", "4,lots"], "--in-flight-sizes: 'lots' is not a size")):
            p = subprocess.run([sys.executable, os.path.join(HERE, "compare.py"), "--no-doc"] + args,
                               capture_output=True, text=True, timeout=60)
            self.assertNotEqual(p.returncode, 0, args)
            self.assertIn(want, p.stderr)

    def test_gloo_worker_refuses_bad_iters(self):
        p = subprocess.run([sys.executable, os.path.join(HERE, "gloo_allreduce.py"), "--rank", "0", "--world", "2",
                            "--init", "tcp://127.0.0.1:1", "--sizes", "4", "--iters", "0"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--iters 0 must be >= 1", p.stderr)
        p = subprocess.run([sys.executable, os.path.join(HERE, "gloo_allreduce.py"), "--rank", "0", "--world", "2",
                            "--init", "tcp://127.0.0.1:1", "--sizes", "4", "--prewarm", "-2"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--prewarm -2 >= 0", p.stderr)
        p = subprocess.run([sys.executable, os.path.join(HERE, "gloo_allreduce.py"), "--rank", "0", "--world", "2",
                            "--init", "tcp://127.0.0.1:1", "--sizes", "4", "--in-flight", "0"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--in-flight 0: want 1 to 64", p.stderr)

    def test_gloo_worker_refuses_bad_size(self):
        p = subprocess.run([sys.executable, os.path.join(HERE, "gloo_allreduce.py"), "--rank", "0", "--world", "2",
                            "--init", "tcp://127.0.0.1:1", "--sizes", "4,big"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--sizes: 'big' is not a byte count", p.stderr)

    def test_free_port_outside_ephemeral_range(self):
        with open(runners.localports.PORT_RANGE_FILE) as f:
            lo, hi = (int(x) for x in f.read().split())
        ports = [runners.free_port() for _ in range(30)]
        for p in ports:
            self.assertFalse(lo <= p <= hi or p < runners.localports.MIN_PORT,
                             f"port {p} is in the ephemeral range {lo}-{hi} or below {runners.localports.MIN_PORT}")
        # Drawn at random from thousands: 30 draws all but never repeat.
        self.assertGreater(len(set(ports)), 25, ports)

    def test_tcp_bidir_moves_bytes_both_ways(self):
        port = runners.free_port()
        script = os.path.join(HERE, "tcp_bidir.py")
        lp = subprocess.Popen([sys.executable, script, "--listen", str(port), "--seconds", "0.3"],
                              stdout=subprocess.PIPE, text=True)
        try:
            c = subprocess.run([sys.executable, script, "--connect", str(port), "--seconds", "0.3"],
                               capture_output=True, text=True, timeout=60)
            lout, _ = lp.communicate(timeout=60)
        finally:
            if lp.poll() is None:
                lp.kill()
                lp.wait()
        self.assertEqual(c.returncode, 0, c.stderr)
        a, b = json.loads(lout), json.loads(c.stdout)
        self.assertEqual(a["recv_bytes"], b["sent_bytes"])
        self.assertEqual(b["recv_bytes"], a["sent_bytes"])
        self.assertGreater(a["recv_bytes"], 0)

    @unittest.skipUnless(shutil.which("gcc"), "gcc not installed")
    def test_c_probe_moves_bytes_both_ways_on_each_stream(self):
        binary = os.path.join(HERE, ".build", "tcp_bidir_test")
        os.makedirs(os.path.dirname(binary), exist_ok=True)
        subprocess.run(["gcc", "-O2", "-Wall", "-pthread", "-o", binary, os.path.join(HERE, "tcp_bidir.c")], check=True)
        got = runners.threaded_bidir([binary], 0.3, 60, streams=2)
        self.assertGreater(got["forward_GBps"], 0)
        self.assertGreater(got["reverse_GBps"], 0)
        p = subprocess.run([binary, "--connect", "1", "--seconds", "1", "--streams", "17"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--streams: want 1 to 16", p.stderr)

    def test_tcp_bidir_refuses_nonpositive_seconds(self):
        p = subprocess.run([sys.executable, os.path.join(HERE, "tcp_bidir.py"), "--connect", "1", "--seconds", "0"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--seconds 0.0: want more than 0", p.stderr)


class RSSGrowthTest(unittest.TestCase):
    def test_growth_needs_the_daemons_buffer_figure(self):
        fresh = [{"node": 0, "pid": 11, "private_bytes": 10, "buffer_bytes": 4},
                 {"node": 1, "pid": 12, "private_bytes": 10, "buffer_bytes": 4}]
        serving = [{"max_private_bytes": 14}, {"max_private_bytes": 18}]
        self.assertEqual(rss.growth_per_buffers(fresh, serving), 2.0)
        self.assertEqual([sv["growth_bytes"] for sv in serving], [4, 8])
        fresh[1]["buffer_bytes"] = None
        with self.assertRaises(runners.RunError) as cm:
            rss.growth_per_buffers(fresh, serving)
        self.assertIn("daemon 1 (pid 12) reports no ring.buffer_bytes", str(cm.exception))


# make test builds the daemon and names it in COLLECTIVED_BIN; by hand,
# bench/compare's build serves.
COLLECTIVED_BIN = os.environ.get("COLLECTIVED_BIN") or os.path.join(HERE, ".build", "collectived")


@unittest.skipUnless(os.access(COLLECTIVED_BIN, os.X_OK),
                     f"{COLLECTIVED_BIN} not built (make build, or run bench/compare once)")
class RSSTest(unittest.TestCase):
    def test_idle_serving_and_after_work(self):
        got = rss.measure(COLLECTIVED_BIN, settle_s=0.5)
        for when in ("fresh", "after_work"):
            self.assertEqual([s["node"] for s in got[when]], [0, 1])
            for s in got[when]:
                self.assertGreater(s["vmrss_bytes"], 1 << 20)
                self.assertEqual(s["memfds"], 0, f"{when}: daemon holds memfds with no trainer attached")
        self.assertEqual(got["max_rss_bytes"], max(s["vmrss_bytes"] for s in got["fresh"] + got["after_work"]))
        # While serving: sampled more than once, the 64 MiB segment seen in
        # the daemon's shared RSS, and the growth beyond it set against the
        # ring's buffers as the daemon reports them.
        for f, sv in zip(got["fresh"], got["serving"]):
            self.assertGreater(sv["samples"], 1)
            self.assertGreaterEqual(sv["max_shmem_bytes"], 64 << 20)
            self.assertGreater(f["buffer_bytes"], 1 << 20)
            self.assertEqual(sv["growth_bytes"], sv["max_private_bytes"] - f["private_bytes"])
        self.assertEqual(got["serving_growth_per_buffers"],
                         max(sv["growth_bytes"] / f["buffer_bytes"] for f, sv in zip(got["fresh"], got["serving"])))
        for s in got["fresh"]:  # the daemons were stopped by their PIDs
            self.assertFalse(os.path.exists(f"/proc/{s['pid']}/status") and _alive(s["pid"]), s["pid"])


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


if __name__ == "__main__":
    unittest.main()


class PyTrainerArgsTest(unittest.TestCase):
    """bench/py_trainer.py reads the flags `collectived bench` gives its trainers."""

    def setUp(self):
        sys.path.insert(0, HERE)
        import py_trainer
        self.t = py_trainer
        sys.path.remove(HERE)

    def test_go_durations(self):
        for s, want in [("0s", 0.0), ("200µs", 200e-6), ("200us", 200e-6), ("-1ns", -1e-9),
                        ("1m30s", 90.0), ("1.5ms", 1.5e-3)]:
            self.assertAlmostEqual(self.t.parse_duration(s), want, msg=s)
        with self.assertRaisesRegex(ValueError, r"duration '2 hours': want a Go duration"):
            self.t.parse_duration("2 hours")

    def test_inline_max_is_refused(self):
        # The Go client's option: the Python client has none, so a bench
        # asking for it is refused, not silently measured without it.
        p = subprocess.run([sys.executable, os.path.join(HERE, "py_trainer.py"), "--socket", "/nonexistent", "--job",
                            "j", "--sizes", "4", "--inline-max", "2048"], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--inline-max: the Python client has no such option; give 0", p.stderr)

    def test_bad_flags_are_refused_by_name(self):
        for flag, value, want in (("--sizes", "4,lots", "size 'lots': want bytes"),
                                  ("--spin", "2 hours", "duration '2 hours': want a Go duration"),
                                  ("--between", "1 GB", "size '1 GB': want bytes"),
                                  ("--in-flight", "0", "--in-flight 0: want 1 to 64"),
                                  ("--in-flight", "65", "--in-flight 65: want 1 to 64")):
            args = ["--socket", "/nonexistent", "--job", "j", "--sizes", "4", flag, value]
            p = subprocess.run([sys.executable, os.path.join(HERE, "py_trainer.py")] + args, capture_output=True,
                               text=True, timeout=60)
            self.assertEqual(p.returncode, 2, (flag, p.stderr))
            self.assertIn(want, p.stderr)
            self.assertNotIn("Traceback", p.stderr)

    def test_sizes(self):
        self.assertEqual([self.t.parse_size(s) for s in ("4", "64KiB", "1MiB")], [4, 65536, 1 << 20])
        with self.assertRaisesRegex(ValueError, r"size 'lots': want bytes"):
            self.t.parse_size("lots")


@unittest.skipUnless(_collectived_bin("--trainer-cmd"), "bin/collectived with bench --trainer-cmd not built (make build)")
class PyTrainerRealTest(unittest.TestCase):
    def test_python_trainers_in_bench(self):
        cmd = f"{sys.executable} {os.path.join(HERE, 'py_trainer.py')}"
        p = subprocess.run([_collectived_bin(), "bench", "--trainer-cmd", cmd, "--sizes", "4,1MiB", "--iters", "5",
                            "--warmup", "1", "--prewarm", "10", "--json"], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        self.assertEqual([(r["bytes"], r["path"], r["lane"], r["iters"], r["verified"], r["trainer_cmd"]) for r in rows],
                         [(4, "inline", True, 5, True, cmd), (1 << 20, "shm", True, 5, True, cmd)])
        self.assertTrue(all(r["median_us"] > 0 for r in rows))

    def test_python_trainers_with_calls_in_flight(self):
        # --in-flight 3: each iteration starts three allreduces (async) and
        # waits for them; every buffer is checked.
        cmd = f"{sys.executable} {os.path.join(HERE, 'py_trainer.py')}"
        p = subprocess.run([_collectived_bin(), "bench", "--trainer-cmd", cmd, "--sizes", "4,64KiB,1MiB",
                            "--iters", "5", "--warmup", "1", "--prewarm", "10", "--in-flight", "3", "--json"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        self.assertEqual([(r["bytes"], r["in_flight"], r["iters"], r["verified"]) for r in rows],
                         [(4, 3, 5, True), (65536, 3, 5, True), (1 << 20, 3, 5, True)])


class InFlightReportTest(unittest.TestCase):
    """Calls in flight together: collectived's Go and Python trainers, Gloo and OpenMPI TCP, in a section of
    their own."""

    def res(self):
        res = fake_res()
        k = 4
        res["in_flight"] = {"k": k, "sizes": [4, 65536], "iters": 200, "warmup": 50}
        for system, size, us in (("collectived", 4, 120.0), ("collectived-py", 4, 360.0), ("gloo", 4, 900.0),
                                 ("mpi-tcp", 4, 60.0), ("collectived", 65536, 400.0), ("gloo", 65536, 4000.0)):
            res["rows"].append({"system": report.in_flight_name(system, k), "world": 2, "bytes": size,
                                "median_us": us, "p99_us": us * 2, "algbw_GBps": 0.0, "busbw_GBps": 0.0,
                                "iters": 200})
        res["rows"].append({"system": "collectived-py", "world": 2, "bytes": 4, "median_us": 60.0, "p99_us": 90.0,
                            "algbw_GBps": 0.0, "busbw_GBps": 0.0, "iters": 30})
        return res

    def test_ratios_to_gloo_and_to_calls_one_at_a_time(self):
        rows = report.in_flight_rows(self.res())
        self.assertEqual([r["size"] for r in rows], [4, 65536])
        c, p = rows[0]["collectived"], rows[0]["collectived-py"]
        self.assertAlmostEqual(c["gloo"], 120.0 / 900.0)
        self.assertAlmostEqual(c["one"], 120.0 / (4 * 30.0))  # fake_res: collectived 4 B world 2 is 30 µs
        self.assertAlmostEqual(p["gloo"], 360.0 / 900.0)
        self.assertAlmostEqual(p["one"], 360.0 / (4 * 60.0))
        self.assertAlmostEqual(c["mpi-tcp"], 120.0 / 60.0)
        self.assertAlmostEqual(p["mpi-tcp"], 360.0 / 60.0)
        self.assertIsNone(rows[1]["collectived"]["mpi-tcp"])  # OpenMPI not measured at 64 KiB
        self.assertEqual(rows[1]["collectived-py"], {"us": None, "gloo": None, "mpi-tcp": None, "one": None})
        self.assertIsNone(rows[1]["collectived"]["one"])  # no 64 KiB row in the main tables

    def test_section_in_the_report_and_absent_without_the_measurement(self):
        md = report.markdown(self.res(), "bench")
        sec = md[md.index("## Calls in flight together"):]
        sec = sec[:sec.index("\n## ", 5)]
        self.assertIn("--in-flight 4", sec)
        self.assertIn("| 4 B | 120.0 | 0.13 | 2.00 | 1.00 | 360.0 | 0.40 | 6.00 | 1.50 | 900.0 | 60.0 |", sec)
        self.assertIn("| 64 KiB | 400.0 | 0.10 | - | - | - | - | - | - | 4000.0 | - |", sec)
        self.assertIn("MPI_Iallreduce", sec)
        self.assertIn("Calls in flight together (4), world 2", report.in_flight_text(self.res()))
        self.assertNotIn("## Calls in flight together", report.markdown(fake_res(), "bench"))
        self.assertEqual(report.in_flight_text(fake_res()), "")


class PythonTrainersReportTest(unittest.TestCase):
    """The collectived-py system: Python trainers against Gloo, in a section of their own."""

    def res(self):
        res = fake_res()
        for w, us, bus in ((2, 90.0, None), (4, 300.0, None)):
            res["rows"].append({"system": report.PYTHON_TRAINERS, "world": w, "bytes": 4, "median_us": us,
                                "p99_us": us * 2, "algbw_GBps": 4 / (us * 1e3), "busbw_GBps": 4 / (us * 1e3),
                                "iters": 30})
        return res

    def test_ratios_to_gloo_and_go_trainers(self):
        got = report.python_rows(self.res(), 2)
        self.assertEqual(len(got), 1)
        self.assertAlmostEqual(got[0]["lat_gloo"], 90.0 / 200.0)
        self.assertAlmostEqual(got[0]["lat_go"], 90.0 / 30.0)
        self.assertEqual(report.python_rows(self.res(), 4)[0]["lat_gloo"], None)  # no Gloo 4 B row in world 4

    def test_section_in_the_report_and_absent_without_rows(self):
        md = report.markdown(self.res(), "bench")
        sec = md[md.index("## Python trainers"):]
        sec = sec[:sec.index("\n## ", 5)]
        self.assertIn("| size | Python median µs | ÷ Gloo (latency) | ÷ Go trainers (latency) | busbw GB/s | "
                      "÷ Gloo (busbw) |", sec)
        self.assertIn("| 4 B | 90.0 | 0.45 | 3.00 |", sec)
        self.assertIn("--trainer-cmd", sec)
        self.assertNotIn("## Python trainers", report.markdown(fake_res(), "bench"))
        # The targets stay the Go trainers' own.
        self.assertEqual(verdicts(self.res()), verdicts(fake_res()))


class PythonTrainersCompareTest(unittest.TestCase):
    def test_missing_python_client_is_refused_with_the_way_out(self):
        p = subprocess.run([sys.executable, os.path.join(HERE, "compare.py"), "--no-doc", "--systems",
                            "collectived,collectived-py", "--python-client", "/nonexistent/python"],
                           capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--python-client /nonexistent/python: not an executable", p.stderr)
        self.assertIn("leave collectived-py out of --systems", p.stderr)

    def test_runner_passes_the_trainer_command(self):
        n = len(runners.COMMANDS)
        with self.assertRaises(runners.RunError):
            runners.collectived("/bin/false", 2, 1, [4], 1, 0, 5, trainer_cmd="py t.py")
        self.assertTrue(runners.COMMANDS[n].endswith("--json --trainer-cmd 'py t.py'"), runners.COMMANDS[n])


# --- the other collectives and the bfloat16 pairs (issue 25) -----------------

def coll_res(cvd_ag=1.0, mpi_ag=0.5, gloo_ag=0.4, cvd_rs=1.0, mpi_rs=0.5, bf16=(0.55, 0.58), gloo_rs=None):
    """fake_res with a collectives part as compare builds it: busbw at
    64 MiB (GB/s) of each system's allgather and reduce-scatter, one round;
    gloo_rs None: Gloo has no reduce_scatter. bf16: the pairs' ratios."""
    res = fake_res()
    rows = []

    def r(system, op, busbw):
        total = 2 * MIB64 if op == "allgather" else MIB64
        med = total / (busbw / 0.5) / 1e3
        return {"system": system, "op": op, "world": 2, "bytes": MIB64, "total_bytes": total, "iters": 20,
                "median_us": med, "p99_us": med * 1.5, "path": "shm"}
    rows = [r("collectived", "allgather", cvd_ag), r("mpi-tcp", "allgather", mpi_ag), r("gloo", "allgather", gloo_ag),
            r("collectived", "reducescatter", cvd_rs), r("mpi-tcp", "reducescatter", mpi_rs)]
    unsupported = {}
    if gloo_rs is None:
        unsupported = {"gloo": {"reducescatter": "ProcessGroupGloo does not support reduce_scatter"}}
    else:
        rows.append(r("gloo", "reducescatter", gloo_rs))
    pairs = [{"first": "float32" if i % 2 == 0 else "bfloat16",
              "float32": {"median_us": 100.0, "load": 1.0}, "bfloat16": {"median_us": 100.0 * x, "load": 1.0}}
             for i, x in enumerate(bf16)]
    c = {"ops": ["allgather", "reducescatter"], "sizes": [MIB64], "world": 2, "systems": list(compare.COLL_SYSTEMS),
         "iters": {"iters": 10, "warmup": 3, "prewarm": 5000},
         "bf16_pairs_per_round": len(bf16), "bf16_iters": {"iters": 30, "warmup": 5},
         "per_round": [{"rows": rows, "bf16_pairs": pairs}], "unsupported": unsupported}
    compare.aggregate_collectives(c)
    res["collectives"] = c
    return res


class CollectiveSizesTest(unittest.TestCase):
    def test_sizes_as_collectived_bench_takes_them(self):
        # allgather: each rank's block, the total the gathered vector;
        # reducescatter: the input, a multiple of the world in elements.
        self.assertEqual(runners.coll_bytes("allgather", MIB64, 2), (MIB64, 2 * MIB64))
        self.assertEqual(runners.coll_bytes("reducescatter", 100, 3), (96, 96))
        self.assertEqual(runners.coll_bytes("reducescatter", 4, 3), (12, 12))
        self.assertEqual(runners.coll_bytes("broadcast", 2, 2), (4, 4))
        self.assertEqual(runners.coll_bytes("allgather", 6, 2, elem=2), (6, 12))

    def test_busbw_by_nccl_conventions(self):
        for op, f in (("allreduce", 1.0), ("allgather", 0.5), ("reducescatter", 0.5), ("reduce", 1.0),
                      ("broadcast", 1.0)):
            self.assertEqual(runners.bus_factor(op, 2), f, op)
        self.assertEqual(runners.bus_factor("allgather", 4), 0.75)
        self.assertEqual(runners.bus_factor("broadcast", 1), 0.0)
        s = runners.coll_stats("allgather", 1000, 2000, [1000, 1000, 3000], 2)
        self.assertAlmostEqual(s["algbw_GBps"], 2.0)  # 2000 bytes in 1 µs
        self.assertAlmostEqual(s["busbw_GBps"], 1.0)
        self.assertEqual((s["bytes"], s["total_bytes"], s["median_us"]), (1000, 2000, 1.0))

    def test_wrong_sizes_are_errors(self):
        with self.assertRaises(runners.RunError) as cm:
            runners._expect_coll([{"bytes": 64, "total_bytes": 64}], "allgather", [64], 2, "x")
        self.assertIn("x: reported (bytes, total_bytes) [(64, 64)], want [(64, 128)]", str(cm.exception))


class CollectiveRunnersTest(unittest.TestCase):
    def fake(self, d, text):
        path = os.path.join(d, "fake")
        with open(path, "w") as f:
            f.write(f"#!{sys.executable}\nimport sys\nprint({text!r})\n")
        os.chmod(path, 0o755)
        return path

    def test_collectived_op_command_and_rows(self):
        row = '{"bytes": 64, "total_bytes": 128, "collective": "allgather", "median_us": 2, "verified": true}'
        with tempfile.TemporaryDirectory() as d:
            n = len(runners.COMMANDS)
            rows = runners.collectived_op(self.fake(d, row), "allgather", 2, 1, [64], 5, 1, 30, prewarm=7)
            self.assertEqual([(r["bytes"], r["world"]) for r in rows], [(64, 2)])
            self.assertIn("bench --op allgather --dtype float32 --nodes 2 --local 1 --sizes 64 --iters 5 --warmup 1 "
                          "--prewarm 7 --json", runners.COMMANDS[n])
            with self.assertRaises(runners.RunError) as cm:
                runners.collectived_op(self.fake(d, row), "reducescatter", 2, 1, [64], 5, 1, 30)
            self.assertIn("want [(64, 64)]", str(cm.exception))
            bf = '{"bytes": 64, "total_bytes": 64, "collective": "allreduce", "median_us": 2, "verified": true}'
            runners.collectived_op(self.fake(d, bf), "allreduce", 2, 1, [64], 5, 1, 30, dtype="bfloat16")
            self.assertIn("--op allreduce --dtype bfloat16", runners.COMMANDS[-1])

    def test_gloo_unsupported_is_said_not_failed(self):
        with tempfile.TemporaryDirectory() as d:
            fake = os.path.join(d, "fake_gloo.py")
            with open(fake, "w") as f:
                f.write("import json, sys\nif sys.argv[sys.argv.index('--rank') + 1] == '0':\n"
                        "    print(json.dumps({'op': 'reducescatter', 'unsupported': 'no such thing'}))\n")
            with self.assertRaises(runners.Unsupported) as cm:
                runners.gloo_op(sys.executable, fake, "reducescatter", 2, [64], 5, 1, 60)
            self.assertEqual(str(cm.exception), "no such thing")

    def test_collective_items_rotate_and_leave_out_the_unsupported(self):
        ops, systems = ["allgather", "reducescatter"], list(compare.COLL_SYSTEMS)
        r0 = compare.collective_items(ops, systems, 0, {})
        self.assertEqual(r0[:3], [("collectived", "allgather"), ("mpi-tcp", "allgather"), ("gloo", "allgather")])
        self.assertEqual(compare.collective_items(ops, systems, 1, {})[0], ("mpi-tcp", "allgather"))
        un = {"gloo": {"reducescatter": "no"}}
        got = compare.collective_items(ops, systems, 0, un)
        self.assertNotIn(("gloo", "reducescatter"), got)
        self.assertEqual(len(got), 5)
        self.assertEqual(compare.collective_items([], systems, 3, {}), [])
        with self.assertRaisesRegex(ValueError, "mpi-shm: no allgather measurement"):
            compare.measure_collective("mpi-shm", "allgather", [([4], 1, 0, 0)], {}, 10)

    def test_bf16_runs_alternate_which_dtype_is_first(self):
        self.assertEqual([compare.bf16_order(rnd, j)[0] for rnd in range(2) for j in range(2)],
                         ["float32", "bfloat16", "bfloat16", "float32"])
        calls = []

        def step(name, fn):
            calls.append(name)
            return [{"dtype": "bfloat16", "median_us": 50.0}, {"dtype": "float32", "median_us": 100.0}]
        pair = compare.bf16_pair(step, "p", ["bfloat16", "float32"], {}, 1, 30, 5, 0)
        self.assertEqual(calls, ["p"])  # one run, both dtypes
        self.assertEqual((pair["first"], pair["float32"]["median_us"], pair["bfloat16"]["median_us"]),
                         ("bfloat16", 100.0, 50.0))
        self.assertIsNone(compare.bf16_pair(lambda name, fn: None, "p", ["float32", "bfloat16"], {}, 1, 30, 5, 0))

    def test_alternate_dtype_rows_are_checked_for_both(self):
        rows = ('{"bytes": 64, "total_bytes": 64, "dtype": "float32", "collective": "allreduce", "median_us": 2, '
                '"verified": true}\n{"bytes": 32, "total_bytes": 32, "dtype": "bfloat16", "collective": "allreduce", '
                '"median_us": 1, "verified": true}')
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "fake")
            with open(path, "w") as f:
                f.write(f"#!{sys.executable}\nprint({rows!r})\n")
            os.chmod(path, 0o755)
            got = runners.collectived_op(path, "allreduce", 2, 1, [64], 5, 1, 30, alternate="bfloat16")
            self.assertEqual([r["dtype"] for r in got], ["float32", "bfloat16"])
            self.assertIn("--dtype float32 --alternate-dtype bfloat16", runners.COMMANDS[-1])
            with self.assertRaises(runners.RunError) as cm:
                runners.collectived_op(path, "allreduce", 2, 1, [128], 5, 1, 30, alternate="bfloat16")
            self.assertIn("want [(128, 128)]", str(cm.exception))

    def test_aggregate_median_of_rounds_and_paired_bf16(self):
        def row(med):
            return {"system": "mpi-tcp", "op": "allgather", "world": 2, "bytes": 1000, "total_bytes": 2000,
                    "iters": 5, "median_us": med, "p99_us": med * 2}

        def pair(f, b):
            return {"first": "float32", "float32": {"median_us": f}, "bfloat16": {"median_us": b}}
        c = {"per_round": [{"rows": [row(10.0)], "bf16_pairs": [pair(100.0, 60.0)]},
                           {"rows": [row(30.0)], "bf16_pairs": [pair(200.0, 100.0)]},
                           {"rows": [row(20.0)], "bf16_pairs": [pair(150.0, 60.0)]}]}
        compare.aggregate_collectives(c)
        (r,) = c["rows"]
        self.assertEqual((r["median_us"], r["p99_us"], r["total_bytes"]), (20.0, 40.0, 2000))
        self.assertAlmostEqual(r["busbw_GBps"], 2000 / 20e3 * 0.5)
        self.assertEqual([x["median_us"] for x in r["rounds"]], [10.0, 30.0, 20.0])
        # Each pair's own ratio (0.6, 0.5, 0.4), then their median; beside
        # it the ratio of the two medians (60 / 150).
        self.assertAlmostEqual(c["bf16"]["ratio"], 0.5)
        self.assertAlmostEqual(c["bf16"]["ratio_of_medians"], 0.4)
        self.assertEqual([p["round"] for p in c["bf16"]["pairs"]], [1, 2, 3])

    def test_compare_refuses_bad_collective_options(self):
        for args, want in ((["--collectives", "alltoall"], "--collectives: 'alltoall' is not one of"),
                           (["--collective-sizes", "4,lots"], "--collective-sizes: 'lots' is not a size"),
                           (["--bf16-pairs", "-1"], "--bf16-pairs -1: want 0 or more"),
                           (["--only", "collectives", "--collectives", "none", "--bf16-pairs", "0"],
                            "measures nothing"),
                           (["--only", "everything"], "invalid choice: 'everything'")):
            p = subprocess.run([sys.executable, os.path.join(HERE, "compare.py"), "--no-doc"] + args,
                               capture_output=True, text=True, timeout=60)
            self.assertNotEqual(p.returncode, 0, args)
            self.assertIn(want, p.stderr, args)


class CollectivesReportTest(unittest.TestCase):
    def test_targets_pass_fail_and_not_offered(self):
        v = {t["target"]: t["verdict"] for t in report.targets25(coll_res())}
        self.assertEqual(list(v.values()), ["PASS", "PASS", "PASS", "not offered", "PASS"], v)
        ts = report.targets25(coll_res(cvd_ag=1.0, mpi_ag=0.7, gloo_ag=0.67, cvd_rs=1.0, mpi_rs=0.67, gloo_rs=0.7,
                                       bf16=(0.61, 0.62)))
        self.assertEqual([t["verdict"] for t in ts], ["FAIL"] * 5, ts)
        self.assertAlmostEqual(ts[0]["value"], 1.0 / 0.7)
        self.assertAlmostEqual(ts[4]["value"], 0.615)
        un = report.targets25(coll_res())[3]
        self.assertIn("ProcessGroupGloo does not support reduce_scatter", un["note"])
        # Nothing measured: n/a, not a verdict.
        res = fake_res()
        self.assertEqual({t["verdict"] for t in report.targets25(res)}, {"n/a"})

    def test_text_and_markdown_say_what_gloo_lacks(self):
        res = coll_res()
        text = report.collectives_text(res)
        self.assertIn("Gloo does not offer reduce-scatter: ProcessGroupGloo does not support reduce_scatter", text)
        self.assertIn("64 MiB (x2)", text)
        self.assertIn("targets (issue 25)", text)
        md = report.markdown(res, "bench")
        self.assertIn("## Targets (issue 25)", md)
        self.assertIn("## Other collectives (world 2)", md)
        self.assertIn("### reduce-scatter", md)
        self.assertIn("**Gloo does not offer reduce-scatter**", md)
        self.assertIn("| 64 MiB | 1 | 0.5 | not offered | 2.00 | - |", md)
        self.assertIn("![allgather](bench/coll_allgather.png)", md)
        self.assertIn("## bfloat16 allreduce against float32", md)
        self.assertIn("**0.565** (target ≤ 0.6)", md)
        self.assertIn("--alternate-dtype bfloat16", md)
        self.assertIn("bench/compare --only collectives", md)
        self.assertNotIn("## Targets (issue 25)", report.markdown(fake_res(), "bench"))

    @unittest.skipUnless(subprocess.run([sys.executable, "-c", "import matplotlib"], capture_output=True).returncode == 0,
                         "no matplotlib")
    def test_a_plot_per_collective(self):
        with tempfile.TemporaryDirectory() as d:
            self.assertEqual(report.collectives_plots(coll_res(), d),
                             ["coll_allgather.png", "coll_reducescatter.png", "bf16_allreduce.png"])
            for name in os.listdir(d):
                self.assertGreater(os.path.getsize(os.path.join(d, name)), 1000)


@unittest.skipUnless(shutil.which("mpirun") and shutil.which("mpicc"), "OpenMPI not installed")
class MPICollectivesProgramTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.bin = os.path.join(HERE, ".build", "mpi_collectives_test")
        os.makedirs(os.path.dirname(cls.bin), exist_ok=True)
        subprocess.run(["mpicc", "-O2", "-Wall", "-o", cls.bin, os.path.join(HERE, "mpi_collectives.c")], check=True)

    def test_every_op_is_checked_and_parsed(self):
        # The program aborts on a wrong result; world 3 has a reduce-scatter
        # input that does not divide.
        for world in (2, 3):
            for op in ("allgather", "reducescatter", "reduce", "broadcast"):
                n = len(runners.COMMANDS)
                rows = runners.mpi_op(self.bin, "mpi-tcp", op, world, [4, 100, 65536], 3, 1, 120, prewarm=5)
                want = [runners.coll_bytes(op, s, world) for s in (4, 100, 65536)]
                self.assertEqual([(r["bytes"], r["total_bytes"]) for r in rows], want, (op, world))
                self.assertTrue(all(r["iters"] == 3 and r["median_us"] > 0 for r in rows))
                self.assertTrue(runners.COMMANDS[n].endswith(f"mpi_collectives_test {op} 4,100,65536 3 1 5"))

    def test_bad_op_and_counts_are_refused_by_name(self):
        for args, want in ((["gather", "4", "5", "1"], 'OP "gather": want allgather, reducescatter, reduce or '
                                                       'broadcast'),
                           (["allgather", "4", "0", "1"], 'ITERS "0": want a whole number from 1'),
                           (["allgather", "4x", "5", "1"], 'size "4x" is not a byte count')):
            p = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "1", self.bin] + args,
                               capture_output=True, text=True, timeout=60)
            self.assertNotEqual(p.returncode, 0, args)
            self.assertIn(want, p.stderr, args)


@unittest.skipUnless(_torch_python(), "no torch in /usr/bin/python3 (scripts/setup.sh installs python3-torch)")
class GlooCollectivesProgramTest(unittest.TestCase):
    script = os.path.join(HERE, "gloo_collectives.py")

    def test_allgather_reduce_broadcast_rows_and_no_reduce_scatter(self):
        for op in ("allgather", "reduce", "broadcast"):
            rows = runners.gloo_op("/usr/bin/python3", self.script, op, 2, [4, 4096], 3, 1, 300, prewarm=5)
            self.assertEqual([(r["bytes"], r["total_bytes"]) for r in rows],
                             [runners.coll_bytes(op, s, 2) for s in (4, 4096)], op)
        # torch 1.13's Gloo: reduce_scatter raises "not supported"; a newer
        # one may have it, and then its rows are checked like the others.
        try:
            rows = runners.gloo_op("/usr/bin/python3", self.script, "reducescatter", 2, [4096], 3, 1, 300)
            self.assertEqual([r["bytes"] for r in rows], [4096])
        except runners.Unsupported as e:
            self.assertIn("does not support reduce_scatter", str(e))

    def test_bad_op_is_refused(self):
        p = subprocess.run(["/usr/bin/python3", self.script, "--op", "gather", "--rank", "0", "--world", "2",
                            "--init", "tcp://127.0.0.1:1", "--sizes", "4"], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("invalid choice: 'gather'", p.stderr)


@unittest.skipUnless(_collectived_bin("--reduce"), "bin/collectived with bench --op COLLECTIVE not built (make build)")
class CollectivedOpRealTest(unittest.TestCase):
    def test_real_allgather_and_reducescatter_rows(self):
        for op, sizes in (("allgather", [4, 65536]), ("reducescatter", [4, 100, 65536])):
            rows = runners.collectived_op(_collectived_bin("--reduce"), op, 2, 1, sizes, 3, 1, 120, prewarm=10)
            self.assertEqual([(r["bytes"], r["total_bytes"]) for r in rows],
                             [runners.coll_bytes(op, s, 2) for s in sizes], op)
            self.assertTrue(all(r["verified"] and r["busbw_GBps"] > 0 for r in rows))


class SplicedSectionsTest(unittest.TestCase):
    def test_sections_of_other_programs_survive_a_rewrite(self):
        ddp = ("<!-- ddp-step: begin (bench/ddp_step.py) -->\n## DDP training step\n\n| a |\n"
               "<!-- ddp-step: end -->\n")
        old = "# Benchmarks\n\nold figures\n\n" + ddp
        got = report.keep_spliced(old, "# Benchmarks\n\nnew figures\n")
        self.assertEqual(got, "# Benchmarks\n\nnew figures\n\n" + ddp)
        self.assertEqual(report.keep_spliced(got, got), got)  # kept once
        self.assertEqual(report.keep_spliced("", "x\n"), "x\n")
        self.assertEqual(report.keep_spliced("<!-- a: begin (p) -->\nno end", "x\n"), "x\n")


# --- the ResNet-50 step (issue 27): tensors files, runners, bench/named_step.py ---

SHAPES = os.path.join(HERE, "resnet50_shapes.txt")


def _tensors_file(d, n=3):
    """A small tensors file: n tensors of 2x3, 5 and 7x1x2."""
    shapes = ["2x3", "5", "7x1x2"]
    path = os.path.join(d, "t.txt")
    with open(path, "w") as f:
        f.write("# test\n" + "".join(f"t{i}.weight {shapes[i % 3]}\n" for i in range(n)))
    return path


class TensorsFileTest(unittest.TestCase):
    def test_parse(self):
        self.assertEqual(tensors.parse("# c\n\nconv.weight 64x3x7x7\n  bn.bias  64 \n"),
                         [("conv.weight", (64, 3, 7, 7)), ("bn.bias", (64,))])
        self.assertEqual(tensors.numel((64, 3, 7, 7)), 9408)
        self.assertEqual(tensors.shape_text((64, 3, 7, 7)), "64x3x7x7")

    def test_what_is_no_tensor_is_refused_by_line(self):
        for text, want in (("a 4\nb 2\na 1\n", "f:3: a again (first on line 1): names are unique"),
                           ("a 4 x\n", 'f:1: want "name shape"'),
                           ("a 4x0\n", "f:1: a: shape '4x0': want 1 to 8 dimensions of at least 1"),
                           ("a 4xb\n", "f:1: a: shape '4xb' is not dimensions joined by x"),
                           ("a " + "x".join(["1"] * 9) + "\n", "want 1 to 8 dimensions"),
                           ("n" * 256 + " 4\n", "is 256 bytes, at most 255"),
                           ("# none\n", "f: no tensors")):
            with self.assertRaises(ValueError) as cm:
                tensors.parse(text, "f")
            self.assertIn(want, str(cm.exception))

    def test_resnet50_is_161_tensors_of_25557032_parameters(self):
        ts = tensors.read(SHAPES)
        self.assertEqual((len(ts), sum(tensors.numel(s) for _, s in ts)), (161, 25_557_032))
        self.assertEqual((ts[0], ts[-2], ts[-1]), (("conv1.weight", (64, 3, 7, 7)), ("fc.weight", (1000, 2048)),
                                                  ("fc.bias", (1000,))))
        # The committed file is what the script writes from the architecture.
        self.assertEqual(resnet50_shapes.build(), ts)
        with open(SHAPES) as f:
            self.assertEqual(f.read(), resnet50_shapes.text(ts))
        # Every stage's first block has its projection; 53 convolutions, 53 batch norms, the fc.
        names = [n for n, _ in ts]
        self.assertEqual([n for n in names if "downsample.0" in n],
                         [f"layer{i}.0.downsample.0.weight" for i in range(1, 5)])
        self.assertEqual(sum(n.endswith(".weight") and len(s) == 4 for n, s in ts), 53)
        self.assertEqual(sum(n.endswith(".bias") for n in names), 54)

    def test_check_agrees_with_torchvision_where_installed(self):
        # --check compares with torchvision.models.resnet50() when it imports.
        p = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "resnet50_shapes.py"), "--check"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("161 tensors, 25,557,032 parameters", p.stdout)


class StepRunnersTest(unittest.TestCase):
    def fake(self, d, lines):
        path = os.path.join(d, "fake_collectived")
        with open(path, "w") as f:
            f.write(f"#!{sys.executable}\nimport sys\nprint({lines!r})\n")
        os.chmod(path, 0o755)
        return path

    STEP = '{"bytes": 60, "calls": 3, "named": true, "order": "random", "median_us": 3, "verified": true}'
    CONCAT = '{"bytes": 60, "calls": 1, "concat": true, "median_us": 2, "verified": true}'

    def test_collectived_step_argv_and_rows(self):
        with tempfile.TemporaryDirectory() as d:
            n = len(runners.COMMANDS)
            rows = runners.collectived_step(self.fake(d, self.STEP + "\n" + self.CONCAT), 2, 2, "t.txt", 3, 5, 1, 30,
                                            prewarm=7, seed=4)
            self.assertEqual([(r["calls"], r["world"]) for r in rows], [(3, 4), (1, 4)])
            self.assertIn("bench --nodes 2 --local 2 --tensors t.txt --iters 5 --warmup 1 --prewarm 7 --json --named "
                          "--seed 4 --concat", runners.COMMANDS[n])
            runners.collectived_step(self.fake(d, self.STEP + "\n" + self.CONCAT), 2, 1, "t.txt", 3, 5, 1, 30,
                                     extra_config=named_step.UNFUSED_CONFIG)
            self.assertIn("--concat --extra-config 'fusion: {threshold_bytes: 0}'", runners.COMMANDS[-1])

    def test_collectived_step_rows_must_be_what_was_asked(self):
        ordered = self.STEP.replace('"named": true, ', "")
        for out, kw, want in ((self.STEP, {}, "rows of [3] calls, want [3, 1]"),
                              (self.CONCAT + "\n" + self.STEP, {}, "rows of [1, 3] calls, want [3, 1]"),
                              (ordered + "\n" + self.CONCAT, {}, "rows say named False"),
                              (self.STEP + "\n" + self.CONCAT, {"named": False}, "rows say named True"),
                              (self.STEP + "\n" + self.CONCAT.replace("60", "64"), {}, "rows of [60, 64] bytes")):
            with tempfile.TemporaryDirectory() as d:
                with self.assertRaises(runners.RunError) as cm:
                    runners.collectived_step(self.fake(d, out), 2, 1, "t.txt", 3, 5, 1, 30, **kw)
                self.assertIn(want, str(cm.exception))

    def test_gloo_worker_refuses_bad_tensors_flags(self):
        with tempfile.TemporaryDirectory() as d:
            good = _tensors_file(d)
            bad = os.path.join(d, "bad.txt")
            with open(bad, "w") as f:
                f.write("a 4x0\n")
            for args, want in ((["--sizes", "4", "--tensors", good], "give --sizes or --tensors"),
                               ([], "give --sizes or --tensors"),
                               (["--tensors", good, "--in-flight", "2"], "--in-flight and --tensors"),
                               (["--tensors", bad], "--tensors: " + bad + ":1: a: shape '4x0'")):
                p = subprocess.run([sys.executable, os.path.join(HERE, "gloo_allreduce.py"), "--rank", "0",
                                    "--world", "2", "--init", "tcp://127.0.0.1:1"] + args,
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(p.returncode, 2, args)
                self.assertIn(want, p.stderr)


@unittest.skipUnless(_torch_python(), "no torch in /usr/bin/python3 (scripts/setup.sh installs python3-torch)")
class GlooStepTest(unittest.TestCase):
    def test_step_of_tensors_one_by_one(self):
        with tempfile.TemporaryDirectory() as d:
            row = runners.gloo_step("/usr/bin/python3", os.path.join(HERE, "gloo_allreduce.py"), 2, _tensors_file(d, 4),
                                    4, 3, 1, 300)
        # 2x3 + 5 + 7x1x2 + 2x3 elements of float32
        self.assertEqual((row["bytes"], row["calls"], row["iters"], row["tensors"]), (4 * 31, 4, 3, "t.txt"))
        self.assertGreater(row["median_us"], 0)


@unittest.skipUnless(_collectived_bin("--tensors"), "bin/collectived with bench --tensors not built (make build)")
class CollectivedStepRealTest(unittest.TestCase):
    def test_ordered_step_and_concatenation(self):
        with tempfile.TemporaryDirectory() as d:
            rows = runners.collectived_step(_collectived_bin("--tensors"), 2, 1, _tensors_file(d, 4), 4, 3, 1, 120,
                                            named=False, prewarm=10)
        self.assertEqual([(r["bytes"], r["calls"], r.get("order"), r.get("concat", False), r["verified"])
                          for r in rows], [(124, 4, "file", False, True), (124, 1, None, True, True)])


def _step_res(named=True, gloo=True):
    """Results of named_step.measure: 2 rounds of world 2, and of world 4
    whose Gloo run failed in round 2."""
    runs = []
    for rnd, (step, concat, g) in enumerate(((110.0, 100.0, 400.0), (130.0, 100.0, 300.0)), start=1):
        runs.append({"round": rnd, "world": 2, "system": "collectived", "load_before": 1.0, "load_after": 2.0,
                     "rows": [{"median_us": step * 1e3, "calls": 161, "named": named},
                              {"median_us": concat * 1e3, "calls": 1, "concat": True}]})
        if gloo:
            runs.append({"round": rnd, "world": 2, "system": "gloo", "load_before": 2.0, "load_after": 2.5,
                         "rows": [{"median_us": g * 1e3, "calls": 161}]})
        runs.append({"round": rnd, "world": 2, "system": named_step.UNFUSED, "load_before": 1.0, "load_after": 2.0,
                     "rows": [{"median_us": step * 2e3, "calls": 161, "named": named},
                              {"median_us": concat * 1e3, "calls": 1, "concat": True}]})
    runs.append({"round": 1, "world": 4, "system": "collectived", "load_before": 1.0, "load_after": 2.0,
                 "rows": [{"median_us": 200e3, "calls": 161, "named": named,
                           "daemon_named": {"rounds": 9, "executed": 322, "fused_ops": 4,
                                            "cache": {"hits": 300, "misses": 22}}},
                          {"median_us": 160e3, "calls": 1, "concat": True}]})
    return {"date": "2026-12-03 00:00:00 UTC", "took_s": 60,
            "machine": {"nproc": 2, "loadavg_start": "1.0 1.0 1.0 1/1 1", "loadavg_end": "2.0 1.0 1.0 1/1 1"},
            "settings": {"tensors": "bench/resnet50_shapes.txt", "n_tensors": 161, "bytes": 102228128, "rounds": 2,
                         "worlds": [2, 4], "iters": 10, "warmup": 2, "prewarm": 1000, "named": named,
                         "order": "random", "seed": 1, "commit": "abc1234", "dirty": False, "torch": "1.13"},
            "runs": runs, "errors": ["round 2, world 4, gloo: exit 1"],
            "commands": ["bench/.build/collectived bench --nodes 2 --local 1 --tensors t",
                         "for r in ...; do gloo --init tcp://127.0.0.1:31234 ...; done",
                         "for r in ...; do gloo --init tcp://127.0.0.1:31999 ...; done"]}


class NamedStepReportTest(unittest.TestCase):
    def test_ratios_are_each_rounds_pair_and_their_median(self):
        s = named_step.summarize(_step_res())
        w2 = s[2]
        self.assertEqual(w2["step_ms"]["rounds"], [110.0, 130.0])
        self.assertEqual(w2["fusion"]["pairs"], [1.1, 1.3])
        self.assertAlmostEqual(w2["fusion"]["ratio"], 1.2)
        self.assertAlmostEqual(w2["vs_gloo"]["ratio"], statistics.median([110 / 400, 130 / 300]))
        self.assertAlmostEqual(w2["vs_gloo"]["ratio_of_medians"], 120 / 350)
        self.assertNotIn("vs_gloo", s[4])  # no Gloo run in world 4
        self.assertAlmostEqual(s[4]["fusion"]["ratio"], 1.25)
        # Fusion off: its own run's ratio, and the fused step over it.
        u = w2["unfused"]
        self.assertEqual(u["step_ms"]["rounds"], [220.0, 260.0])
        self.assertEqual(u["fusion_pairs"], [2.2, 2.6])
        self.assertEqual(u["fused_over_unfused"], [0.5, 0.5])
        self.assertNotIn("unfused", s[4])

    def test_verdicts(self):
        res = _step_res()
        self.assertEqual(named_step.verdict(res, 1.15, "fusion"), "PASS")
        self.assertEqual(named_step.verdict(res, 1.2, "fusion"), "FAIL")
        self.assertEqual(named_step.verdict(res, 0.35, "gloo"), "PASS")
        self.assertEqual(named_step.verdict(res, None, "gloo"), "not measured")
        # Ordered calls check the harness; they are not the target's measurement.
        self.assertEqual(named_step.verdict(_step_res(named=False), 1.0, "fusion"), "not the target (ordered calls)")

    def test_markdown_and_splice(self):
        md = named_step.markdown(_step_res())
        self.assertTrue(md.startswith(named_step.BEGIN + "\n## Named calls and fusion (ResNet-50 step)\n"))
        self.assertTrue(md.endswith(named_step.END + "\n"))
        self.assertIn("| 2 | 120.0 ms (110.0-130.0) | 100.0 ms (100.0-100.0) | 350.0 ms (300.0-400.0) | **1.20x** "
                      "(1.10, 1.30; of medians 1.20) | <= 1.15 | **FAIL** |", md)
        self.assertIn("| <= 0.35 | **not measured** |", md)
        self.assertIn("| 2 | 240.0 ms (220.0-260.0) | 100.0 ms (100.0-100.0) | **2.40x** (2.20, 2.60) | "
                      "**0.50x** (0.50, 0.50) |", md)
        self.assertIn("| 1 | 4 | 9 | 322 | 4 | 300 | 22 |", md)
        self.assertIn("the concatenated ÷ Gloo's step: 0.29x in world 2 (medians; want <= 0.35)", md)
        self.assertNotIn("No run fused anything", md)
        res = _step_res()
        res["runs"][-1]["rows"][0]["daemon_named"]["fused_ops"] = 0
        self.assertIn("No run fused anything", named_step.markdown(res))
        self.assertIn("- round 2, world 4, gloo: exit 1", md)
        self.assertIn("tcp://127.0.0.1:PORT", md)
        self.assertEqual(md.count("tcp://127.0.0.1:PORT"), 1)  # one line for the runs that differ by port only
        self.assertIn("**ordered** calls", named_step.markdown(_step_res(named=False)))
        # Spliced between its markers, or appended; bench/compare keeps it.
        old = "# Benchmarks\n\nx\n"
        once = named_step.splice(old, md)
        self.assertEqual(once, old + "\n" + md)
        self.assertEqual(named_step.splice(once, md), once)
        self.assertEqual(named_step.splice(once.replace("**FAIL**", "old"), md), once)
        self.assertEqual(report.keep_spliced(once, "# Benchmarks\n\nnew\n"), "# Benchmarks\n\nnew\n\n" + md)

    def test_text_and_args(self):
        t = named_step.text(_step_res())
        self.assertIn("world 2: step 120.0 ms, concatenated 100.0 ms, Gloo 350.0 ms; fusion 1.20x (want <= 1.15) "
                      "FAIL", t)
        self.assertIn("world 4: step 200.0 ms, concatenated 160.0 ms, Gloo failed; fusion 1.25x", t)
        self.assertIn("fusion off: step 240.0 ms, 2.40x its concatenation, fused step / unfused 0.50x", t)
        self.assertEqual(named_step.parse_worlds("2, 4"), [2, 4])
        with self.assertRaises(SystemExit) as cm:
            named_step.parse_worlds("3")
        self.assertIn("--worlds: '3'", str(cm.exception))
        self.assertEqual([named_step.order(r, w) for r in (0, 1) for w in (0, 1)],
                         [["collectived", "gloo"], ["gloo", "collectived"], ["gloo", "collectived"],
                          ["collectived", "gloo"]])
        u = named_step.UNFUSED
        self.assertEqual([named_step.order(r, 0, True) for r in range(3)],
                         [["collectived", u, "gloo"], [u, "gloo", "collectived"], ["gloo", "collectived", u]])
        p = subprocess.run([sys.executable, os.path.join(HERE, "named_step.py"), "--iters", "0", "--no-doc"],
                           capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--iters 0: want at least 1", p.stderr)
