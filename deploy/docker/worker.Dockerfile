# kforge-worker on NVIDIA's CUDA runtime image, built from this repository:
#   docker build -f deploy/docker/worker.Dockerfile -t kforge-worker:1.0.0 .
# One container per GPU: it sees one device (the NVIDIA container toolkit,
# or the device plugin's nvidia.com/gpu: 1), which is --gpu 0 inside. The
# runtime image brings libnvrtc; compute-sanitizer (the promotion gates) is
# added from NVIDIA's repository, which the image has configured. Runs as
# the unprivileged user kforge (uid 10001); the compile cache lives on
# /var/cache/kforge. The kforge CLI is here for `kforge health`, the probe.

# --- build: the same stage as the server's (deploy/docker/build-in-container.sh)
FROM debian:bookworm AS build
WORKDIR /src
COPY . .
RUN ./deploy/docker/build-in-container.sh

# --- the image. The binaries were built on Debian 12 against Debian's
# gRPC and protobuf; the bundle (deploy/bundle.sh) carries those libraries,
# everything but glibc, libstdc++, libnvrtc and libcuda, which this base's
# newer versions (and the driver) provide, as on the GPU test machines.
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu24.04
FROM ${CUDA_IMAGE}
ARG CUDA_PACKAGE_VERSION=13-0
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      "cuda-sanitizer-${CUDA_PACKAGE_VERSION}" \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/kforge/bin/ /opt/kforge/bin/
COPY --from=build /opt/kforge/lib/ /opt/kforge/lib/
ENV PATH=/opt/kforge/bin:/usr/local/cuda/bin:${PATH} \
    LD_LIBRARY_PATH=/opt/kforge/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib:/usr/local/nvidia/lib64 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
RUN groupadd --system --gid 10001 kforge \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/cache/kforge kforge \
 && install -d -o kforge -g kforge -m 0700 /var/cache/kforge \
 && kforge-worker --version
USER 10001:10001
VOLUME ["/var/cache/kforge"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["kforge-worker"]
CMD ["--server", "kforge-server:50051", "--tls-ca", "/etc/kforge/tls/ca.crt", \
     "--token-file", "/etc/kforge/secrets/worker.token", "--gpu", "0", \
     "--cache-dir", "/var/cache/kforge"]
