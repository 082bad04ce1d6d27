#!/usr/bin/env bash
# Sets everything up, builds the Worker and the demo app, and serves them under `wrangler dev`
# (state kept in .wrangler/state). For a loop that rebuilds on every change, run
# `npx wrangler dev` after this has set things up: wrangler.toml's [build] does the rest.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
"$ROOT/scripts/setup.sh"
"$ROOT/scripts/build.sh"
"$ROOT/scripts/prebuilt-config.sh" "$ROOT/.wrangler/prebuilt.toml"
port="${PORT:-8787}"
echo
echo "Demo: http://127.0.0.1:$port/  (parent agent at ws://127.0.0.1:$port/agents/assistant/<name>)"
echo
exec wrangler dev -c "$ROOT/.wrangler/prebuilt.toml" --local --ip 127.0.0.1 --port "$port" \
  --persist-to "$ROOT/.wrangler/state" "$@"
