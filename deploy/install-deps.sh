#!/usr/bin/env bash
# Installs every system package kforge's build and tests need on Debian 12.
# Idempotent: packages already installed are skipped, so a second run is quick.
# CUDA 13 (NVRTC, headers) is not in Debian's archive: it is expected under
# /usr/local/cuda (or $CUDA_HOME); this script checks for it and says so.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config ccache git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev libcurl4-openssl-dev libssl-dev
  libsqlite3-dev sqlite3 nlohmann-json3-dev libcpp-httplib-dev libcli11-dev
  libgtest-dev libgmock-dev
  python3-grpcio python3-grpc-tools   # the non-C++ client in the interop test
  python3-pip python3-setuptools python3-wheel   # pip install ./python offline (--no-build-isolation)
  python3-yaml openssl   # tests/deploy: the YAML artefacts; TLS certificates made at test time
  chromium chromium-driver python3-selenium       # the dashboard in a real browser (e2e.dashboard)
  python3-prometheus-client                       # its parser reads /metrics (e2e.dashboard)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all ${#packages[@]} packages already installed"
fi

cuda_home="${CUDA_HOME:-/usr/local/cuda}"
if [ ! -f "$cuda_home/include/nvrtc.h" ] || ! ls "$cuda_home"/lib64/libnvrtc.so* >/dev/null 2>&1; then
  echo "install-deps: CUDA toolkit (NVRTC) not found under $cuda_home." >&2
  echo "  kforge needs CUDA 13 (nvrtc.h and libnvrtc); install NVIDIA's cuda-toolkit-13-0" >&2
  echo "  package and/or set CUDA_HOME. A GPU is not needed to build or test." >&2
  exit 1
fi
echo "install-deps: CUDA $("$cuda_home/bin/nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p') at $cuda_home"
