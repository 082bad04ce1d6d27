//! A browser client as the stock libraries behave: `useAgent`'s socket (which reconnects by
//! itself unless the server closed it with a final 4xxx code), `useAgentChat`'s chat requests,
//! RPC calls, and `useAgentToolEvents`'s state, kept by the Rust port of the stock reducer.
//! Each `agent-tool-event` frame is checked against the contract as it arrives.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::{Rc, Weak};

use serde_json::{json, Value};

use super::exec::TEST;
use super::io::KitSocket;
use super::reducer::{Client as Reducer, Outcome};
use super::world::WorldInner;
use crate::chat::message::{text_of, user_text, MessageBuilder};
use crate::error::Unavailable;

/// How long a dropped client waits before it reconnects (on the virtual clock; PartySocket's
/// first delay is about a second).
pub const RECONNECT: std::time::Duration = std::time::Duration::from_secs(1);
pub(crate) const RECONNECT_MS: u64 = RECONNECT.as_millis() as u64;

/// One run as the stock client's state holds it (`useAgentToolEvents`' `AgentToolRunState`),
/// typed: what [`Client::run_states`] lists. [`Client::runs`] is the same state as JSON, byte for
/// byte the stock hook's, for comparing with a browser's.
///
/// ```
/// # use agent_tools::prelude::*;
/// use agent_tools::testing::{ScriptedModel, Step, World};
/// use serde_json::json;
/// # #[derive(Default)] pub struct Researcher;
/// # impl Agent for Researcher {}
/// # #[derive(Default)] pub struct Planner;
/// # impl Agent for Planner {
/// #     fn tools(&self) -> Tools<Self> { Tools::new().agent(AgentTool::of::<Researcher>("research", "Research.")) }
/// # }
/// # agent_tools::durable_object!(Planner, unchecked);
/// # agent_tools::durable_object!(Researcher, unchecked);
/// # fn main() {
/// let world = World::new()
///     .route::<Planner>()
///     .agent::<Researcher>()
///     .model::<Planner>(ScriptedModel::new().step(Step::new().tool_call("research", json!({ "query": "QUIC" }))))
///     .model::<Researcher>(ScriptedModel::new().otherwise(|_| Step::new().text("QUIC runs over UDP.")));
/// let client = world.connect("/agents/planner/alice");
/// client.wait_reply(&client.send_chat("Research QUIC"));
/// let runs = client.run_states();
/// assert_eq!((runs[0].agent_type.as_str(), runs[0].status), ("Researcher", RunStatus::Completed));
/// assert_eq!(runs[0].summary.as_deref(), Some("QUIC runs over UDP."));
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct RunState {
    /// Run id.
    pub run_id: String,
    /// Child class.
    pub agent_type: String,
    /// The tool call that dispatched it (none for an unbound run).
    #[serde(default)]
    pub parent_tool_call_id: Option<String>,
    /// Its input's preview.
    #[serde(default)]
    pub input_preview: Option<String>,
    /// Its order among its siblings.
    #[serde(default)]
    pub order: Option<i64>,
    /// Its UI metadata.
    #[serde(default)]
    pub display: Option<Value>,
    /// `running` until its terminal frame (`finished` is [`crate::RunStatus::Completed`]).
    pub status: crate::RunStatus,
    /// The child's message parts the client built from the run's chunks.
    #[serde(default)]
    pub parts: Vec<Value>,
    /// Its summary, once completed.
    #[serde(default)]
    pub summary: Option<String>,
    /// Its error (or an abort's reason).
    #[serde(default)]
    pub error: Option<String>,
    /// Why it was interrupted.
    #[serde(default)]
    pub reason: Option<crate::InterruptedReason>,
    /// Whether the child still ran when the parent stopped waiting.
    #[serde(default)]
    pub child_still_running: Option<bool>,
    /// Its latest progress (stamped with the client's clock, as the stock hook does).
    #[serde(default)]
    pub progress: Option<crate::ProgressSnapshot>,
    /// Its milestones, by sequence.
    #[serde(default)]
    pub milestones: Vec<crate::Milestone>,
}

