//! Side-by-side benchmark: this Worker against the TypeScript Agents SDK (agents@0.32.0,
//! @cloudflare/ai-chat@0.12.2) doing the same work, both under `wrangler dev` (workerd) on
//! this machine. Run with `./scripts/bench.sh`; it prints numbers (it checks only that every
//! run completed, so a number never stands for a failed run).
//!
//! - fan-out: one RPC dispatches K children that each stream W text deltas with no delay;
//!   time to the first chunk frame and to the RPC's answer, frames per second at the client.
//! - replay: with R finished runs retained, a new client connects; time to the last replay
//!   frame (the TypeScript SDK asks every child for its chunks on every connect).
//! - bundle: `wrangler deploy --dry-run`, gzip.

#[path = "../tests/e2e/harness.rs"]
#[allow(dead_code)]
mod harness;

use std::path::Path;
use std::time::{Duration, Instant};

use harness::{root, unique, Client, Worker};
use serde_json::json;

struct Target {
    label: &'static str,
    /// The child class the `research` RPC should run (the Rust demo's plain chat child).
    agent: Option<&'static str>,
    worker: Worker,
}

fn wanted(target: &Target, only: &str) -> bool {
    only.is_empty() || (only == "rust") == target.agent.is_some()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

async fn fanout(target: &Target, runs: usize, words: u64) -> (f64, f64, usize) {
    let mut client = Client::connect(&target.worker.ws(&format!("/agents/assistant/{}", unique("fan")))).await;
    client.wait_for(Duration::from_secs(30), |f| f["type"] == "cf_agent_identity").await;
    let topics: Vec<String> = (0..runs).map(|i| format!("topic {i}")).collect();
    let mut arg = json!({ "topics": topics, "words": words, "delayMs": 0 });
    if let Some(agent) = target.agent {
        arg["agent"] = json!(agent);
    }
    let started = Instant::now();
    let id = client.send_call("research", json!([arg])).await;
    client.wait_for(Duration::from_secs(60), |f| f["event"]["kind"] == "chunk").await;
    let to_first = started.elapsed().as_secs_f64() * 1000.0;
    let result = client.reply(&id).await.expect("the fan-out completes");
    let to_done = started.elapsed().as_secs_f64() * 1000.0;
    let completed = result.as_array().map_or(0, |r| r.iter().filter(|r| r["status"] == "completed").count());
    assert_eq!(completed, runs, "{} runs completed: {result}", target.label);
    (to_first, to_done, client.events().len())
}

async fn replay(target: &Target, retained: usize, words: u64, samples: usize) -> (f64, usize) {
    let name = unique("replay");
    let mut client = Client::connect(&target.worker.ws(&format!("/agents/assistant/{name}"))).await;
    let topics: Vec<String> = (0..retained).map(|i| format!("kept {i}")).collect();
    for chunk in topics.chunks(8) {
        let mut arg = json!({ "topics": chunk, "words": words, "delayMs": 0 });
        if let Some(agent) = target.agent {
            arg["agent"] = json!(agent);
        }
        client.call("research", json!([arg])).await.expect("runs to retain");
    }
    let expected = {
        let mut probe = Client::connect(&target.worker.ws(&format!("/agents/assistant/{name}"))).await;
        probe.drain(Duration::from_millis(1500)).await;
        probe.events().len()
    };
    let mut times = Vec::new();
    for _ in 0..samples {
        let started = Instant::now();
        let mut fresh = Client::connect(&target.worker.ws(&format!("/agents/assistant/{name}"))).await;
        let mut seen = 0;
        while seen < expected {
            let frame = fresh.recv(Duration::from_secs(30)).await.expect("replay frames");
            seen += usize::from(frame["type"] == "agent-tool-event");
        }
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    (median(times), expected)
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

#[tokio::main]
async fn main() {
    let samples = 5;
    // `BENCH_ONLY=rust` (or `ts`) measures one side only, e.g. while tuning.
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    harness::ensure_built();
    let ts_dir = root().join("bench/ts-worker");
    let ts_wrangler = ts_dir.join("node_modules/.bin/wrangler");
    assert!(ts_wrangler.exists(), "run ./scripts/bench.sh: it installs the TypeScript baseline");
    let rust = Target { label: "Rust (this repo)", agent: Some("Summarizer"), worker: Worker::start().await };
    let ts = Target {
        label: "TypeScript SDK",
        agent: None,
        worker: Worker::start_custom(&ts_wrangler, &ts_dir.join("wrangler.toml"), &ts_dir, None, &[]).await,
    };

    println!("\nfan-out: one RPC, K children × W text deltas, no delay (median of {samples})");
    println!(
        "{:<18} {:>4} {:>5} {:>14} {:>14} {:>8} {:>12}",
        "", "K", "W", "first chunk ms", "all done ms", "frames", "frames/s"
    );
    for (runs, words) in [(1, 50), (4, 200), (8, 400)] {
        for target in [&rust, &ts].into_iter().filter(|t| wanted(t, &only)) {
            let _ = fanout(target, runs, words).await; // warm-up
            let mut firsts = Vec::new();
            let mut dones = Vec::new();
            let mut frames = 0;
            for _ in 0..samples {
                let (first, done, n) = fanout(target, runs, words).await;
                firsts.push(first);
                dones.push(done);
                frames = n;
            }
            let done = median(dones);
            println!(
                "{:<18} {:>4} {:>5} {:>14.1} {:>14.1} {:>8} {:>12.0}",
                target.label,
                runs,
                words,
                median(firsts),
                done,
                frames,
                frames as f64 / (done / 1000.0)
            );
        }
    }

    println!("\nreplay: a client connects to a parent with R finished runs of W deltas (median of {samples})");
    println!("{:<18} {:>4} {:>5} {:>16} {:>8}", "", "R", "W", "last replay ms", "frames");
    for (retained, words) in [(10, 50), (40, 50)] {
        for target in [&rust, &ts].into_iter().filter(|t| wanted(t, &only)) {
            let (ms, frames) = replay(target, retained, words, samples).await;
            println!("{:<18} {:>4} {:>5} {:>16.1} {:>8}", target.label, retained, words, ms, frames);
        }
    }

    println!("\nbundle (wrangler deploy --dry-run)");
    let rust_gzip = bundle_gzip_kib(&harness::prebuilt_config(), &root(), &root().join("node_modules/.bin/wrangler"));
    let ts_gzip = bundle_gzip_kib(&ts_dir.join("wrangler.toml"), &ts_dir, &ts_wrangler);
    println!("{:<18} {:>10}", "", "gzip KiB");
    println!("{:<18} {:>10}", rust.label, rust_gzip.map_or("?".into(), |v| format!("{v:.1}")));
    println!("{:<18} {:>10}", ts.label, ts_gzip.map_or("?".into(), |v| format!("{v:.1}")));
}
