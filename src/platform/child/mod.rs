//! The child host: binds [`crate::child::runs`] and the chat to a Durable Object.
//!
//! A child serves its parent over internal routes (the Worker entry never routes here): `start`
//! begins a run and returns at once while the turn runs on; `tail` streams the stored chunks
//! after a cursor and then the live ones, with no gap and no duplicate between the two (the log
//! is read and the subscriber registered in one synchronous step, and every chunk is stored and
//! fanned out in one synchronous step); `inspect` and `cancel` do what they say. Clients reach
//! the child's own chat only through the parent's drill-in gate.

mod api;
mod turn;

use std::cell::RefCell;
use std::collections::HashMap;
use std::pin::Pin;
use std::rc::Rc;

use futures::channel::mpsc;
use futures::Stream;
use serde_json::{json, Value};
use worker::{Env, Method, Request, Response, State, WebSocket, WebSocketIncomingMessage, WebSocketPair};

pub use turn::{ChildTools, Turn};

use super::chat::{self, Chat, ChatAction};
use super::model::{ModelProvider, PlatformModel};
use super::{json_error, now_ms, random_id, DoSql};
use crate::cancel::CancelToken;
use crate::chat::message::user_text;
use crate::child::progress::{Coalescer, Report};
use crate::child::runs::{ChildRun, ChildRuns, ChildStatus};
use crate::model::{ModelError, ToolCall, ToolSpec};
use crate::protocol::child_api::{CancelRequest, StartRequest};
use crate::protocol::chunk;
use crate::protocol::rpc::RpcResponse;
use crate::protocol::tail::{ChunkKind, OutcomeStatus, RunOutcome, TailLine};
use crate::routing::{kebab_case, parse_agent_path};
use crate::store::meta;

/// What a finished turn hands back.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TurnOutput {
    /// Short text for display and for the parent's model.
    pub summary: String,
    /// Structured output, when the agent has one.
    pub output: Option<Value>,
}

/// A child agent: a chat agent that runs one agent-tool turn per run.
#[allow(async_fn_in_trait)] // Workers are single-threaded; no `Send` bound is wanted.
pub trait ChildAgent: Sized + 'static {
    /// The class name (`Researcher`): the `agentType` of its runs.
    const CLASS: &'static str;

    /// Instructions for the model.
    fn system_prompt(&self) -> Option<String> {
        None
    }

    /// The most model steps in one turn.
    fn max_steps(&self) -> usize {
        5
    }

    /// The model for a turn (`input` is the run's input; `None` for a drill-in chat turn).
    fn model(&self, env: &Env, input: Option<&Value>) -> Result<ModelProvider, ModelError> {
        let _ = input;
        ModelProvider::from_env(env)
    }

    /// The user message that starts a run: the input as text (a string as is, anything else as
    /// pretty JSON), with id `agent-tool-<run>-input`.
    fn format_agent_tool_input(&self, input: &Value, run_id: &str) -> Value {
        let text = match input {
            Value::String(s) => s.clone(),
            other => serde_json::to_string_pretty(other).unwrap_or_default(),
        };
        user_text(format!("agent-tool-{run_id}-input"), text)
    }

    /// Structured output of a finished run (default: none). Read right after the turn ends.
    fn get_agent_tool_output(&self, turn: &Turn, message: &Value) -> Option<Value> {
        let _ = (turn, message);
        None
    }

    /// The run's summary: by default the assistant's text, or the output's JSON when the turn
    /// produced no text.
    fn get_agent_tool_summary(&self, text: &str, output: Option<&Value>) -> String {
        match output {
            Some(o) if text.is_empty() => o.to_string(),
            _ => text.to_owned(),
        }
    }

    /// Server-side tools of this agent's model.
    fn tools(&self) -> Vec<ToolSpec> {
        Vec::new()
    }

    /// Runs one of [`ChildAgent::tools`]. `turn` is the agent-tool run, if the call happens in
    /// one (a drill-in chat turn has none).
    async fn execute_tool(&self, turn: Option<&Turn>, call: &ToolCall) -> Result<Value, String> {
        let _ = turn;
        Err(format!("unknown tool {:?}", call.name))
    }

    /// Runs the turn for `turn.input()`. The default runs a chat turn ([`Turn::chat`]); override
    /// it for workflow-style work, streaming through [`Turn::emit`]. An `Err` ends the run as
    /// `error`; a cancel drops this future.
    async fn run(&self, turn: &Turn) -> Result<TurnOutput, String> {
        turn.chat(self).await
    }
}

struct LiveRun {
    subscribers: Vec<mpsc::UnboundedSender<Vec<u8>>>,
    next_index: i64,
    cancel: CancelToken,
    terminal_only: bool,
    progress: Coalescer,
}

struct ChildCore {
    state: State,
    env: Env,
    sql: DoSql,
    chat: Chat,
    live: RefCell<HashMap<String, LiveRun>>,
}

const LOST_TURN: &str =
    "the child's turn stopped when its Durable Object restarted; its partial output is kept, not re-run";

