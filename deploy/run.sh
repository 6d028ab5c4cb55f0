#!/usr/bin/env bash
# Sets up, builds and runs kforge's main job on its embedded defaults:
# kforge-server on 127.0.0.1:50051 with an SQLite file (./kforge.db) and the
# builtin proposer, plus one local kforge-worker (GPU 0, or compile-only for
# sm_90a when this machine has no CUDA driver). Ctrl-C stops both.
#
# Tokens: taken from KFORGE_CLIENT_TOKEN / KFORGE_WORKER_TOKEN, else made once
# and kept in ./kforge-local.env (mode 600) so the CLI can use them:
#   . ./kforge-local.env && build/cli/kforge shapes
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/install-deps.sh
build="${KFORGE_BUILD_DIR:-build}"
cmake -G Ninja -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" -j "$(nproc)" --target kforge-server kforge-worker kforge

env_file=kforge-local.env
if [ -z "${KFORGE_CLIENT_TOKEN:-}" ] || [ -z "${KFORGE_WORKER_TOKEN:-}" ]; then
  if [ ! -f "$env_file" ]; then
    umask 077
    {
      echo "export KFORGE_CLIENT_TOKEN=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
      echo "export KFORGE_WORKER_TOKEN=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
      echo 'export KFORGE_TOKEN=$KFORGE_CLIENT_TOKEN'
    } > "$env_file"
  fi
  # shellcheck disable=SC1090
  . "./$env_file"
fi
listen="${KFORGE_LISTEN:-127.0.0.1:50051}"

# Promotion needs a worker that gates with compute-sanitizer. KFORGE_GATE
# (the compute-sanitizer binary) turns the local worker's gate on; without it
# the local worker is ungated and the server is told to promote ungated
# results, or a local run would tune and never serve what it found.
gate=(); ungated=(--allow-ungated-promotion)
if [ -n "${KFORGE_GATE:-}" ]; then gate=(--sanitizer-gate "$KFORGE_GATE"); ungated=(); fi
"$build/server/kforge-server" --listen "$listen" --db "${KFORGE_DB:-kforge.db}" "${ungated[@]}" "$@" &
server=$! worker=
trap 'kill $server $worker 2>/dev/null; wait' INT TERM EXIT
# The worker retries until the server listens; without a driver it says so
# and serves compile-only tasks.
"$build/worker/kforge-worker" --server "$listen" --gpu "${KFORGE_GPU:-0}" --cache-dir .kforge-cache \
  "${gate[@]}" &
worker=$!
echo "kforge: server on $listen (pid $server), worker pid $worker; tokens in $env_file"
wait $server
