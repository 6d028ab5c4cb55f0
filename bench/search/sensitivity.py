# How much the builtin proposer's figures depend on the model's fixed
# priors, and what choosing them on the tables would buy: each
# configuration below (the defaults, then one prior moved at a time) is
# replayed on every table; then, leaving one shape out at a time, the
# configuration with the best worst case on the other shapes is "chosen"
# and scored on the shape left out. If the defaults do as well on every
# left-out shape as the chosen one, tuning the priors on these tables would
# only fit them.
#   python3 sensitivity.py REPLAY SWEEP LENGTHS SHAPES OUT_DIR [--seeds 5] [--noise 1]
# REPLAY: kforge-search-replay; SHAPES: comma-separated table names.
# Prints a markdown table; writes each configuration's replay JSON to OUT_DIR.
import argparse, json, os, subprocess

CONFIGS = [
    ("defaults", []),
    ("template_level 0.25", ["--template-level", "0.25"]),
    ("template_level 1", ["--template-level", "1"]),
    ("across_templates 0", ["--across-templates", "0"]),
    ("across_templates 0.5", ["--across-templates", "0.5"]),
    ("theta_start 0.5", ["--theta-start", "0.5"]),
    ("theta_start 2", ["--theta-start", "2"]),
    ("explore 0.1", ["--explore", "0.1"]),
]
TARGET = 0.05


def run(args, name, extra):
    out = os.path.join(args.out_dir, name.replace(" ", "_") + ".json")
    if not os.path.exists(out):
        subprocess.run([args.replay, "--sweep", args.sweep, "--lengths", args.lengths, "--only",
                        args.shapes, "--seeds", str(args.seeds), "--noise", str(args.noise),
                        "--max-evaluations", str(args.max_evaluations), "--json", out, *extra],
                       check=True, stdout=subprocess.DEVNULL)
    worst = {}
    with open(out) as f:
        shapes = json.load(f)
    for shape in shapes:
        s = next(x for x in shape["summary"] if abs(x["target"] - TARGET) < 1e-9)
        worst[shape["shape"]] = s["worst_fraction"] if not s["never"] else float("inf")
    return worst


def main():
    p = argparse.ArgumentParser()
    for a in ("replay", "sweep", "lengths", "shapes", "out_dir"):
        p.add_argument(a)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--noise", type=float, default=1)
    p.add_argument("--max-evaluations", type=int, default=120)
    args = p.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    shapes = args.shapes.split(",")
    results = {name: run(args, name, extra) for name, extra in CONFIGS}
    pct = lambda x: "never" if x == float("inf") else f"{100 * x:.1f}%"
    print(f"Worst evaluations to {100 * TARGET:g}% over seeds, as a fraction of the space:\n")
    print("| configuration | " + " | ".join(shapes) + " |")
    print("|---|" + "---|" * len(shapes))
    for name, _ in CONFIGS:
        print(f"| {name} | " + " | ".join(pct(results[name].get(s, float("inf"))) for s in shapes) + " |")
    print("\nLeave one shape out: the configuration with the best worst case on the others, on the one left out:\n")
    print("| left out | chosen | chosen on it | defaults on it |")
    print("|---|---|---|---|")
    for held in shapes:
        others = [s for s in shapes if s != held]
        # Ties keep the earlier configuration (the defaults first).
        chosen = min((name for name, _ in CONFIGS),
                     key=lambda n: (max(results[n].get(s, float("inf")) for s in others),
                                    [c for c, _ in CONFIGS].index(n)))
        print(f"| {held} | {chosen} | {pct(results[chosen].get(held, float('inf')))} | "
              f"{pct(results['defaults'].get(held, float('inf')))} |")


if __name__ == "__main__":
    main()
