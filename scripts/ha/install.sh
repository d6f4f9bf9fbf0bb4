#!/bin/sh
# Installs what `make ha` needs and the machine lacks: Debian's galera-4 (the Galera
# provider), haproxy, rsync (state transfers) and mariadb-server (the nodes' mariadbd;
# 'make db' installs it too). Only missing packages are installed; nothing is started
# or configured outside the run's own temporary directory.
set -eu
missing=""
[ -e /usr/lib/galera/libgalera_smm.so ] || missing="$missing galera-4"
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || missing="$missing haproxy"
command -v rsync >/dev/null 2>&1 || missing="$missing rsync"
[ -x /usr/sbin/mariadbd ] || command -v mariadbd >/dev/null 2>&1 || missing="$missing mariadb-server"
command -v ss >/dev/null 2>&1 || missing="$missing iproute2"
[ -z "$missing" ] && exit 0
echo "make ha: installing$missing" >&2
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# The haproxy and mariadb-server packages would start their own system services;
# policy-rc.d 101 keeps them from starting (the run starts its own processes).
if [ ! -e /usr/sbin/policy-rc.d ]; then
	printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
	$SUDO chmod +x /usr/sbin/policy-rc.d
	trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
fi
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
