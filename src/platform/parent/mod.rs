//! The parent host: binds the registry and the chat to a Durable Object, its WebSocket clients
//! and the children's stubs.
//!
//! A dispatch inserts the row, sends `started`, starts the child (idempotent), tails it, and
//! for every batch of lines read stores the frames and broadcasts them in one synchronous step.
//! A client that connects is accepted and replayed in one synchronous step too, so every frame
//! reaches it exactly once: in the replay if it was stored before, live if after.

mod chat_turn;
mod detached;
mod dispatch;
mod follow;
mod recovery;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use futures::channel::oneshot;
use serde_json::{json, Value};
use worker::{Env, Request, Response, State, WebSocket, WebSocketIncomingMessage, WebSocketPair};

use super::chat::{self, Chat, ChatAction};
use super::model::ModelProvider;
use super::{json_error, DoSql};
use crate::cancel::CancelToken;
use crate::model::ModelError;
use crate::observability::ObservabilityEvent;
use crate::parent::{Admission, AgentTool, Registry, RunRecord, RunResult, RunStatus};
use crate::protocol::rpc::RpcResponse;
use crate::protocol::EventFrame;
use crate::routing::{kebab_case, parse_agent_path};
use crate::store::{meta, Sql};

/// A child class this parent may dispatch, and the Durable Object binding that hosts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChildClass {
    /// The class name, which is also the runs' `agentType` (`Researcher`).
    pub class: &'static str,
    /// The `[[durable_objects.bindings]]` name in `wrangler.toml`.
    pub binding: &'static str,
}

