//! Side-by-side benchmark: this Worker against the TypeScript Agents SDK (agents@0.32.0,
//! @cloudflare/ai-chat@0.12.2) doing the same work, both under `wrangler dev` (workerd) on this
//! machine, in one run, plus the bare platform costs the goals are measured against. Run with
//! `./scripts/bench.sh`; it prints tables of medians and p90s (it checks only that every run
//! completed, so a number never stands for a failed run).
//!
//! - S1: one awaited run of one text chunk, client RPC → result, sequential; against the bare
//!   round trip client → parent object → child object (one fetch) and back; wall time and the
//!   CPU time workerd spent.
//! - S2: one run of N text chunks, dispatch → terminal frame at the client; the first chunk's
//!   time; workerd's CPU time; its peak RSS, and its RSS before the run (the runtime's floor);
//!   in a fresh runtime, then again once it is warm; the warm run against the raw rate at
//!   which a Durable Object sends frames.
//! - S3: a new client's connect → last replay frame, with R finished runs × C chunks retained;
//!   against reading those frames from SQLite and sending them with no engine.
//! - S4: N concurrent awaited runs × 10 chunks, wall time.
//! - S5: N detached runs × 10 chunks: each dispatch's round trip, and the time until every
//!   terminal frame reached the client.
//! - memory: workerd's resident memory step by step in one fresh runtime (its floor, a client,
//!   one run, two runs of 10 000 chunks, 200 runs of one chunk, 200 bare new objects), with
//!   the Worker's WebAssembly memory.
//! - the bundle: `wrangler deploy --dry-run`, gzip.
//!
//! `BENCH_ONLY=rust` (or `ts`) measures one side; `BENCH_QUICK=1` the small sizes only;
//! `BENCH_SCENARIOS=S2,S3` (any of S1–S5, `memory` and `bundle`) only those scenarios.

#[path = "../tests/e2e/harness.rs"]
#[allow(dead_code)]
mod harness;

use std::path::Path;
use std::time::{Duration, Instant};

use harness::{root, unique, Client, Worker};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(600);

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Rust,
    Ts,
}

impl Side {
    fn label(self) -> &'static str {
        match self {
            Side::Rust => "this Worker",
            Side::Ts => "TypeScript SDK",
        }
    }
}

/// Medians and 90th percentiles of samples, in ms.
#[derive(Clone, Copy, Default)]
struct Stats {
    median: f64,
    p90: f64,
}

