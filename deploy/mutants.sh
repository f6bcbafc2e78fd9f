#!/usr/bin/env bash
# Mutation testing of the generator (docs/generator.md, "Planted bugs"): plants each bug of
# deploy/mutants/*.patch, one at a time, in a scratch copy of this tree (never in the
# product), runs the test the patch names on it (`# test: <binary> [<test>]`, where a
# <test> ending in `::` is a module of tests/it, every test of it run; with
# `# faults: ...` as WALRUS_GEN_FAULTS if given), and prints, per plant, whether a violation
# was found and how many seconds after its mode started the first came.
#
#   deploy/mutants.sh                         # every plant, seed 1, the default run length
#   deploy/mutants.sh deploy/mutants/last-key-unmarked.patch
#   WALRUS_GEN_SEED=7 WALRUS_GEN_SECONDS=120 deploy/mutants.sh
#
# Violations of bugs today's tree is known to have (WALRUS_MUTANTS_KNOWN, a regular
# expression; none by default) are not counted: a plant counts as caught by a violation of
# another kind.
#
# The scratch copy is always at the same path, with a target directory of its own
# ($WALRUS_MUTANTS_DIR/target: the first plant builds everything, the next ones walrus
# only). Not this tree's: cargo puts every build's walrus binary at the same place in a
# target directory, and this tree's tests would run the last plant's. Logs go to
# $WALRUS_MUTANTS_DIR/<plant>.log.
set -euo pipefail
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
dir=${WALRUS_MUTANTS_DIR:-/tmp/walrus-mutants}
export CARGO_TARGET_DIR=${WALRUS_MUTANTS_TARGET:-$dir/target}
export WALRUS_GEN_SEED=${WALRUS_GEN_SEED:-1}
known=${WALRUS_MUTANTS_KNOWN-}
mkdir -p "$dir"
patches=("$@")
if [ ${#patches[@]} -eq 0 ]; then
    patches=("$root"/deploy/mutants/*.patch)
fi
printf '| plant | test | caught | first violation |\n|---|---|---|---|\n'
for patch in "${patches[@]}"; do
    name=$(basename "$patch" .patch)
    read -r bin filter <<< "$(sed -n 's/^# test: //p' "$patch")"
    test=$bin
    case "$filter" in
        "") args=() ;;
        *::) args=("$filter"); test=${filter%::} ;;
        *) args=(--exact "$filter") ;;
    esac
    faults=$(sed -n 's/^# faults: //p' "$patch")
    rm -rf "$dir/src"
    mkdir -p "$dir/src"
    git -C "$root" archive HEAD | tar -x -C "$dir/src"
    # This tree's local cargo settings (untracked), so that the dependencies' builds are
    # shared.
    if [ -e "$root/.cargo/config.toml" ]; then
        mkdir -p "$dir/src/.cargo" && cp "$root/.cargo/config.toml" "$dir/src/.cargo/"
    fi
    patch -s -d "$dir/src" -p1 < "$patch"
    log="$dir/$name.log"
    (cd "$dir/src" && WALRUS_GEN_FAULTS="$faults" \
        cargo test --test "$bin" -- --nocapture ${args[@]+"${args[@]}"}) \
        > "$log" 2>&1 || true
    # The earliest of the first mode that found one (each mode's clock starts at 0).
    found=$(grep '^VIOLATION' "$log" | grep -Ev "${known:-^$}" || true)
    mode=$(head -1 <<< "$found" | cut -d' ' -f4)
    first=$(grep -F " $mode " <<< "$found" | sort -t' ' -k6,6n | head -1 || true)
    if [ -n "$first" ]; then
        after=$(sed -n 's/^VIOLATION (\([^)]*\)).*/\1/p' <<< "$first")
        kind=$(sed 's/^VIOLATION ([^)]*): \([^:]*\):.*/\1/' <<< "$first")
        printf '| %s | %s | yes | %s: %s |\n' "$name" "$test" "$after" "$kind"
    elif grep -q '^test result: FAILED' "$log"; then
        # A test that checks by assertions (crash_points): its first failure.
        what=$(grep -m1 -A1 'panicked at' "$log" | tail -1 | cut -c1-200)
        printf '| %s | %s | yes | test failed: %s |\n' "$name" "$test" "$what"
    elif grep -q 'test result:' "$log"; then
        printf '| %s | %s | no | |\n' "$name" "$test"
    else
        printf '| %s | %s | build or run failed (see %s) | |\n' "$name" "$test" "$log"
    fi
done
