#!/usr/bin/env bash
# Runs kforge's variants and the anchors (varlen_attn, FlexAttention) on the
# same batches in one run, then prints the ratio tables.
# On the GPU machine, from anywhere:
#   BUNDLE=.bundle OUT=/tmp/kb [OP=fwd|bwd|both] [ONLY=a,b] [SKIP_ANCHORS=1] [VARIANTS=sweep|default]
#     [SHAPES=bench/shapes_wide.json] [TEMPLATES=a,b] [SETTINGS="tmpl:K=V,K=V;..."] bench/attention/run.sh
# TEMPLATES and SETTINGS are kforge-bench-attn's --templates and --settings;
# COOL_MS its --cool-ms (an idle before each candidate's timed runs, for A/B
# runs of long kernels, which reach the board's power cap).
# BUNDLE is a folder made here by deploy/bundle.sh (binaries in bin/, libraries in lib/).
# OP (default fwd) picks what kforge-bench-attn times; with bwd or both the
# anchors run without FWD_ONLY, so anchors.py times their backward too.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${BUNDLE:-.bundle}
O=${OUT:-/tmp/kforge-bench}
OP=${OP:-fwd}
case "$OP" in
  fwd) ours_cap=300; anchor_cap=420 ;;
  bwd|both) ours_cap=420; anchor_cap=600 ;;  # backward runs take longer on both sides
  *) echo "OP must be fwd, bwd or both, not $OP" >&2; exit 2 ;;
esac
SHAPES=$(realpath "${SHAPES:-bench/shapes.json}")  # the public set by default
mkdir -p "$O"
export LD_LIBRARY_PATH=$(realpath "$B")/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
python3 bench/attention/lengths.py "$SHAPES" > "$O/lengths.json" || exit 1
timeout "${OURS_TIMEOUT:-$ours_cap}" "$B/bin/kforge-bench-attn" --lengths "$O/lengths.json" --out "$O/ours.json" \
  --op "$OP" --variants "${VARIANTS:-sweep}" \
  ${ONLY:+--only "$ONLY"} ${REPS:+--reps "$REPS"} ${TEMPLATES:+--templates "$TEMPLATES"} \
  ${SETTINGS:+--settings "$SETTINGS"} ${COOL_MS:+--cool-ms "$COOL_MS"} 2>&1 | tee "$O/ours.log"
echo "kforge-bench-attn rc=${PIPESTATUS[0]}" | tee -a "$O/ours.log"
rm -f "$O/anchors.jsonl"
if [ -z "${SKIP_ANCHORS:-}" ]; then
  if [ "$OP" = fwd ]; then fwd_only=(FWD_ONLY=1); else fwd_only=(-u FWD_ONLY); fi
  (cd bench && env "${fwd_only[@]}" ANCHORS_OUT="$O/anchors.jsonl" SHAPES="$SHAPES" ${ONLY:+ONLY="$ONLY"} \
     timeout "${ANCHOR_TIMEOUT:-$anchor_cap}" python3 anchors.py) > "$O/anchors.log" 2>&1
  echo "anchors rc=$?" >> "$O/anchors.log"
  tail -n 12 "$O/anchors.log"
fi
python3 bench/attention/report.py "$O/ours.json" "$O/anchors.jsonl" | tee "$O/table.md"
