//! A person in the loop: a tool call waits for approval, or for a client-side tool's output,
//! durably. The turn pauses (its stream ends with the question), the first answer wins, the turn
//! goes on into the same message with the approved call run, the denial or the client's output
//! given to the model, and all of it survives a crash at any point, a second tab, a timeout and
//! a new message.

use std::cell::Cell;
use std::time::Duration;

use agent_tools::model::{ModelMessage, ModelRequest};
use agent_tools::prelude::*;
use agent_tools::testing::{Client, Faults, ObjectRef, ScriptedModel, Simulation, Step, World, DROPPED};
use serde_json::{json, Value};

thread_local! {
    /// How many times `publish` ran, and how many child runs started.
    static PUBLISHED: Cell<usize> = const { Cell::new(0) };
    /// Which answer won, across a simulation's schedules: (approvals, denials).
    static WON: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
    /// The desk's approval timeout (s), if it has one.
    static TIMEOUT: Cell<Option<u64>> = const { Cell::new(None) };
}

#[derive(Default)]
pub struct Editor;
impl Agent for Editor {}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct PublishInput {
    title: String,
}

struct Publish;
impl Tool<Desk> for Publish {
    type Input = PublishInput;
    type Output = String;
    fn name(&self) -> &str {
        "publish"
    }
    fn description(&self) -> &str {
        "Publishes an article."
    }
    fn needs_approval(&self, input: &PublishInput) -> bool {
        // Drafts go out without asking.
        !input.title.starts_with("draft:")
    }
    async fn execute(&self, ctx: &ToolContext<'_, Desk>, input: PublishInput) -> Result<String, Error> {
        PUBLISHED.with(|c| c.set(c.get() + 1));
        // Long enough for a crash to cut it.
        ctx.host().sleep(Duration::from_millis(20)).await;
        Ok(format!("published {}", input.title))
    }
}

#[derive(Default)]
pub struct Desk;
impl Agent for Desk {
    fn tools(&self) -> Tools<Self> {
        Tools::new().tool(Publish).agent(AgentTool::of::<Editor>("edit", "Edits an article.").needs_approval()).client(
            ClientTool::new("confirm_title", "Asks the user to confirm a title.").input_schema(json!({
                "type": "object", "properties": { "title": { "type": "string" } }, "required": ["title"]
            })),
        )
    }
    fn agent_tool_options(&self, _env: &Env) -> AgentToolOptions {
        match TIMEOUT.with(Cell::get) {
            Some(seconds) => AgentToolOptions::default().approval_timeout(Duration::from_secs(seconds)),
            None => AgentToolOptions::default(),
        }
    }
}

agent_tools::durable_object!(Desk, unchecked);
agent_tools::durable_object!(Editor, unchecked);

/// The desk's model: for "publish X" it calls publish with X (and, for "edit", the editor too);
/// once it has results, one line per result.
fn desk_model(request: &ModelRequest) -> Step {
    let results: Vec<String> = request
        .messages
        .iter()
        .rev()
        .take_while(|m| !matches!(m, ModelMessage::User(_)))
        .filter_map(|m| match m {
            ModelMessage::Tool { name, output, .. } => Some(format!("{name}={output}")),
            _ => None,
        })
        .collect();
    if !results.is_empty() {
        return Step::new().words(&format!("Done: {}", results.join(" ; ")), Duration::from_millis(5));
    }
    let last = request.messages.iter().rev().find_map(|m| match m {
        ModelMessage::User(text) => Some(text.clone()),
        _ => None,
    });
    let text = last.unwrap_or_default();
    if let Some(rest) = text.strip_prefix("ask ") {
        // A client-side tool: the agent's own, or one the client declared.
        let (tool, title) = rest.split_once(' ').unwrap_or((rest, ""));
        return Step::new().text("Asking.").tool_call(tool, json!({ "title": title }));
    }
    let title = text.trim_start_matches("publish ").trim_start_matches("edit ").to_owned();
    // Streamed word by word, so a crash can cut the asking step itself.
    let mut step =
        Step::new().words("On it.", Duration::from_millis(20)).tool_call("publish", json!({ "title": title }));
    if text.starts_with("edit ") {
        step = step.tool_call("edit", json!({ "article": title }));
    }
    step
}

