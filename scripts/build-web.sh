#!/usr/bin/env bash
# Bundles the demo app (web/app.jsx and the stock client libraries) into public/assets/app.js.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
mkdir -p public/assets
esbuild web/app.jsx --bundle --format=esm --minify --jsx=automatic \
  --define:process.env.NODE_ENV='"production"' --log-level=warning --outfile=public/assets/app.js