impl ChildCore {
    fn runs(&self) -> ChildRuns<'_, DoSql> {
        ChildRuns::new(&self.sql)
    }

    /// Stores a chunk, sends it to the child's own chat clients, and fans it out to the tails,
    /// in one synchronous step. Progress is not stored. Chat clients get a run's chunks only
    /// while its chat stream is open (between its `start` and its final frame): a chat client
    /// would take a chunk outside that window for a new message.
    fn emit(&self, run_id: &str, kind: ChunkKind, body: String) -> bool {
        self.emit_kept(run_id, kind, body, None)
    }

    /// [`ChildCore::emit`], with what the parent keeps for replay when it differs from `body`.
    fn emit_kept(&self, run_id: &str, kind: ChunkKind, body: String, kept: Option<String>) -> bool {
        let mut live = self.live.borrow_mut();
        let Some(run) = live.get_mut(run_id) else { return false };
        let streaming = self.chat.is_streaming(run_id);
        let index = match kind {
            ChunkKind::Progress => {
                if streaming {
                    self.chat.send(&self.state, run_id, &body);
                }
                None
            }
            ChunkKind::Stored | ChunkKind::Milestone => {
                let index = run.next_index;
                if !self.chat.store(run_id, index, kind, &body) {
                    return false;
                }
                if streaming && (kind == ChunkKind::Milestone || !run.terminal_only) {
                    self.chat.send(&self.state, run_id, &body);
                }
                run.next_index += 1;
                Some(index)
            }
        };
        let line = TailLine::Chunk { i: index, k: kind, b: body, r: kept }.to_line().into_bytes();
        run.subscribers.retain(|s| s.unbounded_send(line.clone()).is_ok());
        true
    }

    /// Sends a progress report: live with its `data`, kept for replay without it unless
    /// persisted.
    fn emit_progress(&self, run_id: &str, report: &Report) {
        if let Ok(snapshot) = serde_json::to_value(report.kept()) {
            if let Err(e) = self.runs().record_progress(run_id, &snapshot, now_ms()) {
                worker::console_error!("agent-tools: progress of {run_id} failed: {e}");
            }
        }
        let id = random_id();
        let live = chunk::progress(&id, &report.progress);
        let kept = (!report.persist && report.progress.data.is_some()).then(|| chunk::progress(&id, &report.kept()));
        self.emit_kept(run_id, ChunkKind::Progress, live, kept);
    }

    /// Sends the progress report a burst held back, if any.
    fn flush_progress(&self, run_id: &str) {
        let held = self.live.borrow_mut().get_mut(run_id).and_then(|run| run.progress.flush(now_ms()));
        if let Some(report) = held {
            self.emit_progress(run_id, &report);
        }
    }

    /// Records the outcome (unless the run already ended), sends the `end` line to every tail
    /// and closes them. Held progress goes out first: the latest report is never lost.
    fn seal(&self, run_id: &str, outcome: &RunOutcome) {
        self.flush_progress(run_id);
        if let Err(e) = self.runs().finish(run_id, outcome, now_ms()) {
            worker::console_error!("agent-tools: sealing {run_id} failed: {e}");
        }
        let stored = self.runs().get(run_id).ok().flatten().and_then(|r| r.outcome());
        let line = TailLine::End { outcome: stored.unwrap_or_else(|| outcome.clone()) }.to_line().into_bytes();
        if let Some(run) = self.live.borrow_mut().remove(run_id) {
            for s in run.subscribers {
                let _ = s.unbounded_send(line.clone());
            }
        }
    }

    /// A `starting`/`running` row with no turn in this instance lost its turn in a restart:
    /// seal it with a clear error rather than leave it running forever.
    fn reconcile(&self, run: ChildRun) -> ChildRun {
        if run.status.is_terminal() || self.live.borrow().contains_key(&run.run_id) {
            return run;
        }
        let outcome =
            RunOutcome { status: OutcomeStatus::Error, summary: None, output: None, error: Some(LOST_TURN.into()) };
        self.seal(&run.run_id, &outcome);
        self.runs().get(&run.run_id).ok().flatten().unwrap_or(run)
    }
}

/// Binds a [`ChildAgent`] to its Durable Object. Delegate `fetch`, `websocket_message` and
/// `websocket_close` to it.
pub struct ChildHost<C: ChildAgent> {
    core: Rc<ChildCore>,
    agent: Rc<C>,
}

type BodyStream = Pin<Box<dyn Stream<Item = worker::Result<Vec<u8>>>>>;

impl<C: ChildAgent> ChildHost<C> {
    /// Creates the host and its tables.
    pub fn new(state: State, env: Env, agent: C) -> Self {
        let sql = DoSql(state.storage().sql());
        let runs = ChildRuns::new(&sql);
        if let Err(e) = runs.migrate().and_then(|_| crate::store::Sql::batch(&sql, meta::SCHEMA)) {
            worker::console_error!("agent-tools: child schema failed: {e}");
        }
        let chat =
            Chat::new(sql.clone()).with_reserved_ids(|sql, id| matches!(ChildRuns::new(sql).get(id), Ok(Some(_))));
        let core = Rc::new(ChildCore { state, env, sql, chat, live: RefCell::new(HashMap::new()) });
        Self { core, agent: Rc::new(agent) }
    }

