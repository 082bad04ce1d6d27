//! Chat agents: the parent's model calls children as tools, on the offline model and on a real
//! OpenAI-compatible HTTP server scripted by the test.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::text_of;
use crate::harness::{streamed_text, unique, Client, Worker, WAIT};
use crate::mock_model::{self, answer, is_parent, last_role, last_user_text, tool_calls, MockModel, Reply};
use agent_tools::model::OfflineModel as offline;

fn of_type<'a>(chunks: &'a [Value], kind: &str) -> Vec<&'a Value> {
    chunks.iter().filter(|c| c["type"] == kind).collect()
}

fn text_of_chunks(chunks: &[Value]) -> String {
    of_type(chunks, "text-delta").iter().map(|c| c["delta"].as_str().unwrap()).collect()
}

async fn get_messages(worker: &Worker, name: &str) -> Vec<Value> {
    let url = worker.http(&format!("/agents/assistant/{name}/get-messages"));
    reqwest::get(url).await.unwrap().json().await.unwrap()
}

async fn runs(client: &mut Client) -> Vec<Value> {
    client.call("runs", json!([])).await.unwrap().as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_offline_model_dispatches_two_children_in_one_step() {
    // parity: 15
    let vars = [("OFFLINE_WORDS", "8"), ("OFFLINE_DELAY_MS", "5")];
    let worker = Worker::start_with(None, &vars).await;
    let name = unique("chat");
    let mut client = worker.client(&name).await;
    let mut other = worker.client(&name).await;
    let request = client.chat("Research HTTP/3 and gRPC").await;
    let done = client.chat_done(&request).await;
    // Another tab gets the transcript after the turn.
    let broadcast = other
        .wait_for(WAIT, |f| {
            f["type"] == "cf_agent_chat_messages" && f["messages"].as_array().is_some_and(|m| m.len() == 2)
        })
        .await;
    assert_eq!(broadcast["messages"][1]["role"], "assistant");
    assert!(done.get("outcome").is_none(), "completed turns carry no outcome: {done}");
    let chunks = client.chat_chunks(&request);

    let calls = of_type(&chunks, "tool-input-available");
    assert_eq!(calls.len(), 2, "two research calls: {chunks:#?}");
    let starts: Vec<usize> =
        chunks.iter().enumerate().filter(|(_, c)| c["type"] == "start-step").map(|(i, _)| i).collect();
    let first_output = chunks.iter().position(|c| c["type"] == "tool-output-available").unwrap();
    assert!(
        chunks[..first_output].iter().filter(|c| c["type"] == "tool-input-available").count() == 2
            && starts.iter().filter(|s| **s < first_output).count() == 1,
        "both calls are made in the first step, before any result"
    );
    for (call, topic) in calls.iter().zip(["HTTP/3", "gRPC"]) {
        assert_eq!(call["toolName"], "research");
        assert_eq!(call["input"], json!({"query": topic}));
        let call_id = call["toolCallId"].as_str().unwrap();
        let expected = offline::research_answer(topic, 8);
        let output =
            chunks.iter().find(|c| c["type"] == "tool-output-available" && c["toolCallId"] == call_id).unwrap();
        assert_eq!(output["output"], expected.as_str(), "the model gets the child's summary");
        let run_id = format!("agent-tool:{call_id}");
        let events = client.run_events(&run_id);
        assert_eq!(events[0]["event"]["kind"], "started");
        assert_eq!(events[0]["parentToolCallId"], call_id);
        assert_eq!(events[0]["event"]["display"], json!({"icon": "🔎", "name": "Researcher"}));
        assert_eq!(events.last().unwrap()["event"], json!({"kind": "finished", "runId": run_id, "summary": expected}));
        assert_eq!(streamed_text(&events), expected);
        let seqs: Vec<i64> = events.iter().map(|e| e["sequence"].as_i64().unwrap()).collect();
        assert_eq!(seqs, (0..events.len() as i64).collect::<Vec<_>>());
    }
    let final_text = text_of_chunks(&chunks);
    let expected = format!(
        "Here is what I found:\n- HTTP/3: {}\n- gRPC: {}",
        offline::research_answer("HTTP/3", 8),
        offline::research_answer("gRPC", 8)
    );
    assert_eq!(final_text, expected);

    let messages = get_messages(&worker, &name).await;
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0]["role"], "user");
    let assistant = &messages[1];
    assert_eq!(assistant["role"], "assistant");
    let parts = assistant["parts"].as_array().unwrap();
    let tool_parts: Vec<&Value> = parts.iter().filter(|p| p["type"] == "tool-research").collect();
    assert_eq!(tool_parts.len(), 2);
    assert!(tool_parts.iter().all(|p| p["state"] == "output-available"));
    assert_eq!(text_of(assistant), expected, "the final answer is persisted");

    let rows = runs(&mut client).await;
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|r| r["status"] == "completed" && r["parentToolCallId"].is_string()));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_openai_compatible_server_drives_parent_and_children() {
    // parity: 9
    let mock = MockModel::start(|body| {
        if !is_parent(body) {
            let topic = offline::topics(&last_user_text(body)).join(" ");
            return answer(&format!("Notes on {topic}: fast and widely deployed."), 5);
        }
        if last_role(body) == "tool" {
            return answer("Both are modern transport protocols.", 5);
        }
        tool_calls("research", &[json!({"query": "HTTP/3"}), json!({"query": "gRPC"})])
    })
    .await;
    let worker = Worker::start_with_vars(&mock.vars()).await;
    let name = unique("openai");
    let mut client = worker.client(&name).await;
    let request = client.chat("Compare HTTP/3 and gRPC").await;
    client.chat_done(&request).await;
    let chunks = client.chat_chunks(&request);

    let inputs: Vec<Value> = of_type(&chunks, "tool-input-available").iter().map(|c| c["input"].clone()).collect();
    assert_eq!(inputs, vec![json!({"query": "HTTP/3"}), json!({"query": "gRPC"})]);
    let deltas: String = of_type(&chunks, "tool-input-delta")
        .iter()
        .filter(|c| c["toolCallId"] == "call_mock_0")
        .map(|c| c["inputTextDelta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, "{\"query\":\"HTTP/3\"}", "argument deltas stream as they arrive");
    for (call_id, topic) in [("call_mock_0", "HTTP/3"), ("call_mock_1", "gRPC")] {
        let expected = format!("Notes on {topic}: fast and widely deployed.");
        let events = client.run_events(&format!("agent-tool:{call_id}"));
        assert_eq!(streamed_text(&events), expected, "the child streamed its own model's text");
        assert_eq!(events.last().unwrap()["event"]["kind"], "finished");
    }
    assert_eq!(text_of_chunks(&chunks), "Both are modern transport protocols.");

    let requests = mock.requests();
    let parent_requests: Vec<&Value> = requests.iter().filter(|r| is_parent(r)).collect();
    assert_eq!(parent_requests.len(), 2);
    let first = parent_requests[0];
    assert_eq!(first["stream"], true);
    assert_eq!(first["model"], "mock-model");
    assert_eq!(first["messages"][0]["role"], "system");
    assert_eq!(first["tools"][0]["function"]["name"], "research");
    assert_eq!(first["tools"][0]["function"]["parameters"]["properties"]["query"]["minLength"], 3);
    let second = parent_requests[1];
    let tool_results: Vec<(&str, &str)> = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| (m["tool_call_id"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    assert_eq!(
        tool_results,
        vec![
            ("call_mock_0", "Notes on HTTP/3: fast and widely deployed."),
            ("call_mock_1", "Notes on gRPC: fast and widely deployed.")
        ],
        "both results return to the parent's model"
    );
    let assistant_call = second["messages"].as_array().unwrap().iter().find(|m| m["role"] == "assistant").unwrap();
    assert_eq!(assistant_call["tool_calls"].as_array().unwrap().len(), 2);
    assert_eq!(requests.iter().filter(|r| !is_parent(r)).count(), 2, "one model call per child");

    let messages = get_messages(&worker, &name).await;
    assert_eq!(text_of(&messages[1]), "Both are modern transport protocols.");
}

#[tokio::test(flavor = "multi_thread")]
async fn every_schema_keyword_is_checked_before_a_child_starts() {
    // `pattern`, `format`, `uniqueItems` and `if`/`then` of the demo's tool schema, each broken
    // once, and one valid call beside them.
    let calls = [
        json!({"query": "QUIC", "ticket": "net-42"}),
        json!({"query": "QUIC", "notify": "not an address"}),
        json!({"query": "QUIC", "sources": ["rfc9000", "rfc9000"]}),
        json!({"query": "QUIC", "depth": "deep"}),
        json!({"query": "QUIC", "ticket": "NET-42", "notify": "a@example.com", "depth": "deep", "sources": ["rfc9000"]}),
    ];
    let mock = MockModel::start(move |body| {
        if !is_parent(body) {
            answer("Notes.", 0)
        } else if last_role(body) == "tool" {
            answer("Done.", 0)
        } else {
            tool_calls("research", &calls)
        }
    })
    .await;
    let worker = Worker::start_with_vars(&mock.vars()).await;
    let mut client = worker.client(&unique("schema")).await;
    let request = client.chat("Research QUIC").await;
    client.chat_done(&request).await;
    let chunks = client.chat_chunks(&request);
    let errors: Vec<&str> =
        of_type(&chunks, "tool-output-error").iter().map(|e| e["errorText"].as_str().unwrap()).collect();
    let expected = [
        "/ticket: must match the pattern",
        "/notify: must be a valid email",
        "/sources: items 0 and 1 are equal",
        "/sources: is required",
    ];
    assert_eq!(errors.len(), expected.len(), "{errors:#?}");
    for (error, needle) in errors.iter().zip(expected) {
        assert!(error.starts_with("Invalid input for tool research: ") && error.contains(needle), "{error} ~ {needle}");
    }
    let rows = runs(&mut client).await;
    assert_eq!(rows.len(), 1, "only the valid call started a child: {rows:#?}");
    assert_eq!(rows[0]["status"], "completed");
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_tool_input_is_a_tool_error_and_starts_no_child() {
    // parity: 10
    let mock = MockModel::start(|body| {
        if last_role(body) == "tool" {
            answer("Sorry, that topic is too short.", 0)
        } else {
            tool_calls("research", &[json!({"query": "ab"})])
        }
    })
    .await;
    let worker = Worker::start_with_vars(&mock.vars()).await;
    let mut client = worker.client(&unique("invalid")).await;
    let request = client.chat("Research ab").await;
    client.chat_done(&request).await;
    let chunks = client.chat_chunks(&request);
    let errors = of_type(&chunks, "tool-output-error");
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0]["errorText"], "Invalid input for tool research: /query: must be at least 3 characters long");
    assert!(client.events().is_empty(), "no child run was started: {:#?}", client.events());
    assert!(runs(&mut client).await.is_empty());
    let second = &mock.requests()[1];
    let tool_message = second["messages"].as_array().unwrap().iter().find(|m| m["role"] == "tool").unwrap();
    assert!(tool_message["content"].as_str().unwrap().contains("must be at least 3 characters"));
    assert_eq!(text_of_chunks(&chunks), "Sorry, that topic is too short.");
}

/// The Worker's log line naming `id` (wrangler relays the log a moment after it is written).
async fn log_line(worker: &Worker, id: &str) -> String {
    assert!(!id.is_empty(), "an error id");
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        if let Some(line) = worker.log_text().lines().find(|l| l.contains(id)) {
            return line.to_owned();
        }
        assert!(std::time::Instant::now() < deadline, "the log never named {id}:\n{}", worker.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A masked key, as OpenAI quotes it in a 401.
const LEAKY_KEY: &str = "sk-proj-ab**********************wxyz";

#[tokio::test(flavor = "multi_thread")]
async fn provider_failures_end_turns_and_runs_with_errors() {
    // parity: 21
    let mock = MockModel::start(|body| {
        let text = last_user_text(body);
        if text.contains("http401") {
            // What OpenAI says to a wrong key: it quotes the key, masked.
            Reply::Status(401, format!("{{\"error\":{{\"message\":\"Incorrect API key provided: {LEAKY_KEY}\"}}}}"))
        } else if text.contains("instream") {
            // An error inside a 200 stream, with a key in its words.
            let error = format!("{{\"error\":{{\"message\":\"Rate limit for key {LEAKY_KEY} reached\"}}}}");
            Reply::Sse(vec![(0, mock_model::text("Hi")), (0, error)])
        } else if text.contains("http500") {
            Reply::Status(500, "{\"error\":{\"message\":\"upstream exploded\"}}".into())
        } else if text.contains("malformed") {
            Reply::Raw(b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: {not json}\n\n".to_vec())
        } else if text.contains("stall") {
            Reply::Stall(mock_model::text("Starting"))
        } else {
            answer("fine", 0)
        }
    })
    .await;
    let worker = Worker::start_with_vars(&mock.vars()).await;
    let name = unique("failures");
    let mut client = worker.client(&name).await;

    // The parent's own model fails: an error frame, then the final frame with outcome "error".
    // The provider's body (a key, masked) goes to the log under an id; clients get the id.
    let request = client.chat("http401 please").await;
    let done = client.chat_done(&request).await;
    assert_eq!(done["outcome"], "error");
    let error = client
        .wait_for(WAIT, |f| {
            f["type"] == "cf_agent_use_chat_response" && f["id"] == request.as_str() && f["error"] == true
        })
        .await;
    let body = error["body"].as_str().unwrap();
    assert!(body.contains("HTTP 401"), "{error}");
    let id = body.split("(error ").nth(1).and_then(|rest| rest.split(';').next()).expect("an error id");
    let chunks = client.chat_chunks(&request);
    assert_eq!(of_type(&chunks, "error").len(), 1, "the stream carries an error part");
    client.drain(Duration::from_millis(300)).await;
    let mut late = worker.client(&name).await;
    late.drain(Duration::from_millis(500)).await;
    for frame in client.frames.iter().chain(late.frames.iter()) {
        assert!(!frame.to_string().contains("sk-"), "a client saw the key: {frame}");
    }
    let line = log_line(&worker, id).await;
    assert!(line.contains(LEAKY_KEY) && line.contains("HTTP 401"), "the details are in the log: {line}");

    // An error the provider reports inside its stream: the same treatment.
    let request = client.chat("instream please").await;
    assert_eq!(client.chat_done(&request).await["outcome"], "error");
    let error = client
        .wait_for(WAIT, |f| {
            f["type"] == "cf_agent_use_chat_response" && f["id"] == request.as_str() && f["error"] == true
        })
        .await;
    let body = error["body"].as_str().unwrap();
    assert!(body.contains("reported an error"), "{error}");
    let id = body.split("(error ").nth(1).and_then(|rest| rest.split(';').next()).expect("an error id");
    assert!(client.frames.iter().all(|f| !f.to_string().contains("sk-")), "a client saw the key");
    let line = log_line(&worker, id).await;
    assert!(line.contains(LEAKY_KEY) && line.contains("Rate limit"), "the details are in the log: {line}");

    // Children whose model fails end `error`, each with the provider's problem. A run's `error`
    // is safe to surface (row 21): a child's provider that quotes a key in its body gives the
    // run an error that says HTTP 401 and an error id, never the key, in the result, the
    // frames and the registry alike; the child's log has the details under that id.
    let results = client.call("research", json!([["http500", "malformed", "stall", "http401"]])).await.unwrap();
    let results = results.as_array().unwrap();
    let expectations = [
        ("http500", "HTTP 500"),
        ("malformed", "malformed stream"),
        ("stall", "sent nothing for 1500 ms"),
        ("http401", "HTTP 401"),
    ];
    for (result, (topic, needle)) in results.iter().zip(expectations) {
        assert_eq!(result["status"], "error", "{topic}: {result}");
        assert!(result["error"].as_str().unwrap().contains(needle), "{topic}: {result}");
        let events = client.run_events(result["runId"].as_str().unwrap());
        assert_eq!(events.last().unwrap()["event"]["kind"], "error");
    }
    let leaked = &results[3];
    let error = leaked["error"].as_str().unwrap();
    assert!(!leaked.to_string().contains("sk-"), "the run's result quotes the key: {leaked}");
    let id = error.split("(error ").nth(1).and_then(|rest| rest.split(';').next()).expect("an error id");
    let rows = runs(&mut client).await;
    assert_eq!(rows.len(), 4);
    assert!(rows.iter().all(|r| r["status"] == "error"), "nothing left running: {rows:#?}");
    client.drain(Duration::from_millis(300)).await;
    let mut late = worker.client(&name).await;
    late.drain(Duration::from_millis(500)).await;
    for frame in client.frames.iter().chain(late.frames.iter()) {
        assert!(!frame.to_string().contains("sk-"), "a client saw the key: {frame}");
    }
    assert!(!serde_json::to_string(&rows).unwrap().contains("sk-"), "the registry keeps the key: {rows:#?}");
    let line = log_line(&worker, id).await;
    assert!(line.contains(LEAKY_KEY) && line.contains("HTTP 401"), "the details are in the log: {line}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_child_may_finish_with_structured_output_and_no_text() {
    // parity: 29, 31, 33
    let mock = MockModel::start(|_| Reply::Sse(vec![(0, mock_model::finish("stop")), (0, "[DONE]".into())])).await;
    let worker = Worker::start_with_vars(&mock.vars()).await;
    let mut client = worker.client(&unique("structured")).await;
    let results = client.call("research", json!([["quiet topic"]])).await.unwrap();
    let result = &results[0];
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(result["output"], json!({"topic": "quiet topic", "findings": "", "words": 0}));
    let summary: Value = serde_json::from_str(result["summary"].as_str().unwrap()).unwrap();
    assert_eq!(summary, result["output"], "with no text, the summary is the output");
    let events = client.run_events(result["runId"].as_str().unwrap());
    assert_eq!(streamed_text(&events), "");
    assert_eq!(events.last().unwrap()["event"]["kind"], "finished");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_stock_typescript_clients_chat_with_the_rust_agent() {
    let vars = [("OFFLINE_WORDS", "6"), ("OFFLINE_DELAY_MS", "5")];
    let worker = Worker::start_with(None, &vars).await;
    let name = unique("stock");
    let result = crate::harness::node_report("stock-chat.mjs", &worker, &[&name, "Research HTTP/3 and gRPC"]).await;
    assert_eq!(result["identity"], json!({"agent": "assistant", "name": name}));
    let message = &result["message"];
    assert_eq!(message["role"], "assistant");
    let parts = message["parts"].as_array().unwrap();
    let tools: Vec<&Value> = parts.iter().filter(|p| p["type"] == "tool-research").collect();
    assert_eq!(tools.len(), 2, "{parts:#?}");
    for (part, topic) in tools.iter().zip(["HTTP/3", "gRPC"]) {
        assert_eq!(part["state"], "output-available");
        assert_eq!(part["input"], json!({"query": topic}));
        assert_eq!(part["output"], offline::research_answer(topic, 6).as_str());
    }
    let text: String = parts.iter().filter(|p| p["type"] == "text").map(|p| p["text"].as_str().unwrap()).collect();
    assert!(text.starts_with("Here is what I found:\n- HTTP/3: Findings on HTTP/3:"), "{text}");
    assert_eq!(result["runs"].as_array().unwrap().len(), 2, "agent.call() reaches the Rust RPC");
    assert_eq!(result["rejected"], "Method noSuchMethod does not exist", "a failed call rejects with our message");
}

/// Agent state with the stock `AgentClient`, unchanged: `setState` from one tab reaches another's
/// `onStateUpdate`; a change the agent refuses reaches the sender's `onStateUpdateError` with the
/// agent's reason and no other tab; a tab that connects later is `ready` with the state.
#[tokio::test(flavor = "multi_thread")]
async fn the_stock_client_sets_and_follows_the_agents_state() {
    let worker = Worker::start().await;
    let name = unique("state");
    let result = crate::harness::node_report("stock-state.mjs", &worker, &[&name]).await;
    // The sender applied its own change at once; the other tab got it from the server.
    assert_eq!(result["a"]["updates"][0], json!({"state": {"budget": 3}, "source": "client"}));
    assert_eq!(result["b"]["updates"], json!([{"state": {"budget": 3}, "source": "server"}]));
    assert_eq!(result["a"]["errors"], json!(["the state is {\"budget\": n}, a research budget of 1 to 10 runs"]));
    assert_eq!(result["b"]["errors"], json!([]));
    // Nothing of the refused change was kept: a later tab has the accepted state.
    assert_eq!(result["stateOfC"], json!({"budget": 3}));
    assert_eq!(result["c"]["updates"], json!([{"state": {"budget": 3}, "source": "server"}]));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_message_after_a_cleared_chat_dispatches_new_children() {
    let worker = Worker::start_with(None, &[("OFFLINE_WORDS", "5"), ("OFFLINE_DELAY_MS", "0")]).await;
    let name = unique("again");
    let mut client = worker.client(&name).await;
    let first = client.chat("Research HTTP/3 and gRPC").await;
    client.chat_done(&first).await;
    client.send_text(&json!({"type": "cf_agent_chat_clear"}).to_string()).await;
    let second = client.chat("Research HTTP/3 and gRPC").await;
    client.chat_done(&second).await;
    // The offline model numbers its calls from the start of the (now empty) conversation, so
    // the provider ids repeat; the turn renames them rather than join the old runs.
    let ids = |request: &str| -> Vec<String> {
        client
            .chat_chunks(request)
            .iter()
            .filter(|c| c["type"] == "tool-input-available")
            .map(|c| c["toolCallId"].as_str().unwrap().to_owned())
            .collect()
    };
    let (a, b) = (ids(&first), ids(&second));
    assert_eq!((a.len(), b.len()), (2, 2));
    assert!(a.iter().all(|id| !b.contains(id)), "{a:?} vs {b:?}");
    let rows = runs(&mut client).await;
    assert_eq!(rows.len(), 4, "four children ran: {rows:#?}");
    for id in &b {
        let events = client.run_events(&format!("agent-tool:{id}"));
        assert_eq!(events[0]["event"]["kind"], "started", "a new child started for {id}");
        assert_eq!(events.last().unwrap()["event"]["kind"], "finished");
    }
    assert_eq!(get_messages(&worker, &name).await.len(), 2, "the cleared transcript stayed cleared");
}

/// The stock chat transport with a call that needs approval, on `worker`: the first stream ends
/// with the approval request; `cf_agent_tool_approval` and the transport's tool continuation
/// (the resume handshake, `continuation: true` frames) carry the rest into the same message,
/// which the AI SDK's `readUIMessageStream` builds into what the agent stored; the other tab
/// gets `cf_agent_message_updated`, and its late answer is refused with what the first said.
async fn stock_approval(worker: Worker, answer: &str) {
    let name = unique("approval");
    let result = crate::harness::node_report("stock-approval.mjs", &worker, &[&name, answer]).await;
    let asked = result["asked"]["parts"].as_array().unwrap();
    let publish = asked.iter().find(|p| p["type"] == "tool-publish").expect("the publish call");
    assert_eq!(publish["state"], "approval-requested", "{publish:#}");
    assert_eq!(publish["approval"]["id"], format!("approval-{}", publish["toolCallId"].as_str().unwrap()));
    let stored = result["stored"].as_array().unwrap();
    assert_eq!(stored.len(), 2, "{stored:#?}");
    let final_parts = &result["final"]["parts"];
    assert_eq!(final_parts, &stored[1]["parts"], "the stock client built what the agent stored");
    assert_eq!(result["final"]["id"], stored[1]["id"], "the same message went on");
    assert_eq!(result["continued"], true);
    assert!(result["continuationFrames"].as_u64().unwrap() > 0, "{result}");
    assert!(result["updates"].as_u64().unwrap() >= 1, "the other tab saw the answer: {result}");
    let text = text_of(&stored[1]);
    let part = stored[1]["parts"].as_array().unwrap().iter().find(|p| p["type"] == "tool-publish").unwrap().clone();
    if answer == "approve" {
        assert_eq!(part["state"], "output-available", "{part:#}");
        assert!(text.contains("- QUIC: Findings on QUIC:"), "{text}");
        assert_eq!(
            result["lateError"],
            format!("tool call \"{}\" was already answered: approved", part["toolCallId"].as_str().unwrap())
        );
    } else {
        assert_eq!(part["state"], "output-denied", "{part:#}");
        assert!(text.contains("was not approved"), "{text}");
        let late = result["lateError"].as_str().unwrap();
        assert!(late.ends_with("was already answered: denied"), "{late}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_stock_transport_approves_a_call_and_follows_the_turn_into_the_same_message() {
    stock_approval(Worker::start().await, "approve").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_stock_transport_approves_a_call_and_follows_the_turn_into_the_same_message_on_latest_wrangler() {
    stock_approval(Worker::start_demo_on(crate::harness::Wrangler::Latest).await, "approve").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_stock_transport_denies_a_call_and_the_model_is_told() {
    stock_approval(Worker::start().await, "deny").await;
}
