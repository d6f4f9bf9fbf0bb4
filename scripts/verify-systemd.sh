#!/usr/bin/env bash
# Verify systemd/batcherd.service with `systemd-analyze verify` (and print the
# `systemd-analyze security` exposure) when systemd-analyze exists; skip otherwise.
#
#   scripts/verify-systemd.sh            # verify; exit non-zero on any warning
#   SECURITY=1 scripts/verify-systemd.sh # also print the full security table
#
# verify checks that ExecStart= is executable, so the unit is copied to a temporary
# directory with ExecStart= pointing at bin/batcherd if built, else at a stub.
set -euo pipefail
cd "$(dirname "$0")/.."

unit=systemd/batcherd.service
if ! command -v systemd-analyze >/dev/null 2>&1; then
	echo "verify-systemd: systemd-analyze not found; skipping (apt-get install systemd to run it)"
	exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bin="$PWD/bin/batcherd"
if [ ! -x "$bin" ]; then
	bin="$tmp/batcherd"
	printf '#!/bin/sh\nexit 0\n' >"$bin"
	chmod +x "$bin"
fi
sed "s|^ExecStart=/usr/local/bin/batcherd |ExecStart=$bin |" "$unit" >"$tmp/batcherd.service"
grep -q "^ExecStart=$bin serve\$" "$tmp/batcherd.service" || {
	echo "verify-systemd: could not rewrite ExecStart= in $unit" >&2
	exit 1
}

# systemd-analyze verify exits 0 on some warnings (unknown keys); treat any output as failure.
out=$(systemd-analyze verify "$tmp/batcherd.service" 2>&1) || {
	echo "$out" >&2
	echo "verify-systemd: systemd-analyze verify failed" >&2
	exit 1
}
if [ -n "$out" ]; then
	echo "$out" >&2
	echo "verify-systemd: systemd-analyze verify reported warnings" >&2
	exit 1
fi
echo "verify-systemd: systemd-analyze verify $unit: OK"

if [ "${SECURITY:-0}" = 1 ]; then
	systemd-analyze security --offline=yes "$tmp/batcherd.service"
else
	systemd-analyze security --offline=yes "$tmp/batcherd.service" 2>/dev/null | grep 'Overall exposure' || true
fi
