#!/usr/bin/env bash
# Lints api/openapi.yaml with an independent OpenAPI 3 validator: kin-openapi's
# cmd/validate, a Go module pinned here and installed from the Go module proxy into
# bin/tools when missing. It needs nothing but the Go toolchain the build already
# needs (no node: Debian 12's nodejs is 18, older than current Redocly CLI wants), and
# it is not the project's own reading of the document (internal/api's tests parse the
# YAML with yaml.v3, which took an unquoted "description: a, b" inside {…} as a key
# and passed a file other validators reject).
set -euo pipefail
cd "$(dirname "$0")/.."
version=v0.153.0
tools="$PWD/bin/tools"
bin="$tools/kin-openapi-validate-$version"
if [ ! -x "$bin" ]; then
	echo "installing github.com/getkin/kin-openapi/cmd/validate@$version into bin/tools"
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	GOBIN="$tmp" GOFLAGS=-mod=mod go install "github.com/getkin/kin-openapi/cmd/validate@$version"
	mkdir -p "$tools"
	mv "$tmp/validate" "$bin"
fi
# -multi: every error, not only the first; examples and defaults are validated against
# their schemas too (the tool's defaults).
"$bin" -multi api/openapi.yaml
echo "api/openapi.yaml: valid OpenAPI (kin-openapi $version)"