/// A parent agent: a chat agent whose model may call child agents as tools, and whose clients
/// may call methods over RPC.
#[allow(async_fn_in_trait)] // Workers are single-threaded; no `Send` bound is wanted.
pub trait ParentAgent: Sized + 'static {
    /// The class name (`Assistant`); clients address it as its kebab-case (`assistant`).
    const CLASS: &'static str;
    /// The child classes this parent dispatches.
    const CHILDREN: &'static [ChildClass];

    /// Instructions for the model.
    fn system_prompt(&self) -> Option<String> {
        None
    }

    /// The child agents the model may call (see [`AgentTool`]).
    fn tools(&self) -> Vec<AgentTool> {
        Vec::new()
    }

    /// The most model steps in one chat turn (the AI SDK's `stepCountIs(n)`).
    fn max_steps(&self) -> usize {
        5
    }

    /// The model; by default the one the Worker's settings select (`MODEL_PROVIDER`, …).
    fn model(&self, env: &Env) -> Result<ModelProvider, ModelError> {
        ModelProvider::from_env(env)
    }

    /// How long a followed child may send nothing before the run is sealed `interrupted`
    /// (`no-progress`, the child left running). Default 120 000 ms.
    fn reattach_no_progress_timeout_ms(&self) -> u64 {
        120_000
    }

    /// The longest a run may be followed after its tail first broke; past it the child is torn
    /// down and the run sealed `interrupted` (`window-exceeded`). Default: unlimited.
    fn reattach_max_window_ms(&self) -> Option<u64> {
        None
    }

    /// How soon after a run starts the parent's alarm fires (and then how often, while runs
    /// are live) to recover runs a restart left undriven. Default 10 000 ms.
    fn recovery_alarm_ms(&self, env: &Env) -> u64 {
        let _ = env;
        10_000
    }

    /// Delivers a detached run's outcome to the handler it was dispatched with (the tag given in
    /// `DetachedOptions::on_finish`, typically the app's own enum, serialized). Called at least
    /// once per outcome (exactly once unless a delivery crashed): make it idempotent. `Err`
    /// is retried by the backbone, up to 5 attempts, then dead-lettered.
    async fn on_detached_finish(
        &self,
        parent: &ParentHost<Self>,
        handler: &Value,
        run: &RunRecord,
        result: &RunResult,
    ) -> Result<(), String> {
        let _ = (parent, handler, run, result);
        Ok(())
    }

    /// The chat message a `notify` run injects on completion (empty: none).
    fn format_detached_completion(&self, run: &RunRecord, result: &RunResult) -> String {
        let outcome = match (&result.summary, &result.error) {
            (Some(summary), _) if result.status == RunStatus::Completed => summary.clone(),
            (_, Some(error)) => error.clone(),
            _ => String::new(),
        };
        format!("Background run {} ({}) {}: {outcome}", run.run_id, run.agent_type, result.status.as_str())
    }

    /// The chat line a milestone of an `on_milestones` run adds (empty: none). `milestone` is
    /// `{name, sequence, at, fraction?, message?, phase?, data?}`.
    fn format_detached_milestone(&self, run: &RunRecord, milestone: &Value) -> String {
        let name = milestone.get("name").and_then(Value::as_str).unwrap_or_default();
        format!("{} ({}) reached milestone \"{name}\".", run.agent_type, run.run_id)
    }

    /// Best-effort: a child's progress or milestone passed through this parent. Not durable.
    async fn on_progress(&self, parent: &ParentHost<Self>, run: &RunRecord, progress: &Value) {
        let _ = (parent, run, progress);
    }

    /// The backbone's cadence for detached runs (default 5, 15, 30, then every 120 s).
    fn backbone_cadence_ms(&self, env: &Env) -> Vec<u64> {
        let _ = env;
        crate::parent::detached::CADENCE_MS.to_vec()
    }

    /// A detached run's absolute budget unless it sets one (default 24 h).
    fn detached_max_budget_ms(&self) -> u64 {
        crate::parent::detached::DEFAULT_MAX_BUDGET_MS
    }

    /// A detached run's no-progress budget unless it sets one (default 1 h; 0 disables).
    fn detached_no_progress_budget_ms(&self) -> u64 {
        crate::parent::detached::DEFAULT_NO_PROGRESS_BUDGET_MS
    }

    /// Subscribes to the engine's structured events (they are also logged as JSON lines).
    fn on_observability(&self, event: &ObservabilityEvent) {
        let _ = event;
    }

    /// The most runs `starting` or `running` at once (default: unlimited).
    fn max_concurrent_agent_tools(&self, env: &Env) -> Option<usize> {
        let _ = env;
        None
    }

    /// What a dispatch over the cap does (default: [`Admission::Reject`]).
    fn admission(&self, env: &Env) -> Admission {
        let _ = env;
        Admission::Reject
    }

    /// Fires once when a run's row is created, after its `started` frame.
    async fn on_agent_tool_start(&self, parent: &ParentHost<Self>, run: &RunRecord) {
        let _ = (parent, run);
    }

    /// Fires once when a run reaches a terminal status (again if an `interrupted` run is later
    /// repaired by its real result).
    async fn on_agent_tool_finish(&self, parent: &ParentHost<Self>, run: &RunRecord, result: &RunResult) {
        let _ = (parent, run, result);
    }

    /// The drill-in gate: runs before a `/sub/<child>/<name>` request reaches the child.
    /// Return a response to refuse it. The default refuses (404) any name that is not a known
    /// run of that child class, so a guessed id never creates a child.
    async fn on_before_sub_agent(
        &self,
        parent: &ParentHost<Self>,
        request: &Request,
        child: ChildClass,
        name: &str,
    ) -> Option<Response> {
        let _ = request;
        if parent.has_agent_tool_run(child.class, name) {
            return None;
        }
        json_error(404, format!("no {} run {name:?} on this {}", child.class, Self::CLASS)).ok()
    }

    /// Serves an RPC call (`agent.call(method, args)`). The default knows no methods. Return
    /// `Err(message)` to reject the call with that message.
    async fn call(&self, parent: &ParentHost<Self>, method: &str, args: Vec<Value>) -> Result<Value, String> {
        let _ = (parent, args);
        Err(format!("Method {method} does not exist"))
    }
}

/// A run this instance is driving.
#[derive(Default)]
struct Inflight {
    /// Callers that dispatched the same run id meanwhile.
    waiters: Vec<oneshot::Sender<RunResult>>,
    /// Stops the driver (the run was cancelled here).
    cancel: CancelToken,
}

