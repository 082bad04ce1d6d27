//! A parent's own chat turn survives a crash at any point: the kit crashes the parent between
//! every two durable steps of a turn with two agent tools and an ordinary tool, and checks that
//! the turn ends once, each result reaches the model once, nothing is lost, the stored message is
//! what a reconnecting client shows, and no tool part is left open.

use std::cell::Cell;
use std::time::Duration;

use agent_tools::model::ModelRequest;
use agent_tools::prelude::*;
use agent_tools::testing::{Faults, ObjectRef, ScriptedModel, Simulation, Step, World, DROPPED};
use agent_tools::{ChatRecovery, InterruptedTurn};
use serde_json::{json, Value};

#[derive(Default)]
pub struct Researcher;
impl Agent for Researcher {}

thread_local! {
    /// How many times the ordinary tool ran (it is not safe to repeat), and returned.
    static COUNTED: Cell<usize> = const { Cell::new(0) };
    static RETURNED: Cell<usize> = const { Cell::new(0) };
    /// Whether the planner declines to continue a cut turn.
    static DECLINE: Cell<bool> = const { Cell::new(false) };
    /// Whether the ordinary tool panics.
    static PANIC: Cell<bool> = const { Cell::new(false) };
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct CountInput {
    text: String,
}

struct Count;
impl Tool<Planner> for Count {
    type Input = CountInput;
    type Output = usize;
    fn name(&self) -> &str {
        "count"
    }
    fn description(&self) -> &str {
        "Counts words."
    }
    async fn execute(&self, ctx: &ToolContext<'_, Planner>, input: CountInput) -> Result<usize, Error> {
        COUNTED.with(|c| c.set(c.get() + 1));
        ctx.host().sleep(std::time::Duration::from_millis(30)).await;
        if PANIC.with(Cell::get) {
            panic!("boom in the count tool");
        }
        RETURNED.with(|c| c.set(c.get() + 1));
        Ok(input.text.split_whitespace().count())
    }
}

#[derive(Default)]
pub struct Planner;
impl Agent for Planner {
    fn tools(&self) -> Tools<Self> {
        Tools::new().agent(AgentTool::of::<Researcher>("research", "Research a topic.")).tool(Count)
    }
    fn on_chat_recovery(&self, _turn: &InterruptedTurn) -> ChatRecovery {
        match DECLINE.with(Cell::get) {
            true => ChatRecovery::Decline("not continued by this agent".into()),
            false => ChatRecovery::Continue,
        }
    }
}

agent_tools::durable_object!(Planner, unchecked);
agent_tools::durable_object!(Researcher, unchecked);

/// The planner's model: three calls in its first step, then one line per result, slowly (a
/// request-driven script, so a step run again says the same).
fn planner_model(request: &ModelRequest) -> Step {
    let results: Vec<String> = request
        .messages
        .iter()
        .filter_map(|m| match m {
            agent_tools::model::ModelMessage::Tool { name, output, .. } => Some(format!("{name}={output}")),
            _ => None,
        })
        .collect();
    if results.is_empty() {
        return Step::new()
            .text("Looking.")
            .tool_call("research", json!({ "query": "HTTP/3" }))
            .tool_call("research", json!({ "query": "gRPC" }))
            .tool_call("count", json!({ "text": "one two three" }));
    }
    Step::new().words(&format!("Found: {}", results.join(" ; ")), Duration::from_millis(10))
}

fn world() -> World {
    COUNTED.with(|c| c.set(0));
    RETURNED.with(|c| c.set(0));
    World::new()
        .route::<Planner>()
        .agent::<Researcher>()
        .model::<Planner>(ScriptedModel::new().otherwise(planner_model))
        .model::<Researcher>(
            ScriptedModel::new().otherwise(|_| Step::new().words("notes on the topic", Duration::from_millis(20))),
        )
}

fn text_of(message: &Value) -> String {
    let parts = message["parts"].as_array().into_iter().flatten();
    parts.filter(|p| p["type"] == "text").filter_map(|p| p["text"].as_str()).collect()
}

fn tool_parts(message: &Value) -> Vec<Value> {
    message["parts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["type"].as_str().is_some_and(|t| t.starts_with("tool-")))
        .cloned()
        .collect()
}

/// The turn's invariants once it ended: one user and one assistant message, every tool part
/// closed, each result in the final text once, the client's reply equal to the stored message.
fn check_ended(world: &World, client: &agent_tools::testing::Client, request_id: &str, at: &str) -> Value {
    assert!(world.run_until(|| client.reply(request_id).is_some_and(|r| r.done)), "{at}: the turn never ended");
    world.settle();
    let stored = world.get("/agents/planner/p/get-messages");
    let messages: Vec<Value> = serde_json::from_slice(stored.body()).expect("messages");
    let roles: Vec<&str> = messages.iter().map(|m| m["role"].as_str().unwrap_or("?")).collect();
    assert_eq!(roles, ["user", "assistant"], "{at}: {messages:#?}");
    let answer = &messages[1];
    for part in tool_parts(answer) {
        assert_ne!(part["state"], "input-available", "{at}: a tool part left open: {part:#}");
        assert_ne!(part["state"], "input-streaming", "{at}: a tool part left open: {part:#}");
    }
    let reply = client.reply(request_id).expect("a reply");
    assert_eq!(reply.message["parts"], answer["parts"], "{at}: the client shows what is stored");
    assert!(!client.is_recovering(), "{at}: still shown as recovering");
    answer.clone()
}

#[test]
fn a_turn_crashed_at_every_step_ends_once_with_every_result() {
    // How many events an uncrashed turn takes, to crash at each.
    let (steps, baseline) = {
        let world = world();
        let client = world.connect("/agents/planner/p");
        let start = world.steps();
        let id = client.send_chat("Research HTTP/3 and gRPC, and count");
        let answer = check_ended(&world, &client, &id, "no crash");
        (world.steps() - start, text_of(&answer))
    };
    assert!(baseline.contains("research=\"notes on the topic\""), "{baseline}");
    assert!(baseline.contains("count=3"), "{baseline}");
    let mut continued = 0;
    for crash_at in 1..steps {
        let world = world();
        let client = world.connect("/agents/planner/p");
        let start = world.steps();
        let id = client.send_chat("Research HTTP/3 and gRPC, and count");
        world.run_until(|| world.steps() - start >= crash_at);
        world.crash(&ObjectRef::of::<Planner>("p"));
        let at = format!("crashed after {crash_at} of {steps} steps");
        let answer = check_ended(&world, &client, &id, &at);
        let text = text_of(&answer);
        assert_eq!(text.matches("Found:").count(), 1, "{at}: glued: {text}");
        assert_eq!(text.matches("research=").count(), 2, "{at}: {text}");
        // The ordinary tool ran at most once; if it was cut, the model was told so.
        let counted = COUNTED.with(Cell::get);
        assert!(counted <= 1, "{at}: count ran {counted} times");
        assert!(text.contains("count=3") || text.contains("interrupted") || counted == 0, "{at}: {text}");
        // A result the tool returned was kept in the same step: the model got it, not "interrupted".
        if RETURNED.with(Cell::get) == 1 {
            assert!(text.contains("count=3"), "{at}: the kept result reached the model: {text}");
        }
        if text != baseline {
            continued += 1;
        }
    }
    assert!(continued > 0, "some crash cut the ordinary tool, whose call the model was told was interrupted");
}

#[test]
fn a_turn_cut_with_no_client_connected_is_continued_by_the_alarm() {
    let world = world();
    let client = world.connect("/agents/planner/p");
    let id = client.send_chat("Research HTTP/3 and gRPC, and count");
    world.advance(Duration::from_millis(60));
    client.close();
    world.crash(&ObjectRef::of::<Planner>("p"));
    // Nobody comes back: the alarm wakes the planner and the turn ends.
    world.advance(Duration::from_secs(60));
    let stored = world.get("/agents/planner/p/get-messages");
    let messages: Vec<Value> = serde_json::from_slice(stored.body()).expect("messages");
    assert_eq!(messages.len(), 2, "{messages:#?}");
    let text = text_of(&messages[1]);
    assert_eq!(text.matches("research=").count(), 2, "{text}");
    assert!(tool_parts(&messages[1]).iter().all(|p| p["state"] != "input-available"));
    let _ = id;
}

#[test]
fn a_declined_turn_ends_with_the_reason_and_closes_its_tool_parts() {
    DECLINE.with(|d| d.set(true));
    let world = world();
    let client = world.connect("/agents/planner/p");
    let id = client.send_chat("Research HTTP/3 and gRPC, and count");
    world.advance(Duration::from_millis(15));
    world.crash(&ObjectRef::of::<Planner>("p"));
    let ended = world.run_until(|| client.reply(&id).is_some_and(|r| r.done));
    DECLINE.with(|d| d.set(false));
    assert!(ended);
    let reply = client.reply(&id).expect("a reply");
    assert_eq!(reply.error.as_deref(), Some("not continued by this agent"));
    world.settle();
    let stored = world.get("/agents/planner/p/get-messages");
    let messages: Vec<Value> = serde_json::from_slice(stored.body()).expect("messages");
    assert_eq!(messages[1]["metadata"]["error"], "not continued by this agent");
    let parts = tool_parts(&messages[1]);
    assert_eq!(parts.len(), 3, "{messages:#?}");
    assert!(parts.iter().all(|p| p["state"] == "output-available"), "{parts:#?}");
    assert!(parts.iter().any(|p| p["output"]["status"] == "interrupted"), "{parts:#?}");
    assert_eq!(text_of(&messages[1]).matches("Found:").count(), 0, "not continued: {:#}", messages[1]);
}

#[test]
fn a_turn_that_crashes_its_instance_every_time_stops_after_the_bound() {
    let world = world();
    let client = world.connect("/agents/planner/p");
    client.send_chat("Research HTTP/3 and gRPC, and count");
    client.close();
    let parent = ObjectRef::of::<Planner>("p");
    world.advance(Duration::from_millis(25));
    // Each continuation begins with the alarm (no client) and is cut 25 ms in.
    for _ in 0..5 {
        world.crash(&parent);
        world.advance(Duration::from_secs(5));
    }
    world.settle();
    let stored = world.get("/agents/planner/p/get-messages");
    let messages: Vec<Value> = serde_json::from_slice(stored.body()).expect("messages");
    assert_eq!(messages.len(), 2, "{messages:#?}");
    let error = messages[1]["metadata"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("interrupted 4 times"), "{:#}", messages[1]);
    assert!(tool_parts(&messages[1]).iter().all(|p| p["state"] == "output-available"));
}

#[test]
fn a_notice_that_comes_during_a_turn_is_shown_after_its_answer() {
    let world = world();
    let client = world.connect("/agents/planner/p");
    let id = client.send_chat("Research HTTP/3 and gRPC, and count");
    world.advance(Duration::from_millis(5));
    let host = world.host::<Planner>("p");
    let detached = world.block_on(async move {
        let options = RunOptions::new(json!("QUIC")).run_id("bg");
        host.run_agent_tool_detached::<Researcher>(options, DetachedOptions::default().notify()).await
    });
    assert!(detached.is_ok(), "{detached:?}");
    assert!(world.run_until(|| client.reply(&id).is_some_and(|r| r.done)));
    world.settle();
    let stored = world.get("/agents/planner/p/get-messages");
    let messages: Vec<Value> = serde_json::from_slice(stored.body()).expect("messages");
    let ids: Vec<&str> = messages.iter().map(|m| m["id"].as_str().unwrap_or("?")).collect();
    let answer = ids.iter().position(|i| i.starts_with("assistant_")).expect("the answer");
    let notice = ids.iter().position(|i| i.starts_with("detached-finish:")).expect("the notice");
    assert_eq!(messages[0]["role"], "user");
    assert_eq!(answer, 1, "the answer follows its question: {ids:?}");
    assert!(notice > answer, "the notice comes after the answer: {ids:?}");
    // Every client holds the same order.
    let late = world.connect("/agents/planner/p");
    world.settle();
    let order = |m: &[Value]| m.iter().map(|m| m["id"].clone()).collect::<Vec<_>>();
    assert_eq!(order(&late.messages()), order(&messages));
    assert_eq!(order(&client.messages()), order(&messages));
}

#[test]
fn a_panicking_tool_resets_the_instance_and_the_turn_goes_on_without_it() {
    PANIC.with(|p| p.set(true));
    let world = world();
    let client = world.connect("/agents/planner/p");
    let id = client.send_chat("Research HTTP/3 and gRPC, and count");
    let ended = world.run_until(|| client.reply(&id).is_some_and(|r| r.done));
    PANIC.with(|p| p.set(false));
    assert!(ended, "the turn ended");
    assert!(world.logs().iter().any(|l| l.text.contains("panicked (boom in the count tool)")));
    // The client stayed connected (a reset keeps the sockets), was told, and got the rest.
    assert_eq!(client.reconnects(), 0);
    assert!(client.frames().iter().any(|f| f["type"] == "cf_agent_chat_recovering" && f["recovering"] == true));
    let answer = check_ended(&world, &client, &id, "a panicking tool");
    let text = text_of(&answer);
    assert_eq!(text.matches("research=").count(), 2, "both runs' results reached the model: {text}");
    assert!(text.contains("count={") && text.contains("interrupted"), "the model was told: {text}");
    assert_eq!(COUNTED.with(Cell::get), 1, "the panicking tool was not run again");
}

#[test]
fn seeded_schedules_with_crashes_hibernations_and_drops_end_every_turn_once() {
    let faults = Faults::none().crash(0.01).hibernate(0.01).drop_client(0.01).until(Duration::from_secs(3));
    let injected = Simulation::new(|w| {
        COUNTED.with(|c| c.set(0));
        w.route::<Planner>()
            .agent::<Researcher>()
            .model::<Planner>(ScriptedModel::new().otherwise(planner_model))
            .model::<Researcher>(
            ScriptedModel::new().otherwise(|_| Step::new().words("notes on the topic", Duration::from_millis(20))),
        )
    })
    .faults(faults)
    .schedules(150)
    .check(|world| {
        let stored = world.get("/agents/planner/p/get-messages");
        let messages: Vec<Value> = serde_json::from_slice(stored.body()).map_err(|e| e.to_string())?;
        let roles: Vec<&str> = messages.iter().map(|m| m["role"].as_str().unwrap_or("?")).collect();
        if roles != ["user", "assistant"] {
            return Err(format!("one question, one answer: {roles:?}"));
        }
        let text = text_of(&messages[1]);
        let ended_with_error = messages[1]["metadata"]["error"].is_string();
        if !ended_with_error && (text.matches("Found:").count() != 1 || text.matches("research=").count() != 2) {
            return Err(format!("each result reached the model once, in one answer: {text}"));
        }
        if COUNTED.with(Cell::get) > 1 {
            return Err("the ordinary tool ran twice".to_owned());
        }
        Ok(())
    })
    .run(|world| {
        let client = world.connect("/agents/planner/p");
        let id = client.send_chat("Research HTTP/3 and gRPC, and count");
        // A message the connection took with it is said so; the user sends it again.
        world.run_until(|| client.reply(&id).is_some_and(|r| r.done));
        if client.reply(&id).and_then(|r| r.error).is_some_and(|e| e.starts_with(DROPPED)) {
            client.send_chat("Research HTTP/3 and gRPC, and count");
        }
    });
    assert!(injected > 0, "the schedules injected faults");
}

#[test]
fn a_message_sent_as_the_agent_comes_back_waits_for_the_cut_turn() {
    let world = world();
    let client = world.connect("/agents/planner/p");
    client.send_chat("Research HTTP/3 and gRPC, and count");
    world.advance(Duration::from_millis(120));
    // Evicted with its sockets kept: the new instance's first event is this client's next message.
    world.hibernate(&ObjectRef::of::<Planner>("p"));
    let second = client.send_chat("Research QUIC and TLS, and count");
    assert!(world.run_until(|| client.reply(&second).is_some_and(|r| r.done)));
    world.settle();
    let stored = world.get("/agents/planner/p/get-messages");
    let messages: Vec<Value> = serde_json::from_slice(stored.body()).expect("messages");
    let roles: Vec<&str> = messages.iter().map(|m| m["role"].as_str().unwrap_or("?")).collect();
    assert_eq!(roles, ["user", "assistant", "user", "assistant"], "{messages:#?}");
    for answer in [&messages[1], &messages[3]] {
        let text = text_of(answer);
        assert_eq!(text.matches("Found:").count(), 1, "{text}");
        assert!(tool_parts(answer).iter().all(|p| p["state"] == "output-available"), "{answer:#}");
    }
    // The second turn ran after the first ended: its model saw the first turn's results, so this
    // script answered with them at once, calling no tool again.
    assert!(tool_parts(&messages[3]).is_empty(), "{:#}", messages[3]);
}

thread_local! {
    /// Whether the researcher's model panics.
    static CHILD_PANICS: Cell<bool> = const { Cell::new(false) };
}

#[test]
fn a_child_whose_run_panics_every_time_still_ends_the_parents_turn() {
    CHILD_PANICS.with(|p| p.set(true));
    let world = World::new()
        .route::<Planner>()
        .agent::<Researcher>()
        .model::<Planner>(ScriptedModel::new().otherwise(planner_model))
        .model::<Researcher>(ScriptedModel::new().otherwise(|_| {
            if CHILD_PANICS.with(Cell::get) {
                panic!("the researcher's model panicked");
            }
            Step::new().words("notes on the topic", Duration::from_millis(20))
        }));
    let client = world.connect("/agents/planner/p");
    let id = client.send_chat("Research HTTP/3 and gRPC, and count");
    let ended = world.run_until(|| client.reply(&id).is_some_and(|r| r.done));
    CHILD_PANICS.with(|p| p.set(false));
    assert!(ended, "the turn ended");
    world.settle();
    assert!(world.logs().iter().any(|l| l.text.contains("panicked (the researcher's model panicked)")));
    let stored = world.get("/agents/planner/p/get-messages");
    let messages: Vec<Value> = serde_json::from_slice(stored.body()).expect("messages");
    assert_eq!(messages.len(), 2, "{messages:#?}");
    assert!(tool_parts(&messages[1]).iter().all(|p| p["state"] == "output-available"), "{:#}", messages[1]);
    // Every run ended (never left running), each with a failure the model could read.
    for run in world.host::<Planner>("p").agent_tool_runs().expect("the runs") {
        assert!(!run.status.is_live(), "{run:?}");
    }
}

#[derive(Default)]
pub struct Fragile;
impl Agent for Fragile {
    async fn on_request(&self, host: &AgentHost<Self>, req: HttpRequest) -> HttpResponse {
        if req.uri().path().ends_with("/boom") {
            panic!("on_request panicked");
        }
        host.default_response(&req)
    }
}
agent_tools::durable_object!(Fragile, unchecked);

#[test]
fn a_panic_in_on_request_answers_that_request_with_an_error_and_the_agent_goes_on() {
    let world = World::new().route::<Fragile>();
    let answer = world.post("/agents/fragile/f/boom", &json!({}));
    assert!(answer.status().is_server_error(), "{:?}", answer.status());
    assert!(world.logs().iter().any(|l| l.text.contains("panicked (on_request panicked)")));
    // The next request is served by a fresh instance.
    assert_eq!(world.get("/agents/fragile/f").status(), 200);
}

#[derive(Default)]
pub struct Budgeted;
impl Agent for Budgeted {
    fn validate_state_change(&self, next: &Value) -> Result<(), Error> {
        match next["budget"].as_u64() {
            Some(1..=10) => Ok(()),
            _ => Err("the research budget is 1 to 10 runs".into()),
        }
    }
    async fn on_state_changed(&self, host: &AgentHost<Self>, state: &Value, source: &agent_tools::StateSource) {
        let who = match source {
            agent_tools::StateSource::Server => "server",
            _ => "client",
        };
        host.log(&format!("state changed by the {who}: {state}"));
    }
    async fn call(&self, host: &AgentHost<Self>, method: &str, _args: Vec<Value>) -> Result<Value, Error> {
        #[derive(Default, serde::Serialize, serde::Deserialize)]
        struct State {
            budget: u64,
        }
        match method {
            "spend" => {
                let mut state: State = host.agent_state()?;
                state.budget = state.budget.saturating_sub(1);
                host.set_agent_state(&state).await?;
                Ok(json!(state.budget))
            }
            _ => Err(Error::NotFound(agent_tools::NotFound::Method(method.to_owned()))),
        }
    }
}
agent_tools::durable_object!(Budgeted, unchecked);

#[test]
fn agent_state_is_validated_kept_broadcast_and_survives_a_restart() {
    let world = World::new().route::<Budgeted>();
    let tab = world.connect("/agents/budgeted/b");
    let other = world.connect("/agents/budgeted/b");
    assert_eq!(tab.state(), None, "never set: no state frame");
    // A client's change: validated, kept, sent to the other tab, then the hook.
    tab.set_state(&json!({ "budget": 3 }));
    world.settle();
    assert_eq!(other.state(), Some(json!({ "budget": 3 })));
    assert!(world.logs().iter().any(|l| l.text == "state changed by the client: {\"budget\":3}"));
    // A refused change: the sender hears why, nothing is kept, nobody else hears of it.
    tab.set_state(&json!({ "budget": 99 }));
    world.settle();
    assert_eq!(tab.state_errors(), ["the research budget is 1 to 10 runs"]);
    assert_eq!(other.state(), Some(json!({ "budget": 3 })));
    // The agent's own change reaches every client.
    assert_eq!(tab.call("spend", vec![]).expect("spent"), json!(2));
    world.settle();
    assert_eq!((tab.state(), other.state()), (Some(json!({ "budget": 2 })), Some(json!({ "budget": 2 }))));
    // Kept across a restart, and sent right after the identity to a client that connects.
    world.crash(&ObjectRef::of::<Budgeted>("b"));
    let late = world.connect("/agents/budgeted/b");
    world.settle();
    assert_eq!(late.state(), Some(json!({ "budget": 2 })));
    let frames = late.frames();
    let identity = frames.iter().position(|f| f["type"] == "cf_agent_identity").expect("an identity");
    assert_eq!(frames[identity]["stateFollows"], true);
    assert_eq!(frames[identity + 1]["type"], "cf_agent_state", "the state follows the identity");
    // A malformed frame is refused with a clear error, the socket stays open.
    late.send(&json!({ "type": "cf_agent_state" }));
    world.settle();
    assert_eq!(late.state_errors(), ["cf_agent_state needs a \"state\""]);
    assert!(late.is_open());
}

/// A child that keeps its own state while it runs.
#[derive(Default)]
pub struct Stateful;
impl Agent for Stateful {
    async fn run(&self, turn: &Turn<Self>) -> Result<TurnOutput, Error> {
        turn.host().set_agent_state(&json!({ "phase": "reading" })).await?;
        let output = turn.chat().await?;
        turn.host().set_agent_state(&json!({ "phase": "done" })).await?;
        Ok(output)
    }
}
agent_tools::durable_object!(Stateful, unchecked);

#[derive(Default)]
pub struct Delegator;
impl Agent for Delegator {
    fn tools(&self) -> Tools<Self> {
        Tools::new().agent(AgentTool::of::<Stateful>("delegate", "Delegate."))
    }
}
agent_tools::durable_object!(Delegator, unchecked);

#[test]
fn a_childs_state_is_visible_through_drill_in() {
    let world = World::new()
        .route::<Delegator>()
        .agent::<Stateful>()
        .model::<Delegator>(ScriptedModel::new().otherwise(|request| {
            let answered = request.messages.iter().any(|m| matches!(m, agent_tools::model::ModelMessage::Tool { .. }));
            match answered {
                true => Step::new().text("done"),
                false => Step::new().tool_call("delegate", json!({ "query": "QUIC" })),
            }
        }))
        .model::<Stateful>(ScriptedModel::new().otherwise(|_| Step::new().words("notes", Duration::from_millis(5))));
    let client = world.connect("/agents/delegator/d");
    client.chat("go");
    let run_id = world.host::<Delegator>("d").agent_tool_runs().expect("the runs")[0].run_id.clone();
    let drilled = world.connect(&format!("/agents/delegator/d/sub/stateful/{run_id}"));
    world.settle();
    assert_eq!(drilled.state(), Some(json!({ "phase": "done" })), "the child's state, through the parent's gate");
    assert_eq!(client.state(), None, "the parent's own state is its own");
}

#[derive(Default)]
pub struct Unconfigured;
impl Agent for Unconfigured {
    fn model(
        &self,
        _env: &Env,
        _input: Option<&Value>,
    ) -> Result<impl agent_tools::model::Model, agent_tools::model::ModelError> {
        Err::<agent_tools::model::OfflineModel, _>(agent_tools::model::ModelError::Config(
            "no model is configured".into(),
        ))
    }
}
agent_tools::durable_object!(Unconfigured, unchecked);

#[test]
fn turns_that_cannot_begin_do_not_keep_waiting() {
    let world = World::new().route::<Unconfigured>();
    let client = world.connect("/agents/unconfigured/u");
    for _ in 0..agent_tools::limits::MAX_WAITING_TURNS + 8 {
        let reply = client.chat("hello");
        assert!(reply.error.as_deref().is_some_and(|e| e.contains("no model is configured")), "{reply:?}");
    }
}
