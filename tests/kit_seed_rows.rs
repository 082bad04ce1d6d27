//! Rows of `docs/parity.md` (the TypeScript SDK's "Agent Tools" page, behaviour by behaviour)
//! asserted under the test kit: each test's doc comment names its row and the behaviour it
//! checks. The agents are small ones of this file's own (two parents and two children), hosted
//! natively by `agent_tools::testing` over real SQLite on a virtual clock (see
//! `docs/testing.md`), each class on a scripted model.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use agent_tools::model::ModelMessage;
use agent_tools::prelude::*;
use agent_tools::testing::{Client, ObjectRef, ScriptedModel, Step, World};
use agent_tools::{DetachedHandle, EventDelivery, HandlerTag, Milestone, OnMilestones, RunInfo};
use serde_json::{json, Value};

// ----- the agents ---------------------------------------------------------------------------

/// The `checkpoint` tool's input.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Note {
    note: String,
}

/// An ordinary tool that reports a milestone named `checkpoint`: the same code serves a
/// parent's own chat turn (no run to report to) and a child's run.
struct Checkpoint;

impl<A: Agent> Tool<A> for Checkpoint {
    type Input = Note;
    type Output = String;
    fn name(&self) -> &str {
        "checkpoint"
    }
    fn description(&self) -> &str {
        "Marks a checkpoint of the work."
    }
    async fn execute(&self, ctx: &ToolContext<'_, A>, input: Note) -> Result<String, Error> {
        ctx.report_progress(Progress::milestone("checkpoint").data(json!({ "note": input.note })));
        Ok(format!("noted: {}", input.note))
    }
}

/// A parent: its model may dispatch writers (`write`) and call `checkpoint`; its detached
/// handler keeps every outcome it is handed. Its notices have the default wording.
#[derive(Default)]
pub struct Desk {
    /// `(handler tag, run id, result)` of each `on_detached_finish` call.
    delivered: RefCell<Vec<(Value, String, RunResult)>>,
}

impl Agent for Desk {
    fn tools(&self) -> Tools<Self> {
        Tools::new().agent(AgentTool::of::<Writer>("write", "Write about a topic.")).tool(Checkpoint)
    }

    async fn on_detached_finish(
        &self,
        _host: &AgentHost<Self>,
        handler: &HandlerTag,
        run: &RunInfo,
        result: &RunResult,
    ) -> Result<(), Error> {
        self.delivered.borrow_mut().push((handler.as_json().clone(), run.run_id.clone(), result.clone()));
        Ok(())
    }
}

/// A parent whose notices are all worded `""` (suppressed); it counts how often it was asked.
#[derive(Default)]
pub struct QuietDesk {
    completions: Cell<usize>,
    milestones: Cell<usize>,
}

impl Agent for QuietDesk {
    fn format_detached_completion(&self, _run: &RunInfo, _result: &RunResult) -> String {
        self.completions.set(self.completions.get() + 1);
        String::new()
    }

    fn format_detached_milestone(&self, _run: &RunInfo, _milestone: &Milestone) -> String {
        self.milestones.set(self.milestones.get() + 1);
        String::new()
    }
}

/// A child that reports the milestone `outlined` as its run begins, then answers as a chat
/// turn (with the `checkpoint` tool). Its first message is the default one.
#[derive(Default)]
pub struct Writer;

impl Agent for Writer {
    fn tools(&self) -> Tools<Self> {
        Tools::new().tool(Checkpoint)
    }

    async fn run(&self, turn: &Turn<Self>) -> Result<TurnOutput, Error> {
        turn.report_progress(Progress::milestone("outlined"));
        turn.chat().await
    }
}

/// A child that builds its run's first message itself, as the seed's `Summarizer` does.
#[derive(Default)]
pub struct Summarizer;

impl Agent for Summarizer {
    fn format_agent_tool_input(&self, input: &Value, run_id: &str) -> Value {
        let text = input["text"].as_str().unwrap_or_default();
        json!({
            "id": format!("agent-tool-{run_id}-input"),
            "role": "user",
            "parts": [{ "type": "text", "text": format!("Summarize:\n\n{text}") }],
        })
    }
}

/// A parent whose notices have its own wording: a run's completion and each milestone it is
/// told of.
#[derive(Default)]
pub struct Herald;

impl Agent for Herald {
    fn format_detached_completion(&self, run: &RunInfo, result: &RunResult) -> String {
        format!("{} finished {}: {}", run.agent_type, run.run_id, result.summary.as_deref().unwrap_or("-"))
    }

    fn format_detached_milestone(&self, run: &RunInfo, milestone: &Milestone) -> String {
        format!("{} passed {}", run.run_id, milestone.name)
    }
}

/// A parent that meters: it keeps every progress signal that passed through it and the kind of
/// every structured event it was told of.
#[derive(Default)]
pub struct Meter {
    /// `(run id, milestone or fraction, data)` of each `on_progress` call.
    progress: RefCell<Vec<(String, String, Option<Value>)>>,
    /// The `type` of each `on_observability` event.
    observed: RefCell<Vec<String>>,
}

impl Agent for Meter {
    async fn on_progress(&self, _host: &AgentHost<Self>, run: &RunInfo, progress: &ProgressSnapshot) {
        let what = progress.milestone.clone().unwrap_or_else(|| format!("{:?}", progress.fraction));
        self.progress.borrow_mut().push((run.run_id.clone(), what, progress.data.clone()));
    }

    fn on_observability(&self, event: &agent_tools::observability::ObservabilityEvent) {
        let kind = serde_json::to_value(event.kind).expect("JSON");
        self.observed.borrow_mut().push(kind.as_str().unwrap_or_default().to_owned());
    }
}

/// A child whose run reports progress with live-only data, then with data it persists, a
/// second apart, then ends.
#[derive(Default)]
pub struct Gauge;

impl Agent for Gauge {
    async fn run(&self, turn: &Turn<Self>) -> Result<TurnOutput, Error> {
        turn.report_progress(Progress::fraction(0.25).data(json!({ "draft": "live only" })));
        turn.pause(std::time::Duration::from_secs(1)).await;
        turn.report_progress(Progress::fraction(0.5).data(json!({ "kept": true })).persist());
        turn.pause(std::time::Duration::from_secs(1)).await;
        Ok(TurnOutput::new("measured"))
    }
}

/// A parent whose drill-in gate keeps the runs it calls private (`private-…`) from every client,
/// and otherwise lets in the runs it has, as the default gate does.
#[derive(Default)]
pub struct Vault;

impl Agent for Vault {
    async fn on_before_sub_agent(
        &self,
        host: &AgentHost<Self>,
        _request: &HttpRequest,
        child: &agent_tools::SubAgent,
    ) -> Option<HttpResponse> {
        if child.name.starts_with("private-") || !host.has_agent_tool_run(&child.class, &child.name).unwrap_or(false) {
            return Some(agent_tools::json_error(404, "no such report"));
        }
        None
    }
}

/// A parent that gives up on a re-attached child after 3 s without a chunk.
#[derive(Default)]
pub struct Impatient;

impl Agent for Impatient {
    fn tools(&self) -> Tools<Self> {
        Tools::new().agent(AgentTool::of::<Writer>("write", "Write about a topic."))
    }

    fn agent_tool_options(&self, _env: &Env) -> AgentToolOptions {
        AgentToolOptions::default().reattach_no_progress_timeout(std::time::Duration::from_secs(3))
    }
}

/// A child whose summary is its own: the run id and the answer's first words.
#[derive(Default)]
pub struct Briefer;

impl Agent for Briefer {
    fn agent_tool_summary(&self, run_id: &str, text: &str, _output: Option<&Value>) -> String {
        let first: Vec<&str> = text.split_whitespace().take(3).collect();
        format!("[{run_id}] {}…", first.join(" "))
    }
}

/// A parent whose `POST …/watch` starts an awaited `Writer` run `t1` with `terminal` delivery in
/// the background (its clients get the run's events but not its chunks).
#[derive(Default)]
pub struct Relay;

