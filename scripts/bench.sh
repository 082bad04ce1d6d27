#!/usr/bin/env bash
# Benchmarks this Worker against the TypeScript Agents SDK doing the same work (both under
# wrangler dev on this machine) and prints the numbers. Installs the pinned TypeScript baseline
# in bench/ts-worker/ first.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
"$ROOT/scripts/setup.sh"
"$ROOT/scripts/build.sh"
if [ ! -d bench/ts-worker/node_modules ] || ! cmp -s bench/ts-worker/package-lock.json bench/ts-worker/node_modules/.package-lock.stamp; then
  (cd bench/ts-worker && npm ci --no-audit --no-fund && cp package-lock.json node_modules/.package-lock.stamp)
fi
# The same dev-proxy fix as the main install (scripts/patch-wrangler.mjs): both sides run on it.
node scripts/patch-wrangler.mjs bench/ts-worker/node_modules
cargo bench --bench compare "$@"
