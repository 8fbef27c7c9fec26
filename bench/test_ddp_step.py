"""bench/ddp_step.py's report, on made-up results: the ratio and verdicts,
the rounds' ratios, and the section it writes into docs/BENCHMARKS.md
(replaced between its markers, the rest of the file kept)."""

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ddp_step  # noqa: E402


def _res(c10m, g10m, c30k, g30k):
    def run(a, b):
        return {"10M": {"params": 9968128, "step_s": a}, "30K": {"params": 29466, "step_s": b}}
    return {"date": "2026-12-03 00:00:00 UTC", "took_s": 1, "machine": {"nproc": 2, "load": [1, 1, 1]},
            "settings": {"rounds": len(c10m), "warmup": 1, "steps_10m": 3, "steps_30k": 3,
                         "torch": "1.13"},
            "runs": {"collectived": [run(a, b) for a, b in zip(c10m, c30k)],
                     "gloo": [run(a, b) for a, b in zip(g10m, g30k)]}}


class TestReport(unittest.TestCase):
    def test_summary_and_verdicts(self):
        res = _res([[0.5, 0.6, 0.7], [0.4, 0.5, 0.9]], [[1.0, 1.0, 1.0], [0.8, 0.8, 0.8]],
                   [[0.01, 0.01, 0.01]] * 2, [[0.01, 0.02, 0.03]] * 2)
        s = ddp_step.summarize(res)
        self.assertAlmostEqual(s["10M"]["collectived"]["median"], 0.55)  # medians 0.6 and 0.5
        self.assertAlmostEqual(s["10M"]["gloo"]["median"], 0.9)
        self.assertAlmostEqual(s["10M"]["ratio"], 0.55 / 0.9)
        self.assertEqual([round(p, 3) for p in s["10M"]["pairs"]], [0.6, 0.625])
        self.assertAlmostEqual(s["30K"]["ratio"], 0.5)
        md = ddp_step.markdown(res, "bench/ddp_step.png")
        self.assertIn("| 10M | 9,968,128 | 550.00 ms (500.00-600.00) | 900.00 ms", md)
        self.assertIn("| 0.61x | 0.60, 0.62 | <= 0.75x | **PASS** |", md)
        self.assertIn("| 30K | 29,466 |", md)
        self.assertIn("| 0.50x | 0.50, 0.50 | <= 0.6x | **PASS** |", md)
        fail = ddp_step.markdown(_res([[1.0]], [[1.0]], [[1.0]], [[1.0]]), "p.png")
        self.assertEqual(fail.count("**FAIL**"), 2)

    def test_section_replaced_between_markers(self):
        res = _res([[0.5]], [[1.0]], [[0.01]], [[0.02]])
        with tempfile.TemporaryDirectory() as d:
            doc = os.path.join(d, "BENCHMARKS.md")
            with open(doc, "w") as f:
                f.write("# Benchmarks\n\nbefore\n")
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                self.skipTest("no matplotlib")
            ddp_step.write_doc(res, doc)
            ddp_step.write_doc(_res([[0.6]], [[1.0]], [[0.01]], [[0.02]]), doc)
            text = open(doc).read()
            self.assertTrue(text.startswith("# Benchmarks\n\nbefore\n"))
            self.assertEqual(text.count(ddp_step.BEGIN), 1)
            self.assertIn("0.60x", text)
            self.assertNotIn("0.50x |", text.split("30K")[0])
            self.assertTrue(os.path.exists(os.path.join(d, "bench", "ddp_step.png")))


if __name__ == "__main__":
    unittest.main()
