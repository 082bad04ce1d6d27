// Where a run's memory goes in the Worker's workerd: after each step, the isolate's JS heap (its
// used and total size, through wrangler dev's inspector) and workerd's resident memory split by
// the kind of region it lies in (from /proc/<pid>/smaps): V8's pointer cage (the JS heap's
// pages), executable code (compiled JS and wasm), the allocator's heap (tcmalloc's 1 GiB
// reservations: everything the runtime mallocs: SQLite, buffers, V8's compiler zones), files
// (the binary, SQLite's files), and other anonymous memory. Not a test and not part of the
// benchmark; docs/benchmarks.md's *Peak RSS* entry quotes it. Start the Worker as for
// bench/profile.mjs (docs/benchmarks.md says how, with `-c /tmp/w.toml`), then:
//
//   node bench/memory.mjs <worker port> <inspector port> [chunks=10000] [warm-up runs of 1 000 = 0]
import { readFileSync, readdirSync } from "node:fs";
import WebSocket from "ws";
import { connectInspector } from "./inspector.mjs";

const [port, inspector] = [process.argv[2], process.argv[3]];
const chunks = Number(process.argv[4] ?? 10000);
const warmups = Number(process.argv[5] ?? 0);
if (!port || !inspector) {
  console.error("usage: node bench/memory.mjs <worker port> <inspector port> [chunks] [warm-up runs]");
  process.exit(2);
}

const command = await connectInspector(inspector);

/** The workerd that serves the Worker: the biggest one under the wrangler with this inspector
 * port (wrangler also runs a small proxy). */
function workerdPid() {
  const read = (pid, file) => {
    try {
      return readFileSync(`/proc/${pid}/${file}`, "utf8");
    } catch {
      return "";
    }
  };
  const parent = (pid) => /PPid:\s+(\d+)/.exec(read(pid, "status"))?.[1];
  const ours = (pid) => {
    for (let at = parent(pid); at && at !== "0"; at = parent(at)) {
      if (read(at, "cmdline").split("\0").join(" ").includes(`--inspector-port ${inspector}`)) return true;
    }
    return false;
  };
  let best = null;
  for (const pid of readdirSync("/proc").filter((p) => /^\d+$/.test(p))) {
    if (!read(pid, "cmdline").includes("workerd") || !ours(pid)) continue;
    const rss = Number(/VmRSS:\s+(\d+)/.exec(read(pid, "status"))?.[1] ?? 0);
    if (!best || rss > best.rss) best = { pid, rss };
  }
  if (!best) throw new Error(`no workerd under a wrangler with --inspector-port ${inspector}`);
  return best.pid;
}
const pid = process.env.WORKERD_PID ?? workerdPid();

/** Resident KiB by kind of region. Adjacent mappings form one reservation; its size tells. */
function regions() {
  const maps = [];
  let current = null;
  for (const line of readFileSync(`/proc/${pid}/smaps`, "utf8").split("\n")) {
    const head = /^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ (\S+)\s*(.*)$/.exec(line);
    if (head) {
      current = { start: BigInt(`0x${head[1]}`), end: BigInt(`0x${head[2]}`), perms: head[3], file: head[5], rss: 0 };
      maps.push(current);
    } else if (current && line.startsWith("Rss:")) {
      current.rss = Number(line.split(/\s+/)[1]);
    }
  }
  const kinds = { "JS heap (V8's cage)": 0, code: 0, "allocator heap": 0, files: 0, "other anonymous": 0 };
  for (let i = 0; i < maps.length; ) {
    let j = i;
    while (j + 1 < maps.length && maps[j + 1].start === maps[j].end && !maps[j + 1].file && !maps[i].file) j++;
    const group = maps.slice(i, j + 1);
    const size = Number(group[group.length - 1].end - group[0].start) / 2 ** 20;
    const rss = group.reduce((sum, m) => sum + m.rss, 0);
    if (group[0].file && !group[0].file.startsWith("[")) kinds.files += rss;
    else if (group.some((m) => m.perms.includes("x"))) kinds.code += rss;
    else if (Math.abs(size - 4096) < 1) kinds["JS heap (V8's cage)"] += rss;
    else if (size >= 1024 && Math.abs(size / 1024 - Math.round(size / 1024)) < 0.001) kinds["allocator heap"] += rss;
    else kinds["other anonymous"] += rss;
    i = j + 1;
  }
  return kinds;
}

const client = new WebSocket(`ws://127.0.0.1:${port}/agents/assistant/memory-${Date.now()}`);
await new Promise((resolve, reject) => client.once("open", resolve).once("error", reject));
function run(words, topic) {
  const id = `memory-${topic}`;
  return new Promise((resolve) => {
    client.on("message", function onFrame(data) {
      const frame = JSON.parse(data.toString());
      if (frame.type === "rpc" && frame.id === id && frame.done !== false) {
        client.off("message", onFrame);
        resolve();
      }
    });
    const args = [{ topics: [topic], words, delayMs: 0, agent: "Summarizer" }];
    client.send(JSON.stringify({ type: "rpc", id, method: "research", args }));
  });
}

const mib = (kib) => (kib / 1024).toFixed(1).padStart(6);
const names = Object.keys(regions());
console.log(`workerd ${pid}; MiB`);
console.log(["step".padEnd(28), "JS used", " total", ...names.map((n) => n.padStart(20))].join(" "));
async function report(step) {
  const { result } = await command("Runtime.getHeapUsage");
  const kinds = regions();
  const heap = [result.usedSize, result.totalSize].map((b) => mib(b / 1024));
  console.log([step.padEnd(28), ` ${heap[0]}`, heap[1], ...names.map((n) => mib(kinds[n]).padStart(20))].join(" "));
}
await command("HeapProfiler.enable");
await report("connected");
await run(1, "one");
await report("a run of 1 chunk");
for (let i = 0; i < warmups; i++) {
  await run(1000, `warm-${i}`);
  await report(`warm-up run ${i + 1} of 1 000`);
}
await run(chunks, "measured");
await report(`a run of ${chunks}`);
await command("HeapProfiler.collectGarbage");
await report("a collection");
await run(chunks, "again");
await report(`another run of ${chunks}`);
process.exit(0);
