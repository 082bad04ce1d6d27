// A connection to the Worker's isolate through wrangler dev's inspector (the DevTools protocol):
// `command(method, params)` sends one call and resolves with its reply. Shared by
// bench/profile.mjs and bench/memory.mjs.
import WebSocket from "ws";

export async function connectInspector(inspectorPort) {
  const targets = await (await fetch(`http://127.0.0.1:${inspectorPort}/json`)).json();
  const devtools = new WebSocket(targets[0].webSocketDebuggerUrl);
  await new Promise((resolve, reject) => devtools.once("open", resolve).once("error", reject));
  let nextId = 1;
  const replies = new Map();
  devtools.on("message", (data) => {
    const message = JSON.parse(data.toString());
    replies.get(message.id)?.(message);
    replies.delete(message.id);
  });
  return (method, params = {}) =>
    new Promise((resolve) => {
      const id = nextId++;
      replies.set(id, resolve);
      devtools.send(JSON.stringify({ id, method, params }));
    });
}