/// A chat response as the client assembled it from its stream.
///
/// ```
/// # use agent_tools::prelude::*;
/// use agent_tools::testing::{ScriptedModel, Step, World};
/// # #[derive(Default)] pub struct Planner;
/// # impl Agent for Planner {}
/// # agent_tools::durable_object!(Planner, unchecked);
/// # fn main() {
/// let failing = ScriptedModel::new().step(Step::new().text("Let me").fail("provider down"));
/// let world = World::new().route::<Planner>().model::<Planner>(failing);
/// let client = world.connect("/agents/planner/alice");
/// let reply = client.wait_reply(&client.send_chat("Hi"));
/// assert_eq!(reply.text, "Let me", "what streamed before the failure stays");
/// assert!(reply.error.is_some_and(|e| e.contains("provider down")));
/// # }
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ChatReply {
    /// The assistant message (`UIMessage` JSON).
    pub message: Value,
    /// Its text parts, joined.
    pub text: String,
    /// The stream's error, if it ended with one.
    pub error: Option<String>,
    /// Whether the stream ended.
    pub done: bool,
}

/// How a reply or an RPC answer that a dropped connection took with it begins.
pub const DROPPED: &str = "the connection dropped";

#[derive(Default)]
struct Response {
    /// Sent by this client (not a stream it only watches).
    sent: bool,
    /// The agent ended it (not a drop).
    ended_by_server: bool,
    builder: Option<MessageBuilder>,
    error: Option<String>,
    done: bool,
    /// Acknowledged a resume: live frames are not its until the replay is complete.
    replaying: bool,
    /// The replay starts the message afresh (the stock client replaces the message with the
    /// stream's id).
    fresh: bool,
}

/// What a client's socket delivers to, and what it keeps.
pub(crate) struct Inbox {
    pub(crate) path: String,
    world: Weak<WorldInner>,
    socket: RefCell<Option<Rc<KitSocket>>>,
    frames: RefCell<Vec<Value>>,
    reducer: RefCell<Reducer>,
    transcript: RefCell<Vec<Value>>,
    responses: RefCell<BTreeMap<String, Response>>,
    rpc: RefCell<HashMap<String, Result<Value, String>>>,
    /// The agent's state as this client holds it (`useAgent`'s `state`), and the refusals of
    /// its own changes (`onStateUpdateError`).
    state: RefCell<Option<Value>>,
    state_errors: RefCell<Vec<String>>,
    /// RPC calls sent and not answered yet.
    calls: RefCell<std::collections::HashSet<String>>,
    /// Frames sent while the connection was down, sent when it is back (PartySocket's queue).
    outbox: RefCell<Vec<String>>,
    closed: RefCell<Option<(u16, String)>>,
    /// The client closed it itself: it stays closed.
    closed_by_client: Cell<bool>,
    reconnects: Cell<usize>,
    /// The server says a turn a restart cut short is being continued
    /// (`cf_agent_chat_recovering`, the stock client's `isRecovering`).
    recovering: Cell<bool>,
    // ----- the contract, checked frame by frame
    /// Each `(run, sequence)`'s event, as first seen.
    named: RefCell<HashMap<(String, i64), String>>,
    /// The sequence of each run's hard terminal frame (`finished`, `error`, `aborted`) on this
    /// connection; an `interrupted` run can still be repaired by a late result.
    terminal: RefCell<HashMap<String, i64>>,
    violation: RefCell<Option<String>>,
}

impl Inbox {
    pub(crate) fn new(world: &Rc<WorldInner>, path: &str) -> Rc<Self> {
        let mut reducer = Reducer::new();
        reducer.set_now(world.exec.now() as f64);
        Rc::new(Self {
            path: path.to_owned(),
            world: Rc::downgrade(world),
            socket: RefCell::new(None),
            frames: RefCell::new(Vec::new()),
            reducer: RefCell::new(reducer),
            transcript: RefCell::new(Vec::new()),
            responses: RefCell::new(BTreeMap::new()),
            rpc: RefCell::new(HashMap::new()),
            calls: RefCell::new(std::collections::HashSet::new()),
            state: RefCell::new(None),
            state_errors: RefCell::new(Vec::new()),
            outbox: RefCell::new(Vec::new()),
            closed: RefCell::new(None),
            closed_by_client: Cell::new(false),
            reconnects: Cell::new(0),
            recovering: Cell::new(false),
            named: RefCell::new(HashMap::new()),
            terminal: RefCell::new(HashMap::new()),
            violation: RefCell::new(None),
        })
    }

