# Prints kforge-bench-attn's ours.json one row per (shape, op): the first
# variant (the defaults) in µs, then each other variant's µs and the ratio
# first / other (> 1: the other is faster), whatever the labels. For
# --settings A/B runs whose defaults differ from shape to shape.
# usage: python3 ab_pairs.py ours.json
import json, sys

for sh in json.load(open(sys.argv[1]))["shapes"]:
    vs = sh.get("variants", [])
    if not vs:
        continue
    def us(v):
        ok = v.get("outcome", "verified") == "verified" and v.get("us", 0) > 0
        return v["us"] if ok else None
    base = us(vs[0])
    cells = [f"{base:.1f}" if base else "x"]
    for v in vs[1:]:
        u = us(v)
        cells.append("x" if u is None else f"{u:.1f} ({base / u:.3f})" if base else f"{u:.1f}")
    print(f"| {sh['shape']} | {sh.get('op', 'fwd')} | " + " | ".join(cells) + " |")
    for v in vs:
        print(f"|   | | {v.get('variant', '?')} |")