    /// The agent.
    pub fn agent(&self) -> &C {
        &self.agent
    }

    /// Serves the parent's requests and drill-in clients.
    pub async fn fetch(&self, mut req: Request) -> worker::Result<Response> {
        let url = req.url()?;
        if !url.path().starts_with("/_agent_tools/") {
            return self.serve_client(&req, url.path());
        }
        let query: HashMap<String, String> = url.query_pairs().into_owned().collect();
        let run_id = query.get("runId").cloned().unwrap_or_default();
        match (req.method(), url.path()) {
            (Method::Post, "/_agent_tools/start") => match req.json::<StartRequest>().await {
                Ok(start) => self.start(start),
                Err(e) => json_error(400, format!("malformed start request: {e}")),
            },
            (Method::Get, "/_agent_tools/tail") => {
                let after = query.get("after").and_then(|a| a.parse::<i64>().ok()).unwrap_or(-1);
                self.tail(&run_id, after)
            }
            (Method::Get, "/_agent_tools/inspect") => self.inspect(&run_id),
            (Method::Post, "/_agent_tools/cancel") => match req.json::<CancelRequest>().await {
                Ok(cancel) => self.cancel(cancel),
                Err(e) => json_error(400, format!("malformed cancel request: {e}")),
            },
            (Method::Post, "/_agent_tools/clear") => self.clear().await,
            (_, path) => json_error(404, format!("{} has no route {path}", C::CLASS)),
        }
    }

    /// A drill-in request, forwarded by the parent after its gate.
    fn serve_client(&self, req: &Request, path: &str) -> worker::Result<Response> {
        let Some(sub) = parse_agent_path(path).and_then(|p| Some((p.sub?, p.rest))) else {
            return json_error(404, format!("{} is reached through its parent's /sub/ route", C::CLASS));
        };
        let (sub, rest) = sub;
        let upgrade = req.headers().get("upgrade")?.unwrap_or_default();
        if upgrade.eq_ignore_ascii_case("websocket") {
            let pair = WebSocketPair::new()?;
            let connection = chat::accept(&self.core.state, &pair.server);
            self.core.chat.on_connect(&pair.server, &connection);
            let identity = json!({ "type": "cf_agent_identity", "name": sub.name, "agent": kebab_case(C::CLASS) });
            pair.server.send_with_str(identity.to_string())?;
            let mcp = json!({ "type": "cf_agent_mcp_servers",
                              "mcp": { "servers": {}, "tools": [], "prompts": [], "resources": [] } });
            pair.server.send_with_str(mcp.to_string())?;
            return Response::from_websocket(pair.client);
        }
        match rest.as_str() {
            "/get-messages" => Response::from_json(&self.core.chat.messages()),
            "" => Response::from_json(&json!({ "agent": kebab_case(C::CLASS), "name": sub.name })),
            other => json_error(404, format!("{} has no route {other}", C::CLASS)),
        }
    }

    /// Handles one frame from a drill-in client: the child's own chat.
    pub async fn websocket_message(&self, ws: WebSocket, message: WebSocketIncomingMessage) -> worker::Result<()> {
        match self.core.chat.receive(&self.core.state, &ws, message) {
            ChatAction::Done => {}
            ChatAction::Call(call) => {
                let reply = RpcResponse::err(call.id, format!("Method {} does not exist", call.method));
                let _ = ws.send_with_str(reply.to_json());
            }
            ChatAction::RunTurn { request_id, sender } => self.chat_turn(request_id, sender).await,
            ChatAction::Cancel { request_id } => {
                self.core.chat.cancel(&request_id, "cancelled by the client");
            }
        }
        Ok(())
    }

    /// Handles a drill-in client going away.
    pub async fn websocket_close(&self, ws: WebSocket, code: usize, reason: String) -> worker::Result<()> {
        self.core.chat.closed(&ws, code, reason);
        Ok(())
    }

    /// A chat turn a drill-in client asked for (outside any agent-tool run; its request id
    /// never names a run, see [`Chat::with_reserved_ids`]).
    async fn chat_turn(&self, request_id: String, sender: String) {
        let core = &self.core;
        let provider = match self.agent.model(&core.env, None) {
            Ok(p) => p,
            Err(e) => return core.chat.fail_request(&core.state, &request_id, &e.to_string()),
        };
        let model = PlatformModel { provider, env: &core.env };
        let tools = ChildTools { agent: &*self.agent, turn: None };
        let (system, max_steps) = (self.agent.system_prompt(), self.agent.max_steps());
        core.chat.run_client_turn(&core.state, &request_id, Some(sender), system, max_steps, &model, &tools).await;
    }
}

fn status_str(s: ChildStatus) -> &'static str {
    match s {
        ChildStatus::Starting => "starting",
        ChildStatus::Running => "running",
        ChildStatus::Completed => "completed",
        ChildStatus::Error => "error",
        ChildStatus::Aborted => "aborted",
    }
}