    pub(crate) fn connected(&self, socket: Rc<KitSocket>) {
        *self.socket.borrow_mut() = Some(socket.clone());
        *self.closed.borrow_mut() = None;
        // A new connection gets the replay again; its terminal frames are tracked afresh.
        self.terminal.borrow_mut().clear();
        let Some(world) = self.world.upgrade() else { return };
        // As the stock chat hook does on every (re)connect: ask whether a stream goes on.
        let probe =
            json!({ "type": "cf_agent_stream_resume_request", "probeId": format!("probe-{}", self.reconnects.get()) });
        world.send_frame(socket.clone(), probe.to_string());
        for text in self.outbox.take() {
            world.send_frame(socket.clone(), text);
        }
    }

    /// A stream goes on (`cf_agent_stream_resuming`): the stock client acknowledges once and
    /// rebuilds the response from the replay that follows (the message with the stream's id
    /// is replaced, never appended to).
    fn resuming(&self, frame: &Value) {
        let Some(id) = frame.get("id").and_then(Value::as_str) else { return };
        let socket = self.socket.borrow().clone();
        let (Some(socket), Some(world)) = (socket, self.world.upgrade()) else { return };
        let mut responses = self.responses.borrow_mut();
        let response = responses.entry(id.to_owned()).or_default();
        if response.replaying {
            // Offered twice (on connect and in answer to the probe): acknowledged once.
            return;
        }
        response.replaying = true;
        response.fresh = true;
        // A reply a drop had ended goes on: its stream is offered.
        response.done = false;
        response.error = None;
        drop(responses);
        world.send_frame(socket, json!({ "type": "cf_agent_stream_resume_ack", "id": id }).to_string());
    }

    pub(crate) fn refused(&self, code: u16, reason: &str) {
        *self.closed.borrow_mut() = Some((code, reason.to_owned()));
    }

    pub(crate) fn is_open(&self) -> bool {
        self.closed.borrow().is_none() && self.socket.borrow().is_some()
    }

    /// The transcript loaded over HTTP at connect (a frame that came meanwhile is newer).
    pub(crate) fn set_transcript(&self, messages: Vec<Value>) {
        let mut transcript = self.transcript.borrow_mut();
        if transcript.is_empty() {
            *transcript = messages;
        }
    }

    /// The chat replies that ended without an error, as this client assembled them.
    pub(crate) fn finished_replies(&self) -> Vec<Value> {
        let responses = self.responses.borrow();
        let ended = responses.values().filter(|r| r.done && r.error.is_none() && !r.replaying);
        ended.filter_map(|r| r.builder.as_ref().map(MessageBuilder::message)).collect()
    }

    /// The stock reducer's state.
    pub(crate) fn runs_json(&self) -> Value {
        self.reducer.borrow().state_json()
    }

    /// Whether the client still listens (it did not close its socket, and no refusal was final).
    pub(crate) fn listening(&self) -> bool {
        !self.closed_by_client.get() && self.is_open()
    }

    pub(crate) fn violation(&self) -> Option<String> {
        self.violation.borrow().clone()
    }

    fn violated(&self, problem: String) {
        let mut violation = self.violation.borrow_mut();
        if violation.is_none() {
            *violation = Some(format!("{}: {problem}", self.path));
        }
    }

