#!/usr/bin/env bash
# Installs the MariaDB server binaries (mariadbd, mariadb-install-db) and client from the
# distribution's packages, for the faithful DBBench backend and its tests. Idempotent and
# non-interactive; no service is started (hsjax starts its own socket-only server).
set -euo pipefail

if command -v mariadbd >/dev/null 2>&1 && command -v mariadb-install-db >/dev/null 2>&1; then
  echo "install_mariadb: $(mariadbd --version) already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# The *-core packages carry the binaries without the init scripts and the system service.
$SUDO apt-get install -y -q --no-install-recommends mariadb-server-core mariadb-client-core \
  || $SUDO apt-get install -y -q --no-install-recommends mariadb-server mariadb-client
echo "install_mariadb: $(mariadbd --version) installed"
