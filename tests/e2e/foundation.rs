//! The foundation: a parent dispatches child runs end to end, and what it records survives.

use serde_json::{json, Value};

use crate::harness::{streamed_text, unique, Worker, WAIT};
use agent_tools::model::OfflineModel as offline;

/// Checks one run's frames are exactly `started`@0, `chunk`@1..n, `finished`@n+1, and returns
/// the summary.
fn assert_exact_run(events: &[Value], run_id: &str) -> String {
    assert!(events.len() >= 3, "run {run_id}: too few frames: {events:#?}");
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence"], json!(i), "run {run_id}: frame {i} has sequence {}", e["sequence"]);
        assert_eq!(e["event"]["runId"], run_id);
        assert!(e.get("replay").is_none(), "live frames carry no replay flag");
    }
    assert_eq!(events[0]["event"]["kind"], "started");
    assert_eq!(events[0]["event"]["agentType"], "Researcher");
    let last = events.last().unwrap();
    assert_eq!(last["event"]["kind"], "finished", "run {run_id} must finish: {last}");
    for e in &events[1..events.len() - 1] {
        assert_eq!(e["event"]["kind"], "chunk");
    }
    last["event"]["summary"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn two_concurrent_runs_stream_exact_frames_and_rows() {
    // parity: 17, 30, 36, 106
    let worker = Worker::start().await;
    let name = unique("fanout");
    let mut client = worker.client(&name).await;
    let identity = client.wait_for(WAIT, |f| f["type"] == "cf_agent_identity").await;
    assert_eq!(identity, json!({"type": "cf_agent_identity", "name": name, "agent": "assistant"}));

    let results = client
        .call("research", json!([{"topics": ["HTTP/3", "gRPC"], "words": 12, "delayMs": 15}]))
        .await
        .expect("research call");
    let results = results.as_array().unwrap().clone();
    assert_eq!(results.len(), 2);
    for (i, (topic, result)) in ["HTTP/3", "gRPC"].iter().zip(&results).enumerate() {
        let run_id = result["runId"].as_str().unwrap();
        assert_eq!(result["status"], "completed", "{result}");
        let expected = offline::research_answer(topic, 12);
        assert_eq!(result["summary"], expected.as_str());
        let events = client.run_events(run_id);
        let summary = assert_exact_run(&events, run_id);
        assert_eq!(summary, expected, "the finished frame carries the child's text");
        assert_eq!(streamed_text(&events), expected, "the chunks stream the same text");
        assert_eq!(events[0]["event"]["order"], json!(i));
        assert_eq!(events[0]["event"]["inputPreview"], json!({"query": topic, "words": 12, "delayMs": 15}).to_string());
        let kinds: Vec<String> = events[1..events.len() - 1]
            .iter()
            .map(|e| {
                serde_json::from_str::<Value>(e["event"]["body"].as_str().unwrap()).unwrap()["type"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .filter(|kind| !kind.starts_with("data-agent-"))
            .collect();
        assert_eq!(&kinds[..3], ["start", "start-step", "text-start"]);
        assert_eq!(&kinds[kinds.len() - 3..], ["text-end", "finish-step", "finish"]);
    }
    // The two runs interleaved: both were live at once.
    let order: Vec<String> = client.events().iter().map(|e| e["event"]["runId"].as_str().unwrap().to_owned()).collect();
    let first_end_a = order.iter().rposition(|r| r == results[0]["runId"].as_str().unwrap()).unwrap();
    let first_b = order.iter().position(|r| r == results[1]["runId"].as_str().unwrap()).unwrap();
    assert!(first_b < first_end_a, "runs were dispatched concurrently, not one after the other");

    let rows = client.call("runs", json!([])).await.unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for (row, result) in rows.iter().zip(&results) {
        assert_eq!(row["runId"], result["runId"]);
        assert_eq!(row["status"], "completed");
        assert_eq!(row["agentType"], "Researcher");
        assert_eq!(row["summary"], result["summary"]);
        let events = client.run_events(row["runId"].as_str().unwrap());
        assert_eq!(row["chunks"], json!(stored_chunks(&events)), "every stored chunk kept for replay, once");
        assert!(row["completedAt"].as_i64().unwrap() >= row["startedAt"].as_i64().unwrap());
    }
}

/// The chunk events of a run that are kept (everything but transient progress).
fn stored_chunks(events: &[Value]) -> usize {
    events
        .iter()
        .filter(|e| e["event"]["kind"] == "chunk")
        .filter(|e| !e["event"]["body"].as_str().unwrap_or_default().contains("\"data-agent-progress\""))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn one_run_id_starts_one_child() {
    // parity: 38
    let worker = Worker::start().await;
    let name = unique("dup");
    let mut a = worker.client(&name).await;
    let mut b = worker.client(&name).await;
    let args = json!([{"topics": ["QUIC"], "runIds": ["same-run"], "words": 10, "delayMs": 20}]);
    // Two dispatches of the same run id at once, from two clients…
    let (ra, rb) = tokio::join!(a.call("research", args.clone()), b.call("research", args.clone()));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(ra, rb, "both callers get the same result");
    assert_eq!(ra[0]["status"], "completed");
    // …and once more after it finished.
    let rc = a.call("research", args).await.unwrap();
    assert_eq!(rc, ra);
    a.drain(std::time::Duration::from_millis(300)).await;
    let events = a.run_events("same-run");
    let summary = assert_exact_run(&events, "same-run");
    assert_eq!(summary, offline::research_answer("QUIC", 10));
    assert_eq!(events.iter().filter(|e| e["event"]["kind"] == "started").count(), 1, "one child, one started frame");
    let rows = a.call("runs", json!([])).await.unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 1);
    assert_eq!(rows[0]["chunks"], json!(stored_chunks(&events)), "no second stream was stored");
    let last = events.last().unwrap();
    assert_eq!(last["sequence"], json!(events.len() - 1), "no sequence was handed to a second stream");
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_agents_and_paths_are_json_404s() {
    let worker = Worker::start().await;
    let http = reqwest::Client::new();
    for path in [
        "/agents/nope/x",
        "/agents/researcher/x",
        "/agents/researcher/Assistant%2Fa%2Fb",
        "/elsewhere",
        "/agents/assistant",
    ] {
        let resp = http.get(worker.http(path)).send().await.unwrap();
        assert_eq!(resp.status(), 404, "{path}");
        let body: Value = resp.json().await.unwrap_or_else(|e| panic!("{path}: not JSON: {e}"));
        assert!(body["error"].as_str().is_some_and(|e| !e.is_empty()), "{path}: {body}");
    }
    let body: Value = http.get(worker.http("/agents/nope/x")).send().await.unwrap().json().await.unwrap();
    assert!(body["error"].as_str().unwrap().contains("unknown agent \"nope\""), "{body}");
    let page = http.get(worker.http("/")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("Agent tools for Rust Workers"), "the demo page is served at /");
    // A guessed drill-in id creates nothing and is a 404.
    let resp = http.get(worker.http("/agents/assistant/a/sub/researcher/guessed")).send().await.unwrap();
    assert_eq!(resp.status(), 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_frames_get_errors_and_the_socket_stays_usable() {
    let worker = Worker::start().await;
    let mut client = worker.client(&unique("bad")).await;
    client.wait_for(WAIT, |f| f["type"] == "cf_agent_identity").await;

    client.send_text("{nope").await;
    let e = client.wait_for(WAIT, |f| f["type"] == "cf_agent_error").await;
    assert!(e["error"].as_str().unwrap().contains("not valid JSON"), "{e}");
    client.frames.clear();

    client.send_binary(&[0, 159, 146, 150]).await;
    let e = client.wait_for(WAIT, |f| f["type"] == "cf_agent_error").await;
    assert!(e["error"].as_str().unwrap().contains("binary"), "{e}");
    client.frames.clear();

    client.send_text(r#"{"type":"rpc","method":"research"}"#).await;
    let e = client.wait_for(WAIT, |f| f["type"] == "cf_agent_error").await;
    assert!(e["error"].as_str().unwrap().contains("\"id\" must be a string"), "{e}");

    client.send_text(r#"{"type":"rpc","id":"x1","method":"research","args":{"topics":[]}}"#).await;
    let e = client.wait_for(WAIT, |f| f["type"] == "rpc" && f["id"] == "x1").await;
    assert_eq!(e["success"], false);
    assert!(e["error"].as_str().unwrap().contains("\"args\" must be an array"), "{e}");

    assert_eq!(client.call("nope", json!([])).await, Err("Method nope does not exist".into()));
    let err = client.call("research", json!([{"topics": []}])).await.unwrap_err();
    assert!(err.contains("1 to 16 topics"), "{err}");
    let err = client.call("research", json!([{"topics": ["abc"], "runIds": [""]}])).await.unwrap();
    assert_eq!(err[0]["status"], "error");
    assert!(err[0]["error"].as_str().unwrap().contains("run id must not be empty"));

    // Still usable.
    let ok = client.call("research", json!([{"topics": ["after errors"], "words": 6, "delayMs": 0}])).await.unwrap();
    assert_eq!(ok[0]["status"], "completed");
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_survive_a_restart_and_replay_with_their_sequences() {
    // parity: 89, 125
    let mut worker = Worker::start().await;
    let state = worker.take_temp().unwrap();
    let persist = worker.persist.clone();
    let name = unique("restart");
    let mut live = worker.client(&name).await;
    let results =
        live.call("research", json!([{"topics": ["durable", "objects"], "words": 8, "delayMs": 5}])).await.unwrap();
    assert!(results.as_array().unwrap().iter().all(|r| r["status"] == "completed"));
    live.drain(std::time::Duration::from_millis(300)).await;
    let rows_before = live.call("runs", json!([])).await.unwrap();
    worker.stop();

    let worker = Worker::start_with(Some(&persist), &[]).await;
    let mut fresh = worker.client(&name).await;
    fresh.drain(std::time::Duration::from_millis(1500)).await;
    let replayed = fresh.events();
    assert!(replayed.iter().all(|r| r["replay"] == true));
    // Replay groups frames by run (live, the two runs interleaved) and keeps only the latest
    // progress of a run; every other frame comes back with its live sequence and content.
    for result in results.as_array().unwrap() {
        let run_id = result["runId"].as_str().unwrap();
        let again = fresh.run_events(run_id);
        let before = live.run_events(run_id);
        let latest_progress = before.iter().rfind(|e| is_progress(e)).cloned();
        let expected: Vec<&Value> =
            before.iter().filter(|e| !is_progress(e) || Some(*e) == latest_progress.as_ref()).collect();
        assert!(latest_progress.is_some(), "the researcher reports progress");
        assert_eq!(again.len(), expected.len(), "{again:#?}");
        for (r, l) in again.iter().zip(expected) {
            assert_eq!((&r["sequence"], &r["event"]), (&l["sequence"], &l["event"]));
            assert_eq!(r.get("parentToolCallId"), l.get("parentToolCallId"));
        }
    }
    let rows_after = fresh.call("runs", json!([])).await.unwrap();
    assert_eq!(rows_after, rows_before, "rows intact after the restart");
    drop(state);
}

fn is_progress(frame: &Value) -> bool {
    frame["event"]["body"].as_str().is_some_and(|b| b.contains("\"data-agent-progress\""))
}

#[test]
fn deploy_dry_run_bundles_and_validates() {
    crate::harness::ensure_built();
    let out = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(crate::harness::root().join("node_modules/.bin/wrangler"))
        .args(["deploy", "--dry-run", "--outdir"])
        .arg(out.path())
        .arg("-c")
        .arg(crate::harness::prebuilt_config())
        .env("CLOUDFLARE_CF_FETCH_ENABLED", "false")
        .env("WRANGLER_SEND_METRICS", "false")
        .current_dir(crate::harness::root())
        .status()
        .unwrap();
    assert!(status.success(), "wrangler deploy --dry-run failed");
    let wasm = std::fs::read_dir(out.path())
        .unwrap()
        .flatten()
        .find(|e| e.path().extension().is_some_and(|x| x == "wasm"))
        .expect("the bundle contains the wasm module");
    let bytes = std::fs::read(wasm.path()).unwrap();
    let gz = std::process::Command::new("gzip").arg("-c").arg(wasm.path()).output().unwrap().stdout;
    println!("bundle: wasm {} KB, gzip {} KB", bytes.len() / 1024, gz.len() / 1024);
    assert!(bytes.starts_with(b"\0asm"));
}
