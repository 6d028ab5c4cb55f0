# Regression check of the builtin proposer against the measured tables kept
# in tables/ (H200, 2026-12-01; README.md): every complete table must be
# within 5% of its exhaustive best within 15% of its space (60 of 402
# evaluations) in every seed, over the templates the tables measured. When
# their knob space no longer matches the tables (a template gained or lost a
# setting), the test is
# skipped with the reason: the tables measure the old space, and the answer
# is a new sweep (sweep.sh), not a failing build.
#   python3 goal_test.py path/to/kforge-search-replay
import gzip, json, os, shutil, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TABLE = os.path.join(HERE, "tables", "h200-d128-fwd-2026-12-01")
COMPLETE = "powerlaw_short,above_tile_causal,hstu_imbal_causal,longq_shortk_cross,gdpa_self"
SKIP = 77


def main(replay):
    tmp = tempfile.mkdtemp()
    try:
        paths = {}
        for part, name in (("sweep", ".json.gz"), ("lengths", ".lengths.json.gz")):
            paths[part] = os.path.join(tmp, part + ".json")
            with gzip.open(TABLE + name, "rb") as src, open(paths[part], "wb") as dst:
                shutil.copyfileobj(src, dst)
        out = os.path.join(tmp, "replay.json")
        # The space the tables measured: their templates (the catalog may have
        # gained others since, e.g. fwd_stream after the 2026-12-01 sweep).
        with open(paths["sweep"]) as f:
            swept = json.load(f)
        templates = sorted({v["template"] for shape in swept["shapes"] for v in shape["variants"]})
        r = subprocess.run([replay, "--sweep", paths["sweep"], "--lengths", paths["lengths"],
                            "--only", COMPLETE, "--templates", ",".join(templates),
                            "--seeds", "3", "--noise", "1",
                            "--max-evaluations", "60", "--json", out],
                           capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            if "is not in" in r.stderr and "table" in r.stderr:
                print(f"skipped: the catalog's space differs from the tables': {r.stderr.strip()}")
                return SKIP
            print(r.stderr, file=sys.stderr)
            return 1
        print(r.stdout)
        failed = []
        with open(out) as f:
            shapes = json.load(f)
        for shape in shapes:
            s5 = next(s for s in shape["summary"] if abs(s["target"] - 0.05) < 1e-9)
            if s5["never"] or s5["worst"] > 0.15 * shape["space"]:
                failed.append(f"{shape['shape']}: worst {s5['worst']} evaluations"
                              f"{' (never, in 60)' if s5['never'] else ''}")
        if failed:
            print("not within 5% using at most 15% of the space: " + "; ".join(failed), file=sys.stderr)
            return 1
        return 0
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
