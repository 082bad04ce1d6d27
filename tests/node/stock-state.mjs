// The stock AgentClient (agents/client) and the Rust agent's state: one tab's setState reaches
// another tab's onStateUpdate, a refused change reaches the sender's onStateUpdateError, and a
// tab that connects later is ready with the state (the identity says it follows).
// Usage: node stock-state.mjs <host:port> <agent-name>
import WebSocket from "ws";
import { AgentClient } from "agents/client";

const [host, name] = process.argv.slice(2);
const timeout = setTimeout(() => {
  console.error("timed out");
  process.exit(2);
}, 30_000);
const until = async (check) => {
  while (!check()) await new Promise((r) => setTimeout(r, 20));
};
const open = (log) =>
  new AgentClient({
    agent: "Assistant",
    name,
    host,
    WebSocket,
    onStateUpdate: (state, source) => log.updates.push({ state, source }),
    onStateUpdateError: (error) => log.errors.push(error)
  });

const a = { updates: [], errors: [] };
const b = { updates: [], errors: [] };
const tabA = open(a);
const tabB = open(b);
await tabA.ready;
await tabB.ready;
tabA.setState({ budget: 3 });
await until(() => b.updates.length > 0);
tabA.setState({ budget: 99 });
await until(() => a.errors.length > 0);
const c = { updates: [], errors: [] };
const tabC = open(c);
await tabC.ready;
console.log(JSON.stringify({ a, b, c, stateOfC: tabC.state }));
clearTimeout(timeout);
for (const tab of [tabA, tabB, tabC]) tab.close();
process.exit(0);
