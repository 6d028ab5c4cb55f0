#!/usr/bin/env bash
# GPU smoke test, end to end: a kforge-server (fresh SQLite database), one
# kforge-worker on GPU 0 and a small builtin tuning job submitted with the
# kforge CLI; then the tuned kernel is fetched back. For the GPU machine.
#
#   tests/worker/gpu-smoke.sh [DIR]
# DIR: a bundle made by deploy/bundle.sh (default .bundle; binaries in bin/,
# libraries in lib/) or a build directory (server/, worker/, cli/).
# Env: SMOKE_MAX_VARIANTS (default 4), SMOKE_MAX_SECONDS (default 300),
# SMOKE_KEEP=1 keeps the work directory with the logs, SMOKE_ARCH.
# Prints "N passed, M failed" and exits non-zero unless the job succeeded
# with at least one verified variant.
set -uo pipefail
cd "$(dirname "$0")/../.."
dir="$(realpath "${1:-.bundle}")"

find_bin() {
  for p in "$dir/bin/$1" "$dir/$2/$1"; do
    [ -x "$p" ] && { echo "$p"; return 0; }
  done
  echo "gpu-smoke: $1 not found under $dir" >&2
  return 1
}
server_bin=$(find_bin kforge-server server) || exit 2
worker_bin=$(find_bin kforge-worker worker) || exit 2
cli_bin=$(find_bin kforge cli) || exit 2
[ -d "$dir/lib" ] && export LD_LIBRARY_PATH="$dir/lib:${CUDA_HOME:-/usr/local/cuda}/lib64:${LD_LIBRARY_PATH:-}"

# SMOKE_ARCH overrides the GPU's arch (and lets the script's plumbing be
# tried on a machine without a GPU, where the job cannot finish).
arch="${SMOKE_ARCH:-}"
if [ -z "$arch" ]; then
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader -i 0 2>/dev/null | tr -d ' .')
  [ -n "$cc" ] || { echo "gpu-smoke: no GPU (nvidia-smi found none)"; echo "0 passed, 1 failed"; exit 1; }
  case "$cc" in 90) arch=sm_90a ;; 100) arch=sm_100a ;; *) arch="sm_$cc" ;; esac
fi

work=$(mktemp -d /tmp/kforge-smoke.XXXXXX)
port=$((20000 + RANDOM % 20000))
addr="127.0.0.1:$port"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  if [ "${SMOKE_KEEP:-0}" = 1 ]; then echo "gpu-smoke: logs kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# Tokens in the environment (32+ characters; no binary takes one from a flag).
export KFORGE_WORKER_TOKEN=smoke-worker-token-0123456789abcdef0123
export KFORGE_CLIENT_TOKEN=smoke-client-token-0123456789abcdef0123 KFORGE_TOKEN=smoke-client-token-0123456789abcdef0123
"$server_bin" --listen "$addr" --db "$work/kforge.db" --heartbeat-ms 1000 > "$work/server.log" 2>&1 &
pids+=($!)
"$worker_bin" --server "$addr" --gpu 0 --name smoke-gpu0 \
  --cache-dir "$work/cache" > "$work/worker.log" 2>&1 &
pids+=($!)

# Wait for the worker to register.
for _ in $(seq 1 100); do
  grep -q "registered as worker" "$work/worker.log" 2>/dev/null && break
  sleep 0.2
done
grep -q "registered as worker" "$work/worker.log" || {
  echo "gpu-smoke: the worker did not register"; tail -n 30 "$work/worker.log" "$work/server.log"
  echo "0 passed, 1 failed"; exit 1; }
grep -m1 "GPU 0:" "$work/worker.log" || true

pass=0 fail=0
check() {  # check NAME CONDITION-EXIT-CODE
  if [ "$2" -eq 0 ]; then pass=$((pass + 1)); echo "PASS $1"; else fail=$((fail + 1)); echo "FAIL $1"; fi
}

shape=(--op fwd --head-dim 128 --heads 8 --kv-heads 8 --arch "$arch" --batch 4 --max-len-q 512 --total-q 1200)
start=$(date +%s)
timeout $(( ${SMOKE_MAX_SECONDS:-300} + 60 )) "$cli_bin" --server "$addr" \
  tune "${shape[@]}" --name gpu-smoke --max-variants "${SMOKE_MAX_VARIANTS:-4}" \
  --max-seconds "${SMOKE_MAX_SECONDS:-300}" --seed 1 > "$work/tune.log" 2>&1
rc=$?
tail -n 15 "$work/tune.log"
check "tuning job succeeded (rc $rc, $(( $(date +%s) - start )) s)" $rc

verified=$(grep -c "\]: verified\|: verified" "$work/worker.log" || true)
echo "worker outcomes:"; grep -oE "task [^:]+: (verified|wrong|crashed|timeout|compile_error|compiled)" "$work/worker.log" \
  | awk '{print $3}' | sort | uniq -c
[ "$verified" -gt 0 ]; check "at least one variant verified ($verified)" $?
! grep -qE "Segmentation fault|terminate called|Aborted|core dumped" "$work/worker.log"; check "worker log shows no crash of the worker itself" $?
kill -0 "${pids[1]}" 2>/dev/null; check "worker still running" $?

"$cli_bin" --server "$addr" get "${shape[@]}" --out "$work/kernel" > "$work/get.log" 2>&1
rc=$?
cat "$work/get.log"
check "get returns a kernel" $rc
grep -q "tuned        yes" "$work/get.log"; check "the kernel served is tuned" $?
ls "$work/kernel"/*.cubin > /dev/null 2>&1; check "the kernel comes with a cubin" $?

echo "gpu-smoke: ${pass} passed, ${fail} failed"
echo "${pass} passed, ${fail} failed"
[ "$fail" -eq 0 ]
