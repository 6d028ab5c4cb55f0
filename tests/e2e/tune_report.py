#!/usr/bin/env python3
"""Summarises a tuning run from its kforge SQLite database (as left by
tests/e2e/gpu_tune_shapes.sh): per bucket, the time from the job's start to
the first verified kernel, to the first one within 5% of the bucket's final
best, the evaluations used, and the served best.

    tests/e2e/tune_report.py tune.db
"""
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


if __name__ == "__main__":
    main(sys.argv[1])
