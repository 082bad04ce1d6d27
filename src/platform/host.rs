//! [`AgentHost`]: one agent bound to its Durable Object. It serves the agent's clients (HTTP,
//! WebSocket chat, RPC, replay, drill-in), its parent (the internal child routes), and its
//! alarm (recovery, the detached backbone, scheduled tasks). The parent role lives in
//! `platform/parent/`, the child role in `platform/child/`.
//!
//! A client that connects is accepted and replayed in one synchronous step, and every frame is
//! stored and broadcast in another, so every frame reaches a client exactly once: in the replay
//! if it was stored before, live if after.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::time::Duration;

use futures::channel::oneshot;
use serde_json::{json, Value};
use worker::{Delay, Env, Method, Request, Response, State, WebSocket, WebSocketIncomingMessage, WebSocketPair};

use super::chat::{self, Chat, ChatAction};
use super::{json_error, DoSql};
use crate::agent::{Agent, SubAgent};
use crate::cancel::CancelToken;
use crate::child::engine::{ChildEngine, SubscriberId};
use crate::child::runs::ChildRuns;
use crate::parent::engine::ParentEngine;
use crate::parent::registry::{Registry, ReplayCursor};
use crate::protocol::rpc::RpcResponse;
use crate::routing::{kebab_case, parse_agent_path, AgentPath, RequestUrl};
use crate::schedule::Schedule;
use crate::store::{meta, Sql};
use crate::tools::Tools;
use crate::types::AgentToolOptions;
use crate::types::{RunResult, ScheduledTask};

use super::hooks::{Hooks, LocalFuture, Parts};

/// What an agent's Durable Object holds, whatever the agent's type: its platform handles, its
/// chat, its engines and the driver's state, and the agent itself behind [`Hooks`].
pub(crate) struct Core {
    /// The agent's class name ([`crate::AgentClass::CLASS`]).
    pub(crate) class: &'static str,
    /// The agent and its tools.
    pub(crate) hooks: Rc<dyn Hooks>,
    pub(crate) state: State,
    pub(crate) env: Env,
    pub(crate) sql: DoSql,
    pub(crate) chat: Chat,
    /// Why this agent cannot serve (a broken tool declaration, a missing binding); every
    /// request is answered with it.
    pub(crate) config_error: Option<String>,
    // ----- the parent role
    /// Whether the parent role's tables exist here: an object makes them with its first parent
    /// work ([`AgentHost::parent_sql`]), so a child that never dispatches never has them.
    pub(crate) parent_tables: Cell<bool>,
    /// The decisions about the runs this agent dispatches.
    pub(crate) parent: RefCell<ParentEngine>,
    /// Callers waiting for a run's result, by run id.
    pub(crate) waiters: RefCell<HashMap<String, Vec<oneshot::Sender<RunResult>>>>,
    /// The children's tails being read, by run id (cancel one to stop reading).
    pub(crate) tails: RefCell<HashMap<String, CancelToken>>,
    /// Tails that came back with their start (the child's log index they follow, and the
    /// response), for the engine's next `OpenTail` of that run to take instead of a new request.
    pub(crate) started_tails: RefCell<HashMap<String, (i64, worker::Response)>>,
    /// The agent-tool runs each chat turn dispatched, by request id (to cancel them with it).
    pub(crate) turn_runs: RefCell<HashMap<String, Vec<String>>>,
    /// When the object's one timer fires, if armed (the engines' next deadline), and which arm
    /// it is.
    pub(crate) timer_at: Cell<Option<i64>>,
    pub(crate) timer_gen: Cell<u64>,
    /// When the pending alarm fires, as far as this instance knows.
    pub(crate) alarm_at: Cell<Option<i64>>,
    /// Client sockets whose replay is still going out (not in the live broadcast yet).
    pub(crate) catching_up: RefCell<HashSet<String>>,
    /// Serializes [`AgentHost::arm_alarm_at`].
    pub(crate) alarm_lock: futures::lock::Mutex<()>,
    // ----- the child role
    /// The decisions about the runs this agent executes for its parent.
    pub(crate) child: RefCell<ChildEngine>,
    /// The turns running here, by run id (cancel one to stop it).
    pub(crate) turns: RefCell<HashMap<String, CancelToken>>,
    /// The parents' tails of this agent's runs, by subscriber.
    pub(crate) subscribers: RefCell<HashMap<SubscriberId, futures::channel::mpsc::Sender<Vec<u8>>>>,
}

