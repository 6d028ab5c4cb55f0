#!/usr/bin/env bash
# The agent loop on a GPU machine, as a user runs it: kforge-server on a fresh
# SQLite file, one kforge-worker on GPU 0, and `kforge tune` with the builtin
# proposer over a shapes file (default bench/shapes.json). Afterwards every
# shape is fetched with `kforge get` and the database is left in $OUT for
# tests/e2e/tune_report.py, which derives time to first verified kernel,
# time to within 5% of the final best and evaluations used.
#   [GATE=/usr/local/cuda/bin/compute-sanitizer] tests/e2e/gpu_tune_shapes.sh BUNDLE \
#       [SHAPES=bench/shapes.json] [MAX_VARIANTS=4] [MAX_SECONDS=200]
# GATE turns on the worker's sanitizer gate (--sanitizer-gate); the worker
# then registers as gated and its CONFIRM/RETIME results promote. Without
# GATE the server is started with --allow-ungated-promotion, or nothing would
# ever become a bucket's best.
set -uo pipefail
cd "$(dirname "$0")/../.."
bundle="$(realpath "$1")"; shapes="${2:-bench/shapes.json}"
max_variants="${3:-4}"; max_seconds="${4:-200}"
out="${OUT:-$PWD/gpu_tune_out}"; mkdir -p "$out"
export LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export KFORGE_TOKEN=tune-client-token-0123456789abcdef012345 KFORGE_WORKER_TOKEN=tune-worker-token-0123456789abcdef012345
export KFORGE_CLIENT_TOKEN=$KFORGE_TOKEN
addr=127.0.0.1:$((20000 + RANDOM % 20000))
work=$(mktemp -d)
ungated=(); [ -n "${GATE:-}" ] || ungated=(--allow-ungated-promotion)
"$bundle/bin/kforge-server" --listen "$addr" --db "$work/kforge.db" \
  "${ungated[@]}" > "$out/server.log" 2>&1 & server=$!
"$bundle/bin/kforge-worker" --server "$addr" --gpu 0 --cache-dir "$work/cache" \
  ${GATE:+--sanitizer-gate "$GATE"} > "$out/worker.log" 2>&1 & worker=$!
kf() { "$bundle/bin/kforge" --server "$addr" "$@"; }
for _ in $(seq 1 300); do grep -q "registered as worker" "$out/worker.log" && break; sleep 0.2; done
grep -q "registered as worker" "$out/worker.log" || { echo "worker did not register:"; tail -n 20 "$out/worker.log"; }
kf tune --shapes "$shapes" --name public-shapes --max-variants "$max_variants" \
  --max-seconds "$max_seconds" --seed 1 > "$out/tune.txt" 2>&1; rc=$?
tail -n 20 "$out/tune.txt"
kf shapes > "$out/shapes.txt" 2>&1; cat "$out/shapes.txt"
kill -TERM $worker $server; wait $worker $server 2>/dev/null
cp "$work/kforge.db" "$out/tune.db"
echo "tune rc=$rc"