    /// A frame arrived.
    pub(crate) fn receive(&self, text: &str) {
        let frame: Value = serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()));
        match frame.get("type").and_then(Value::as_str) {
            Some("agent-tool-event") => self.event(&frame),
            Some("cf_agent_chat_messages") => {
                if let Some(messages) = frame.get("messages").and_then(Value::as_array) {
                    *self.transcript.borrow_mut() = messages.clone();
                }
            }
            Some("cf_agent_use_chat_response") => self.response(&frame),
            Some("cf_agent_message_updated") => {
                if let Some(message) = frame.get("message") {
                    self.updated(message);
                }
            }
            Some("cf_agent_stream_resuming") => self.resuming(&frame),
            Some("cf_agent_state") => *self.state.borrow_mut() = frame.get("state").cloned(),
            Some("cf_agent_state_error") => {
                let error = frame.get("error").and_then(Value::as_str).unwrap_or_default();
                self.state_errors.borrow_mut().push(error.to_owned());
            }
            Some("cf_agent_chat_recovering") => {
                self.recovering.set(frame.get("recovering") == Some(&Value::Bool(true)))
            }
            Some("rpc") => {
                let id = frame.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
                if frame.get("success") == Some(&Value::Bool(false)) {
                    let error = frame.get("error").and_then(Value::as_str).unwrap_or_default().to_owned();
                    self.rpc.borrow_mut().insert(id, Err(error));
                } else if frame.get("done") == Some(&Value::Bool(true)) {
                    self.rpc.borrow_mut().insert(id, Ok(frame.get("result").cloned().unwrap_or(Value::Null)));
                }
            }
            _ => {}
        }
        self.frames.borrow_mut().push(frame);
    }

    fn event(&self, frame: &Value) {
        if let Some(world) = self.world.upgrade() {
            self.reducer.borrow_mut().set_now(world.exec.now() as f64);
        }
        match self.reducer.borrow_mut().receive(frame) {
            Outcome::KeyThrew(e) | Outcome::Threw(e) => {
                self.violated(format!("the stock reducer threw on {frame}: {}", e.message()))
            }
            _ => {}
        }
        let event = &frame["event"];
        let (Some(run), Some(sequence)) = (event["runId"].as_str(), frame["sequence"].as_i64()) else {
            return self.violated(format!("a frame without a run id or a sequence: {frame}"));
        };
        let text = event.to_string();
        let key = (run.to_owned(), sequence);
        let first = self.named.borrow().get(&key).cloned();
        match first {
            Some(seen) if seen != text => {
                self.violated(format!("({run}, {sequence}) names two frames: {seen} and {text}"))
            }
            Some(_) => {}
            None => {
                self.named.borrow_mut().insert(key, text);
            }
        }
        if let Some(&end) = self.terminal.borrow().get(run) {
            if sequence > end {
                self.violated(format!("a frame of {run} after its terminal frame ({end}): {frame}"));
            }
        }
        let kind = event["kind"].as_str().unwrap_or_default();
        if ["finished", "error", "aborted"].contains(&kind) {
            self.terminal.borrow_mut().insert(run.to_owned(), sequence);
        }
    }

    /// A saved message changed (`cf_agent_message_updated`): the stock client replaces its copy.
    fn updated(&self, message: &Value) {
        for held in self.transcript.borrow_mut().iter_mut().filter(|m| m["id"] == message["id"]) {
            *held = message.clone();
        }
        for response in self.responses.borrow_mut().values_mut() {
            if response.builder.as_ref().is_some_and(|b| b.message()["id"] == message["id"]) {
                response.builder = Some(MessageBuilder::from_message(message));
            }
        }
    }

    /// The last assistant message this client shows (a continuation goes on with it).
    fn last_assistant(&self) -> Option<Value> {
        let responses = self.responses.borrow();
        let replies =
            responses.values().filter(|r| r.done).filter_map(|r| r.builder.as_ref().map(MessageBuilder::message));
        let transcript = self.transcript.borrow();
        let mut shown: Vec<Value> = transcript.clone();
        for reply in replies {
            match shown.iter_mut().find(|m| m["id"] == reply["id"]) {
                Some(m) => *m = reply,
                None => shown.push(reply),
            }
        }
        shown.into_iter().rev().find(|m| m["role"] == "assistant")
    }

    fn response(&self, frame: &Value) {
        let Some(id) = frame.get("id").and_then(Value::as_str) else { return };
        let continuation = frame.get("continuation") == Some(&Value::Bool(true));
        let base = if continuation { self.last_assistant() } else { None };
        let mut responses = self.responses.borrow_mut();
        let response = responses.entry(id.to_owned()).or_default();
        let replay = frame.get("replay") == Some(&Value::Bool(true));
        if response.replaying && !replay {
            // A live frame that crossed the acknowledgement: the replay brings it.
            return;
        }
        if replay && frame.get("replayComplete") == Some(&Value::Bool(true)) {
            response.replaying = false;
            return;
        }
        if response.done && response.ended_by_server && !replay {
            // Checked at every step: a turn ends once (a replay of an ended stream may repeat it).
            drop(responses);
            return self.violated(format!("chat request {id} got a second end: {frame}"));
        }
        if replay && std::mem::take(&mut response.fresh) {
            *response = Response { replaying: true, sent: response.sent, ..Response::default() };
        }
        let body = frame.get("body").and_then(Value::as_str).unwrap_or_default();
        if frame.get("error") == Some(&Value::Bool(true)) {
            response.error = Some(body.to_owned());
        } else if let Ok(chunk) = serde_json::from_str::<Value>(body) {
            // A continuation goes on with the last assistant message, as the stock client's does.
            let start =
                || base.as_ref().map_or_else(|| MessageBuilder::new(format!("a-{id}")), MessageBuilder::from_message);
            let builder = response.builder.get_or_insert_with(start);
            builder.apply(&chunk);
            if chunk.get("type").and_then(Value::as_str) == Some("error") {
                response.error = chunk.get("errorText").and_then(Value::as_str).map(str::to_owned);
            }
        }
        if frame.get("done") == Some(&Value::Bool(true)) {
            response.done = true;
            response.ended_by_server = true;
            response.replaying = false;
            // The stock client stops showing "recovering" with any end but a recovering one.
            if frame.get("outcome").and_then(Value::as_str) != Some("recovering") {
                self.recovering.set(false);
            }
            // A continuation's message is the one it went on with: every copy shows it.
            let finished = response.builder.as_ref().filter(|_| continuation).map(MessageBuilder::message);
            drop(responses);
            if let Some(message) = finished {
                self.updated(&message);
            }
        }
    }

    /// The connection closed (the server closed it, or the network dropped it): the client
    /// reconnects after [`RECONNECT`] unless the code is final (4000–4999) or it closed
    /// the socket itself.
    pub(crate) fn closed(self: &Rc<Self>, code: u16, reason: &str) {
        *self.closed.borrow_mut() = Some((code, reason.to_owned()));
        // What the connection took with it is never lost without a word: an RPC call without
        // its answer fails; a chat request that got nothing back ends with an error (replaced by
        // its stream if the agent did get it and offers it on reconnect).
        for id in self.calls.take() {
            self.rpc.borrow_mut().insert(id, Err(format!("{DROPPED} (code {code}): the call's answer was lost")));
        }
        for response in self.responses.borrow_mut().values_mut().filter(|r| r.sent && !r.done && r.builder.is_none()) {
            response.error = Some(format!("{DROPPED} before the agent answered: send the message again"));
            response.done = true;
        }
        if self.closed_by_client.get() || (4000..5000).contains(&code) {
            return;
        }
        let Some(world) = self.world.upgrade() else { return };
        let inbox = Rc::downgrade(self);
        let wait = world.exec.sleep(RECONNECT_MS);
        let clock = Rc::downgrade(&world);
        world.exec.spawn(
            TEST,
            Box::pin(async move {
                wait.await;
                loop {
                    let (Some(inbox), Some(world)) = (inbox.upgrade(), clock.upgrade()) else { return };
                    if inbox.closed_by_client.get() || inbox.is_open() {
                        return;
                    }
                    inbox.reconnects.set(inbox.reconnects.get() + 1);
                    let open = WorldInner::open(world.clone(), inbox.clone());
                    let wait = world.exec.sleep(RECONNECT_MS);
                    drop((inbox, world));
                    match open.await {
                        Ok(()) | Err((true, _)) => return,
                        Err((false, _)) => wait.await,
                    }
                }
            }),
        );
    }

    /// The network drops the connection: both ends hear of it.
    pub(crate) fn drop_connection(self: &Rc<Self>) {
        let socket = self.socket.borrow_mut().take();
        let Some(socket) = socket else { return };
        if let Some(world) = self.world.upgrade() {
            world.close_socket(socket, 1006, "the connection dropped".into());
        }
        self.closed(1006, "the connection dropped");
    }
}

