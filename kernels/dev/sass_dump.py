# One line per SASS instruction of an Nsight Compute source page (CSV, as
# profile_bwd.sh writes it, optionally gzipped): index, stall samples,
# instructions executed, the instruction, and its top three stall reasons.
import csv, gzip, sys
rows = list(csv.reader((gzip.open if sys.argv[1].endswith(".gz") else open)(sys.argv[1], "rt", errors="replace")))
hi = next(i for i, r in enumerate(rows) if "Source" in r)
head, body = rows[hi], rows[hi + 1:]
ix = {c: i for i, c in enumerate(head)}
def n(r, c):
    try: return float(r[ix[c]].replace(",", ""))
    except (ValueError, KeyError, IndexError): return 0.0
reasons = [c for c in head if c.startswith("stall_") and "Not Issued" not in c]
for k, r in enumerate(body):
    s = n(r, "Warp Stall Sampling (All Samples)")
    top = sorted(((n(r, c), c[6:]) for c in reasons), reverse=True)[:3]
    tops = " ".join(f"{c}:{v:.0f}" for v, c in top if v > 0)
    print(f"{k:5d} {s:8.0f} {n(r,'Instructions Executed'):10.0f}  {r[ix['Source']][:90]:90} {tops}")
