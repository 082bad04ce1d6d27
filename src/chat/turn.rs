//! The turn loop: ask the model, stream what it says as `UIMessageChunk`s, run the tools it
//! calls (all calls of a step at once), feed the results back, and repeat until the model stops
//! or the step limit is reached (the AI SDK's `stopWhen: stepCountIs(n)`).
//!
//! Plain async Rust over two traits, so it runs the same in a Durable Object and in a native
//! test. Cancelling a turn is dropping its future.

use std::collections::{HashMap, HashSet};

use futures::stream::{FuturesUnordered, StreamExt};
use serde_json::{json, Value};

use crate::chat::interaction::Kind;
use crate::chat::journal::{interrupted_result, Continuation, Redo, ToolResult};
pub use crate::llm::Model;
use crate::llm::{FinishReason, ModelError, ModelEvent, ModelMessage, ModelRequest, ToolCall, ToolSpec};

/// The tools a turn may call.
#[allow(async_fn_in_trait)]
pub trait ToolBox {
    /// The tools, as the model sees them.
    fn specs(&self) -> Vec<ToolSpec>;
    /// Runs one call. `order` is its position among the calls of its step. `Ok` is the result
    /// the model sees (a failure envelope is an `Ok` too); `Err` is reported as a tool error.
    async fn execute(&self, call: &ToolCall, order: usize) -> Result<Value, String>;

    /// Whether a tool call id is already spoken for outside the conversation (a parent's run
    /// registry keys runs by it). Such an id is renamed before the call is streamed or run.
    fn call_id_taken(&self, id: &str) -> bool {
        let _ = id;
        false
    }

    /// What a turn's continuation does with a call of tool `name` that was started and has no
    /// result: run it again only if that is safe (default: give the model an "interrupted"
    /// result).
    fn redo(&self, name: &str) -> Redo {
        let _ = name;
        Redo::Interrupted
    }

    /// Whether a call runs now or waits for a person (default: it runs).
    fn needs(&self, call: &ToolCall) -> Needs {
        let _ = call;
        Needs::Run
    }

    /// A call a person denied, before the turn goes on without it (default: nothing).
    async fn denied(&self, call: &ToolCall, reason: &str) {
        let _ = (call, reason);
    }
}

/// What a tool call needs before it can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Nothing: it runs.
    Run,
    /// A person's approval: the turn pauses with an approval request.
    Approval,
    /// A client to run it and send the output (a client-side tool): the turn pauses.
    Client,
}

/// The approval id of call `call_id` (the AI SDK's `approvalId`): one per call, the same after
/// a restart.
pub fn approval_id(call_id: &str) -> String {
    format!("approval-{call_id}")
}

type LocalBoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + 'a>>;

/// A [`Model`] as a trait object: the turn's code is compiled once, whatever model each agent
/// of a Worker has (a generic turn would be compiled again for every agent class).
pub trait DynModel {
    /// [`Model::step`], boxed.
    fn step_boxed<'a>(
        &'a self,
        request: &'a ModelRequest,
        on_event: &'a mut dyn FnMut(ModelEvent),
    ) -> LocalBoxFuture<'a, Result<(), ModelError>>;
}

impl<M: Model> DynModel for M {
    fn step_boxed<'a>(
        &'a self,
        request: &'a ModelRequest,
        on_event: &'a mut dyn FnMut(ModelEvent),
    ) -> LocalBoxFuture<'a, Result<(), ModelError>> {
        Box::pin(self.step(request, on_event))
    }
}

