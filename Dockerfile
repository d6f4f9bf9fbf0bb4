# syntax=docker/dockerfile:1
#
# batcherd container image.
#
#   docker build -t batcherd:dev --build-arg VERSION=$(git describe --tags --always --dirty) .
#   docker run --rm --env-file batcherd.env -p 8080:8080 batcherd:dev          # serve
#   docker run --rm --env-file batcherd.env batcherd:dev migrate               # schema
#
# The runtime image is distroless "static" (no shell, no package manager, CA certificates
# and /etc/passwd included) running as the numeric nonroot user 65532. There is deliberately
# no HEALTHCHECK: orchestrators probe GET /healthz (liveness) and GET /readyz (readiness).

ARG GO_VERSION=1.26

############################
# build stage
############################
FROM golang:${GO_VERSION} AS build
WORKDIR /src

# Module downloads are cached in their own layer, keyed on go.mod/go.sum only.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download && go mod verify

COPY . .

ARG VERSION=dev
ARG TARGETOS=linux
ARG TARGETARCH
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" \
        -o /out/batcherd ./cmd/batcherd

############################
# runtime stage
############################
FROM gcr.io/distroless/static-debian12:nonroot

ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="batcherd" \
      org.opencontainers.image.description="Batches approved change requests into one GitLab merge request per round per repository; N replicas coordinate through MySQL only." \
      org.opencontainers.image.source="https://github.com/batcherd/batcherd" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="gcr.io/distroless/static-debian12:nonroot"

COPY --from=build /out/batcherd /batcherd

# 65532 is "nonroot" in distroless; numeric so runAsNonRoot can verify it.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/batcherd"]
CMD ["serve"]
