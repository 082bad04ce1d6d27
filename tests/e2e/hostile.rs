//! Hostile input and load: malformed and oversized frames on every surface, and many clients
//! at once. The Worker must answer each with a precise error, lose nothing, corrupt nothing,
//! and never panic (a panic would reset the WASM instance and log it).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::{unique, Client, Worker, WAIT};

fn no_panic(worker: &Worker) {
    let log = worker.log_text();
    for sign in ["panicked", "RuntimeError", "Module terminated", "unreachable"] {
        assert!(!log.contains(sign), "the Worker logged {sign:?}:\n{log}");
    }
}

/// Frames that are wrong in every way this protocol can be.
fn hostile_frames() -> Vec<String> {
    let huge = "x".repeat(1_500_000);
    let mut frames: Vec<String> = vec![
        "".into(),
        "null".into(),
        "42".into(),
        "\"text\"".into(),
        "{".into(),
        "{\"type\":null}".into(),
        format!("{}{}", "[".repeat(5000), "]".repeat(5000)),
        json!({"type": "rpc"}).to_string(),
        json!({"type": "rpc", "id": 7, "method": "runs", "args": []}).to_string(),
        json!({"type": "rpc", "id": "h1", "method": ["runs"], "args": []}).to_string(),
        json!({"type": "rpc", "id": "h2", "method": "runs", "args": "no"}).to_string(),
        json!({"type": "rpc", "id": "h3", "method": "constructor", "args": []}).to_string(),
        json!({"type": "rpc", "id": "h4", "method": "dispatch", "args": [{"agent": 5}]}).to_string(),
        json!({"type": "rpc", "id": "h5", "method": "dispatch", "args": [{"agent": "Researcher", "runId": "a\u{0}b"}]}).to_string(),
        json!({"type": "rpc", "id": "h6", "method": "dispatch", "args": [{"agent": "Researcher", "runId": "r".repeat(10_000)}]}).to_string(),
        json!({"type": "rpc", "id": "h7", "method": "dispatch", "args": [{"agent": "Researcher", "detached": {"onFinish": "nope"}}]}).to_string(),
        json!({"type": "rpc", "id": "h8", "method": "dispatch", "args": [{"agent": "Researcher", "eventDelivery": "sometimes"}]}).to_string(),
        json!({"type": "rpc", "id": "h9", "method": "cancel", "args": [{"runId": []}]}).to_string(),
        json!({"type": "rpc", "id": "h10", "method": "clear", "args": [{"status": "all"}]}).to_string(),
        json!({"type": "rpc", "id": "h11", "method": "clear", "args": [{"status": ["sleeping"]}]}).to_string(),
        json!({"type": "rpc", "id": "h12", "method": "research", "args": [{"topics": "x"}]}).to_string(),
        json!({"type": "rpc", "id": "h13", "method": "research", "args": [vec!["t"; 17]]}).to_string(),
        json!({"type": "cf_agent_use_chat_request"}).to_string(),
        json!({"type": "cf_agent_use_chat_request", "id": "c1", "init": {"method": "GET"}}).to_string(),
        json!({"type": "cf_agent_use_chat_request", "id": "c2", "init": {"method": "POST", "body": "{not json"}}).to_string(),
        json!({"type": "cf_agent_use_chat_request", "id": "c3", "init": {"method": "POST", "body": "{\"messages\":[{\"id\":\"\"}]}"}}).to_string(),
        json!({"type": "cf_agent_use_chat_request", "id": "c4", "init": {"method": "POST",
            "body": json!({"messages": [{"id": "m", "role": "robot", "parts": []}]}).to_string()}}).to_string(),
        json!({"type": "cf_agent_use_chat_request", "id": "c5", "init": {"method": "POST",
            "body": json!({"messages": [{"id": "m", "role": "user", "parts": [{"type": "text", "text": huge}]}]}).to_string()}}).to_string(),
        json!({"type": "cf_agent_chat_messages", "messages": "no"}).to_string(),
        json!({"type": "cf_agent_chat_request_cancel", "id": "never"}).to_string(),
        json!({"type": "cf_agent_stream_resume_ack", "id": "never"}).to_string(),
        json!({"type": "cf_agent_stream_resume_request"}).to_string(),
        json!({"type": "cf_agent_tool_result", "toolCallId": "x", "output": 1}).to_string(),
        json!({"type": "cf_agent_state", "state": {"a": 1}}).to_string(),
        json!({"type": "something_else", "deep": {"a": [1, {"b": null}]}}).to_string(),
    ];
    frames.push("é😀東京\u{0}".into());
    frames
}

