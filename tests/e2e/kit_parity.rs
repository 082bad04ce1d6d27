//! The test kit tells the truth: three scenarios run the same steps on the demo's agents twice,
//! in `agent_tools::testing` (natively, virtual time) and against `wrangler dev` (workerd), and
//! compare what clients see — per run, its frames' kinds, sequences and text, and the final
//! state of every run. What depends on the wall clock (message ids, timestamps) is left out of
//! the comparison; nothing else is.

use std::time::Duration;

use agent_tools::demo::{Assistant, Researcher, Summarizer};
use agent_tools::testing::World;
use serde_json::{json, Value};

use crate::harness::{unique, Client, Worker, WAIT};

const VARS: [(&str, &str); 2] = [("OFFLINE_WORDS", "8"), ("OFFLINE_DELAY_MS", "5")];

fn kit() -> World {
    let mut world = World::new().route::<Assistant>().agent::<Researcher>().agent::<Summarizer>();
    for (name, value) in VARS {
        world = world.var(name, value);
    }
    world
}

/// Runs a kit scenario on a thread of its own (a world is single-threaded).
async fn in_kit(scenario: impl FnOnce() -> Value + Send + 'static) -> Value {
    tokio::task::spawn_blocking(scenario).await.expect("the kit scenario ran")
}

/// Per run, what a client saw of it: each frame's sequence, kind, chunk type and text (a
/// delta, a summary, an error, a progress phase or a milestone name).
fn frames_by_run(frames: &[Value]) -> Value {
    let mut runs = serde_json::Map::new();
    for frame in frames.iter().filter(|f| f["type"] == "agent-tool-event") {
        let event = &frame["event"];
        let chunk: Value = event["body"].as_str().and_then(|b| serde_json::from_str(b).ok()).unwrap_or(Value::Null);
        let text = match event["kind"].as_str() {
            Some("chunk") => chunk["delta"]
                .as_str()
                .or(chunk["data"]["phase"].as_str())
                .or(chunk["data"]["name"].as_str())
                .unwrap_or_default(),
            _ => event["summary"].as_str().or(event["error"].as_str()).unwrap_or_default(),
        };
        let entry = json!([frame["sequence"], event["kind"], chunk["type"], text]);
        let run = event["runId"].as_str().unwrap_or_default().to_owned();
        runs.entry(run).or_insert_with(|| json!([])).as_array_mut().expect("an array").push(entry);
    }
    Value::Object(runs)
}

/// The final state of each run as the demo's `runs` RPC gives it, without its clock readings.
fn final_states(runs: &Value) -> Value {
    let runs = runs.as_array().cloned().unwrap_or_default();
    let states: Vec<Value> = runs
        .iter()
        .map(|r| {
            let milestones: Vec<&Value> =
                r["milestones"].as_array().map(|m| m.iter().map(|m| &m["name"]).collect()).unwrap_or_default();
            json!({ "runId": r["runId"], "agentType": r["agentType"], "status": r["status"], "summary": r["summary"],
                    "error": r["error"], "parentToolCallId": r["parentToolCallId"], "milestones": milestones,
                    "progress": r["progress"]["fraction"], "chunks": r["chunks"], "reruns": r["reruns"] })
        })
        .collect();
    Value::Array(states)
}

fn chat_text(chunks: &[Value]) -> String {
    chunks.iter().filter(|c| c["type"] == "text-delta").filter_map(|c| c["delta"].as_str()).collect()
}

fn response_chunks(frames: &[Value], request: &str) -> Vec<Value> {
    frames
        .iter()
        .filter(|f| f["type"] == "cf_agent_use_chat_response" && f["id"] == request && f["done"] == false)
        .filter_map(|f| serde_json::from_str(f["body"].as_str()?).ok())
        .collect()
}

async fn runs_of(client: &mut Client) -> Value {
    client.call("runs", json!([])).await.expect("runs")
}

/// A chat turn whose model researches two topics at once: the reply, every frame of both runs
/// as the client saw them live, and the runs' final states.
#[tokio::test(flavor = "multi_thread")]
async fn a_chat_that_researches_two_topics_looks_the_same_in_the_kit() {
    let kit = in_kit(|| {
        let world = kit();
        let client = world.connect("/agents/assistant/parity");
        let request = client.send_chat("Research HTTP/3 and gRPC");
        let reply = client.wait_reply(&request);
        let runs = client.call("runs", vec![]).expect("runs");
        json!({ "reply": reply.text, "frames": frames_by_run(&client.frames()), "runs": final_states(&runs) })
    })
    .await;

    let worker = Worker::start_with(None, &VARS).await;
    let mut client = worker.client(&unique("parity")).await;
    let request = client.chat("Research HTTP/3 and gRPC").await;
    client.chat_done(&request).await;
    let runs = runs_of(&mut client).await;
    let wrangler = json!({
        "reply": chat_text(&response_chunks(&client.frames, &request)),
        "frames": frames_by_run(&client.frames),
        "runs": final_states(&runs),
    });
    assert_eq!(kit, wrangler, "the kit and wrangler dev differ");
    assert_eq!(kit["runs"].as_array().map(Vec::len), Some(2), "the scenario ran: {kit:#}");
}

