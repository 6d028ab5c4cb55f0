"""The length rule drawn in C++ (core/lengths.h, through kforge_draw_lengths)
and in Python (python/kforge/lengths.py) gives identical lengths for the same
seed and shape, and both refuse the same malformed shapes with the same words.

    python3 cross_language_test.py PATH/TO/kforge_draw_lengths
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.environ.get("KFORGE_REPO") or os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
sys.path.insert(0, os.path.join(REPO, "python"))
from kforge import lengths  # noqa: E402

TOOL = None
SEEDS = [0, 1, 7, 12345, (1 << 64) - 1]

# Corners of the rule beyond the public shapes: tiny and huge alpha (the
# clamp at both ends), one-value ranges, lengths of 0, the int32 limit,
# empty batches, cross with every kind, and shapes the rule refuses.
EDGES = [
    {"B": 64, "q": {"dist": "pareto", "alpha": 0.05, "lo": 1, "hi": 2147483647}, "kv": "same"},
    {"B": 64, "q": {"dist": "pareto", "alpha": 50, "lo": 17, "hi": 4096}},
    {"B": 64, "q": {"dist": "pareto", "alpha": 1.2, "lo": 9, "hi": 9}},
    {"B": 64, "q": {"dist": "uniform", "lo": 0, "hi": 1}, "kv": {"dist": "uniform", "lo": 0, "hi": 2147483647}},
    {"B": 64, "q": {"dist": "uniform", "lo": 5, "hi": 5}, "kv": {"dist": "pareto", "alpha": 0.7, "lo": 1, "hi": 100000}},
    {"B": 0, "q": {"dist": "uniform", "lo": 1, "hi": 10}, "kv": {"dist": "fixed", "hi": 3}},
    {"batch": 3, "q": {"dist": "fixed", "hi": 0}, "kv": {"dist": "uniform", "hi": 4}},
    {"B": 2, "q": {"dist": "normal", "hi": 3}},
    {"B": 2, "q": {"dist": "uniform", "lo": 5, "hi": 3}},
    {"B": 2, "q": {"dist": "pareto", "lo": 1, "hi": 9}},
    {"B": 2, "q": {"dist": "fixed", "hi": 3}, "kv": "other"},
    {"B": -1, "q": {"dist": "fixed", "hi": 3}},
]


def cpp(shapes, seed):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(shapes, f)
    try:
        out = subprocess.run([TOOL, f.name, str(seed)], check=True, capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    return json.loads(out.stdout)


def py(shapes, seed):
    out = []
    for s in shapes:
        try:
            lq, lk = lengths.draw_shape_lengths(s, seed)
            out.append({"lq": lq, "lk": lk})
        except ValueError as e:
            out.append({"error": str(e)})
    return out


class CrossLanguage(unittest.TestCase):
    def check(self, shapes):
        for seed in SEEDS:
            got_cpp, got_py = cpp(shapes, seed), py(shapes, seed)
            self.assertEqual(len(got_cpp), len(shapes))
            for i, (c, p) in enumerate(zip(got_cpp, got_py)):
                self.assertEqual(c, p, f"shape {i} ({shapes[i].get('name', shapes[i])}), seed {seed}")

    def test_public_shapes_draw_identical_batches(self):
        with open(os.path.join(REPO, "bench", "shapes.json")) as f:
            shapes = json.load(f)
        self.check(shapes)
        wide = os.path.join(REPO, "bench", "shapes_wide.json")  # the shape classes beyond them
        if os.path.exists(wide):
            with open(wide) as f:
                self.check(json.load(f))
        # Not trivially equal: the batches are jagged and depend on the seed.
        lq1 = py(shapes, 1)[1]["lq"]
        self.assertGreater(len(set(lq1)), 100)
        self.assertNotEqual(lq1, py(shapes, 2)[1]["lq"])

    def test_corner_cases_and_refusals_agree(self):
        self.check(EDGES)
        drawn = py(EDGES, 1)
        self.assertEqual(max(drawn[0]["lq"]), 2147483647, "tiny alpha reaches the cap")
        self.assertIn("error", drawn[7])


class PythonRule(unittest.TestCase):
    def test_generator_is_splitmix64(self):
        r = lengths.SplitMix64(0)
        self.assertEqual([r.next() for _ in range(3)],
                         [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F])

    def test_same_keys_are_none(self):
        lq, lk = lengths.draw_shape_lengths({"B": 3, "q": {"dist": "fixed", "hi": 4}, "kv": "same"})
        self.assertEqual((lq, lk), ([4, 4, 4], None))


if __name__ == "__main__":
    TOOL = sys.argv.pop(1)
    unittest.main()
