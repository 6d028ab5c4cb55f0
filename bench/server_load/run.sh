#!/usr/bin/env bash
# kforge-server's task throughput: the load generator (server_load_bench) at
# rising concurrency, then real compile-only kforge-workers at rising counts.
# Each level gets a fresh kforge-server on a fresh SQLite file.
#
# usage: bench/server_load/run.sh [BUILD_DIR]      (default: build)
# Environment: CLIENTS ("1 2 4 8 16 32 64"), WORKERS ("1 2 4 8 16"; "" skips
# them), REPEATS (3: each level's median is printed), SECONDS_LOAD (10),
# SECONDS_WORKERS (30), OUT (a file for the JSON lines; default: none).
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
server="$build/server/kforge-server"
worker="$build/worker/kforge-worker"
cli="$build/cli/kforge"
bench="$build/bench/server_load/server_load_bench"
for b in "$server" "$worker" "$cli" "$bench"; do
  [[ -x "$b" ]] || { echo "run.sh: $b is not built (cmake --build $build)" >&2; exit 2; }
done
CLIENTS="${CLIENTS-1 2 4 8 16 32 64}"
WORKERS="${WORKERS-1 2 4 8 16}"
REPEATS="${REPEATS:-3}"
SECONDS_LOAD="${SECONDS_LOAD:-10}"
SECONDS_WORKERS="${SECONDS_WORKERS:-30}"
OUT="${OUT:-}"

# Throwaway tokens for throwaway servers.
KFORGE_CLIENT_TOKEN="$(openssl rand -hex 32)"
KFORGE_WORKER_TOKEN="$(openssl rand -hex 32)"
export KFORGE_CLIENT_TOKEN KFORGE_WORKER_TOKEN KFORGE_TOKEN="$KFORGE_CLIENT_TOKEN"

work="$(mktemp -d -t kforge-server-load.XXXXXX)"
server_pid=""
worker_pids=()
cleanup() {
  for p in "${worker_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [[ -n "$server_pid" ]] && kill "$server_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start_server() {
  rm -f "$work"/kforge.db*
  port="$(free_port)"
  addr="127.0.0.1:$port"
  "$server" --listen "$addr" --db "$work/kforge.db" --log-level warn >>"$work/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 100); do
    "$cli" --server "$addr" health >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "run.sh: kforge-server did not come up:" >&2
  tail -20 "$work/server.log" >&2
  exit 1
}

stop_server() {
  kill "$server_pid"
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}

# The median tasks_per_s of a level's JSON lines.
median() { python3 -c 'import json,statistics,sys; print("%.1f" % statistics.median(json.loads(l)["tasks_per_s"] for l in sys.stdin))'; }

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# load generator: clients, median tasks/s of $REPEATS runs of ${SECONDS_LOAD} s (each run's line follows)"
for n in $CLIENTS; do
  lines=""
  for _ in $(seq "$REPEATS"); do
    start_server
    line="$("$bench" --server "$addr" --clients "$n" --seconds "$SECONDS_LOAD" --json)" || true
    stop_server
    [[ -n "$OUT" ]] && echo "$line" >>"$OUT"
    lines+="$line"$'\n'
  done
  printf '%3d clients: %s tasks/s\n' "$n" "$(printf '%s' "$lines" | median)"
  printf '%s' "$lines" | sed 's/^/    /'
done

[[ -z "$WORKERS" ]] && exit 0
echo "# real compile-only kforge-workers (--compile-threads 1), tasks/s over ${SECONDS_WORKERS} s after 10 s, one run each"
for n in $WORKERS; do
  start_server
  worker_pids=()
  for i in $(seq "$n"); do
    "$worker" --server "$addr" --compile-only --name "load-w$i" --cache-dir "$work/cache-$i" \
      --compile-threads 1 --log-level warn >>"$work/workers.log" 2>&1 &
    worker_pids+=($!)
  done
  line="$("$bench" --server "$addr" --clients 0 --shapes 8 --variants 64 --fresh-compiles \
      --warmup-s 10 --seconds "$SECONDS_WORKERS" --json)" || true
  for p in "${worker_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${worker_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  worker_pids=()
  stop_server
  # --fresh-compiles: every result should be a program of its own (a
  # variant for an arch), none answered by a worker's compile cache.
  distinct="$(sqlite3 "$work/kforge.db" \
      "SELECT COUNT(*) || ' results, ' || COUNT(DISTINCT variant || ' ' || arch) || ' distinct programs'
       FROM tasks WHERE state = 'done'" 2>/dev/null || echo "?")"
  [[ -n "$OUT" ]] && echo "{\"workers\": $n, \"result\": $line}" >>"$OUT"
  printf '%3d workers: %s (whole run: %s)\n' "$n" "$line" "$distinct"
  rm -rf "$work"/cache-*
done
