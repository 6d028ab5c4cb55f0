# Ratio tables: kforge's best verified variant per shape, forward and
# backward, against the better anchor (varlen_attn FA2, FlexAttention)
# measured in the same run.
#   python3 report.py ours.json [anchors.jsonl]
# ours.json: kforge-bench-attn --out (rows without "op" are forward: files
# from before --op). anchors.jsonl: bench/anchors.py's ANCHORS_OUT lines;
# their backward figures exist only when anchors.py ran without FWD_ONLY.
import json, math, os, sys

ANCHORS = (("varlen_attn_fa2", "varlen_attn"), ("flex_docmask", "Flex"))


def anchor_us(r, key, op):
    """µs of anchor `key` for op, or None (missing, failed, or not timed)."""
    v = (r or {}).get(key, {})
    field = f"{op}_ms"
    return v[field] * 1e3 if isinstance(v, dict) and isinstance(v.get(field), (int, float)) else None


def table(rows, anchors, op):
    """Markdown lines of one op's table and its geomean line."""
    what = "forward" if op == "fwd" else "backward"
    f = lambda x: f"{x:.1f}" if x else "-"
    names = " | ".join(f"{label} {op} µs" for _, label in ANCHORS)
    out = [f"### {what}" + (" (FLOPs = 2.5 x forward)" if op == "bwd" else ""), "",
           f"| shape | kforge best {op} variant | kforge µs | kforge TFLOP/s | {names} | vs better anchor |",
           "|---|---|---|---|" + "---|" * len(ANCHORS) + "---|"]
    ratios = []
    for s in rows:
        b = s.get("best") or {}
        us = b.get("us") or 0
        a = anchors.get(s["shape"])
        times = [anchor_us(a, key, op) for key, _ in ANCHORS]
        best_anchor = min([x for x in times if x], default=None)
        ratio = best_anchor / us if best_anchor and us else None
        if ratio:
            ratios.append(ratio)
        out.append(f"| {s['shape']} | {b.get('variant') or 'none verified'} | {f(us)} | {f(b.get('tflops'))} | "
                   + " | ".join(f(x) for x in times) + f" | {(f'{ratio:.2f}x') if ratio else '-'} |")
    if op == "bwd" and anchors and not any(anchor_us(a, k, "bwd") for a in anchors.values() for k, _ in ANCHORS):
        out += ["", "(no anchor backward figures: anchors.py ran with FWD_ONLY)"]
    if ratios:
        g = math.exp(sum(map(math.log, ratios)) / len(ratios))
        out += ["", f"{what} geomean speedup vs the better anchor: {g:.2f}x over {len(ratios)} shapes"]
    return out


def render(ours, anchors):
    lines = [f"GPU: {ours.get('gpu')} ({ours.get('arch')})", ""]
    for op in ("fwd", "bwd"):
        rows = [s for s in ours.get("shapes", []) if s.get("op", "fwd") == op]
        if rows:
            lines += table(rows, anchors, op) + [""]
    return "\n".join(lines)


def load_anchors(path):
    anchors = {}
    if path and os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    anchors[r["shape"]] = r
    return anchors


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: report.py ours.json [anchors.jsonl]")
    if not os.path.exists(sys.argv[1]):
        sys.exit(f"{sys.argv[1]}: missing (kforge-bench-attn finished no shape: see ours.log)")
    with open(sys.argv[1]) as f:
        ours = json.load(f)
    print(render(ours, load_anchors(sys.argv[2] if len(sys.argv) > 2 else None)))
