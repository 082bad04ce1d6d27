//! At the sizes the limits are for: a parent with thousands of retained runs replays them in
//! pages (its peak memory printed) and trims them to its retention policy; fifty clients
//! connecting, chatting, dispatching, dropping and reconnecting for two minutes.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::{root, unique, Client, Worker, WAIT};

/// Prints a figure and keeps it in `test-artifacts/scale.txt` (the test command shows it at the
/// end: a benchmark figure, not an assertion).
fn report(line: &str) {
    println!("scale: {line}");
    let path = root().join("test-artifacts/scale.txt");
    let _ = std::fs::create_dir_all(path.parent().unwrap());
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
    let _ = writeln!(file, "{line}");
}

/// Runs retained before the policy applies (`SCALE_RUNS` to change it).
fn scale_runs() -> usize {
    std::env::var("SCALE_RUNS").ok().and_then(|n| n.parse().ok()).unwrap_or(5000)
}

#[tokio::test(flavor = "multi_thread")]
async fn thousands_of_retained_runs_replay_in_pages_and_are_trimmed_to_the_policy() {
    let runs = scale_runs();
    // 14 words: `started`, 21 chunks (start, start-step, text-start, 14 deltas, text-end,
    // finish-step, finish, and the child's sources-gathered milestone), `finished`: 23 frames.
    let seed_vars = [
        ("OFFLINE_WORDS", "14"),
        ("OFFLINE_DELAY_MS", "0"),
        ("MAX_CONCURRENT_AGENT_TOOLS", "0"),
        ("AGENT_TOOL_RETAIN_RUNS", "0"),
        ("AGENT_TOOL_RETAIN_MS", "0"),
    ];
    let mut worker = Worker::start_with(None, &seed_vars).await;
    let state = worker.take_temp().unwrap();
    let persist = worker.persist.clone();
    let name = unique("scale");
    let seeding = Instant::now();
    let mut client = worker.client(&name).await;
    let mut topics = (0..runs).map(|i| format!("topic {i}")).collect::<Vec<_>>().into_iter();
    let mut oldest = None;
    loop {
        let mut calls = Vec::new();
        for _ in 0..8 {
            let batch: Vec<String> = topics.by_ref().take(16).collect();
            if !batch.is_empty() {
                calls.push(client.send_call("research", json!([{"topics": batch}])).await);
            }
        }
        if calls.is_empty() {
            break;
        }
        for call in calls {
            let results = client.reply(&call).await.expect("research");
            assert!(results.as_array().unwrap().iter().all(|r| r["status"] == "completed"), "{results}");
            oldest.get_or_insert_with(|| results[0]["runId"].as_str().unwrap().to_owned());
        }
        client.frames.clear();
    }
    let seeded = seeding.elapsed();
    drop(client);
    worker.stop();

    // A fresh runtime on that state, so its peak memory is the replay's.
    let worker = Worker::start_with(Some(&persist), &seed_vars).await;
    reqwest::get(worker.http("/")).await.unwrap();
    let (before, _) = worker.workerd_memory_kib().expect("workerd's memory");
    let connecting = Instant::now();
    let mut client = Client::connect(&worker.ws(&format!("/agents/assistant/{name}"))).await;
    let mut seen = HashSet::new();
    let mut started = 0;
    let mut finished: HashMap<String, i64> = HashMap::new();
    while let Some(frame) = client.recv(Duration::from_secs(3)).await {
        if frame["type"] == "agent-tool-event" {
            let key = (frame["event"]["runId"].as_str().unwrap().to_owned(), frame["sequence"].as_i64().unwrap());
            assert!(seen.insert(key.clone()), "a frame twice: {frame}");
            started += usize::from(frame["event"]["kind"] == "started");
            if frame["event"]["kind"] == "finished" {
                finished.insert(key.0, key.1);
            }
        }
        client.frames.clear();
    }
    let replayed = connecting.elapsed().saturating_sub(Duration::from_secs(3));
    let (peak, now) = worker.workerd_memory_kib().expect("workerd's memory");
    assert_eq!(started, runs, "every run replayed");
    // Every frame once (no key twice, above), and none missing: every run's terminal frame,
    // and, for a sample of runs, every chunk the parent stored for it (only transient progress
    // frames, replaced by a later one, are not replayed).
    assert_eq!(finished.len(), runs, "every run's terminal frame");
    let mut per_run: HashMap<&str, HashSet<i64>> = HashMap::new();
    for (run_id, seq) in &seen {
        per_run.entry(run_id).or_default().insert(*seq);
    }
    for run_id in finished.keys().step_by((runs / 100).max(1)) {
        let stored = client.call("chunks", json!([{"runId": run_id}])).await.unwrap();
        let stored: Vec<i64> = stored.as_array().unwrap().iter().map(|c| c["sequence"].as_i64().unwrap()).collect();
        assert!(stored.len() >= 20, "{run_id}: {stored:?}");
        let replayed = &per_run[run_id.as_str()];
        let missing: Vec<&i64> = stored.iter().filter(|s| !replayed.contains(s)).collect();
        assert!(missing.is_empty(), "{run_id}: stored frames {missing:?} were not replayed");
        assert!(replayed.contains(&0), "{run_id}: its started frame");
    }
    report(&format!(
        "seeded {runs} runs in {:.1} s; a connect replayed {} frames in {:.2} s; workerd peak RSS {} MiB \
         (before the connect {} MiB, after {} MiB)",
        seeded.as_secs_f64(),
        seen.len(),
        replayed.as_secs_f64(),
        peak / 1024,
        before / 1024,
        now / 1024
    ));
    drop(client);
    drop(worker);

    // The policy switched on: 500 runs kept, the rest cleared with their children.
    let keep = 500;
    let vars = [
        ("OFFLINE_WORDS", "3"),
        ("OFFLINE_DELAY_MS", "0"),
        ("AGENT_TOOL_RETAIN_RUNS", "500"),
        ("AGENT_TOOL_ALARM_MS", "500"),
    ];
    let worker = Worker::start_with(Some(&persist), &vars).await;
    let mut client = worker.client(&name).await;
    let trimming = Instant::now();
    client.call("research", json!([{"topics": ["the one that triggers it"], "runIds": ["trigger"]}])).await.unwrap();
    let deadline = Instant::now() + WAIT * 8;
    let kept = loop {
        let rows = client.call("runs", json!([])).await.unwrap();
        let rows = rows.as_array().unwrap().clone();
        if rows.len() <= keep {
            break rows;
        }
        assert!(Instant::now() < deadline, "still {} runs", rows.len());
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    report(&format!(
        "retention trimmed {} runs to {keep} in {:.1} s",
        runs + 1 - keep,
        trimming.elapsed().as_secs_f64()
    ));
    assert_eq!(kept.len(), keep);
    assert!(kept.iter().any(|r| r["runId"] == "trigger"), "the newest stay");
    let oldest = oldest.unwrap();
    assert!(kept.iter().all(|r| r["runId"] != oldest.as_str()), "the oldest went");
    // A cleared run is gone for drill-in too; a kept one is there.
    let path = |id: &str| worker.http(&format!("/agents/assistant/{name}/sub/researcher/{id}/get-messages"));
    assert_eq!(reqwest::get(path(kept[0]["runId"].as_str().unwrap())).await.unwrap().status(), 200);
    assert_eq!(reqwest::get(path(&oldest)).await.unwrap().status(), 404);
    let mut late = Client::connect(&worker.ws(&format!("/agents/assistant/{name}"))).await;
    late.drain(Duration::from_secs(2)).await;
    let started: Vec<&Value> = late.frames.iter().filter(|f| f["event"]["kind"] == "started").collect();
    assert_eq!(started.len(), keep, "the replay holds the kept runs only");
    // The trimmed run's child storage went too: its id dispatched again runs afresh (a child
    // that still held it would answer with the old run's result at once).
    let args = json!([{"agent": "Researcher", "runId": oldest, "input": {"query": "asked anew", "words": 3}}]);
    let deadline = Instant::now() + WAIT;
    let again = loop {
        let again = late.call("dispatch", args.clone()).await.unwrap();
        // Refused, writing nothing, while the child has not yet confirmed its clear.
        if !again["error"].as_str().is_some_and(|e| e.contains("not yet deleted")) {
            break again;
        }
        assert!(Instant::now() < deadline, "the child never cleared: {again}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(
        again["summary"],
        agent_tools::model::OfflineModel::research_answer("asked anew", 3).as_str(),
        "{again}"
    );
    drop(state);
}

/// How long the soak runs (`SOAK_SECS`, default 120).
fn soak_secs() -> u64 {
    std::env::var("SOAK_SECS").ok().and_then(|n| n.parse().ok()).unwrap_or(120)
}

/// A small seeded generator (SplitMix64), one per client.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn fifty_clients_for_two_minutes_leave_every_run_terminal_and_the_rows_within_policy() {
    const CLIENTS: u64 = 50;
    const KEEP: usize = 100;
    let vars = [
        ("OFFLINE_WORDS", "6"),
        ("OFFLINE_DELAY_MS", "20"),
        ("AGENT_TOOL_RETAIN_RUNS", "100"),
        ("AGENT_TOOL_ALARM_MS", "1000"),
    ];
    let worker = std::sync::Arc::new(Worker::start_with(None, &vars).await);
    let name = unique("soak");
    let until = Instant::now() + Duration::from_secs(soak_secs());
    let tasks = (0..CLIENTS).map(|c| {
        let worker = worker.clone();
        let name = name.clone();
        tokio::spawn(async move {
            let mut rng = Rng(c * 7919 + 1);
            let mut done = [0usize; 5];
            let mut client = worker.client(&name).await;
            while Instant::now() < until {
                let action = rng.below(10);
                match action {
                    // Chat, now and then: the parent's model dispatches children. The agent runs
                    // one turn at a time, so a turn may wait behind up to 32 others (or be
                    // refused past them); it ends, whatever it is.
                    0 if rng.below(2) == 0 => {
                        let request = client.chat(&format!("Research topic {c} and topic {}", rng.below(100))).await;
                        client
                            .wait_for(WAIT * 6, |f| {
                                f["type"] == "cf_agent_use_chat_response"
                                    && f["id"] == request.as_str()
                                    && f["done"] == true
                            })
                            .await;
                    }
                    0 => {}
                    // An awaited run (a refusal at the cap is an answer too).
                    1..=3 => {
                        let topic = format!("soak {c} {}", rng.below(1000));
                        client.call("research", json!([{"topics": [topic]}])).await.expect("an answer");
                    }
                    // A detached run.
                    4 | 5 => {
                        let arg =
                            json!([{"agent": "Researcher", "input": {"query": format!("bg {c}")}, "detached": true}]);
                        client.call("dispatch", arg).await.expect("a handle or a refusal");
                    }
                    // Look at the runs.
                    6 | 7 => {
                        client.call("runs", json!([])).await.expect("runs");
                    }
                    // Drop and come back.
                    _ => {
                        drop(client);
                        tokio::time::sleep(Duration::from_millis(rng.below(300))).await;
                        client = worker.client(&name).await;
                    }
                }
                done[(action as usize).min(4)] += 1;
                client.frames.clear();
            }
            done
        })
    });
    let mut actions = 0;
    for task in futures_util::future::join_all(tasks).await {
        actions += task.expect("a client task").iter().sum::<usize>();
    }
    // Then every run ends, and the policy trims the finished ones.
    let mut probe = worker.client(&name).await;
    let deadline = Instant::now() + WAIT * 2;
    let rows = loop {
        let rows = probe.call("runs", json!([])).await.unwrap();
        let rows = rows.as_array().unwrap().clone();
        let live = rows.iter().filter(|r| r["status"] == "running" || r["status"] == "starting").count();
        if live == 0 && rows.len() <= KEEP {
            break rows;
        }
        assert!(Instant::now() < deadline, "{live} live, {} rows", rows.len());
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let log = worker.log_text();
    let errors: Vec<&str> =
        log.lines().filter(|l| l.contains("panicked") || l.contains("[ERROR]") || l.contains("agent-tools:")).collect();
    assert!(errors.is_empty(), "errors in the log:\n{}", errors.join("\n"));
    report(&format!(
        "soak: {CLIENTS} clients, {actions} actions in {} s; {} runs retained at the end (policy {KEEP})",
        soak_secs(),
        rows.len()
    ));
}
