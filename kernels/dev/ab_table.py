# Prints kforge-bench-attn's ours.json as one row per (shape, op) and one
# column per variant (µs; "x" = not verified), each variant's ratio to the
# first column's. For A/B runs of knob settings (--settings) in one call.
# usage: python3 ab_table.py ours.json [ours2.json ...]
import json, sys

rows, cols = {}, []
for path in sys.argv[1:]:
    for sh in json.load(open(path))["shapes"]:
        key = (sh["shape"], sh.get("op", "fwd"))
        for v in sh.get("variants", []):
            label = v.get("variant", "?")
            if label not in cols:
                cols.append(label)
            ok = v.get("outcome", "verified") == "verified" and v.get("us", 0) > 0
            rows.setdefault(key, {})[label] = v["us"] if ok else None

def short(label):
    return label.replace("bwd_sm90 ", "").replace("BLOCK_N=128 ", "").replace("STAGES=2 ", "")

for i, c in enumerate(cols):
    print(f"c{i}: {c}")
print("| shape | op | " + " | ".join(f"c{i}" for i in range(len(cols))) + " |")
print("|---|---|" + "---|" * len(cols))
for (shape, op), r in rows.items():
    base = r.get(cols[0])
    cells = []
    for c in cols:
        us = r.get(c)
        if us is None:
            cells.append("x" if c in r else "")
        elif base:
            cells.append(f"{us:.1f} ({base / us:.3f})")
        else:
            cells.append(f"{us:.1f}")
    print(f"| {shape} | {op} | " + " | ".join(cells) + " |")
