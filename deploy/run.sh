#!/usr/bin/env bash
# Sets up, builds and runs kforge's main job on its embedded defaults: the
# server on 127.0.0.1:50051 with an SQLite file (./kforge.db), the builtin
# proposer, and one local worker (on GPU 0, or compile-only without a GPU).
# Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/install-deps.sh
build="${KFORGE_BUILD_DIR:-build}"
cmake -G Ninja -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" -j "$(nproc)" --target kforge-server kforge-worker kforge
exec "$build/server/kforge-server" --local-worker "$build/worker/kforge-worker" "$@"
