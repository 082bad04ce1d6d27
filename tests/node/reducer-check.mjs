// The stock client reducer of agents@0.32.0, as `useAgentToolEvents` drives it, for the Rust
// port's check (tests/e2e/reducer_check.rs).
//
// Reads JSON lines from stdin, each `{"case": n, "frames": [...]}`; feeds each case's frames,
// in order, to a fresh client exactly as the hook's message listener does (frames that are not
// `agent-tool-event`s ignored; dedupe on `agentToolEventDedupeKey` in a `seen` set; then
// `applyAgentToolEvent`); prints one line per case:
//   {"case": n, "state": <JSON.parse(JSON.stringify(state))>, "outcomes": [...]}
// where `outcomes` says what became of each frame: "ignored", "key-threw", "duplicate",
// "applied", "unchanged" (the reducer returned the same state) or "threw" (the reducer threw;
// the state stays as it was).
//
// `Date.now()` is a counter restarted for each case at CLOCK_START and advanced by one per call,
// so that the Rust port, given the same clock, must read it exactly when the JavaScript does.
// Usage: node tests/node/reducer-check.mjs < cases.jsonl
import { applyAgentToolEvent, createAgentToolEventState } from "agents/chat";
// Not exported by the package; the hook (dist/react.js) imports it from this very module.
import { n as agentToolEventDedupeKey } from "../../node_modules/agents/dist/agent-tools-CdJC-8Dc.js";

if (agentToolEventDedupeKey.name !== "agentToolEventDedupeKey") {
  throw new Error(`the module's export "n" is ${agentToolEventDedupeKey.name}, not agentToolEventDedupeKey`);
}

const CLOCK_START = 1_000_000;
let clock = CLOCK_START;
Date.now = () => clock++;

/** One case through a fresh client: its final state and what became of each frame. */
function run(frames) {
  clock = CLOCK_START;
  let state = createAgentToolEventState();
  const seen = new Set();
  const outcomes = [];
  // The hook's listener, after its JSON.parse: any exception before `setState` escapes it.
  const onMessage = (message) => {
    if (message.type !== "agent-tool-event") return "ignored";
    let key;
    try {
      key = agentToolEventDedupeKey(message);
    } catch {
      return "key-threw";
    }
    if (seen.has(key)) return "duplicate";
    seen.add(key);
    try {
      const next = applyAgentToolEvent(state, message);
      const outcome = next === state ? "unchanged" : "applied";
      state = next;
      return outcome;
    } catch {
      return "threw";
    }
  };
  for (const frame of frames) {
    let outcome;
    try {
      outcome = onMessage(frame);
    } catch {
      outcome = "ignored"; // `null.type`
    }
    outcomes.push(outcome);
  }
  return { state: JSON.parse(JSON.stringify(state)), outcomes };
}

let input = "";
process.stdin.setEncoding("utf8");
for await (const chunk of process.stdin) input += chunk;
const out = [];
for (const line of input.split("\n")) {
  if (!line.trim()) continue;
  const { case: n, frames } = JSON.parse(line);
  const { state, outcomes } = run(frames);
  out.push(JSON.stringify({ case: n, state, outcomes }));
}
process.stdout.write(out.length ? out.join("\n") + "\n" : "");
