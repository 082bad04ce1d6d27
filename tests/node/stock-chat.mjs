// The stock TypeScript clients against the Rust agent: AgentClient (agents/client) connects,
// the stock chat transport (agents/chat/transport) sends a message as useAgentChat does, and
// the AI SDK's own readUIMessageStream (strict about chunk order) builds the answer.
// Usage: node stock-chat.mjs <host:port> <agent-name> <text>
import WebSocket from "ws";
import { AgentClient } from "agents/client";
import { WebSocketChatTransport } from "agents/chat/transport";
import { readUIMessageStream } from "ai";

const [host, name, text] = process.argv.slice(2);
const agent = new AgentClient({ agent: "Assistant", name, host, WebSocket });
const timeout = setTimeout(() => {
  console.error("timed out");
  process.exit(2);
}, 60_000);

await agent.ready;
const transport = new WebSocketChatTransport({ agent });
const messages = [{ id: "stock-user-1", role: "user", parts: [{ type: "text", text }] }];
const stream = await transport.sendMessages({
  chatId: name,
  messages,
  trigger: "submit-message",
  messageId: undefined,
  abortSignal: undefined
});
let message;
for await (const m of readUIMessageStream({ stream })) message = m;
const runs = await agent.call("runs", []);
// A failing call rejects with the server's message.
const rejected = await agent.call("noSuchMethod", []).then(
  () => null,
  (e) => String(e?.message ?? e)
);
console.log(JSON.stringify({ identity: { agent: agent.agent, name: agent.name }, message, runs, rejected }));
clearTimeout(timeout);
agent.close();
process.exit(0);
