#!/usr/bin/env bash
# Builds the release artifacts into dist/ (or --out DIR), so that a user can install walrus
# without compiling it:
#
#   walrus-VERSION-TARGET.tar.gz   bin/walrus (release build), config.toml, the systemd unit
#                                  and its configuration (systemd/), the alert rules
#                                  (prometheus/), the dashboard (grafana/), the docs, LICENSE
#   walrus-CHARTVERSION.tgz        the Helm chart, packaged (`helm install walrus FILE.tgz`)
#   SHA256SUMS                     for `sha256sum -c SHA256SUMS`
#
#   deploy/release.sh                      # builds walrus (cargo build --release --locked)
#   deploy/release.sh --binary PATH        # packages an existing walrus binary instead
#   deploy/release.sh --out DIR            # writes the artifacts to DIR
#
# Needs helm 3 (deploy/setup.sh --test builds it into its cache directory) for the chart.
# The tarball's files carry the commit's time and root's ownership: no builder's user or clock.
set -euo pipefail
cd "$(dirname "$0")/.."

BINARY=""
OUT="dist"
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) BINARY="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    *) echo "usage: deploy/release.sh [--binary PATH] [--out DIR]" >&2; exit 2 ;;
  esac
done

field() { sed -n "s/^$1 *[:=] *\"\\{0,1\\}\\([^\"]*\\)\"\\{0,1\\}\$/\\1/p" "$2" | head -n1; }
VERSION="$(field version Cargo.toml)"
CHART_VERSION="$(field version helm/walrus/Chart.yaml)"
APP_VERSION="$(field appVersion helm/walrus/Chart.yaml)"
if [ "$APP_VERSION" != "$VERSION" ]; then
  echo "release: helm/walrus/Chart.yaml's appVersion is $APP_VERSION but Cargo.toml's version is $VERSION; make them one" >&2
  exit 1
fi

HELM=""
for c in "${XDG_CACHE_HOME:-$HOME/.cache}/walrus/bin/helm" helm; do
  if "$c" version --template '{{.Version}}' 2>/dev/null | grep -q '^v3\.'; then HELM="$c"; break; fi
done
if [ -z "$HELM" ]; then
  echo "release: helm 3 not found; deploy/setup.sh --test builds it" >&2
  exit 1
fi

if [ -z "$BINARY" ]; then
  cargo build --release --locked --bin walrus
  BINARY="target/release/walrus"
fi
if ! "$BINARY" --version | grep -q "^walrus $VERSION "; then
  echo "release: $BINARY is not walrus $VERSION: $("$BINARY" --version 2>&1 | head -n1)" >&2
  exit 1
fi

TARGET="$(rustc -vV | sed -n 's/^host: //p')"
NAME="walrus-$VERSION-$TARGET"
mkdir -p "$OUT"
STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/$NAME"/{bin,systemd,prometheus,grafana}
install -m 0755 "$BINARY" "$STAGE/$NAME/bin/walrus"
for f in config.toml LICENSE README.md; do cp "$f" "$STAGE/$NAME/"; done
cp -r docs "$STAGE/$NAME/docs"
cp deploy/systemd/walrus.service deploy/systemd/walrus.toml deploy/systemd/walrus-tls.conf "$STAGE/$NAME/systemd/"
cp deploy/prometheus/walrus-alerts.yml "$STAGE/$NAME/prometheus/"
cp deploy/grafana/walrus-dashboard.json "$STAGE/$NAME/grafana/"

# The commit's time, so that two builds of one commit give the same tarball.
MTIME="@$(git log -1 --format=%ct 2>/dev/null || echo 0)"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="$MTIME" \
  -C "$STAGE" -cf - "$NAME" | gzip -n > "$OUT/$NAME.tar.gz"

"$HELM" lint helm/walrus --set image.repository=walrus >/dev/null
"$HELM" package helm/walrus --destination "$OUT" >/dev/null

(cd "$OUT" && sha256sum "$NAME.tar.gz" "walrus-$CHART_VERSION.tgz" > SHA256SUMS)
echo "release: $OUT/$NAME.tar.gz, $OUT/walrus-$CHART_VERSION.tgz, $OUT/SHA256SUMS"