/// A client connected to an agent (see [`super::World::connect`]): its socket, the stock
/// client's state of agent-tool runs, and the chat. Methods that wait for an answer drive the
/// world until it comes.
pub struct Client {
    world: Weak<WorldInner>,
    inbox: Rc<Inbox>,
    next_id: Cell<u64>,
    /// This client's number in its world: ids it makes are unique across clients, as a
    /// browser's random ids are.
    tab: usize,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("path", &self.inbox.path).field("tab", &self.tab).finish_non_exhaustive()
    }
}

impl Client {
    pub(crate) fn new(world: Weak<WorldInner>, inbox: Rc<Inbox>) -> Self {
        let tab = world.upgrade().map_or(0, |w| w.clients.borrow().len());
        Self { world, inbox, next_id: Cell::new(1), tab }
    }

    fn world(&self) -> Rc<WorldInner> {
        self.world.upgrade().expect("the world of this client was dropped")
    }

    fn id(&self, prefix: &str) -> String {
        let n = self.next_id.get();
        self.next_id.set(n + 1);
        format!("{prefix}-{}-{n}", self.tab)
    }

    /// Every frame received so far, parsed (a frame that is not JSON is a JSON string).
    pub fn frames(&self) -> Vec<Value> {
        self.inbox.frames.borrow().clone()
    }

