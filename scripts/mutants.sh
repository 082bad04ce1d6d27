#!/usr/bin/env bash
# Mutation testing of the engines, one shard at a time: ./scripts/mutants.sh K N runs shard K
# (0 ≤ K < N) of the mutants of src/parent, src/child, src/protocol and src/types, against the
# library's unit tests, the simulation and the kit suites. The lists of caught, missed, hanging
# (timeout) and unviable mutants are copied to mutants/<commit>/shard-K-of-N/ to be committed;
# docs/testing.md keeps the counts and an explanation for every survivor. Not part of the test
# command.
#
# MUTANTS_AT=<commit> runs the shard over that commit (checked out in target/, not here), so
# the shards of one campaign cover one list of mutants while the code moves on.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"

if [ $# -ne 2 ]; then
  echo "usage: $0 SHARD SHARDS   (e.g. $0 0 8)" >&2
  exit 2
fi

if [ "$(cargo mutants --version 2>/dev/null | awk '{print $2}')" != "$CARGO_MUTANTS_VERSION" ]; then
  echo "==> cargo install cargo-mutants $CARGO_MUTANTS_VERSION (a few minutes, once)"
  cargo install cargo-mutants --version "$CARGO_MUTANTS_VERSION" --locked
fi

# The mutants are built in a copy of the tree; dependencies come from one target directory kept
# between shards, so a shard rebuilds only this crate before its baseline.
export CARGO_TARGET_DIR="$ROOT/target/mutants-shards"
export SIM_SCHEDULES="${SIM_SCHEDULES:-200}"
rev="$(git rev-parse --short=7 "${MUTANTS_AT:-HEAD}")"
tree="$ROOT"
if [ -n "${MUTANTS_AT:-}" ]; then
  tree="$ROOT/target/mutants-at-$rev"
  [ -d "$tree" ] || git worktree add --detach "$tree" "$rev"
fi
out="$CARGO_TARGET_DIR/out-$rev-$1-of-$2"
keep="$ROOT/mutants/$rev/shard-$1-of-$2"
mkdir -p "$out"
cd "$tree"
cargo mutants -p agent-tools --profile mutants --features demo,testing \
  --file 'src/parent/**' --file 'src/child/**' --file 'src/protocol/**' --file 'src/types/**' \
  --exclude '**/tests.rs' --exclude '**/testing.rs' --exclude-re 'impl (std::fmt::)?Debug for' \
  --shard "$1/$2" -j "${MUTANTS_JOBS:-1}" --timeout 120 --build-timeout 600 --output "$out" \
  -- --lib --test kit_approvals --test kit_clear --test kit_demo --test kit_mediated \
  --test kit_seed_rows --test kit_turns || status=$?
mkdir -p "$keep"
cp "$out"/mutants.out/{caught,missed,timeout,unviable}.txt "$keep"/
wc -l "$keep"/*.txt
# cargo-mutants exits 2 when a mutant was missed, 3 when one hung the tests: the lists say which.
exit "${status:-0}"
