# syntax=docker/dockerfile:1

# capsnap as a static, non-root image that holds the binary and nothing
# else that can run: no shell, no package manager, no libc. It needs
# BuildKit (the default builder since Docker Engine 23) for the cache
# mounts and the platform arguments.
#
#   docker build --pull --build-arg VERSION="$(git describe --tags --always)" -t capsnap .
#
# Without Docker, `make image` builds the same image (deploy/image), on an
# empty base instead of distroless, as an OCI archive in bin/.
#
# examples/deploy/deploy_test.go holds this file to that: CGO off, a
# numeric non-root USER, no RUN in the final stage, the golang tag equal to
# go.mod's go line, and the user, entrypoint, command and ports of make
# image's.

# Build on the builder's own platform and cross-compile, which is fast and
# needs no emulation; Go cross-compiles a CGO-free binary natively. The tag
# follows the newest 1.26 patch, and the image sets GOTOOLCHAIN=local, so a
# cached image older than go.mod's go line fails the build instead of
# fetching a toolchain: build with --pull.
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src
# Modules get a layer of their own so that a source edit does not fetch
# them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
ARG TARGETOS
ARG TARGETARCH
# CGO_ENABLED=0 makes the binary static, so the final stage needs no libc.
# -trimpath keeps the build machine's paths out of the binary and its
# stack traces; -s -w drop the symbol tables.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w -X main.version=$VERSION" -o /out/capsnap ./cmd/capsnap

# distroless/static brings CA certificates (for https MCP server URLs), tzdata
# and a passwd entry for uid 65532, and no shell.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/capsnap /capsnap
# Numeric, so the kubelet can verify runAsNonRoot: with a user name it
# cannot tell whether that name is root and refuses to start the pod.
USER 65532:65532
# 9001: ext_authz and grpc.health.v1. 9002: /healthz, /readyz, /metrics,
# /catalog and POST /policy/reload.
EXPOSE 9001 9002
ENTRYPOINT ["/capsnap"]
CMD ["serve", "--config", "/etc/capsnap/capsnap.yaml"]