    /// The `agent-tool-event` frames received so far.
    pub fn events(&self) -> Vec<Value> {
        let frames = self.inbox.frames.borrow();
        frames.iter().filter(|f| f["type"] == "agent-tool-event").cloned().collect()
    }

    /// The stock client's state (`useAgentToolEvents`): `{runsById, runsByToolCallId,
    /// unboundRuns}`, as `JSON.parse(JSON.stringify(state))`.
    pub fn runs(&self) -> Value {
        self.inbox.reducer.borrow().state_json()
    }

    /// One run of [`Client::runs`] (`runsById[run_id]`).
    pub fn run(&self, run_id: &str) -> Option<Value> {
        self.runs().get("runsById").and_then(|runs| runs.get(run_id)).cloned()
    }

    /// The runs of [`Client::runs`], typed, in the order the client knows them (`runsById`).
    /// Panics on a run the stock state could not hold (the client checks every frame as it
    /// arrives, so that is a bug here).
    ///
    /// ```
    /// # use agent_tools::prelude::*;
    /// # #[derive(Default)] pub struct Planner;
    /// # impl agent_tools::AgentClass for Planner { const CLASS: &'static str = "Planner"; const BINDING: &'static str = "Planner"; }
    /// # impl Agent for Planner {}
    /// use agent_tools::testing::World;
    ///
    /// let world = World::new().route::<Planner>();
    /// let client = world.connect("/agents/planner/p");
    /// assert!(client.run_states().is_empty(), "no run yet");
    /// assert_eq!(client.run_state("r1"), None);
    /// ```
    pub fn run_states(&self) -> Vec<RunState> {
        let runs = self.runs();
        let Some(Value::Object(by_id)) = runs.get("runsById") else { return Vec::new() };
        by_id
            .iter()
            .map(|(id, run)| {
                serde_json::from_value(run.clone())
                    .unwrap_or_else(|e| panic!("run {id} of the client's state: {e}: {run}"))
            })
            .collect()
    }

    /// One run of [`Client::run_states`].
    pub fn run_state(&self, run_id: &str) -> Option<RunState> {
        self.run_states().into_iter().find(|run| run.run_id == run_id)
    }

    /// The transcript as the stock client holds it: loaded at connect (`GET get-messages`),
    /// then replaced by each `cf_agent_chat_messages` the server sends.
    pub fn messages(&self) -> Vec<Value> {
        self.inbox.transcript.borrow().clone()
    }

    /// Sends a raw frame. While the connection is down (the client reconnecting) the frame
    /// waits and goes out when it is back, as PartySocket queues it.
    pub fn send(&self, frame: &Value) {
        assert!(!self.inbox.closed_by_client.get(), "the client closed its connection to {}", self.inbox.path);
        let socket = self.inbox.socket.borrow().clone();
        match socket {
            Some(socket) if self.inbox.is_open() => self.world().send_frame(socket, frame.to_string()),
            _ => self.inbox.outbox.borrow_mut().push(frame.to_string()),
        }
    }

    /// Sends a chat message as `useAgentChat`'s `sendMessage` does (the transcript so far and
    /// the new user message), without waiting. Returns the request id.
    pub fn send_chat(&self, text: &str) -> String {
        self.send_chat_with(text, json!({}))
    }

    /// [`Client::send_chat`] with more fields in the request body, as the stock client adds
    /// its `body` option and its `clientTools` (`{"clientTools": [{name, description,
    /// parameters}]}`).
    pub fn send_chat_with(&self, text: &str, extra_body: Value) -> String {
        let request_id = self.id("req");
        let mut messages = self.messages();
        for reply in self.inbox.responses.borrow().values().filter(|r| r.done) {
            if let Some(message) = reply.builder.as_ref().map(MessageBuilder::message) {
                if !messages.iter().any(|m| m["id"] == message["id"]) {
                    messages.push(message);
                }
            }
        }
        messages.push(user_text(self.id("user"), text));
        let mut body = json!({ "messages": messages, "trigger": "submit-message" });
        if let (Value::Object(body), Value::Object(extra)) = (&mut body, extra_body) {
            body.extend(extra);
        }
        let body = body.to_string();
        let frame = json!({ "type": "cf_agent_use_chat_request", "id": request_id,
                            "init": { "method": "POST", "body": body } });
        self.inbox.responses.borrow_mut().insert(request_id.clone(), Response { sent: true, ..Response::default() });
        self.send(&frame);
        request_id
    }

