#!/usr/bin/env bash
# Bundles kforge's binaries, the GPU-labelled test binaries and the shared
# libraries they need into one folder that runs on another Linux machine with
# the same CUDA (the GPU test machine): everything `ldd` lists except the C/C++
# runtime, which the target has, and libnvrtc/libcuda, which come from the
# target's own CUDA install and driver.
#   [KFORGE_BUNDLE_TESTS=0] deploy/bundle.sh [BUILD_DIR=build] [OUT_DIR=.bundle]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
out="${2:-.bundle}"
rm -rf "$out" && mkdir -p "$out/bin" "$out/lib"

bins=()
for b in server/kforge-server worker/kforge-worker cli/kforge; do
  [ -x "$build/$b" ] && bins+=("$build/$b")
done
while IFS= read -r f; do bins+=("$f"); done < <(find "$build/bench" "$build/kernels" -maxdepth 3 -type f -executable \( -name 'kforge-bench*' -o -name 'kforge-kernels-compile' \) 2>/dev/null)

# GPU-labelled tests: CTest names are "<binary>.<Suite>.<Case>".
# KFORGE_BUNDLE_TESTS=0 leaves them out (the container images).
if [ "${KFORGE_BUNDLE_TESTS:-1}" = 0 ]; then : > "$out/gpu-tests.txt"; else
ctest --test-dir "$build" -L gpu -N 2>/dev/null | sed -n 's/^ *Test *#[0-9]*: \([^.]*\)\..*/\1/p' | sort -u > "$out/gpu-tests.txt"
fi
# (a GPU-labelled test that is a script, such as e2e.agent_gpu_compare, has no
# binary of that name: it is left out of the list rather than reported missing)
found=()
while IFS= read -r t; do
  f=$(find "$build" -type f -executable -name "$t" | head -n 1)
  [ -n "$f" ] && { bins+=("$f"); found+=("$t"); }
done < "$out/gpu-tests.txt"
printf '%s\n' "${found[@]}" | grep -v '^$' > "$out/gpu-tests.txt" || true

# Libraries loaded at run time, not linked by a binary: libkforge_runtime.so
# (the Python package loads it with ctypes; KFORGE_RUNTIME_LIB=lib/libkforge_runtime.so.1).
libs=()
[ -e "$build/runtime/libkforge_runtime.so.1" ] && libs+=("$build/runtime/libkforge_runtime.so.1")

skip='^(linux-vdso|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|ld-linux|libstdc\+\+\.so|libgcc_s\.so|libnvrtc|libcuda\.so)'
for b in "${bins[@]}" "${libs[@]}"; do
  case " ${libs[*]} " in *" $b "*) cp -L "$b" "$out/lib/" ;; *) cp "$b" "$out/bin/" ;; esac
  ldd "$b" | awk '/=> \//{print $1" "$3}' | while read -r name path; do
    [[ "$name" =~ $skip ]] && continue
    [ -e "$out/lib/$name" ] || cp -L "$path" "$out/lib/$name"
  done
done
# Debug info is most of a RelWithDebInfo binary; the bundle must stay small
# enough to travel (the device call carries at most 64 MiB).
strip --strip-debug "$out"/bin/* "$out"/lib/* 2>/dev/null || true
# Resources the binaries read at run time (kernel shapes, anchor script).
cp -r bench/shapes.json bench/anchors.py "$out/" 2>/dev/null || true
echo "bundle: $(ls "$out/bin" | wc -l) binaries, $(ls "$out/lib" | wc -l) libraries, $(du -sh "$out" | cut -f1) in $out"
