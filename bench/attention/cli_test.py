# CPU test of kforge-bench-attn's command line: --help, argument validation
# (before any GPU work) and --list-candidates, which builds each shape's
# candidates from the catalog without a GPU.
#   python3 cli_test.py path/to/kforge-bench-attn
import json, os, shutil, subprocess, sys, tempfile, unittest

HERE = os.path.dirname(os.path.abspath(__file__))
LENGTHS = os.path.join(HERE, "testdata", "lengths.json")
BIN = None


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120)


def listing(*args):
    """{(op, shape): [candidate labels]} from --list-candidates."""
    r = run("--lengths", LENGTHS, "--list-candidates", *args)
    assert r.returncode == 0, r.stderr
    out, key = {}, None
    for line in r.stdout.splitlines():
        if line.startswith("  "):
            out[key].append(line.strip())
        else:
            op, shape = line.split(":")[0].split()
            key = (op, shape)
            out[key] = []
    return out


class CliTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def test_help(self):
        r = run("--help")
        self.assertEqual(r.returncode, 0)
        for word in ("--op", "fwd|bwd|both", "--templates", "--list-candidates", "--trace-dir"):
            self.assertIn(word, r.stdout)

    def test_bad_arguments_exit_2_with_the_reason(self):
        for args, why in [(["--op", "backward"], "--op must be fwd, bwd or both"),
                          (["--reps", "0"], "--reps must be an integer"),
                          (["--reps", "20x"], "--reps must be an integer"),
                          (["--variants", "every"], "--variants must be default, sweep or all"),
                          (["--jobs", "0"], "--jobs must be an integer in 1..256"),
                          (["--cool-ms", "-1"], "--cool-ms must be an integer in 0..60000"),
                          (["--cool-ms", "1s"], "--cool-ms must be an integer in 0..60000"),
                          (["--templates", "fwd_mma,bwd_nope"], "bwd_nope is not in this build's catalog"),
                          (["--lengths"], "--lengths needs a value"),
                          (["--trace-dir"], "--trace-dir needs a value"),
                          (["--frobnicate"], "unknown argument --frobnicate")]:
            r = run(*args)
            self.assertEqual(r.returncode, 2, args)
            self.assertIn(why, r.stderr, args)

    def test_unreadable_lengths(self):
        r = run("--lengths", "/nonexistent/lengths.json", "--list-candidates")
        self.assertEqual(r.returncode, 1)
        self.assertIn("cannot read", r.stderr)

    def test_default_op_is_forward(self):
        got = listing()
        self.assertEqual(sorted(op for op, _ in got), ["fwd", "fwd"])
        for labels in got.values():
            self.assertTrue(labels)
            self.assertTrue(all(l.startswith("fwd_") for l in labels), labels)

    def test_backward_candidates_come_from_the_bwd_templates(self):
        got = listing("--op", "bwd")
        self.assertEqual(set(got), {("bwd", "tiny_causal"), ("bwd", "tiny_d64_cross")})
        for labels in got.values():
            self.assertTrue(all(l.startswith("bwd_") for l in labels), labels)
            self.assertEqual(len(labels), len(set(labels)))
        # bwd_mma's knob space is small: the sweep is all of it (2 x 3 x 2), but its
        # DET=1 settings, which only deterministic shapes are tuned over.
        self.assertEqual(len([l for l in got[("bwd", "tiny_causal")] if l.startswith("bwd_mma ")]), 12)
        # --variants default: each template's defaults only, the served default first.
        got = listing("--op", "bwd", "--variants", "default")
        # The served backward default first: on sm_90a bwd_sm90 where sequences
        # average 64 keys or more or pack (both tiny shapes do), then bwd_mma's.
        # tiny_causal is a causal batch of few (sequence, kv head) groups: ORDER=0.
        self.assertEqual(got[("bwd", "tiny_causal")],
                         ["bwd_sm90 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=1 ORDER=0 SPLIT=0 STAGES=2 TMA=1", "bwd_mma BLOCK_M=32 BLOCK_N=64 DET=0 MIN_BLOCKS=1"])
        # (head dim 64: 128 query rows a step)
        self.assertEqual(got[("bwd", "tiny_d64_cross")][0], "bwd_sm90 BLOCK_M=128 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=1 ORDER=1 SPLIT=0 STAGES=2 TMA=1")
        self.assertTrue(got[("bwd", "tiny_d64_cross")][1].startswith("bwd_mma "))

    def test_settings_add_candidates_over_the_defaults(self):
        got = listing("--op", "bwd", "--variants", "default", "--templates", "bwd_sm90", "--only", "tiny_causal",
                      "--settings", "bwd_sm90:ORDER=1")
        self.assertEqual(got[("bwd", "tiny_causal")],
                         ["bwd_sm90 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=1 ORDER=0 SPLIT=0 STAGES=2 TMA=1",
                          "bwd_sm90 BLOCK_M=64 BLOCK_N=128 CSKIP=1 DET=0 DQW=0 DQZ=1 DQ_DIRECT=0 HELP=0 KVFIRST=0 KVSTORE=1 ORDER=1 SPLIT=0 STAGES=2 TMA=1"])
        for bad, why in (("bwd_sm90", "has no 'template:'"), ("bwd_sm90:ORDER", "is not KNOB=INTEGER"),
                         ("bwd_sm90:ORDER=x", "is not KNOB=INTEGER")):
            r = run("--list-candidates", "--settings", bad)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn(why, r.stderr + r.stdout)

    def test_both_and_the_per_op_template_filter(self):
        got = listing("--op", "both", "--templates", "fwd_mma", "--only", "tiny_causal")
        self.assertEqual(set(got), {("fwd", "tiny_causal"), ("bwd", "tiny_causal")})
        self.assertTrue(all(l.startswith("fwd_mma ") for l in got[("fwd", "tiny_causal")]))
        # The list names no backward template: the backward keeps them all.
        self.assertTrue(got[("bwd", "tiny_causal")])
        got = listing("--op", "both", "--templates", "bwd_mma,fwd_mma", "--variants", "default")
        self.assertTrue(all(l.startswith("bwd_mma ") for (op, _), ls in got.items() if op == "bwd" for l in ls))

    def test_all_is_every_setting_the_templates_accept(self):
        out = os.path.join(self.tmp, "list.json")
        got = listing("--variants", "all", "--out", out)
        with open(out) as f:
            listed = {(s["op"], s["shape"]): s for s in json.load(f)["shapes"]}
        self.assertEqual(set(listed), set(got))
        for key, labels in got.items():
            self.assertEqual(len(labels), len(set(labels)), key)
            shape = listed[key]
            # The JSON is the run's layout: every setting with its template and knobs.
            self.assertEqual([v["variant"] for v in shape["variants"]], labels)
            space = shape["space"]
            self.assertEqual(space["kept"], len(labels))
            for name, t in space["templates"].items():
                self.assertEqual(t["product"], t["kept"] + t["refused_validate"] + t["refused_check"])
                self.assertEqual(t["kept"], sum(v["template"] == name for v in shape["variants"]))
            mma = [v["knobs"] for v in shape["variants"] if v["template"] == "fwd_mma"]
            # fwd_mma: 2 x 3 x 2 x 2 x 2 x 4 x 2 x 2 settings, half of them with
            # BLOCK_M != 16 * WARPS (refused); every other one fits at D <= 128.
            self.assertEqual(space["templates"]["fwd_mma"]["product"], 768)
            self.assertEqual(len(mma), 384)
            self.assertTrue(all(k["BLOCK_M"] == 16 * k["WARPS"] for k in mma))
            sm90 = [v["knobs"] for v in shape["variants"] if v["template"] == "fwd_sm90"]
            # 5 BLOCK_N x 3 STAGES x 2 PERSISTENT x 3 ORDER x 2 PACK x 3 QAHEAD; ORDER>=1,
            # PACK=1 and QAHEAD>=1 need the persistent grid, PACK=1 a BLOCK_N of 128 or more,
            # QAHEAD=2 and ORDER=2 no PACK, QAHEAD=2 a second Q buffer in shared memory.
            self.assertEqual(space["templates"]["fwd_sm90"]["product"], 540)
            self.assertTrue(all(k["PERSISTENT"] == 1 and k["PACK"] == 0
                                for k in sm90 if k["ORDER"] == 2))
            # ORDER=2 is ORDER=0's persistent unpacked settings on the grouped list
            self.assertEqual(sum(k["ORDER"] == 2 for k in sm90),
                             sum(k["ORDER"] == 0 and k["PERSISTENT"] == 1 and k["PACK"] == 0
                                 for k in sm90))
            self.assertTrue(all(k["PERSISTENT"] == 1 for k in sm90 if k["QAHEAD"] >= 1))
            self.assertTrue(all(k["PACK"] == 0 for k in sm90 if k["QAHEAD"] == 2))
            if shape["head_dim"] == 128:  # BLOCK_N > 176 spills at D = 128, and smem caps the rest
                self.assertTrue(all(k["BLOCK_N"] <= 176 for k in sm90))
                self.assertTrue(all(k["BLOCK_N"] == 128 for k in sm90 if k["PACK"] == 1))
                # (QAHEAD>=1 spills past BLOCK_N 128 there)
                self.assertTrue(all(k["BLOCK_N"] <= 128 for k in sm90 if k["QAHEAD"] >= 1))
                # QAHEAD=2: BLOCK_N 64 (STAGES 2-4), 96 (2-3), 128 (2) x ORDER 0/1/2; ORDER=2: 23
                self.assertEqual(len(sm90), 82)
            else:
                # QAHEAD=2: every BLOCK_N and STAGES x ORDER 0/1/2; ORDER=2: 45
                self.assertEqual(len(sm90), 186)
        # The served default is one of the settings: the search starts inside the table.
        defaults = listing("--variants", "default")
        for key, labels in defaults.items():
            self.assertIn(labels[0], got[key])
        # No "+grouped" manifest edits: knob settings only.
        self.assertFalse(any("+grouped" in l for ls in got.values() for l in ls))

    def test_all_for_backward(self):
        got = listing("--op", "bwd", "--variants", "all")
        for labels in got.values():
            self.assertGreaterEqual(len([l for l in labels if l.startswith("bwd_mma ")]), 12)

    def test_arch_without_a_template(self):
        # No template compiles for this target: no candidates, not an error.
        got = listing("--op", "bwd", "--arch", "sm_70")
        self.assertEqual(got[("bwd", "tiny_causal")], [])


if __name__ == "__main__":
    BIN = sys.argv.pop(1)
    unittest.main()
