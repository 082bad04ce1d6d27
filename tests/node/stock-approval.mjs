// The stock chat transport (agents/chat/transport) and a call that needs approval, as
// useAgentChat drives them: the message streams until the approval request and ends; the answer
// goes out as cf_agent_tool_approval; the transport's tool continuation (expectToolContinuation,
// then reconnectToStream: the resume handshake) carries the rest of the turn, which the AI SDK's
// own readUIMessageStream applies to the same message. A second tab's late answer is refused.
// Usage: node stock-approval.mjs <host:port> <agent-name> <approve|deny>
import WebSocket from "ws";
import { AgentClient } from "agents/client";
import { WebSocketChatTransport } from "agents/chat/transport";
import { readUIMessageStream } from "ai";

const [host, name, answer] = process.argv.slice(2);
const timeout = setTimeout(() => {
  console.error("timed out");
  process.exit(2);
}, 60_000);
const open = () => new AgentClient({ agent: "Assistant", name, host, WebSocket });
const frames = (agent) => {
  const seen = [];
  agent.addEventListener("message", (e) => seen.push(JSON.parse(e.data)));
  return seen;
};

const tab = open();
const other = open();
const seenByTab = frames(tab);
const seenByOther = frames(other);
await Promise.all([tab.ready, other.ready]);
const transport = new WebSocketChatTransport({ agent: tab });
// What useAgentChat's message handler hands its transport: the resume handshake's answers.
tab.addEventListener("message", (e) => {
  const frame = JSON.parse(e.data);
  if (frame.type === "cf_agent_stream_resuming") transport.handleStreamResuming(frame);
  if (frame.type === "cf_agent_stream_pending") transport.handleStreamPending();
  if (frame.type === "cf_agent_stream_resume_none") transport.handleStreamResumeNone(frame);
});
const user = { id: "stock-user-1", role: "user", parts: [{ type: "text", text: "Publish QUIC" }] };
let asked;
const first = await transport.sendMessages({ chatId: name, messages: [user], trigger: "submit-message" });
for await (const m of readUIMessageStream({ stream: first })) asked = m;
const part = asked.parts.find((p) => p.type === "tool-publish");

// useAgentChat's addToolApprovalResponse: the frame, then its tool continuation.
tab.send(JSON.stringify({ type: "cf_agent_tool_approval", toolCallId: part.toolCallId, approved: answer === "approve", autoContinue: true }));
transport.expectToolContinuation();
const rest = await transport.reconnectToStream({ chatId: name });
// The AI SDK's client holds the message as it answered it (approval-responded) and applies
// the continuation to it.
const held = structuredClone(asked);
const heldPart = held.parts.find((p) => p.type === "tool-publish");
heldPart.state = "approval-responded";
heldPart.approval = { ...heldPart.approval, approved: answer === "approve" };
let final = held;
if (rest) for await (const m of readUIMessageStream({ message: held, stream: rest })) final = m;

// The other tab answers late: refused, with what the first answer said.
other.send(JSON.stringify({ type: "cf_agent_tool_approval", toolCallId: part.toolCallId, approved: true, autoContinue: true }));
while (!seenByOther.some((f) => f.type === "cf_agent_error")) await new Promise((r) => setTimeout(r, 20));
const stored = await (await fetch(`http://${host}/agents/assistant/${name}/get-messages`)).json();
console.log(
  JSON.stringify({
    asked,
    continued: rest !== null,
    final,
    stored,
    updates: seenByOther.filter((f) => f.type === "cf_agent_message_updated").length,
    continuationFrames: seenByTab.filter((f) => f.type === "cf_agent_use_chat_response" && f.continuation === true).length,
    lateError: seenByOther.find((f) => f.type === "cf_agent_error")?.error
  })
);
clearTimeout(timeout);
tab.close();
other.close();
process.exit(0);
