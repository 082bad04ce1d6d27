//! Who may get in, and how far anything may grow: the access hook on every path, and each
//! limit hit with its documented error while the next legitimate request still works.

use std::process::Command;

use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::harness::{root, unique, Client, Worker, WAIT};
use crate::mock_model::{self, MockModel, Reply};

const TOKEN: &str = "s3cret-token";

/// Opens a WebSocket and returns the close code the server sends first.
async fn close_code(url: &str) -> u16 {
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.expect("the upgrade is answered");
    match tokio::time::timeout(WAIT, ws.next()).await.expect("a close in time") {
        Some(Ok(Message::Close(Some(frame)))) => u16::from(frame.code),
        Some(Ok(Message::Text(t))) => panic!("a refused socket got a frame: {t}"),
        other => panic!("expected a close frame, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn access_is_checked_on_every_path_before_anything_runs() {
    let worker = Worker::start_with(None, &[("ACCESS_TOKEN", TOKEN)]).await;
    let name = unique("guarded");
    let base = format!("/agents/assistant/{name}");
    // Sockets: the parent's and drill-in, without a token and with a wrong one.
    assert_eq!(close_code(&worker.ws(&base)).await, 4401);
    assert_eq!(close_code(&worker.ws(&format!("{base}?token=wrong"))).await, 4403);
    assert_eq!(close_code(&worker.ws(&format!("{base}/sub/researcher/r1"))).await, 4401);
    assert_eq!(close_code(&worker.ws(&format!("{base}/sub/researcher/r1?token=wrong"))).await, 4403);
    // What a refused socket sends before its close is never read: no run, no turn.
    let (mut ws, _) = tokio_tungstenite::connect_async(worker.ws(&base)).await.unwrap();
    use futures_util::SinkExt;
    let rpc = json!({"type": "rpc", "id": "1", "method": "dispatch",
                     "args": [{"agent": "Researcher", "runId": "sneaky", "input": {"query": "sneaky"}}]});
    let chat = json!({"type": "cf_agent_use_chat_request", "id": "c1", "init": {"method": "POST",
                      "body": json!({"messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}]}).to_string()}});
    let _ = ws.send(Message::text(rpc.to_string())).await;
    let _ = ws.send(Message::text(chat.to_string())).await;
    while let Ok(Some(Ok(message))) = tokio::time::timeout(WAIT, ws.next()).await {
        assert!(!message.is_text(), "a refused socket got a frame: {message:?}");
        if message.is_close() {
            break;
        }
    }
    // HTTP: the transcript, drill-in, the agent's own routes; a bearer header counts too.
    let http = reqwest::Client::new();
    for (method, path) in [
        (reqwest::Method::GET, format!("{base}/get-messages")),
        (reqwest::Method::GET, format!("{base}/sub/researcher/r1/get-messages")),
        (reqwest::Method::POST, base.clone()),
        (reqwest::Method::POST, format!("{base}/runs")),
        (reqwest::Method::GET, base.clone()),
    ] {
        let body = json!({"query": "through the back door"}).to_string();
        let resp = http.request(method.clone(), worker.http(&path)).body(body).send().await.unwrap();
        assert_eq!(resp.status(), 401, "{method} {path}");
        let body: Value = resp.json().await.unwrap();
        assert!(body["error"].as_str().unwrap().contains("token"), "{body}");
    }
    let wrong = http.get(worker.http(&format!("{base}/get-messages"))).bearer_auth("nope").send().await.unwrap();
    assert_eq!(wrong.status(), 403);
    let right = http.get(worker.http(&format!("{base}/get-messages"))).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(right.status(), 200);

    // The stock client takes the refusal as final: one close, no reconnect.
    let out = Command::new("node")
        .arg(root().join("tests/node/refused.mjs"))
        .arg(format!("127.0.0.1:{}", worker.port))
        .arg(&name)
        .current_dir(root())
        .output()
        .expect("node");
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{out:?}"));
    assert_eq!(seen, json!({"closes": [4401], "opened": 1}), "one refusal, then no retry");
    let out = Command::new("node")
        .arg(root().join("tests/node/refused.mjs"))
        .arg(format!("127.0.0.1:{}", worker.port))
        .arg(&name)
        .arg("wrong")
        .current_dir(root())
        .output()
        .expect("node");
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{out:?}"));
    assert_eq!(seen, json!({"closes": [4403], "opened": 1}), "a wrong token: one refusal, then no retry");

    // Nothing ran: with the token, the agent has no run and no message, and a guessed
    // drill-in id made no child.
    let mut client = Client::connect(&worker.ws(&format!("{base}?token={TOKEN}"))).await;
    assert_eq!(client.call("runs", json!([])).await.unwrap(), json!([]));
    let messages: Vec<Value> = right.json().await.unwrap();
    assert!(messages.is_empty());
    let guessed =
        http.get(worker.http(&format!("{base}/sub/researcher/r1/get-messages?token={TOKEN}"))).send().await.unwrap();
    assert_eq!(guessed.status(), 404, "the drill-in gate still applies behind the token");
    // Only declared RPC methods are callable; the declared ones work.
    let undeclared = client.call("clearAgentToolRuns", json!([])).await.unwrap_err();
    assert!(undeclared.contains("does not exist"), "{undeclared}");
    let result = client.call("research", json!([{"topics": ["access"]}])).await.unwrap();
    assert_eq!(result[0]["status"], "completed");
}

#[tokio::test(flavor = "multi_thread")]
async fn each_limit_gives_its_error_and_the_next_request_still_works() {
    let vars = [("MAX_CONCURRENT_AGENT_TOOLS", "3"), ("OFFLINE_WORDS", "8"), ("OFFLINE_DELAY_MS", "150")];
    let worker = Worker::start_with(None, &vars).await;
    let name = unique("limits");
    let mut client = worker.client(&name).await;
    let dispatch = |run_id: &str, input: Value, extra: Value| {
        let mut arg = json!({"agent": "Researcher", "runId": run_id, "input": input, "detached": true});
        if let (Value::Object(a), Value::Object(e)) = (&mut arg, extra) {
            a.extend(e);
        }
        json!([arg])
    };

    // Run input and display past their limits: refused, nothing written.
    let big = json!({"query": "x".repeat(300 * 1024)});
    let refused = client.call("dispatch", dispatch("big", big, json!({}))).await.unwrap();
    assert_eq!(refused["status"], "error");
    assert!(refused["error"].as_str().unwrap().contains("at most 262144"), "{refused}");
    let wide = json!({"display": {"name": "y".repeat(5000)}});
    let refused = client.call("dispatch", dispatch("wide", json!({"query": "okay"}), wide)).await.unwrap();
    assert!(refused["error"].as_str().unwrap().contains("display"), "{refused}");
    // A given inputPreview is cut to 500 characters.
    let long_preview = json!({"inputPreview": "p".repeat(2000)});
    client.call("dispatch", dispatch("preview", json!({"query": "okay"}), long_preview)).await.unwrap();
    let started = client.wait_for(WAIT, |f| f["event"]["runId"] == "preview" && f["event"]["kind"] == "started").await;
    assert_eq!(started["event"]["inputPreview"].as_str().unwrap().chars().count(), 500);

    // The live-run cap (3 here; the demo's default is 64): the fourth live run is refused.
    for i in 0..2 {
        client.call("dispatch", dispatch(&format!("live-{i}"), json!({"query": "slow"}), json!({}))).await.unwrap();
    }
    let over = client.call("dispatch", dispatch("live-2", json!({"query": "slow"}), json!({}))).await.unwrap();
    assert_eq!(over["status"], "error", "{over}");
    assert!(over["error"].as_str().unwrap().contains('3'), "{over}");

    // A child that sends a tail line past 1 MiB: that run ends `error`, nothing else does.
    for run in ["preview", "live-0", "live-1"] {
        client.wait_for(WAIT, |f| f["event"]["runId"] == run && f["event"]["kind"] == "finished").await;
    }
    let huge = json!({"query": "huge", "hugeChunkBytes": 1_200_000});
    client.call("dispatch", dispatch("huge", huge, json!({}))).await.unwrap();
    let error = client.wait_for(WAIT, |f| f["event"]["runId"] == "huge" && f["event"]["kind"] == "error").await;
    assert!(error["event"]["error"].as_str().unwrap().contains("tail line longer than"), "{error}");
    let ok = client.call("research", json!([{"topics": ["after the limits"]}])).await.unwrap();
    assert_eq!(ok[0]["status"], "completed", "the next request still works: {ok}");
    let rows = client.call("runs", json!([])).await.unwrap();
    let ids: Vec<&str> = rows.as_array().unwrap().iter().map(|r| r["runId"].as_str().unwrap()).collect();
    assert!(
        !ids.contains(&"big") && !ids.contains(&"wide") && !ids.contains(&"live-2"),
        "refused runs left rows: {ids:?}"
    );

    // Chat turns queued on one connection: one runs, four wait, the sixth is refused with an
    // error response and the socket stays open.
    let requests: Vec<String> = (0..6).map(|_| unique("turn")).collect();
    for id in &requests {
        let body = json!({"messages": [{"id": format!("m-{id}"), "role": "user", "parts": [{"type": "text", "text": "hello"}]}]});
        let frame = json!({"type": "cf_agent_use_chat_request", "id": id, "init": {"method": "POST", "body": body.to_string()}});
        client.send_text(&frame.to_string()).await;
    }
    let refused = client.wait_for(WAIT, |f| f["id"] == requests[5].as_str() && f["error"] == true).await;
    assert!(refused["body"].as_str().unwrap().contains("at most 4"), "{refused}");
    assert_eq!(client.call("runs", json!([])).await.unwrap().as_array().unwrap().len(), rows.as_array().unwrap().len());
    for id in &requests[..5] {
        let done = client.wait_for(WAIT * 2, |f| f["id"] == id.as_str() && f["done"] == true).await;
        assert_ne!(done["outcome"], "error", "{done}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_provider_stream_line_past_the_limit_ends_the_turn_with_an_error() {
    let mock = MockModel::start(|body| {
        if mock_model::last_user_text(body).contains("huge") {
            let line =
                format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n", "z".repeat(1_100_000));
            Reply::Raw(line.into_bytes())
        } else {
            mock_model::answer("fine", 0)
        }
    })
    .await;
    let worker = Worker::start_with_vars(&mock.vars()).await;
    let mut client = worker.client(&unique("sse")).await;
    let request = client.chat("a huge line please").await;
    let done = client.chat_done(&request).await;
    assert_eq!(done["outcome"], "error");
    let error = client.wait_for(WAIT, |f| f["id"] == request.as_str() && f["error"] == true).await;
    assert!(error["body"].as_str().unwrap().contains("longer than 1048576 bytes"), "{error}");
    let request = client.chat("and now a normal one").await;
    assert_ne!(client.chat_done(&request).await["outcome"], "error");
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_past_their_age_are_cleared_by_the_alarm_with_no_count_limit() {
    // Age alone, no count limit.
    let vars = [("AGENT_TOOL_RETAIN_RUNS", "0"), ("AGENT_TOOL_RETAIN_MS", "1500")];
    let worker = Worker::start_with(None, &vars).await;
    let mut client = worker.client(&unique("aging")).await;
    let args = json!([{"agent": "Researcher", "runId": "old-1", "input": {"query": "ages out", "words": 3}}]);
    assert_eq!(client.call("dispatch", args.clone()).await.unwrap()["status"], "completed");
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let runs = client.call("runs", json!([])).await.unwrap();
        if runs.as_array().unwrap().is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never aged out: {runs}\n{}", worker.log_text());
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    assert!(worker.log_text().contains("agent_tool:retention"), "the alarm cleared it");
    // Its child's storage went too: the id runs afresh (refused while the child has not yet
    // confirmed, so asked until it has).
    let again = loop {
        let again = client.call("dispatch", args.clone()).await.unwrap();
        if !again["error"].as_str().is_some_and(|e| e.contains("not yet deleted")) {
            break again;
        }
        assert!(std::time::Instant::now() < deadline, "the child never cleared: {again}");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    };
    assert_eq!(again["status"], "completed", "{again}");
}
