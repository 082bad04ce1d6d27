#!/usr/bin/env bash
# Sets everything up, builds the demo Worker, the demo app and the example Worker once, and runs
# the whole test suite: lints (native and wasm32, with and without the demo), the API docs,
# native unit tests against SQLite and doctests, the schema checks in wasm on V8, then end-to-end tests that start `wrangler dev`
# (real workerd), a scripted model server, Node clients and Chromium themselves.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
"$ROOT/scripts/setup.sh" --with-browser
"$ROOT/scripts/build.sh" --example
cargo fmt --all -- --check
# Every guard of docs/testing.md still names code that is there (removing each is scripts/guards/run.py).
python3 scripts/guards/run.py --check
cargo clippy --workspace --all-targets --features agent-tools/demo -- -D warnings
# Without the demo: demo-worker is left out, or its dependency would turn the feature on for all.
cargo clippy --workspace --exclude agent-tools-demo --all-targets -- -D warnings
cargo clippy --target wasm32-unknown-unknown -p agent-tools --lib --features demo -- -D warnings
cargo clippy --target wasm32-unknown-unknown -p agent-tools --lib -- -D warnings
cargo clippy --target wasm32-unknown-unknown -p hello-agents -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -p agent-tools --target wasm32-unknown-unknown
cargo test -p agent-tools --doc --features demo,testing
# The crate as it would be published: packaged, and the package built on its own.
cargo package -p agent-tools --allow-dirty --offline
# The schema checks compiled to wasm32 and run on V8's RegExp, in Node (tests/wasm.rs).
CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner \
  cargo test --target wasm32-unknown-unknown -p agent-tools --test wasm
# The example Worker's own tests: its agents hosted natively by the test kit (no wrangler).
cargo test -p hello-agents --tests
# Three guards of docs/testing.md removed in turn, each caught by a test its row names: a different
# three for each commit, so successive CI runs go round all of them (the whole: run.py, ~40 min).
SIM_SCHEDULES=300 python3 scripts/guards/run.py --sample 3
rm -f "$ROOT/test-artifacts/scale.txt"
cargo test -p agent-tools --features demo --lib --tests -- --test-threads="${TEST_THREADS:-2}" "$@"
if [ -f "$ROOT/test-artifacts/scale.txt" ]; then
  echo "== figures measured by tests/e2e/scale.rs (not assertions) =="
  cat "$ROOT/test-artifacts/scale.txt"
fi
