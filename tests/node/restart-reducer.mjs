// Two stock clients across a restart of the runtime: "steady" connects before it and reconnects
// after it, keeping its state and its seen-frame set as `useAgentToolEvents` does for the life of
// a page; "late" connects only after everything ended. Both apply frames with the stock reducer
// (`applyAgentToolEvent`, deduplicated with `agentToolEventDedupeKey` exactly like the hook).
// Usage: node restart-reducer.mjs <agent-name>; commands on stdin, one JSON object per line:
//   {"cmd":"connect","who":"steady"|"late","host":"127.0.0.1:<port>"}   (re)connects
//   {"cmd":"dump","runs":N,"status":S}   prints {"steady": state, "late": state} once both hold
//                             N runs, each with status S (what the test knows the end to be)
import readline from "node:readline";
import WebSocket from "ws";
import { AgentClient } from "agents/client";
import { applyAgentToolEvent, createAgentToolEventState } from "agents/chat";
import { n as agentToolEventDedupeKey } from "../../node_modules/agents/dist/agent-tools-CdJC-8Dc.js";

const [name] = process.argv.slice(2);
const clients = {
  steady: { state: createAgentToolEventState(), seen: new Set(), agent: null },
  late: { state: createAgentToolEventState(), seen: new Set(), agent: null }
};
setTimeout(() => {
  console.error("timed out");
  process.exit(2);
}, 180_000);

function connect(who, host) {
  const client = clients[who];
  client.agent?.close();
  const agent = new AgentClient({ agent: "Assistant", name, host, WebSocket });
  agent.addEventListener("message", (event) => {
    const frame = JSON.parse(event.data);
    if (frame.type !== "agent-tool-event") return;
    const key = agentToolEventDedupeKey(frame);
    if (client.seen.has(key)) return;
    client.seen.add(key);
    client.state = applyAgentToolEvent(client.state, frame);
  });
  client.agent = agent;
  return agent.ready;
}

const lines = readline.createInterface({ input: process.stdin });
for await (const line of lines) {
  const command = JSON.parse(line);
  if (command.cmd === "connect") {
    await connect(command.who, command.host);
    console.log(JSON.stringify({ connected: command.who }));
  } else if (command.cmd === "dump") {
    const settled = (state) => {
      const runs = Object.values(state.runsById);
      return runs.length >= command.runs && runs.every((run) => run.status === command.status);
    };
    while (!settled(clients.steady.state) || !settled(clients.late.state)) await new Promise((r) => setTimeout(r, 20));
    console.log(JSON.stringify({ steady: clients.steady.state, late: clients.late.state }));
    for (const client of Object.values(clients)) client.agent?.close();
    process.exit(0);
  }
}