/// One agent bound to its Durable Object: what hooks receive, and what dispatches, cancels,
/// inspects and clears child runs. Clone is cheap (a shared handle).
///
/// [`crate::durable_object!`] creates one per Durable Object instance and forwards every
/// platform event to it.
pub struct AgentHost<A: Agent> {
    pub(crate) host: Host,
    pub(crate) parts: Rc<Parts<A>>,
}

impl<A: Agent> Clone for AgentHost<A> {
    fn clone(&self) -> Self {
        Self { host: self.host.clone(), parts: self.parts.clone() }
    }
}

/// An [`AgentHost`] with its agent's type erased: the one copy of the host's code every agent
/// class of the Worker runs. Clone is cheap (a shared handle).
#[derive(Clone)]
pub(crate) struct Host(pub(crate) Rc<Core>);

/// Frames a replay sends before it lets the socket drain.
const REPLAY_PAGE: usize = 1024;

impl<A: Agent> AgentHost<A> {
    #[doc(hidden)] // called by the class `durable_object!` generates
    /// Creates the host and its tables. Called by the Durable Object's constructor.
    pub fn new(state: State, env: Env) -> Self {
        let sql = DoSql::of(&state);
        let agent = A::default();
        let migrated = migrate(&sql);
        let parent_tables = matches!(migrated, Ok(true));
        let mut config_error = migrated.err().map(|e| {
            format!(
                "{}: its SQLite storage failed ({e}); list {:?} in a [[migrations]] new_sqlite_classes of wrangler.toml",
                A::CLASS,
                A::CLASS
            )
        });
        let tools = agent.tools();
        if config_error.is_none() {
            config_error = tools.check().err().map(|e| format!("{}: {e}", A::CLASS));
        }
        if config_error.is_none() {
            config_error = check_bindings(&tools, &env);
        }
        if let Some(e) = &config_error {
            worker::console_error!("agent-tools: {e}");
        }
        let options = agent.agent_tool_options(&env);
        let parts = Rc::new(Parts { agent, tools });
        let host = Host::new(A::CLASS, parts.clone(), state, env, sql, options, config_error, parent_tables);
        Self { host, parts }
    }

    /// The agent.
    pub fn agent(&self) -> &A {
        &self.parts.agent
    }

    /// The Worker environment (vars, secrets, bindings).
    pub fn env(&self) -> &Env {
        &self.host.0.env
    }

    /// The Durable Object state (storage, sockets, `wait_until`). The alarm belongs to the
    /// engine: schedule work with [`AgentHost::schedule`], never `set_alarm`/`delete_alarm`
    /// (they would cut the backbone and recovery short).
    pub fn state(&self) -> &State {
        &self.host.0.state
    }

    /// This agent's SQLite storage, for the app's own tables (the TypeScript SDK's `this.sql`).
    /// The engine's tables start with `agent_tool_` and `chat_`: read runs through
    /// [`AgentHost::agent_tool_runs`] and its siblings, and never write those tables (a write
    /// there bypasses the run state machine).
    pub fn sql(&self) -> &worker::SqlStorage {
        &self.host.0.sql.sql
    }

    /// The chat transcript (`UIMessage` JSON, oldest first).
    pub fn messages(&self) -> Vec<Value> {
        self.host.messages()
    }

    /// This instance's name: the `<name>` of `/agents/<agent>/<name>` for an agent clients
    /// reach, `<Parent>/<parent-name>/<run-id>` for a child. Learned on the first request and
    /// kept in SQL (an alarm wakes a Durable Object without one).
    pub fn name(&self) -> Option<String> {
        self.host.name()
    }

    /// Sends a text frame to every connected client (the TypeScript SDK's `broadcast`). The
    /// engine numbers `agent-tool-event` frames itself: send your own frame types.
    pub fn broadcast(&self, text: &str) {
        self.host.broadcast(text)
    }

    /// The answer [`Agent::on_request`] gives by default: a JSON 405 for a method the agent's
    /// own routes do not serve, a JSON 404 for any other path.
    pub fn default_response(&self, request: &Request) -> worker::Result<Response> {
        self.host.default_response(request)
    }