fn world() -> World {
    PUBLISHED.with(|c| c.set(0));
    TIMEOUT.with(|t| t.set(None));
    World::new()
        .route::<Desk>()
        .agent::<Editor>()
        .model::<Desk>(ScriptedModel::new().otherwise(desk_model))
        .model::<Editor>(ScriptedModel::new().otherwise(|_| Step::new().words("edited", Duration::from_millis(5))))
}

fn stored(world: &World) -> Vec<Value> {
    let response = world.get("/agents/desk/d/get-messages");
    serde_json::from_slice(response.body()).expect("messages")
}

fn text_of(message: &Value) -> String {
    let parts = message["parts"].as_array().into_iter().flatten();
    parts.filter(|p| p["type"] == "text").filter_map(|p| p["text"].as_str()).collect()
}

fn part<'a>(message: &'a Value, tool: &str) -> &'a Value {
    let parts = message["parts"].as_array().expect("parts");
    parts.iter().find(|p| p["type"] == format!("tool-{tool}")).unwrap_or_else(|| panic!("no {tool} part: {message:#}"))
}

/// A client that asked the desk to publish, and the call that waits for its approval.
fn asked_to_publish(world: &World) -> (Client, String) {
    let client = world.connect("/agents/desk/d");
    client.chat("publish Rust 2027");
    let (call, _) = client.approval_requests().remove(0);
    (client, call)
}

#[test]
fn an_approved_call_runs_after_the_answer_and_the_turn_goes_on_in_the_same_message() {
    // parity: 4
    let world = world();
    let client = world.connect("/agents/desk/d");
    let reply = client.chat("publish Rust 2027");
    assert!(reply.error.is_none(), "{reply:?}");
    // The stream ended with the question; nothing ran.
    assert_eq!(part(&reply.message, "publish")["state"], "approval-requested", "{:#}", reply.message);
    assert_eq!(PUBLISHED.with(Cell::get), 0);
    let asked = client.approval_requests();
    assert_eq!(asked.len(), 1, "{asked:?}");
    let (call, approval) = &asked[0];
    assert_eq!(approval, &format!("approval-{call}"));
    world.settle();
    let messages = stored(&world);
    assert_eq!(part(&messages[1], "publish")["state"], "approval-requested", "stored as asked");

    client.answer_approval(call, true);
    world.settle();
    assert_eq!(PUBLISHED.with(Cell::get), 1, "approved: it ran, once");
    let messages = stored(&world);
    assert_eq!(messages.len(), 2, "the turn went on in its message: {messages:#?}");
    let answer = &messages[1];
    assert_eq!(part(answer, "publish")["state"], "output-available", "{answer:#}");
    assert_eq!(part(answer, "publish")["approval"]["approved"], true);
    assert_eq!(text_of(answer), "On it.Done: publish=\"published Rust 2027\"");
    let shown = client.last_answer().expect("the client shows the answer");
    assert_eq!(shown["parts"], answer["parts"], "the client shows what is stored");
    assert!(client.approval_requests().is_empty());
    assert!(client.errors().is_empty(), "{:?}", client.errors());
}

#[test]
fn a_denied_call_never_runs_and_the_model_is_told_why() {
    let world = world();
    let (client, call) = asked_to_publish(&world);
    client.send(&json!({ "type": "cf_agent_tool_approval", "toolCallId": call, "approved": false,
                         "reason": "not before Friday", "autoContinue": true }));
    world.settle();
    assert_eq!(PUBLISHED.with(Cell::get), 0);
    let answer = &stored(&world)[1];
    let publish = part(answer, "publish");
    assert_eq!(publish["state"], "output-denied", "{answer:#}");
    assert_eq!(
        publish["approval"],
        json!({ "id": format!("approval-{call}"), "approved": false, "reason": "not before Friday" })
    );
    let text = text_of(answer);
    assert!(text.contains("\"status\":\"denied\""), "{text}");
    assert!(text.contains("not before Friday"), "the reason reached the model: {text}");
}

#[test]
fn a_call_that_needs_no_approval_by_its_input_runs_at_once() {
    let world = world();
    let client = world.connect("/agents/desk/d");
    let reply = client.chat("publish draft: notes");
    assert_eq!(PUBLISHED.with(Cell::get), 1);
    assert_eq!(part(&reply.message, "publish")["state"], "output-available");
    assert!(reply.text.contains("published draft: notes"), "{}", reply.text);
}

