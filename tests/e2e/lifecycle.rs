//! The run lifecycle: idempotency, cancellation, replay after refresh, clearing, drill-in,
//! concurrency caps, nothing stranded, hooks that fire once.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::harness::text_of;
use crate::harness::{streamed_text, unique, Client, Worker, WAIT};
use agent_tools::model::OfflineModel as offline;

fn dispatch_args(agent: &str, run_id: &str, query: &str, words: u64, delay_ms: u64) -> Value {
    json!([{ "agent": agent, "runId": run_id, "input": { "query": query, "words": words, "delayMs": delay_ms } }])
}

async fn hooks(client: &mut Client) -> Vec<(String, String, Option<String>)> {
    let rows = client.call("hooks", json!([])).await.unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["runId"].as_str().unwrap().to_owned(),
                r["hook"].as_str().unwrap().to_owned(),
                r["status"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

fn hook_count(hooks: &[(String, String, Option<String>)], run_id: &str, hook: &str) -> usize {
    hooks.iter().filter(|(r, h, _)| r == run_id && h == hook).count()
}

fn is_progress(frame: &Value) -> bool {
    frame["event"]["body"].as_str().is_some_and(|b| b.contains("\"data-agent-progress\""))
}

#[tokio::test(flavor = "multi_thread")]
async fn run_ids_are_never_reused_across_agent_types() {
    let worker = Worker::start().await;
    let mut client = worker.client(&unique("types")).await;
    let first = client.call("dispatch", dispatch_args("Researcher", "shared-id", "QUIC", 4, 0)).await.unwrap();
    assert_eq!(first["status"], "completed");
    let other = client.call("dispatch", dispatch_args("Summarizer", "shared-id", "QUIC", 4, 0)).await.unwrap();
    assert_eq!(other["status"], "error");
    let error = other["error"].as_str().unwrap();
    assert!(error.contains("already belongs to a Researcher run") && error.contains("Summarizer"), "{error}");
    // The demo maps class names to child types; an unknown name never reaches the engine.
    let unknown = client.call("dispatch", dispatch_args("Nope", "other-id", "QUIC", 4, 0)).await.unwrap_err();
    assert!(unknown.contains("unknown variant `Nope`, expected `Researcher` or `Summarizer`"), "{unknown}");
    let runs = client.call("runs", json!([])).await.unwrap();
    assert_eq!(runs.as_array().unwrap().len(), 1, "refusals write nothing");
    assert_eq!(runs[0]["agentType"], "Researcher");
    assert_eq!(runs[0]["status"], "completed");
    // A second class works under its own id.
    let summary = client.call("dispatch", dispatch_args("Summarizer", "sum-1", "QUIC", 5, 0)).await.unwrap();
    assert_eq!(summary["status"], "completed");
    assert_eq!(summary["agentType"], "Summarizer");
    assert_eq!(summary["summary"], offline::research_answer("QUIC", 5).as_str());
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelling_a_run_stops_the_child_promptly_once() {
    // parity: 62
    let worker = Worker::start().await;
    let name = unique("cancel");
    let mut a = worker.client(&name).await;
    let mut b = worker.client(&name).await;
    let call = a.send_call("dispatch", dispatch_args("Researcher", "slow-run", "patience", 400, 100)).await;
    a.wait_deltas("slow-run", 3).await;
    let row = b.call("cancel", json!([{"runId": "slow-run", "reason": "changed my mind"}])).await.unwrap();
    assert_eq!(row["status"], "aborted");
    let result = a.reply(&call).await.unwrap();
    assert_eq!(result["status"], "aborted");
    assert_eq!(result["error"], "changed my mind");
    a.drain(Duration::from_millis(800)).await;
    let events = a.run_events("slow-run");
    let last = events.last().unwrap();
    assert_eq!(last["event"], json!({"kind": "aborted", "runId": "slow-run", "reason": "changed my mind"}));
    assert_eq!(events.iter().filter(|e| e["event"]["kind"] == "aborted").count(), 1);
    let deltas = streamed_text(&events).split_whitespace().count();
    assert!(deltas < 40, "the child stopped promptly: {deltas} words of 400 streamed");

    // The child's own transcript stops growing: its model stream was dropped.
    let url = worker.http(&format!("/agents/assistant/{name}/sub/researcher/slow-run/get-messages"));
    let before: Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
    // A run at the same pace streams six words meanwhile: time enough for the cancelled one to
    // have grown, had its model gone on.
    let paced = b.call("dispatch", dispatch_args("Researcher", "pace-run", "pace", 6, 100)).await.unwrap();
    assert_eq!(paced["status"], "completed");
    let after: Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
    assert_eq!(before, after);
    assert_eq!(before.as_array().unwrap().len(), 2, "the input and the partial answer are kept");
    let saved = text_of(&before[1]);
    assert!(saved.starts_with(&streamed_text(&events)), "the saved answer is what streamed: {saved}");
    assert!(saved.split_whitespace().count() < 40, "and it stopped there: {saved}");

    // Idempotent: again, and for an unknown run, nothing happens.
    let again = b.call("cancel", json!([{"runId": "slow-run", "reason": "again"}])).await.unwrap();
    assert_eq!(again["error"], "changed my mind");
    assert_eq!(b.call("cancel", json!([{"runId": "never-was"}])).await.unwrap(), Value::Null);
    b.drain(Duration::from_millis(300)).await;
    assert_eq!(b.run_events("slow-run").iter().filter(|e| e["event"]["kind"] == "aborted").count(), 1);
    let hooks = hooks(&mut b).await;
    assert_eq!(hook_count(&hooks, "slow-run", "start"), 1);
    assert_eq!(hook_count(&hooks, "slow-run", "finish"), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelling_the_chat_turn_cancels_its_children() {
    // parity: 5
    let worker = Worker::start_with(None, &[("OFFLINE_WORDS", "200"), ("OFFLINE_DELAY_MS", "80")]).await;
    let mut client = worker.client(&unique("chat-cancel")).await;
    let request = client.chat("Research alpha and beta").await;
    let calls: Vec<String> = loop {
        let ids: Vec<String> = client
            .events()
            .iter()
            .filter(|e| e["event"]["kind"] == "started")
            .map(|e| e["event"]["runId"].as_str().unwrap().to_owned())
            .collect();
        if ids.len() == 2 {
            break ids;
        }
        client.recv(WAIT).await.expect("both children start");
    };
    for run_id in &calls {
        client.wait_deltas(run_id, 2).await;
    }
    client.send_text(&json!({"type": "cf_agent_chat_request_cancel", "id": request}).to_string()).await;
    let done = client.chat_done(&request).await;
    assert_eq!(done["outcome"], "aborted");
    for run_id in &calls {
        let end =
            client.wait_for(WAIT, |f| f["event"]["runId"] == run_id.as_str() && f["event"]["kind"] == "aborted").await;
        assert_eq!(end["event"]["reason"], "the chat turn was cancelled");
    }
    let runs = client.call("runs", json!([])).await.unwrap();
    assert!(runs.as_array().unwrap().iter().all(|r| r["status"] == "aborted"), "{runs:#?}");
    let chunks = client.chat_chunks(&request);
    assert_eq!(chunks.last().unwrap()["type"], "abort");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_connecting_mid_stream_gets_every_frame_once() {
    // parity: 2
    let worker = Worker::start().await;
    let name = unique("refresh");
    let mut watcher = worker.client(&name).await;
    let call = watcher.send_call("dispatch", dispatch_args("Researcher", "watched", "replay", 40, 40)).await;
    watcher.wait_deltas("watched", 10).await;
    let mut late = worker.client(&name).await;
    watcher.reply(&call).await.unwrap();
    late.wait_for(WAIT, |f| f["event"]["runId"] == "watched" && f["event"]["kind"] == "finished").await;
    watcher.drain(Duration::from_millis(200)).await;
    let seen = watcher.run_events("watched");
    let got = late.run_events("watched");
    assert!(
        got.iter().any(|f| f["replay"] == true) && got.iter().any(|f| f.get("replay").is_none()),
        "replay, then live"
    );
    let mut seqs: Vec<i64> = got.iter().map(|f| f["sequence"].as_i64().unwrap()).collect();
    let count = seqs.len();
    seqs.dedup();
    assert_eq!(seqs.len(), count, "no frame doubled");
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "in order");
    for frame in &got {
        let original = seen.iter().find(|f| f["sequence"] == frame["sequence"]).expect("a frame the watcher saw");
        assert_eq!(frame["event"], original["event"], "a sequence always names the same frame");
    }
    for frame in seen.iter().filter(|f| !is_progress(f)) {
        assert!(got.iter().any(|g| g["sequence"] == frame["sequence"]), "missing {frame}");
    }
    assert_eq!(streamed_text(&got), offline::research_answer("replay", 40));
}

#[tokio::test(flavor = "multi_thread")]
async fn clearing_removes_runs_their_children_and_their_replay() {
    // parity: 126, 127, 129
    let worker = Worker::start().await;
    let name = unique("clear");
    let mut client = worker.client(&name).await;
    client.call("dispatch", dispatch_args("Researcher", "done-1", "one", 4, 0)).await.unwrap();
    client.call("dispatch", dispatch_args("Summarizer", "done-2", "two", 4, 0)).await.unwrap();
    let live = client.send_call("dispatch", dispatch_args("Researcher", "live-1", "three", 300, 100)).await;
    client.wait_deltas("live-1", 2).await;

    let cleared = client.call("clear", json!([{"status": ["completed"]}])).await.unwrap();
    assert_eq!(cleared, json!({"cleared": ["done-1", "done-2"]}));
    let runs = client.call("runs", json!([])).await.unwrap();
    assert_eq!(runs.as_array().unwrap().iter().map(|r| r["runId"].clone()).collect::<Vec<_>>(), vec![json!("live-1")]);
    let mut fresh = worker.client(&name).await;
    // Replay comes in one piece at connect, oldest run first: once the live run's `started`
    // arrives, the cleared runs would have come before it.
    fresh.wait_for(WAIT, |f| f["event"]["runId"] == "live-1" && f["event"]["kind"] == "started").await;
    assert!(
        fresh.run_events("done-1").is_empty() && fresh.run_events("done-2").is_empty(),
        "cleared runs never replay"
    );
    let gone = reqwest::get(worker.http(&format!("/agents/assistant/{name}/sub/researcher/done-1/get-messages")))
        .await
        .unwrap();
    assert_eq!(gone.status(), 404, "a cleared run cannot be drilled into");

    // Clearing everything cancels the live run first.
    let all = client.call("clear", json!([{}])).await.unwrap();
    assert_eq!(all, json!({"cleared": ["live-1"]}));
    assert_eq!(client.reply(&live).await.unwrap()["status"], "aborted");
    assert!(client.call("runs", json!([])).await.unwrap().as_array().unwrap().is_empty());

    // The child's storage went too: the same run id starts afresh with the new input, and its
    // frames continue the old numbering, so a page that saw the old run takes none for old.
    let old_last = client.run_events("done-1").last().unwrap()["sequence"].as_i64().unwrap();
    let seen = client.frames.len();
    let again = client.call("dispatch", dispatch_args("Researcher", "done-1", "a new topic", 5, 0)).await.unwrap();
    assert_eq!(again["status"], "completed");
    assert_eq!(again["summary"], offline::research_answer("a new topic", 5).as_str());
    client.drain(Duration::from_millis(200)).await;
    let fresh_frames: Vec<&Value> = client.frames[seen..].iter().filter(|f| f["event"]["runId"] == "done-1").collect();
    assert_eq!(fresh_frames[0]["event"]["kind"], "started");
    let seqs: Vec<i64> = fresh_frames[1..].iter().map(|f| f["sequence"].as_i64().unwrap()).collect();
    assert!(!seqs.is_empty() && seqs[0] > old_last, "numbering continues after {old_last}: {seqs:?}");
    assert!(seqs.windows(2).all(|w| w[0] < w[1]));
    let hooks = hooks(&mut client).await;
    assert_eq!(hook_count(&hooks, "live-1", "finish"), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn drill_in_serves_the_childs_own_chat_through_the_gate() {
    // parity: 1, 107, 121, 123, 124
    let worker = Worker::start().await;
    let name = unique("drill");
    let mut parent = worker.client(&name).await;
    let call = parent.send_call("dispatch", dispatch_args("Researcher", "deep/run 1", "drilling", 40, 40)).await;
    parent.wait_deltas("deep/run 1", 5).await;
    let path = format!("/agents/assistant/{name}/sub/researcher/{}", crate::harness::percent_encode("deep/run 1"));
    let mut child = Client::connect(&worker.ws(&path)).await;
    let resuming = child.wait_for(WAIT, |f| f["type"] == "cf_agent_stream_resuming").await;
    assert_eq!(resuming["id"], "deep/run 1");
    let identity = child.wait_for(WAIT, |f| f["type"] == "cf_agent_identity").await;
    assert_eq!(identity, json!({"type": "cf_agent_identity", "name": "deep/run 1", "agent": "researcher"}));
    child.send_text(&json!({"type": "cf_agent_stream_resume_ack", "id": "deep/run 1"}).to_string()).await;
    child.chat_done("deep/run 1").await;
    let frames: Vec<&Value> = child.frames.iter().filter(|f| f["type"] == "cf_agent_use_chat_response").collect();
    let complete = frames.iter().position(|f| f["replayComplete"] == true).expect("a replay, then replayComplete");
    assert!(complete > 0 && frames[..complete].iter().all(|f| f["replay"] == true), "stored chunks replayed");
    assert!(
        frames.len() > complete + 1 && frames[complete + 1..].iter().all(|f| f.get("replay").is_none()),
        "then live frames"
    );
    let text: String = child
        .chat_chunks("deep/run 1")
        .iter()
        .filter(|c| c["type"] == "text-delta")
        .map(|c| c["delta"].as_str().unwrap().to_owned())
        .collect();
    let expected = offline::research_answer("drilling", 40);
    assert_eq!(text, expected, "replay and live join with nothing doubled or missing");
    assert_eq!(parent.reply(&call).await.unwrap()["summary"], expected.as_str());

    let messages: Value =
        reqwest::get(worker.http(&format!("{path}/get-messages"))).await.unwrap().json().await.unwrap();
    assert_eq!(messages[0]["role"], "user");
    assert!(messages[0]["parts"][0]["text"].as_str().unwrap().contains("drilling"));
    assert_eq!(messages[1]["role"], "assistant");

    // The gate: unknown runs and unknown classes are refused and create nothing.
    let http = reqwest::Client::new();
    for bad in ["sub/researcher/guessed", "sub/summarizer/deep%2Frun%201", "sub/nope/deep%2Frun%201"] {
        let resp = http.get(worker.http(&format!("/agents/assistant/{name}/{bad}/get-messages"))).send().await.unwrap();
        assert_eq!(resp.status(), 404, "{bad}");
        assert!(resp.json::<Value>().await.unwrap()["error"].is_string());
    }
    let (mut ws, _) =
        tokio_tungstenite::connect_async(worker.ws(&format!("/agents/assistant/{name}/sub/researcher/guessed")))
            .await
            .expect("the upgrade is answered");
    let close = tokio::time::timeout(WAIT, ws.next()).await.unwrap();
    match close {
        Some(Ok(tokio_tungstenite::tungstenite::Message::Close(Some(frame)))) => {
            assert_eq!(u16::from(frame.code), 4404);
            assert_eq!(frame.reason, "Sub-agent connection rejected (404)");
        }
        other => panic!("expected a 4404 close, got {other:?}"),
    }
    let runs = parent.call("runs", json!([])).await.unwrap();
    assert_eq!(runs.as_array().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn over_the_cap_a_dispatch_is_refused_and_leaves_nothing() {
    // parity: 59
    let worker = Worker::start_with(None, &[("MAX_CONCURRENT_AGENT_TOOLS", "1")]).await;
    let mut client = worker.client(&unique("cap")).await;
    let slow = client.send_call("dispatch", dispatch_args("Researcher", "first", "one", 30, 30)).await;
    client.wait_deltas("first", 1).await;
    let refused = client.call("dispatch", dispatch_args("Researcher", "second", "two", 3, 0)).await.unwrap();
    assert_eq!(refused["status"], "error");
    assert!(refused["error"].as_str().unwrap().contains("maxConcurrentAgentTools (1) reached"), "{refused}");
    assert!(client.run_events("second").is_empty());
    assert_eq!(client.call("runs", json!([])).await.unwrap().as_array().unwrap().len(), 1, "nothing stored");
    assert_eq!(client.reply(&slow).await.unwrap()["status"], "completed");
    let retried = client.call("dispatch", dispatch_args("Researcher", "second", "two", 3, 0)).await.unwrap();
    assert_eq!(retried["status"], "completed", "the same run id succeeds once a slot is free");
}

#[tokio::test(flavor = "multi_thread")]
async fn queued_admission_waits_for_a_slot() {
    let vars = [("MAX_CONCURRENT_AGENT_TOOLS", "1"), ("AGENT_TOOL_ADMISSION", "queue")];
    let worker = Worker::start_with(None, &vars).await;
    let mut client = worker.client(&unique("queue")).await;
    let results = client
        .call("research", json!([{"topics": ["first", "second", "third"], "words": 6, "delayMs": 10}]))
        .await
        .unwrap();
    assert!(results.as_array().unwrap().iter().all(|r| r["status"] == "completed"), "{results:#?}");
    // One at a time: each run starts after the one before it finished.
    let events = client.events();
    let position = |run: &Value, kind: &str| {
        events.iter().position(|e| e["event"]["runId"] == run["runId"] && e["event"]["kind"] == kind).unwrap()
    };
    let runs = results.as_array().unwrap();
    let mut order: Vec<(usize, usize)> =
        runs.iter().map(|r| (position(r, "started"), position(r, "finished"))).collect();
    order.sort();
    for pair in order.windows(2) {
        assert!(pair[0].1 < pair[1].0, "runs overlapped: {order:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failure_after_the_row_is_written_finalizes_it() {
    // Summarizer is bound but has no SQLite storage: its Durable Object cannot start the run.
    let worker = Worker::start_without_sqlite("Summarizer").await;
    let mut client = worker.client(&unique("stranded")).await;
    let result = client.call("dispatch", dispatch_args("Summarizer", "orphan", "text", 3, 0)).await.unwrap();
    assert_eq!(result["status"], "error");
    assert!(result["error"].as_str().unwrap().contains("Summarizer"), "{result}");
    let runs = client.call("runs", json!([])).await.unwrap();
    assert_eq!(runs[0]["status"], "error", "never left starting");
    let events = client.run_events("orphan");
    let kinds: Vec<&str> = events.iter().map(|e| e["event"]["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, vec!["started", "error"]);
    let hooks = hooks(&mut client).await;
    assert_eq!((hook_count(&hooks, "orphan", "start"), hook_count(&hooks, "orphan", "finish")), (1, 1));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_child_without_a_binding_is_refused_before_any_row() {
    let worker = Worker::start_without_binding("Summarizer").await;
    let mut client = worker.client(&unique("unbound")).await;
    let result = client.call("dispatch", dispatch_args("Summarizer", "orphan", "text", 3, 0)).await.unwrap();
    assert_eq!(result["status"], "error");
    let error = result["error"].as_str().unwrap();
    assert!(
        error.contains("no Durable Object binding \"Summarizer\"")
            && error.contains("[[durable_objects.bindings]] name = \"Summarizer\" class_name = \"Summarizer\""),
        "the error names the class and the line to add: {error}"
    );
    assert!(client.call("runs", json!([])).await.unwrap().as_array().unwrap().is_empty(), "nothing written");
    assert!(client.run_events("orphan").is_empty(), "no frame");
    // The parent's own tool (Researcher) is bound: the agent still works.
    let ok = client.call("dispatch", dispatch_args("Researcher", "fine", "QUIC", 3, 0)).await.unwrap();
    assert_eq!(ok["status"], "completed");
}

#[tokio::test(flavor = "multi_thread")]
async fn hooks_fire_once_per_awaited_run() {
    let worker = Worker::start().await;
    let name = unique("hooks");
    let mut a = worker.client(&name).await;
    let mut b = worker.client(&name).await;
    let args = dispatch_args("Researcher", "twice", "hooks", 8, 10);
    let (ra, rb) = tokio::join!(a.call("dispatch", args.clone()), b.call("dispatch", args.clone()));
    assert_eq!(ra.unwrap(), rb.unwrap());
    a.call("dispatch", args).await.unwrap();
    a.call("research", json!([{"topics": ["xx1", "xx2"], "words": 3, "delayMs": 0}])).await.unwrap();
    let hooks = hooks(&mut a).await;
    let runs = a.call("runs", json!([])).await.unwrap();
    assert_eq!(runs.as_array().unwrap().len(), 3);
    for run in runs.as_array().unwrap() {
        let id = run["runId"].as_str().unwrap();
        assert_eq!(hook_count(&hooks, id, "start"), 1, "{id}: {hooks:?}");
        assert_eq!(hook_count(&hooks, id, "finish"), 1, "{id}: {hooks:?}");
    }
    assert!(hooks.iter().filter(|h| h.1 == "finish").all(|h| h.2.as_deref() == Some("completed")));
}

#[tokio::test(flavor = "multi_thread")]
async fn terminal_event_delivery_forwards_only_lifecycle_progress_and_milestones() {
    // parity: 108, 109, 112
    let worker = Worker::start().await;
    let mut client = worker.client(&unique("terminal")).await;
    let mut args = dispatch_args("Researcher", "quiet", "terse", 10, 5);
    args[0]["eventDelivery"] = json!("terminal");
    let result = client.call("dispatch", args).await.unwrap();
    assert_eq!(result["summary"], offline::research_answer("terse", 10).as_str(), "the result is unchanged");
    client.drain(Duration::from_millis(300)).await;
    let events = client.run_events("quiet");
    let bodies: Vec<String> = events
        .iter()
        .filter(|e| e["event"]["kind"] == "chunk")
        .map(|e| {
            serde_json::from_str::<Value>(e["event"]["body"].as_str().unwrap()).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert!(!bodies.is_empty());
    assert!(bodies.iter().all(|t| t == "data-agent-progress" || t == "data-agent-milestone"), "{bodies:?}");
    assert!(bodies.contains(&"data-agent-milestone".to_owned()));
    assert_eq!(events.last().unwrap()["event"]["kind"], "finished");
    // The parent never held the run's text, but its chunks are still there: read from the
    // child, which keeps its whole stream.
    let stored = client.call("chunks", json!([{"runId": "quiet"}])).await.unwrap();
    let stored: Vec<Value> =
        stored.as_array().unwrap().iter().map(|c| serde_json::from_str(c["body"].as_str().unwrap()).unwrap()).collect();
    let text: String =
        stored.iter().filter(|c| c["type"] == "text-delta").map(|c| c["delta"].as_str().unwrap()).collect();
    assert_eq!(text, offline::research_answer("terse", 10), "the child's chunks: {stored:?}");
    let later = client.call("chunks", json!([{"runId": "quiet", "after": 3}])).await.unwrap();
    assert_eq!(later.as_array().unwrap()[0]["sequence"], 4, "after a log index");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_stock_reducer_rebuilds_the_same_state_after_every_refresh() {
    // parity: 116
    let worker = Worker::start().await;
    let report = crate::harness::node_report("replay-reducer.mjs", &worker, &[&unique("reducer")]).await;
    assert_eq!(report["reconnects"], 4, "three refreshes mid-run and one after it ended");
    assert_eq!(report["compared"], 3, "compared with the steady client after every refresh mid-run");
    assert!(report["steadyFrames"].as_u64().unwrap() > 60, "the steady client saw the whole run");
    assert!(report["textLength"].as_u64().unwrap() > 100);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_parents_model_gets_the_failure_envelope_of_a_cancelled_child() {
    // parity: 18
    let worker = Worker::start_with(None, &[("OFFLINE_WORDS", "60"), ("OFFLINE_DELAY_MS", "40")]).await;
    let name = unique("envelope");
    let mut client = worker.client(&name).await;
    let mut other = worker.client(&name).await;
    let request = client.chat("Research alpha and beta").await;
    let started = client.wait_for(WAIT, |f| f["event"]["kind"] == "started").await;
    let victim = started["event"]["runId"].as_str().unwrap().to_owned();
    client.wait_deltas(&victim, 2).await;
    other.call("cancel", json!([{"runId": victim, "reason": "not needed"}])).await.unwrap();
    client.chat_done(&request).await;
    let chunks = client.chat_chunks(&request);
    let call_id = victim.strip_prefix("agent-tool:").unwrap();
    let output = chunks
        .iter()
        .find(|c| c["type"] == "tool-output-available" && c["toolCallId"] == call_id)
        .expect("the cancelled call still gets a result");
    assert_eq!(output["output"], json!({"ok": false, "status": "aborted", "error": "not needed", "retryable": false}));
    let outputs = chunks.iter().filter(|c| c["type"] == "tool-output-available").count();
    assert_eq!(outputs, 2, "the other child completed and the turn went on");
    let text: String =
        chunks.iter().filter(|c| c["type"] == "text-delta").map(|c| c["delta"].as_str().unwrap()).collect();
    assert!(text.contains("\"status\":\"aborted\""), "the model saw the envelope: {text}");
}
