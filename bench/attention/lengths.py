# Writes the jagged lengths of every benchmark shape as JSON, drawn by the one
# length rule (core/lengths.h; python/kforge/lengths.py here, seed 1 per
# shape), which ../anchors.py draws with too, so kforge-bench-attn times the
# same batches the anchors run on.
#   python3 lengths.py ../shapes.json > lengths.json
import json, os, sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from kforge.lengths import draw_shape_lengths  # noqa: E402

out = []
for s in json.load(open(sys.argv[1] if len(sys.argv) > 1 else "../shapes.json")):
    lq, lk = draw_shape_lengths(s)
    out.append({**s, "lq": lq, "lk": lq if lk is None else lk})
json.dump(out, sys.stdout)
