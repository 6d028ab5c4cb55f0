# The source page of an Nsight Compute report (CSV, as profile_bwd.sh writes
# it, optionally gzipped), read once:
#   sass_dump.py page.csv[.gz]          one line per SASS instruction: index,
#                                       stall samples, instructions executed,
#                                       the instruction, its top three reasons
#   sass_dump.py --summary page.csv     the stall totals by reason, then the
#                                       60 instructions with the most samples
import csv, gzip, sys

summary = sys.argv[1] == "--summary"
path = sys.argv[-1]
rows = list(csv.reader((gzip.open if path.endswith(".gz") else open)(path, "rt", errors="replace")))
hi = next((i for i, r in enumerate(rows) if "Source" in r), None)
if hi is None:
    sys.exit(f"no source table in {path}: " + " | ".join(",".join(r)[:200] for r in rows[:5]))
head, body = rows[hi], rows[hi + 1:]
ix = {c: i for i, c in enumerate(head)}
SAMPLES = "Warp Stall Sampling (All Samples)"


def n(r, c):
    try:
        return float(r[ix[c]].replace(",", ""))
    except (ValueError, KeyError, IndexError):
        return 0.0


reasons = [c for c in head if c.startswith("stall_") and "Not Issued" not in c]


def line(k, r):
    top = sorted(((n(r, c), c[6:]) for c in reasons), reverse=True)[:3]
    tops = " ".join(f"{c}:{v:.0f}" for v, c in top if v > 0)
    return f"{k:5d} {n(r, SAMPLES):8.0f} {n(r, 'Instructions Executed'):10.0f}  {r[ix['Source']][:90]:90} {tops}"


if summary:
    print("stall samples by reason:")
    totals = sorted(((sum(n(r, c) for r in body), c) for c in [SAMPLES] + reasons), reverse=True)
    for v, c in totals:
        print(f"  {v:12.0f}  {c}")
    print(f"\ntop instructions by {SAMPLES}:")
    for k, r in sorted(enumerate(body), key=lambda kr: -n(kr[1], SAMPLES))[:60]:
        print(line(k, r))
else:
    for k, r in enumerate(body):
        print(line(k, r))
