#!/usr/bin/env bash
# Builds the Worker into build/ (wasm + JS shim). Incremental: a no-change rebuild takes seconds.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
worker-build --release "$@"
