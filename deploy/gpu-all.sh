#!/usr/bin/env bash
# One call on the GPU machine for one change: every GPU-labelled test, a short
# tuning run through the real binaries with the sanitizer gates (throughput,
# promotions), then the training-step benchmark, and optionally the attention
# benchmark (kforge forward and backward against the anchors), each within its
# own time cap so the call ends inside the device tool's limit. Logs go to
# $OUT as one archive; a short table is printed last.
#   OUT=/tmp/out deploy/gpu-all.sh [BUNDLE=.bundle]
# Caps (seconds): TESTS_S (default 260), TUNE_S (170), TRAIN_S (60), BENCH_S
# (default 0); a cap of 0 skips that step. BENCH_S runs
# bench/attention/run.sh with OP=$BENCH_OP (default both; every shape needs
# several minutes, so give it a device call of its own or trim the others).
# TUNE_VARIANTS (6) variants per shape over bench/shapes.json; TESTS (see
# gpu-tests.sh) picks and orders the tests.
set -uo pipefail
cd "$(dirname "$0")/.."
bundle="$(realpath "${1:-.bundle}")"
out="${OUT:-$PWD/gpu-all-out}"
work="$out/work"; mkdir -p "$work/logs" "$work/tune" "$work/train"
sanitizer=/usr/local/cuda/bin/compute-sanitizer
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader

if [ "${TESTS_S:-260}" -gt 0 ]; then
  LOG_DIR="$work/logs" timeout "${TESTS_S:-260}" deploy/gpu-tests.sh "$bundle" > "$work/tests.txt" 2>&1
  echo "gpu tests rc=$?" >> "$work/tests.txt"
fi

if [ "${TUNE_S:-170}" -gt 0 ]; then
  OUT="$work/tune" GATE=$sanitizer timeout "${TUNE_S:-170}" tests/e2e/gpu_tune_shapes.sh "$bundle" \
    bench/shapes.json "${TUNE_VARIANTS:-6}" $(( ${TUNE_S:-170} - 30 )) > "$work/tune.txt" 2>&1
  echo "tune rc=$?" >> "$work/tune.txt"
  [ -f "$work/tune/tune.db" ] && python3 tests/e2e/tune_report.py "$work/tune/tune.db" > "$work/tune_report.txt" 2>&1
fi

if [ "${TRAIN_S:-60}" -gt 0 ]; then
  BUNDLE="$bundle" OUT="$work/train" timeout "${TRAIN_S:-60}" bench/train/run.sh > "$work/train.txt" 2>&1
  echo "train rc=$?" >> "$work/train.txt"
fi

if [ "${BENCH_S:-0}" -gt 0 ]; then
  # run.sh's own caps are split from BENCH_S so that both kforge and the
  # anchors get their turn (the outer timeout does not reach the process
  # groups of the inner ones); the rest draws the lengths and reports.
  part=$(( BENCH_S * 45 / 100 ))
  [ -n "${SKIP_ANCHORS:-}" ] && part=$(( BENCH_S * 90 / 100 ))  # kforge alone
  OP="${BENCH_OP:-both}" BUNDLE="$bundle" OUT="$work/bench" OURS_TIMEOUT=$part ANCHOR_TIMEOUT=$part \
    timeout "$BENCH_S" bench/attention/run.sh > "$work/bench.txt" 2>&1
  echo "bench rc=$?" >> "$work/bench.txt"
fi

tar czf "$out/gpu-all.tgz" -C "$work" . && rm -rf "$work"/logs "$work"/tune "$work"/train "$work"/bench
echo "---- tests";  grep -sE "^[a-z_]+ +pass|GPU tests:|rc=" "$work/tests.txt"
echo "---- tune";   tail -n 8 "$work/tune_report.txt" 2>/dev/null; grep -s "rc=" "$work/tune.txt"
echo "---- train";  tail -n 6 "$work/train.txt" 2>/dev/null
if [ "${BENCH_S:-0}" -gt 0 ]; then echo "---- bench"; grep -E "^\||geomean|rc=" "$work/bench.txt"; fi
