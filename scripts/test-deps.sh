#!/usr/bin/env bash
# Installs what the test command (`make test`) needs beyond Go, git and make, when it is
# missing, so that the suite runs on a fresh Debian 12 machine like scripts/mariadb-bootstrap.sh
# makes MariaDB run there. Idempotent and quiet when everything is present. It installs with
# apt-get (apt-get update first) and only as root; otherwise it names the packages to install
# and fails, because a suite that silently skips its tools proves less than it says.
#
# Adding a requirement (a tool a new test needs): one `need` line in the list at the bottom,
#
#   need "<why, shown when it is missing>" "<debian packages>" <check command> [args...]
#
# where the check succeeds when the requirement is met (`have TOOL` for a command on PATH,
# or any function defined here). The packages of every failed check are installed together.
#
# Go tools the suite runs are Go modules pinned by version, installed from the Go module
# proxy by the script that runs them (scripts/openapi-lint.sh: kin-openapi's validator),
# not Debian packages: they need nothing here beyond the Go toolchain.
#
# A Go test that runs such a tool skips when it is missing under a plain `go test`, but fails
# when BATCHERD_REQUIRE_TOOLS is set, as `make test` sets it: the suite never passes by skipping.
#
# TEST_DEPS_DRY_RUN=1 only says what it would install (exit 3 when something is missing).
set -euo pipefail

die() { echo "test-deps: $*" >&2; exit 1; }

missing_pkgs=()
missing_why=()

# need WHY PACKAGES CHECK...: records PACKAGES when CHECK fails.
need() {
  local why=$1 pkgs=$2; shift 2
  if ! "$@" >/dev/null 2>&1; then
    # shellcheck disable=SC2206 # PACKAGES is a space-separated list on purpose
    missing_pkgs+=($pkgs)
    missing_why+=("$why")
  fi
}

have() { command -v "$1"; }

# cc_builds: the C compiler cgo uses can build a program against the C library's headers
# (gcc alone, without libc6-dev, fails here with "stdlib.h: No such file or directory").
cc_builds() {
  local cc=${CC:-gcc} tmp
  tmp=$(mktemp -d)
  printf '#include <stdlib.h>\nint main(void) { return 0; }\n' >"$tmp/t.c"
  local rc=0
  "$cc" -o "$tmp/t" "$tmp/t.c" || rc=1
  rm -rf "$tmp"
  return $rc
}

check_all() {
  missing_pkgs=(); missing_why=()
  # ---- requirements of the suite (one line each; add yours here) ----
  need "go test -race needs cgo, and cgo a C compiler" gcc have "${CC:-gcc}"
  need "cgo builds against the C library's headers" "gcc libc6-dev" cc_builds
  need "promtool checks and unit-tests the alerting rules (deploy/prometheus)" prometheus have promtool
  need "the status page's browser test drives headless Chromium (internal/ui)" chromium have chromium
  need "binding files must read back exactly with a YAML 1.1 reader: PyYAML safe_load (internal/mr)" python3-yaml python3 -c "import yaml"
  need "binding files must read back exactly with js-yaml (internal/mr; Debian's node-js-yaml lives in /usr/share/nodejs)" "nodejs node-js-yaml" env NODE_PATH=/usr/share/nodejs node -e "require('js-yaml')"
  need "the protocol model test runs spin and compiles its verifier (model/, scripts/model.sh)" "spin gcc bc" have spin
  need "scripts/model.sh times its runs with bc" bc have bc
  # ---- end of requirements ----
}

check_all
[ ${#missing_pkgs[@]} -eq 0 ] && exit 0

# Deduplicate, keeping the order.
mapfile -t pkgs < <(printf '%s\n' "${missing_pkgs[@]}" | awk '!seen[$0]++')
for w in "${missing_why[@]}"; do echo "test-deps: missing: $w" >&2; done
if [ -n "${TEST_DEPS_DRY_RUN:-}" ]; then
  echo "test-deps: would install: ${pkgs[*]}" >&2
  exit 3
fi
command -v apt-get >/dev/null 2>&1 ||
  die "no apt-get here: install ${pkgs[*]} (or their equivalents) yourself, then run make test again"
[ "$(id -u)" = 0 ] ||
  die "installing needs root: run 'sudo apt-get install ${pkgs[*]}', then make test again"

echo "test-deps: installing ${pkgs[*]} with apt-get (first run only)..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null || die "apt-get update failed"
apt-get install -y -qq "${pkgs[@]}" >/dev/null || die "apt-get install ${pkgs[*]} failed"

check_all
if [ ${#missing_pkgs[@]} -ne 0 ]; then
  for w in "${missing_why[@]}"; do echo "test-deps: still missing after install: $w" >&2; done
  exit 1
fi
