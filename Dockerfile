# syntax=docker/dockerfile:1
# The controller image: `make docker-build IMG=<registry>/ck8s-certs:<tag>`.
#
# Builder: the official Rust image on Debian 12, so that the binary links against the same glibc
# as the runtime image. The registry and target folders are BuildKit cache mounts: rebuilds only
# compile what changed.
FROM docker.io/library/rust:1.95.0-slim-bookworm AS builder
# make: tikv-jemalloc-sys builds jemalloc (the controller's allocator) with configure and make.
RUN apt-get update \
 && apt-get install -y --no-install-recommends make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p ck8s-certs \
 && install -D -m 0755 target/release/ck8s-certs /out/ck8s-certs

# Runtime: glibc, CA certificates and nothing else (no shell); the time zone database is built into
# the binary. 65532 is distroless's "nonroot", the user config/manager/manager.yaml runs as.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /out/ck8s-certs /ck8s-certs
USER 65532:65532
ENTRYPOINT ["/ck8s-certs"]
