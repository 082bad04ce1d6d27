//! The demo Worker's agents under the test kit: its chat, drill-in and recovery scenarios, on
//! the built-in offline model, natively (no wrangler, no Node). `tests/e2e/kit_parity.rs` runs
//! three of them both ways and compares.

#![cfg(feature = "demo")]

use std::time::Duration;

use agent_tools::demo::{Assistant, Researcher, Summarizer};
use agent_tools::testing::{Faults, ObjectRef, Simulation, World};
use agent_tools::RunStatus;
use serde_json::{json, Value};

/// The demo Worker, its offline model answering `words` words `delay_ms` apart.
fn demo(words: u32, delay_ms: u32) -> World {
    World::new()
        .route::<Assistant>()
        .agent::<Researcher>()
        .agent::<Summarizer>()
        .var("OFFLINE_WORDS", &words.to_string())
        .var("OFFLINE_DELAY_MS", &delay_ms.to_string())
}

fn runs(client: &agent_tools::testing::Client) -> Vec<Value> {
    client.call("runs", vec![]).expect("runs").as_array().cloned().unwrap_or_default()
}

#[test]
fn the_offline_model_researches_two_topics_in_one_step() {
    let world = demo(8, 5);
    let client = world.connect("/agents/assistant/alice");
    let other = world.connect("/agents/assistant/alice");
    let reply = client.chat("Research HTTP/3 and gRPC");
    assert_eq!(reply.error, None);
    let tools: Vec<&Value> =
        (reply.message["parts"].as_array().expect("parts").iter()).filter(|p| p["type"] == "tool-research").collect();
    assert_eq!(tools.len(), 2, "{:#}", reply.message);
    assert!(tools.iter().all(|t| t["state"] == "output-available"));
    // Both runs completed, each with a milestone, in the registry and in both clients' state.
    let runs = runs(&client);
    assert_eq!(runs.len(), 2);
    for run in &runs {
        assert_eq!(run["status"], "completed", "{run:#}");
        assert_eq!(run["milestones"][0]["name"], "sources-gathered");
        let id = run["runId"].as_str().expect("a run id");
        for state in [client.run(id), other.run(id)] {
            let state = state.expect("the client knows the run");
            assert_eq!((&state["status"], &state["summary"]), (&json!("completed"), &run["summary"]));
        }
    }
    // The other tab got the transcript after the turn.
    assert_eq!(other.messages().len(), 2);
}

#[test]
fn drilling_in_shows_the_childs_own_chat_and_a_guessed_id_is_refused() {
    // parity: 122
    let world = demo(6, 5);
    let client = world.connect("/agents/assistant/bob");
    client.chat("Research QUIC");
    let run_id = runs(&client)[0]["runId"].as_str().expect("a run id").to_owned();
    let child = world.connect(&format!("/agents/assistant/bob/sub/researcher/{run_id}"));
    world.settle();
    let messages = child.messages();
    assert_eq!(messages.len(), 2, "the child's transcript: the run's input and its answer");
    assert_eq!(messages[1]["role"], "assistant");
    let identity = child.frames().into_iter().find(|f| f["type"] == "cf_agent_identity").expect("an identity");
    assert_eq!((&identity["agent"], &identity["name"]), (&json!("researcher"), &json!(run_id)));
    // A run id the parent never dispatched: the socket is accepted and closed with 4404.
    let refused = world.try_connect("/agents/assistant/bob/sub/researcher/guessed").expect_err("refused");
    assert!(refused.to_string().contains("4404"), "{refused}");
}

