#!/usr/bin/env bash
# One device call for a backward knob change: the GPU eval cases named by
# TESTS (a gtest filter over eval_gpu_test), then kforge-bench-attn on the
# public shapes (or SHAPES=...) with the template defaults and each SETTINGS
# entry, anchors skipped unless ANCHORS=1, then one table of every variant.
#   BUNDLE=.bundle OUT=$OUT TESTS='EvalGpu.BwdSm90*' SETTINGS='bwd_sm90:CSKIP=1;...' \
#     kernels/dev/ab_bwd.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
B=$(realpath "${BUNDLE:-.bundle}")
O=${OUT:-/tmp/ab}
mkdir -p "$O"
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
# (no commit here: the device machine's copy of .git need not be this
# checkout's HEAD; record the commit that built the bundle yourself)
date -u +%FT%TZ
if [ -n "${TESTS:-}" ]; then
  timeout "${TEST_TIMEOUT:-300}" "$B/bin/eval_gpu_test" --gtest_filter="$TESTS" > "$O/eval.log" 2>&1
  echo "eval_gpu_test rc=$?"
  grep -E '^\[ +(OK|FAILED) +\]|Failure|Expected|outcome' "$O/eval.log" | head -40
fi
skip=SKIP_ANCHORS=1
[ -n "${ANCHORS:-}" ] && skip=
env $skip OP="${OP:-bwd}" VARIANTS=default \
  TEMPLATES="${TEMPLATES:-bwd_sm90}" SETTINGS="${SETTINGS:-}" BUNDLE="$B" OUT="$O/bench" \
  ${SHAPES:+SHAPES="$SHAPES"} ${ONLY:+ONLY="$ONLY"} bench/attention/run.sh > "$O/run.log" 2>&1
echo "run.sh rc=$?"
grep -E 'rc=|error|Error|wrong' "$O/bench/ours.log" | tail -8
[ -n "${ANCHORS:-}" ] && cat "$O/bench/table.md"
python3 kernels/dev/ab_table.py "$O/bench/ours.json" | tee "$O/ab.md"
