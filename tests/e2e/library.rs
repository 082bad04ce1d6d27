//! The library's public surface, through the demo agent: a caller's cancellation signal,
//! scheduled work that shares the agent's alarm and survives a restart, and the read-only views
//! of the registry (`inspect_agent_tool_run`, `agent_tool_chunks`).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::detached::eventually;
use crate::harness::{unique, Worker, WAIT};
use agent_tools::model::OfflineModel;

#[tokio::test(flavor = "multi_thread")]
async fn a_callers_signal_cancels_its_awaited_runs() {
    // parity: 61
    let worker = Worker::start().await;
    let mut client = worker.client(&unique("signal")).await;
    let args = json!([{"topics": ["slow one", "slow two"], "runIds": ["sig-1", "sig-2"], "words": 80, "delayMs": 80,
                       "cancelAfterMs": 900}]);
    let started = Instant::now();
    let results = client.call("research", args).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "cancelled promptly, not run to the end");
    for (result, run_id) in results.as_array().unwrap().iter().zip(["sig-1", "sig-2"]) {
        assert_eq!(result["status"], "aborted", "{result}");
        assert_eq!(result["error"], "no result within 900 ms");
        let events = client.run_events(run_id);
        assert_eq!(events.last().unwrap()["event"]["kind"], "aborted");
        assert_eq!(events.iter().filter(|e| e["event"]["kind"] == "aborted").count(), 1);
    }
    let runs = client.call("runs", json!([])).await.unwrap();
    assert!(runs.as_array().unwrap().iter().all(|r| r["status"] == "aborted"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_signal_cancelled_before_admission_writes_nothing() {
    let vars = [("MAX_CONCURRENT_AGENT_TOOLS", "1"), ("AGENT_TOOL_ADMISSION", "queue")];
    let worker = Worker::start_with(None, &vars).await;
    let mut client = worker.client(&unique("presignal")).await;
    // Already cancelled: refused at once, no row, no frame.
    let results = client.call("research", json!([{"topics": ["never"], "runIds": ["pre"], "cancelAfterMs": 0}])).await;
    let result = &results.unwrap()[0];
    assert_eq!(result["status"], "aborted", "{result}");
    assert_eq!(result["error"], "cancelled before the dispatch");
    // Queued behind a long run: the caller gives up while waiting for the one slot.
    let busy = client
        .send_call("research", json!([{"topics": ["hold the slot"], "runIds": ["busy"], "words": 40, "delayMs": 100}]))
        .await;
    client.wait_for(WAIT, |f| f["event"]["runId"] == "busy" && f["event"]["kind"] == "started").await;
    let started = Instant::now();
    let queued = client
        .call("research", json!([{"topics": ["waiting"], "runIds": ["queued"], "cancelAfterMs": 500}]))
        .await
        .unwrap();
    assert_eq!(queued[0]["status"], "aborted", "{queued}");
    assert_eq!(queued[0]["error"], "no result within 500 ms");
    assert!(started.elapsed() < Duration::from_secs(3), "it did not wait for the slot");
    let runs = client.call("runs", json!([])).await.unwrap();
    let ids: Vec<&str> = runs.as_array().unwrap().iter().filter_map(|r| r["runId"].as_str()).collect();
    assert_eq!(ids, ["busy"], "neither cancelled dispatch wrote a row");
    assert!(client.run_events("pre").is_empty() && client.run_events("queued").is_empty());
    let busy = client.reply(&busy).await.unwrap();
    assert_eq!(busy[0]["status"], "completed", "the run holding the slot is untouched: {busy}");
}

#[tokio::test(flavor = "multi_thread")]
async fn scheduled_work_shares_the_alarm_and_survives_a_restart() {
    // parity: 34
    let mut worker = Worker::start().await;
    let state = worker.take_temp().unwrap();
    let persist = worker.persist.clone();
    let name = unique("schedule");
    let mut client = worker.client(&name).await;
    let asked = Instant::now();
    let soon = client.call("schedule", json!([{"inMs": 600, "topic": "soon", "runId": "sched-soon"}])).await.unwrap();
    assert!(soon["taskId"].as_str().is_some_and(|id| id.len() == 36), "{soon}");
    let later =
        client.call("schedule", json!([{"inMs": 4000, "topic": "later", "runId": "sched-later"}])).await.unwrap();
    assert_eq!(later["scheduled"], 2);
    let frame = client.wait_for(WAIT, |f| f["event"]["runId"] == "sched-soon" && f["event"]["kind"] == "started").await;
    assert!(asked.elapsed() >= Duration::from_millis(500), "not before its time");
    assert_eq!(frame["event"]["agentType"], "Researcher");
    client.wait_for(WAIT, |f| f["event"]["runId"] == "sched-soon" && f["event"]["kind"] == "finished").await;
    // The runtime stops before the second task is due; it runs after the restart, with nobody
    // connected, from the alarm alone.
    drop(client);
    worker.stop();
    let worker = Worker::start_with(Some(&persist), &[]).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut probe = worker.client(&name).await;
        probe.drain(Duration::from_millis(300)).await;
        if probe.run_events("sched-later").iter().any(|e| e["event"]["kind"] == "finished") {
            let summary = probe.run_events("sched-later").last().unwrap()["event"]["summary"].clone();
            assert_eq!(summary, json!(OfflineModel::research_answer("later", 6)));
            let runs = probe.call("runs", json!([])).await.unwrap();
            assert_eq!(runs.as_array().unwrap().len(), 2, "each task ran once");
            break;
        }
        assert!(Instant::now() < deadline, "the scheduled task never ran after the restart:\n{}", worker.log_text());
    }
    drop(state);
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_can_be_inspected_and_their_chunks_read() {
    // parity: 70, 73, 75, 88, 92
    let worker = Worker::start().await;
    let mut client = worker.client(&unique("inspect")).await;
    assert_eq!(client.call("inspect", json!([{"runId": "nope"}])).await.unwrap(), Value::Null, "unknown: null");
    let args = json!([{"topics": ["inspection"], "runIds": ["ins-1"], "words": 6, "delayMs": 10}]);
    client.call("research", args).await.unwrap();
    let inspection = client.call("inspect", json!([{"runId": "ins-1"}])).await.unwrap();
    assert_eq!(inspection["runId"], "ins-1");
    assert_eq!(inspection["agentType"], "Researcher");
    assert_eq!(inspection["status"], "completed");
    assert_eq!(inspection["result"]["summary"], json!(OfflineModel::research_answer("inspection", 6)));
    assert_eq!(inspection["progress"]["fraction"], 1.0, "the latest progress");
    assert!(inspection["progress"]["at"].as_i64().unwrap() > 0, "with the time it was reported");
    let milestones = inspection["milestones"].as_array().unwrap();
    assert_eq!(milestones.len(), 1);
    assert_eq!((&milestones[0]["name"], &milestones[0]["sequence"]), (&json!("sources-gathered"), &json!(0)));

    // The stored chunks are the run's chunk frames (progress aside), with the same sequences.
    let live: Vec<(i64, String)> = client
        .run_events("ins-1")
        .iter()
        .filter(|e| e["event"]["kind"] == "chunk")
        .filter(|e| !e["event"]["body"].as_str().unwrap().contains("\"data-agent-progress\""))
        .map(|e| (e["sequence"].as_i64().unwrap(), e["event"]["body"].as_str().unwrap().to_owned()))
        .collect();
    let stored = client.call("chunks", json!([{"runId": "ins-1"}])).await.unwrap();
    let stored: Vec<(i64, String)> = stored
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["sequence"].as_i64().unwrap(), c["body"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(stored, live);
    let after = client.call("chunks", json!([{"runId": "ins-1", "after": live[2].0}])).await.unwrap();
    assert_eq!(after.as_array().unwrap().len(), live.len() - 3);
    assert_eq!(client.call("chunks", json!([{"runId": "nope"}])).await.unwrap(), json!([]));
}

/// A direct sub-agent chat (`host.sub_agent::<Researcher>(name).chat(..)`, the demo's `ask`)
/// on real workerd: the answer streams to the caller with no run row and no frames to the
/// parent's clients; the same name is one conversation; a turn dropped mid-stream is cancelled
/// in the child, which a later read of the turn shows.
#[tokio::test(flavor = "multi_thread")]
async fn a_sub_agent_chat_streams_to_its_caller_and_a_dropped_turn_is_cancelled() {
    // parity: 6
    let worker = Worker::start_with(None, &[("OFFLINE_WORDS", "8"), ("OFFLINE_DELAY_MS", "30")]).await;
    let name = unique("ask");
    let mut client = worker.client(&name).await;
    let answer = client.call("ask", json!([{"name": "notes", "message": "Research QUIC"}])).await.unwrap();
    assert_eq!(answer["status"], "completed", "{answer}");
    assert!(!answer["text"].as_str().unwrap().is_empty() && answer["text"] == answer["summary"], "{answer}");
    assert_eq!(client.call("runs", json!([])).await.unwrap(), json!([]), "no run row");
    client.drain(Duration::from_millis(200)).await;
    assert!(!client.frames.iter().any(|f| f["type"] == "agent-tool-event"), "nothing reached the parent's clients");
    let stopped =
        client.call("ask", json!([{"name": "notes", "message": "Research TLS", "stopAfter": 2}])).await.unwrap();
    assert_eq!(stopped["status"], Value::Null, "the caller stopped reading: {stopped}");
    let turn = stopped["turnId"].as_str().unwrap();
    let again = eventually("the dropped turn cancelled in the child", async || {
        let read = client.call("ask", json!([{"name": "notes", "turnId": turn}])).await.ok()?;
        (read["status"] == "aborted").then_some(read)
    })
    .await;
    assert!(again["text"].as_str().unwrap().split_whitespace().count() < 8, "cut short: {again}");
    let transcript: Vec<Value> = reqwest::get(worker.http(&format!("/agents/assistant/{name}/get-messages")))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(transcript.is_empty(), "the parent's own chat is untouched");
}