fn stats(mut v: Vec<f64>) -> Stats {
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    Stats { median: at(0.5), p90: at(0.9) }
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

/// A running Worker of one side.
struct Target {
    side: Side,
    worker: Worker,
}

const RUST_VARS: &[(&str, &str)] = &[
    ("BENCH_ROUTES", "1"),
    ("QUIET_HOOKS", "1"),
    ("MAX_CONCURRENT_AGENT_TOOLS", "0"),
    ("AGENT_TOOL_RETAIN_RUNS", "0"),
    ("AGENT_TOOL_RETAIN_MS", "0"),
];

async fn start(side: Side) -> Target {
    let worker = match side {
        Side::Rust => Worker::start_with(None, RUST_VARS).await,
        Side::Ts => {
            let dir = root().join("bench/ts-worker");
            let wrangler = dir.join("node_modules/.bin/wrangler");
            Worker::start_custom(&wrangler, &dir.join("wrangler.toml"), &dir, None, &[]).await
        }
    };
    Target { side, worker }
}

impl Target {
    async fn client(&self, name: &str) -> Client {
        let mut client = Client::connect(&self.worker.ws(&format!("/agents/assistant/{name}"))).await;
        client.wait_for(LONG, |f| f["type"] == "cf_agent_identity").await;
        client
    }

    /// The `research` argument: the Rust side runs its plain chat child (`Summarizer`), whose
    /// offline model streams `words` deltas as the baseline's child does.
    fn research(&self, topics: &[String], words: u64) -> Value {
        let mut arg = json!({ "topics": topics, "words": words, "delayMs": 0 });
        if self.side == Side::Rust {
            arg["agent"] = json!("Summarizer");
        }
        json!([arg])
    }
}

fn completed(result: &Value) -> usize {
    result.as_array().map_or(0, |r| r.iter().filter(|r| r["status"] == "completed").count())
}

/// Calls made before a series' measured ones (not counted in its times).
const WARM_UPS: usize = 5;

/// S1: `n` sequential awaited runs of one chunk.
async fn s1(t: &Target, n: usize) -> Stats {
    let mut client = t.client(&unique("s1")).await;
    let mut times = Vec::new();
    for i in 0..n + WARM_UPS {
        let started = Instant::now();
        let result = client.call("research", t.research(&[format!("s1 {i}")], 1)).await.expect("S1");
        assert_eq!(completed(&result), 1, "{}: {result}", t.side.label());
        if i >= WARM_UPS {
            times.push(ms(started));
        }
        client.frames.clear();
    }
    stats(times)
}

/// The bare round trip: client → parent object → one fetch to a child object → back (`op`
/// `ping`: the same child each time; `ping-new`: a child object created by the call).
async fn bare_ping(t: &Target, n: usize, op: &str) -> Stats {
    let mut client = t.client(&unique("ping")).await;
    let mut times = Vec::new();
    for i in 0..n + WARM_UPS {
        let started = Instant::now();
        client.call("bench", json!([{ "op": op }])).await.expect("ping");
        if i >= WARM_UPS {
            times.push(ms(started));
        }
    }
    stats(times)
}

/// One step of the memory scenario.
#[derive(Clone, Copy)]
enum MemStep {
    Nothing,
    Connect,
    /// `runs` sequential runs of `chunks` chunks each.
    Runs(usize, u64),
    /// `n` bare child objects, each created by one fetch.
    BareObjects(usize),
}

/// S2: one run of `chunks` deltas: (first chunk ms, terminal frame ms, frames).
async fn s2(t: &Target, chunks: u64) -> (f64, f64, usize) {
    let mut client = t.client(&unique("s2")).await;
    let started = Instant::now();
    let id = client.send_call("research", t.research(&["s2".into()], chunks)).await;
    let mut first = None;
    let mut frames = 0;
    loop {
        let frame = client.recv(LONG).await.expect("S2 frames");
        if frame["type"] == "agent-tool-event" {
            frames += 1;
            let kind = frame["event"]["kind"].as_str().unwrap_or_default();
            if kind == "chunk" && first.is_none() {
                first = Some(ms(started));
            }
            if matches!(kind, "finished" | "error" | "aborted" | "interrupted") {
                assert_eq!(kind, "finished", "{}: {frame}", t.side.label());
                break;
            }
        }
        client.frames.clear();
    }
    let done = ms(started);
    client.reply(&id).await.expect("S2 result");
    (first.unwrap_or(done), done, frames)
}

/// The raw rate a Durable Object sends frames at: `n` small frames → frames/s at the client.
async fn bare_blast(t: &Target, n: u64) -> f64 {
    let mut client = t.client(&unique("blast")).await;
    let started = Instant::now();
    client.send_call("bench", json!([{"op": "blast", "n": n}])).await;
    await_frames(&mut client, "bench-blast", n as usize).await;
    n as f64 / started.elapsed().as_secs_f64()
}

/// Retains `runs` finished runs of `chunks` deltas on a new parent; returns its name and the
/// number of frames its replay holds.
async fn seed(t: &Target, runs: usize, chunks: u64) -> (String, usize) {
    let name = unique("s3");
    let mut client = t.client(&name).await;
    let topics: Vec<String> = (0..runs).map(|i| format!("kept {i}")).collect();
    for wave in topics.chunks(16 * 8) {
        let mut calls = Vec::new();
        for batch in wave.chunks(16) {
            calls.push(client.send_call("research", t.research(batch, chunks)).await);
        }
        for call in calls {
            let result = client.reply(&call).await.expect("runs to retain");
            assert_eq!(completed(&result), result.as_array().unwrap().len());
        }
        client.frames.clear();
    }
    drop(client);
    let mut probe = t.client(&name).await;
    probe.drain(Duration::from_secs(3)).await;
    let frames = probe.events().len();
    (name, frames)
}

/// S3: a connect → the last of `frames` replay frames.
async fn s3(t: &Target, name: &str, frames: usize) -> f64 {
    let started = Instant::now();
    let mut client = Client::connect(&t.worker.ws(&format!("/agents/assistant/{name}"))).await;
    await_frames(&mut client, "agent-tool-event", frames).await;
    ms(started)
}

/// Waits until `client` has received `n` frames of `kind`, keeping none of them.
async fn await_frames(client: &mut Client, kind: &str, n: usize) {
    let mut seen = 0;
    while seen < n {
        let frame = client.recv(LONG).await.unwrap_or_else(|| panic!("{n} {kind} frames"));
        seen += usize::from(frame["type"] == kind);
        client.frames.clear();
    }
}

/// The bare replay: as many rows of a chunk's size read from SQLite and sent, no engine (on a
/// parent of its own, so its clients hold no replay).
async fn bare_read(t: &Target, frames: usize) -> f64 {
    let mut client = t.client(&unique("bare-read")).await;
    client.call("bench", json!([{"op": "seed", "n": frames, "bytes": 60}])).await.expect("seeded");
    let started = Instant::now();
    client.send_call("bench", json!([{"op": "read"}])).await;
    await_frames(&mut client, "bench-read", frames).await;
    ms(started)
}

/// S4: `n` concurrent awaited runs × 10 chunks, wall time.
async fn s4(t: &Target, n: usize) -> f64 {
    let mut client = t.client(&unique("s4")).await;
    let topics: Vec<String> = (0..n).map(|i| format!("s4 {i}")).collect();
    let started = Instant::now();
    let mut calls = Vec::new();
    for batch in topics.chunks(16) {
        calls.push(client.send_call("research", t.research(batch, 10)).await);
    }
    let mut done = 0;
    for call in calls {
        done += completed(&client.reply(&call).await.expect("S4"));
    }
    assert_eq!(done, n, "{}", t.side.label());
    ms(started)
}

/// S5: `n` detached runs × 10 chunks: (dispatch round trips, all terminal frames ms).
async fn s5(t: &Target, n: usize) -> (Stats, f64) {
    let mut client = t.client(&unique("s5")).await;
    let started = Instant::now();
    let mut rtts = Vec::new();
    for i in 0..n {
        let sent = Instant::now();
        let handle = match t.side {
            Side::Rust => {
                let arg = json!([{"agent": "Summarizer", "input": {"query": format!("s5 {i}"), "words": 10, "delayMs": 0},
                                  "detached": true}]);
                client.call("dispatch", arg).await.expect("a handle")
            }
            Side::Ts => {
                let arg = json!([{"topics": [format!("s5 {i}")], "words": 10, "delayMs": 0}]);
                client.call("dispatchDetached", arg).await.expect("a handle")
            }
        };
        assert!(!handle.is_null(), "{handle}");
        rtts.push(ms(sent));
    }
    let is_terminal = |frame: &Value| {
        matches!(frame["event"]["kind"].as_str(), Some("finished" | "error" | "aborted" | "interrupted"))
    };
    // Those that ended while the dispatches went on are among the frames already received.
    let mut terminal = client.frames.iter().filter(|f| is_terminal(f)).count();
    client.frames.clear();
    while terminal < n {
        let frame = client.recv(LONG).await.expect("S5 frames");
        terminal += usize::from(is_terminal(&frame));
        client.frames.clear();
    }
    (stats(rtts), ms(started))
}

fn bundle_gzip_kib(config: &Path, cwd: &Path, wrangler: &Path) -> Option<f64> {
    let out = tempfile::tempdir().ok()?;
    let output = std::process::Command::new(wrangler)
        .args(["deploy", "--dry-run", "--outdir"])
        .arg(out.path())
        .arg("-c")
        .arg(config)
        .env("CLOUDFLARE_CF_FETCH_ENABLED", "false")
        .env("WRANGLER_SEND_METRICS", "false")
        .env("NO_COLOR", "1")
        .current_dir(cwd)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout).to_string() + &String::from_utf8_lossy(&output.stderr);
    let line = text.lines().find(|l| l.contains("Total Upload"))?;
    let gzip = line.split("gzip:").nth(1)?.trim().trim_end_matches("KiB").trim();
    gzip.parse().ok()
}

