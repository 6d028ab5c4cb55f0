#!/usr/bin/env bash
# The exhaustive forward tables of the search-efficiency study (issue 15,
# item 4; bench/search/README.md): every setting of the builtin proposer's
# space (`kforge-bench-attn --variants all`), checked and timed, on a few
# forward shapes of one head dim, so that every compile serves every shape.
# On the GPU machine, from the repository root of a copy of the tree:
#   BUNDLE=.bundle OUT=/tmp/ks [NAMES=a,b,...] [CAP=300] [REPS=10] [JOBS=16] bench/search/sweep.sh
# BUNDLE is a folder made by deploy/bundle.sh (bin/, lib/). NAMES are shapes
# of bench/shapes.json or bench/shapes_wide.json, run in the order given:
# the three studied shapes first, then held-out ones that only check the
# search afterwards (never used to design it). The output is rewritten as it
# goes, so a run stopped by CAP keeps every shape and setting it reached.
# Writes $OUT/sweep.json (per shape, every setting's outcome, median and
# quartiles), sweep.log, lengths.json, shapes.json and gpu.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${BUNDLE:-.bundle}
O=${OUT:-/tmp/kforge-sweep}
CAP=${CAP:-300}
NAMES=${NAMES:-powerlaw_short,above_tile_causal,hstu_imbal_causal,longq_shortk_cross,gdpa_self,hstu_prod_causal}
mkdir -p "$O"
export LD_LIBRARY_PATH=$(realpath "$B")/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
python3 - "$NAMES" bench/shapes.json bench/shapes_wide.json > "$O/shapes.json" <<'PY' || exit 1
import json, sys
names = [n for n in sys.argv[1].split(",") if n]
known = {s["name"]: s for f in sys.argv[2:] for s in json.load(open(f))}
missing = [n for n in names if n not in known]
if missing:
    sys.exit(f"sweep.sh: not in {', '.join(sys.argv[2:])}: {', '.join(missing)}")
if len({known[n]["D"] for n in names}) != 1:
    print("sweep.sh: shapes of several head dims share no compiles", file=sys.stderr)
json.dump([known[n] for n in names], sys.stdout)
PY
python3 bench/attention/lengths.py "$O/shapes.json" > "$O/lengths.json" || exit 1
gpu_state() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
    --format=csv 2>&1 || true
}
{ echo "before:"; gpu_state; } > "$O/gpu.txt"
start=$(date +%s)
timeout "$CAP" "$B/bin/kforge-bench-attn" --lengths "$O/lengths.json" --out "$O/sweep.json" \
  --op fwd --variants all ${REPS:+--reps "$REPS"} ${JOBS:+--jobs "$JOBS"} > "$O/sweep.log" 2>&1
rc=$?
echo "kforge-bench-attn rc=$rc after $(( $(date +%s) - start )) s (cap $CAP s)" | tee -a "$O/sweep.log"
{ echo "after:"; gpu_state; } >> "$O/gpu.txt"
grep -E '^(GPU|== )' "$O/sweep.log"
sed -n '/^op | shape/,$p' "$O/sweep.log"
# A run stopped by CAP is a result (it says so above), not a failure.
[ $rc = 124 ] && exit 0
exit $rc
