#!/usr/bin/env bash
# Tests per minute through the test kit's docker and initdb sources: the same test binaries,
# run whole (one process each, as `cargo test` runs them), the sources alternating round by
# round so both see the same machine load. Prints a Markdown table.
#
#   bash testcontainers/bench/tests_per_minute.sh [ROUNDS]        # default 5
#
# Needs a Docker engine with the image PGTENANT_TESTKIT_IMAGE names (this repository's
# .cargo/config.toml says local/postgres:15 with host networking; cargo passes that on, so the
# binaries are run through `cargo test` here, after one build).
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-5}
tests=(-p pgtenant --test control_plane --test tenant_ids --test leases --test handoff --test opening)

cargo test -q "${tests[@]}" --no-run 2>/dev/null
count=$(cargo test -q "${tests[@]}" -- --list 2>/dev/null | grep -c ': test$')

log=$(mktemp)
trap 'rm -f "$log"' EXIT
declare -A times
for round in $(seq 1 "$rounds"); do
    for source in docker initdb; do
        start=$(date +%s%N)
        PGTENANT_TESTKIT=$source cargo test -q "${tests[@]}" >"$log" 2>&1 \
            || { echo "round $round with $source failed:" >&2; grep -v '^\.*$' "$log" | tail -40 >&2; exit 1; }
        end=$(date +%s%N)
        times[$source]+="$(( (end - start) / 1000000 )) "
    done
done

echo "$count tests (${tests[*]}), $rounds rounds, median wall time of a whole run"
echo
echo "| source | wall (ms) | tests per minute |"
echo "|---|---:|---:|"
for source in docker initdb; do
    median=$(echo "${times[$source]}" | tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    echo "| $source | $median | $(( count * 60000 / median )) |"
done
