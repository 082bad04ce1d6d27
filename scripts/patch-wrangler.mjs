#!/usr/bin/env node
// Fixes a request-parking bug in wrangler 4.86.0's dev proxy, in the installed copy under the
// node_modules directories given as arguments. Idempotent; fails loudly if the file is not the
// one this patch was written for (a wrangler upgrade must re-check the bug, not skip the fix).
//
// The bug (upstream: cloudflare/workers-sdk#14593; the network race: #14641). `wrangler dev`
// puts a proxy Worker (ProxyWorker, in its own workerd) in front of the user's Worker. When the
// proxy's fetch to the user's Worker fails, it decides whether the user's Worker was replaced
// (a reload) by comparing the request's whole URL, path and query included, with the user
// Worker's origin + "/". So for every request other than `GET /` a failure counts as "replaced",
// and a GET or HEAD is put on a retry queue that only a reload's `play` message or the next
// incoming request drains: with neither coming, the request hangs. Such failures happen with no
// reload: the proxy reuses an idle keep-alive connection at the moment the user's workerd closes
// it (both sides time idle connections out after 5 s), or the connection was left broken by a
// client that dropped the previous response unread.
//
// Measured on the demo Worker, GET /?i=N every 5.000 s, 40 requests, nothing else sent: unpatched,
// 14 parked (each answered only when an unrelated request arrived, then logged as `GET / 200 OK
// (4010ms)`); patched, 0 parked and the slowest answer 41 ms. tests/e2e/dev_proxy.rs checks it.
//
// The patched `catch`: a failure while the user's Worker is unchanged (same origin, not paused)
// re-sends a GET or HEAD once at once, on a fresh connection (a request that met a closing idle
// connection never reached the Worker, and these methods carry no body to replay); a second
// failure answers 502 with the error. A request whose Worker was replaced or is reloading goes
// on the retry queue as before, and the queue is drained at once if the new Worker is already
// up (the `play` that would have drained it may have come first). Other methods keep wrangler's
// 503 "Your worker restarted mid-request".
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const VERSION = "4.86.0";
const MARKER = "agent-tools patch: ProxyWorker request parking";

const ORIGINAL = `      }).catch((error) => {
        const newUserWorkerUrl = this.proxyData && urlFromParts(this.proxyData.userWorkerUrl);
        if (userWorkerUrl.href === newUserWorkerUrl?.href) {
          void sendMessageToProxyController(this.env, {
            type: "error",
            error: {
              name: error.name,
              message: error.message,
              stack: error.stack,
              cause: error.cause
            }
          });
          deferredResponse.reject(error);
        } else if (request.method === "GET" || request.method === "HEAD") {
          this.requestRetryQueue.set(request, deferredResponse);
        } else {`;

const PATCHED = `      }).catch((error) => {
        // ${MARKER} (see scripts/patch-wrangler.mjs)
        const current = this.proxyData;
        const unchanged = current !== void 0 && userWorkerUrl.origin === urlFromParts(current.userWorkerUrl).origin;
        const bodyless = request.method === "GET" || request.method === "HEAD";
        this.resent ??= new WeakSet();
        if (unchanged && bodyless && this.resent.has(request)) {
          deferredResponse.resolve(new Response(\`wrangler dev's proxy could not reach the Worker: \${error.message}\`, { status: 502 }));
        } else if (bodyless) {
          if (unchanged) this.resent.add(request);
          this.requestRetryQueue.set(request, deferredResponse);
          this.processQueue();
        } else {`;

function patch(nodeModules) {
  const pkg = JSON.parse(readFileSync(join(nodeModules, "wrangler/package.json"), "utf8"));
  const file = join(nodeModules, "wrangler/wrangler-dist/ProxyWorker.js");
  if (pkg.version !== VERSION) {
    throw new Error(
      `${file}: wrangler ${pkg.version} is installed; this patch is for ${VERSION}. ` +
        "Check whether that version still parks failed GETs (workers-sdk#14593) and update scripts/patch-wrangler.mjs.",
    );
  }
  const source = readFileSync(file, "utf8");
  if (source.includes(MARKER)) return `${file}: already patched`;
  const at = source.indexOf(ORIGINAL);
  if (at < 0 || source.indexOf(ORIGINAL, at + 1) >= 0) {
    throw new Error(`${file}: the code this patch replaces is not there exactly once`);
  }
  writeFileSync(file, source.slice(0, at) + PATCHED + source.slice(at + ORIGINAL.length));
  return `${file}: patched`;
}

const dirs = process.argv.slice(2);
if (dirs.length === 0) {
  console.error("usage: patch-wrangler.mjs <node_modules> [<node_modules> ...]");
  process.exit(2);
}
try {
  for (const dir of dirs) console.log(patch(dir));
} catch (error) {
  console.error(`patch-wrangler: ${error.message}`);
  process.exit(1);
}