#[test]
fn the_first_answer_wins_and_a_second_tab_hears_what_it_said() {
    let world = world();
    let first = world.connect("/agents/desk/d");
    first.chat("publish Rust 2027");
    let second = world.connect("/agents/desk/d");
    world.settle();
    // The second tab sees the question too (its transcript, loaded at connect).
    assert_eq!(second.approval_requests(), first.approval_requests());
    let (call, _) = first.approval_requests().remove(0);
    second.answer_approval(&call, false);
    first.answer_approval(&call, true);
    world.settle();
    assert_eq!(PUBLISHED.with(Cell::get), 0, "the denial came first");
    assert_eq!(first.errors(), [format!("tool call \"{call}\" was already answered: denied")]);
    assert!(second.errors().is_empty());
    let answer = &stored(&world)[1];
    assert_eq!(part(answer, "publish")["state"], "output-denied");
    // Both tabs show the stored message.
    for tab in [&first, &second] {
        assert_eq!(tab.last_answer().expect("shown")["parts"], answer["parts"]);
    }
    // An answer for a call that does not wait is refused with a clear error, and changes nothing.
    first.answer_approval("no-such-call", true);
    world.settle();
    assert_eq!(
        first.errors().last().map(String::as_str),
        Some("no tool call \"no-such-call\" is waiting for an answer")
    );
    assert_eq!(&stored(&world)[1], answer);
}

#[test]
fn a_pending_approval_survives_a_crash_and_a_reconnect() {
    let world = world();
    let (client, call) = asked_to_publish(&world);
    client.close();
    world.crash(&ObjectRef::of::<Desk>("d"));
    world.advance(Duration::from_millis(120_000 / 4));
    let back = world.connect("/agents/desk/d");
    world.settle();
    assert_eq!(back.approval_requests().len(), 1, "still asked after the restart");
    back.answer_approval(&call, true);
    world.settle();
    assert_eq!(PUBLISHED.with(Cell::get), 1);
    let answer = &stored(&world)[1];
    assert!(text_of(answer).contains("published Rust 2027"), "{answer:#}");
    assert_eq!(back.last_answer().expect("shown")["parts"], answer["parts"]);
}

#[test]
fn a_crash_at_any_point_after_the_answer_publishes_at_most_once_and_ends_the_turn_once() {
    // How many events an uncrashed continuation takes, to crash at each.
    let steps = {
        let world = world();
        let (client, call) = asked_to_publish(&world);
        let start = world.steps();
        client.answer_approval(&call, true);
        world.settle();
        world.steps() - start
    };
    let mut cut = 0;
    for crash_at in 0..steps {
        let world = world();
        let (client, call) = asked_to_publish(&world);
        let start = world.steps();
        client.answer_approval(&call, true);
        world.run_until(|| world.steps() - start >= crash_at);
        world.crash(&ObjectRef::of::<Desk>("d"));
        world.advance(Duration::from_secs(30));
        world.settle();
        let at = format!("crashed {crash_at} of {steps} steps after the answer");
        let messages = stored(&world);
        assert_eq!(messages.len(), 2, "{at}: {messages:#?}");
        let answer = &messages[1];
        let published = PUBLISHED.with(Cell::get);
        assert!(published <= 1, "{at}: published {published} times");
        let publish = part(answer, "publish");
        let text = text_of(answer);
        // Answered before the crash or not at all: never left half-way.
        match publish["state"].as_str() {
            Some("approval-requested") => {
                assert_eq!(published, 0, "{at}");
                // The answer was lost with the instance before it was stored: asking again works.
                client.answer_approval(&call, true);
                world.settle();
                assert_eq!(PUBLISHED.with(Cell::get), 1, "{at}");
            }
            Some("output-available") => {
                assert_eq!(text.matches("Done:").count(), 1, "{at}: {text}");
                let output = publish["output"].to_string();
                cut += usize::from(output.contains("interrupted"));
                assert!(
                    output.contains("published Rust 2027") && published == 1 || output.contains("interrupted"),
                    "{at}: {output} (published {published})"
                );
            }
            other => panic!("{at}: the publish part is {other:?}: {answer:#}"),
        }
        let answer = &stored(&world)[1];
        assert_eq!(text_of(answer).matches("Done:").count(), 1, "{at}: {answer:#}");
        assert!(client.approval_requests().is_empty(), "{at}");
    }
    assert!(cut > 0 && cut < steps as usize, "some crashes cut publish ({cut} of {steps}), and some came after it");
}

