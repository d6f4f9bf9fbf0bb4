#!/usr/bin/env bash
# Makes sure a MariaDB server answers for the tests and the demo, on this machine or on a
# fresh Debian one. Idempotent and quiet on success; says what failed and what to do.
#
#   1. If the test user can log in over TCP, there is nothing to do.
#   2. Else, if no server answers, start MariaDB (installing mariadb-server with apt-get
#      first when it is missing).
#   3. Create the test user (BATCHERD_TEST_USER/BATCHERD_TEST_PASSWORD, default
#      batcherd/batcherd) with every right on the databases the tests, the demo and the
#      bench create and drop for themselves (their name patterns below), and on nothing
#      else: no global privilege. On a fresh Debian install root logs in only through the
#      unix socket (error 1698 over TCP), so the user is created through the socket as root.
#      A user that already logs in is left as it is.
#
# With --run-db (make run-db) step 3 makes instead what the README's run section uses:
# the database BATCHERD_RUN_DB (batcherd) and the user BATCHERD_RUN_USER/BATCHERD_RUN_PASSWORD
# (batcherd_run/batcherd_run) with the grants batcherd needs on it (the README's MySQL
# requirements: the runtime's and migrate's), again on nothing else.
#
# Environment: BATCHERD_DB_HOST (127.0.0.1), BATCHERD_DB_PORT (3306), BATCHERD_DB_SOCKET
# (root's unix socket; default: the client's).
set -euo pipefail

host=${BATCHERD_DB_HOST:-127.0.0.1}
port=${BATCHERD_DB_PORT:-3306}
mode=test
if [ "${1:-}" = --run-db ]; then
  mode=run
  user=${BATCHERD_RUN_USER:-batcherd_run}
  pass=${BATCHERD_RUN_PASSWORD:-batcherd_run}
  rundb=${BATCHERD_RUN_DB:-batcherd}
elif [ -n "${1:-}" ]; then
  echo "usage: $0 [--run-db]" >&2; exit 2
else
  user=${BATCHERD_TEST_USER:-batcherd}
  pass=${BATCHERD_TEST_PASSWORD:-batcherd}
fi

log() { [ -n "${VERBOSE:-}" ] && echo "mariadb-bootstrap: $*" >&2 || true; }
die() { echo "mariadb-bootstrap: $*" >&2; exit 1; }

client() {
  if command -v mariadb >/dev/null 2>&1; then echo mariadb; elif command -v mysql >/dev/null 2>&1; then echo mysql; fi
}

user_ok() {
  local c; c=$(client); [ -n "$c" ] || return 1
  "$c" --protocol=tcp -h"$host" -P"$port" -u"$user" -p"$pass" -e 'SELECT 1' ${rundb:+"$rundb"} >/dev/null 2>&1
}

server_up() {
  local c; c=$(client); [ -n "$c" ] || return 1
  # Any answer from the server (even "access denied") means it runs.
  local out; out=$("$c" --protocol=tcp -h"$host" -P"$port" -uroot -e 'SELECT 1' 2>&1) && return 0
  case "$out" in *"Access denied"*|*"1698"*|*"1045"*) return 0;; esac
  return 1
}

as_root() {
  # Root over TCP with an empty password at host:port first (images that allow it; it is
  # the server asked for even when another one owns the default socket), then root
  # through the unix socket (fresh Debian).
  local c; c=$(client)
  "$c" --protocol=tcp -h"$host" -P"$port" -uroot "$@" 2>/dev/null ||
    "$c" ${BATCHERD_DB_SOCKET:+--socket="$BATCHERD_DB_SOCKET"} -uroot "$@"
}

if user_ok; then log "user $user already works"; exit 0; fi

if ! server_up; then
  if ! command -v mariadbd >/dev/null 2>&1 && [ ! -x /usr/sbin/mariadbd ]; then
    [ "$(id -u)" = 0 ] || die "MariaDB is not installed and this is not root: run 'sudo apt-get install mariadb-server', or point BATCHERD_TEST_DSN at a server."
    echo "mariadb-bootstrap: installing mariadb-server with apt-get (first run only)..." >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || die "apt-get update failed"
    apt-get install -y -qq mariadb-server mariadb-client >/dev/null || die "apt-get install mariadb-server failed"
  fi
  [ "$(id -u)" = 0 ] || die "MariaDB is installed but not running, and starting it needs root: run 'sudo service mariadb start'."
  log "starting mariadbd"
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
  if [ ! -d /var/lib/mysql/mysql ]; then
    mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null 2>&1 || die "mariadb-install-db failed"
  fi
  mbin=$(command -v mariadbd || echo /usr/sbin/mariadbd)
  nohup "$mbin" --user=mysql --bind-address="$host" --port="$port" >/tmp/batcherd-mariadbd.log 2>&1 &
  for _ in $(seq 1 60); do server_up && break; sleep 0.5; done
  server_up || die "mariadbd did not come up within 30 s; see /tmp/batcherd-mariadbd.log"
fi

if [ "$mode" = run ]; then
  # What `batcherd migrate` and `serve` need on their database (README, MySQL requirements).
  grants="SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER, INDEX, DROP, REFERENCES"
  sql="CREATE DATABASE IF NOT EXISTS \`$rundb\` CHARACTER SET utf8mb4;"
  for h in 127.0.0.1 localhost; do
    sql+="
CREATE USER IF NOT EXISTS '$user'@'$h' IDENTIFIED BY '$pass';
GRANT $grants ON \`$rundb\`.* TO '$user'@'$h';"
  done
  as_root -e "$sql" || die "could not create database $rundb and user $user as root (socket or TCP): run this as root (sudo make run-db), or create them yourself"
  user_ok || die "user $user cannot use database $rundb over TCP at $host:$port"
  echo "mariadb-bootstrap: database $rundb and user $user ready: BATCHERD_MYSQL_DSN='$user:$pass@tcp($host:$port)/$rundb'" >&2
  exit 0
fi

# The name patterns of the databases the test user creates and drops (`_` escaped: in a
# GRANT it matches any one character). Keep in step with the names in the code:
#   bt_            every test package (internal/store/storetest, internal/harness)
#   batcherd_demo_ make demo (cmd/batcherd-demo)
#   bench_         make bench and the Go benchmarks (bench/db.go)
db_patterns=('bt\_%' 'batcherd\_demo\_%' 'bench\_%')

sql="CREATE USER IF NOT EXISTS '$user'@'127.0.0.1' IDENTIFIED BY '$pass';
CREATE USER IF NOT EXISTS '$user'@'localhost' IDENTIFIED BY '$pass';"
for p in "${db_patterns[@]}"; do
  for h in 127.0.0.1 localhost; do
    sql+="
GRANT ALL PRIVILEGES ON \`$p\`.* TO '$user'@'$h';"
  done
done
as_root -e "$sql" || die "could not create user $user as root (socket or TCP); create it yourself or set BATCHERD_TEST_DSN"

user_ok || die "user $user still cannot log in over TCP at $host:$port"
log "ready"
