#!/usr/bin/env bash
# Copies kforge-bench-attn and the non-system shared libraries it links into
# a folder that travels to the GPU machine (name it in `carry`).
#   bench/attention/bundle.sh BUILD_DIR [OUT_DIR=.bundle-kernels]
set -euo pipefail
cd "$(dirname "$0")/../.."
build="$1"; out="${2:-.bundle-kernels}"
rm -rf "$out" && mkdir -p "$out"
skip='^(linux-vdso|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|ld-linux|libstdc\+\+\.so|libgcc_s\.so|libnvrtc|libcuda\.so)'
for b in "$build/bench/attention/kforge-bench-attn" "$build/kernels/kforge-kernels-compile"; do
  [ -x "$b" ] || continue
  cp "$b" "$out/"
  ldd "$b" | awk '/=> \//{print $1" "$3}' | while read -r name path; do
    [[ "$name" =~ $skip ]] && continue
    [ -e "$out/$name" ] || cp -L "$path" "$out/$name"
  done
done
echo "bundle: $(ls "$out" | wc -l) files, $(du -sh "$out" | cut -f1) in $out"
