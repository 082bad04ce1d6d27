//! Detached runs: dispatched without waiting, completed durably through the ledger.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::text_of;
use crate::harness::{unique, Client, Worker, WAIT};

const FAST_BACKBONE: &[(&str, &str)] = &[("AGENT_TOOL_BACKBONE_MS", "300"), ("AGENT_TOOL_ALARM_MS", "1000")];

fn detached(run_id: &str, words: u64, delay_ms: u64, options: Value) -> Value {
    json!([{ "agent": "Researcher", "runId": run_id, "input": { "query": run_id, "words": words, "delayMs": delay_ms },
             "detached": options }])
}

async fn hooks(client: &mut Client, run_id: &str) -> Vec<(String, Option<String>)> {
    let rows = client.call("hooks", json!([])).await.unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .filter(|r| r["runId"] == run_id)
        .map(|r| (r["hook"].as_str().unwrap().to_owned(), r["status"].as_str().map(str::to_owned)))
        .collect()
}

async fn transcript(worker: &Worker, name: &str) -> Vec<Value> {
    let url = worker.http(&format!("/agents/assistant/{name}/get-messages"));
    reqwest::get(url).await.unwrap().json::<Vec<Value>>().await.unwrap()
}

pub(crate) async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the agent's alarm has run with nothing owed (`agent_tool:alarm` with
/// `outstanding: 0`, logged after everything in the log now): the backbone looked again and had
/// nothing left to deliver, so whatever a test counts next is final. A positive event, where a
/// fixed sleep would only hope the backbone had ticked.
///
/// A tick that came before the wait began counts too, once a second passes with no tick after it
/// (a busy machine can finish what the test waited for after the backbone's last tick, and a
/// backbone with nothing owed does not tick again).
async fn backbone_settled(worker: &Worker, name: &str) {
    let alarms = |log: String| -> Vec<Value> {
        log.lines()
            .filter_map(|line| line.find('{').and_then(|i| serde_json::from_str::<Value>(&line[i..]).ok()))
            .filter(|v| v["type"] == "agent_tool:alarm" && v["name"] == name)
            .collect()
    };
    let seen = alarms(worker.log_text()).len();
    let started = Instant::now();
    let deadline = started + WAIT;
    loop {
        let ticks = alarms(worker.log_text());
        let settled_now = ticks.iter().skip(seen).any(|v| v["payload"]["outstanding"] == 0);
        let settled_before = ticks.len() == seen
            && ticks.last().is_some_and(|v| v["payload"]["outstanding"] == 0)
            && started.elapsed() >= Duration::from_secs(1);
        if settled_now || settled_before {
            return;
        }
        assert!(Instant::now() < deadline, "the backbone never settled:\n{}", worker.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_detached_run_returns_at_once_and_its_handler_runs_once() {
    // parity: 41, 42, 44, 45, 51, 93
    let worker = Worker::start_with(None, FAST_BACKBONE).await;
    let name = unique("detached");
    let mut client = worker.client(&name).await;
    let handle = client.call("dispatch", detached("bg-1", 20, 40, json!({"onFinish": "record"}))).await.unwrap();
    assert_eq!(handle, json!({"runId": "bg-1", "agentType": "Researcher", "status": "running"}));
    assert!(
        client.run_events("bg-1").iter().all(|e| e["event"]["kind"] != "finished"),
        "returned before the run ended"
    );
    client.wait_for(WAIT, |f| f["event"]["runId"] == "bg-1" && f["event"]["kind"] == "finished").await;
    let log = eventually("the handler", async || {
        let h = hooks(&mut client, "bg-1").await;
        h.iter().any(|(hook, _)| hook == "detached").then_some(h)
    })
    .await;
    backbone_settled(&worker, &name).await;
    let mut after = hooks(&mut client, "bg-1").await;
    assert_eq!(after, log, "nothing delivered twice");
    // `on_progress` saw the child's milestone once (the demo logs milestones only).
    let milestones: Vec<_> = after.iter().filter(|(hook, _)| hook == "milestone").cloned().collect();
    assert_eq!(milestones, vec![("milestone".to_owned(), Some("sources-gathered".to_owned()))]);
    after.retain(|(hook, _)| hook != "milestone");
    assert_eq!(
        after,
        vec![
            ("start".into(), None),
            ("finish".into(), Some("completed".into())),
            ("detached".into(), Some("completed".into()))
        ]
    );
    // The same run id again: its state, no second child.
    let again = client.call("dispatch", detached("bg-1", 20, 40, json!({"onFinish": "record"}))).await.unwrap();
    assert_eq!(again["status"], "completed");
    assert_eq!(hooks(&mut client, "bg-1").await.len(), after.len() + 1, "no second start, no second delivery");
    client.drain(Duration::from_millis(300)).await;
    let starts = client.run_events("bg-1").iter().filter(|e| e["event"]["kind"] == "started").count();
    assert_eq!(starts, 1, "no second child");
    // Refusals.
    let mut terminal = detached("bg-2", 3, 0, json!(true));
    terminal[0]["eventDelivery"] = json!("terminal");
    let refused = client.call("dispatch", terminal).await.unwrap();
    assert_eq!(refused["status"], "error");
    assert!(refused["error"].as_str().unwrap().contains("not supported for detached runs"));
}

#[tokio::test(flavor = "multi_thread")]
async fn notify_injects_one_message_and_a_model_turn() {
    // parity: 64
    let worker = Worker::start_with(None, FAST_BACKBONE).await;
    let name = unique("notify");
    let mut client = worker.client(&name).await;
    client.call("dispatch", detached("note-1", 6, 10, json!({"notify": true}))).await.unwrap();
    let messages = eventually("the notification and the model's answer", async || {
        let m = transcript(&worker, &name).await;
        (m.len() >= 2).then_some(m)
    })
    .await;
    assert_eq!(messages[0]["id"], "detached-finish:note-1:completed");
    assert_eq!(messages[0]["role"], "user");
    assert_eq!(messages[0]["metadata"]["source"], "detached-agent-tool", "the TypeScript SDK's default source");
    assert_eq!(messages[0]["metadata"]["status"], "completed");
    let text = messages[0]["parts"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("Background task \"Researcher\" (run note-1) finished:\n\nFindings on note-1"), "{text}");
    assert_eq!(messages[1]["role"], "assistant");
    let answer = text_of(&messages[1]);
    assert!(answer.starts_with("Noted: Background task \"Researcher\" (run note-1) finished:"), "{answer}");
    backbone_settled(&worker, &name).await;
    assert_eq!(transcript(&worker, &name).await.len(), 2, "injected once, answered once");
}

#[tokio::test(flavor = "multi_thread")]
async fn milestones_reach_the_chat_live_and_once() {
    // parity: 94, 96, 100
    // A slow backbone (60 s): a milestone that arrived only on a tick would come far too late.
    let worker = Worker::start_with(None, &[("AGENT_TOOL_BACKBONE_MS", "60000")]).await;
    let name = unique("milestone");
    let mut client = worker.client(&name).await;
    let options = json!({"onMilestones": ["sources-gathered"], "notify": {"source": "research-background"}});
    client.call("dispatch", detached("ms-1", 40, 80, options)).await.unwrap();
    let narrated = eventually("the milestone line", async || {
        transcript(&worker, &name).await.into_iter().find(|m| m["id"] == "detached-ms:ms-1:sources-gathered")
    })
    .await;
    let row = client.call("runs", json!([])).await.unwrap()[0].clone();
    assert_eq!(row["status"], "running", "surfaced while the run was still going");
    assert_eq!(narrated["role"], "assistant", "narrate: a synthetic assistant line, no model turn");
    assert_eq!(narrated["metadata"]["source"], "research-background");
    assert_eq!(narrated["metadata"]["milestone"], "sources-gathered");
    assert_eq!(
        narrated["parts"][0]["text"],
        "Background task \"Researcher\" (run ms-1) reached milestone \"sources-gathered\"."
    );
    client.wait_for(WAIT, |f| f["event"]["runId"] == "ms-1" && f["event"]["kind"] == "finished").await;
    let messages = eventually("the completion notice and its answer", async || {
        let m = transcript(&worker, &name).await;
        (m.len() == 3).then_some(m)
    })
    .await;
    let ids: Vec<&str> = messages.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids.iter().filter(|id| id.starts_with("detached-ms:")).count(), 1);
    assert_eq!(ids[1], "detached-finish:ms-1:completed");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_budget_give_up_is_delivered_once_and_its_teardown_never() {
    // parity: 53, 57
    let worker = Worker::start_with(None, FAST_BACKBONE).await;
    let name = unique("budget");
    let mut client = worker.client(&name).await;
    let options = json!({"onFinish": "record", "maxBudgetMs": 1200});
    client.call("dispatch", detached("long-1", 80, 80, options)).await.unwrap();
    let interrupted =
        client.wait_for(WAIT, |f| f["event"]["runId"] == "long-1" && f["event"]["kind"] == "interrupted").await;
    assert_eq!(interrupted["event"]["reason"], "budget-exceeded");
    assert_eq!(interrupted["event"]["childStillRunning"], false);
    let seq = interrupted["sequence"].as_i64().unwrap();
    // Long enough to have seen a second delivery or a late frame: the teardown reached the
    // child (its cut-short turn is saved) and the backbone has nothing left to deliver.
    let child = worker.http(&format!("/agents/assistant/{name}/sub/researcher/long-1/get-messages"));
    eventually("the torn-down child's turn saved", async || {
        let messages: Vec<Value> = reqwest::get(&child).await.ok()?.json().await.ok()?;
        messages.iter().any(|m| m["role"] == "assistant").then_some(())
    })
    .await;
    backbone_settled(&worker, &name).await;
    client.drain(Duration::from_millis(200)).await;
    let later: Vec<&Value> = client
        .frames
        .iter()
        .filter(|f| f["event"]["runId"] == "long-1" && f["sequence"].as_i64() > Some(seq))
        .collect();
    assert!(later.is_empty(), "the torn-down child sent nothing more: {later:#?}");
    let log = hooks(&mut client, "long-1").await;
    let delivered: Vec<&Option<String>> = log.iter().filter(|(h, _)| h == "detached").map(|(_, s)| s).collect();
    assert_eq!(delivered, vec![&Some("interrupted".to_owned())], "no second 'aborted' from the teardown: {log:?}");
    let row = client.call("runs", json!([])).await.unwrap()[0].clone();
    assert_eq!(row["status"], "interrupted");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_handler_that_always_fails_is_dead_lettered() {
    let worker = Worker::start_with(None, &[("AGENT_TOOL_BACKBONE_MS", "200"), ("AGENT_TOOL_ALARM_MS", "1000")]).await;
    let name = unique("dead");
    let mut client = worker.client(&name).await;
    client.call("dispatch", detached("fail-1", 3, 0, json!({"onFinish": "failing"}))).await.unwrap();
    let attempts = |log: &[(String, Option<String>)]| log.iter().filter(|(h, _)| h == "detached-attempt").count();
    eventually("five attempts", async || (attempts(&hooks(&mut client, "fail-1").await) == 5).then_some(())).await;
    backbone_settled(&worker, &name).await;
    assert_eq!(attempts(&hooks(&mut client, "fail-1").await), 5, "not retried forever");
    let failures: Vec<Value> = worker
        .log_text()
        .lines()
        .filter_map(|l| l.find('{').and_then(|i| serde_json::from_str::<Value>(&l[i..]).ok()))
        .filter(|v| v["type"] == "agent_tool:detached:delivery_failed")
        .collect();
    assert_eq!(failures.len(), 5);
    assert_eq!(failures[4]["payload"]["deadLetter"], true);
    assert_eq!(failures[3]["payload"]["deadLetter"], false);
}

#[tokio::test(flavor = "multi_thread")]
async fn detached_runs_recover_after_the_runtime_is_killed() {
    // parity: 48
    // An awaited run would be given up after 1.5 s of silence once re-attached; a detached one
    // keeps its own budgets (1 h of no progress) after the restart too, so the rerun's 3 s stall
    // does not end it.
    let vars = [
        ("AGENT_TOOL_BACKBONE_MS", "500"),
        ("AGENT_TOOL_ALARM_MS", "1000"),
        ("AGENT_TOOL_REATTACH_NO_PROGRESS_MS", "1500"),
    ];
    let mut worker = Worker::start_with(None, &vars).await;
    let state = worker.take_temp().unwrap();
    let persist = worker.persist.clone();
    let name = unique("detached-kill");
    let mut client = worker.client(&name).await;
    let mut args = detached("survivor", 60, 80, json!({"onFinish": "record"}));
    args[0]["input"]["stallAfterWords"] = json!(20);
    args[0]["input"]["stallMs"] = json!(3000);
    client.call("dispatch", args).await.unwrap();
    client.wait_deltas("survivor", 3).await;
    worker.kill();
    let worker = Worker::start_with(Some(&persist), &vars).await;
    // No client: the alarm wakes the parent without a name; it must recover and deliver (the
    // demo logs each hook it runs).
    let delivered_without_client = |log: &str| {
        log.lines().any(|l| l.contains("\"demo:hook\"") && l.contains("\"survivor\"") && l.contains("\"detached\""))
    };
    let deadline = Instant::now() + WAIT;
    while !delivered_without_client(&worker.log_text()) {
        assert!(Instant::now() < deadline, "no delivery without a client:\n{}", worker.log_text());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(worker.log_text().contains("agent_tool:recovery:complete"));
    let mut client = Client::connect(&worker.ws(&format!("/agents/assistant/{name}"))).await;
    let log = eventually("the handler after the restart", async || {
        let h = hooks(&mut client, "survivor").await;
        h.iter().any(|(hook, _)| hook == "detached").then_some(h)
    })
    .await;
    // The child ran its lost turn again (the default policy): the handler got the new answer,
    // once.
    let delivered: Vec<&Option<String>> = log.iter().filter(|(h, _)| h == "detached").map(|(_, s)| s).collect();
    assert_eq!(delivered, vec![&Some("completed".to_owned())]);
    let row = client.call("runs", json!([])).await.unwrap()[0].clone();
    assert_eq!(row["reruns"], 1, "{row}");
    assert_eq!(row["summary"], agent_tools::model::OfflineModel::research_answer("survivor", 60).as_str(), "{row}");
    drop(state);
}

/// The notification ids and source a client may depend on are the stock SDK's: read from the
/// installed `@cloudflare/ai-chat@0.12.2` (no wrangler needed).
#[test]
fn notification_ids_and_source_match_the_stock_sdk() {
    let stock = std::fs::read_to_string(crate::harness::root().join("node_modules/@cloudflare/ai-chat/dist/index.js"))
        .expect("npm packages installed (scripts/setup.sh)");
    for expected in [
        "`detached-finish:${run.runId}:${result.status}`",
        "`detached-ms:${run.runId}:${milestone.name}`",
        &format!("run.notifySource ?? \"{}\"", agent_tools::DEFAULT_NOTIFY_SOURCE),
    ] {
        assert!(stock.contains(expected), "the stock ai-chat no longer has {expected}");
    }
}
