# Sourced by the other scripts: pinned versions and the environment that keeps every tool local.
# worker-build looks for its helpers in these variables before it would download them.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export ROOT
export PATH="$HOME/.cargo/bin:$ROOT/node_modules/.bin:$PATH"
export WORKER_BUILD_VERSION="0.8.7"
export CARGO_MUTANTS_VERSION="27.1.0"
export WASM_BINDGEN_BIN="$HOME/.cargo/bin/wasm-bindgen"
export WASM_OPT_BIN="$ROOT/node_modules/.bin/wasm-opt"
export ESBUILD_BIN="$ROOT/node_modules/.bin/esbuild"
export CLOUDFLARE_CF_FETCH_ENABLED=false
export WRANGLER_SEND_METRICS=false
export WRANGLER_LOG_PATH="$ROOT/.wrangler/logs"
# The wasm-bindgen CLI must match the wasm-bindgen crate in Cargo.lock exactly.
WASM_BINDGEN_VERSION="$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' "$ROOT/Cargo.lock")"
export WASM_BINDGEN_VERSION

# Drops the wasm name section worker-build keeps (about 65 KiB of the gzipped upload; wasm
# frames in a stack trace then show as numbers). KEEP_WASM_NAMES=1 keeps it.
strip_wasm_names() {
  [ "${KEEP_WASM_NAMES:-0}" = "1" ] && return 0
  "$WASM_OPT_BIN" "$1" --strip-debug --strip-producers --enable-mutable-globals --enable-sign-ext \
    --enable-nontrapping-float-to-int --enable-bulk-memory --enable-multivalue --enable-reference-types \
    --enable-exception-handling -o "$1"
}
