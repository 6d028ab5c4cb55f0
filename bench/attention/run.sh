#!/usr/bin/env bash
# Runs kforge's forward variants and the anchors (varlen_attn, FlexAttention)
# on the same batches in one run, then prints the ratio table.
# On the GPU machine, from anywhere:
#   BUNDLE=.bundle OUT=/tmp/kb [ONLY=a,b] [SKIP_ANCHORS=1] [VARIANTS=sweep|default] bench/attention/run.sh
# BUNDLE is a folder made here by deploy/bundle.sh (binaries in bin/, libraries in lib/).
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${BUNDLE:-.bundle}
O=${OUT:-/tmp/kforge-bench}
mkdir -p "$O"
export LD_LIBRARY_PATH=$(realpath "$B")/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
python3 bench/attention/lengths.py bench/shapes.json > "$O/lengths.json" || exit 1
timeout "${OURS_TIMEOUT:-300}" "$B/bin/kforge-bench-attn" --lengths "$O/lengths.json" --out "$O/ours.json" --variants "${VARIANTS:-sweep}" \
  ${ONLY:+--only "$ONLY"} ${REPS:+--reps "$REPS"} ${TEMPLATES:+--templates "$TEMPLATES"} 2>&1 | tee "$O/ours.log"
rm -f "$O/anchors.jsonl"
if [ -z "${SKIP_ANCHORS:-}" ]; then
  (cd bench && FWD_ONLY=1 ANCHORS_OUT="$O/anchors.jsonl" SHAPES=shapes.json ${ONLY:+ONLY="$ONLY"} \
     timeout "${ANCHOR_TIMEOUT:-420}" python3 anchors.py) > "$O/anchors.log" 2>&1
  tail -n 12 "$O/anchors.log"
fi
python3 bench/attention/report.py "$O/ours.json" "$O/anchors.jsonl" | tee "$O/table.md"
