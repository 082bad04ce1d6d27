#!/usr/bin/env bash
# Builds the Worker into build/ (wasm + JS shim) and the demo app into public/assets/.
# Incremental: a rebuild with no change takes seconds.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
worker-build --release "$@"
"$ROOT/scripts/build-web.sh"