    /// Sends a chat message and waits for the whole reply.
    pub fn chat(&self, text: &str) -> ChatReply {
        let request_id = self.send_chat(text);
        self.wait_reply(&request_id)
    }

    /// Waits for the reply to `request_id` to end.
    pub fn wait_reply(&self, request_id: &str) -> ChatReply {
        let inbox = self.inbox.clone();
        let done = self.world().run_until(&mut || inbox.responses.borrow().get(request_id).is_some_and(|r| r.done));
        assert!(done, "no end of the reply to {request_id} within the wait limit");
        self.reply(request_id).expect("a reply")
    }

    /// The reply to `request_id` as received so far.
    pub fn reply(&self, request_id: &str) -> Option<ChatReply> {
        let responses = self.inbox.responses.borrow();
        let response = responses.get(request_id)?;
        let message = response.builder.as_ref().map_or(Value::Null, MessageBuilder::message);
        Some(ChatReply { text: text_of(&message), message, error: response.error.clone(), done: response.done })
    }

    /// Calls the agent's RPC method `method` ([`crate::Agent::call`]) and waits for its answer:
    /// a rejected call is an [`crate::Error::Failed`] with the message the client got; a call
    /// whose answer a dropped connection lost, or that got none within the wait limit, an
    /// [`crate::Error::Unavailable`].
    pub fn call(&self, method: &str, args: Vec<Value>) -> Result<Value, crate::Error> {
        let id = self.id("rpc");
        self.inbox.calls.borrow_mut().insert(id.clone());
        self.send(&json!({ "type": "rpc", "id": id, "method": method, "args": args }));
        let inbox = self.inbox.clone();
        let done = self.world().run_until(&mut || inbox.rpc.borrow().contains_key(&id));
        self.inbox.calls.borrow_mut().remove(&id);
        if !done {
            return Err(
                Unavailable::unreachable(format!("no answer to the RPC call {method} within the wait limit")).into()
            );
        }
        match self.inbox.rpc.borrow_mut().remove(&id) {
            Some(Err(e)) if e.starts_with(DROPPED) => Err(Unavailable::unreachable(e).into()),
            Some(answer) => answer.map_err(crate::Error::Failed),
            None => Err(Unavailable::unreachable(format!("no answer to the RPC call {method}")).into()),
        }
    }

    /// Closes the connection (code 1000); the client does not reconnect.
    pub fn close(&self) {
        self.inbox.closed_by_client.set(true);
        let socket = self.inbox.socket.borrow_mut().take();
        if let Some(socket) = socket {
            self.world().close_socket(socket, 1000, String::new());
        }
        *self.inbox.closed.borrow_mut() = Some((1000, String::new()));
    }

    /// Drops the connection as a network failure would (both ends see 1006); the client
    /// reconnects after [`RECONNECT`].
    pub fn drop_connection(&self) {
        self.inbox.drop_connection();
    }

    /// Forgets the runs this client holds, as the stock hook's `resetLocalState()` does, and
    /// takes the replay again (by reconnecting): what a page does after its app cleared runs
    /// (the stock reducer ignores a `started` frame for a run it holds as finished, so a cleared
    /// run id dispatched again would otherwise stay as it was).
    pub fn reset_local_state(&self) {
        self.inbox.reducer.borrow_mut().reset();
        self.inbox.terminal.borrow_mut().clear();
        if self.inbox.is_open() {
            self.inbox.drop_connection();
        }
    }

    /// Whether the connection is open now.
    pub fn is_open(&self) -> bool {
        self.inbox.is_open()
    }

    /// The close code and reason, while closed.
    pub fn closed(&self) -> Option<(u16, String)> {
        self.inbox.closed.borrow().clone()
    }

    /// The agent's state as this client holds it (`useAgent`'s `state`): the last
    /// `cf_agent_state` it got, or its own last `set_state`.
    pub fn state(&self) -> Option<Value> {
        self.inbox.state.borrow().clone()
    }

    /// Sets the agent's state as the stock client's `setState` does: sent as `cf_agent_state`
    /// and applied here at once (a refusal comes back in [`Client::state_errors`]; the stock
    /// client does not roll back either).
    pub fn set_state(&self, state: &Value) {
        *self.inbox.state.borrow_mut() = Some(state.clone());
        self.send(&json!({ "type": "cf_agent_state", "state": state }));
    }