struct Inner<A> {
    state: State,
    env: Env,
    sql: DoSql,
    agent: A,
    chat: Chat,
    /// Runs this instance is driving, with the callers joined to them.
    inflight: RefCell<HashMap<String, Inflight>>,
    /// The agent-tool runs each chat turn dispatched, by request id (to cancel them with it).
    turn_runs: RefCell<HashMap<String, Vec<String>>>,
    /// Dispatches queued for a concurrency slot.
    slot_waiters: RefCell<Vec<oneshot::Sender<()>>>,
    /// Recovery was started in this instance.
    recovery_started: Cell<bool>,
    /// A recovery pass is under way.
    recovering: Cell<bool>,
    /// When the pending alarm fires, as far as this instance knows.
    alarm_at: Cell<Option<i64>>,
    /// Backbone ticks in a row that changed nothing (the cadence escalates with them).
    backbone_quiet_ticks: Cell<usize>,
}

/// The parent's runtime. Clone is cheap (a shared handle). Hold one in your Durable Object and
/// delegate `fetch`, `websocket_message` and `websocket_close` to it.
pub struct ParentHost<A: ParentAgent>(Rc<Inner<A>>);

impl<A: ParentAgent> Clone for ParentHost<A> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<A: ParentAgent> ParentHost<A> {
    /// Creates the runtime and its tables.
    pub fn new(state: State, env: Env, agent: A) -> Self {
        let sql = DoSql(state.storage().sql());
        let migrated = Registry::new(&sql)
            .migrate()
            .and_then(|_| crate::parent::detached::Ledger::new(&sql).migrate())
            .and_then(|_| sql.batch(meta::SCHEMA));
        if let Err(e) = migrated {
            worker::console_error!("agent-tools: parent schema failed: {e}");
        }
        let chat = Chat::new(sql.clone());
        Self(Rc::new(Inner {
            state,
            env,
            sql,
            agent,
            chat,
            inflight: RefCell::new(HashMap::new()),
            turn_runs: RefCell::new(HashMap::new()),
            slot_waiters: RefCell::new(Vec::new()),
            recovery_started: Cell::new(false),
            recovering: Cell::new(false),
            alarm_at: Cell::new(None),
            backbone_quiet_ticks: Cell::new(0),
        }))
    }

    /// The agent.
    pub fn agent(&self) -> &A {
        &self.0.agent
    }

    /// The Worker environment.
    pub fn env(&self) -> &Env {
        &self.0.env
    }

    /// This agent's SQL storage (for the app's own tables).
    pub fn sql(&self) -> &DoSql {
        &self.0.sql
    }

