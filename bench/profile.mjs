// A CPU profile of the Worker's isolate during one S2 run (one Summarizer run of N chunks on the
// offline model, dispatch → result), or with `runs=N` during N sequential S1 runs (one chunk
// each, every one a new child object), taken through wrangler dev's inspector, summarized by
// function. Not a test and not part of the benchmark: it is how the costs docs/benchmarks.md names
// under Benchmarks were found. See docs/benchmarks.md for the commands that start the Worker.
//
//   node bench/profile.mjs <worker port> <inspector port> [chunks=10000 | runs=N] [out.cpuprofile]
import { writeFileSync } from "node:fs";
import WebSocket from "ws";
import { connectInspector } from "./inspector.mjs";

const [port, inspector] = [process.argv[2], process.argv[3]];
const mode = process.argv[4] ?? "10000";
const runs = mode.startsWith("runs=") ? Number(mode.slice(5)) : 0;
const chunks = runs ? 1 : Number(mode);
const out = process.argv[5];
if (!port || !inspector) {
  console.error("usage: node bench/profile.mjs <worker port> <inspector port> [chunks | runs=N] [out.cpuprofile]");
  process.exit(2);
}

const command = await connectInspector(inspector);

const client = new WebSocket(`ws://127.0.0.1:${port}/agents/assistant/profile-${Date.now()}`);
await new Promise((resolve, reject) => client.once("open", resolve).once("error", reject));

/** One run of `words` chunks: its time, the first chunk's time, the frames seen. */
function run(words, topic) {
  const id = `profile-${topic}`;
  const started = Date.now();
  let first = null;
  let frames = 0;
  return new Promise((resolve) => {
    client.on("message", function onFrame(data) {
      const frame = JSON.parse(data.toString());
      if (frame.type === "agent-tool-event") {
        frames++;
        if (first === null && frame.event.kind === "chunk") first = Date.now() - started;
      }
      if (frame.type === "rpc" && frame.id === id && frame.done !== false) {
        client.off("message", onFrame);
        resolve({ ms: Date.now() - started, firstChunkMs: first, frames });
      }
    });
    const args = [{ topics: [topic], words, delayMs: 0, agent: "Summarizer" }];
    client.send(JSON.stringify({ type: "rpc", id, method: "research", args }));
  });
}

await command("Profiler.enable");
await command("Profiler.setSamplingInterval", { interval: 50 });
await run(100, "warm-up");
await command("Profiler.start");
let measured;
if (runs) {
  const times = [];
  for (let i = 0; i < runs; i++) times.push((await run(1, `s1-${Date.now()}-${i}`)).ms);
  times.sort((a, b) => a - b);
  measured = { runs, medianMs: times[runs >> 1], p90Ms: times[Math.floor(runs * 0.9)] };
} else {
  measured = await run(chunks, "measured");
}
const { result } = await command("Profiler.stop");
const profile = result.profile;
if (out) writeFileSync(out, JSON.stringify(profile));

// Self and inclusive time per function (a function counted once per stack for inclusive).
const nodes = new Map(profile.nodes.map((n) => [n.id, n]));
const parents = new Map();
for (const n of profile.nodes) for (const child of n.children ?? []) parents.set(child, n.id);
const name = (n) => (n.callFrame.functionName || "(anonymous)").replace(/::h[0-9a-f]{16}$/, "");
const selfTime = new Map();
profile.samples.forEach((id, i) => selfTime.set(id, (selfTime.get(id) ?? 0) + (profile.timeDeltas[i] ?? 0)));
const bySelf = new Map();
const byInclusive = new Map();
for (const [id, micros] of selfTime) {
  bySelf.set(name(nodes.get(id)), (bySelf.get(name(nodes.get(id))) ?? 0) + micros);
  const seen = new Set();
  for (let at = id; at !== undefined; at = parents.get(at)) {
    const label = name(nodes.get(at));
    if (!seen.has(label)) byInclusive.set(label, (byInclusive.get(label) ?? 0) + micros);
    seen.add(label);
  }
}
const total = [...selfTime.values()].reduce((a, b) => a + b, 0);
const table = (title, map, rows) => {
  console.log(`\n${title}`);
  for (const [label, micros] of [...map].sort((a, b) => b[1] - a[1]).slice(0, rows)) {
    const share = ((100 * micros) / total).toFixed(1).padStart(5);
    console.log(`${(micros / 1000).toFixed(1).padStart(8)} ms ${share} %  ${label.slice(0, 150)}`);
  }
};
console.log(`${runs ? `${runs} runs of one chunk` : `run of ${chunks} chunks`}: ${JSON.stringify(measured)}; ${(total / 1000).toFixed(0)} ms sampled`);
table("self time", bySelf, 30);
table("inclusive time (this crate's functions and the platform's)", new Map(
  [...byInclusive].filter(([label]) => /agent_tools|worker::|exec|\(idle\)|\(program\)|garbage/.test(label)),
), 40);
process.exit(0);
