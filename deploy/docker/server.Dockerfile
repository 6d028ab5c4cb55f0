# kforge-server on debian:bookworm-slim, built from this repository:
#   docker build -f deploy/docker/server.Dockerfile -t kforge-server:1.0.0 .
# Runs as the unprivileged user kforge (uid 10001); its database lives on
# the volume /var/lib/kforge (created mode 600). Configuration comes from
# flags or a config file (deploy/kforge-server.jsonc), tokens from files or
# the environment, never flags (deploy/README.md). The image also carries
# the kforge CLI, for `kforge health`, the readiness and liveness probe.

# --- build: the CMake build and its bundle (deploy/docker/build-in-container.sh)
FROM debian:bookworm AS build
WORKDIR /src
COPY . .
RUN ./deploy/docker/build-in-container.sh

# --- the image: Debian's runtime libraries from apt, NVRTC from the build
# (the server compiles the seed kernels it serves for untuned shapes).
FROM debian:bookworm-slim
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      ca-certificates libabsl20220623 libcurl4 libfmt9 libgrpc++1.51 libgrpc29 \
      libprotobuf32 libspdlog1.10 libsqlite3-0 libssl3 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/kforge/bin/kforge-server /opt/kforge/bin/kforge /usr/local/bin/
COPY --from=build /opt/kforge/nvrtc/ /usr/local/lib/kforge-nvrtc/
RUN echo /usr/local/lib/kforge-nvrtc > /etc/ld.so.conf.d/kforge-nvrtc.conf && ldconfig \
 && groupadd --system --gid 10001 kforge \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/kforge kforge \
 && install -d -o kforge -g kforge -m 0700 /var/lib/kforge \
 && install -d -m 0755 /etc/kforge \
 && kforge-server --version
USER 10001:10001
WORKDIR /var/lib/kforge
VOLUME ["/var/lib/kforge"]
EXPOSE 50051
# SIGTERM: health NOT_SERVING, shutdown_grace_ms, then in-flight calls drain.
STOPSIGNAL SIGTERM
ENTRYPOINT ["kforge-server"]
CMD ["--config", "/etc/kforge/server.jsonc"]
