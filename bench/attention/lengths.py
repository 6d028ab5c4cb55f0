# Writes the jagged lengths of every benchmark shape as JSON, drawn with the
# exact rule of ../anchors.py (torch.Generator seeded with 1 per shape), so
# kforge-bench-attn times the same batches the anchors run on.
#   python3 lengths.py ../shapes.json > lengths.json
import json, sys
import torch

def draw_lengths(spec, B, g):  # must stay identical to anchors.py
    d = spec["dist"]
    if d == "fixed":
        return torch.full((B,), spec["hi"], dtype=torch.long)
    if d == "uniform":
        return torch.randint(spec["lo"], spec["hi"] + 1, (B,), generator=g)
    if d == "pareto":
        u = torch.rand(B, generator=g, dtype=torch.float64)
        x = spec["lo"] * (1.0 - u) ** (-1.0 / spec["alpha"])
        return x.clamp(spec["lo"], spec["hi"]).long()
    raise ValueError(d)

out = []
for s in json.load(open(sys.argv[1] if len(sys.argv) > 1 else "../shapes.json")):
    g = torch.Generator().manual_seed(1)
    Lq = draw_lengths(s["q"], s["B"], g)
    Lk = Lq.clone() if s["kv"] == "same" else draw_lengths(s["kv"], s["B"], g)
    out.append({**s, "lq": Lq.tolist(), "lk": Lk.tolist()})
json.dump(out, sys.stdout)