#[test]
fn a_parent_restart_mid_run_recovers_and_every_client_converges() {
    // parity: 46
    let world = demo(40, 20);
    let client = world.connect("/agents/assistant/carol");
    let handle = client
        .call("dispatch", vec![json!({ "agent": "Researcher", "input": { "query": "TLS" }, "runId": "r1", "detached": { "onFinish": "record" } })])
        .expect("a handle");
    assert_eq!(handle["runId"], "r1");
    world.advance(Duration::from_millis(300));
    world.crash(&ObjectRef::of::<Assistant>("carol"));
    world.settle();
    assert!(client.reconnects() >= 1);
    let run = &runs(&client)[0];
    assert_eq!(run["status"], "completed", "{run:#}");
    assert_eq!(run["summary"].as_str().map(|s| s.split_whitespace().count()), Some(40));
    // The handler ran once, the finish hook once; a client that connects now holds the same.
    let hooks = client.call("hooks", vec![]).expect("hooks");
    let detached: Vec<&Value> = hooks.as_array().expect("rows").iter().filter(|h| h["hook"] == "detached").collect();
    assert_eq!(detached.len(), 1, "{hooks:#}");
    assert_eq!(world.finish_hooks(&ObjectRef::of::<Assistant>("carol"), "r1"), 1);
    let late = world.connect("/agents/assistant/carol");
    world.settle();
    // The same state, but for the time the stock reducer stamps a progress snapshot with: its
    // own clock when the frame arrived (`Date.now()`), so a client that got it later differs.
    let without_clock = |run: Option<Value>| {
        let mut run = run.expect("the client knows the run");
        run["progress"].as_object_mut().map(|p| p.remove("at"));
        run
    };
    assert_eq!(without_clock(late.run("r1")), without_clock(client.run("r1")));
}

#[test]
fn a_child_restart_mid_run_heals_by_running_it_again() {
    // parity: 87
    let world = demo(30, 20);
    let client = world.connect("/agents/assistant/dave");
    let call = client.call(
        "dispatch",
        vec![json!({ "agent": "Researcher", "input": { "query": "DNS" }, "runId": "r1", "detached": true })],
    );
    assert!(call.is_ok());
    world.advance(Duration::from_millis(200));
    let child = world.objects_of::<Researcher>().remove(0);
    world.crash(&child);
    world.settle();
    let run = &runs(&client)[0];
    assert_eq!(run["status"], "completed", "{run:#}");
    assert_eq!(run["reruns"], 1, "{run:#}");
    // The client's state shows one attempt's text, the summary.
    let state = client.run("r1").expect("the run");
    assert_eq!(state["summary"], run["summary"]);
    // The milestone the first attempt reached is not reached again by the re-run: once in the
    // registry, once in the stock reducer's state, live and in a replay, and one `on_progress`.
    let names = |milestones: &Value| -> Vec<String> {
        milestones.as_array().into_iter().flatten().filter_map(|m| m["name"].as_str().map(str::to_owned)).collect()
    };
    assert_eq!(names(&run["milestones"]), ["sources-gathered"], "{run:#}");
    assert_eq!(names(&state["milestones"]), ["sources-gathered"], "{state:#}");
    let late = world.connect("/agents/assistant/dave");
    world.settle();
    assert_eq!(names(&late.run("r1").expect("replayed")["milestones"]), ["sources-gathered"]);
    // The same state, typed: the replayed run, its milestone and the progress it left.
    let typed = late.run_state("r1").expect("replayed");
    assert_eq!((typed.status, typed.summary.as_deref()), (RunStatus::Completed, run["summary"].as_str()));
    let milestones: Vec<(&str, i64)> = typed.milestones.iter().map(|m| (m.name.as_str(), m.sequence)).collect();
    assert_eq!(milestones, [("sources-gathered", 0)]);
    assert!(typed.progress.is_some(), "{typed:?}");
    let hooks = client.call("hooks", vec![]).expect("hooks");
    let reached = hooks
        .as_array()
        .expect("rows")
        .iter()
        .filter(|h| h["hook"] == "milestone" && h["status"] == "sources-gathered");
    assert_eq!(reached.count(), 1, "{hooks:#}");
}

/// Seeded schedules of the demo's chat and a detached run, with faults.
#[test]
fn seeded_schedules_of_the_demo_keep_the_contract() {
    let injected = Simulation::new(|world| {
        world
            .route::<Assistant>()
            .agent::<Researcher>()
            .agent::<Summarizer>()
            .var("OFFLINE_WORDS", "6")
            .var("OFFLINE_DELAY_MS", "10")
    })
    .faults(Faults::chaos())
    .schedules(std::env::var("SCHEDULES").ok().and_then(|n| n.parse().ok()).unwrap_or(200))
    .check(|world| {
        let host = world.host::<Assistant>("sim");
        match host.agent_tool_runs().expect("the runs").iter().find(|r| matches!(r.status, RunStatus::Error | RunStatus::Aborted)) {
            Some(run) => Err(format!("run {} ended {:?}", run.run_id, run.status)),
            None => Ok(()),
        }
    })
    .run(|world| {
        let client = world.connect("/agents/assistant/sim");
        client.send_chat("Research HTTP/3 and gRPC");
        let dispatch = json!({ "agent": "Researcher", "input": { "query": "QUIC" }, "runId": "d1", "detached": { "onFinish": "record" } });
        client.send(&json!({ "type": "rpc", "id": "d", "method": "dispatch", "args": [dispatch] }));
    });
    assert!(injected > 20, "the faults struck ({injected})");
}