    // ----- platform events: each goes to the host's one copy of the code, boxed, so no
    // agent class gets its own.

    #[doc(hidden)] // called by the class `durable_object!` generates
    /// Serves a request: the parent's internal child routes, drill-in (`/sub/…`), WebSocket
    /// upgrades, `GET /get-messages`, and anything else through [`Agent::on_request`].
    pub async fn fetch(&self, req: Request) -> worker::Result<Response> {
        let served: LocalFuture<'_, _> = Box::pin(self.host.fetch(req));
        served.await
    }

    #[doc(hidden)] // called by the class `durable_object!` generates
    /// Handles one client frame: RPC calls and chat frames. Anything malformed gets an error
    /// frame and the socket stays open.
    pub async fn websocket_message(&self, ws: WebSocket, message: WebSocketIncomingMessage) -> worker::Result<()> {
        let handled: LocalFuture<'_, _> = Box::pin(self.host.websocket_message(ws, message));
        handled.await
    }

    #[doc(hidden)] // called by the class `durable_object!` generates
    /// Handles a client going away.
    pub async fn websocket_close(&self, ws: WebSocket, code: usize, reason: String) -> worker::Result<()> {
        self.host.0.chat.closed(&ws, code, reason);
        Ok(())
    }

    #[doc(hidden)] // called by the class `durable_object!` generates
    /// Handles a socket error: the client is gone.
    pub async fn websocket_error(&self, ws: WebSocket) -> worker::Result<()> {
        self.host.0.chat.closed(&ws, 1011, "socket error".into());
        Ok(())
    }

    #[doc(hidden)] // called by the class `durable_object!` generates
    /// Handles the alarm: recovers undriven runs, runs the detached backbone, runs due
    /// scheduled tasks, and keeps the alarm armed for whatever comes next.
    pub async fn alarm(&self) -> worker::Result<Response> {
        let handled: LocalFuture<'_, _> = Box::pin(self.host.alarm());
        handled.await
    }

    // ----- scheduled work ---------------------------------------------------------------

    /// Schedules [`Agent::on_schedule`] with `payload` at `at` (epoch ms; the past means now).
    /// Durable: it survives restarts and shares the agent's one alarm with the engine. Returns
    /// the task's id.
    pub async fn schedule<T: serde::Serialize>(&self, at: i64, payload: &T) -> Result<String, String> {
        let payload = serde_json::to_string(payload).map_err(|e| format!("the payload does not serialize: {e}"))?;
        self.host.schedule(at, payload).await
    }

    /// Schedules a task `delay_ms` from now (see [`AgentHost::schedule`]).
    pub async fn schedule_in<T: serde::Serialize>(&self, delay_ms: u64, payload: &T) -> Result<String, String> {
        self.schedule(super::now_ms().saturating_add(delay_ms as i64), payload).await
    }

    /// Cancels a scheduled task. Returns whether it was still pending.
    pub fn cancel_schedule(&self, id: &str) -> Result<bool, String> {
        self.host.cancel_schedule(id)
    }

    /// The tasks not yet run, soonest first.
    pub fn scheduled(&self) -> Result<Vec<ScheduledTask>, String> {
        self.host.scheduled()
    }
}

impl Host {
    #[allow(clippy::too_many_arguments)]
    fn new(
        class: &'static str,
        hooks: Rc<dyn Hooks>,
        state: State,
        env: Env,
        sql: DoSql,
        options: AgentToolOptions,
        config_error: Option<String>,
        parent_tables: bool,
    ) -> Self {
        let chat =
            Chat::new(sql.clone()).with_reserved_ids(|sql, id| matches!(ChildRuns::new(sql).get(id), Ok(Some(_))));
        Self(Rc::new(Core {
            class,
            hooks,
            state,
            env,
            sql,
            chat,
            parent: RefCell::new(ParentEngine::new(class, options.clone(), incarnation())),
            child: RefCell::new(ChildEngine::new(options.recovery)),
            config_error,
            parent_tables: Cell::new(parent_tables),
            waiters: RefCell::new(HashMap::new()),
            tails: RefCell::new(HashMap::new()),
            started_tails: RefCell::new(HashMap::new()),
            turn_runs: RefCell::new(HashMap::new()),
            timer_at: Cell::new(None),
            timer_gen: Cell::new(0),
            alarm_at: Cell::new(None),
            alarm_lock: futures::lock::Mutex::new(()),
            catching_up: RefCell::new(HashSet::new()),
            turns: RefCell::new(HashMap::new()),
            subscribers: RefCell::new(HashMap::new()),
        }))
    }