async fn send_all(client: &mut Client, frames: &[String]) {
    for frame in frames {
        client.send_text(frame).await;
    }
    client.send_binary(&[0xde, 0xad, 0xbe, 0xef]).await;
    client.drain(Duration::from_millis(500)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_frames_and_paths_change_nothing_and_panic_nothing() {
    let worker = Worker::start_with(None, &[("OFFLINE_WORDS", "5"), ("OFFLINE_DELAY_MS", "5")]).await;
    let name = unique("hostile");
    let mut client = worker.client(&name).await;
    let legit = client
        .call("dispatch", json!([{"agent": "Researcher", "runId": "legit", "input": {"query": "QUIC"}}]))
        .await
        .unwrap();
    assert_eq!(legit["status"], "completed");
    let before = client.call("runs", json!([])).await.unwrap();

    send_all(&mut client, &hostile_frames()).await;
    // Every rpc with a usable id got an answer; every other bad frame an error frame.
    for id in ["h1", "h2", "h3", "h4", "h5", "h6", "h7", "h8", "h9", "h10", "h11", "h12", "h13"] {
        let reply = client.wait_for(WAIT, |f| f["type"] == "rpc" && f["id"] == id).await;
        let error = reply["error"].as_str().unwrap_or_default().to_owned();
        assert!(reply["success"] == false || reply["result"]["status"] == "error", "{id}: {reply}");
        if reply["success"] == false {
            assert!(!error.is_empty(), "{id}: an error says what is wrong");
        }
    }
    let errors = client.frames.iter().filter(|f| f["type"] == "cf_agent_error").count();
    assert!(errors >= 8, "malformed frames get error frames ({errors})");
    for id in ["c2", "c3", "c4", "c5"] {
        let reply = client.wait_for(WAIT, |f| f["type"] == "cf_agent_use_chat_response" && f["id"] == id).await;
        assert_eq!((reply["done"].clone(), reply["error"].clone()), (json!(true), json!(true)), "{id}: {reply}");
    }

    // The drill-in socket of a known run takes the same barrage, and a chat request that
    // borrows the run's id (its stream log must stay the run's).
    let child_path = format!("/agents/assistant/{name}/sub/researcher/legit");
    let child_messages = || async {
        reqwest::get(worker.http(&format!("{child_path}/get-messages"))).await.unwrap().json::<Value>().await.unwrap()
    };
    let child_before = child_messages().await;
    assert_eq!(child_before.as_array().unwrap().len(), 2, "the run's question and answer");
    let mut child = Client::connect(&worker.ws(&child_path)).await;
    let mut frames = hostile_frames();
    frames.push(
        json!({"type": "cf_agent_use_chat_request", "id": "legit", "init": {"method": "POST",
            "body": json!({"messages": [{"id": "u9", "role": "user", "parts": [{"type": "text", "text": "hi"}]}]}).to_string()}})
        .to_string(),
    );
    send_all(&mut child, &frames).await;
    for id in ["h1", "h2", "h3", "h4", "h5", "h6", "h7", "h8", "h9", "h10", "h11", "h12", "h13"] {
        let reply = child.wait_for(WAIT, |f| f["type"] == "rpc" && f["id"] == id).await;
        assert_eq!(reply["success"], false, "{id}: a child has no callable methods: {reply}");
    }
    let errors = child.frames.iter().filter(|f| f["type"] == "cf_agent_error").count();
    assert!(errors >= 8, "malformed frames get error frames on the child too ({errors})");
    for id in ["c2", "c3", "c4", "c5", "legit"] {
        let reply = child.wait_for(WAIT, |f| f["type"] == "cf_agent_use_chat_response" && f["id"] == id).await;
        assert_eq!((reply["done"].clone(), reply["error"].clone()), (json!(true), json!(true)), "{id}: {reply}");
    }
    let refused = child.wait_for(WAIT, |f| f["type"] == "cf_agent_use_chat_response" && f["id"] == "legit").await;
    assert!(refused["body"].as_str().unwrap().contains("names an agent-tool run"), "{refused}");
    assert_eq!(child_messages().await, child_before, "the child's transcript is untouched");

    let http = reqwest::Client::builder().pool_max_idle_per_host(0).timeout(WAIT).build().unwrap();
    let long = "n".repeat(10_000);
    let paths = [
        "/agents/assistant/".to_owned(),
        "/agents//x".to_owned(),
        format!("/agents/assistant/{name}/sub/researcher/%"),
        format!("/agents/assistant/{name}/sub/researcher/%E0%A4%A"),
        format!("/agents/assistant/{long}"),
        format!("/agents/assistant/{name}/sub/researcher/legit/_agent_tools/cancel"),
        format!("/agents/assistant/{name}/../../etc/passwd"),
        format!("/agents/assistant/{name}/sub/researcher/legit/sub/researcher/legit"),
        format!("/agents/assistant/{name}/nothing-here"),
    ];
    for path in &paths {
        for method in [reqwest::Method::GET, reqwest::Method::POST, reqwest::Method::DELETE] {
            for body in [String::new(), "\u{0}garbage{".to_owned(), "x".repeat(2_000_000)] {
                let short: String = path.chars().take(80).collect();
                let resp = http
                    .request(method.clone(), worker.http(path))
                    .body(body.clone())
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("{method} {short} with {} bytes: {e}", body.len()));
                let status = resp.status().as_u16();
                let text = resp.text().await.unwrap_or_default();
                assert!((400..500).contains(&status), "{method} {short}: {status} {text}");
                let error: Value =
                    serde_json::from_str(&text).unwrap_or_else(|_| panic!("{method} {short}: not JSON: {text}"));
                assert!(error["error"].as_str().is_some_and(|e| !e.is_empty()), "{method} {short}: {text}");
            }
        }
    }

    // A method agents do not serve, on a path that names one, is a 405.
    for method in [reqwest::Method::POST, reqwest::Method::DELETE, reqwest::Method::PUT] {
        let resp =
            http.request(method.clone(), worker.http(&format!("/agents/assistant/{name}"))).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 405, "{method}");
    }

    // Nothing changed, nothing broke.
    assert_eq!(client.call("runs", json!([])).await.unwrap(), before, "the registry is untouched");
    let after = client
        .call("dispatch", json!([{"agent": "Researcher", "runId": "after", "input": {"query": "QUIC"}}]))
        .await
        .unwrap();
    assert_eq!(after["status"], "completed", "the agent still works");
    let messages: Value = http
        .get(worker.http(&format!("/agents/assistant/{name}/get-messages")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(messages.as_array().unwrap().is_empty(), "no bad message was stored: {messages}");
    no_panic(&worker);
}

#[tokio::test(flavor = "multi_thread")]
async fn many_clients_see_every_frame_exactly_once() {
    let worker = Worker::start().await;
    let name = unique("load");
    let mut clients = Vec::new();
    for _ in 0..30 {
        clients.push(worker.client(&name).await);
    }
    let topics: Vec<String> = (0..8).map(|i| format!("topic {i}")).collect();
    let started = Instant::now();
    let results = clients[0].call("research", json!([{"topics": topics, "words": 40, "delayMs": 5}])).await.unwrap();
    let elapsed = started.elapsed();
    let run_ids: Vec<String> =
        results.as_array().unwrap().iter().map(|r| r["runId"].as_str().unwrap().to_owned()).collect();
    assert!(results.as_array().unwrap().iter().all(|r| r["status"] == "completed"));
    let mut frames = 0;
    for client in clients.iter_mut() {
        for run_id in &run_ids {
            client.wait_for(WAIT, |f| f["event"]["runId"] == run_id.as_str() && f["event"]["kind"] == "finished").await;
            let events = client.run_events(run_id);
            let seqs: Vec<i64> = events.iter().map(|e| e["sequence"].as_i64().unwrap()).collect();
            let expected: Vec<i64> = (0..seqs.len() as i64).collect();
            assert_eq!(seqs, expected, "every frame once, in order");
            frames += events.len();
        }
    }
    println!(
        "load: 8 runs × 40 words to 30 clients: {frames} frames delivered in {:.2} s ({:.0} frames/s)",
        elapsed.as_secs_f64(),
        frames as f64 / elapsed.as_secs_f64()
    );
    no_panic(&worker);
}

/// An oversized frame is refused by its size, before it is parsed: a frame over
/// `limits::MAX_FRAME_BYTES` gets its error frame and is never answered as the call it holds,
/// and the socket goes on working.
#[tokio::test(flavor = "multi_thread")]
async fn an_oversized_frame_is_refused_unread() {
    let worker = Worker::start().await;
    let name = unique("oversized");
    let mut client = worker.client(&name).await;
    let limit = agent_tools::limits::MAX_FRAME_BYTES;
    let big = json!({"type": "rpc", "id": "big", "method": "runs", "args": ["x".repeat(limit)]}).to_string();
    client.send_text(&big).await;
    let error = client.wait_for(WAIT, |f| f["type"] == "cf_agent_error").await;
    let message = error["error"].as_str().unwrap();
    assert!(message.contains(&format!("a frame of {} bytes is over the limit", big.len())), "{message}");
    let fine = client.call("runs", json!([])).await.unwrap();
    assert_eq!(fine, json!([]), "the socket still works");
    assert!(!client.frames.iter().any(|f| f["type"] == "rpc" && f["id"] == "big"), "the big call was never read");
    no_panic(&worker);
}
