#!/usr/bin/env bash
# Sets up, builds and runs every test (the README's test command; .ci/run runs it).
# Tests that need a GPU are labelled `gpu` and report themselves skipped, with
# the reason, on a machine without one; deploy/gpu-tests.sh runs them on a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/install-deps.sh
build="${KFORGE_BUILD_DIR:-build}"
cmake -G Ninja -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" --timeout 600