    /// Runs `work` in the background, kept alive by the platform until it ends (`wait_until`).
    /// Boxed, so every background task shares one copy of the platform's spawning code.
    pub(crate) fn spawn(&self, work: impl std::future::Future<Output = ()> + 'static) {
        let work: LocalFuture<'static, ()> = Box::pin(work);
        self.0.state.wait_until(work);
    }

    /// The agent's hooks (a shared handle: each call takes one).
    pub(crate) fn hooks(&self) -> Rc<dyn Hooks> {
        self.0.hooks.clone()
    }

    pub(crate) fn messages(&self) -> Vec<Value> {
        self.0.chat.messages()
    }

    pub(crate) fn name(&self) -> Option<String> {
        meta::get(&self.0.sql, "name").ok().flatten()
    }

    pub(crate) fn broadcast(&self, text: &str) {
        for ws in self.0.state.get_websockets_with_tag(chat::CLIENT_TAG) {
            let _ = ws.send_with_str(text);
        }
    }

    /// Sends text frames, in order, to every connected client; with none connected, the
    /// frames are never built.
    pub(crate) fn broadcast_all(&self, texts: impl Iterator<Item = String>) {
        let sockets = self.0.state.get_websockets_with_tag(chat::CLIENT_TAG);
        if sockets.is_empty() {
            return;
        }
        let texts: Vec<String> = texts.collect();
        let catching_up = self.0.catching_up.borrow();
        for ws in sockets {
            // A socket still being replayed to gets these from its catch-up instead.
            if !catching_up.is_empty() && catching_up.contains(&chat::connection_id(&ws)) {
                continue;
            }
            for text in &texts {
                let _ = ws.send_with_str(text);
            }
        }
    }

