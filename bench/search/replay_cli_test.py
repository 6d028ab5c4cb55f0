# CPU test of kforge-search-replay end to end, on a synthetic table (never
# a measurement): kforge-bench-attn --list-candidates --variants all lists
# the space of the fixture shapes (the bench's own enumeration), this script
# gives every setting a made-up outcome and time, and the replay must run the
# real builtin proposer over it with restart checks on, propose nothing
# outside it, and report the counts in its JSON.
#   python3 replay_cli_test.py path/to/kforge-bench-attn path/to/kforge-search-replay
import json, math, os, shutil, subprocess, sys, tempfile, unittest

HERE = os.path.dirname(os.path.abspath(__file__))
LENGTHS = os.path.join(HERE, "..", "attention", "testdata", "lengths.json")
BENCH = REPLAY = None


def synthetic(variant):
    """A made-up outcome and time: smooth in the knobs, one template faster."""
    k = variant["knobs"]
    if k.get("MIN_BLOCKS") == 4 and k.get("STAGES") == 1:
        return {"outcome": "compile_error", "error": "synthetic"}
    us = 40.0 if variant["template"] == "fwd_sm90" else 60.0
    for name, v in sorted(k.items()):
        us += abs(math.log2(1 + v) - 2.7) * (3 if name.startswith("BLOCK") else 1)
    return {"outcome": "verified", "us": us, "us_q1": us * 0.99, "us_q3": us * 1.01}


class ReplayCliTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def test_replays_the_bench_space(self):
        listed = os.path.join(self.tmp, "listed.json")
        r = subprocess.run([BENCH, "--lengths", LENGTHS, "--list-candidates", "--variants", "all",
                            "--out", listed], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(listed) as f:
            sweep = json.load(f)
        for shape in sweep["shapes"]:
            for v in shape["variants"]:
                v.update(synthetic(v))
        path = os.path.join(self.tmp, "sweep.json")
        with open(path, "w") as f:
            json.dump(sweep, f)
        out = os.path.join(self.tmp, "replay.json")
        r = subprocess.run([REPLAY, "--sweep", path, "--lengths", LENGTHS, "--seeds", "2",
                            "--max-evaluations", "40", "--check-restarts", "--json", out],
                           capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out) as f:
            got = {s["shape"]: s for s in json.load(f)}
        self.assertEqual(set(got), {s["shape"] for s in sweep["shapes"]})
        for shape in sweep["shapes"]:
            g = got[shape["shape"]]
            self.assertEqual(g["space"], len(shape["variants"]))
            best = min(v["us"] for v in shape["variants"] if v["outcome"] == "verified")
            self.assertAlmostEqual(g["best_us"], best)
            self.assertEqual(len(g["runs"]), 2)
            keys = {json.dumps([v["template"], v["knobs"]], sort_keys=True) for v in shape["variants"]}
            for run in g["runs"]:
                self.assertEqual(run["evaluations"], 40)
                self.assertEqual(len(set(run["proposed"])), 40)
                for p in run["proposed"]:
                    tmpl, knobs = p.split(" ", 1)
                    self.assertIn(json.dumps([tmpl, json.loads(knobs)], sort_keys=True), keys)
            for s in g["summary"]:
                self.assertIn(s["target"], (0.02, 0.05))
                self.assertGreaterEqual(s["within"], 1)
        # The table on stdout names every shape.
        for name in got:
            self.assertIn(f"| {name} |", r.stdout)

    def test_refuses_a_sweep_without_outcomes(self):
        listed = os.path.join(self.tmp, "listed.json")
        subprocess.run([BENCH, "--lengths", LENGTHS, "--list-candidates", "--variants", "all",
                        "--out", listed], check=True, capture_output=True, timeout=120)
        r = subprocess.run([REPLAY, "--sweep", listed, "--lengths", LENGTHS], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertIn("no known outcome", r.stderr)


if __name__ == "__main__":
    BENCH, REPLAY = sys.argv.pop(1), sys.argv.pop(1)
    unittest.main()