impl Agent for Relay {
    async fn on_request(&self, host: &AgentHost<Self>, request: HttpRequest) -> HttpResponse {
        if !request.uri().path().ends_with("/watch") {
            return host.default_response(&request);
        }
        let host = host.clone();
        host.clone().spawn(async move {
            let options =
                RunOptions::new(json!("Write about QUIC")).run_id("t1").event_delivery(EventDelivery::Terminal);
            host.run_agent_tool::<Writer>(options).await;
        });
        agent_tools::json_response(202, &json!({ "runId": "t1" }))
    }
}

/// A child whose recovery may stream at most 40 chunks (`max_recovery_work`): a turn a restart
/// cut short that then streams on and on is a runaway.
#[derive(Default)]
pub struct Rambler;

impl Agent for Rambler {
    fn agent_tool_options(&self, _env: &Env) -> AgentToolOptions {
        AgentToolOptions::default().max_recovery_work(Some(40))
    }
}

/// A child whose structured output is what its own stored transcript holds when the output is
/// read: the last message's id and text, and how many messages there are.
#[derive(Default)]
pub struct Archivist;

impl Agent for Archivist {
    fn agent_tool_output(&self, turn: &Turn<Self>, message: &Value) -> Option<Value> {
        let stored = turn.host().messages();
        let last = stored.last()?;
        Some(json!({
            "lastId": last["id"],
            "lastText": text_of(last),
            "handedId": message["id"],
            "messages": stored.len(),
        }))
    }
}

agent_tools::durable_object!(Desk, unchecked);
agent_tools::durable_object!(Archivist, unchecked);
agent_tools::durable_object!(Rambler, unchecked);
agent_tools::durable_object!(Relay, unchecked);
agent_tools::durable_object!(Briefer, unchecked);
agent_tools::durable_object!(Impatient, unchecked);
agent_tools::durable_object!(Vault, unchecked);
agent_tools::durable_object!(Meter, unchecked);
agent_tools::durable_object!(Gauge, unchecked);
agent_tools::durable_object!(Herald, unchecked);
agent_tools::durable_object!(QuietDesk, unchecked);
agent_tools::durable_object!(Writer, unchecked);
agent_tools::durable_object!(Summarizer, unchecked);

// ----- helpers ------------------------------------------------------------------------------

/// The Worker of these tests: both parents routed (`/agents/desk/…`, `/agents/quiet-desk/…`),
/// both children hosted. Each test gives the classes it uses their models.
fn worker() -> World {
    (World::new()
        .route::<Desk>()
        .route::<QuietDesk>()
        .route::<Herald>()
        .route::<Meter>()
        .route::<Vault>()
        .route::<Impatient>()
        .route::<Relay>())
    .agent::<Writer>()
    .agent::<Summarizer>()
    .agent::<Gauge>()
    .agent::<Briefer>()
    .agent::<Rambler>()
    .agent::<Archivist>()
}

/// Runs a `C` child from parent `P`'s object `parent`, awaited, and returns its result.
fn run<P: Agent, C: Agent>(world: &World, parent: &str, options: RunOptions) -> RunResult {
    let host = world.host::<P>(parent);
    world.block_on(async move { host.run_agent_tool::<C>(options).await })
}

/// Dispatches a detached `Writer` run from parent `P`'s object `parent`.
fn detach<P: Agent>(world: &World, parent: &str, options: RunOptions, detached: DetachedOptions) -> DetachedHandle {
    let host = world.host::<P>(parent);
    let handle = world
        .block_on(async move { host.run_agent_tool_detached::<Writer>(options, detached).await })
        .expect("dispatched");
    assert_eq!(handle.status, RunStatus::Running, "dispatched: {handle:?}");
    handle
}

/// A parent's registry row of `run_id`.
fn row<P: Agent>(world: &World, parent: &str, run_id: &str) -> RunInfo {
    let runs = world.host::<P>(parent).agent_tool_runs().expect("the runs");
    runs.into_iter().find(|r| r.run_id == run_id).unwrap_or_else(|| panic!("no run {run_id}"))
}

/// The transcript of the `C` child that ran `run_id`.
fn child_transcript<C: Agent>(world: &World, run_id: &str) -> Vec<Value> {
    let objects = world.objects_of::<C>();
    let child = objects.iter().find(|o| o.name.ends_with(&format!("/{run_id}"))).expect("the run's child");
    world.host::<C>(&child.name).messages()
}

/// The user messages a model was shown in its `n`th request.
fn user_messages(model: &ScriptedModel, n: usize) -> Vec<String> {
    let requests = model.requests();
    let request = requests.get(n).unwrap_or_else(|| panic!("no request {n}"));
    (request.messages.iter())
        .filter_map(|m| match m {
            ModelMessage::User(text) => Some(text.clone()),
            _ => None,
        })
        .collect()
}

/// A message's text parts, joined.
fn text_of(message: &Value) -> String {
    let parts = message["parts"].as_array().into_iter().flatten();
    parts.filter(|p| p["type"] == "text").filter_map(|p| p["text"].as_str()).collect()
}

/// The bodies (parsed `UIMessageChunk`s) of the `chunk` events a client received for a run.
fn chunk_bodies(client: &Client, run_id: &str) -> Vec<Value> {
    (client.events().iter())
        .filter(|f| f["event"]["runId"] == run_id && f["event"]["kind"] == "chunk")
        .map(|f| serde_json::from_str(f["event"]["body"].as_str().expect("a chunk body")).expect("JSON"))
        .collect()
}

