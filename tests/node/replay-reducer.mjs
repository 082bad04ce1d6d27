// Replay with the stock reducer (applyAgentToolEvent, createAgentToolEventState from
// agents@0.32.0): a client that disconnects and reconnects (a page refresh: fresh state each
// time) at several points of a streaming run is, after every refresh, in the same state as a
// client that never disconnected (compared the moment both have applied the same frames), and
// ends in the same state.
// Usage: node replay-reducer.mjs <host:port> <agent-name>
import assert from "node:assert/strict";
import WebSocket from "ws";
import { AgentClient } from "agents/client";
import { applyAgentToolEvent, createAgentToolEventState } from "agents/chat";

const [host, name] = process.argv.slice(2);
const RUN = "replayed-run";
setTimeout(() => {
  console.error("timed out");
  process.exit(2);
}, 90_000);

function connect(onFrame) {
  const agent = new AgentClient({ agent: "Assistant", name, host, WebSocket });
  agent.addEventListener("message", (event) => {
    const frame = JSON.parse(event.data);
    if (frame.type === "agent-tool-event") onFrame(frame);
  });
  return agent;
}

// The client that never disconnects.
let steady = createAgentToolEventState();
let steadyFrames = 0;
const watcher = connect((frame) => {
  steady = applyAgentToolEvent(steady, frame);
  steadyFrames += 1;
});
await watcher.ready;

// The client that keeps refreshing.
let refreshing;
let refreshed = createAgentToolEventState();
let chunksSeen = 0;
function open() {
  refreshed = createAgentToolEventState();
  refreshing = connect((frame) => {
    refreshed = applyAgentToolEvent(refreshed, frame);
    if (frame.event.runId === RUN && frame.event.kind === "chunk") chunksSeen += 1;
  });
  return refreshing.ready;
}
await open();

const done = watcher.call("dispatch", [
  { agent: "Researcher", runId: RUN, input: { query: "refresh", words: 60, delayMs: 25 } }
]);
const waitFor = async (test) => {
  while (!test()) await new Promise((r) => setTimeout(r, 5));
};
// Progress `at` is stamped by the client when it applies the frame; nothing else differs.
const strip = (state) =>
  JSON.parse(JSON.stringify(state, (key, value) => (key === "at" && typeof value === "number" ? undefined : value)));
// The highest sequence of the run a state has applied.
const applied = (frames) => frames.reduce((max, seq) => Math.max(max, seq), -1);
let steadySeqs = [];
let refreshedSeqs = [];
const track = (list) => (frame) => {
  if (frame.event.runId === RUN) list.push(frame.sequence);
};
const trackSteady = track(steadySeqs);
watcher.addEventListener("message", (event) => {
  const frame = JSON.parse(event.data);
  if (frame.type === "agent-tool-event") trackSteady(frame);
});
const reopen = async () => {
  refreshedSeqs = [];
  await open();
  refreshing.addEventListener("message", (event) => {
    const frame = JSON.parse(event.data);
    if (frame.type === "agent-tool-event") track(refreshedSeqs)(frame);
  });
};
let reconnects = 0;
let compared = 0;
for (const after of [3, 15, 40]) {
  await waitFor(() => chunksSeen >= after);
  refreshing.close();
  chunksSeen = 0;
  await reopen();
  reconnects += 1;
  // Caught up: the moment both have applied the same frames, both are in the same state.
  await waitFor(() => refreshedSeqs.length > 0 && applied(refreshedSeqs) === applied(steadySeqs));
  assert.deepEqual(strip(refreshed), strip(steady), `after refresh ${reconnects}`);
  compared += 1;
}
const result = await done;
assert.equal(result.status, "completed");
// After the run ended, a last refresh: replay alone must rebuild the same state.
refreshing.close();
await open();
reconnects += 1;
// The terminal frame is the last one a replay sends (and the steady client's last live one).
await waitFor(() => refreshed.runsById[RUN]?.status === "completed" && steady.runsById[RUN]?.status === "completed");

assert.deepEqual(strip(refreshed), strip(steady));
const run = steady.runsById[RUN];
const text = run.parts.filter((p) => p.type === "text").map((p) => p.text).join("");
assert.equal(text, result.summary);
assert.ok(run.milestones?.length === 1 && run.milestones[0].name === "sources-gathered");
assert.equal(run.progress?.fraction, 1);
// Reached only if every assertion above held (a failed one exits non-zero).
console.log(JSON.stringify({ reconnects, compared, steadyFrames, textLength: text.length }));
watcher.close();
refreshing.close();
process.exit(0);
