# Sourced by the other scripts: pinned versions and the environment that keeps every tool local.
# worker-build looks for its helpers in these variables before it would download them.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export ROOT
export PATH="$HOME/.cargo/bin:$ROOT/node_modules/.bin:$PATH"
export WORKER_BUILD_VERSION="0.8.7"
export WASM_BINDGEN_BIN="$HOME/.cargo/bin/wasm-bindgen"
export WASM_OPT_BIN="$ROOT/node_modules/.bin/wasm-opt"
export ESBUILD_BIN="$ROOT/node_modules/.bin/esbuild"
export CLOUDFLARE_CF_FETCH_ENABLED=false
export WRANGLER_SEND_METRICS=false
export WRANGLER_LOG_PATH="$ROOT/.wrangler/logs"
# The wasm-bindgen CLI must match the wasm-bindgen crate in Cargo.lock exactly.
WASM_BINDGEN_VERSION="$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' "$ROOT/Cargo.lock")"
export WASM_BINDGEN_VERSION
