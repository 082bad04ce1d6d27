#!/usr/bin/env bash
# Builds the demo Worker into build/ (wasm + JS shim) and the demo app into public/assets/;
# with --example, also the example Worker (examples/hello-agents/build/) the tests drive.
# Incremental: a rebuild with no change takes seconds.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
example=false
if [ "${1:-}" = "--example" ]; then example=true; shift; fi
# The demo is a feature of the library (its default features are the library alone), linked as a
# cdylib by the demo-worker crate, so the library itself stays an rlib; wrangler.toml serves build/.
(cd "$ROOT/demo-worker" && worker-build --release "$@")
rm -rf "$ROOT/build"
mv "$ROOT/demo-worker/build" "$ROOT/build"
strip_wasm_names "$ROOT/build/index_bg.wasm"
"$ROOT/scripts/build-web.sh"
if $example; then
  "$ROOT/scripts/build-example.sh" "$@"
fi