#[test]
fn an_unanswered_approval_is_denied_when_its_time_runs_out() {
    let world = world();
    TIMEOUT.with(|t| t.set(Some(60)));
    let client = world.connect("/agents/desk/d");
    client.chat("publish Rust 2027");
    client.close();
    world.advance(Duration::from_secs(61));
    world.settle();
    assert_eq!(PUBLISHED.with(Cell::get), 0);
    let answer = &stored(&world)[1];
    let publish = part(answer, "publish");
    assert_eq!(publish["state"], "output-denied", "{answer:#}");
    assert_eq!(publish["approval"]["reason"], "nobody answered within 60 s");
    assert!(text_of(answer).contains("nobody answered within 60 s"), "the model was told: {answer:#}");
}

#[test]
fn an_agent_tool_that_needs_approval_dispatches_its_child_only_once_approved() {
    let world = world();
    let client = world.connect("/agents/desk/d");
    let reply = client.chat("edit Rust 2027");
    assert_eq!(part(&reply.message, "edit")["state"], "approval-requested");
    assert!(world.objects_of::<Editor>().is_empty(), "no child before the approval");
    let asked = client.approval_requests();
    assert_eq!(asked.len(), 2, "publish and edit: {asked:?}");
    // One answer is not enough: the turn goes on once both are answered.
    client.answer_approval(&asked[1].0, true);
    world.settle();
    assert!(world.objects_of::<Editor>().is_empty(), "still waiting for the other answer");
    assert_eq!(stored(&world).len(), 2);
    client.answer_approval(&asked[0].0, false);
    world.settle();
    assert_eq!(world.objects_of::<Editor>().len(), 1, "approved: the child ran");
    let answer = &stored(&world)[1];
    assert_eq!(part(answer, "edit")["state"], "output-available", "{answer:#}");
    assert_eq!(part(answer, "publish")["state"], "output-denied");
    let text = text_of(answer);
    assert!(text.contains("edit=\"edited\""), "{text}");
    assert_eq!(PUBLISHED.with(Cell::get), 0);
}

#[test]
fn a_new_message_answers_a_question_left_open() {
    let world = world();
    let (client, call) = asked_to_publish(&world);
    let reply = client.chat("publish draft: other");
    assert!(reply.text.contains("published draft: other"), "{}", reply.text);
    world.settle();
    let messages = stored(&world);
    assert_eq!(messages.len(), 4, "{messages:#?}");
    let publish = part(&messages[1], "publish");
    assert_eq!(publish["state"], "output-denied");
    assert_eq!(publish["approval"]["reason"], "a new message was sent before it was answered");
    // The late answer is refused: its question was closed.
    client.answer_approval(&call, true);
    world.settle();
    assert_eq!(
        client.errors(),
        [format!("tool call \"{call}\" was already answered: denied (a new message was sent before it was answered)")]
    );
    assert_eq!(PUBLISHED.with(Cell::get), 1, "only the draft");
}

/// The call of a client-side tool that waits in the last answer: `(toolCallId, toolName)`.
fn client_call(client: &Client) -> (String, String) {
    let message = client.last_answer().expect("an answer");
    let parts = message["parts"].as_array().expect("parts");
    let waiting = parts.iter().find(|p| p["state"] == "input-available").unwrap_or_else(|| panic!("{message:#}"));
    let tool = waiting["type"].as_str().unwrap().trim_start_matches("tool-");
    (waiting["toolCallId"].as_str().unwrap().to_owned(), tool.to_owned())
}