/// A [`ToolBox`] as a trait object, for the same reason.
pub trait DynToolBox {
    /// [`ToolBox::specs`].
    fn specs_dyn(&self) -> Vec<ToolSpec>;
    /// [`ToolBox::execute`], boxed.
    fn execute_boxed<'a>(&'a self, call: &'a ToolCall, order: usize) -> LocalBoxFuture<'a, Result<Value, String>>;
    /// [`ToolBox::call_id_taken`].
    fn call_id_taken_dyn(&self, id: &str) -> bool;
    /// [`ToolBox::redo`].
    fn redo_dyn(&self, name: &str) -> Redo;
    /// [`ToolBox::needs`].
    fn needs_dyn(&self, call: &ToolCall) -> Needs;
    /// [`ToolBox::denied`], boxed.
    fn denied_boxed<'a>(&'a self, call: &'a ToolCall, reason: &'a str) -> LocalBoxFuture<'a, ()>;
}

impl<T: ToolBox> DynToolBox for T {
    fn specs_dyn(&self) -> Vec<ToolSpec> {
        self.specs()
    }
    fn execute_boxed<'a>(&'a self, call: &'a ToolCall, order: usize) -> LocalBoxFuture<'a, Result<Value, String>> {
        Box::pin(self.execute(call, order))
    }
    fn call_id_taken_dyn(&self, id: &str) -> bool {
        self.call_id_taken(id)
    }
    fn redo_dyn(&self, name: &str) -> Redo {
        self.redo(name)
    }
    fn needs_dyn(&self, call: &ToolCall) -> Needs {
        self.needs(call)
    }
    fn denied_boxed<'a>(&'a self, call: &'a ToolCall, reason: &'a str) -> LocalBoxFuture<'a, ()> {
        Box::pin(self.denied(call, reason))
    }
}

/// Gives every tool call an id unique in the conversation and free in the [`ToolBox`]:
/// providers reuse ids (Workers AI numbers them per step, some servers send none, the offline
/// model restarts after a cleared chat), and a reused id would join an old run.
struct CallIds {
    used: HashSet<String>,
    step: HashMap<String, String>,
}

impl CallIds {
    fn new(history: &[ModelMessage]) -> Self {
        let used = history
            .iter()
            .flat_map(|m| match m {
                ModelMessage::Assistant { tool_calls, .. } => tool_calls.iter().map(|c| c.id.clone()).collect(),
                _ => Vec::new(),
            })
            .collect();
        Self { used, step: HashMap::new() }
    }

    fn map(&mut self, provider_id: &str, tools: &dyn DynToolBox) -> String {
        if let Some(ours) = self.step.get(provider_id) {
            return ours.clone();
        }
        let mut ours = provider_id.to_owned();
        let mut n = 1;
        while ours.is_empty() || self.used.contains(&ours) || tools.call_id_taken_dyn(&ours) {
            ours = format!("{provider_id}_{n}");
            n += 1;
        }
        self.used.insert(ours.clone());
        self.step.insert(provider_id.to_owned(), ours.clone());
        ours
    }
}

/// No tools at all.
#[cfg(test)]
pub struct NoTools;

#[cfg(test)]
impl ToolBox for NoTools {
    fn specs(&self) -> Vec<ToolSpec> {
        Vec::new()
    }
    async fn execute(&self, call: &ToolCall, _order: usize) -> Result<Value, String> {
        Err(format!("unknown tool {:?}", call.name))
    }
}

/// How a turn runs.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnOptions {
    /// The id of the assistant message it streams.
    pub message_id: String,
    /// The most model steps it takes.
    pub max_steps: usize,
    /// Whether the turn streams its `start` chunk (a continuation whose log kept it does not).
    pub emit_start: bool,
    /// Where a turn cut short goes on from (its journal's [`Continuation`]), or `None` for a
    /// new turn.
    pub resume: Option<Continuation>,
}

#[cfg(test)]
impl TurnOptions {
    /// A new turn writing `message_id`, at most `max_steps` model steps.
    pub fn new(message_id: impl Into<String>, max_steps: usize) -> Self {
        Self { message_id: message_id.into(), max_steps, emit_start: true, resume: None }
    }
}

