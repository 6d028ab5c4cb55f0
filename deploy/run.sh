#!/usr/bin/env bash
# Sets up, builds and runs kforge's main job on its embedded defaults:
# kforge-server on 127.0.0.1:50051 with an SQLite file (./kforge.db) and the
# builtin proposer, plus one local kforge-worker (GPU 0, or compile-only for
# sm_90a when this machine has no CUDA driver). Ctrl-C stops both.
#
# Tokens: taken from KFORGE_CLIENT_TOKEN / KFORGE_WORKER_TOKEN (32+
# characters each), else made once by deploy/local-env.sh and kept in
# ./kforge-local.env (mode 600) so the CLI can use them:
#   . ./kforge-local.env && build/cli/kforge shapes
# They reach the binaries through the environment only, never a flag.
#
# KFORGE_LISTEN other than a loopback address turns TLS on: a private CA and
# certificates are made once in ./kforge-tls (deploy/make-certs.sh, for this
# host's name), the server serves with them and the worker checks them; the
# CLI then needs `--tls-ca kforge-tls/ca.crt` (or KFORGE_TLS_CA).
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/install-deps.sh
build="${KFORGE_BUILD_DIR:-build}"
cmake -G Ninja -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" -j "$(nproc)" --target kforge-server kforge-worker kforge

env_file=kforge-local.env
if [ -z "${KFORGE_CLIENT_TOKEN:-}" ] || [ -z "${KFORGE_WORKER_TOKEN:-}" ]; then
  ./deploy/local-env.sh "$env_file"
  # shellcheck disable=SC1090
  . "./$env_file"
fi
export KFORGE_CLIENT_TOKEN KFORGE_WORKER_TOKEN
listen="${KFORGE_LISTEN:-127.0.0.1:50051}"
port="${listen##*:}"

# Plaintext is for loopback only: anything else is served with TLS.
server_tls=(); worker_tls=(); target="$listen"
case "${listen%:*}" in
  127.*|localhost|"[::1]") ;;
  *)
    [ -f kforge-tls/server.crt ] || ./deploy/make-certs.sh kforge-tls "$(hostname)" "$(hostname -f 2>/dev/null || hostname)"
    server_tls=(--tls-cert kforge-tls/server.crt --tls-key kforge-tls/server.key)
    worker_tls=(--tls-ca kforge-tls/ca.crt)
    target="localhost:$port"
    ;;
esac

# Promotion needs a worker that gates with compute-sanitizer. KFORGE_GATE
# (the compute-sanitizer binary) turns the local worker's gate on; without it
# the local worker is ungated and the server is told to promote ungated
# results, or a local run would tune and never serve what it found.
gate=(); ungated=(--allow-ungated-promotion)
if [ -n "${KFORGE_GATE:-}" ]; then gate=(--sanitizer-gate "$KFORGE_GATE"); ungated=(); fi
"$build/server/kforge-server" --listen "$listen" --db "${KFORGE_DB:-kforge.db}" \
  "${server_tls[@]}" "${ungated[@]}" "$@" &
server=$! worker=
trap 'kill $server $worker 2>/dev/null; wait' INT TERM EXIT
# The worker retries until the server listens; without a driver it says so
# and serves compile-only tasks. It takes KFORGE_WORKER_TOKEN from the
# environment and clears it from its own.
"$build/worker/kforge-worker" --server "$target" --gpu "${KFORGE_GPU:-0}" --cache-dir .kforge-cache \
  "${worker_tls[@]}" "${gate[@]}" &
worker=$!
echo "kforge: server on $listen (pid $server), worker pid $worker; tokens in $env_file"
wait $server
