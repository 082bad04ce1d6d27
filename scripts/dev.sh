#!/usr/bin/env bash
# Sets everything up, builds, and serves the demo under `wrangler dev` (state kept in .wrangler/).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
"$ROOT/scripts/setup.sh"
"$ROOT/scripts/build.sh"
port="${PORT:-8787}"
echo
echo "Demo: http://127.0.0.1:$port/  (parent agent at ws://127.0.0.1:$port/agents/assistant/<name>)"
echo
exec wrangler dev --local --ip 127.0.0.1 --port "$port" --persist-to "$ROOT/.wrangler/state" "$@"
