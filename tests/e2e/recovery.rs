//! Restart recovery, proven by killing the runtime (SIGKILL to wrangler and workerd) in the
//! middle of streaming runs and starting it again on the same state.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::text_of;
use crate::harness::{streamed_text, unique, Client, Worker, WAIT};
use agent_tools::model::OfflineModel as offline;

const VARS: &[(&str, &str)] = &[("AGENT_TOOL_ALARM_MS", "1500"), ("OFFLINE_WORDS", "60"), ("OFFLINE_DELAY_MS", "80")];

fn log_events(worker: &Worker, kind: &str) -> Vec<Value> {
    worker
        .log_text()
        .lines()
        .filter_map(|line| line.find('{').map(|i| &line[i..]))
        .filter_map(|json| serde_json::from_str::<Value>(json).ok())
        .filter(|v| v["type"] == kind)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_cut_short_by_a_killed_runtime_are_recovered_without_any_client() {
    let mut worker = Worker::start_with(None, VARS).await;
    let state = worker.take_temp().unwrap();
    let persist = worker.persist.clone();
    let name = unique("killed");
    let mut client = worker.client(&name).await;
    let call = client.send_call("research", json!([{"topics": ["first topic", "second topic"]}])).await;
    let chat = client.chat("Research alpha and beta").await;
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
    let _ = (call, chat);

    // Back up on the same state. Nobody connects: the alarm alone must recover the runs.
    let started = Instant::now();
    let worker = Worker::start_with(Some(&persist), VARS).await;
    let complete = loop {
        let done = log_events(&worker, "agent_tool:recovery:complete");
        if let Some(event) = done.first() {
            break event.clone();
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no recovery without a client:\n{}", worker.log_text());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(complete["agent"], "Assistant");
    assert_eq!(complete["name"], name.as_str(), "identity comes from SQL on an alarm wake-up");
    assert_eq!(complete["payload"]["finalized"], 4);
    let rows = log_events(&worker, "agent_tool:recovery:row");
    let mut recovered: Vec<String> = rows.iter().map(|r| r["payload"]["runId"].as_str().unwrap().to_owned()).collect();
    recovered.sort();
    let mut expected = run_ids.clone();
    expected.sort();
    assert_eq!(recovered, expected);

    // Now a client: every run ended with a clear error; what streamed before the kill is kept,
    // never re-run, never glued to a second attempt.
    let mut fresh = Client::connect(&worker.ws(&format!("/agents/assistant/{name}"))).await;
    fresh.drain(Duration::from_millis(800)).await;
    let runs = fresh.call("runs", json!([])).await.unwrap();
    assert_eq!(runs.as_array().unwrap().len(), 4);
    for row in runs.as_array().unwrap() {
        assert_eq!(row["status"], "error", "{row}");
        assert!(row["error"].as_str().unwrap().contains("restarted"), "{row}");
    }
    for run_id in &run_ids {
        let events = fresh.run_events(run_id);
        let seqs: Vec<i64> = events.iter().map(|e| e["sequence"].as_i64().unwrap()).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{run_id}: {seqs:?}");
        let last = events.last().unwrap();
        assert_eq!(last["event"]["kind"], "error");
        // The terminal takes the next sequence after the last forwarded frame (replay keeps
        // that frame: a chunk, or the latest progress).
        assert_eq!(seqs[seqs.len() - 1], seqs[seqs.len() - 2] + 1, "{run_id}: {seqs:?}");
        let text = streamed_text(&events);
        let topic = text.strip_prefix("Findings on ").and_then(|t| t.split(':').next()).unwrap_or_default().to_owned();
        let full = offline::research_answer(&topic, 60);
        assert!(
            !text.is_empty() && full.starts_with(&text) && text.len() < full.len(),
            "{run_id}: a partial answer, once: {text}"
        );
        // The child kept the partial answer in its own transcript.
        let path =
            format!("/agents/assistant/{name}/sub/researcher/{}/get-messages", crate::harness::percent_encode(run_id));
        let messages: Value = reqwest::get(worker.http(&path)).await.unwrap().json().await.unwrap();
        let assistant =
            messages.as_array().unwrap().iter().find(|m| m["role"] == "assistant").expect("a saved partial answer");
        assert_eq!(assistant["metadata"]["interrupted"], true);
        assert_eq!(text_of(assistant), text, "the child's transcript and the parent's frames agree");
    }
    let hooks = fresh.call("hooks", json!([])).await.unwrap();
    for run_id in &run_ids {
        let finishes =
            hooks.as_array().unwrap().iter().filter(|h| h["runId"] == run_id.as_str() && h["hook"] == "finish").count();
        assert_eq!(finishes, 1, "{run_id}");
    }
    // The parent's own chat turn was cut short too: its partial answer is saved, marked.
    let messages: Value = reqwest::get(worker.http(&format!("/agents/assistant/{name}/get-messages")))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let messages = messages.as_array().unwrap();
    assert_eq!(messages.len(), 2, "{messages:#?}");
    assert_eq!(messages[1]["metadata"]["interrupted"], true);
    assert_eq!(messages[1]["parts"].as_array().unwrap().iter().filter(|p| p["type"] == "tool-research").count(), 2);
    drop(state);
}
