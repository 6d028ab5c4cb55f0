# Ratio table: kforge's best verified forward per shape against the better
# anchor (varlen_attn FA2, FlexAttention) measured in the same run.
#   python3 report.py ours.json anchors.jsonl
import json, math, os, sys

ours = json.load(open(sys.argv[1]))
anchors = {}
if len(sys.argv) > 2 and os.path.exists(sys.argv[2]):
    for line in open(sys.argv[2]):
        r = json.loads(line); anchors[r["shape"]] = r

def fwd(r, key):
    v = (r or {}).get(key, {})
    return v.get("fwd_ms") * 1e3 if isinstance(v, dict) and "fwd_ms" in v else None

print(f"GPU: {ours.get('gpu')} ({ours.get('arch')})\n")
print("| shape | kforge best variant | kforge µs | kforge TFLOP/s | varlen_attn µs | Flex µs | vs better anchor |")
print("|---|---|---|---|---|---|---|")
ratios = []
for s in ours["shapes"]:
    b = s["best"]; a = anchors.get(s["shape"])
    va, fl = fwd(a, "varlen_attn_fa2"), fwd(a, "flex_docmask")
    best_anchor = min([x for x in (va, fl) if x], default=None)
    ratio = best_anchor / b["us"] if best_anchor and b["us"] else None
    if ratio: ratios.append(ratio)
    f = lambda x: f"{x:.1f}" if x else "-"
    print(f"| {s['shape']} | {b['variant'] or 'none verified'} | {f(b['us'])} | {f(b['tflops'])} | {f(va)} | {f(fl)} | "
          f"{(f'{ratio:.2f}x') if ratio else '-'} |")
if ratios:
    print(f"\ngeomean speedup vs the better anchor: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x over {len(ratios)} shapes")