    /// The run registry.
    pub fn registry(&self) -> Registry<'_, DoSql> {
        Registry::new(&self.0.sql)
    }

    /// The chat transcript.
    pub fn messages(&self) -> Vec<Value> {
        self.0.chat.messages()
    }

    /// This instance's name, learned from its first request and kept in SQL (an alarm wakes a
    /// Durable Object without one).
    pub fn name(&self) -> Option<String> {
        meta::get(&self.0.sql, "name").ok().flatten()
    }

    /// Whether `run_id` is a known run of `agent_type`.
    pub fn has_agent_tool_run(&self, agent_type: &str, run_id: &str) -> bool {
        self.registry().has_run(agent_type, run_id).unwrap_or(false)
    }

    /// Sends a text frame to every connected client.
    pub fn broadcast(&self, text: &str) {
        for ws in self.0.state.get_websockets_with_tag(chat::CLIENT_TAG) {
            let _ = ws.send_with_str(text);
        }
    }

    /// Sends text frames, in order, to every connected client; with none connected, the
    /// frames are never built.
    fn broadcast_all(&self, texts: impl Iterator<Item = String>) {
        let sockets = self.0.state.get_websockets_with_tag(chat::CLIENT_TAG);
        if sockets.is_empty() {
            return;
        }
        let texts: Vec<String> = texts.collect();
        for ws in sockets {
            for text in &texts {
                let _ = ws.send_with_str(text);
            }
        }
    }

    fn broadcast_frame(&self, frame: &EventFrame) {
        self.broadcast(&frame.to_json());
    }

    /// Serves HTTP and WebSocket requests routed to this agent.
    pub async fn fetch(&self, req: Request) -> worker::Result<Response> {
        let url = req.url()?;
        let Some(path) = parse_agent_path(url.path()) else {
            return json_error(404, format!("{} serves /agents/{}/<name>", A::CLASS, kebab_case(A::CLASS)));
        };
        if self.name().is_none() {
            meta::set(&self.0.sql, "name", &path.name).map_err(|e| worker::Error::RustError(e.to_string()))?;
        }
        self.ensure_recovery();
        if let Some(sub) = &path.sub {
            let Some(child) = A::CHILDREN.iter().find(|c| kebab_case(c.class) == sub.agent) else {
                return json_error(404, format!("{} has no child agent {:?}", A::CLASS, sub.agent));
            };
            let is_socket = req.headers().get("upgrade")?.is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
            if let Some(refusal) = self.0.agent.on_before_sub_agent(self, &req, *child, &sub.name).await {
                return if is_socket { reject_socket(refusal.status_code()) } else { Ok(refusal) };
            }
            return match self.child_stub(*child, &sub.name) {
                Ok(stub) => stub.fetch_with_request(req).await,
                Err(e) => json_error(502, format!("could not reach {}: {e}", child.class)),
            };
        }
        let upgrade = req.headers().get("upgrade")?.unwrap_or_default();
        if upgrade.eq_ignore_ascii_case("websocket") {
            return self.connect(&path.name);
        }
        match path.rest.as_str() {
            "" => Response::from_json(&json!({ "agent": kebab_case(A::CLASS), "name": path.name })),
            "/get-messages" => Response::from_json(&self.messages()),
            other => json_error(404, format!("{} has no route {other}", A::CLASS)),
        }
    }

    fn connect(&self, name: &str) -> worker::Result<Response> {
        let pair = WebSocketPair::new()?;
        let connection = chat::accept(&self.0.state, &pair.server);
        self.0.chat.on_connect(&pair.server, &connection);
        let identity = json!({ "type": "cf_agent_identity", "name": name, "agent": kebab_case(A::CLASS) });
        pair.server.send_with_str(identity.to_string())?;
        let mcp = json!({ "type": "cf_agent_mcp_servers",
                          "mcp": { "servers": {}, "tools": [], "prompts": [], "resources": [] } });
        pair.server.send_with_str(mcp.to_string())?;
        match self.registry().replay() {
            Ok(frames) => {
                for frame in frames {
                    pair.server.send_with_str(frame.to_json())?;
                }
            }
            Err(e) => worker::console_error!("agent-tools: replay failed: {e}"),
        }
        Response::from_websocket(pair.client)
    }

    /// Handles one client frame: RPC calls and chat frames. Anything malformed gets an error
    /// frame and the socket stays open.
    pub async fn websocket_message(&self, ws: WebSocket, message: WebSocketIncomingMessage) -> worker::Result<()> {
        self.ensure_recovery();
        match self.0.chat.receive(&self.0.state, &ws, message) {
            ChatAction::Done => {}
            ChatAction::Call(call) => {
                let reply = match self.0.agent.call(self, &call.method, call.args).await {
                    Ok(result) => RpcResponse::ok(call.id, result),
                    Err(error) => RpcResponse::err(call.id, error),
                };
                let _ = ws.send_with_str(reply.to_json());
            }
            ChatAction::RunTurn { request_id, sender } => self.run_chat_turn(request_id, Some(sender)).await,
            ChatAction::Cancel { request_id } => self.cancel_chat_turn(&request_id).await,
        }
        Ok(())
    }

    /// Handles a client going away.
    pub async fn websocket_close(&self, ws: WebSocket, code: usize, reason: String) -> worker::Result<()> {
        self.0.chat.closed(&ws, code, reason);
        Ok(())
    }
}

/// Refuses a WebSocket the way the TypeScript SDK does: accept it, then close it at once with
/// `4000 + status` for a 4xx status (which the stock client treats as final), else 1011.
fn reject_socket(status: u16) -> worker::Result<Response> {
    let pair = WebSocketPair::new()?;
    pair.server.accept()?;
    let code = if (400..500).contains(&status) { 4000 + status } else { 1011 };
    pair.server.close(Some(code), Some(format!("Sub-agent connection rejected ({status})")))?;
    Response::from_websocket(pair.client)
}