    /// The refusals of this client's state changes (`cf_agent_state_error`), oldest first.
    pub fn state_errors(&self) -> Vec<String> {
        self.inbox.state_errors.borrow().clone()
    }

    /// Whether the server says a chat turn that a restart cut short is being continued (the
    /// stock client's `isRecovering`).
    pub fn is_recovering(&self) -> bool {
        self.inbox.recovering.get()
    }

    /// How many times the client reconnected by itself.
    pub fn reconnects(&self) -> usize {
        self.inbox.reconnects.get()
    }

    /// The last assistant message as this client shows it (its transcript, with the replies and
    /// continuations it received).
    pub fn last_answer(&self) -> Option<Value> {
        self.inbox.last_assistant()
    }

    /// The tool calls that wait for this client's approval, as the stock client shows them (parts
    /// in `approval-requested`): `(toolCallId, approvalId)`, oldest first.
    pub fn approval_requests(&self) -> Vec<(String, String)> {
        let Some(message) = self.last_answer() else { return Vec::new() };
        let parts = message["parts"].as_array().cloned().unwrap_or_default();
        parts
            .iter()
            .filter(|p| p["state"] == "approval-requested")
            .filter_map(|p| Some((p["toolCallId"].as_str()?.to_owned(), p["approval"]["id"].as_str()?.to_owned())))
            .collect()
    }

    /// Answers an approval request as the stock client's `addToolApprovalResponse` does
    /// (`cf_agent_tool_approval` with `autoContinue: true`, the stock default).
    pub fn answer_approval(&self, tool_call_id: &str, approved: bool) {
        self.send(&json!({ "type": "cf_agent_tool_approval", "toolCallId": tool_call_id, "approved": approved,
                           "autoContinue": true }));
    }

    /// Sends a client-side tool's output as the stock client's `addToolOutput` does
    /// (`cf_agent_tool_result` with `autoContinue: true`).
    pub fn add_tool_output(&self, tool_call_id: &str, tool_name: &str, output: &Value) {
        self.send(&json!({ "type": "cf_agent_tool_result", "toolCallId": tool_call_id, "toolName": tool_name,
                           "output": output, "autoContinue": true }));
    }

    /// The `cf_agent_error` frames this client got (frames the agent could not use), oldest first.
    pub fn errors(&self) -> Vec<String> {
        let frames = self.inbox.frames.borrow();
        let errors = frames.iter().filter(|f| f["type"] == "cf_agent_error");
        errors.filter_map(|f| f["error"].as_str().map(str::to_owned)).collect()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // A client that goes away closes its socket, as a closed tab does.
        if self.inbox.is_open() && self.world.upgrade().is_some() {
            self.close();
        }
        self.inbox.closed_by_client.set(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::World;

    fn frame(sequence: i64, kind: &str, text: &str) -> String {
        let event = match kind {
            "chunk" => {
                json!({ "kind": "chunk", "runId": "r", "body": json!({ "type": "text-delta", "id": "t", "delta": text }).to_string() })
            }
            _ => json!({ "kind": kind, "runId": "r", "summary": text }),
        };
        json!({ "type": "agent-tool-event", "sequence": sequence, "event": event }).to_string()
    }

    /// The contract's checks catch what they check: a frame after a run's hard terminal frame,
    /// and one `(run, sequence)` naming two frames; an `interrupted` run may still be repaired.
    #[test]
    fn the_checks_see_what_they_check() {
        let world = World::new();
        let inbox = Inbox::new(&world.0, "/agents/a/b");
        inbox.receive(&frame(1, "chunk", "a"));
        inbox.receive(&frame(2, "interrupted", ""));
        inbox.receive(&frame(3, "chunk", "b"));
        inbox.receive(&frame(4, "finished", "done"));
        inbox.receive(&frame(4, "finished", "done"));
        assert_eq!(inbox.violation(), None, "a repair after interrupted, a replayed frame: all fine");
        inbox.receive(&frame(5, "chunk", "late"));
        let problem = inbox.violation().expect("a frame after the terminal one");
        assert!(problem.contains("after its terminal frame (4)"), "{problem}");

        let inbox = Inbox::new(&world.0, "/agents/a/b");
        inbox.receive(&frame(1, "chunk", "a"));
        inbox.receive(&frame(1, "chunk", "b"));
        let problem = inbox.violation().expect("two frames under one sequence");
        assert!(problem.contains("(r, 1) names two frames"), "{problem}");
    }
}
