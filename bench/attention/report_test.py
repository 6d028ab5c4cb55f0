# CPU test of report.py on the fixtures in testdata/ (no GPU, no torch).
#   python3 report_test.py
import json, os, subprocess, sys, unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import report  # noqa: E402

DATA = os.path.join(HERE, "testdata")


def load(name):
    with open(os.path.join(DATA, name)) as f:
        return json.load(f)


def rows(text, heading):
    """The table rows (split into cells) under `heading`."""
    lines = text.splitlines()
    i = lines.index(heading)
    out = []
    for line in lines[i + 1:]:
        if line.startswith("### "):
            break
        if line.startswith("| ") and not line.startswith("| shape"):
            out.append([c.strip() for c in line.strip("|").split("|")])
    return out


class ReportTest(unittest.TestCase):
    def setUp(self):
        self.ours = load("ours.json")
        self.anchors = report.load_anchors(os.path.join(DATA, "anchors.jsonl"))

    def test_forward_and_backward_tables(self):
        text = report.render(self.ours, self.anchors)
        fwd = rows(text, "### forward")
        bwd = rows(text, "### backward (FLOPs = 2.5 x forward)")
        self.assertEqual([r[0] for r in fwd], ["a_causal", "b_dense"])
        self.assertEqual([r[0] for r in bwd], ["a_causal", "b_dense", "c_cross"])
        # a_causal forward: better anchor varlen 6 ms over kforge 4 ms.
        self.assertEqual(fwd[0][2:], ["4000.0", "500.0", "6000.0", "8000.0", "1.50x"])
        # Backward against the anchors' bwd_ms: 16 ms / 20 ms.
        self.assertEqual(bwd[0][2:], ["20000.0", "250.0", "16000.0", "40000.0", "0.80x"])
        # Nothing verified: no time, no ratio; Flex failed: "-".
        self.assertEqual(bwd[1][1:], ["none verified", "-", "-", "9000.0", "-", "-"])
        # varlen_attn has no backward figure there: Flex is the better anchor.
        self.assertEqual(bwd[2][4:], ["-", "2000.0", "2.00x"])
        self.assertIn("forward geomean speedup vs the better anchor: 1.50x over 2 shapes", text)
        # sqrt(0.8 * 2.0) = 1.26
        self.assertIn("backward geomean speedup vs the better anchor: 1.26x over 2 shapes", text)

    def test_rows_without_op_are_forward(self):
        old = load("ours_fwd_only_old.json")
        text = report.render(old, self.anchors)
        self.assertIn("### forward", text)
        self.assertNotIn("### backward", text)
        self.assertEqual(rows(text, "### forward")[0][-1], "1.50x")

    def test_forward_only_anchors(self):
        fwd_only = {k: {m: {"fwd_ms": v["fwd_ms"]} if "fwd_ms" in v else v for m, v in r.items()
                        if isinstance(v, dict)} | {"shape": k} for k, r in self.anchors.items()}
        text = report.render(self.ours, fwd_only)
        self.assertIn("anchors.py ran with FWD_ONLY", text)
        self.assertTrue(all(r[-1] == "-" for r in rows(text, "### backward (FLOPs = 2.5 x forward)")))

    def test_command_line(self):
        out = subprocess.run([sys.executable, os.path.join(HERE, "report.py"),
                              os.path.join(DATA, "ours.json"), os.path.join(DATA, "anchors.jsonl")],
                             capture_output=True, text=True, check=True).stdout
        self.assertTrue(out.startswith("GPU: NVIDIA H200 (sm_90a)"))
        # A missing anchors file is no anchors, not an error.
        out = subprocess.run([sys.executable, os.path.join(HERE, "report.py"),
                              os.path.join(DATA, "ours.json"), "/nonexistent/anchors.jsonl"],
                             capture_output=True, text=True, check=True).stdout
        self.assertIn("| c_cross | bwd_mma", out)


if __name__ == "__main__":
    unittest.main()
