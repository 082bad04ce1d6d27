//! The example Worker's agents under `cargo test`, hosted natively by `agent_tools::testing`:
//! the same code `wrangler dev` runs, on a virtual clock, with crashes on demand.

use std::time::Duration;

use agent_tools::testing::{Faults, ObjectRef, Simulation, World};
use agent_tools::RunStatus;
use hello_agents::{FactChecker, Planner, Researcher};
use serde_json::json;

/// The Worker: `Planner` routed, its child and grandchild classes hosted.
fn worker() -> World {
    World::new().route::<Planner>().agent::<Researcher>().agent::<FactChecker>()
}

#[test]
fn one_step_calls_the_agent_tool_and_the_ordinary_tool() {
    // parity: 7
    let world = worker();
    let client = world.connect("/agents/planner/alice");
    let reply = client.chat("HTTP/3");
    assert_eq!(reply.error, None);
    // The planner's model saw both results: the researcher's summary and the word count.
    assert!(reply.text.starts_with("Done. research: Done. fact_check: "), "{}", reply.text);
    assert!(reply.text.ends_with("; word_count: 1"), "{}", reply.text);
    // The stock client's state: one research run, completed, bound to its tool call.
    let runs = client.run_states();
    assert_eq!(runs.len(), 1);
    let run = &runs[0];
    assert_eq!((run.agent_type.as_str(), run.status), ("Researcher", RunStatus::Completed));
    assert_eq!(
        run.summary.as_deref(),
        reply.text.strip_prefix("Done. research: ").and_then(|t| t.split("; word_count").next())
    );
    assert!(run.parent_tool_call_id.is_some(), "bound to its tool call");
    assert_eq!(client.runs()["runsByToolCallId"].as_object().map(|m| m.len()), Some(1));
}

#[test]
fn the_researcher_dispatches_its_own_child() {
    let world = worker();
    let client = world.connect("/agents/planner/alice");
    client.chat("QUIC");
    // One researcher object (one per run), and it ran a fact check of its own.
    let researchers = world.objects_of::<Researcher>();
    assert_eq!(researchers.len(), 1);
    assert!(researchers[0].name.starts_with("Planner/alice/"), "{}", researchers[0].name);
    let researcher = world.host::<Researcher>(&researchers[0].name);
    let checks = researcher.agent_tool_runs().expect("the runs");
    assert_eq!(checks.len(), 1);
    assert_eq!((checks[0].agent_type.as_str(), checks[0].status), ("FactChecker", RunStatus::Completed));
    assert_eq!(world.objects_of::<FactChecker>().len(), 1);
    // Drilling in to the researcher's run shows its own run of the fact checker.
    let run_id = world.host::<Planner>("alice").agent_tool_runs().expect("the runs")[0].run_id.clone();
    let drilled = world.connect(&format!("/agents/planner/alice/sub/researcher/{run_id}"));
    world.settle();
    let nested = drilled.runs();
    let nested = nested["runsById"].as_object().expect("runs");
    assert_eq!(nested.len(), 1);
    assert_eq!(
        nested.values().next().map(|r| (&r["agentType"], &r["status"])),
        Some((&json!("FactChecker"), &json!("completed")))
    );
}

#[test]
fn a_post_starts_a_background_run() {
    // parity: 35
    let world = worker();
    let accepted = world.post("/agents/planner/bob/runs", &json!({ "query": "gRPC" }));
    assert_eq!(accepted.status(), 202);
    let handle: serde_json::Value = serde_json::from_slice(accepted.body()).expect("a JSON handle");
    let run_id = handle["runId"].as_str().expect("a run id").to_owned();
    world.settle();
    let planner = world.host::<Planner>("bob");
    let runs = planner.agent_tool_runs().expect("the runs");
    assert_eq!(runs.len(), 1);
    assert_eq!((runs[0].run_id.as_str(), runs[0].status), (run_id.as_str(), RunStatus::Completed));
    assert_eq!(world.finish_hooks(&ObjectRef::of::<Planner>("bob"), &run_id), 1);
    // A body that is not `{"query": string}` is refused, and nothing starts.
    let refused = world.post("/agents/planner/bob/runs", &json!({ "topic": 3 }));
    assert_eq!(refused.status(), 400);
    world.settle();
    assert_eq!(planner.agent_tool_runs().expect("the runs").len(), 1);
}