/// Keeps what a turn has done as it happens (the journal of [`crate::chat::journal`]); each
/// call comes in the same synchronous step as the chunk it accounts for.
pub trait Record {
    /// The model finished step `step` with `text` and `calls`.
    fn step(&self, step: usize, text: &str, calls: &[ToolCall]);
    /// Call `call_id` has its result.
    fn result(&self, call_id: &str, result: &ToolResult);
    /// `call` waits for a person (its approval request, if any, was just streamed).
    fn asks(&self, call: &ToolCall, kind: Kind) {
        let _ = (call, kind);
    }
    /// `call_id` starts running.
    fn started(&self, call_id: &str) {
        let _ = call_id;
    }
}

/// Keeps nothing: an agent-tool run's turn, which its run's own recovery heals.
pub struct NoRecord;

impl Record for NoRecord {
    fn step(&self, _: usize, _: &str, _: &[ToolCall]) {}
    fn result(&self, _: &str, _: &ToolResult) {}
}

/// How a turn ended.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnOutcome {
    /// The model stopped (or the step limit was reached).
    Completed {
        /// The last step's finish reason.
        finish_reason: FinishReason,
        /// Steps taken.
        steps: usize,
    },
    /// The model failed; an `error` chunk was streamed.
    Failed(String),
    /// Calls wait for a person: the stream ended, the turn goes on once they are answered.
    Paused {
        /// Steps taken.
        steps: usize,
    },
}

/// Runs calls of one step at once (a call that must not run again gets its "interrupted"
/// result at once), streaming and recording each result as it comes. Returns the results in
/// the order of `calls`.
async fn run_calls(
    tools: &dyn DynToolBox,
    calls: &[(ToolCall, Redo)],
    emit: &dyn Fn(Value),
    record: &dyn Record,
) -> Vec<Value> {
    let mut results: Vec<Option<Value>> = vec![None; calls.len()];
    let mut running: FuturesUnordered<_> = calls
        .iter()
        .enumerate()
        .map(|(order, (call, redo))| async move {
            let result = match redo {
                Redo::Run => match {
                    record.started(&call.id);
                    tools.execute_boxed(call, order)
                }
                .await
                {
                    Ok(output) => ToolResult::Output(output),
                    Err(error) => ToolResult::Error(error),
                },
                Redo::Interrupted => interrupted_result(&call.name),
            };
            (order, result)
        })
        .collect();
    while let Some((order, result)) = running.next().await {
        let call = &calls[order].0;
        match &result {
            ToolResult::Output(output) => {
                emit(json!({ "type": "tool-output-available", "toolCallId": call.id, "output": output }))
            }
            ToolResult::Error(error) => {
                emit(json!({ "type": "tool-output-error", "toolCallId": call.id, "errorText": error }))
            }
        }
        record.result(&call.id, &result);
        results[order] = Some(result.for_model());
    }
    results.into_iter().map(|r| r.unwrap_or(Value::Null)).collect()
}

