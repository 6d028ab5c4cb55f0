#!/usr/bin/env bash
# cmake --install of the runtime into a fresh prefix, then a C program built
# against it twice: with find_package(kforge_runtime) and with pkg-config.
#   install_test.sh BUILD_DIR RUNTIME_SOURCE_DIR
set -euo pipefail
build="$1" src="$2"
prefix=$(mktemp -d /tmp/kforge_install_XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix/usr" --component runtime > "$prefix/install.log"
for f in include/kforge/runtime.h lib/libkforge_runtime.so lib/cmake/kforge_runtime/kforge_runtimeConfig.cmake lib/pkgconfig/kforge_runtime.pc; do
  [ -e "$prefix/usr/$f" ] || { echo "not installed: $f"; cat "$prefix/install.log"; exit 1; }
done
# Only the C ABI is exported.
if nm -D --defined-only "$prefix/usr/lib/libkforge_runtime.so" | awk '{print $3}' | grep -v '^kf_' | grep -q .; then
  echo "symbols other than kf_* exported:"; nm -D --defined-only "$prefix/usr/lib/libkforge_runtime.so" | grep -v ' kf_' | head; exit 1
fi
cmake -S "$src/testdata/consumer" -B "$prefix/consumer" -DCMAKE_PREFIX_PATH="$prefix/usr" > "$prefix/configure.log" 2>&1 \
  || { cat "$prefix/configure.log"; exit 1; }
cmake --build "$prefix/consumer" > "$prefix/build.log" 2>&1 || { cat "$prefix/build.log"; exit 1; }
"$prefix/consumer/consumer"
export PKG_CONFIG_PATH="$prefix/usr/lib/pkgconfig"
cc -o "$prefix/consumer_pc" "$src/testdata/consumer/consumer.c" $(pkg-config --cflags --libs kforge_runtime) \
  -Wl,-rpath,"$prefix/usr/lib"
"$prefix/consumer_pc"
echo "install test passed"