    pub(crate) fn registry(&self) -> Registry<'_, DoSql> {
        Registry::new(self.parent_sql())
    }

    /// The storage for the parent role's work, its tables made first if this object has none
    /// yet (a new object makes them with its first dispatch, or the first read of its runs).
    pub(crate) fn parent_sql(&self) -> &DoSql {
        if !self.0.parent_tables.get() {
            match crate::parent::engine::create_tables(&self.0.sql) {
                Ok(()) => self.0.parent_tables.set(true),
                Err(e) => worker::console_error!("agent-tools: creating the run registry failed: {e}"),
            }
        }
        &self.0.sql
    }

    pub(crate) fn runs(&self) -> ChildRuns<'_, DoSql> {
        ChildRuns::new(&self.0.sql)
    }

    pub(crate) fn default_response(&self, request: &Request) -> worker::Result<Response> {
        let url = RequestUrl::of(request);
        let rest = parse_agent_path(url.path()).map(|p| p.rest).unwrap_or_default();
        if rest.is_empty() || rest == "/get-messages" {
            return json_error(
                405,
                format!("{} is not served here: {} answers GET and WebSocket upgrades", request.method(), self.0.class),
            );
        }
        json_error(404, format!("{} has no route {rest}", self.0.class))
    }

    // ----- platform events --------------------------------------------------------------

    pub(crate) async fn fetch(&self, req: Request) -> worker::Result<Response> {
        if let Some(problem) = &self.0.config_error {
            return json_error(500, problem.clone());
        }
        let url = RequestUrl::of(&req);
        if url.host() == crate::protocol::child_api::HOST {
            return self.serve_parent(req).await;
        }
        let Some(path) = parse_agent_path(url.path()) else {
            return json_error(404, format!("{} serves /agents/{}/<name>", self.0.class, kebab_case(self.0.class)));
        };
        if let Err(refusal) = self.hooks().authorize(self, &req).await {
            let is_socket = req.headers().get("upgrade")?.is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
            return if is_socket {
                reject_socket_with(refusal.status, &refusal.message)
            } else {
                json_error(refusal.status, refusal.message)
            };
        }
        if self.name().is_none() {
            meta::set(&self.0.sql, "name", &path.name).map_err(|e| worker::Error::RustError(e.to_string()))?;
        }
        self.ensure_recovery();
        if path.sub.is_some() {
            return self.drill_in(req, &path).await;
        }
        // A child reached by drill-in is known to its clients by its run id (the parent's URL
        // rewrite encodes it).
        let name = meta::get(&self.0.sql, "run_id").ok().flatten().unwrap_or_else(|| path.name.clone());
        let upgrade = req.headers().get("upgrade")?.unwrap_or_default();
        if upgrade.eq_ignore_ascii_case("websocket") {
            return self.connect(&name);
        }
        match (req.method(), path.rest.as_str()) {
            (Method::Get | Method::Head, "") => {
                Response::from_json(&json!({ "agent": kebab_case(self.0.class), "name": name }))
            }
            (Method::Get | Method::Head, "/get-messages") => Response::from_json(&self.messages()),
            _ => self.hooks().on_request(self, req).await,
        }
    }

    /// A `/sub/<child>/<name>` request: the gate decides, then the child gets the request with
    /// the path rewritten to its own (`/agents/<child>/<name>/<rest>`), so it serves it as any
    /// agent serves its clients (and gates a deeper `/sub/` with its own registry).
    async fn drill_in(&self, req: Request, path: &AgentPath) -> worker::Result<Response> {
        let Some(sub) = &path.sub else { return json_error(404, "no sub-agent in the path") };
        let is_socket = req.headers().get("upgrade")?.is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
        let run = self.registry().get(&sub.name).ok().flatten().filter(|r| kebab_case(&r.agent_type) == sub.agent);
        let child = SubAgent {
            class: run.as_ref().map_or_else(|| sub.agent.clone(), |r| r.agent_type.clone()),
            name: sub.name.clone(),
        };
        if let Some(refusal) = self.hooks().on_before_sub_agent(self, &req, &child).await {
            return if is_socket { reject_socket(refusal.status_code()) } else { Ok(refusal) };
        }
        let Some(run) = run else {
            let refusal = json_error(404, format!("no {} run {:?} on this {}", sub.agent, sub.name, self.0.class))?;
            return if is_socket { reject_socket(404) } else { Ok(refusal) };
        };
        let to = crate::parent::engine::child_address(self.0.class, &self.name().unwrap_or_default(), &run);
        let stub = match self.0.env.durable_object(&to.binding).and_then(|ns| ns.id_from_name(&to.name)?.get_stub()) {
            Ok(stub) => stub,
            Err(e) => return json_error(502, format!("could not reach {}: {e}", run.agent_type)),
        };
        let child_path = format!("/agents/{}/{}{}", sub.agent, crate::routing::percent_encode(&sub.name), path.rest);
        let url = RequestUrl::of(&req).with_path(&child_path);
        let mut req = req;
        let mut body = None;
        if !matches!(req.method(), Method::Get | Method::Head) {
            let bytes = req.bytes().await.unwrap_or_default();
            body = Some(js_sys::Uint8Array::from(bytes.as_slice()).into());
        }
        stub.fetch_with_request(super::new_request(&url, req.method(), Some(req.headers()), body.as_ref())?).await
    }

    fn connect(&self, name: &str) -> worker::Result<Response> {
        let pair = WebSocketPair::new()?;
        let connection = chat::accept(&self.0.state, &pair.server);
        self.0.chat.on_connect(&pair.server, &connection);
        let identity = json!({ "type": "cf_agent_identity", "name": name, "agent": kebab_case(self.0.class) });
        pair.server.send_with_str(identity.to_string())?;
        let mcp = json!({ "type": "cf_agent_mcp_servers",
                          "mcp": { "servers": {}, "tools": [], "prompts": [], "resources": [] } });
        pair.server.send_with_str(mcp.to_string())?;
        // The replay goes out after the handshake, a page at a time with the socket draining
        // in between; the socket joins the live broadcast when it has caught up.
        self.0.catching_up.borrow_mut().insert(connection.clone());
        let host = self.clone();
        let ws = pair.server.clone();
        self.spawn(async move { host.replay_to(ws, connection).await });
        Response::from_websocket(pair.client)
    }

    /// Sends a new client every retained run, [`REPLAY_PAGE`] frames at a time, yielding
    /// between pages so the socket drains (memory stays at a page, however much is retained);
    /// then, in one synchronous step, what was stored meanwhile for the runs already sent, and
    /// the socket joins the live broadcast: each frame reaches it once.
    async fn replay_to(&self, ws: WebSocket, connection: String) {
        let mut cursor = ReplayCursor::default();
        let mut send = |frame: crate::protocol::EventFrame| ws.send_with_str(frame.to_json()).is_ok();
        loop {
            match self.registry().replay_page(&mut cursor, REPLAY_PAGE, &mut send) {
                Ok(true) => Delay::from(Duration::from_millis(0)).await,
                Ok(false) => break,
                Err(e) => {
                    worker::console_error!("agent-tools: replay failed: {e}");
                    break;
                }
            }
        }
        if let Err(e) = self.registry().replay_rest(&mut cursor, &mut send) {
            worker::console_error!("agent-tools: replay failed: {e}");
        }
        self.0.catching_up.borrow_mut().remove(&connection);
    }

    pub(crate) async fn websocket_message(
        &self,
        ws: WebSocket,
        message: WebSocketIncomingMessage,
    ) -> worker::Result<()> {
        if self.0.config_error.is_some() {
            return Ok(());
        }
        self.ensure_recovery();
        match self.0.chat.receive(&self.0.state, &ws, message) {
            ChatAction::Done => {}
            ChatAction::Call(call) => {
                let reply = match self.hooks().call(self, &call.method, call.args).await {
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

    pub(crate) async fn alarm(&self) -> worker::Result<Response> {
        if self.0.config_error.is_some() {
            return Response::ok("");
        }
        self.0.alarm_at.set(None);
        // With no registry there is nothing to recover, deliver or clear.
        if self.0.parent_tables.get() {
            let actions = self.0.parent.borrow_mut().alarm(&self.0.sql, super::now_ms());
            self.carry_out(actions);
        }
        self.run_due_tasks().await;
        Response::ok("")
    }

    // ----- scheduled work ---------------------------------------------------------------

    pub(crate) async fn schedule(&self, at: i64, payload: String) -> Result<String, String> {
        let id = super::random_id();
        Schedule::new(&self.0.sql).add(&id, at, &payload).map_err(|e| e.to_string())?;
        self.arm_alarm_at(at.max(super::now_ms())).await;
        Ok(id)
    }

    pub fn cancel_schedule(&self, id: &str) -> Result<bool, String> {
        Schedule::new(&self.0.sql).cancel(id).map_err(|e| e.to_string())
    }

    pub(crate) fn scheduled(&self) -> Result<Vec<ScheduledTask>, String> {
        Schedule::new(&self.0.sql).pending().map_err(|e| e.to_string())
    }

    /// Runs the tasks that are due (claimed under a lease, so two alarms never run one task at
    /// once); a task is done once its hook returned. Then the alarm is armed for the next.
    async fn run_due_tasks(&self) {
        let schedule = Schedule::new(&self.0.sql);
        let due = match schedule.claim_due(super::now_ms()) {
            Ok(due) => due,
            Err(e) => return self.storage_failed("schedule", &e),
        };
        for task in due {
            let id = task.id.clone();
            self.hooks().on_schedule(self, task).await;
            if let Err(e) = schedule.done(&id) {
                // Run again when its lease ends.
                self.storage_failed("schedule", &e);
            }
        }
        match schedule.next_at() {
            Ok(Some(at)) => self.arm_alarm_at(at.max(super::now_ms())).await,
            Ok(None) => {}
            Err(e) => {
                self.storage_failed("schedule", &e);
                self.arm_alarm_at(super::now_ms() + crate::schedule::TASK_LEASE_MS).await;
            }
        }
    }

    /// Reports a storage failure outside the engines (`agent_tool:storage_failed`).
    pub(crate) fn storage_failed(&self, step: &str, error: &crate::store::StoreError) {
        let payload = json!({ "step": step, "error": error.to_string() });
        self.observe(crate::observability::EventType::StorageFailed, payload);
    }

    /// Makes sure the alarm fires by `at` (an earlier pending one stays).
    pub(crate) async fn arm_alarm_at(&self, at: i64) {
        if self.0.alarm_at.get().is_some_and(|pending| pending <= at) {
            return;
        }
        // One at a time: two arms that both read "no alarm" would race, and the later time
        // could overwrite the earlier.
        let _one = self.0.alarm_lock.lock().await;
        if self.0.alarm_at.get().is_some_and(|pending| pending <= at) {
            return;
        }
        let storage = self.0.state.storage();
        let pending = storage.get_alarm().await.ok().flatten();
        if pending.is_some_and(|p| p <= at) {
            self.0.alarm_at.set(pending);
            return;
        }
        // `set_alarm(i64)` takes an offset from now, not a time: pass a Date.
        let when = worker::ScheduledTime::new(js_sys::Date::new(&wasm_bindgen::JsValue::from_f64(at as f64)));
        match storage.set_alarm(when).await {
            Ok(()) => self.0.alarm_at.set(Some(at)),
            Err(e) => worker::console_error!("agent-tools: arming the alarm failed: {e}"),
        }
    }

    /// The first event of a fresh instance starts recovery once (in the background).
    pub(crate) fn ensure_recovery(&self) {
        // An object with no registry has no runs to recover.
        if self.0.parent_tables.get() {
            let actions = self.0.parent.borrow_mut().wake(&self.0.sql, super::now_ms());
            self.carry_out(actions);
        }
    }
}

/// Creates the tables every agent's object uses (its identity, the child role's runs, the
/// chat, scheduled work): on a new object in one batch, else role by role with the columns
/// added since. The parent role's tables (its registry and ledger) come with the object's first
/// parent work ([`AgentHost::parent_sql`]), or here when an earlier instance made them: the
/// answer is whether they exist.
pub(crate) fn migrate(sql: &DoSql) -> Result<bool, crate::store::StoreError> {
    let [_registry, _ledger, meta] = crate::parent::engine::SCHEMAS;
    let [child, chat] = crate::child::runs::SCHEMAS;
    let mut parent_tables = false;
    crate::store::migrate(sql, &[meta, child, chat, crate::schedule::SCHEMA], || {
        parent_tables = crate::parent::engine::has_tables(sql)?;
        if parent_tables {
            crate::parent::engine::migrate(sql)?;
        } else {
            sql.batch(meta)?;
        }
        ChildRuns::new(sql).migrate()?;
        sql.batch(crate::schedule::SCHEMA)
    })?;
    Ok(parent_tables)
}

/// A random number naming this instance's exchanges with children (see [`ParentEngine::new`]).
fn incarnation() -> u32 {
    let bytes = uuid::Uuid::new_v4().into_bytes();
    u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

/// Checks that every child class an agent's tools dispatch has its Durable Object binding.
fn check_bindings<A: Agent>(tools: &Tools<A>, env: &Env) -> Option<String> {
    for entry in &tools.entries {
        if let crate::tools::Entry::Agent(tool) = entry {
            if env.durable_object(tool.child.binding).is_err() {
                return Some(missing_binding(A::CLASS, tool.child.class, tool.child.binding));
            }
        }
    }
    None
}

/// The error for a child class whose binding is missing, naming the line to add.
pub(crate) fn missing_binding(parent: &str, class: &str, binding: &str) -> String {
    format!(
        "{parent} dispatches {class}, but the Worker has no Durable Object binding {binding:?}: add \
         [[durable_objects.bindings]] name = \"{binding}\" class_name = \"{class}\" to wrangler.toml \
         (and \"{class}\" to a [[migrations]] new_sqlite_classes)"
    )
}

/// Refuses a WebSocket the way the TypeScript SDK does: accept it, then close it at once with
/// `4000 + status` for a 4xx status (which the stock client treats as final), else 1011.
pub(crate) fn reject_socket(status: u16) -> worker::Result<Response> {
    reject_socket_with(status, &format!("Sub-agent connection rejected ({status})"))
}

/// [`reject_socket`] with a reason of the caller's (cut to the 123 bytes a close frame holds).
pub(crate) fn reject_socket_with(status: u16, reason: &str) -> worker::Result<Response> {
    let pair = WebSocketPair::new()?;
    pair.server.accept()?;
    let code = if (400..500).contains(&status) { 4000 + status } else { 1011 };
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    pair.server.close(Some(code), Some(&reason[..end]))?;
    Response::from_websocket(pair.client)
}