/// Runs a turn over `history`, streaming `UIMessageChunk`s through `emit` and keeping each
/// finished step and each result through `record`. With [`TurnOptions::resume`] it goes on
/// from where a cut turn's journal left it: the calls without a result first, then the next
/// model step.
pub async fn run_turn(
    model: &dyn DynModel,
    tools: &dyn DynToolBox,
    history: Vec<ModelMessage>,
    options: &TurnOptions,
    emit: &dyn Fn(Value),
    record: &dyn Record,
) -> TurnOutcome {
    let specs = tools.specs_dyn();
    let mut messages = history;
    if options.emit_start {
        emit(json!({ "type": "start", "messageId": options.message_id }));
        // The calls a person denied show it first, as the AI SDK streams a denial (the client's
        // own copy of the part says only that it answered).
        for (call, _) in options.resume.iter().flat_map(|r| &r.denied) {
            emit(json!({ "type": "tool-output-denied", "toolCallId": call.id }));
        }
    }
    let mut finish_reason = FinishReason::Stop;
    let mut first = 0;
    if let Some(resume) = &options.resume {
        messages.extend(resume.messages.iter().cloned());
        first = resume.next_step;
        for (call, reason) in &resume.denied {
            tools.denied_boxed(call, reason).await;
        }
        if resume.answered {
            emit(json!({ "type": "finish-step" }));
            emit(json!({ "type": "finish", "finishReason": finish_reason.as_str() }));
            return TurnOutcome::Completed { finish_reason, steps: first };
        }
        let outputs = run_calls(tools, &resume.pending, emit, record).await;
        for ((call, _), output) in resume.pending.iter().zip(outputs) {
            messages.push(ModelMessage::Tool { call_id: call.id.clone(), name: call.name.clone(), output });
        }
        if let Some(reason) = &resume.refused {
            emit(json!({ "type": "error", "errorText": reason }));
            return TurnOutcome::Failed(reason.clone());
        }
        if first > 0 {
            emit(json!({ "type": "finish-step" }));
        }
        if !resume.awaiting.is_empty() {
            emit(json!({ "type": "finish", "finishReason": "tool-calls" }));
            return TurnOutcome::Paused { steps: first };
        }
    }
    let mut ids = CallIds::new(&messages);
    for step in first..options.max_steps.max(1) {
        emit(json!({ "type": "start-step" }));
        let text_id = format!("text-{step}");
        let mut text = String::new();
        let mut text_open = false;
        let mut calls: Vec<ToolCall> = Vec::new();
        let mut failed_calls: Vec<(ToolCall, String)> = Vec::new();
        ids.step.clear();
        let request = ModelRequest { messages: messages.clone(), tools: specs.clone() };
        let result = model
            .step_boxed(&request, &mut |event| match event {
                ModelEvent::TextDelta(delta) => {
                    if !text_open {
                        text_open = true;
                        emit(json!({ "type": "text-start", "id": text_id }));
                    }
                    emit(json!({ "type": "text-delta", "id": text_id, "delta": delta }));
                    text.push_str(&delta);
                }
                ModelEvent::ToolCallStart { id, name } => {
                    let id = ids.map(&id, tools);
                    emit(json!({ "type": "tool-input-start", "toolCallId": id, "toolName": name }));
                }
                ModelEvent::ToolCallDelta { id, delta } => {
                    let id = ids.map(&id, tools);
                    emit(json!({ "type": "tool-input-delta", "toolCallId": id, "inputTextDelta": delta }));
                }
                ModelEvent::ToolCallReady(Ok(mut call)) => {
                    call.id = ids.map(&call.id, tools);
                    emit(json!({ "type": "tool-input-available", "toolCallId": call.id,
                                       "toolName": call.name, "input": call.input }));
                    calls.push(call);
                }
                ModelEvent::ToolCallReady(Err(mut bad)) => {
                    bad.id = ids.map(&bad.id, tools);
                    let error = format!("Invalid JSON arguments for tool {}: {}", bad.name, bad.error);
                    emit(json!({ "type": "tool-input-error", "toolCallId": bad.id, "toolName": bad.name,
                                       "input": bad.raw, "errorText": error }));
                    failed_calls.push((ToolCall { id: bad.id, name: bad.name, input: json!({}) }, error));
                }
                ModelEvent::Finish(reason) => finish_reason = reason,
            })
            .await;
        if text_open {
            emit(json!({ "type": "text-end", "id": text_id }));
        }
        if let Err(e) = result {
            let message = e.to_string();
            emit(json!({ "type": "error", "errorText": message }));
            return TurnOutcome::Failed(message);
        }
        let all_calls: Vec<ToolCall> = calls.iter().chain(failed_calls.iter().map(|(c, _)| c)).cloned().collect();
        record.step(step, &text, &all_calls);
        for (call, error) in &failed_calls {
            record.result(&call.id, &ToolResult::Error(error.clone()));
        }
        if all_calls.is_empty() {
            emit(json!({ "type": "finish-step" }));
            emit(json!({ "type": "finish", "finishReason": finish_reason.as_str() }));
            return TurnOutcome::Completed { finish_reason, steps: step + 1 };
        }
        let mut to_run: Vec<(ToolCall, Redo)> = Vec::new();
        let mut asked = false;
        for call in calls {
            match tools.needs_dyn(&call) {
                Needs::Run => to_run.push((call, Redo::Run)),
                Needs::Approval => {
                    let approval = approval_id(&call.id);
                    emit(json!({ "type": "tool-approval-request", "approvalId": approval, "toolCallId": call.id }));
                    record.asks(&call, Kind::Approval);
                    asked = true;
                }
                Needs::Client => {
                    record.asks(&call, Kind::Client);
                    asked = true;
                }
            }
        }
        let outputs = run_calls(tools, &to_run, emit, record).await;
        emit(json!({ "type": "finish-step" }));
        if asked {
            emit(json!({ "type": "finish", "finishReason": "tool-calls" }));
            return TurnOutcome::Paused { steps: step + 1 };
        }
        messages.push(ModelMessage::Assistant { text, tool_calls: all_calls });
        for ((call, _), output) in to_run.iter().zip(outputs) {
            messages.push(ModelMessage::Tool { call_id: call.id.clone(), name: call.name.clone(), output });
        }
        for (call, error) in failed_calls {
            messages.push(ModelMessage::Tool {
                call_id: call.id,
                name: call.name,
                output: json!(format!("Error: {error}")),
            });
        }
    }
    emit(json!({ "type": "finish", "finishReason": finish_reason.as_str() }));
    TurnOutcome::Completed { finish_reason, steps: options.max_steps.max(1) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::message::MessageBuilder;
    use crate::llm::{offline, ModelError};
    use std::cell::{Cell, RefCell};
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// The offline model, without pauses.
    struct Offline;
    impl Model for Offline {
        async fn step(&self, request: &ModelRequest, on_event: &mut dyn FnMut(ModelEvent)) -> Result<(), ModelError> {
            for e in offline::respond(request, 6) {
                on_event(e);
            }
            Ok(())
        }
    }

    struct Failing;
    impl Model for Failing {
        async fn step(&self, _: &ModelRequest, on_event: &mut dyn FnMut(ModelEvent)) -> Result<(), ModelError> {
            on_event(ModelEvent::TextDelta("partial".into()));
            Err(ModelError::Http { status: 500, id: "e1".into() })
        }
    }

    /// Always calls the tool again.
    struct Looping;
    impl Model for Looping {
        async fn step(&self, request: &ModelRequest, on_event: &mut dyn FnMut(ModelEvent)) -> Result<(), ModelError> {
            let n = request.messages.len();
            on_event(ModelEvent::ToolCallReady(Ok(ToolCall {
                id: format!("c{n}"),
                name: "research".into(),
                input: json!({"query": "x"}),
            })));
            on_event(ModelEvent::Finish(FinishReason::ToolCalls));
            Ok(())
        }
    }

    struct YieldOnce(bool);
    impl Future for YieldOnce {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            if self.0 {
                Poll::Ready(())
            } else {
                self.0 = true;
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
    }

    #[derive(Default)]
    struct Research {
        in_flight: Cell<usize>,
        max_in_flight: Cell<usize>,
        orders: RefCell<Vec<usize>>,
    }
    impl ToolBox for Research {
        fn specs(&self) -> Vec<ToolSpec> {
            vec![ToolSpec {
                name: "research".into(),
                description: "Research one topic".into(),
                input_schema: json!({"type": "object", "properties": {"query": {"type": "string"}}}),
            }]
        }
        async fn execute(&self, call: &ToolCall, order: usize) -> Result<Value, String> {
            self.in_flight.set(self.in_flight.get() + 1);
            self.max_in_flight.set(self.max_in_flight.get().max(self.in_flight.get()));
            self.orders.borrow_mut().push(order);
            YieldOnce(false).await;
            self.in_flight.set(self.in_flight.get() - 1);
            let q = call.input["query"].as_str().unwrap_or_default();
            if q == "fail" {
                return Err("no such topic".into());
            }
            Ok(json!(format!("notes on {q}")))
        }
    }

    fn run<M: Model, T: ToolBox>(
        model: &M,
        tools: &T,
        user: &str,
        max_steps: usize,
    ) -> (TurnOutcome, Vec<Value>, Value) {
        let chunks = RefCell::new(Vec::new());
        let builder = RefCell::new(MessageBuilder::new("m"));
        let emit = |v: Value| {
            builder.borrow_mut().apply(&v);
            chunks.borrow_mut().push(v);
        };
        let options = TurnOptions::new("msg-1", max_steps);
        let history = vec![ModelMessage::User(user.into())];
        let outcome = futures::executor::block_on(run_turn(model, tools, history, &options, &emit, &NoRecord));
        let message = builder.borrow().message();
        (outcome, chunks.into_inner(), message)
    }

    #[test]
    fn two_tool_calls_in_one_step_run_concurrently_then_the_model_answers() {
        let tools = Research::default();
        let (outcome, chunks, message) = run(&Offline, &tools, "Research HTTP/3 and gRPC", 5);
        assert_eq!(outcome, TurnOutcome::Completed { finish_reason: FinishReason::Stop, steps: 2 });
        assert_eq!(tools.max_in_flight.get(), 2, "both calls of the step were in flight at once");
        assert_eq!(*tools.orders.borrow(), vec![0, 1]);
        let types: Vec<&str> = chunks.iter().map(|c| c["type"].as_str().unwrap()).collect();
        assert_eq!(types[0], "start");
        assert_eq!(types.iter().filter(|t| **t == "tool-input-available").count(), 2);
        assert_eq!(types.iter().filter(|t| **t == "tool-output-available").count(), 2);
        assert_eq!(types.last(), Some(&"finish"));
        let parts = message["parts"].as_array().unwrap();
        let tool_parts: Vec<&Value> = parts.iter().filter(|p| p["type"] == "tool-research").collect();
        assert_eq!(tool_parts.len(), 2);
        assert!(tool_parts.iter().all(|p| p["state"] == "output-available"));
        assert_eq!(
            crate::chat::message::text_of(&message),
            "Here is what I found:\n- HTTP/3: notes on HTTP/3\n- gRPC: notes on gRPC"
        );
    }

    #[test]
    fn a_failing_tool_is_a_tool_error_not_a_failed_turn() {
        let (outcome, chunks, message) = run(&Offline, &Research::default(), "Research fail", 5);
        assert!(matches!(outcome, TurnOutcome::Completed { .. }));
        assert!(chunks.iter().any(|c| c["type"] == "tool-output-error" && c["errorText"] == "no such topic"));
        assert!(crate::chat::message::text_of(&message).contains("fail: Error: no such topic"));
    }

    #[test]
    fn a_model_failure_ends_the_turn_with_an_error_part() {
        let (outcome, chunks, message) = run(&Failing, &NoTools, "hi", 5);
        assert_eq!(
            outcome,
            TurnOutcome::Failed(
                "model provider answered HTTP 500 (error e1; the details are in the Worker's log)".into()
            )
        );
        let types: Vec<&str> = chunks.iter().map(|c| c["type"].as_str().unwrap()).collect();
        assert_eq!(types, vec!["start", "start-step", "text-start", "text-delta", "text-end", "error"]);
        assert_eq!(crate::chat::message::text_of(&message), "partial");
    }

    /// Calls `research` with the same provider id in every step, as Workers AI does.
    struct SameIds;
    impl Model for SameIds {
        async fn step(&self, request: &ModelRequest, on_event: &mut dyn FnMut(ModelEvent)) -> Result<(), ModelError> {
            if request.messages.len() > 3 {
                on_event(ModelEvent::TextDelta("done".into()));
                on_event(ModelEvent::Finish(FinishReason::Stop));
                return Ok(());
            }
            on_event(ModelEvent::ToolCallStart { id: "call_0".into(), name: "research".into() });
            on_event(ModelEvent::ToolCallReady(Ok(ToolCall {
                id: "call_0".into(),
                name: "research".into(),
                input: json!({"query": "x"}),
            })));
            on_event(ModelEvent::Finish(FinishReason::ToolCalls));
            Ok(())
        }
    }

    struct TakenIds(Research);
    impl ToolBox for TakenIds {
        fn specs(&self) -> Vec<ToolSpec> {
            self.0.specs()
        }
        async fn execute(&self, call: &ToolCall, order: usize) -> Result<Value, String> {
            self.0.execute(call, order).await
        }
        fn call_id_taken(&self, id: &str) -> bool {
            id == "call_0_1"
        }
    }

    #[test]
    fn reused_provider_call_ids_are_renamed() {
        let (_, chunks, message) = run(&SameIds, &TakenIds(Research::default()), "x", 5);
        let ids: Vec<&str> = chunks
            .iter()
            .filter(|c| c["type"] == "tool-input-available")
            .map(|c| c["toolCallId"].as_str().unwrap())
            .collect();
        assert_eq!(ids, vec!["call_0", "call_0_2"], "the second step's call was renamed, skipping a taken id");
        let starts: Vec<&str> = chunks
            .iter()
            .filter(|c| c["type"] == "tool-input-start")
            .map(|c| c["toolCallId"].as_str().unwrap())
            .collect();
        assert_eq!(starts, ids, "every chunk of a call uses its new id");
        let parts = message["parts"].as_array().unwrap();
        assert_eq!(parts.iter().filter(|p| p["type"] == "tool-research").count(), 2, "two distinct tool parts");
    }

    #[test]
    fn a_continuation_shows_each_denial_first_then_goes_on() {
        let denied = ToolCall::new("c1", "research", json!({"query": "x"}));
        let resume = Continuation {
            messages: vec![ModelMessage::Assistant { text: String::new(), tool_calls: vec![denied.clone()] }],
            pending: Vec::new(),
            awaiting: Vec::new(),
            denied: vec![(denied, "no".into())],
            next_step: 1,
            answered: false,
            refused: None,
        };
        let chunks = RefCell::new(Vec::new());
        let emit = |v: Value| chunks.borrow_mut().push(v);
        let options = TurnOptions { resume: Some(resume), ..TurnOptions::new("m", 3) };
        let history = vec![ModelMessage::User("Research x".into())];
        futures::executor::block_on(run_turn(&Offline, &NoTools, history, &options, &emit, &NoRecord));
        let chunks = chunks.into_inner();
        assert_eq!(chunks[0]["type"], "start");
        assert_eq!(chunks[1], json!({"type": "tool-output-denied", "toolCallId": "c1"}));
        assert_eq!(chunks.iter().filter(|c| c["type"] == "tool-output-denied").count(), 1);
        assert_eq!(chunks.last().unwrap()["type"], "finish");
    }

    #[test]
    fn the_step_limit_stops_a_model_that_keeps_calling_tools() {
        let tools = Research::default();
        let (outcome, chunks, _) = run(&Looping, &tools, "x", 3);
        assert_eq!(outcome, TurnOutcome::Completed { finish_reason: FinishReason::ToolCalls, steps: 3 });
        assert_eq!(chunks.iter().filter(|c| c["type"] == "start-step").count(), 3);
        assert_eq!(tools.orders.borrow().len(), 3);
    }
}