/// The demo's RPC methods check every argument, and a run's input against the child's tool
/// schema (the model's own check), before anything starts: each bad call gets an error that
/// says what was wrong, and no run, no row and no child object comes of it.
#[test]
fn rpc_arguments_are_checked_before_anything_starts() {
    // parity: 112
    let world = demo(4, 5);
    let client = world.connect("/agents/assistant/erin");
    let researcher = |extra: Value| {
        let mut arg = json!({ "agent": "Researcher", "input": { "query": "QUIC" } });
        arg.as_object_mut().expect("an object").extend(extra.as_object().expect("an object").clone());
        arg
    };
    let cases = [
        ("research", json!({ "topics": ["ab"] }), "/query"),
        ("research", json!({ "topics": ["QUIC"], "words": -3 }), "words"),
        ("research", json!({ "topics": ["QUIC"], "wrods": 3 }), "unknown field `wrods`"),
        ("research", json!({ "topics": "QUIC" }), "expected a sequence"),
        ("research", json!({ "topics": ["QUIC"], "agent": "Planner" }), "unknown variant `Planner`"),
        ("dispatch", json!({ "agent": "Researcher" }), "missing field `input`"),
        ("dispatch", json!({ "agent": "Researcher", "input": "QUIC" }), "Invalid input for tool research"),
        ("dispatch", researcher(json!({ "detached": "bogus" })), "detached: true or"),
        ("dispatch", researcher(json!({ "detached": { "onFinish": "nope" } })), "unknown variant `nope`"),
        ("dispatch", researcher(json!({ "detached": { "notify": 1 } })), "detached.notify"),
        ("dispatch", researcher(json!({ "eventDelivery": 7 })), "eventDelivery"),
        ("dispatch", researcher(json!({ "eventDelivery": "sometimes" })), "unknown variant `sometimes`"),
        ("dispatch", researcher(json!({ "displayOrder": -1 })), "displayOrder"),
        ("cancel", json!({ "runId": [] }), "cancel expects {runId, reason?}"),
        ("clear", json!({ "status": ["sleeping"] }), "unknown variant `sleeping`"),
    ];
    for (method, arg, says) in cases {
        let error = client.call(method, vec![arg.clone()]).expect_err(&format!("{method}({arg}) is refused"));
        assert!(error.to_string().contains(says), "{method}({arg}): {error:?} should say {says:?}");
    }
    assert!(runs(&client).is_empty(), "no run was started");
    assert!(world.objects_of::<Researcher>().is_empty() && world.objects_of::<Summarizer>().is_empty());
    // The same calls, well formed, run.
    let done = client.call("dispatch", vec![researcher(json!({ "eventDelivery": "terminal" }))]).expect("a run");
    assert_eq!(done["status"], "completed", "{done:#}");
    // Its chunks never reached the parent, but `chunks` reads them from the child.
    let chunks = client.call("chunks", vec![json!({ "runId": done["runId"] })]).expect("chunks");
    let text: String = (chunks.as_array().expect("chunks").iter())
        .filter_map(|c| serde_json::from_str::<Value>(c["body"].as_str()?).ok())
        .filter(|c| c["type"] == "text-delta")
        .filter_map(|c| c["delta"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(text, done["summary"].as_str().expect("a summary"), "{chunks:#}");
    let done = client.call("research", vec![json!({ "topics": ["QUIC"], "words": 3 })]).expect("runs");
    assert_eq!(done[0]["status"], "completed", "{done:#}");
}

/// A sub-agent is addressed by its parent's name, read when the chat starts: a parent whose
/// name cannot be read gets an error, and no nameless sub-agent object (which every parent
/// with an unreadable name would share) is ever reached.
#[test]
fn a_parent_whose_name_cannot_be_read_reaches_no_sub_agent() {
    let world = demo(6, 20);
    let host = world.host::<Assistant>("gus");
    host.sql().batch("DROP TABLE agent_tool_meta").expect("the name's table dropped");
    let tried = host.clone();
    let error = world
        .block_on(async move { tried.sub_agent::<Researcher>("notes").chat("Research QUIC").await.map(|_| ()) })
        .expect_err("no name, no chat");
    assert!(error.to_string().contains("name could not be read"), "{error}");
    let resumed =
        world.block_on(async move { host.sub_agent::<Researcher>("notes").resume("chat:x", -1).await.map(|_| ()) });
    assert!(resumed.is_err());
    assert!(world.objects_of::<Researcher>().is_empty(), "{:?}", world.objects());
}

/// The lower-level call beside agent tools: `host.sub_agent::<C>(name).chat(..)` streams one
/// chat turn of a named sub-agent to the caller, with no registry row and no frames to the
/// parent's clients; each name is one conversation; the caller can resume a turn from a log
/// index, and dropping the stream cancels the turn.
#[test]
fn a_sub_agent_chat_streams_to_the_caller_alone() {
    // parity: 6
    use agent_tools::ChatChunk;
    let world = demo(6, 20);
    let client = world.connect("/agents/assistant/fay");
    let host = world.host::<Assistant>("fay");
    let read = |host: agent_tools::AgentHost<Assistant>, message: &'static str| async move {
        let mut turn = host.sub_agent::<Researcher>("notes").chat(message).await.expect("a turn");
        let mut chunks: Vec<ChatChunk> = Vec::new();
        while let Some(chunk) = turn.next().await {
            chunks.push(chunk.expect("a chunk"));
        }
        (turn.turn_id().to_owned(), chunks, turn.outcome().cloned().expect("an outcome"))
    };
    let text = |chunks: &[ChatChunk]| -> String {
        chunks.iter().filter(|c| c.chunk["type"] == "text-delta").filter_map(|c| c.chunk["delta"].as_str()).collect()
    };
    let (turn, chunks, outcome) = world.block_on(read(host.clone(), "Research QUIC"));
    assert_eq!(outcome.status(), RunStatus::Completed, "{outcome:?}");
    assert_eq!(Some(text(&chunks).as_str()), outcome.summary(), "the caller got the whole answer");
    let logged: Vec<ChatChunk> = chunks.iter().filter(|c| c.index.is_some()).cloned().collect();
    assert!(logged.windows(2).all(|w| w[1].index == w[0].index.map(|i| i + 1)), "in log order");
    assert!(runs(&client).is_empty(), "no registry row");
    world.settle();
    assert!(!client.frames().iter().any(|f| f["type"] == "agent-tool-event"), "nothing reached the parent's clients");
    // The same name again: one conversation, in the child's own transcript.
    let (_, _, second) = world.block_on(read(host.clone(), "Research DNS"));
    assert_eq!(second.status(), RunStatus::Completed);
    let child = world.host::<Researcher>("sub-agent:Assistant/fay/notes");
    let roles: Vec<Value> = child.messages().iter().map(|m| m["role"].clone()).collect();
    assert_eq!(roles, [json!("user"), json!("assistant"), json!("user"), json!("assistant")]);
    // Replay is the caller's: the turn's chunks after a log index, from the child.
    let from = logged[2].index.expect("a logged chunk");
    let resumed = world.block_on({
        let host = host.clone();
        async move {
            let mut stream = host.sub_agent::<Researcher>("notes").resume(&turn, from).await.expect("resumed");
            let mut out = Vec::new();
            while let Some(chunk) = stream.next().await {
                out.push(chunk.expect("a chunk"));
            }
            out
        }
    });
    assert_eq!(resumed, logged[3..].to_vec(), "what the log keeps after it");
    // A turn dropped after its first chunk is cancelled in the child.
    let dropped = world.block_on({
        let host = host.clone();
        async move {
            let mut turn = host.sub_agent::<Researcher>("notes").chat("Research TLS").await.expect("a turn");
            turn.next().await;
            turn.turn_id().to_owned()
        }
    });
    world.settle();
    let ended = world.block_on(async move {
        let mut stream = host.sub_agent::<Researcher>("notes").resume(&dropped, -1).await.expect("resumed");
        while stream.next().await.is_some() {}
        stream.outcome().cloned()
    });
    assert_eq!(ended.map(|o| o.status()), Some(RunStatus::Aborted));
}
