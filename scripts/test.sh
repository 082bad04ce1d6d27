#!/usr/bin/env bash
# Sets everything up, builds the Worker and the demo app once, and runs the whole test suite:
# native unit tests against SQLite, then end-to-end tests that start `wrangler dev` (real
# workerd), a scripted model server, Node clients and Chromium themselves.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
"$ROOT/scripts/setup.sh" --with-browser
"$ROOT/scripts/build.sh"
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
cargo clippy --target wasm32-unknown-unknown --lib -- -D warnings
cargo test --lib --tests -- --test-threads="${TEST_THREADS:-2}" "$@"
