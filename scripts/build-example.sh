#!/usr/bin/env bash
# Builds the example Worker (examples/hello-agents) into its build/ directory.
# Incremental: a rebuild with no change takes seconds.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT/examples/hello-agents"
worker-build --release "$@"
strip_wasm_names "$ROOT/examples/hello-agents/build/index_bg.wasm"
