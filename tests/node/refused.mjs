// The stock AgentClient (agents/client) against an agent that refuses it: it must see one close
// with the server's code, take it as final, and not reconnect.
// Usage: node refused.mjs <host:port> <agent-name> [token]   → prints {"closes":[codes...],"opened":n}
import WebSocket from "ws";
import { AgentClient } from "agents/client";

const [host, name, token] = process.argv.slice(2);
const closes = [];
let opened = 0;
const agent = new AgentClient({
  agent: "Assistant",
  name,
  host,
  WebSocket,
  query: token ? { token } : undefined,
  minReconnectionDelay: 100,
  maxReconnectionDelay: 200
});
agent.addEventListener("open", () => opened++);
agent.addEventListener("close", (e) => closes.push(e.code));
agent.ready.catch(() => {});
// Long enough for several reconnects at the delays above, had the client wanted them.
setTimeout(() => {
  console.log(JSON.stringify({ closes, opened }));
  agent.close();
  process.exit(0);
}, 2500);
