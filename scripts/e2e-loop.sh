#!/usr/bin/env bash
# Runs the end-to-end suite (or part of it) N times in a row from a clean clone of this
# repository's HEAD, and counts failures per test. Not part of `.ci/run`: it proves the suite is
# stable. Usage:
#
#   ./scripts/e2e-loop.sh [-n N] [FILTER]      e.g.  ./scripts/e2e-loop.sh -n 50 browser::
#
# FILTER is a `cargo test` name filter (default: the whole suite). Each failing run's output is
# kept in the results directory (printed at the end), with the wrangler logs and screenshots the
# tests save under test-artifacts/.
set -uo pipefail
source "$(dirname "$0")/env.sh"

runs=10
if [ "${1:-}" = "-n" ]; then runs="$2"; shift 2; fi
filter="${1:-}"

work="$(mktemp -d /tmp/e2e-loop.XXXXXX)"
results="$work/results"
mkdir -p "$results"
git clone -q "$ROOT" "$work/p"
cd "$work/p"
echo "clean clone of $(git rev-parse --short HEAD) in $work/p; results in $results"

./scripts/setup.sh --with-browser >"$results/setup.log" 2>&1 || { cat "$results/setup.log"; exit 1; }
./scripts/build.sh >"$results/build.log" 2>&1 || { cat "$results/build.log"; exit 1; }
cargo test --test e2e --no-run >"$results/compile.log" 2>&1 || { cat "$results/compile.log"; exit 1; }

declare -A failures=()
failed_runs=0
for i in $(seq 1 "$runs"); do
  started=$(date +%s)
  out="$results/run-$i.log"
  rm -rf test-artifacts
  cargo test --test e2e -- --test-threads="${TEST_THREADS:-2}" $filter >"$out" 2>&1
  rc=$?
  summary="$(grep -E '^test result' "$out" | tail -1)"
  echo "run $i/$runs: exit $rc in $(( $(date +%s) - started )) s: $summary"
  if [ "$rc" != 0 ]; then
    failed_runs=$((failed_runs + 1))
    while read -r name; do
      failures[$name]=$(( ${failures[$name]:-0} + 1 ))
      echo "  FAILED: $name"
    done < <(grep -E '^test .* \.\.\. FAILED$' "$out" | sed -E 's/^test (.*) \.\.\. FAILED$/\1/')
    [ -d test-artifacts ] && cp -r test-artifacts "$results/artifacts-$i"
  else
    rm -f "$out"
  fi
done

echo
echo "$failed_runs of $runs runs failed${filter:+ (filter: $filter)}"
for name in "${!failures[@]}"; do
  echo "  ${failures[$name]}× $name"
done
echo "outputs of failing runs: $results"
[ "$failed_runs" = 0 ]