#[test]
fn a_client_side_tool_pauses_the_turn_until_the_browser_answers() {
    // parity: 4
    let world = world();
    let client = world.connect("/agents/desk/d");
    let reply = client.chat("ask confirm_title Rust 2027");
    assert!(reply.error.is_none(), "{reply:?}");
    let (call, tool) = client_call(&client);
    assert_eq!(tool, "confirm_title");
    world.settle();
    assert_eq!(part(&stored(&world)[1], "confirm_title")["state"], "input-available", "it waits, stored");
    // A restart while it waits loses nothing.
    world.crash(&ObjectRef::of::<Desk>("d"));
    world.advance(Duration::from_secs(10));
    client.add_tool_output(&call, &tool, &json!({ "confirmed": "Rust 2027!" }));
    world.settle();
    let answer = &stored(&world)[1];
    assert_eq!(part(answer, "confirm_title")["state"], "output-available", "{answer:#}");
    assert_eq!(text_of(answer), "Asking.Done: confirm_title={\"confirmed\":\"Rust 2027!\"}");
    assert_eq!(client.last_answer().expect("shown")["parts"], answer["parts"]);
    // A second output for the same call is refused with what the first said.
    client.add_tool_output(&call, &tool, &json!("again"));
    world.settle();
    assert_eq!(client.errors(), [format!("tool call \"{call}\" was already answered: answered with an output")]);
}

#[test]
fn a_client_declared_tool_is_offered_to_the_model_and_answered_the_same_way() {
    let world = world();
    let client = world.connect("/agents/desk/d");
    let tools = json!({ "clientTools": [{ "name": "pick_colour", "description": "Asks the user for a colour.",
                                          "parameters": { "type": "object", "properties": { "title": { "type": "string" } } } }] });
    let id = client.send_chat_with("ask pick_colour banner", tools);
    client.wait_reply(&id);
    let (call, tool) = client_call(&client);
    assert_eq!(tool, "pick_colour");
    client.send(&json!({ "type": "cf_agent_tool_result", "toolCallId": call, "toolName": tool, "output": null,
                         "state": "output-error", "errorText": "the user closed the picker", "autoContinue": true }));
    world.settle();
    let answer = &stored(&world)[1];
    assert_eq!(part(answer, "pick_colour")["state"], "output-error");
    assert!(text_of(answer).contains("pick_colour=\"Error: the user closed the picker\""), "{answer:#}");
    // A declaration that is not usable fails its request, with what is wrong.
    let bad = json!({ "clientTools": [{ "name": "no spaces" }] });
    let id = client.send_chat_with("hello", bad);
    let reply = client.wait_reply(&id);
    assert_eq!(
        reply.error.as_deref(),
        Some("init.body.clientTools[0].name must be 1 to 64 characters of [a-zA-Z0-9_-]")
    );
}

#[test]
fn an_output_without_auto_continue_is_kept_and_the_next_message_goes_on_from_it() {
    let world = world();
    let client = world.connect("/agents/desk/d");
    client.chat("ask confirm_title Rust 2027");
    let (call, tool) = client_call(&client);
    client.send(&json!({ "type": "cf_agent_tool_result", "toolCallId": call, "toolName": tool,
                         "output": "yes", "autoContinue": false }));
    world.settle();
    let messages = stored(&world);
    assert_eq!(part(&messages[1], "confirm_title")["state"], "output-available", "kept and shown");
    assert_eq!(text_of(&messages[1]), "Asking.", "not continued");
    let reply = client.chat("publish draft: x");
    assert!(reply.text.contains("published draft: x"), "{}", reply.text);
}

