#!/usr/bin/env bash
# Installs everything the project needs, pinned, skipping what is already there (idempotent).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"

step() { printf '\033[1m==> %s\033[0m\n' "$*"; }

if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
  step "rustup target add wasm32-unknown-unknown"
  rustup target add wasm32-unknown-unknown
fi

if [ "$(worker-build --version 2>/dev/null | awk '{print $2}')" != "$WORKER_BUILD_VERSION" ]; then
  step "cargo install worker-build $WORKER_BUILD_VERSION (a few minutes, once)"
  cargo install worker-build --version "$WORKER_BUILD_VERSION"
fi

if [ "$(wasm-bindgen --version 2>/dev/null | awk '{print $2}')" != "$WASM_BINDGEN_VERSION" ]; then
  step "cargo install wasm-bindgen-cli $WASM_BINDGEN_VERSION (a few minutes, once)"
  # --locked fails for this crate here; the version itself is exact.
  cargo install wasm-bindgen-cli --version "$WASM_BINDGEN_VERSION" --force
fi

# npm packages from the lockfile; re-run only when the lockfile changed.
stamp="node_modules/.package-lock.stamp"
if [ ! -f "$stamp" ] || ! cmp -s package-lock.json "$stamp"; then
  step "npm ci"
  npm ci --no-audit --no-fund
  cp package-lock.json "$stamp"
fi

step "setup complete"
