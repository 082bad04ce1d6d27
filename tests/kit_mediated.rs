//! The seed's parent-mediated approval, whole: a detached child reaches `needs-approval` (a
//! milestone in `react` mode) and waits (`Turn::wait_for`); the parent's turn asks its person
//! with a tool that needs approval; the answer, either way, reaches the running child as a
//! typed message, and the child goes on. Across a restart of the waiting child, a child that
//! cannot be reached when the answer comes, and seeded schedules of crashes.

use std::cell::Cell;
use std::time::Duration;

use agent_tools::model::{ModelMessage, ModelRequest};
use agent_tools::prelude::*;
use agent_tools::testing::{Faults, ObjectRef, ScriptedModel, Simulation, Step, World};
use agent_tools::Refused;
use serde_json::json;

thread_local! {
    /// How many times the author's run began (a restart runs it again).
    static BEGUN: Cell<usize> = const { Cell::new(0) };
}

#[derive(serde::Deserialize)]
struct Decision {
    approved: bool,
    #[serde(default)]
    reason: String,
}

/// The child: drafts, asks its parent, waits for the answer, and publishes or not.
#[derive(Default)]
pub struct Author;
impl Agent for Author {
    async fn run(&self, turn: &Turn<Self>) -> Result<TurnOutput, Error> {
        BEGUN.with(|b| b.set(b.get() + 1));
        turn.pause(std::time::Duration::from_millis(50)).await;
        turn.report_progress(Progress::milestone("needs-approval").data(json!({ "question": "Publish the draft?" })));
        let decision: Decision = turn.wait_for("approval").await?;
        Ok(TurnOutput::new(match decision.approved {
            true => "published".to_owned(),
            false => format!("kept as a draft ({})", decision.reason),
        }))
    }
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct ReviewInput {
    run_id: String,
}

/// The parent's tool: asks its person; the answer goes to the waiting child either way.
struct Review;
impl Tool<Lead> for Review {
    type Input = ReviewInput;
    type Output = String;
    fn name(&self) -> &str {
        "review"
    }
    fn description(&self) -> &str {
        "Asks the user whether a background draft may be published."
    }
    fn needs_approval(&self, _input: &ReviewInput) -> bool {
        true
    }
    async fn execute(&self, ctx: &ToolContext<'_, Lead>, input: ReviewInput) -> Result<String, Error> {
        let decision = json!({ "approved": true });
        ctx.host().send_to_agent_tool_run(&input.run_id, "approval", &decision).await?;
        Ok(format!("{} may publish", input.run_id))
    }
    async fn on_denied(&self, ctx: &ToolContext<'_, Lead>, input: ReviewInput, reason: &str) {
        let decision = json!({ "approved": false, "reason": reason });
        if let Err(e) = ctx.host().send_to_agent_tool_run(&input.run_id, "approval", &decision).await {
            ctx.host().log_error(&format!("telling {} failed: {e}", input.run_id));
        }
    }
}

#[derive(Default)]
pub struct Lead;
impl Agent for Lead {
    fn tools(&self) -> Tools<Self> {
        Tools::new().tool(Review)
    }
    fn format_detached_milestone(&self, run: &RunInfo, milestone: &Milestone) -> String {
        format!("review {} ({})", run.run_id, milestone.name)
    }
}

agent_tools::durable_object!(Lead, unchecked);
agent_tools::durable_object!(Author, unchecked);

/// The lead's model: "review <run> …" calls `review`; a result is acknowledged; a notice noted.
fn lead_model(request: &ModelRequest) -> Step {
    match request.messages.last() {
        Some(ModelMessage::User(text)) if text.starts_with("review ") => {
            let run = text["review ".len()..].split_whitespace().next().unwrap_or_default();
            Step::new().tool_call("review", json!({ "run_id": run }))
        }
        Some(ModelMessage::Tool { output, .. }) => Step::new().text(&format!("Reviewed: {output}")),
        _ => Step::new().text("Noted."),
    }
}

fn world() -> World {
    BEGUN.with(|b| b.set(0));
    World::new().route::<Lead>().agent::<Author>().model::<Lead>(ScriptedModel::new().otherwise(lead_model))
}

fn dispatch(world: &World) {
    let host = world.host::<Lead>("l");
    let started = world.block_on(async move {
        let detached = DetachedOptions::default().on_milestones(OnMilestones::react(["needs-approval"])).notify();
        host.run_agent_tool_detached::<Author>(RunOptions::new(json!("a draft")).run_id("w1"), detached).await
    });
    assert!(started.is_ok(), "{started:?}");
}

fn run_summary(world: &World) -> (RunStatus, Option<String>) {
    let run = world
        .host::<Lead>("l")
        .agent_tool_runs()
        .expect("the runs")
        .into_iter()
        .find(|r| r.run_id == "w1")
        .expect("the run");
    let result = world.host::<Lead>("l").inspect_agent_tool_run("w1").expect("the registry").and_then(|i| i.result);
    (run.status, result.and_then(|r| r.summary))
}

fn texts(world: &World) -> Vec<String> {
    let messages = world.host::<Lead>("l").messages();
    messages
        .iter()
        .map(|m| {
            let parts = m["parts"].as_array().cloned().unwrap_or_default();
            parts.iter().filter(|p| p["type"] == "text").filter_map(|p| p["text"].as_str()).collect::<String>()
        })
        .collect()
}

/// A client on the lead, once the waiting run's question shows in its chat.
fn asked(world: &World) -> agent_tools::testing::Client {
    let client = world.connect("/agents/lead/l");
    dispatch(world);
    world.run_until(|| !client.approval_requests().is_empty());
    client
}

#[test]
fn the_person_approves_and_the_waiting_child_publishes() {
    // parity: 4
    let world = world();
    let client = asked(&world);
    let (call, _) = client.approval_requests().remove(0);
    assert_eq!(run_summary(&world).0, RunStatus::Running, "the child waits");
    client.answer_approval(&call, true);
    world.settle();
    assert_eq!(run_summary(&world), (RunStatus::Completed, Some("published".into())));
    let texts = texts(&world);
    assert_eq!(texts.iter().filter(|t| t.starts_with("review w1")).count(), 1, "{texts:#?}");
    assert!(texts.iter().any(|t| t == "Reviewed: \"w1 may publish\""), "{texts:#?}");
    assert_eq!(BEGUN.with(Cell::get), 1);
}

#[test]
fn the_person_denies_and_the_child_is_told_why() {
    let world = world();
    let client = asked(&world);
    let (call, _) = client.approval_requests().remove(0);
    client.send(&json!({ "type": "cf_agent_tool_approval", "toolCallId": call, "approved": false,
                         "reason": "not this week", "autoContinue": true }));
    world.settle();
    assert_eq!(run_summary(&world), (RunStatus::Completed, Some("kept as a draft (not this week)".into())));
}

#[test]
fn a_child_restarted_while_it_waits_asks_once_and_gets_the_answer() {
    let world = world();
    let client = asked(&world);
    world.crash(&ObjectRef { binding: "Author".into(), name: "Lead/l/w1".into() });
    world.advance(Duration::from_secs(30));
    assert!(BEGUN.with(Cell::get) >= 2, "the run ran again after the restart");
    let (call, _) = client.approval_requests().remove(0);
    client.answer_approval(&call, true);
    world.settle();
    assert_eq!(run_summary(&world), (RunStatus::Completed, Some("published".into())));
    let asked = texts(&world).iter().filter(|t| t.starts_with("review w1")).count();
    assert_eq!(asked, 1, "the milestone asked the parent once");
}

#[test]
fn an_answer_the_child_cannot_take_at_once_is_delivered_later() {
    let world = world();
    let client = asked(&world);
    let (call, _) = client.approval_requests().remove(0);
    // The next calls to the child are lost on the way (its tail included, which heals too).
    world.drop_hops_to("Author", 3);
    client.answer_approval(&call, true);
    world.settle();
    assert_eq!(run_summary(&world), (RunStatus::Completed, Some("published".into())));
    assert!(world.logs().iter().any(|l| l.text.contains("sending \"approval\" to w1 failed (tried again)")));
}

#[test]
fn a_message_for_a_run_that_ended_or_never_was_is_refused() {
    let world = world();
    let host = world.host::<Lead>("l");
    let unknown = world.block_on(async move { host.send_to_agent_tool_run("nope", "approval", &json!(1)).await });
    assert!(matches!(unknown, Err(Error::NotFound(_))), "{unknown:?}");
    let client = asked(&world);
    let (call, _) = client.approval_requests().remove(0);
    client.answer_approval(&call, true);
    world.settle();
    let host = world.host::<Lead>("l");
    let late = world.block_on(async move { host.send_to_agent_tool_run("w1", "approval", &json!(2)).await });
    assert!(matches!(&late, Err(Error::Refused(Refused::Ended { status: RunStatus::Completed, .. }))), "{late:?}");
    assert!(late.unwrap_err().to_string().contains("already ended (completed)"));
}

#[test]
fn seeded_schedules_with_crashes_end_with_the_childs_answer() {
    let faults = Faults::none().crash(0.02).hibernate(0.01).drop_client(0.01).until(Duration::from_secs(4));
    let injected = Simulation::new(|w| {
        BEGUN.with(|b| b.set(0));
        w.route::<Lead>().agent::<Author>().model::<Lead>(ScriptedModel::new().otherwise(lead_model))
    })
    .faults(faults)
    .schedules(60)
    .check(|world| {
        let (status, summary) = run_summary(world);
        if status != RunStatus::Completed || summary.as_deref() != Some("published") {
            let run = world.host::<Lead>("l").inspect_agent_tool_run("w1").expect("the registry");
            return Err(format!("the run ended {status:?} with {summary:?}: {run:?}"));
        }
        let asked = texts(world).iter().filter(|t| t.starts_with("review w1")).count();
        if asked != 1 {
            return Err(format!("the parent was asked {asked} times"));
        }
        Ok(())
    })
    .run(|world| {
        let mut client = world.connect("/agents/lead/l");
        dispatch(world);
        let ended = |world: &World| !matches!(run_summary(world).0, RunStatus::Starting | RunStatus::Running);
        // The person answers whenever the question shows (again if a crash lost the answer), and
        // reloads the page when it shows nothing.
        for _ in 0..8 {
            world.run_until(|| !client.approval_requests().is_empty() || ended(world));
            if ended(world) {
                break;
            }
            match client.approval_requests().first().cloned() {
                Some((call, _)) => {
                    client.answer_approval(&call, true);
                    world.run_until(|| client.approval_requests().is_empty());
                }
                None => client = world.connect("/agents/lead/l"),
            }
        }
    });
    assert!(injected > 0, "the schedules injected faults");
}
