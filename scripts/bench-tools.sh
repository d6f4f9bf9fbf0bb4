#!/usr/bin/env bash
# Installs the load generators `make bench` compares against when they are missing and
# this machine can install Debian packages: mariadb-slap (package mariadb-client, the raw
# INSERT ceiling) and wrk (package wrk, a C client for the HTTP API). Without them the
# bench still runs, with its in-process Go clients only, and says so in BENCHMARKS.md.
# Never fails the bench: a tool it cannot install is reported and skipped.
set -uo pipefail

missing=()
command -v mariadb-slap >/dev/null 2>&1 || missing+=(mariadb-client)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "bench-tools: installing ${missing[*]} with apt-get" >&2
  if DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 ||
     { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null 2>&1; }; then
    exit 0
  fi
fi
echo "bench-tools: ${missing[*]} not installed (apt-get install ${missing[*]}); the bench measures without them" >&2
exit 0
