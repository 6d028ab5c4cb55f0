#!/usr/bin/env bash
# The build stage of both images (server.Dockerfile, worker.Dockerfile), on
# debian:bookworm, so that they are built from this repo's CMake build with
# the same Debian packages as every other kforge build:
#   1. NVIDIA's Debian 12 repository for CUDA's NVRTC and headers (not in
#      Debian's archive; a GPU is not needed to build);
#   2. deploy/install-deps.sh for the Debian packages;
#   3. the three binaries, bundled with the shared libraries they need by
#      deploy/bundle.sh into /opt/kforge (bin/, lib/), and NVRTC's libraries
#      into /opt/kforge/nvrtc/ for the server image, whose base has no CUDA.
# Run from the repository root inside the build stage; not meant for a host.
set -euo pipefail
cuda="${CUDA_PACKAGE_VERSION:-13-0}"   # cuda-nvrtc-dev-13-0, ...
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends ca-certificates curl
curl -fsSL -o /tmp/cuda-keyring.deb \
  https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb
dpkg -i /tmp/cuda-keyring.deb
apt-get update -q
apt-get install -y -q --no-install-recommends "cuda-nvcc-$cuda" "cuda-nvrtc-dev-$cuda" \
  "cuda-cudart-dev-$cuda" "cuda-driver-dev-$cuda"
[ -e /usr/local/cuda ] || ln -s "/usr/local/cuda-${cuda/-/.}" /usr/local/cuda

./deploy/install-deps.sh
cmake -G Ninja -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j "$(nproc)" --target kforge-server kforge-worker kforge
KFORGE_BUNDLE_TESTS=0 ./deploy/bundle.sh build /opt/kforge
mkdir -p /opt/kforge/nvrtc
cp -L /usr/local/cuda/lib64/libnvrtc.so.13 /usr/local/cuda/lib64/libnvrtc-builtins.so.13.* \
  /opt/kforge/nvrtc/
/opt/kforge/bin/kforge-server --version
