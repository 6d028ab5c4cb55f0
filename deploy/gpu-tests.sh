#!/usr/bin/env bash
# Runs every GPU-labelled test on a GPU machine, from a bundle made here by
# deploy/bundle.sh, and prints a summary. Logs go to $LOG_DIR (default ./gpu-logs).
#   [TESTS="worker_gpu_test eval_gpu_test"] deploy/gpu-tests.sh [BUNDLE=.bundle]
# TESTS: the test binaries to run, in that order (default: every one the
# bundle lists, alphabetically), e.g. the slowest first under a time cap.
set -uo pipefail
cd "$(dirname "$0")/.."
bundle="$(realpath "${1:-.bundle}")"
logs="${LOG_DIR:-gpu-logs}"
mkdir -p "$logs"
export LD_LIBRARY_PATH="$bundle/lib:${CUDA_HOME:-/usr/local/cuda}/lib64:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader || true

total_pass=0 total_fail=0 total_skip=0 failed_bins=()
while IFS= read -r t; do
  [ -x "$bundle/bin/$t" ] || { echo "missing test binary $t"; failed_bins+=("$t(missing)"); continue; }
  "$bundle/bin/$t" --gtest_brief=0 > "$logs/$t.log" 2>&1
  rc=$?
  p=$(grep -c '^\[       OK \]' "$logs/$t.log")
  s=$(grep -c '^\[  SKIPPED \] [^0-9]' "$logs/$t.log")
  f=$(grep -E '^\[  FAILED  \] [A-Za-z_/]+\.[^ ]+' "$logs/$t.log" | grep -v ' listed below' | sed 's/ (.*//; s/, where .*//' | sort -u | wc -l)
  total_pass=$((total_pass + p)); total_fail=$((total_fail + f)); total_skip=$((total_skip + s))
  if [ $rc -ne 0 ]; then failed_bins+=("$t"); tail -n 30 "$logs/$t.log"; fi
  printf '%-28s pass %3d  fail %3d  skip %3d  rc %d\n' "$t" "$p" "$f" "$s" "$rc"
done < <(if [ -n "${TESTS:-}" ]; then tr ' ' '\n' <<< "$TESTS" | grep -v '^$'; else cat "$bundle/gpu-tests.txt"; fi)

echo "GPU tests: ${total_pass} passed, ${total_fail} failed, ${total_skip} skipped"
[ ${#failed_bins[@]} -eq 0 ] || { echo "failing binaries: ${failed_bins[*]}"; exit 1; }
