//! Restart recovery, for real: the runtime killed with SIGKILL (parent and children together)
//! and started again on the same state, or the parent's runtime alone killed and restarted while
//! its children go on in another (a [`Split`]), as a deploy of the parent leaves them.
//! Children heal their lost turns by their recovery policy (`rerun`, `seal`); the parent
//! re-attaches, within its budgets, and every client (one that stayed, one that came back, one
//! that came late) ends in the same state, checked with the stock reducer.

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::harness::{percent_encode, root, streamed_text, text_of, unique, Client, Split, Worker, WAIT};
use agent_tools::model::OfflineModel as offline;

fn log_events(worker: &Worker, kind: &str) -> Vec<Value> {
    worker
        .log_text()
        .lines()
        .filter_map(|line| line.find('{').map(|i| &line[i..]))
        .filter_map(|json| serde_json::from_str::<Value>(json).ok())
        .filter(|v| v["type"] == kind)
        .collect()
}

async fn wait_log(worker: &Worker, kind: &str, count: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let events = log_events(worker, kind);
        if events.len() >= count {
            return events;
        }
        assert!(Instant::now() < deadline, "fewer than {count} {kind} events:\n{}", worker.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The stock reducer in Node, for a client that stays (and reconnects) and a late one.
struct StockClients {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl StockClients {
    fn start(name: &str) -> Self {
        let mut child = tokio::process::Command::new("node")
            .arg(root().join("tests/node/restart-reducer.mjs"))
            .arg(name)
            .current_dir(root())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("node");
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Self { child, stdin, lines }
    }

    async fn send(&mut self, command: Value) -> Value {
        self.stdin.write_all(format!("{command}\n").as_bytes()).await.unwrap();
        let line = tokio::time::timeout(WAIT * 2, self.lines.next_line()).await;
        let line = line.ok().and_then(Result::ok).flatten().unwrap_or_else(|| panic!("node said nothing to {command}"));
        serde_json::from_str(&line).unwrap()
    }

    async fn connect(&mut self, who: &str, worker: &Worker) {
        self.send(json!({"cmd": "connect", "who": who, "host": format!("127.0.0.1:{}", worker.port)})).await;
    }

    /// Both states once each holds `runs` runs, all `completed`, with the times the client
    /// stamps itself (`progress.at`) left out.
    async fn states(mut self, runs: usize) -> (Value, Value) {
        let states = self.send(json!({"cmd": "dump", "runs": runs, "status": "completed"})).await;
        let _ = self.child.wait().await;
        (strip_at(states["steady"].clone()), strip_at(states["late"].clone()))
    }
}

fn strip_at(mut v: Value) -> Value {
    match &mut v {
        Value::Object(o) => {
            o.retain(|k, value| !(k == "at" && value.is_number()));
            for value in o.values_mut() {
                *value = strip_at(value.take());
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| *x = strip_at(x.take())),
        _ => {}
    }
    v
}

/// The text of a run's chunks, split at the `data-agent-superseded` markers: one entry per
/// attempt.
fn attempts(events: &[Value]) -> Vec<String> {
    let mut out = vec![String::new()];
    for e in events.iter().filter(|e| e["event"]["kind"] == "chunk") {
        let Ok(chunk) = serde_json::from_str::<Value>(e["event"]["body"].as_str().unwrap_or_default()) else {
            continue;
        };
        match chunk["type"].as_str() {
            Some("text-delta") => out.last_mut().unwrap().push_str(chunk["delta"].as_str().unwrap_or_default()),
            Some("data-agent-superseded") => out.push(String::new()),
            _ => {}
        }
    }
    out
}

fn topic_of(text: &str) -> String {
    text.strip_prefix("Findings on ").and_then(|t| t.split(':').next()).unwrap_or_default().to_owned()
}

const KILL_VARS: &[(&str, &str)] =
    &[("AGENT_TOOL_ALARM_MS", "1500"), ("OFFLINE_WORDS", "60"), ("OFFLINE_DELAY_MS", "80")];

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_runtime_heals_every_run_by_running_the_lost_turn_again() {
    // parity: 132
    let mut worker = Worker::start_with(None, KILL_VARS).await;
    let state = worker.take_temp().unwrap();
    let persist = worker.persist.clone();
    let name = unique("rerun");
    let mut stock = StockClients::start(&name);
    stock.connect("steady", &worker).await;
    let mut client = worker.client(&name).await;
    client.send_call("research", json!([{"topics": ["first topic", "second topic"]}])).await;
    client.chat("Research alpha and beta").await;
    let mut run_ids: Vec<String> = Vec::new();
    while run_ids.len() < 4 {
        let frame = client.recv(WAIT).await.expect("four runs start");
        if frame["event"]["kind"] == "started" {
            run_ids.push(frame["event"]["runId"].as_str().unwrap().to_owned());
        }
    }
    for run_id in &run_ids {
        client.wait_deltas(run_id, 4).await;
    }
    worker.kill();

    // Back up on the same state. Nobody connects: the alarm alone recovers the runs, each
    // child runs its lost turn again, and the parent follows it to the end.
    let worker = Worker::start_with(Some(&persist), KILL_VARS).await;
    let complete = wait_log(&worker, "agent_tool:recovery:complete", 1).await;
    assert_eq!(complete[0]["name"], name.as_str(), "identity comes from SQL on an alarm wake-up");
    assert_eq!(complete[0]["payload"]["reattached"], 4, "{complete:?}");
    let reruns = wait_log(&worker, "agent_tool:recovery:rerun", 4).await;
    let mut rerun_ids: Vec<String> =
        reruns.iter().map(|e| e["payload"]["runId"].as_str().unwrap().to_owned()).collect();
    rerun_ids.sort();
    let mut expected = run_ids.clone();
    expected.sort();
    assert_eq!(rerun_ids, expected, "each child ran its turn again, once");
    assert!(reruns.iter().all(|e| e["payload"]["attempt"] == 2));

    // Wait for every run to finish, still with no client (the finish hooks in the log), then look.
    let deadline = Instant::now() + Duration::from_secs(40);
    while log_events(&worker, "demo:hook").iter().filter(|e| e["hook"] == "finish").count() < 4 {
        assert!(Instant::now() < deadline, "runs did not finish:\n{}", worker.log_text());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut fresh = Client::connect(&worker.ws(&format!("/agents/assistant/{name}"))).await;
    fresh.drain(Duration::from_millis(800)).await;
    let runs = fresh.call("runs", json!([])).await.unwrap();
    assert!(runs.as_array().unwrap().iter().all(|r| r["status"] == "completed"), "{runs:#}");
    for row in runs.as_array().unwrap() {
        let run_id = row["runId"].as_str().unwrap();
        assert_eq!(row["reruns"], 1, "{row}");
        let events = fresh.run_events(run_id);
        let seqs: Vec<i64> = events.iter().map(|e| e["sequence"].as_i64().unwrap()).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{run_id}: {seqs:?}");
        assert_eq!(events.last().unwrap()["event"]["kind"], "finished");
        let attempts = attempts(&events);
        assert_eq!(attempts.len(), 2, "{run_id}: the superseded attempt, a marker, the new one");
        let full = offline::research_answer(&topic_of(&attempts[1]), 60);
        assert_eq!(attempts[1], full, "{run_id}: the new attempt, whole");
        assert!(full.starts_with(&attempts[0]) && attempts[0].len() < full.len(), "{run_id}: the partial, once");
        assert_eq!(row["summary"], full.as_str(), "{run_id}: the result is the new answer alone");
        // The child keeps both in its transcript, the cut-short one marked superseded.
        let path = format!("/agents/assistant/{name}/sub/researcher/{}/get-messages", percent_encode(run_id));
        let messages: Vec<Value> = reqwest::get(worker.http(&path)).await.unwrap().json().await.unwrap();
        let answers: Vec<&Value> = messages.iter().filter(|m| m["role"] == "assistant").collect();
        assert_eq!(answers.len(), 2, "{messages:#?}");
        assert_eq!(answers[0]["metadata"]["superseded"], true);
        assert_eq!(text_of(answers[0]), attempts[0], "the transcript keeps the partial as it streamed");
        assert_eq!(text_of(answers[1]), full);
    }
    let hooks = fresh.call("hooks", json!([])).await.unwrap();
    for run_id in &run_ids {
        let finishes =
            hooks.as_array().unwrap().iter().filter(|h| h["runId"] == run_id.as_str() && h["hook"] == "finish").count();
        assert_eq!(finishes, 1, "{run_id}");
    }

    // The client that stayed (reconnected to the new runtime) and a late one agree.
    stock.connect("steady", &worker).await;
    stock.connect("late", &worker).await;
    let (steady, late) = stock.states(4).await;
    assert_eq!(steady["runsById"].as_object().map(|o| o.len()), Some(4));
    assert_eq!(steady, late, "a reconnected client and a late client end in the same state");
    // What the stock reducer made of a healed run: the cut-short text, the marker, the new text
    // (a part is never removed, so the superseded one stays, marked); the result the new answer.
    for row in runs.as_array().unwrap() {
        let run = &steady["runsById"][row["runId"].as_str().unwrap()];
        assert_eq!(run["status"], "completed");
        assert_eq!(run["summary"], row["summary"], "the stock client's result is the new answer alone");
        let shown: Vec<&Value> = run["parts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["type"] == "text" || p["type"] == "data-agent-superseded")
            .collect();
        assert_eq!(shown.len(), 3, "{shown:#?}");
        assert_eq!(
            (shown[0]["type"].as_str(), shown[1]["type"].as_str()),
            (Some("text"), Some("data-agent-superseded"))
        );
        assert_eq!(shown[1]["data"]["attempt"], 2);
        assert_eq!(shown[2]["text"], row["summary"]);
        let partial = shown[0]["text"].as_str().unwrap();
        assert!(row["summary"].as_str().unwrap().starts_with(partial) && !partial.is_empty());
    }
    drop(state);
}

#[tokio::test(flavor = "multi_thread")]
async fn under_the_seal_policy_a_killed_run_is_interrupted_and_a_new_dispatch_runs_it_afresh() {
    // parity: 25
    let vars = [KILL_VARS, &[("CHILD_RECOVERY", "seal")]].concat();
    let mut worker = Worker::start_with(None, &vars).await;
    let state = worker.take_temp().unwrap();
    let persist = worker.persist.clone();
    let name = unique("seal");
    let mut stock = StockClients::start(&name);
    stock.connect("steady", &worker).await;
    let mut client = worker.client(&name).await;
    let args = json!([{"topics": ["sealed topic"], "runIds": ["sealed-1"]}]);
    client.send_call("research", args.clone()).await;
    client.wait_deltas("sealed-1", 5).await;
    worker.kill();

    let worker = Worker::start_with(Some(&persist), &vars).await;
    wait_log(&worker, "agent_tool:recovery:sealed", 1).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut client = loop {
        let mut probe = worker.client(&name).await;
        let runs = probe.call("runs", json!([])).await.unwrap();
        if runs[0]["status"] == "interrupted" {
            assert_eq!(runs[0]["childStillRunning"], false);
            assert!(runs[0]["error"].as_str().unwrap().contains("restarted"), "{runs:#}");
            break probe;
        }
        assert!(Instant::now() < deadline, "the run was not sealed: {runs:#}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    // Retryable: the same run id dispatched again runs it afresh, to a whole answer.
    let result = client.call("research", args).await.unwrap();
    assert_eq!(result[0]["status"], "completed", "{result}");
    let full = offline::research_answer("sealed topic", 60);
    assert_eq!(result[0]["summary"], full.as_str());
    let mut late = Client::connect(&worker.ws(&format!("/agents/assistant/{name}"))).await;
    late.drain(Duration::from_millis(800)).await;
    let events = late.run_events("sealed-1");
    let kinds: Vec<&str> = events.iter().map(|e| e["event"]["kind"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"interrupted"), "the interruption stays in the run's history: {kinds:?}");
    let attempts = attempts(&events);
    assert_eq!(attempts.len(), 2);
    assert!(full.starts_with(&attempts[0]) && attempts[0] != full);
    assert_eq!(attempts[1], full);

    stock.connect("steady", &worker).await;
    stock.connect("late", &worker).await;
    let (steady, late) = stock.states(1).await;
    assert_eq!(steady["runsById"]["sealed-1"]["status"], "completed");
    assert_eq!(steady, late, "a reconnected client and a late client end in the same state");
    drop(state);
}

/// Row 147 on workerd: a runaway is bounded by the child's own `max_recovery_work`, live. A
/// research of 400 words is killed a few words in; back up, the child runs it again (one
/// re-run), and as that attempt streams its 26th chunk the child seals the run `interrupted`
/// and stops the turn, with no other restart, long before its 400 words.
#[tokio::test(flavor = "multi_thread")]
async fn a_runaway_rerun_is_sealed_live_by_the_childs_work_bound() {
    // parity: 147
    let vars = [KILL_VARS, &[("CHILD_MAX_RECOVERY_WORK", "25")]].concat();
    let mut worker = Worker::start_with(None, &vars).await;
    let state = worker.take_temp().unwrap();
    let persist = worker.persist.clone();
    let name = unique("runaway");
    let mut client = worker.client(&name).await;
    dispatch(&mut client, "ramble-1", json!({"query": "ramble", "words": 400, "delayMs": 40})).await;
    client.wait_deltas("ramble-1", 5).await;
    worker.kill();

    let worker = Worker::start_with(Some(&persist), &vars).await;
    let sealed = wait_log(&worker, "agent_tool:recovery:sealed", 1).await;
    assert_eq!(sealed[0]["payload"]["reason"], "work_budget_exceeded", "{sealed:#?}");
    assert_eq!(sealed[0]["payload"]["attempt"], 2, "sealed during the re-run: {sealed:#?}");
    assert_eq!(log_events(&worker, "agent_tool:recovery:rerun").len(), 1, "one re-run, no other restart");
    let row = run_row(&worker, &name, "ramble-1", |r| r["status"] == "interrupted").await;
    assert_eq!(row["childStillRunning"], false, "{row}");
    assert!(row["error"].as_str().unwrap_or_default().contains("max_recovery_work (25)"), "{row}");
    // The stopped turn streamed no more: the child's answer is a fraction of the 400 words.
    let path = format!("/agents/assistant/{name}/sub/researcher/ramble-1/get-messages");
    let messages: Vec<Value> = reqwest::get(worker.http(&path)).await.unwrap().json().await.unwrap();
    let words = messages.iter().filter(|m| m["role"] == "assistant").map(text_of).collect::<String>();
    let count = words.split_whitespace().count();
    assert!(count > 0 && count < 100, "{count} words: {messages:#?}");
    drop(state);
}

const RESET_VARS: &[(&str, &str)] = &[
    ("AGENT_TOOL_ALARM_MS", "800"),
    ("AGENT_TOOL_BACKBONE_MS", "1000"),
    ("OFFLINE_WORDS", "30"),
    ("OFFLINE_DELAY_MS", "60"),
];

async fn dispatch(client: &mut Client, run_id: &str, input: Value) -> String {
    client.send_call("dispatch", json!([{"agent": "Researcher", "runId": run_id, "input": input}])).await
}

async fn run_row(worker: &Worker, name: &str, run_id: &str, until: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let mut probe = worker.client(name).await;
        let runs = probe.call("runs", json!([])).await.unwrap();
        if let Some(row) = runs.as_array().unwrap().iter().find(|r| r["runId"] == run_id) {
            if until(row) {
                return row.clone();
            }
        }
        assert!(Instant::now() < deadline, "{run_id} never got there: {runs:#}\n{}", worker.log_text());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_parent_restarted_alone_reattaches_to_its_live_child_from_the_last_chunk_seen() {
    // parity: 131
    let mut split = Split::start(RESET_VARS).await;
    let name = unique("reattach");
    let mut client = split.parent.client(&name).await;
    dispatch(&mut client, "live-1", json!({"query": "reattach", "words": 100, "delayMs": 80})).await;
    client.wait_deltas("live-1", 6).await;
    split.restart_parent().await;
    let worker = &split.parent;
    wait_log(worker, "agent_tool:recovery:reattach", 1).await;
    let row = run_row(worker, &name, "live-1", |r| r["status"] == "completed").await;
    assert_eq!(row["reruns"], 0, "the child never stopped: nothing ran twice");
    let full = offline::research_answer("reattach", 100);
    assert_eq!(row["summary"], full.as_str());
    // One attempt, every word once, the frames numbered on from where the parent stopped.
    let mut late = worker.client(&name).await;
    late.drain(Duration::from_millis(500)).await;
    let events = late.run_events("live-1");
    let seqs: Vec<i64> = events.iter().map(|e| e["sequence"].as_i64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert_eq!(attempts(&events), std::slice::from_ref(&full));
    assert!(log_events(worker, "agent_tool:recovery:rerun").is_empty());
    // What the first client saw before the restart is exactly what the late one has at those
    // sequences (transient progress aside: it is live only).
    for seen in client.run_events("live-1") {
        if seen["event"]["body"].as_str().is_some_and(|b| b.contains(r#""transient":true"#)) {
            continue;
        }
        let same = events.iter().find(|e| e["sequence"] == seen["sequence"]);
        let same = same.unwrap_or_else(|| panic!("{seen} not replayed; replayed: {:?}", seqs));
        assert_eq!(same["event"], seen["event"]);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_silent_child_is_no_progress_and_its_late_result_repairs_the_run() {
    // parity: 139
    let vars = [RESET_VARS, &[("AGENT_TOOL_REATTACH_NO_PROGRESS_MS", "1500")]].concat();
    let mut split = Split::start(&vars).await;
    let name = unique("silent");
    let mut client = split.parent.client(&name).await;
    let input = json!({"query": "silence", "words": 12, "delayMs": 40, "stallAfterWords": 5, "stallMs": 9000});
    dispatch(&mut client, "quiet-1", input).await;
    client.wait_deltas("quiet-1", 5).await;
    split.restart_parent().await;
    let worker = &split.parent;
    let row = run_row(worker, &name, "quiet-1", |r| r["status"] == "interrupted").await;
    assert_eq!(row["reason"], "no-progress");
    assert_eq!(row["childStillRunning"], true, "soft: the child was left running");
    // The child speaks again and finishes: the backbone records its real result, once.
    let row = run_row(worker, &name, "quiet-1", |r| r["status"] == "completed").await;
    assert_eq!(row["summary"], offline::research_answer("silence", 12).as_str());
    wait_log(worker, "agent_tool:recovery:late_result", 1).await;
    let mut late = worker.client(&name).await;
    late.drain(Duration::from_millis(500)).await;
    let events = late.run_events("quiet-1");
    let kinds: Vec<&str> = events.iter().map(|e| e["event"]["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds.iter().filter(|k| **k == "interrupted").count(), 1, "{kinds:?}");
    assert_eq!(*kinds.last().unwrap(), "finished");
    assert_eq!(streamed_text(&events), offline::research_answer("silence", 12), "every word once");
    let hooks = late.call("hooks", json!([])).await.unwrap();
    let finishes =
        hooks.as_array().unwrap().iter().filter(|h| h["runId"] == "quiet-1" && h["hook"] == "finish").count();
    assert_eq!(finishes, 1, "the finish hook fired once, at the interruption");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_past_its_reattach_window_is_torn_down() {
    // parity: 138, 141
    let vars = [RESET_VARS, &[("AGENT_TOOL_REATTACH_WINDOW_MS", "1200")]].concat();
    let mut split = Split::start(&vars).await;
    let name = unique("window");
    let mut client = split.parent.client(&name).await;
    dispatch(&mut client, "long-1", json!({"query": "window", "words": 150, "delayMs": 80})).await;
    client.wait_deltas("long-1", 3).await;
    split.restart_parent().await;
    let worker = &split.parent;
    let row = run_row(worker, &name, "long-1", |r| r["status"] == "interrupted").await;
    assert_eq!(row["reason"], "window-exceeded");
    assert_eq!(row["childStillRunning"], false);
    // The child was torn down: its own run ended aborted, and no late result ever repairs it.
    let path = format!("/agents/assistant/{name}/sub/researcher/long-1/get-messages");
    let deadline = Instant::now() + WAIT;
    loop {
        let messages: Vec<Value> = reqwest::get(worker.http(&path)).await.unwrap().json().await.unwrap();
        let words = messages.iter().filter(|m| m["role"] == "assistant").map(text_of).collect::<String>();
        if !words.is_empty() && words.split_whitespace().count() < 150 {
            break;
        }
        assert!(Instant::now() < deadline, "the child's answer: {messages:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The alarm that came after says nothing is live or watched any more: no inspection is
    // coming that could repair the run.
    let deadline = Instant::now() + WAIT;
    while !log_events(worker, "agent_tool:alarm")
        .iter()
        .any(|e| e["name"] == name.as_str() && e["payload"]["live"] == 0 && e["payload"]["watched"] == 0)
    {
        assert!(Instant::now() < deadline, "no quiet alarm:\n{}", worker.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let row = run_row(worker, &name, "long-1", |_| true).await;
    assert_eq!(row["status"], "interrupted");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hung_child_times_recovery_out_per_run_and_as_a_whole() {
    // parity: 143, 146
    let mut split = Split::start(RESET_VARS).await;
    let name = unique("hung");
    let mut client = split.parent.client(&name).await;
    for i in 0..4 {
        let input = json!({"query": format!("hung {i}"), "words": 6, "delayMs": 20, "hangMs": 15000});
        dispatch(&mut client, &format!("hung-{i}"), input).await;
    }
    // Each child reports its first progress, then hangs (nothing reaches it, not even an
    // inspection).
    for i in 0..4 {
        client.wait_for(WAIT, |f| f["event"]["runId"] == format!("hung-{i}") && f["event"]["kind"] == "chunk").await;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    split.restart_parent().await;
    let worker = &split.parent;
    let complete = wait_log(worker, "agent_tool:recovery:complete", 1).await;
    assert_eq!(complete[0]["payload"]["finalized"], 4, "{complete:?}");
    let mut reasons = Vec::new();
    for i in 0..4 {
        let row = run_row(worker, &name, &format!("hung-{i}"), |r| r["status"] != "running").await;
        reasons.push(row["reason"].as_str().unwrap_or_default().to_owned());
    }
    // Two seconds per inspection, five for the pass: three time out, the fourth is past the
    // deadline before its turn.
    assert_eq!(reasons.iter().filter(|r| *r == "inspect-timeout").count(), 3, "{reasons:?}");
    assert_eq!(reasons.iter().filter(|r| *r == "recovery-deadline").count(), 1, "{reasons:?}");
    assert_eq!(log_events(worker, "agent_tool:recovery:deadline").len(), 1);
    // The timed-out ones were left running: once unhung, their real results repair them.
    for (i, reason) in reasons.iter().enumerate() {
        if reason == "inspect-timeout" {
            let row = run_row(worker, &name, &format!("hung-{i}"), |r| r["status"] == "completed").await;
            assert_eq!(row["summary"], offline::research_answer(&format!("hung {i}"), 6).as_str());
        }
    }
}

/// Where the runtime is killed in the parent's own chat turn.
#[derive(Debug, Clone, Copy)]
enum KillAt {
    /// At the turn's first frame, before or as the model calls its tools.
    FirstFrame,
    /// While both children stream.
    ChildrenRunning,
    /// While the parent's final answer streams.
    FinalText,
}

/// The parent's own chat turn survives the runtime's death while its two children run: nobody
/// connects after the restart, the alarm continues the turn, the children's results reach the
/// model once each, and the stored answer has every tool part closed.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_runtime_continues_the_parents_own_turn() {
    continue_after_kill(KillAt::ChildrenRunning).await;
}

/// The same, killed at the turn's very first frame.
#[tokio::test(flavor = "multi_thread")]
async fn a_runtime_killed_as_the_turn_begins_continues_it() {
    continue_after_kill(KillAt::FirstFrame).await;
}

/// The same, killed while the parent's answer streams: the cut step runs again, its partial
/// text replaced, not glued.
#[tokio::test(flavor = "multi_thread")]
async fn a_runtime_killed_during_the_final_text_continues_it_once() {
    continue_after_kill(KillAt::FinalText).await;
}

async fn continue_after_kill(at: KillAt) {
    let mut worker = Worker::start_with(None, KILL_VARS).await;
    let _state = worker.take_temp().unwrap();
    let persist = worker.persist.clone();
    let name = unique("turn");
    let mut client = worker.client(&name).await;
    let request = client.chat("Research HTTP/3 and gRPC").await;
    let is_chunk = |f: &Value, kind: &str| {
        f["type"] == "cf_agent_use_chat_response"
            && f["id"] == request.as_str()
            && f["body"].as_str().is_some_and(|b| b.contains(&format!("\"type\":\"{kind}\"")))
    };
    match at {
        KillAt::FirstFrame => {
            client.wait_for(WAIT, |f| f["type"] == "cf_agent_use_chat_response" && f["id"] == request.as_str()).await;
        }
        KillAt::ChildrenRunning => {
            let mut run_ids: Vec<String> = Vec::new();
            while run_ids.len() < 2 {
                let frame = client.recv(WAIT).await.expect("two runs start");
                if frame["event"]["kind"] == "started" {
                    run_ids.push(frame["event"]["runId"].as_str().unwrap().to_owned());
                }
            }
            for run_id in &run_ids {
                client.wait_deltas(run_id, 3).await;
            }
        }
        KillAt::FinalText => {
            client.wait_for(Duration::from_secs(60), |f| is_chunk(f, "text-delta")).await;
        }
    }
    worker.kill();

    let worker = Worker::start_with(Some(&persist), KILL_VARS).await;
    // Nothing reaches the parent until its turn ended: the alarm alone continues it.
    let continued = wait_log(&worker, "agent_tool:chat:continued", 1).await;
    assert_eq!(continued[0]["name"], name.as_str(), "{at:?}");
    assert_eq!(continued[0]["payload"]["outcome"], "completed", "{at:?}: {continued:?}");
    assert_eq!(log_events(&worker, "agent_tool:chat:continue")[0]["payload"]["attempt"], 1, "{at:?}");
    let path = format!("/agents/assistant/{name}/get-messages");
    let deadline = Instant::now() + Duration::from_secs(90);
    let answer = loop {
        let messages: Vec<Value> = reqwest::get(worker.http(&path)).await.unwrap().json().await.unwrap();
        if messages.len() == 2 {
            break messages[1].clone();
        }
        assert!(messages.len() < 2, "{at:?}: one question, one answer: {messages:#?}");
        assert!(Instant::now() < deadline, "{at:?}: the turn was not continued:\n{}", worker.log_text());
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let text = text_of(&answer);
    assert_eq!(text.matches("Here is what I found").count(), 1, "{at:?}: one answer, not glued: {text}");
    assert_eq!(text.matches("- HTTP/3:").count(), 1, "{at:?}: {text}");
    assert_eq!(text.matches("- gRPC:").count(), 1, "{at:?}: {text}");
    let tools: Vec<&Value> =
        answer["parts"].as_array().unwrap().iter().filter(|p| p["type"] == "tool-research").collect();
    assert_eq!(tools.len(), 2, "{at:?}: {answer:#}");
    assert!(tools.iter().all(|p| p["state"] == "output-available"), "{at:?}: {answer:#}");
    // A client that connects now finds nothing streaming and the same answer.
    let mut late = Client::connect(&worker.ws(&format!("/agents/assistant/{name}"))).await;
    late.send_text(&json!({"type": "cf_agent_stream_resume_request", "probeId": "p"}).to_string()).await;
    let none = late.wait_for(WAIT, |f| f["type"].as_str().is_some_and(|t| t.starts_with("cf_agent_stream_"))).await;
    assert_eq!(none["type"], "cf_agent_stream_resume_none", "{at:?}: {none}");
}