#[test]
fn a_child_that_crashes_mid_run_is_run_again_and_the_chat_gets_its_answer() {
    let world = worker();
    let client = world.connect("/agents/planner/carol");
    let request = client.send_chat("HTTP/2");
    // Let the grandchild get going (its offline model streams a word every 20 ms), then crash
    // the researcher between its turn's start and its end.
    assert!(world.run_until(|| !world.objects_of::<FactChecker>().is_empty()));
    world.advance(Duration::from_millis(30));
    let researcher = world.objects_of::<Researcher>().remove(0);
    world.crash(&researcher);
    let reply = client.wait_reply(&request);
    assert_eq!(reply.error, None, "{reply:?}");
    assert!(reply.text.starts_with("Done. research: Done. fact_check: "), "{}", reply.text);
    let planner = world.host::<Planner>("carol");
    let run = &planner.agent_tool_runs().expect("the runs")[0];
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(world.finish_hooks(&ObjectRef::of::<Planner>("carol"), &run.run_id), 1);
    // The researcher healed by running its turn again.
    let logs = world.logs();
    assert!(logs.iter().any(|l| l.text.contains("rerun")), "no rerun in {logs:#?}");
}

#[test]
fn a_parent_that_crashes_mid_run_recovers_the_run() {
    // parity: 130
    let world = worker();
    let client = world.connect("/agents/planner/dave");
    client.send_chat("TLS");
    assert!(world.run_until(|| !world.objects_of::<FactChecker>().is_empty()));
    world.crash(&ObjectRef::of::<Planner>("dave"));
    world.settle();
    // The client reconnected by itself and holds the run, completed, as the registry does.
    assert!(client.reconnects() >= 1);
    let planner = world.host::<Planner>("dave");
    let runs = planner.agent_tool_runs().expect("the runs");
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].status, RunStatus::Completed);
    assert_eq!(client.run(&runs[0].run_id).map(|r| r["status"].clone()), Some(json!("completed")));
    assert_eq!(world.finish_hooks(&ObjectRef::of::<Planner>("dave"), &runs[0].run_id), 1);
}

/// `SCHEDULES` seeded schedules (default 1 000): chats and background runs under crashes,
/// hibernations, dropped clients, stalls and slow hops; the library's invariants after every
/// step and at the end, and this Worker's own: no run ends in `error` or `aborted` (a fault can
/// leave one `interrupted`, retryable, e.g. a child reset while it accepted the run), and
/// when no fault struck all three runs completed (a crash can lose a chat request in flight,
/// as it would in a Worker).
#[test]
fn seeded_schedules_with_faults_keep_the_contract() {
    let schedules = std::env::var("SCHEDULES").ok().and_then(|n| n.parse().ok()).unwrap_or(1_000);
    let started = std::time::Instant::now();
    let injected = Simulation::new(|world| world.route::<Planner>().agent::<Researcher>().agent::<FactChecker>())
        .faults(Faults::chaos())
        .schedules(schedules)
        .check(|world| {
            let runs = world.host::<Planner>("sim").agent_tool_runs().expect("the runs");
            let faults = world.injected_faults() > 0;
            let allowed = |s: RunStatus| s == RunStatus::Completed || (faults && s == RunStatus::Interrupted);
            match runs.iter().find(|r| !allowed(r.status)) {
                Some(run) => Err(format!("run {} ended {:?}: {run:?}", run.run_id, run.status)),
                None if runs.len() == 3 || faults => Ok(()),
                None => Err(format!("{} runs, not 3", runs.len())),
            }
        })
        .run(|world| {
            let client = world.connect("/agents/planner/sim");
            let first = client.send_chat("HTTP/3");
            world.post("/agents/planner/sim/runs", &json!({ "query": "QUIC" }));
            // The next message once the first answer is in (or after a minute: a crash can lose
            // a turn), as a user would send it.
            let patience = world.now() + Duration::from_secs(60);
            world.run_until(|| client.reply(&first).is_some_and(|r| r.done) || world.now() > patience);
            client.send_chat("TLS");
        });
    eprintln!("{schedules} schedules in {:.1} s, {injected} faults injected", started.elapsed().as_secs_f64());
    assert!(injected > schedules as usize / 10, "the faults struck ({injected})");
}
