#!/usr/bin/env python3
"""Summarises a tuning run from its kforge SQLite database (as left by
tests/e2e/gpu_tune_shapes.sh): per bucket, the time from the job's start to
the first verified kernel, to the first one within 5% of the bucket's final
best, the evaluations used, and the served best; then the worker's
throughput (verified evaluations a minute) and where an evaluation's time
went (the evaluator's "prepare X s, run Y s" in each verified message).

    tests/e2e/tune_report.py tune.db
"""
import re
import sqlite3
import sys


def main(path):
    db = sqlite3.connect(path)
    start = db.execute("SELECT MIN(created) FROM jobs").fetchone()[0]
    rows = db.execute(
        "SELECT e.bucket, e.outcome, e.median_us, e.created, v.template, v.knobs "
        "FROM evaluations e JOIN tasks t ON t.id = CAST(substr(e.task, 2) AS INTEGER) "
        "JOIN variants v ON v.id = e.variant WHERE t.kind = 'evaluate' ORDER BY e.id").fetchall()
    best = {b: (v, us) for b, v, us in db.execute(
        "SELECT bucket, variant, median_us FROM best")}
    buckets = {}
    for bucket, outcome, us, created, template, knobs in rows:
        buckets.setdefault(bucket, []).append((outcome, us, (created - start) / 1000.0))
    print(f"{'bucket':<74} {'evals':>5} {'first ok s':>10} {'<=5% s':>7} {'best us':>9} {'served us':>9}")
    for bucket, evals in buckets.items():
        ok = [(us, t) for o, us, t in evals if o == "verified"]
        first = min((t for _, t in ok), default=None)
        final = min((us for us, _ in ok), default=None)
        near = min((t for us, t in ok if final and us <= 1.05 * final), default=None)
        served = best.get(bucket, (None, None))[1]
        fmt = lambda x, spec: "-" if x is None else format(x, spec)
        print(f"{bucket:<74} {len(evals):>5} {fmt(first, '10.1f')} {fmt(near, '7.1f')} "
              f"{fmt(final, '9.1f')} {fmt(served, '9.1f')}")
    print("\nserved variants:")
    for bucket, template, knobs, us in db.execute(
            "SELECT b.bucket, v.template, v.knobs, b.median_us FROM best b "
            "JOIN variants v ON v.id = b.variant ORDER BY b.bucket"):
        print(f"  {bucket}: {template} {knobs} {us:.1f} us")


    all_rows = db.execute("SELECT outcome, created, message FROM evaluations").fetchall()
    if all_rows:
        span_min = (max(r[1] for r in all_rows) - start) / 60000.0
        verified = sum(1 for r in all_rows if r[0] == "verified")
        phases = [tuple(map(float, m.groups())) for m in
                  (re.search(r"prepare ([0-9.]+) s, run ([0-9.]+) s", r[2]) for r in all_rows) if m]
        print(f"\n{len(all_rows)} results ({verified} verified) in {span_min:.1f} min: "
              f"{verified / span_min if span_min > 0 else 0:.1f} verified a minute")
        kinds = {}
        for kind, outcome in db.execute(
                # evaluations.task holds the task id as the API names it ("t" + row id).
                "SELECT t.kind, e.outcome FROM evaluations e JOIN tasks t ON 't' || t.id = e.task"):
            k = kinds.setdefault(kind, [0, 0])
            k[0] += 1
            k[1] += outcome == "verified"
        if kinds:
            # Evaluations are what a tuning run is for; confirmations and
            # re-timings (with their sanitizer gates) are what promotion costs.
            print("by task kind: " + ", ".join(f"{k} {n} ({v} verified)"
                                               for k, (n, v) in sorted(kinds.items())))
            ev = kinds.get("evaluate", [0, 0])[1]
            print(f"verified evaluations: {ev / span_min if span_min > 0 else 0:.1f} a minute")
        by_outcome = {}
        for r in all_rows:
            by_outcome[r[0]] = by_outcome.get(r[0], 0) + 1
        print("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(by_outcome.items())))
        if phases:
            print(f"evaluator phases over {len(phases)} evaluations: prepare (inputs + reference) "
                  f"mean {sum(p[0] for p in phases) / len(phases):.2f} s, run (checks + timing) "
                  f"mean {sum(p[1] for p in phases) / len(phases):.2f} s")


if __name__ == "__main__":
    main(sys.argv[1])