/// The structured events of `type` an object logged (their payloads).
/// A time as the kit's clock counts it (epoch ms, as `World::now`).
fn ms(time: std::time::SystemTime) -> i64 {
    time.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn logged_events(world: &World, object: &ObjectRef, kind: &str) -> Vec<Value> {
    (world.logs().iter())
        .filter(|line| &line.object == object)
        .filter_map(|line| serde_json::from_str::<Value>(&line.text).ok())
        .filter(|event| event["type"] == kind)
        .map(|event| event["payload"].clone())
        .collect()
}

// ----- the rows -----------------------------------------------------------------------------

/// Row 4: a sub-agent's turn has no client-side tools: a client's `cf_agent_tool_result` or
/// `cf_agent_tool_approval` frame on a drill-in socket to a child is answered with an error
/// frame saying so, and starts nothing. On the parent's own socket the same frames answer calls
/// that wait for a person (`tests/kit_approvals.rs`); for a call that does not wait, the error
/// says so, and nothing starts either.
#[test]
fn client_side_tool_frames_are_answered_with_an_error() {
    // parity: 4
    let desk = ScriptedModel::new();
    let world =
        worker().model::<Desk>(desk.clone()).model::<Writer>(ScriptedModel::new().step(Step::new().text("Done.")));
    let parent = world.connect("/agents/desk/ann");
    run::<Desk, Writer>(&world, "ann", RunOptions::new(json!("a note")).run_id("w1"));
    let child = world.connect("/agents/desk/ann/sub/writer/w1");
    world.settle();
    for client in [&parent, &child] {
        client.send(&json!({ "type": "cf_agent_tool_result", "toolCallId": "call-1", "output": { "ok": true } }));
        client.send(&json!({ "type": "cf_agent_tool_approval", "toolCallId": "call-1", "approved": true }));
    }
    world.settle();
    assert_eq!(
        child.errors(),
        [
            "cf_agent_tool_result is not supported: this agent has no client-side tools",
            "cf_agent_tool_approval is not supported: this agent has no client-side tools",
        ],
        "the drill-in socket"
    );
    let waiting = "no tool call \"call-1\" is waiting for an answer";
    assert_eq!(parent.errors(), [waiting, waiting], "the parent's socket");
    assert!(desk.requests().is_empty(), "no chat turn started");
    assert!(world.host::<Desk>("ann").messages().is_empty());
    assert_eq!(child_transcript::<Writer>(&world, "w1").len(), 2, "the child's transcript is the run's");
}

/// Row 14: a child that overrides `format_agent_tool_input` starts its run with the message it
/// builds (the seed's example: id `agent-tool-<run>-input`, text `Summarize:\n\n<text>`), and
/// its model is shown that text. Without an override the input becomes the text of a message
/// with that id: a string as is, anything else as pretty JSON.
#[test]
fn a_run_starts_with_the_message_its_child_formats_from_the_input() {
    // parity: 14
    let (summarizer, writer) = (ScriptedModel::new(), ScriptedModel::new());
    let world = worker().model::<Summarizer>(summarizer.clone()).model::<Writer>(writer.clone());
    let input = json!({ "text": "QUIC runs over UDP." });
    run::<Desk, Summarizer>(&world, "bo", RunOptions::new(input).run_id("s1"));
    let first = &child_transcript::<Summarizer>(&world, "s1")[0];
    let expected = json!({
        "id": "agent-tool-s1-input",
        "role": "user",
        "parts": [{ "type": "text", "text": "Summarize:\n\nQUIC runs over UDP." }],
    });
    assert_eq!(first, &expected);
    assert_eq!(user_messages(&summarizer, 0), ["Summarize:\n\nQUIC runs over UDP."]);

    // The default: a string input as is, an object as pretty JSON.
    let object = json!({ "topic": "QUIC", "words": 3 });
    let pretty = serde_json::to_string_pretty(&object).expect("JSON");
    assert!(pretty.contains('\n'));
    for (n, (run_id, input, text)) in
        [("w1", json!("Write about QUIC"), "Write about QUIC"), ("w2", object, pretty.as_str())].into_iter().enumerate()
    {
        run::<Desk, Writer>(&world, "bo", RunOptions::new(input).run_id(run_id));
        let first = &child_transcript::<Writer>(&world, run_id)[0];
        assert_eq!(
            (first["id"].as_str(), first["role"].as_str()),
            (Some(&*format!("agent-tool-{run_id}-input")), Some("user"))
        );
        assert_eq!(text_of(first), text, "{first:#}");
        assert_eq!(user_messages(&writer, n), [text]);
    }
}

/// Row 60: a detached run does not inherit the caller's signal, since it must outlive the turn
/// that started it: a `RunOptions::signal` cancelled mid-run, or one already cancelled at the
/// dispatch, leaves the run to complete.
#[test]
fn a_detached_run_ignores_the_callers_signal() {
    // parity: 60
    let answer = "one two three four five";
    let writer = ScriptedModel::new().otherwise(move |_| Step::new().words(answer, Duration::from_millis(100)));
    let world = worker().model::<Writer>(writer);
    let (later, already) = (CancelToken::new(), CancelToken::new());
    already.cancel(Some("the turn already ended".into()));
    for (run_id, token) in [("d1", &later), ("d2", &already)] {
        let options = RunOptions::new(json!("count to five")).run_id(run_id).signal(token.clone());
        detach::<Desk>(&world, "cy", options, DetachedOptions::default());
    }
    world.advance(Duration::from_millis(250));
    assert_eq!(row::<Desk>(&world, "cy", "d1").status, RunStatus::Running);
    later.cancel(Some("the turn that started it ended".into()));
    world.settle();
    let host = world.host::<Desk>("cy");
    for run_id in ["d1", "d2"] {
        let inspection = host.inspect_agent_tool_run(run_id).expect("the registry").expect("a run");
        let result = inspection.result.expect("a result");
        assert_eq!((result.status, result.summary.as_deref()), (RunStatus::Completed, Some(answer)), "{run_id}");
        assert_eq!(world.finish_hooks(&ObjectRef::of::<Desk>("cy"), run_id), 1);
    }
}

/// Row 68: a `notify` run whose `format_detached_completion` returns `""` posts no message and
/// starts no model turn, and its delivery is settled: ten minutes on (past the backbone's
/// ticks and a delivery's lease), it was not offered again.
#[test]
fn an_empty_completion_notice_posts_nothing_and_settles_the_delivery() {
    // parity: 68
    let quiet = ScriptedModel::new();
    let writer = ScriptedModel::new().step(Step::new().text("A draft."));
    let world = worker().model::<QuietDesk>(quiet.clone()).model::<Writer>(writer);
    let options = RunOptions::new(json!("a draft")).run_id("n1");
    detach::<QuietDesk>(&world, "di", options, DetachedOptions::default().notify());
    assert!(world.run_until(|| row::<QuietDesk>(&world, "di", "n1").status == RunStatus::Completed));
    world.advance(Duration::from_millis(10 * 60_000));
    let host = world.host::<QuietDesk>("di");
    assert_eq!(host.agent().completions.get(), 1, "worded once, not offered again");
    assert!(host.messages().is_empty(), "no message: {:#?}", host.messages());
    assert!(quiet.requests().is_empty(), "no model turn");
    let ticks = logged_events(&world, &ObjectRef::of::<QuietDesk>("di"), "agent_tool:alarm");
    let last = ticks.last().expect("the backbone ticked");
    assert_eq!(last["outstanding"], 0, "nothing owed: {ticks:#?}");
}

/// Rows 66, 67 and 98: a `notify` run's messages are the parent's to word and carry the run's
/// `notify_source` as `metadata.source`: the milestone line (`format_detached_milestone`) and
/// the completion notice (`format_detached_completion`, handed the run and its result), which
/// the parent's model then answers.
#[test]
fn a_notify_runs_messages_have_the_parents_wording_and_the_runs_source() {
    // parity: 66, 67, 98
    let herald = ScriptedModel::new().otherwise(|_| Step::new().text("Thanks."));
    let writer = ScriptedModel::new().step(Step::new().text("A draft."));
    let world = worker().model::<Herald>(herald.clone()).model::<Writer>(writer);
    let detached = DetachedOptions::default()
        .notify()
        .notify_source("nightly-digest")
        .on_milestones(OnMilestones::narrate(["outlined"]));
    detach::<Herald>(&world, "hal", RunOptions::new(json!("a draft")).run_id("h1"), detached);
    world.settle();
    let messages = world.host::<Herald>("hal").messages();
    let by_id = |id: &str| {
        messages.iter().find(|m| m["id"] == id).unwrap_or_else(|| panic!("no message {id}: {messages:#?}")).clone()
    };
    let milestone = by_id("detached-ms:h1:outlined");
    assert_eq!(text_of(&milestone), "h1 passed outlined");
    assert_eq!(milestone["metadata"]["source"], "nightly-digest");
    let notice = by_id("detached-finish:h1:completed");
    assert_eq!(text_of(&notice), "Writer finished h1: A draft.");
    assert_eq!(notice["metadata"]["source"], "nightly-digest");
    assert!(user_messages(&herald, 0).contains(&"Writer finished h1: A draft.".to_owned()), "the model is told");
}

/// Row 95: a milestone the parent never forwarded, because it was evicted before the child
/// reported it, is surfaced once it is back: a detached run's child calls `checkpoint` six
/// seconds in; the parent crashes at three and comes back by its alarm alone, reads the run's
/// stream from its cursor and posts the milestone's message, then the completion's, each once;
/// another crash after that posts neither again.
#[test]
fn a_milestone_reported_while_the_parent_was_evicted_is_surfaced_once_after() {
    // parity: 95
    let writer = ScriptedModel::new()
        .step(Step::new().delay(Duration::from_secs(6)).tool_call("checkpoint", json!({ "note": "half way" })))
        .otherwise(|_| Step::new().words("The rest of the draft.", Duration::from_millis(500)));
    let world = worker().model::<Writer>(writer);
    let detached = DetachedOptions::default().notify().on_milestones(OnMilestones::narrate(["checkpoint"]));
    detach::<Desk>(&world, "eve", RunOptions::new(json!("a draft")).run_id("m1"), detached);
    world.advance(Duration::from_secs(3));
    let parent = ObjectRef::of::<Desk>("eve");
    let milestone_id = "detached-ms:m1:checkpoint";
    let count = |id: &str| world.host::<Desk>("eve").messages().iter().filter(|m| m["id"] == id).count();
    assert_eq!(count(milestone_id), 0, "not reported yet");
    world.crash(&parent);
    world.settle();
    let messages = world.host::<Desk>("eve").messages();
    let ids: Vec<&str> = messages.iter().filter_map(|m| m["id"].as_str()).collect();
    let at = |id: &str| ids.iter().position(|m| *m == id).unwrap_or_else(|| panic!("no {id}: {ids:?}"));
    assert!(at(milestone_id) < at("detached-finish:m1:completed"), "the milestone's message, then the completion's");
    let milestone = &messages[at(milestone_id)];
    assert_eq!(milestone["metadata"]["milestone"], "checkpoint", "{milestone}");
    assert_eq!(row::<Desk>(&world, "eve", "m1").status, RunStatus::Completed);
    world.crash(&parent);
    world.advance(Duration::from_secs(60));
    assert_eq!((count(milestone_id), count("detached-finish:m1:completed")), (1, 1), "once each");
}

/// Rows 47 and 63: the detached handler gets the run and its lifecycle result, whatever the
/// end: `error` with the child's error, `aborted` with the cancel's reason, `interrupted` with
/// its reason (here its budget ran out) and whether the child still runs, each once.
#[test]
fn the_detached_handler_gets_each_kind_of_end() {
    // parity: 47, 63
    let world = worker().model::<Writer>(failing_or_slow_writer());
    let tag = DetachedOptions::default().on_finish("ends");
    detach::<Desk>(&world, "ivy", RunOptions::new(json!("fail")).run_id("e1"), tag.clone());
    detach::<Desk>(&world, "ivy", RunOptions::new(json!("slow")).run_id("a1"), tag.clone());
    let budget = tag.max_budget(std::time::Duration::from_secs(3));
    detach::<Desk>(&world, "ivy", RunOptions::new(json!("slow")).run_id("i1"), budget);
    world.advance(Duration::from_millis(500));
    let host = world.host::<Desk>("ivy");
    host.cancel_agent_tool("a1", Some("the user changed their mind".into())).expect("cancelled");
    world.settle();
    let delivered = host.agent().delivered.borrow().clone();
    // Run id, status, error, reason, whether the child still runs.
    type End<'a> = (&'a str, RunStatus, Option<&'a str>, Option<String>, Option<bool>);
    let mut ends: Vec<End> = (delivered.iter())
        .map(|(handler, run_id, result)| {
            assert_eq!(handler, &json!("ends"));
            let reason = result.reason.map(|r| serde_json::to_value(r).unwrap().as_str().unwrap().to_owned());
            (run_id.as_str(), result.status, result.error.as_deref(), reason, result.child_still_running)
        })
        .collect();
    ends.sort_by_key(|e| e.0);
    let budget_error = ends.get(2).and_then(|e| e.2);
    assert!(budget_error.is_some_and(|e| e.contains("budget")), "{ends:#?}");
    assert_eq!(
        ends,
        [
            ("a1", RunStatus::Aborted, Some("the user changed their mind"), None, None),
            ("e1", RunStatus::Error, Some("model provider unreachable: the model is down"), None, None),
            ("i1", RunStatus::Interrupted, budget_error, Some("budget-exceeded".to_owned()), Some(false)),
        ]
    );
    for run_id in ["a1", "e1", "i1"] {
        assert_eq!(world.detached_handlers(&ObjectRef::of::<Desk>("ivy"), run_id), 1, "{run_id}");
    }
}

/// Row 82: an overridden `on_progress` sees every child signal that passes through the parent,
/// of awaited and of detached runs alike.
#[test]
fn on_progress_sees_the_signals_of_awaited_and_detached_runs() {
    // parity: 82
    let writer = ScriptedModel::new().otherwise(|_| Step::new().text("Done."));
    let world = worker().model::<Writer>(writer);
    run::<Meter, Writer>(&world, "max", RunOptions::new(json!("a")).run_id("w1"));
    detach::<Meter>(&world, "max", RunOptions::new(json!("b")).run_id("d1"), DetachedOptions::default());
    world.settle();
    let seen = world.host::<Meter>("max").agent().progress.borrow().clone();
    let outlined: Vec<&str> =
        (seen.iter()).filter(|(_, what, _)| what == "outlined").map(|(r, _, _)| r.as_str()).collect();
    assert_eq!(outlined, ["w1", "d1"], "{seen:#?}");
}

/// Row 81: progress `data` is live-only unless the report persists it: `on_progress` sees both
/// reports' data as they pass, but the snapshot the parent keeps (what an inspection and a
/// replay give) has the data only of the report that persisted it.
#[test]
fn progress_data_is_kept_only_when_persisted() {
    // parity: 81
    let world = worker();
    let host = world.host::<Meter>("mia");
    let options = RunOptions::new(json!("g")).run_id("g1");
    let dispatched =
        world.block_on(async move { host.run_agent_tool_detached::<Gauge>(options, Default::default()).await });
    assert_eq!(dispatched.expect("dispatched").status, RunStatus::Running);
    let kept = || {
        let host = world.host::<Meter>("mia");
        host.inspect_agent_tool_run("g1").expect("the registry").expect("the run").progress.expect("a snapshot")
    };
    world.advance(Duration::from_millis(500));
    assert_eq!((kept().fraction, kept().data), (Some(0.25), None), "live only");
    world.advance(Duration::from_secs(1));
    assert_eq!((kept().fraction, kept().data), (Some(0.5), Some(json!({ "kept": true }))), "persisted");
    let seen = world.host::<Meter>("mia").agent().progress.borrow().clone();
    let data: Vec<Option<Value>> = seen.into_iter().map(|(_, _, data)| data).collect();
    assert_eq!(data, [Some(json!({ "draft": "live only" })), Some(json!({ "kept": true }))], "both pass through");
}

/// Row 148: an overridden `on_observability` is told of the parent's reconciliation: after the
/// parent crashed mid-run, its recovery pass's events reach the new instance's hook.
#[test]
fn on_observability_is_told_of_recovery() {
    // parity: 148
    let writer =
        ScriptedModel::new().otherwise(|_| Step::new().words("one two three four five six", Duration::from_secs(1)));
    let world = worker().model::<Writer>(writer);
    let _client = world.connect("/agents/meter/ned");
    detach::<Meter>(&world, "ned", RunOptions::new(json!("r")).run_id("r1"), DetachedOptions::default());
    world.advance(Duration::from_millis(1_500));
    world.crash(&ObjectRef::of::<Meter>("ned"));
    world.settle();
    let observed = world.host::<Meter>("ned").agent().observed.borrow().clone();
    for kind in ["agent_tool:recovery:begin", "agent_tool:recovery:row", "agent_tool:recovery:complete"] {
        assert!(observed.iter().any(|k| k == kind), "{kind} in {observed:?}");
    }
    assert_eq!(row::<Meter>(&world, "ned", "r1").status, RunStatus::Completed);
}

/// A detached `Writer` run of parent `Desk` `parent` that is streaming, and its child.
fn streaming_run(world: &World, parent: &str, run_id: &str) -> ObjectRef {
    detach::<Desk>(world, parent, RunOptions::new(json!("long")).run_id(run_id), DetachedOptions::default());
    world.advance(Duration::from_millis(2_500));
    assert_eq!(row::<Desk>(world, parent, run_id).status, RunStatus::Running);
    let child = world.objects_of::<Writer>().into_iter().find(|o| o.name.ends_with(&format!("/{run_id}")));
    child.expect("the run's child")
}

/// A writer's model that fails when asked to ("fail" in the input), and otherwise answers
/// eight words, a word a second.
fn failing_or_slow_writer() -> ScriptedModel {
    ScriptedModel::new().otherwise(|request| {
        let asked = request.messages.iter().any(|m| matches!(m, ModelMessage::User(t) if t.contains("fail")));
        if asked {
            Step::new().fail("the model is down")
        } else {
            Step::new().words("one two three four five six seven eight", Duration::from_secs(1))
        }
    })
}

/// A long answer, a word a second.
fn slow_writer() -> ScriptedModel {
    let words = (1..=60).map(|n| n.to_string()).collect::<Vec<_>>().join(" ");
    ScriptedModel::new().otherwise(move |_| Step::new().words(&words, Duration::from_secs(1)))
}

/// Row 142: a child whose stream cannot be tailed, though it answers where the run stands, is
/// sealed `not-tailable` after three failed tails in a row: `interrupted`, retryable, the child
/// still running.
#[test]
fn a_child_that_cannot_be_tailed_is_sealed_not_tailable() {
    // parity: 142
    let world = worker().model::<Writer>(slow_writer());
    let child = streaming_run(&world, "nia", "t1");
    world.drop_tails_to(&child, 3);
    world.break_tails_to(&child);
    world.advance(Duration::from_secs(5));
    let result = world.host::<Desk>("nia").inspect_agent_tool_run("t1").expect("the registry").expect("the run");
    let result = result.result.expect("sealed");
    let reason = result.reason.map(|r| serde_json::to_value(r).expect("JSON"));
    assert_eq!(
        (result.status, reason, result.child_still_running),
        (RunStatus::Interrupted, Some(json!("not-tailable")), Some(true))
    );
    assert!(result.failure().expect("a failure").retryable);
}

/// Row 144: a child that cannot be reached to ask where the run stands is sealed
/// `inspect-failed`: `interrupted` and retryable, never `error`.
#[test]
fn a_child_that_cannot_be_reached_is_sealed_inspect_failed() {
    // parity: 144
    let world = worker().model::<Writer>(slow_writer());
    let child = streaming_run(&world, "oto", "u1");
    world.drop_hops_to("Writer", 1_000);
    world.break_tails_to(&child);
    world.advance(Duration::from_secs(5));
    let result = world.host::<Desk>("oto").inspect_agent_tool_run("u1").expect("the registry").expect("the run");
    let result = result.result.expect("sealed");
    let reason = result.reason.map(|r| serde_json::to_value(r).expect("JSON"));
    assert_eq!((result.status, reason), (RunStatus::Interrupted, Some(json!("inspect-failed"))));
    assert!(result.failure().expect("a failure").retryable);
}

/// Row 123: an overridden `on_before_sub_agent` decides who drills in: its 404 answers a run
/// it keeps private (though the run exists) and a guessed run id, and a refused drill-in
/// creates no child; a run it lets in is served.
#[test]
fn an_overridden_drill_in_gate_refuses_with_its_own_answer() {
    // parity: 123
    let world = worker().model::<Writer>(ScriptedModel::new().otherwise(|_| Step::new().text("Done.")));
    let _parent = world.connect("/agents/vault/vi");
    for run_id in ["private-1", "open-1"] {
        run::<Vault, Writer>(&world, "vi", RunOptions::new(json!("a")).run_id(run_id));
    }
    let children = world.objects_of::<Writer>().len();
    for run_id in ["private-1", "guess-9"] {
        let refused = world.get(&format!("/agents/vault/vi/sub/writer/{run_id}/get-messages"));
        assert_eq!(refused.status(), 404, "{run_id}");
        let body: Value = serde_json::from_slice(refused.body()).expect("a JSON body");
        assert_eq!(body["error"], "no such report", "{run_id}: {body}");
        assert!(world.try_connect(&format!("/agents/vault/vi/sub/writer/{run_id}")).is_err(), "{run_id}");
    }
    assert_eq!(world.objects_of::<Writer>().len(), children, "no child was created");
    let open = world.get("/agents/vault/vi/sub/writer/open-1/get-messages");
    assert_eq!(open.status(), 200);
    let messages: Vec<Value> = serde_json::from_slice(open.body()).expect("messages");
    assert_eq!(messages.len(), 2, "the run's own conversation");
}

/// Row 3: both kinds of child are agents of the one trait: a chat agent (the default `run`, a
/// chat turn of its model: `Writer` only adds a milestone before it) and a workflow whose own
/// `run` streams what it does and asks no model (`Gauge`). Each run completes with its child's
/// answer and leaves the child's own conversation.
#[test]
fn a_chat_agent_and_a_workflow_are_both_children() {
    // parity: 3
    let writer = ScriptedModel::new().step(Step::new().text("A chat answer."));
    let world = worker().model::<Writer>(writer.clone());
    let chat = run::<Desk, Writer>(&world, "pia", RunOptions::new(json!("chat")).run_id("c1"));
    let workflow = run::<Desk, Gauge>(&world, "pia", RunOptions::new(json!("measure")).run_id("g1"));
    assert_eq!((chat.status, chat.summary.as_deref()), (RunStatus::Completed, Some("A chat answer.")));
    assert_eq!((workflow.status, workflow.summary.as_deref()), (RunStatus::Completed, Some("measured")));
    assert_eq!(writer.requests().len(), 1, "only the chat agent asked its model");
    let chat_transcript = child_transcript::<Writer>(&world, "c1");
    assert_eq!(text_of(&chat_transcript[1]), "A chat answer.");
    let inspection = world.host::<Desk>("pia").inspect_agent_tool_run("g1").expect("the registry").expect("the run");
    assert_eq!(inspection.progress.and_then(|p| p.fraction), Some(0.5), "the workflow's own reports");
}

/// Row 32: a child's structured output (`Agent::agent_tool_output`) is read once the turn's
/// messages are saved: when it is read, the child's stored transcript already ends with the
/// assistant message the hook is handed, whole, behind the run's input.
#[test]
fn the_output_is_read_once_the_turns_messages_are_saved() {
    // parity: 32
    let archivist = ScriptedModel::new().step(Step::new().text("Filed and saved."));
    let world = worker().model::<Archivist>(archivist);
    let result = run::<Desk, Archivist>(&world, "ada", RunOptions::new(json!("File it")).run_id("a1"));
    assert_eq!(result.status, RunStatus::Completed, "{result:?}");
    let output = result.output.expect("an output");
    assert_eq!(output["lastText"], "Filed and saved.", "{output}");
    assert_eq!(output["lastId"], output["handedId"], "the message handed is the one stored: {output}");
    assert_eq!(output["messages"], 2, "the input and the answer: {output}");
}

/// Row 43: a dispatch that is rejected is an `Err`, never a handle; an `Ok` handle says
/// `running` for a run started (or still going when its id is dispatched again), and for a
/// known run id whose run already ended, that run's final status, `error` included: the run is
/// not started again, and no second child is.
#[test]
fn a_detached_handle_is_running_or_a_known_runs_end() {
    // parity: 43
    let world = worker().model::<Writer>(failing_or_slow_writer());
    let dispatch = |run_id: &str, input: &str| {
        let host = world.host::<Desk>("quin");
        let options = RunOptions::new(json!(input)).run_id(run_id);
        world.block_on(async move { host.run_agent_tool_detached::<Writer>(options, DetachedOptions::default()).await })
    };
    assert_eq!(dispatch("f1", "fail").expect("dispatched").status, RunStatus::Running, "started");
    assert_eq!(dispatch("s1", "slow").expect("dispatched").status, RunStatus::Running, "started");
    world.advance(Duration::from_secs(2));
    assert_eq!(row::<Desk>(&world, "quin", "f1").status, RunStatus::Error);
    let again = dispatch("f1", "fail").expect("a known run is no rejection");
    assert_eq!((again.run_id.as_str(), again.status), ("f1", RunStatus::Error), "its end, not a rejection");
    assert_eq!(dispatch("s1", "slow").expect("dispatched").status, RunStatus::Running, "still going");
    assert_eq!(world.objects_of::<Writer>().len(), 2, "no second child");
    let terminal = RunOptions::new(json!("x")).run_id("t1").event_delivery(EventDelivery::Terminal);
    let host = world.host::<Desk>("quin");
    let refused =
        world.block_on(async move { host.run_agent_tool_detached::<Writer>(terminal, Default::default()).await });
    assert!(matches!(refused, Err(Error::Refused(_))), "a rejection is an Err: {refused:?}");
}

/// Rows 7 and 9: the parent's model is offered each agent tool under its name, with its
/// description and its input's JSON Schema (here the default one of an agent tool without a
/// typed input), beside the ordinary tools, on every step.
#[test]
fn the_model_is_offered_the_agent_tool_with_its_description_and_schema() {
    // parity: 7, 9
    let desk = ScriptedModel::new().otherwise(|_| Step::new().text("Nothing to do."));
    let world = worker().model::<Desk>(desk.clone());
    world.connect("/agents/desk/rae").chat("Anything?");
    let requests = desk.requests();
    let tools = &requests.first().expect("a model request").tools;
    let write = tools.iter().find(|t| t.name == "write").expect("the agent tool");
    assert_eq!(write.description, "Write about a topic.");
    assert_eq!(write.input_schema, json!({ "type": "object" }), "an agent tool with no typed input takes any object");
    let checkpoint = tools.iter().find(|t| t.name == "checkpoint").expect("the ordinary tool");
    assert_eq!(checkpoint.description, "Marks a checkpoint of the work.");
    assert_eq!(checkpoint.input_schema["properties"]["note"]["type"], "string");
}

/// Row 33: a child that overrides `agent_tool_summary` (handed the run id, the answer's text
/// and its output) decides what the parent's model reads; the child's transcript keeps the
/// whole answer.
#[test]
fn an_overridden_summary_is_what_the_parent_gets() {
    // parity: 33
    let answer = "QUIC runs over UDP and carries its own handshake.";
    let world = worker().model::<Briefer>(ScriptedModel::new().step(Step::new().text(answer)));
    let result = run::<Desk, Briefer>(&world, "sol", RunOptions::new(json!("QUIC")).run_id("b1"));
    assert_eq!(result.summary.as_deref(), Some("[b1] QUIC runs over…"), "{result:?}");
    assert_eq!(result.for_model(), json!("[b1] QUIC runs over…"));
    assert_eq!(text_of(&child_transcript::<Briefer>(&world, "b1")[1]), answer);
}

/// Row 113: a client that drills in to a `terminal`-delivery run sees the child's stored
/// conversation when it connects and its final messages when the run ends, but no live text.
#[test]
fn a_drill_in_to_a_terminal_run_sees_the_conversation_then_the_end_but_no_live_text() {
    // parity: 113
    let answer = "one two three four five six";
    let world = worker().model::<Writer>(ScriptedModel::new().step(Step::new().words(answer, Duration::from_secs(1))));
    let _parent = world.connect("/agents/relay/ray");
    assert_eq!(world.post("/agents/relay/ray/watch", &json!({})).status(), 202);
    world.advance(Duration::from_millis(2_500));
    let child = world.connect("/agents/relay/ray/sub/writer/t1");
    let at_connect = child.messages();
    assert_eq!(at_connect.len(), 1, "the stored conversation: {at_connect:#?}");
    assert_eq!(text_of(&at_connect[0]), "Write about QUIC");
    // What the turn streamed before the client came is replayed to it (the stock client's
    // resume); nothing of the turn comes live after that.
    let live_text = |client: &Client| -> Vec<Value> {
        (client.frames().into_iter())
            .filter(|f| f["type"] == "cf_agent_use_chat_response" && f["replay"] != true)
            .filter(|f| f["body"].as_str().is_some_and(|b| b.contains("text-delta")))
            .collect()
    };
    let replayed = (child.frames().iter()).filter(|f| f["replay"] == true).count();
    assert!(replayed > 0, "the stream so far is replayed");
    world.advance(Duration::from_secs(2));
    assert_eq!(live_text(&child), Vec::<Value>::new(), "no live text");
    world.settle();
    let end = child.messages();
    assert_eq!(end.len(), 2, "the final messages: {end:#?}");
    assert_eq!((end[1]["role"].as_str(), text_of(&end[1]).trim()), (Some("assistant"), answer));
    assert_eq!(live_text(&child), Vec::<Value>::new(), "still no live text");
}

/// Row 69: an explicit `on_finish` takes precedence over `notify`: the handler gets the run's
/// outcome once, and no message is posted (so no model turn runs), though the parent's
/// completion wording is the default one.
#[test]
fn on_finish_takes_precedence_over_notify() {
    // parity: 69
    let desk = ScriptedModel::new();
    let writer = ScriptedModel::new().step(Step::new().text("A draft."));
    let world = worker().model::<Desk>(desk.clone()).model::<Writer>(writer);
    let detached = DetachedOptions::default().on_finish("drafts").notify();
    detach::<Desk>(&world, "ed", RunOptions::new(json!("a draft")).run_id("f1"), detached);
    world.settle();
    let host = world.host::<Desk>("ed");
    let delivered = host.agent().delivered.borrow().clone();
    assert_eq!(delivered.len(), 1, "{delivered:#?}");
    let (handler, run_id, result) = &delivered[0];
    assert_eq!((handler, run_id.as_str()), (&json!("drafts"), "f1"));
    assert_eq!((result.status, result.summary.as_deref()), (RunStatus::Completed, Some("A draft.")));
    assert_eq!(world.detached_handlers(&ObjectRef::of::<Desk>("ed"), "f1"), 1);
    assert!(host.messages().is_empty(), "no message: {:#?}", host.messages());
    assert!(desk.requests().is_empty(), "no model turn");
}

/// Row 74: `report_progress` from a tool outside an agent-tool run (here the parent's own chat
/// turn) does nothing but log a warning: no run, no frame, no progress chunk, and the tool
/// still runs. The same tool reports in a child's run.
#[test]
fn reporting_progress_outside_a_run_only_warns() {
    // parity: 74
    let desk = ScriptedModel::new()
        .step(Step::new().tool_call("checkpoint", json!({ "note": "standalone" })))
        .step(Step::new().text("Noted."));
    let writer = ScriptedModel::new()
        .step(Step::new().tool_call("checkpoint", json!({ "note": "in a run" })))
        .step(Step::new().text("Done."));
    let world = worker().model::<Desk>(desk.clone()).model::<Writer>(writer);
    let client = world.connect("/agents/desk/flo");
    let reply = client.chat("Mark a checkpoint");
    assert_eq!((reply.error.as_deref(), reply.text.as_str()), (None, "Noted."));
    assert_eq!(desk.last_tool_results(), [("checkpoint".to_owned(), json!("noted: standalone"))]);
    let warning = "agent-tools: report_progress outside an agent-tool run is ignored";
    let warned = |object: &ObjectRef| world.logs().iter().filter(|l| &l.object == object && l.text == warning).count();
    assert_eq!(warned(&ObjectRef::of::<Desk>("flo")), 1);
    assert!(client.events().is_empty(), "no agent-tool frame: {:#?}", client.events());
    assert!(world.host::<Desk>("flo").agent_tool_runs().expect("the runs").is_empty());
    let sent = serde_json::to_string(&client.frames()).expect("JSON");
    assert!(!sent.contains("data-agent-milestone"), "no milestone reached the client: {sent}");

    // The same tool in a child's run reports its milestone, with no warning.
    run::<Desk, Writer>(&world, "flo", RunOptions::new(json!("work")).run_id("w1"));
    let inspection = world.host::<Desk>("flo").inspect_agent_tool_run("w1").expect("the registry").expect("the run");
    let milestones: Vec<(&str, Option<&Value>)> =
        inspection.milestones.iter().map(|m| (m.name.as_str(), m.data.as_ref())).collect();
    assert_eq!(milestones, [("outlined", None), ("checkpoint", Some(&json!({ "note": "in a run" })))]);
    let child = world.objects_of::<Writer>().remove(0);
    assert_eq!(warned(&child), 0);
}

/// Row 90: a milestone replays on drill-in: a client that drills in to a child after the
/// milestone was reported, and resumes its stream, gets the `data-agent-milestone` chunk in the
/// replay, before the live chunks.
#[test]
fn a_milestone_replays_on_drill_in() {
    // parity: 90
    let writer = ScriptedModel::new().step(Step::new().words("one two three four five six", Duration::from_secs(1)));
    let world = worker().model::<Writer>(writer);
    // A parent learns its name from its first request: only then are its runs' children the
    // objects a drill-in path names (`World::host` alone does not tell it).
    let _parent = world.connect("/agents/desk/gus");
    detach::<Desk>(&world, "gus", RunOptions::new(json!("count")).run_id("m1"), DetachedOptions::default());
    world.advance(Duration::from_millis(2_500));
    let reached = world.host::<Desk>("gus").inspect_agent_tool_run("m1").expect("the registry").expect("the run");
    assert_eq!((reached.info.status, reached.milestones.len()), (RunStatus::Running, 1), "reported, still running");
    let child = world.connect("/agents/desk/gus/sub/writer/m1");
    let resuming = child.frames().into_iter().find(|f| f["type"] == "cf_agent_stream_resuming").expect("a stream");
    assert_eq!(resuming["id"], "m1");
    child.send(&json!({ "type": "cf_agent_stream_resume_ack", "id": "m1" }));
    world.settle();
    let responses: Vec<Value> =
        child.frames().into_iter().filter(|f| f["type"] == "cf_agent_use_chat_response").collect();
    let replayed: Vec<Value> = (responses.iter())
        .take_while(|f| f["replay"] == true)
        .filter_map(|f| serde_json::from_str(f["body"].as_str()?).ok())
        .collect();
    let milestone = replayed.iter().find(|c| c["type"] == "data-agent-milestone").expect("the milestone replayed");
    assert_eq!((&milestone["data"]["name"], &milestone["data"]["sequence"]), (&json!("outlined"), &json!(0)));
    assert!(responses.iter().any(|f| f.get("replay").is_none()), "then live frames");
    assert_eq!(row::<Desk>(&world, "gus", "m1").status, RunStatus::Completed);
}

/// Row 97: an `on_milestones` run with `MilestoneMode::React` posts a user-role message with id
/// `detached-ms:<run>:<name>` when the milestone lands, and the parent's model takes a turn on
/// it, once.
#[test]
fn a_react_milestone_posts_a_user_message_and_runs_a_model_turn_once() {
    // parity: 97
    let desk = ScriptedModel::new().otherwise(|_| Step::new().text("Good to know."));
    let writer = ScriptedModel::new().step(Step::new().words("one two three", Duration::from_secs(1)));
    let world = worker().model::<Desk>(desk.clone()).model::<Writer>(writer);
    let detached = DetachedOptions::default().on_milestones(OnMilestones::react(["outlined"]));
    detach::<Desk>(&world, "hal", RunOptions::new(json!("count")).run_id("r1"), detached);
    world.settle();
    let notice = "Background task \"Writer\" (run r1) reached milestone \"outlined\".";
    let messages = world.host::<Desk>("hal").messages();
    let summary: Vec<(&str, &str, String)> = (messages.iter())
        .map(|m| (m["id"].as_str().unwrap_or_default(), m["role"].as_str().unwrap_or_default(), text_of(m)))
        .collect();
    assert_eq!(summary.len(), 2, "{messages:#?}");
    assert_eq!((summary[0].0, summary[0].1, summary[0].2.as_str()), ("detached-ms:r1:outlined", "user", notice));
    assert_eq!((summary[1].1, summary[1].2.as_str()), ("assistant", "Good to know."));
    assert_eq!(desk.requests().len(), 1, "one model turn");
    assert_eq!(user_messages(&desk, 0), [notice]);
    assert_eq!(row::<Desk>(&world, "hal", "r1").status, RunStatus::Completed);
}

/// Row 99: an `on_milestones` run whose `format_detached_milestone` returns `""` posts nothing
/// for the milestone, and the milestone counts as handled: the backbone, which offers a
/// milestone not yet handled on each tick, does not offer it again while the run goes on.
#[test]
fn an_empty_milestone_notice_posts_nothing_and_is_not_offered_again() {
    // parity: 99
    let quiet = ScriptedModel::new();
    let writer = ScriptedModel::new().step(Step::new().words("one two three four", Duration::from_secs(20)));
    let world = worker().model::<QuietDesk>(quiet.clone()).model::<Writer>(writer);
    let detached = DetachedOptions::default().on_milestones(OnMilestones::narrate(["outlined"]));
    detach::<QuietDesk>(&world, "ida", RunOptions::new(json!("count")).run_id("q1"), detached);
    world.settle();
    let host = world.host::<QuietDesk>("ida");
    assert_eq!(row::<QuietDesk>(&world, "ida", "q1").status, RunStatus::Completed);
    let ticks = logged_events(&world, &ObjectRef::of::<QuietDesk>("ida"), "agent_tool:alarm");
    let while_live = ticks.iter().filter(|t| t["live"].as_u64() > Some(0)).count();
    assert!(while_live >= 2, "the backbone ticked while the run went on: {ticks:#?}");
    assert_eq!(host.agent().milestones.get(), 1, "offered once");
    assert!(host.messages().is_empty(), "no message: {:#?}", host.messages());
    assert!(quiet.requests().is_empty(), "no model turn");
}

/// Row 110: the ordinary chunks of a run with `EventDelivery::Terminal` are not replayed on
/// reconnect: a client connecting after the run ended gets its lifecycle and its milestone,
/// while the same answer delivered in full replays its text chunks too.
#[test]
fn a_terminal_runs_ordinary_chunks_are_not_replayed() {
    // parity: 110
    let writer = ScriptedModel::new().otherwise(|_| Step::new().words("alpha beta gamma", Duration::from_millis(10)));
    let world = worker().model::<Writer>(writer);
    for (run_id, delivery) in [("full", EventDelivery::Full), ("terminal", EventDelivery::Terminal)] {
        let result =
            run::<Desk, Writer>(&world, "jo", RunOptions::new(json!("abc")).run_id(run_id).event_delivery(delivery));
        assert_eq!(result.summary.as_deref(), Some("alpha beta gamma"), "{run_id}");
    }
    let late = world.connect("/agents/desk/jo");
    world.settle();
    let kinds = |run_id: &str| -> Vec<String> {
        chunk_bodies(&late, run_id).iter().map(|c| c["type"].as_str().unwrap_or_default().to_owned()).collect()
    };
    assert!(kinds("full").iter().any(|k| k == "text-delta"), "full delivery replays the text: {:?}", kinds("full"));
    assert_eq!(kinds("terminal"), ["data-agent-milestone"]);
    let events = late.events();
    let replayed: Vec<&str> = (events.iter())
        .filter(|f| f["event"]["runId"] == "terminal")
        .filter_map(|f| f["event"]["kind"].as_str())
        .collect();
    assert_eq!(replayed, ["started", "chunk", "finished"]);
    assert!(events.iter().all(|f| f["replay"] == true), "all of it a replay");
    // The child kept its whole answer all the same.
    assert_eq!(text_of(&child_transcript::<Writer>(&world, "terminal")[1]), "alpha beta gamma");
}

/// Rows 135 and 137: the re-attach budgets' defaults. A followed child may be silent for
/// 120 000 ms (`agentToolReattachNoProgressTimeoutMs`), and a re-attach has no window
/// (`agentToolReattachMaxWindowMs` is `Infinity`).
#[test]
fn reattach_budgets_default_to_two_silent_minutes_and_no_window() {
    // parity: 135, 137
    let options = AgentToolOptions::default();
    assert_eq!(options.reattach_no_progress_timeout, std::time::Duration::from_secs(120));
    assert_eq!(options.reattach_max_window, None);
}

/// Row 136: the no-progress budget of a re-attach (here 3 s) starts over with every chunk
/// forwarded: 15 s after the parent's restart, a child that sends a word every 2 s is still
/// followed (and later to its result), one that waits 5 s between words was given up as
/// `no-progress`, still running.
#[test]
fn the_no_progress_budget_starts_over_with_every_chunk() {
    // parity: 136
    for (name, gap) in [("steady", 2_000), ("halting", 5_000)] {
        let answer = (1..=20).map(|n| format!("w{n}")).collect::<Vec<_>>().join(" ");
        let impatient = ScriptedModel::new()
            .step(Step::new().tool_call("write", json!({ "topic": "QUIC" })))
            .otherwise(|_| Step::new().text("Done."));
        let writer = ScriptedModel::new().step(Step::new().words(&answer, Duration::from_millis(gap)));
        let world = worker().model::<Impatient>(impatient).model::<Writer>(writer);
        let client = world.connect(&format!("/agents/impatient/{name}"));
        client.send_chat("Write about QUIC");
        assert!(world.run_until(|| !world.objects_of::<Writer>().is_empty()));
        world.advance(Duration::from_millis(gap / 2));
        world.crash(&ObjectRef::of::<Impatient>(name));
        world.advance(Duration::from_secs(15));
        let host = world.host::<Impatient>(name);
        let run = host.agent_tool_runs().expect("the runs").remove(0);
        let inspection = host.inspect_agent_tool_run(&run.run_id).expect("the registry").expect("the run");
        if name == "steady" {
            assert_eq!(inspection.info.status, RunStatus::Running, "followed");
            world.settle();
            let result = host.inspect_agent_tool_run(&run.run_id).expect("the registry").and_then(|i| i.result);
            let result = result.expect("ended");
            assert_eq!((result.status, result.summary), (RunStatus::Completed, Some(answer)), "{name}");
        } else {
            let result = inspection.result.expect("given up");
            let reason = result.reason.map(|r| serde_json::to_value(r).expect("JSON"));
            let got = (result.status, reason, result.child_still_running);
            assert_eq!(got, (RunStatus::Interrupted, Some(json!("no-progress")), Some(true)), "{name}");
        }
    }
}

/// Row 147: on the live path (no restart) the parent has no timer for its child: with the same
/// 3 s no-progress budget as above, a child that waits 5 s between words is followed to its
/// result, for as long as it streams.
#[test]
fn a_live_child_is_followed_however_long_it_pauses() {
    // parity: 147
    let answer = (1..=8).map(|n| format!("w{n}")).collect::<Vec<_>>().join(" ");
    let impatient = ScriptedModel::new()
        .step(Step::new().tool_call("write", json!({ "topic": "QUIC" })))
        .otherwise(|_| Step::new().text("Done."));
    let writer = ScriptedModel::new().step(Step::new().words(&answer, Duration::from_secs(5)));
    let world = worker().model::<Impatient>(impatient).model::<Writer>(writer);
    let reply = world.connect("/agents/impatient/live").chat("Write about QUIC");
    assert_eq!((reply.error.as_deref(), reply.text.as_str()), (None, "Done."));
    let host = world.host::<Impatient>("live");
    let run = host.agent_tool_runs().expect("the runs").remove(0);
    let result = host.inspect_agent_tool_run(&run.run_id).expect("the registry").and_then(|i| i.result);
    let result = result.expect("ended");
    assert_eq!((result.status, result.summary), (RunStatus::Completed, Some(answer)));
    assert!(ms(run.completed_at.expect("ended")) - ms(run.started_at) >= 35_000, "followed through its pauses");
}

/// Row 147: a content runaway is bounded the same way live and in recovery, by the child's own
/// `max_recovery_work` (the SDK's `maxRecoveryWork`), not by a parent timer. A child streams a
/// word a second for five minutes; its object crashes ten seconds in; the parent's inspection
/// runs its turn again, which streams on: the 41st chunk since the restart seals the run
/// `interrupted` while it is live (no other restart), the turn stops, and the parent's awaited
/// caller has the child's reason well within a minute and a half, not after five.
#[test]
fn a_runaway_after_a_restart_is_sealed_live_by_the_childs_work_bound() {
    // parity: 147
    let long = (1..=300).map(|n| format!("w{n}")).collect::<Vec<_>>().join(" ");
    let rambler = ScriptedModel::new().otherwise(move |_| Step::new().words(&long, Duration::from_secs(1)));
    let world = worker().model::<Rambler>(rambler);
    let host = world.host::<Desk>("rw");
    let result = Rc::new(RefCell::new(None));
    host.clone().spawn({
        let result = result.clone();
        async move {
            let options = RunOptions::new(json!("Ramble")).run_id("ramble-1");
            *result.borrow_mut() = Some(host.run_agent_tool::<Rambler>(options).await);
        }
    });
    assert!(world.run_until(|| !world.objects_of::<Rambler>().is_empty()));
    world.advance(Duration::from_secs(10));
    let child = world.objects_of::<Rambler>().remove(0);
    let began = world.now();
    world.crash(&child);
    world.settle();
    let result = result.borrow_mut().take().expect("the awaited caller has its result");
    assert_eq!(result.status, RunStatus::Interrupted, "{result:?}");
    let error = result.error.unwrap_or_default();
    assert!(error.contains("max_recovery_work (40)"), "{error}");
    let sealed = logged_events(&world, &child, "agent_tool:recovery:sealed");
    assert_eq!(sealed.len(), 1, "{sealed:#?}");
    assert_eq!((&sealed[0]["reason"], &sealed[0]["attempt"]), (&json!("work_budget_exceeded"), &json!(2)));
    let run = &world.host::<Desk>("rw").agent_tool_runs().expect("the runs")[0];
    assert_eq!(run.status, RunStatus::Interrupted);
    let took = run.completed_at.expect("ended").duration_since(began).expect("after the restart");
    assert!(
        (Duration::from_secs(30)..Duration::from_secs(90)).contains(&took),
        "sealed {took:?} after the restart, not 300 s"
    );
    // The stopped turn streams nothing more: the child's log ends where the bound was passed.
    let chunks = || {
        let host = world.host::<Desk>("rw");
        world.block_on(async move { host.agent_tool_chunks("ramble-1", None).await.expect("the chunks").len() })
    };
    let kept = chunks();
    world.advance(Duration::from_secs(30));
    assert_eq!(chunks(), kept);
}

/// Row 137: with the default (no window), a re-attach follows a child for as long as it
/// streams. The parent crashes a minute into a chat's run whose child sends a word every 90 s
/// (within the silence budget) for about half an hour: the restarted parent re-attaches and
/// follows it, for more than 25 minutes, to its result.
#[test]
fn a_reattach_follows_a_streaming_child_past_any_fixed_time() {
    // parity: 137
    let words: Vec<String> = (1..=20).map(|n| format!("w{n}")).collect();
    let answer = words.join(" ");
    let desk = ScriptedModel::new()
        .step(Step::new().tool_call("write", json!({ "topic": "QUIC" })))
        .otherwise(|_| Step::new().text("Done."));
    let writer = ScriptedModel::new().step(Step::new().words(&answer, Duration::from_secs(90)));
    let world = worker().model::<Desk>(desk).model::<Writer>(writer);
    let client = world.connect("/agents/desk/kai");
    client.send_chat("Write about QUIC");
    assert!(world.run_until(|| !world.objects_of::<Writer>().is_empty()));
    world.advance(Duration::from_secs(60));
    let parent = ObjectRef::of::<Desk>("kai");
    world.crash(&parent);
    let crashed_at = world.now();
    world.settle();
    let run = &world.host::<Desk>("kai").agent_tool_runs().expect("the runs")[0];
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    let reattached = logged_events(&world, &parent, "agent_tool:recovery:reattach");
    assert!(reattached.iter().any(|r| r["runId"] == run.run_id.as_str()), "re-attached: {reattached:#?}");
    let followed = run.completed_at.expect("ended").duration_since(crashed_at).expect("after the crash");
    assert!(followed > Duration::from_secs(25 * 60), "followed for {followed:?}");
    let result =
        world.host::<Desk>("kai").inspect_agent_tool_run(&run.run_id).expect("the registry").and_then(|i| i.result);
    assert_eq!(result.and_then(|r| r.summary), Some(answer));
}

/// A detached dispatch that starts nothing is an `Err`, not a handle to look into: a terminal
/// delivery is refused (the seed's "not supported for detached runs"), a tag that does not
/// serialize is invalid, and neither leaves a row.
#[test]
fn a_refused_detached_dispatch_is_an_error_and_writes_nothing() {
    let world = worker();
    let host = world.host::<Desk>("re");
    let terminal = RunOptions::new(json!("x")).run_id("t1").event_delivery(EventDelivery::Terminal);
    let refused = world.block_on({
        let host = host.clone();
        async move { host.run_agent_tool_detached::<Writer>(terminal, DetachedOptions::default()).await }
    });
    match refused {
        Err(Error::Refused(why)) => {
            assert_eq!(why, agent_tools::Refused::TerminalDeliveryDetached);
            assert!(why.to_string().contains("not supported for detached runs"), "{why}");
        }
        other => panic!("a refusal: {other:?}"),
    }
    // A map with non-string keys has no JSON form.
    let tag: std::collections::HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
    let options = RunOptions::new(json!("x")).run_id("t2");
    let invalid = world.block_on({
        let host = host.clone();
        async move { host.run_agent_tool_detached::<Writer>(options, DetachedOptions::default().on_finish(&tag)).await }
    });
    assert!(matches!(&invalid, Err(Error::Invalid(why)) if why.to_string().contains("on_finish tag")), "{invalid:?}");
    assert!(host.agent_tool_runs().expect("the runs").is_empty(), "nothing written");
}