fn mib(kib: Option<(u64, u64)>) -> String {
    kib.map_or("?".into(), |(peak, _)| format!("{}", peak / 1024))
}

#[tokio::main]
async fn main() {
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| v == "1");
    let scenarios = std::env::var("BENCH_SCENARIOS").unwrap_or_default();
    let wants = |name: &str| scenarios.is_empty() || scenarios.split(',').any(|s| s.trim().eq_ignore_ascii_case(name));
    let sides: Vec<Side> = [Side::Rust, Side::Ts]
        .into_iter()
        .filter(|s| only.is_empty() || (only == "rust") == (*s == Side::Rust))
        .collect();
    harness::ensure_built();
    let ts_dir = root().join("bench/ts-worker");
    assert!(
        !sides.contains(&Side::Ts) || ts_dir.join("node_modules/.bin/wrangler").exists(),
        "run ./scripts/bench.sh: it installs the TypeScript baseline"
    );

    if wants("S1") {
        // S1 and the bare round trip.
        println!("\nS1: one awaited run of one chunk, RPC → result, 200 sequential (ms)");
        println!("{:<16} {:>8} {:>8}", "", "median", "p90");
        for &side in &sides {
            let t = start(side).await;
            let cpu = || t.worker.workerd_cpu_ms().unwrap_or(f64::NAN);
            // Each series makes 200 measured calls after 5 warm-ups; the CPU counts all of them.
            let calls = (200 + WARM_UPS) as f64;
            let before = cpu();
            let s = s1(&t, 200).await;
            let s1_cpu = (cpu() - before) / calls;
            println!("{:<16} {:>8.2} {:>8.2}   workerd CPU {s1_cpu:.2} ms a run", side.label(), s.median, s.p90);
            if side == Side::Rust {
                let bare = bare_ping(&t, 200, "ping").await;
                println!(
                    "{:<16} {:>8.2} {:>8.2}   (client → parent → child object → back)",
                    "bare round trip", bare.median, bare.p90
                );
                let before = cpu();
                let fresh = bare_ping(&t, 200, "ping-new").await;
                let fresh_cpu = (cpu() - before) / calls;
                println!(
                    "{:<16} {:>8.2} {:>8.2}   (the same, to a child object created by the call); workerd CPU \
                     {fresh_cpu:.2} ms a call",
                    "bare, new child", fresh.median, fresh.p90
                );
                println!(
                    "S1 / bare round trip: {:.2}; S1 / bare with a new child: {:.2} (workerd CPU: {:.2})",
                    s.median / bare.median,
                    s.median / fresh.median,
                    s1_cpu / fresh_cpu
                );
                let mut client = t.client(&unique("rpc")).await;
                let started = Instant::now();
                let rpc = client.call("bench", json!([{"op": "rpc"}])).await;
                println!("JS RPC on a Rust child's stub ({:.2} ms): {rpc:?}", ms(started));
            }
        }
    }

    if wants("S2") {
        // S2 against the raw send rate, with peak memory (a fresh runtime per size).
        println!(
            "\nS2: one run of N chunks, dispatch → terminal frame (one sample per size, a fresh runtime each, then \
             the same run again in it; peak memory after the first)"
        );
        println!(
            "{:<16} {:>7} {:>11} {:>11} {:>10} {:>9} {:>14} {:>9} {:>10}",
            "", "N", "first ms", "done ms", "frames/s", "peak MiB", "first / done", "CPU ms", "start MiB"
        );
        let sizes: &[u64] = if quick { &[1_000, 10_000] } else { &[1_000, 10_000, 100_000] };
        for &chunks in sizes {
            for &side in &sides {
                if side == Side::Ts && chunks > 10_000 {
                    continue; // about 10 s per 10 000 chunks: 100 000 would take minutes
                }
                let t = start(side).await;
                // The runtime's memory before any run: the floor the run's peak stands on.
                let floor = mib(t.worker.workerd_memory_kib());
                let cpu = || t.worker.workerd_cpu_ms().unwrap_or(f64::NAN);
                let row =
                    |label: &str, (first, done, frames): (f64, f64, usize), cpu_ms: f64, peak: &str, floor: &str| {
                        println!(
                            "{:<16} {:>7} {:>11.0} {:>11.0} {:>10.0} {:>9} {:>13.1}% {:>9.0} {:>10}",
                            label,
                            chunks,
                            first,
                            done,
                            frames as f64 / (done / 1000.0),
                            peak,
                            100.0 * first / done,
                            cpu_ms,
                            floor
                        );
                    };
                let before = cpu();
                let fresh = s2(&t, chunks).await;
                let fresh_cpu = cpu() - before;
                row(side.label(), fresh, fresh_cpu, &mib(t.worker.workerd_memory_kib()), &floor);
                // The same run again in the now warm runtime: the first run's first chunk also
                // waited for the engine to compile each function on its path at its first call.
                let before = cpu();
                let (first, done, frames) = s2(&t, chunks).await;
                row("  again, warm", (first, done, frames), cpu() - before, "", "");
                if side == Side::Rust && chunks == 10_000 {
                    let raw = bare_blast(&t, 20_000).await;
                    println!(
                        "{:<16} {:>7} {:>11} {:>11} {:>10.0}   (S2 at 10 000: {:.0}% of it)",
                        "raw send rate",
                        20_000,
                        "",
                        "",
                        raw,
                        100.0 * (frames as f64 / (done / 1000.0)) / raw
                    );
                }
            }
        }
    }

    if wants("S3") {
        // S3 against a bare read-and-send.
        println!("\nS3: a new client's connect → last replay frame, R finished runs × C chunks (ms)");
        println!("{:<16} {:>6} {:>6} {:>8} {:>9} {:>9} {:>10}", "", "R", "C", "frames", "median", "p90", "peak MiB");
        let shapes: &[(usize, u64)] =
            if quick { &[(10, 100), (100, 100)] } else { &[(10, 100), (100, 100), (1000, 100)] };
        for &(runs, chunks) in shapes {
            for &side in &sides {
                if side == Side::Ts && runs > 100 {
                    continue;
                }
                let t = start(side).await;
                let (name, frames) = seed(&t, runs, chunks).await;
                let samples = if runs >= 1000 { 3 } else { 5 };
                let mut times = Vec::new();
                for _ in 0..samples {
                    times.push(s3(&t, &name, frames).await);
                }
                let s = stats(times);
                println!(
                    "{:<16} {:>6} {:>6} {:>8} {:>9.0} {:>9.0} {:>10}",
                    side.label(),
                    runs,
                    chunks,
                    frames,
                    s.median,
                    s.p90,
                    mib(t.worker.workerd_memory_kib())
                );
                if side == Side::Rust {
                    let mut bare = Vec::new();
                    for _ in 0..samples {
                        bare.push(bare_read(&t, frames).await);
                    }
                    let b = stats(bare);
                    println!(
                        "{:<16} {:>6} {:>6} {:>8} {:>9.0} {:>9.0}   (S3 / bare: {:.2})",
                        "bare read+send",
                        runs,
                        chunks,
                        frames,
                        b.median,
                        b.p90,
                        s.median / b.median
                    );
                }
            }
        }
    }

    if wants("S4") {
        // S4 at growing concurrency.
        println!("\nS4: N concurrent awaited runs × 10 chunks, wall time (ms)");
        println!("{:<16} {:>6} {:>9} {:>9} {:>10}", "", "N", "median", "p90", "peak MiB");
        let counts: &[usize] = if quick { &[10, 100] } else { &[10, 100, 1000] };
        for &n in counts {
            for &side in &sides {
                if side == Side::Ts && n > 100 {
                    continue;
                }
                let t = start(side).await;
                let _ = s4(&t, n.min(16)).await; // warm-up
                let samples = if n >= 1000 { 1 } else { 3 };
                let mut times = Vec::new();
                for _ in 0..samples {
                    times.push(s4(&t, n).await);
                }
                let s = stats(times);
                println!(
                    "{:<16} {:>6} {:>9.0} {:>9.0} {:>10}",
                    side.label(),
                    n,
                    s.median,
                    s.p90,
                    mib(t.worker.workerd_memory_kib())
                );
            }
        }
    }

    if wants("S5") {
        // S5.
        println!("\nS5: 100 detached runs × 10 chunks");
        println!("{:<16} {:>16} {:>14} {:>18}", "", "dispatch med ms", "dispatch p90", "all terminal ms");
        for &side in &sides {
            let t = start(side).await;
            let (rtt, all) = s5(&t, 100).await;
            println!("{:<16} {:>16.2} {:>14.2} {:>18.0}", side.label(), rtt.median, rtt.p90, all);
        }
    }

    if wants("memory") {
        // Where a runtime's memory goes: its floor, a client, one run, S2's runs at 10 000, then
        // many objects (every run's child is one).
        println!(
            "\nmemory: workerd's resident memory (peak / now, MiB) step by step in one fresh runtime; the \
             Worker's WebAssembly memory after each step"
        );
        println!("{:<16} {:<40} {:>6} {:>6} {:>9}", "", "after", "peak", "now", "wasm MiB");
        const OBJECTS: usize = 200;
        for &side in &sides {
            let t = start(side).await;
            let mut client: Option<Client> = None;
            let mut steps = vec![
                ("the runtime started", MemStep::Nothing),
                ("a client connected (its parent object)", MemStep::Connect),
                ("one run of 1 chunk (a child object)", MemStep::Runs(1, 1)),
                ("one run of 10 000 chunks", MemStep::Runs(1, 10_000)),
                ("another run of 10 000 chunks", MemStep::Runs(1, 10_000)),
                ("200 runs of 1 chunk (200 child objects)", MemStep::Runs(OBJECTS, 1)),
            ];
            if side == Side::Rust {
                steps.push(("200 bare new objects (one fetch each)", MemStep::BareObjects(OBJECTS)));
            }
            let mut last_now = 0;
            for (i, (step, what)) in steps.into_iter().enumerate() {
                match what {
                    MemStep::Nothing => {}
                    MemStep::Connect => client = Some(t.client(&unique("mem")).await),
                    MemStep::Runs(runs, chunks) => {
                        let c = client.as_mut().expect("connected");
                        for r in 0..runs {
                            let result = c.call("research", t.research(&[format!("mem {i} {r}")], chunks)).await;
                            assert_eq!(completed(&result.expect("memory run")), 1, "{}", t.side.label());
                            c.frames.clear();
                        }
                    }
                    MemStep::BareObjects(n) => {
                        let c = client.as_mut().expect("connected");
                        for _ in 0..n {
                            c.call("bench", json!([{ "op": "ping-new" }])).await.expect("ping-new");
                        }
                    }
                }
                let (peak, now) = t.worker.workerd_memory_kib().unwrap_or((0, 0));
                let wasm = match (side, client.as_mut()) {
                    (Side::Rust, Some(c)) => c
                        .call("bench", json!([{ "op": "memory" }]))
                        .await
                        .ok()
                        .and_then(|v| v["bytes"].as_f64())
                        .map_or("?".into(), |b| format!("{:.1}", b / 1048576.0)),
                    _ => String::new(),
                };
                let per_object = match what {
                    MemStep::Runs(n, _) | MemStep::BareObjects(n) if n >= OBJECTS => {
                        format!("   {:.2} MiB each", (now.saturating_sub(last_now)) as f64 / 1024.0 / n as f64)
                    }
                    _ => String::new(),
                };
                last_now = now;
                let label = if i == 0 { side.label() } else { "" };
                println!("{label:<16} {step:<40} {:>6} {:>6} {wasm:>9}{per_object}", peak / 1024, now / 1024);
            }
        }
    }

    if wants("bundle") {
        println!("\nbundle (wrangler deploy --dry-run, gzip KiB)");
        for &side in &sides {
            let kib = match side {
                Side::Rust => {
                    bundle_gzip_kib(&harness::prebuilt_config(), &root(), &root().join("node_modules/.bin/wrangler"))
                }
                Side::Ts => {
                    bundle_gzip_kib(&ts_dir.join("wrangler.toml"), &ts_dir, &ts_dir.join("node_modules/.bin/wrangler"))
                }
            };
            println!("{:<16} {:>10}", side.label(), kib.map_or("?".into(), |v| format!("{v:.1}")));
        }
    }
}