#[test]
fn seeded_schedules_with_crashes_while_an_approval_waits_and_two_answers_racing() {
    let faults = Faults::none().crash(0.02).hibernate(0.01).drop_client(0.02).until(Duration::from_secs(3));
    let injected = Simulation::new(|w| {
        PUBLISHED.with(|c| c.set(0));
        TIMEOUT.with(|t| t.set(None));
        w.route::<Desk>()
            .agent::<Editor>()
            .model::<Desk>(ScriptedModel::new().otherwise(desk_model))
            .model::<Editor>(ScriptedModel::new().otherwise(|_| Step::new().words("edited", Duration::from_millis(5))))
    })
    .faults(faults)
    .schedules(100)
    .check(|world| {
        let messages = stored(world);
        let Some(answer) = messages.iter().rev().find(|m| m["role"] == "assistant") else {
            return Err(format!("no answer: {messages:#?}"));
        };
        let parts = answer["parts"].as_array().cloned().unwrap_or_default();
        let Some(publish) = parts.iter().find(|p| p["type"] == "tool-publish") else {
            return Err(format!("no publish call: {answer:#}"));
        };
        let published = PUBLISHED.with(Cell::get);
        let output = publish["output"].to_string();
        let (approved, denied) = WON.with(Cell::get);
        match publish["state"].as_str() {
            Some("output-denied") => WON.with(|w| w.set((approved, denied + 1))),
            _ => WON.with(|w| w.set((approved + 1, denied))),
        }
        match publish["state"].as_str() {
            Some("output-denied") if published == 0 => {}
            Some("output-available") if output.contains("published Rust 2027") && published == 1 => {}
            Some("output-available") if output.contains("interrupted") && published <= 1 => {}
            other => return Err(format!("publish ended as {other:?} with {output}, run {published} times")),
        }
        // A turn the bound stopped ends with its reason instead of an answer.
        let stopped = answer["metadata"]["error"].is_string();
        if !stopped && text_of(answer).matches("Done:").count() != 1 {
            return Err(format!("the turn went on once: {answer:#}"));
        }
        Ok(())
    })
    .run(|world| {
        let (mut a, b) = (world.connect("/agents/desk/d"), world.connect("/agents/desk/d"));
        // A message or an answer a drop or a crash took with it is sent again, as a person would.
        for _ in 0..6 {
            let id = a.send_chat("publish Rust 2027");
            world.run_until(|| a.reply(&id).is_some_and(|r| r.done));
            if !a.reply(&id).and_then(|r| r.error).is_some_and(|e| e.starts_with(DROPPED)) {
                break;
            }
        }
        // The last question was answered (a message sent again closes the one before it).
        let settled = |world: &World| {
            let messages = stored(world);
            let last = messages.iter().rev().find(|m| m["role"] == "assistant").cloned().unwrap_or_default();
            last["parts"].as_array().cloned().unwrap_or_default().iter().any(|p| {
                p["type"] == "tool-publish" && matches!(p["state"].as_str(), Some("output-available" | "output-denied"))
            })
        };
        // The person answers whenever the question shows (again if a crash lost the answer), and
        // reloads the page when it shows nothing.
        for _ in 0..8 {
            world.run_until(|| !a.approval_requests().is_empty() || settled(world));
            if settled(world) {
                break;
            }
            match a.approval_requests().first().cloned() {
                Some((call, _)) => {
                    a.answer_approval(&call, true);
                    b.answer_approval(&call, false);
                    world.run_until(|| a.approval_requests().is_empty());
                }
                None => a = world.connect("/agents/desk/d"),
            }
        }
    });
    assert!(injected > 0, "the schedules injected faults");
    let (approved, denied) = WON.with(Cell::get);
    assert!(approved > 0 && denied > 0, "either answer won in some schedule: {approved} approvals, {denied} denials");
}

#[test]
fn a_crash_at_any_point_before_the_question_asks_it_once() {
    // How many events the asking turn takes, to crash at each.
    let steps = {
        let world = world();
        let client = world.connect("/agents/desk/d");
        let start = world.steps();
        client.chat("publish Rust 2027");
        world.settle();
        world.steps() - start
    };
    for crash_at in 0..steps {
        let world = world();
        let client = world.connect("/agents/desk/d");
        let start = world.steps();
        let id = client.send_chat("publish Rust 2027");
        world.run_until(|| world.steps() - start >= crash_at);
        world.crash(&ObjectRef::of::<Desk>("d"));
        world.advance(Duration::from_secs(30));
        world.settle();
        let at = format!("crashed {crash_at} of {steps} steps into the asking turn");
        let messages = stored(&world);
        if messages.len() < 2 {
            // The message was lost with the instance before it was stored: the user sends it again.
            assert!(client.reply(&id).is_some_and(|r| r.error.is_some()), "{at}: {messages:#?}");
            continue;
        }
        assert_eq!(messages.len(), 2, "{at}: {messages:#?}");
        assert_eq!(part(&messages[1], "publish")["state"], "approval-requested", "{at}: {:#}", messages[1]);
        assert_eq!(PUBLISHED.with(Cell::get), 0, "{at}: nothing ran before the answer");
        // A fresh page shows the one question; answered, the call runs once.
        let page = world.connect("/agents/desk/d");
        world.settle();
        let asked = page.approval_requests();
        assert_eq!(asked.len(), 1, "{at}: {asked:?}");
        page.answer_approval(&asked[0].0, true);
        world.settle();
        assert_eq!(PUBLISHED.with(Cell::get), 1, "{at}");
        assert_eq!(text_of(&stored(&world)[1]).matches("Done:").count(), 1, "{at}");
    }
}
