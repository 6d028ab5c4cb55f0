#!/usr/bin/env bash
# Whole-system smoke run on a GPU machine: kforge-server + one kforge-worker
# on GPU 0 + `kforge tune` with the builtin proposer, then `kforge get`
# must serve a tuned kernel. Expects a bundle (bin/, lib/) as made by
# deploy/bundle.sh; logs go to $OUT (or ./gpu_tune_out).
#   tests/e2e/gpu_tune.sh BUNDLE_DIR [MAX_VARIANTS=6] [MAX_SECONDS=240]
set -uo pipefail
bundle="$(cd "$1" && pwd)"; max_variants="${2:-6}"; max_seconds="${3:-240}"
out="${OUT:-$PWD/gpu_tune_out}"; mkdir -p "$out"
export LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export KFORGE_TOKEN=gpu-client-token-0123456789 KFORGE_WORKER_TOKEN=gpu-worker-token-0123456789
port=$((20000 + RANDOM % 20000)); addr=127.0.0.1:$port
work=$(mktemp -d)
"$bundle/bin/kforge-server" --listen "$addr" --db "$work/kforge.db" --client-token "$KFORGE_TOKEN" \
  --worker-token "$KFORGE_WORKER_TOKEN" > "$out/server.log" 2>&1 & server=$!
sleep 2
"$bundle/bin/kforge-worker" --server "$addr" --cache-dir "$work/cache" > "$out/worker.log" 2>&1 & worker=$!
kf() { "$bundle/bin/kforge" --server "$addr" "$@"; }
shape=(--head-dim 128 --heads 4 --causal --batch 16 --max-len-q 2048 --total-q 24000)
kf get "${shape[@]}" | tee "$out/get_before.txt"
kf tune "${shape[@]}" --max-variants "$max_variants" --max-seconds "$max_seconds" --name gpu-smoke \
  | tee "$out/tune.txt"; tune_rc=${PIPESTATUS[0]}
kf get "${shape[@]}" --out "$out/kernel" | tee "$out/get_after.txt"
kf variants | tee "$out/variants.txt"
kf shapes | tee "$out/shapes.txt"
kill -TERM $worker $server; wait $worker $server
echo "tune rc=$tune_rc"
grep -q "tuned        yes" "$out/get_after.txt" && echo "RESULT: tuned kernel served" || echo "RESULT: no tuned kernel"