/// Imperative runs: an awaited `research` call and a detached dispatch whose handler records
/// its outcome; then a client that connects late and gets the replay. Compared: the results,
/// the hooks the demo logged (in order, per run), the replay's frames and the final states.
#[tokio::test(flavor = "multi_thread")]
async fn imperative_runs_hooks_and_a_late_replay_look_the_same_in_the_kit() {
    let dispatch = json!({ "agent": "Summarizer", "input": { "text": "QUIC is a transport." }, "runId": "p1",
                           "detached": { "onFinish": "record" } });
    let research = json!({ "topics": ["QUIC"], "runIds": ["p2"] });
    let (d, r) = (dispatch.clone(), research.clone());
    let kit = in_kit(move || {
        let world = kit();
        let client = world.connect("/agents/assistant/parity");
        client.call("dispatch", vec![d]).expect("a handle");
        let results = client.call("research", vec![r]).expect("results");
        world.settle();
        let hooks = client.call("hooks", vec![]).expect("hooks");
        let late = world.connect("/agents/assistant/parity");
        world.settle();
        let runs = client.call("runs", vec![]).expect("runs");
        json!({ "results": results, "hooks": hooks, "replay": frames_by_run(&late.frames()), "runs": final_states(&runs) })
    })
    .await;

    let worker = Worker::start_with(None, &VARS).await;
    let name = unique("parity");
    let mut client = worker.client(&name).await;
    client.call("dispatch", json!([dispatch])).await.expect("a handle");
    let results = client.call("research", json!([research])).await.expect("results");
    // The detached run's handler has run once its hook shows in the log.
    let deadline = tokio::time::Instant::now() + WAIT;
    let hooks = loop {
        let hooks = client.call("hooks", json!([])).await.expect("hooks");
        let done = hooks.as_array().is_some_and(|h| h.iter().any(|h| h["runId"] == "p1" && h["hook"] == "detached"));
        if done || tokio::time::Instant::now() > deadline {
            break hooks;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut late = worker.client(&name).await;
    late.drain(Duration::from_millis(500)).await;
    let runs = runs_of(&mut client).await;
    let wrangler = json!({ "results": results, "hooks": hooks, "replay": frames_by_run(&late.frames), "runs": final_states(&runs) });
    assert_eq!(kit, wrangler, "the kit and wrangler dev differ");
    assert_eq!(kit["runs"].as_array().map(Vec::len), Some(2), "the scenario ran: {kit:#}");
}

/// Drill-in: after a chat turn, a client drills in to one run's child and sees its own chat
/// (`get-messages`) and identity; a guessed run id is refused the same way.
#[tokio::test(flavor = "multi_thread")]
async fn drilling_in_looks_the_same_in_the_kit() {
    let texts = |messages: &Value| -> Value {
        let messages = messages.as_array().cloned().unwrap_or_default();
        messages.iter().map(|m| json!([m["role"], crate::harness::text_of(m)])).collect()
    };
    let kit = in_kit(move || {
        let world = kit();
        let client = world.connect("/agents/assistant/parity");
        client.chat("Research QUIC");
        let runs = client.call("runs", vec![]).expect("runs");
        let run_id = runs[0]["runId"].as_str().expect("a run id").to_owned();
        let child = world.connect(&format!("/agents/assistant/parity/sub/researcher/{run_id}"));
        world.settle();
        let identity = child.frames().into_iter().find(|f| f["type"] == "cf_agent_identity").expect("identity");
        let messages = world.get(&format!("/agents/assistant/parity/sub/researcher/{run_id}/get-messages"));
        let messages: Value = serde_json::from_slice(messages.body()).expect("JSON");
        let guessed = world.get("/agents/assistant/parity/sub/researcher/guessed/get-messages");
        json!({ "identity": identity, "messages": texts(&messages), "guessed": guessed.status().as_u16() })
    })
    .await;

    let worker = Worker::start_with(None, &VARS).await;
    let name = unique("parity");
    let mut client = worker.client(&name).await;
    let request = client.chat("Research QUIC").await;
    client.chat_done(&request).await;
    let runs = runs_of(&mut client).await;
    let run_id = runs[0]["runId"].as_str().expect("a run id").to_owned();
    let mut child = Client::connect(&worker.ws(&format!("/agents/assistant/{name}/sub/researcher/{run_id}"))).await;
    let identity = child.wait_for(WAIT, |f| f["type"] == "cf_agent_identity").await;
    let url = worker.http(&format!("/agents/assistant/{name}/sub/researcher/{run_id}/get-messages"));
    let messages: Value = reqwest::get(url).await.expect("get-messages").json().await.expect("JSON");
    let guessed = reqwest::get(worker.http(&format!("/agents/assistant/{name}/sub/researcher/guessed/get-messages")))
        .await
        .expect("a refusal");
    let wrangler = json!({ "identity": identity, "messages": texts(&messages), "guessed": guessed.status().as_u16() });
    assert_eq!(kit, wrangler, "the kit and wrangler dev differ");
    assert_eq!(kit["messages"].as_array().map(Vec::len), Some(2), "the scenario ran: {kit:#}");
}
