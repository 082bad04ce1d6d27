//! The example Worker (`examples/hello-agents`), built on the library as another Worker would:
//! an agent tool and an ordinary tool in one model step, a child with an agent tool of its own
//! (depth 2, with drill-in), a model of the Worker's own, and a POST route that starts a
//! background run. Each scenario runs twice: on the repository's pinned wrangler (patched, on
//! the machine's Node) and on the newest wrangler (`tools/wrangler-latest`, on Node 22).

use serde_json::{json, Value};

use crate::harness::{unique, Client, Worker, Wrangler, WAIT};
use agent_tools::model::OfflineModel;

fn started(frames: &[Value]) -> Vec<(String, String)> {
    frames
        .iter()
        .filter(|f| f["type"] == "agent-tool-event" && f["event"]["kind"] == "started")
        .map(|f| {
            (f["event"]["runId"].as_str().unwrap().to_owned(), f["event"]["agentType"].as_str().unwrap().to_owned())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_and_ordinary_tools_share_a_step_and_a_child_has_children_of_its_own() {
    tools_beside_agent_tools_and_nested_children(Wrangler::Pinned).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_and_ordinary_tools_share_a_step_and_a_child_has_children_of_its_own_on_latest_wrangler() {
    tools_beside_agent_tools_and_nested_children(Wrangler::Latest).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_post_route_starts_a_background_run() {
    background_run_from_a_post(Wrangler::Pinned).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_post_route_starts_a_background_run_on_latest_wrangler() {
    background_run_from_a_post(Wrangler::Latest).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tool_inputs_are_validated_and_tool_failures_reach_the_model_as_the_envelope() {
    validation_and_failure_envelopes(Wrangler::Pinned).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tool_inputs_are_validated_and_tool_failures_reach_the_model_as_the_envelope_on_latest_wrangler() {
    validation_and_failure_envelopes(Wrangler::Latest).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_panicking_tool_resets_the_instance_and_the_turn_goes_on() {
    panicking_tool(Wrangler::Pinned).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_panicking_tool_resets_the_instance_and_the_turn_goes_on_on_latest_wrangler() {
    panicking_tool(Wrangler::Latest).await;
}

/// `word_count` panics (`PANIC_ON=boom`): workerd resets the Wasm instance; the turn is continued
/// from its journal without that call's result (the model is told it was interrupted), the
/// research run's result still reaches the model, and the client gets the end of its turn.
async fn panicking_tool(wrangler: Wrangler) {
    let worker = Worker::start_example_with(wrangler, &[("PANIC_ON", "boom")]).await;
    let name = unique("panic");
    let path = format!("/agents/planner/{name}");
    let mut client = Client::connect(&worker.ws(&path)).await;
    let request = client.chat("boom topic").await;
    // Nothing reaches the planner until its turn ended: the alarm alone continues it.
    let deadline = std::time::Instant::now() + WAIT * 4;
    while !worker.log_text().contains("\"agent_tool:chat:continued\"") {
        assert!(std::time::Instant::now() < deadline, "the turn was not continued:\n{}", worker.log_text());
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let answer = loop {
        let messages: Vec<Value> =
            reqwest::get(worker.http(&format!("{path}/get-messages"))).await.unwrap().json().await.unwrap();
        if messages.len() == 2 {
            break messages[1].clone();
        }
        assert!(std::time::Instant::now() < deadline, "the turn did not go on:\n{}", worker.log_text());
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    };
    let log = worker.log_text();
    assert!(log.contains("panic"), "the tool panicked:\n{log}");
    let text = answer["parts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] == "text")
        .map(|p| p["text"].as_str().unwrap())
        .collect::<String>();
    assert!(text.starts_with("Done. research: Done. fact_check: "), "{text}");
    assert!(text.contains("word_count: {") && text.contains("interrupted"), "{text}");
    let parts: Vec<&Value> = answer["parts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"].as_str().unwrap().starts_with("tool-"))
        .collect();
    assert!(parts.iter().all(|p| p["state"] == "output-available"), "{answer:#}");
    // The client that sent it: still connected, it was told and offered the stream again; it
    // acknowledges (as the stock client does) and gets the end of its turn.
    let recovering = client.wait_for(WAIT, |f| f["type"] == "cf_agent_chat_recovering").await;
    assert_eq!(recovering["recovering"], true, "{recovering}");
    let offered = client.wait_for(WAIT, |f| f["type"] == "cf_agent_stream_resuming").await;
    assert_eq!(offered["id"], request.as_str());
    client.send_text(&json!({ "type": "cf_agent_stream_resume_ack", "id": request }).to_string()).await;
    let done = client.chat_done(&request).await;
    assert!(done.get("error").is_none(), "{done}");
}

async fn tools_beside_agent_tools_and_nested_children(wrangler: Wrangler) {
    let worker = Worker::start_example_on(wrangler).await;
    let name = unique("planner");
    let mut client = Client::connect(&worker.ws(&format!("/agents/planner/{name}"))).await;
    let request = client.chat("quantum networking basics").await;
    let done = client.chat_done(&request).await;
    assert!(done.get("error").is_none() && done.get("outcome").is_none(), "{done}");
    let chunks = client.chat_chunks(&request);

    // Step one calls both tools; the turn runs them and feeds both results back.
    let first_step_end = chunks.iter().position(|c| c["type"] == "finish-step").unwrap();
    let called: Vec<&str> = chunks[..first_step_end]
        .iter()
        .filter(|c| c["type"] == "tool-input-available")
        .map(|c| c["toolName"].as_str().unwrap())
        .collect();
    assert_eq!(called, ["research", "word_count"], "one model step, an agent tool and an ordinary tool");
    let output = |id: &str| {
        chunks.iter().find(|c| c["type"] == "tool-output-available" && c["toolCallId"] == id).unwrap()["output"].clone()
    };
    assert_eq!(output("call_0_1"), json!(3), "the ordinary tool ran with its typed input");
    let findings = OfflineModel::research_answer("quantum networking basics", 8);
    let research = format!("Done. fact_check: {findings}");
    assert_eq!(output("call_0_0"), json!(research), "the child reported its run, its own child's result inside");
    let answer: String =
        chunks.iter().filter(|c| c["type"] == "text-delta").map(|c| c["delta"].as_str().unwrap()).collect();
    assert_eq!(answer, format!("Done. research: {research}; word_count: 3"));

    // The parent's clients see its child's run, not the grandchild's.
    assert_eq!(started(&client.frames), [("agent-tool:call_0_0".to_owned(), "Researcher".to_owned())]);

    // Drilling into the child shows the grandchild's run on the child's own stream.
    let child = format!("/agents/planner/{name}/sub/researcher/agent-tool%3Acall_0_0");
    let mut drill = Client::connect(&worker.ws(&child)).await;
    let finished = drill.wait_for(WAIT, |f| f["event"]["kind"] == "finished").await;
    assert_eq!(finished["replay"], true);
    assert_eq!(finished["event"]["summary"], json!(findings));
    assert_eq!(started(&drill.frames), [("agent-tool:call_0_0".to_owned(), "FactChecker".to_owned())]);

    // Depth 2: the grandchild's own transcript, through both gates.
    let grandchild = format!("{child}/sub/fact-checker/agent-tool%3Acall_0_0/get-messages");
    let messages: Vec<Value> = reqwest::get(worker.http(&grandchild)).await.unwrap().json().await.unwrap();
    assert_eq!(messages.len(), 2, "{messages:#?}");
    assert_eq!(
        messages[1]["parts"].as_array().unwrap().iter().find(|p| p["type"] == "text").unwrap()["text"],
        json!(findings)
    );
    // A guessed grandchild id is refused at the child's gate and creates nothing.
    let guessed = format!("{child}/sub/fact-checker/no-such-run/get-messages");
    let refused = reqwest::get(worker.http(&guessed)).await.unwrap();
    assert_eq!(refused.status(), 404);
    assert!(refused.json::<Value>().await.unwrap()["error"].as_str().unwrap().contains("no-such-run"));
}

async fn background_run_from_a_post(wrangler: Wrangler) {
    let worker = Worker::start_example_on(wrangler).await;
    let name = unique("posted");
    let http = reqwest::Client::new();
    let runs = worker.http(&format!("/agents/planner/{name}/runs"));
    let resp = http.post(&runs).json(&json!({ "query": "edge computing" })).send().await.unwrap();
    assert_eq!(resp.status(), 202);
    let handle: Value = resp.json().await.unwrap();
    assert_eq!((handle["agentType"].as_str(), handle["status"].as_str()), (Some("Researcher"), Some("running")));
    let run_id = handle["runId"].as_str().unwrap().to_owned();
    assert_eq!(run_id.len(), 36, "a v4 UUID: {run_id}");

    let mut client = Client::connect(&worker.ws(&format!("/agents/planner/{name}"))).await;
    let finished = client.wait_for(WAIT, |f| f["event"]["runId"] == run_id && f["event"]["kind"] == "finished").await;
    let findings = OfflineModel::research_answer("edge computing", 8);
    assert_eq!(finished["event"]["summary"], json!(format!("Done. fact_check: {findings}")));

    // What the route and the defaults refuse.
    let bad = http.post(&runs).body("not json").send().await.unwrap();
    assert_eq!(bad.status(), 400);
    let agent = worker.http(&format!("/agents/planner/{name}"));
    assert_eq!(http.post(&agent).body("{}").send().await.unwrap().status(), 405, "the agent itself answers GET");
    let unknown = http.get(&runs).send().await.unwrap();
    assert_eq!(unknown.status(), 404);
    assert!(unknown.json::<Value>().await.unwrap()["error"].as_str().unwrap().contains("no route /runs"));
    // Nothing the refusals did started a run.
    client.drain(std::time::Duration::from_millis(300)).await;
    assert_eq!(started(&client.frames).len(), 1);
}

async fn validation_and_failure_envelopes(wrangler: Wrangler) {
    let worker = Worker::start_example_on(wrangler).await;
    let mut client = Client::connect(&worker.ws(&format!("/agents/planner/{}", unique("failing")))).await;
    let error_of = |chunks: &[Value], id: &str| {
        chunks
            .iter()
            .find(|c| c["type"] == "tool-output-error" && c["toolCallId"] == id)
            .map(|c| c["errorText"].clone())
    };
    let output_of = |chunks: &[Value], id: &str| {
        chunks
            .iter()
            .find(|c| c["type"] == "tool-output-available" && c["toolCallId"] == id)
            .map(|c| c["output"].clone())
    };

    // "42": too short for `research` (minLength 3), and no words for `word_count`.
    let request = client.chat("42").await;
    client.chat_done(&request).await;
    let chunks = client.chat_chunks(&request);
    let refused = error_of(&chunks, "call_0_0").expect("research refused");
    assert!(refused.as_str().unwrap().starts_with("Invalid input for tool research"), "{refused}");
    let envelope = output_of(&chunks, "call_0_1").expect("word_count answered");
    assert_eq!(
        envelope,
        json!({"ok": false, "status": "error", "error": "no words in \"42\"", "retryable": false}),
        "an ordinary tool's Err is the agent tools' failure envelope"
    );
    assert!(started(&client.frames).is_empty(), "an invalid input starts no child");

    // Over `word_count`'s maxLength 64: refused by its schema before `execute`.
    let long = "a very long message that goes on and on well past the sixty-four characters";
    let mut client = Client::connect(&worker.ws(&format!("/agents/planner/{}", unique("long")))).await;
    let request = client.chat(long).await;
    client.chat_done(&request).await;
    let chunks = client.chat_chunks(&request);
    let refused = error_of(&chunks, "call_0_1").expect("word_count refused");
    assert!(refused.as_str().unwrap().starts_with("Invalid input for tool word_count"), "{refused}");
    assert!(output_of(&chunks, "call_0_0").is_some(), "the agent tool beside it still ran");
}
