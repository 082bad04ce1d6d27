//! [`AgentHost`]: one agent bound to its object. It serves the agent's clients (HTTP, WebSocket
//! chat, RPC, replay, drill-in), its parent (the child calls), and its alarm (recovery, the
//! detached backbone, scheduled tasks), over the [`Io`] of whatever runs it (a Durable Object,
//! or a test). The parent role lives in `host/parent/`, the child role in `host/child/`.
//!
//! A client that connects is accepted and replayed in one synchronous step, and every frame is
//! stored and broadcast in another, so every frame reaches a client exactly once: in the replay
//! if it was stored before, live if after.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use futures::channel::oneshot;
use serde_json::{json, Value};

use super::chat::{Chat, ChatAction};
use super::hooks::{Hooks, Parts};
use super::io::{
    is_upgrade, json_error, json_response, ByteStream, HttpRequest, HttpResponse, Io, LocalFuture, Reply, Socket,
};
use crate::agent::{Agent, SubAgent};
use crate::cancel::CancelToken;
use crate::chat::interaction::Interactions;
use crate::chat::journal::{Journal, OpenTurn};
use crate::child::engine::{ChildEngine, SubscriberId};
use crate::child::runs::ChildRuns;
use crate::error::Error;
use crate::parent::engine::ParentEngine;
use crate::parent::registry::{Registry, ReplayCursor};
use crate::protocol::rpc::RpcResponse;
use crate::routing::{kebab_case, parse_agent_path, AgentPath, RequestUrl};
use crate::schedule::Schedule;
use crate::store::{meta, Sql, StoreError};
use crate::tools::Tools;
use crate::types::{AgentToolOptions, RunResult, ScheduledTask};

/// What an agent's object holds, whatever the agent's type: its platform beneath, its chat, its
/// engines and the driver's state, and the agent itself behind [`Hooks`].
/// Wakes a run waiting for a message from its parent ([`crate::Turn::wait_for`]).
pub(crate) type Arrival = oneshot::Sender<()>;

pub(crate) struct Core {
    /// The agent's class name ([`crate::AgentClass::CLASS`]).
    pub(crate) class: &'static str,
    /// The agent and its tools.
    pub(crate) hooks: Rc<dyn Hooks>,
    /// The platform beneath.
    pub(crate) io: Rc<dyn Io>,
    pub(crate) chat: Chat,
    /// Why this agent cannot serve (a broken tool declaration, a missing binding); every
    /// request is answered with it.
    pub(crate) config_error: Option<String>,
    /// Why its tables could not be made: tried again at each event (a statement that failed
    /// once, say on a full disk, must not leave the object refusing everything until it is
    /// evicted), and answered with while it keeps failing (a class with no SQLite storage).
    pub(crate) storage_error: RefCell<Option<String>>,
    // ----- the parent role
    /// Whether the parent role's tables exist here: an object makes them with its first parent
    /// work ([`Host::parent_sql`]), so a child that never dispatches never has them.
    pub(crate) parent_tables: Cell<bool>,
    /// The decisions about the runs this agent dispatches.
    pub(crate) parent: RefCell<ParentEngine>,
    /// Callers waiting for a run's result, by run id.
    pub(crate) waiters: RefCell<HashMap<String, Vec<oneshot::Sender<RunResult>>>>,
    /// The runs of this child waiting for a message from their parent, by (run id, name).
    pub(crate) inbox_waiters: RefCell<HashMap<(String, String), Vec<Arrival>>>,
    /// Who waits for every run's turn here to have ended and recorded its end (a clear).
    pub(crate) turns_idle: RefCell<Vec<futures::channel::oneshot::Sender<()>>>,
    /// The children's tails being read, by run id (cancel one to stop reading).
    pub(crate) tails: RefCell<HashMap<String, CancelToken>>,
    /// Tails that came back with their start (the child's log index they follow, and the
    /// stream), for the engine's next `OpenTail` of that run to take instead of a new call.
    pub(crate) started_tails: RefCell<HashMap<String, (i64, ByteStream)>>,
    /// The agent-tool runs each chat turn dispatched, by request id (to cancel them with it).
    pub(crate) turn_runs: RefCell<HashMap<String, Vec<String>>>,
    /// When the object's one timer fires, if armed (the engines' next deadline), and which arm
    /// it is.
    pub(crate) timer_at: Cell<Option<i64>>,
    /// Cancels the armed timer's task (a later arm for an earlier time replaces it).
    pub(crate) timer: RefCell<Option<CancelToken>>,
    /// When the pending alarm fires, as far as this instance knows.
    pub(crate) alarm_at: Cell<Option<i64>>,
    /// Client sockets whose replay is still going out (not in the live broadcast yet).
    pub(crate) catching_up: RefCell<HashSet<String>>,
    /// Whether this instance looked for chat turns a restart cut short (once, at its first
    /// event).
    pub(crate) chat_recovery: Cell<bool>,
    /// How many times a cut chat turn is continued at most.
    pub(crate) chat_recovery_attempts: u32,
    /// Serializes [`Host::arm_alarm_at`].
    pub(crate) alarm_lock: futures::lock::Mutex<()>,
    // ----- the child role
    /// The decisions about the runs this agent executes for its parent.
    pub(crate) child: RefCell<ChildEngine>,
    /// The turns running here, by run id (cancel one to stop it).
    pub(crate) turns: RefCell<HashMap<String, CancelToken>>,
    /// The parents' tails of this agent's runs, by subscriber.
    pub(crate) subscribers: RefCell<HashMap<SubscriberId, futures::channel::mpsc::Sender<Vec<u8>>>>,
}

/// One agent bound to its object: what hooks receive, and what dispatches, cancels, inspects
/// and clears child runs. Clone is cheap (a shared handle).
///
/// [`crate::durable_object!`] creates one per Durable Object instance and forwards every
/// platform event to it; the test kit creates one per simulated object.
pub struct AgentHost<A: Agent> {
    pub(crate) host: Host,
    pub(crate) parts: Rc<Parts<A>>,
}

/// The agent class it hosts (its storage, sockets and runs are not listed).
impl<A: Agent> std::fmt::Debug for AgentHost<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentHost").field("class", &self.host.0.class).finish_non_exhaustive()
    }
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

/// How often the alarm looks in while a chat turn is open: a turn a restart cut short is
/// continued within this time even when no client comes back.
pub(crate) const CHAT_WATCH_MS: i64 = 5_000;

/// Frames a replay sends before it lets the socket drain.
const REPLAY_PAGE: usize = 1024;

impl<A: Agent> AgentHost<A> {
    /// The host of a new object over `io`: its tables made, its tools checked.
    pub(crate) fn with_io(io: Rc<dyn Io>) -> Self {
        let agent = A::default();
        let migrated = migrate(io.sql());
        let parent_tables = matches!(migrated, Ok(true));
        let storage_error = migrated.err().map(|e| storage_problem(A::CLASS, &e));
        let tools = agent.tools();
        let mut config_error = tools.check().err().map(|e| format!("{}: {e}", A::CLASS));
        if config_error.is_none() {
            config_error = check_bindings(&tools, io.as_ref());
        }
        if let Some(e) = config_error.as_ref().or(storage_error.as_ref()) {
            io.log(&format!("agent-tools: {e}"), true);
        }
        let options = agent.agent_tool_options(io.env());
        let parts = Rc::new(Parts { agent, tools });
        let host = Host::new(A::CLASS, parts.clone(), io, options, config_error, parent_tables);
        *host.0.storage_error.borrow_mut() = storage_error;
        Self { host, parts }
    }

    /// The agent.
    pub fn agent(&self) -> &A {
        &self.parts.agent
    }

    /// The Worker environment (vars, secrets, and in a Worker its bindings).
    pub fn env(&self) -> &crate::Env {
        self.host.0.io.env()
    }

    /// The Durable Object state (storage, sockets, `wait_until`), in a Worker; `None` in a
    /// test. The alarm belongs to the engine: schedule work with [`AgentHost::schedule`], never
    /// `set_alarm`/`delete_alarm` (they would cut the backbone and recovery short).
    pub fn state(&self) -> Option<&worker::State> {
        self.host.0.io.state()
    }

    /// This agent's SQLite storage, for the app's own tables (the TypeScript SDK's `this.sql`).
    /// The engine's tables start with `agent_tool_` and `chat_`: read runs through
    /// [`AgentHost::agent_tool_runs`] and its siblings, and never write those tables (a write
    /// there bypasses the run state machine).
    pub fn sql(&self) -> crate::sql::Storage<'_> {
        crate::sql::Storage::new(self.host.0.io.sql())
    }

    /// Runs `work` in the background, after the current request if need be (a Worker's
    /// `wait_until`).
    pub fn spawn(&self, work: impl std::future::Future<Output = ()> + 'static) {
        self.host.spawn(work)
    }

    /// Writes a line to the log (the Worker's console; the test kit's captured log).
    pub fn log(&self, line: &str) {
        self.host.0.io.log(line, false);
    }

    /// Writes an error line to the log.
    pub fn log_error(&self, line: &str) {
        self.host.0.io.log(line, true);
    }

    /// Resolves after `duration` on this object's clock (the runtime's timers in a Worker, the
    /// test kit's virtual clock in a test).
    pub fn sleep(&self, duration: Duration) -> impl std::future::Future<Output = ()> + 'static {
        self.host.0.io.sleep(crate::types::ms(duration) as u64)
    }

    /// The time now on this object's clock (`Date.now()` in a Worker, where
    /// `SystemTime::now()` is not available; the test kit's virtual clock in a test).
    pub fn now(&self) -> SystemTime {
        crate::types::time_of(self.host.now())
    }

    /// This agent's state (the TypeScript SDK's `this.state`; [`AgentHost::state`] is the Durable
    /// Object's), read as `S`: `S::default()` when
    /// it was never set. A state that does not read as `S` is an [`Error::Invalid`].
    ///
    /// ```
    /// # use agent_tools::prelude::*;
    /// # #[derive(Default)] pub struct Assistant;
    /// # impl Agent for Assistant {}
    /// # agent_tools::durable_object!(Assistant, unchecked);
    /// #[derive(Default, serde::Serialize, serde::Deserialize)]
    /// struct Budget {
    ///     runs: u32,
    /// }
    /// async fn spend(host: &AgentHost<Assistant>) -> Result<u32, Error> {
    ///     let mut budget: Budget = host.agent_state()?;
    ///     budget.runs = budget.runs.saturating_sub(1);
    ///     host.set_agent_state(&budget).await?; // every client gets it (`onStateUpdate`)
    ///     Ok(budget.runs)
    /// }
    /// # fn main() {}
    /// ```
    pub fn agent_state<S: serde::de::DeserializeOwned + Default>(&self) -> Result<S, Error> {
        match crate::state::get(self.host.sql())? {
            None => Ok(S::default()),
            Some(state) => serde_json::from_value(state)
                .map_err(|e| Error::json("the stored state does not read as the type asked for", e)),
        }
    }

    /// Sets this agent's state (the TypeScript SDK's `setState`): stored, sent to every client
    /// as `cf_agent_state`, then [`Agent::on_state_changed`] runs with
    /// [`crate::StateSource::Server`]. Not validated: [`Agent::validate_state_change`] guards
    /// clients' changes.
    pub async fn set_agent_state<S: serde::Serialize>(&self, state: &S) -> Result<(), Error> {
        let state = serde_json::to_value(state).map_err(|e| Error::json("the state does not serialize", e))?;
        self.host.set_state(state).await
    }

    /// The chat transcript (`UIMessage` JSON, oldest first).
    pub fn messages(&self) -> Vec<Value> {
        self.host.messages()
    }

    /// This instance's name: the `<name>` of `/agents/<agent>/<name>` for an agent clients
    /// reach, `<Parent>/<parent-name>/<run-id>` for a child. Learned on the first request and
    /// kept in SQL (an alarm wakes a Durable Object without one). `Ok(None)` before the first
    /// request; `Err(Storage)` when it cannot be read (never a silent `None`).
    pub fn name(&self) -> Result<Option<String>, Error> {
        meta::get(self.host.sql(), "name").map_err(Error::Storage)
    }

    /// Sends a text frame to every connected client (the TypeScript SDK's `broadcast`). The
    /// engine numbers `agent-tool-event` frames itself: send your own frame types.
    pub fn broadcast(&self, text: &str) {
        self.host.broadcast(text)
    }

    /// The answer [`Agent::on_request`] gives by default: a JSON 405 for a method the agent's
    /// own routes do not serve, a JSON 404 for any other path.
    pub fn default_response(&self, request: &HttpRequest) -> HttpResponse {
        self.host.default_response(request)
    }

    // ----- scheduled work ---------------------------------------------------------------

    /// Schedules [`Agent::on_schedule`] with `payload` at `at` (the past means now). Durable: it
    /// survives restarts and shares the agent's one alarm with the engine. Returns the task's id.
    pub async fn schedule<T: serde::Serialize>(&self, at: SystemTime, payload: &T) -> Result<String, Error> {
        let payload = serde_json::to_string(payload).map_err(|e| Error::json("the payload does not serialize", e))?;
        Ok(self.host.schedule(crate::types::epoch_ms(at), payload).await?)
    }

    /// Schedules a task `delay` from now (see [`AgentHost::schedule`]).
    pub async fn schedule_in<T: serde::Serialize>(&self, delay: Duration, payload: &T) -> Result<String, Error> {
        let at = self.host.now().saturating_add(crate::types::ms(delay));
        self.host
            .schedule(at, serde_json::to_string(payload).map_err(|e| Error::json("the payload does not serialize", e))?)
            .await
            .map_err(Error::Storage)
    }

    /// Cancels a scheduled task. Returns whether it was still pending.
    pub fn cancel_schedule(&self, id: &str) -> Result<bool, Error> {
        self.host.cancel_schedule(id).map_err(Error::Storage)
    }

    /// The tasks not yet run, soonest first.
    pub fn scheduled(&self) -> Result<Vec<ScheduledTask>, Error> {
        self.host.scheduled().map_err(Error::Storage)
    }
}

impl Host {
    fn new(
        class: &'static str,
        hooks: Rc<dyn Hooks>,
        io: Rc<dyn Io>,
        options: AgentToolOptions,
        config_error: Option<String>,
        parent_tables: bool,
    ) -> Self {
        let chat = Chat::new(io.clone())
            .with_reserved_ids(|sql, id| !matches!(ChildRuns::new(sql).get(id), Ok(None)))
            .with_sub_agent_check(|sql| !matches!(ChildRuns::new(sql).any(), Ok(false)));
        chat.set_approval_timeout(options.approval_timeout);
        let incarnation = incarnation(io.as_ref());
        let keep = {
            let hooks = hooks.clone();
            crate::child::engine::KeepRecovering(Rc::new(move |run| hooks.should_keep_recovering(run)))
        };
        Self(Rc::new(Core {
            class,
            hooks,
            io,
            chat,
            parent: RefCell::new(ParentEngine::new(class, options.clone(), incarnation)),
            child: RefCell::new(ChildEngine::new(options.recovery).with_recovery(
                options.max_recovery_attempts,
                options.max_recovery_work,
                keep,
            )),
            config_error,
            storage_error: RefCell::new(None),
            parent_tables: Cell::new(parent_tables),
            waiters: RefCell::new(HashMap::new()),
            inbox_waiters: RefCell::new(HashMap::new()),
            turns_idle: RefCell::new(Vec::new()),
            tails: RefCell::new(HashMap::new()),
            started_tails: RefCell::new(HashMap::new()),
            turn_runs: RefCell::new(HashMap::new()),
            timer_at: Cell::new(None),
            timer: RefCell::new(None),
            alarm_at: Cell::new(None),
            chat_recovery: Cell::new(false),
            chat_recovery_attempts: options.max_recovery_attempts,
            alarm_lock: futures::lock::Mutex::new(()),
            catching_up: RefCell::new(HashSet::new()),
            turns: RefCell::new(HashMap::new()),
            subscribers: RefCell::new(HashMap::new()),
        }))
    }

    /// Runs `work` in the background, kept alive by the platform until it ends. Boxed, so every
    /// background task shares one copy of the platform's spawning code.
    pub(crate) fn spawn(&self, work: impl std::future::Future<Output = ()> + 'static) {
        let work: LocalFuture<'static, ()> = Box::pin(work);
        self.0.io.spawn(work);
    }

    /// Now, on the platform's clock.
    pub(crate) fn now(&self) -> i64 {
        self.0.io.now()
    }

    /// The object's storage.
    pub(crate) fn sql(&self) -> &dyn Sql {
        self.0.io.sql()
    }

    /// Writes a log line.
    pub(crate) fn log(&self, line: &str) {
        self.0.io.log(line, false);
    }

    /// Writes an error to the log.
    pub(crate) fn log_error(&self, line: &str) {
        self.0.io.log(&format!("agent-tools: {line}"), true);
    }

    /// The agent's hooks (a shared handle: each call takes one).
    pub(crate) fn hooks(&self) -> Rc<dyn Hooks> {
        self.0.hooks.clone()
    }

    pub(crate) fn messages(&self) -> Vec<Value> {
        self.0.chat.messages()
    }

    pub(crate) fn name(&self) -> Option<String> {
        meta::get(self.sql(), "name").ok().flatten()
    }

    /// This agent's name, to address its children by (`<Class>/<name>/<run>`): an error when it
    /// cannot be read or the agent has none yet, never an empty name that would address another
    /// parent's children.
    pub(crate) fn own_name(&self) -> Result<String, String> {
        match meta::get(self.sql(), "name") {
            Ok(Some(name)) if !name.is_empty() => Ok(name),
            Ok(_) => Err(format!("this {} has no name yet", self.0.class)),
            Err(e) => Err(format!("this agent's name could not be read: {e}")),
        }
    }

    pub(crate) fn broadcast(&self, text: &str) {
        for socket in self.0.io.sockets() {
            socket.send(text);
        }
    }

    /// Sends text frames, in order, to every connected client; with none connected, the
    /// frames are never built.
    pub(crate) fn broadcast_all(&self, texts: impl Iterator<Item = String>) {
        let sockets = self.0.io.sockets();
        if sockets.is_empty() {
            return;
        }
        let texts: Vec<String> = texts.collect();
        let catching_up = self.0.catching_up.borrow();
        for socket in sockets {
            // A socket still being replayed to gets these from its catch-up instead.
            if !catching_up.is_empty() && catching_up.contains(&socket.id()) {
                continue;
            }
            for text in &texts {
                socket.send(text);
            }
        }
    }

    pub(crate) fn registry(&self) -> Registry<'_, dyn Sql + '_> {
        Registry::new(self.parent_sql())
    }

    /// The storage for the parent role's work, its tables made first if this object has none
    /// yet (a new object makes them with its first dispatch, or the first read of its runs).
    pub(crate) fn parent_sql(&self) -> &dyn Sql {
        if !self.0.parent_tables.get() {
            match crate::parent::engine::create_tables(self.sql()) {
                Ok(()) => self.0.parent_tables.set(true),
                Err(e) => self.log_error(&format!("creating the run registry failed: {e}")),
            }
        }
        self.sql()
    }

    pub(crate) fn runs(&self) -> ChildRuns<'_, dyn Sql + '_> {
        ChildRuns::new(self.sql())
    }

    pub(crate) fn default_response(&self, request: &HttpRequest) -> HttpResponse {
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

    /// Serves a client's request: drill-in (`/sub/…`), WebSocket upgrades, `GET`,
    /// `GET /get-messages`, and anything else through [`Agent::on_request`].
    pub(crate) async fn fetch(&self, req: HttpRequest) -> Reply {
        if let Some(problem) = self.unready() {
            return Reply::Http(json_error(500, problem));
        }
        let url = RequestUrl::of(&req);
        let Some(path) = parse_agent_path(url.path()) else {
            let problem = format!("{} serves /agents/{}/<name>", self.0.class, kebab_case(self.0.class));
            return Reply::Http(json_error(404, problem));
        };
        if let Err(refusal) = self.hooks().authorize(self, &req).await {
            return self.refuse(&req, refusal.status, &refusal.message);
        }
        if self.name().is_none() {
            if let Err(e) = meta::set(self.sql(), "name", &path.name) {
                return Reply::Http(json_error(500, format!("this agent's identity could not be kept: {e}")));
            }
        }
        self.ensure_recovery();
        if path.sub.is_some() {
            return self.drill_in(req, &path).await;
        }
        // A child reached by drill-in is known to its clients by its run id (the parent's URL
        // rewrite encodes it).
        let name = meta::get(self.sql(), "run_id").ok().flatten().unwrap_or_else(|| path.name.clone());
        if is_upgrade(&req) {
            return self.connect(&name);
        }
        let read = matches!(*req.method(), http::Method::GET | http::Method::HEAD);
        match (read, path.rest.as_str()) {
            (true, "") => Reply::Http(json_response(200, &json!({ "agent": kebab_case(self.0.class), "name": name }))),
            (true, "/get-messages") => Reply::Http(json_response(200, &self.messages())),
            _ => Reply::Http(self.hooks().on_request(self, req).await),
        }
    }

    /// Refuses a request: HTTP with `{"error": message}` and `status`; a WebSocket accepted and
    /// closed at once with `4000 + status` (which the stock client treats as final), the way the
    /// TypeScript SDK does.
    fn refuse(&self, req: &HttpRequest, status: u16, message: &str) -> Reply {
        if !is_upgrade(req) {
            return Reply::Http(json_error(status, message));
        }
        let code = if (400..500).contains(&status) { 4000 + status } else { 1011 };
        let mut end = message.len().min(123);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        self.0.io.refuse_socket(code, &message[..end]).unwrap_or_else(|e| Reply::Http(json_error(500, e)))
    }

    /// A `/sub/<child>/<name>` request: the gate decides, then the child gets the request with
    /// the path rewritten to its own (`/agents/<child>/<name>/<rest>`), so it serves it as any
    /// agent serves its clients (and gates a deeper `/sub/` with its own registry).
    async fn drill_in(&self, req: HttpRequest, path: &AgentPath) -> Reply {
        let Some(sub) = &path.sub else { return Reply::Http(json_error(404, "no sub-agent in the path")) };
        let run = self.registry().get(&sub.name).ok().flatten().filter(|r| kebab_case(&r.agent_type) == sub.agent);
        let child = SubAgent {
            class: run.as_ref().map_or_else(|| sub.agent.clone(), |r| r.agent_type.clone()),
            name: sub.name.clone(),
        };
        if let Some(refusal) = self.hooks().on_before_sub_agent(self, &req, &child).await {
            return match is_upgrade(&req) {
                true => self.refuse(
                    &req,
                    refusal.status().as_u16(),
                    &format!("Sub-agent connection rejected ({})", refusal.status().as_u16()),
                ),
                false => Reply::Http(refusal),
            };
        }
        let Some(run) = run else {
            let message = format!("no {} run {:?} on this {}", sub.agent, sub.name, self.0.class);
            return match is_upgrade(&req) {
                true => self.refuse(&req, 404, "Sub-agent connection rejected (404)"),
                false => Reply::Http(json_error(404, message)),
            };
        };
        let parent = match self.own_name() {
            Ok(parent) => parent,
            Err(e) => return Reply::Http(json_error(500, e)),
        };
        let to = crate::parent::engine::child_address(self.0.class, &parent, &run);
        let child_path = format!("/agents/{}/{}{}", sub.agent, crate::routing::percent_encode(&sub.name), path.rest);
        let url = RequestUrl::of(&req).with_path(&child_path);
        let (mut parts, body) = req.into_parts();
        match url.parse() {
            Ok(uri) => parts.uri = uri,
            Err(e) => return Reply::Http(json_error(400, format!("the drill-in path is not a URL: {e}"))),
        }
        match self.0.io.forward(&to, HttpRequest::from_parts(parts, body)).await {
            Ok(reply) => reply,
            Err(e) => Reply::Http(json_error(502, format!("could not reach {}: {e}", run.agent_type))),
        }
    }

    fn connect(&self, name: &str) -> Reply {
        let (socket, reply) = match self.0.io.accept() {
            Ok(accepted) => accepted,
            Err(e) => return Reply::Http(json_error(500, format!("the connection could not be accepted: {e}"))),
        };
        let connection = socket.id();
        self.0.chat.on_connect(socket.as_ref());
        let mut identity = json!({ "type": "cf_agent_identity", "name": name, "agent": kebab_case(self.0.class) });
        // As the stock server does: the state (if any) right after the identity, which says it
        // follows (the stock client is `ready` once it has it).
        let state = crate::state::get(self.sql()).unwrap_or_else(|e| {
            self.storage_failed("state", &e);
            None
        });
        if state.is_some() {
            identity["stateFollows"] = Value::Bool(true);
        }
        socket.send(&identity.to_string());
        if let Some(state) = &state {
            socket.send(&crate::state::state_frame(state));
        }
        let mcp = json!({ "type": "cf_agent_mcp_servers",
                          "mcp": { "servers": {}, "tools": [], "prompts": [], "resources": [] } });
        socket.send(&mcp.to_string());
        // The replay goes out after the handshake, a page at a time with the socket draining
        // in between; the socket joins the live broadcast when it has caught up.
        self.0.catching_up.borrow_mut().insert(connection.clone());
        let host = self.clone();
        self.spawn(async move { host.replay_to(socket, connection).await });
        reply
    }

    /// Sends a new client every retained run, [`REPLAY_PAGE`] frames at a time, yielding
    /// between pages so the socket drains (memory stays at a page, however much is retained);
    /// then, in one synchronous step, what was stored meanwhile for the runs already sent, and
    /// the socket joins the live broadcast: each frame reaches it once.
    async fn replay_to(&self, socket: Rc<dyn Socket>, connection: String) {
        let mut cursor = ReplayCursor::default();
        let mut send = |frame: crate::protocol::EventFrame| socket.send(&frame.to_json());
        // A replay that cannot be read closes the socket, so the client reconnects and is
        // replayed afresh (a socket left with half a replay would never see the runs it missed).
        loop {
            let page = self.registry().replay_page(&mut cursor, REPLAY_PAGE, &mut send);
            let done = match page {
                Ok(true) => Ok(false),
                Ok(false) => self.registry().replay_rest(&mut cursor, &mut send).map(|()| true),
                Err(e) => Err(e),
            };
            match done {
                Ok(true) => break,
                Ok(false) => self.0.io.sleep(0).await,
                Err(e) => {
                    self.log_error(&format!("replay failed ({e}); the client is asked to reconnect"));
                    self.0.catching_up.borrow_mut().remove(&connection);
                    return socket.close(1011, "the replay could not be read; reconnect");
                }
            }
        }
        self.0.catching_up.borrow_mut().remove(&connection);
    }

    /// One client frame: RPC calls and chat frames. Anything malformed gets an error frame and
    /// the socket stays open.
    pub(crate) async fn websocket_message(&self, socket: Rc<dyn Socket>, message: Result<String, ()>) {
        if self.unready().is_some() {
            return;
        }
        self.ensure_recovery();
        match self.0.chat.receive(socket.as_ref(), message) {
            ChatAction::Done => {}
            ChatAction::Call(call) => {
                let reply = match self.hooks().call(self, &call.method, call.args).await {
                    Ok(result) => RpcResponse::ok(call.id, result),
                    Err(error) => RpcResponse::err(call.id, error),
                };
                socket.send(&reply.to_json());
            }
            ChatAction::RunTurn { request_id, sender } => self.run_chat_turn(request_id, Some(sender)).await,
            ChatAction::Cancel { request_id } => self.cancel_chat_turn(&request_id).await,
            ChatAction::State(next) => self.client_state(socket.as_ref(), next).await,
            ChatAction::Answered => self.run_continuations().await,
        }
    }

    /// A client's `setState`: the agent validates it, then it is stored, every other client gets
    /// it, and `on_state_changed` runs; a refusal (or a storage failure) is the sender's
    /// `cf_agent_state_error`, with nothing stored.
    async fn client_state(&self, socket: &dyn Socket, next: Value) {
        let hooks = self.hooks();
        let decided = crate::state::client_change(self.sql(), next, |v| hooks.validate_state_change(v), self.now());
        match decided {
            Ok(crate::state::ClientChange::Accepted(state)) => {
                let sender = socket.id();
                let frame = crate::state::state_frame(&state);
                for other in self.0.io.sockets().into_iter().filter(|s| s.id() != sender) {
                    other.send(&frame);
                }
                let source = crate::StateSource::Client(sender);
                self.hooks().on_state_changed(self, &state, &source).await;
            }
            Ok(crate::state::ClientChange::Refused(reason)) => {
                socket.send(&crate::state::error_frame(&reason));
            }
            Err(e) => {
                self.storage_failed("state", &e);
                socket.send(&crate::state::error_frame(&format!("the state could not be stored: {e}")));
            }
        }
    }

    /// Sets the state from the agent: stored, sent to every client, then `on_state_changed`.
    pub(crate) async fn set_state(&self, state: Value) -> Result<(), Error> {
        crate::state::check_size(&state).map_err(Error::invalid)?;
        crate::state::set(self.sql(), &state, self.now())?;
        self.broadcast(&crate::state::state_frame(&state));
        self.hooks().on_state_changed(self, &state, &crate::StateSource::Server).await;
        Ok(())
    }

    /// A client went away.
    pub(crate) fn websocket_closed(&self, socket: &dyn Socket, code: u16, reason: &str) {
        self.0.chat.closed(socket, code, reason);
    }

    /// The alarm: recovery, the detached backbone and retention (the parent engine), due
    /// scheduled tasks, and the alarm armed for whatever comes next.
    pub(crate) async fn alarm(&self) {
        self.0.alarm_at.set(None);
        if let Some(problem) = self.unready() {
            // Kept armed while the tables are only not made yet: the work it was for waits.
            if self.0.config_error.is_none() {
                self.arm_alarm_at(self.now() + UNREADY_RETRY_MS).await;
            }
            return self.log_error(&format!("the alarm waits: {problem}"));
        }
        self.recover_chat_turns(true);
        // Approvals nobody answered in time are denied, and their turns go on.
        let next_expiry = self.0.chat.expire_approvals();
        self.run_continuations().await;
        if let Some(at) = next_expiry {
            self.arm_alarm_at(at.max(self.now())).await;
        }
        if matches!(Journal::new(self.sql()).any_open(), Ok(true)) {
            self.watch_chat_turn().await;
        }
        // With no registry there is nothing to recover, deliver or clear.
        if self.0.parent_tables.get() {
            let actions = self.0.parent.borrow_mut().alarm(self.sql(), self.now());
            self.carry_out(actions);
            self.deliver_messages(None).await;
        }
        self.run_due_tasks().await;
    }

    // ----- scheduled work ---------------------------------------------------------------

    pub(crate) async fn schedule(&self, at: i64, payload: String) -> Result<String, StoreError> {
        let id = self.0.io.random_id();
        Schedule::new(self.sql()).add(&id, at, &payload)?;
        self.arm_alarm_at(at.max(self.now())).await;
        Ok(id)
    }

    pub(crate) fn cancel_schedule(&self, id: &str) -> Result<bool, StoreError> {
        Schedule::new(self.sql()).cancel(id)
    }

    pub(crate) fn scheduled(&self) -> Result<Vec<ScheduledTask>, StoreError> {
        Schedule::new(self.sql()).pending()
    }

    /// Runs the tasks that are due (claimed under a lease, so two alarms never run one task at
    /// once); a task is done once its hook returned. Then the alarm is armed for the next.
    async fn run_due_tasks(&self) {
        let schedule = Schedule::new(self.sql());
        let due = match schedule.claim_due(self.now()) {
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
            Ok(Some(at)) => self.arm_alarm_at(at.max(self.now())).await,
            Ok(None) => {}
            Err(e) => {
                self.storage_failed("schedule", &e);
                self.arm_alarm_at(self.now() + crate::schedule::TASK_LEASE_MS).await;
            }
        }
    }

    /// Reports a storage failure outside the engines (`agent_tool:storage_failed`).
    pub(crate) fn storage_failed(&self, step: &str, error: &StoreError) {
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
        let pending = self.0.io.alarm().await.ok().flatten();
        if pending.is_some_and(|p| p <= at) {
            self.0.alarm_at.set(pending);
            return;
        }
        match self.0.io.set_alarm(at).await {
            Ok(()) => self.0.alarm_at.set(Some(at)),
            Err(e) => self.log_error(&format!("arming the alarm failed: {e}")),
        }
    }

    /// The first event of a fresh instance continues the chat turns a restart cut short (in
    /// the background, each before any turn a client asks for now); the alarm looks again each
    /// time (`always`), so an open turn that nothing in this instance runs is never left open.
    pub(crate) fn recover_chat_turns(&self, always: bool) {
        if self.0.chat_recovery.replace(true) && !always {
            return;
        }
        let open = match Journal::new(self.sql()).open() {
            Ok(open) => open,
            Err(e) => {
                // Tried again at the next event (the alarm is armed while a turn is open).
                self.0.chat_recovery.set(false);
                return self.storage_failed("chat recovery", &e);
            }
        };
        for turn in open.into_iter().filter(|t| !self.0.chat.is_live(&t.request_id)) {
            self.spawn_continuation(turn, false);
        }
    }

    /// Runs the turns that may go on after a person's answers (begun in the journal, so a
    /// restart meanwhile continues them as it continues any open turn); then the alarm is armed
    /// for the next approval that can run out.
    pub(crate) async fn run_continuations(&self) {
        for turn in self.0.chat.take_continuations() {
            self.spawn_continuation(turn, true);
        }
        let next = Interactions::new(self.sql()).next_expiry();
        match next {
            Ok(Some(at)) => self.arm_alarm_at(at.max(self.now())).await,
            Ok(None) => {}
            Err(e) => self.storage_failed("waiting calls", &e),
        }
    }

    /// Continues an open turn in the background, before any turn a client asks for from now on
    /// (it takes the turn slot now if it is free): after a restart, or (`fresh`) after a
    /// person's answers.
    fn spawn_continuation(&self, turn: OpenTurn, fresh: bool) {
        let slot = self.0.chat.claim_slot();
        // Live from now on: a second look finds it taken.
        self.0.chat.waits(&turn.request_id, None);
        let host = self.clone();
        let max = self.0.chat_recovery_attempts;
        self.spawn(async move {
            let request_id = turn.request_id.clone();
            host.watch_chat_turn().await;
            let begun = json!({ "requestId": request_id, "attempt": turn.attempts, "fresh": fresh });
            host.observe(crate::observability::EventType::ChatContinue, begun);
            let end = host.hooks().continue_chat_turn(&host, turn, max, slot, fresh).await;
            host.0.chat.done_waiting(&request_id);
            host.0.turn_runs.borrow_mut().remove(&request_id);
            let mut ended = json!({ "requestId": request_id, "fresh": fresh });
            match end {
                super::chat::ChatEnd::Completed => ended["outcome"] = json!("completed"),
                super::chat::ChatEnd::Error(e) => {
                    ended["outcome"] = json!("error");
                    ended["error"] = json!(e);
                }
                super::chat::ChatEnd::Aborted(_) => ended["outcome"] = json!("aborted"),
            }
            host.observe(crate::observability::EventType::ChatContinued, ended);
            // A continuation that paused again and was answered meanwhile goes on too.
            host.run_continuations().await;
        });
    }

    /// Keeps the alarm armed within [`CHAT_WATCH_MS`] while a chat turn is open, so a turn that
    /// a restart cuts is continued even when no client comes back.
    pub(crate) async fn watch_chat_turn(&self) {
        self.arm_alarm_at(self.now() + CHAT_WATCH_MS).await;
    }

    /// The first event of a fresh instance starts recovery once (in the background).
    pub(crate) fn ensure_recovery(&self) {
        self.recover_chat_turns(false);
        // An object with no registry has no runs to recover.
        if self.0.parent_tables.get() {
            let actions = self.0.parent.borrow_mut().wake(self.sql(), self.now());
            self.carry_out(actions);
        }
    }
}

/// Creates the tables every agent's object uses (its identity, the child role's runs, the
/// chat, scheduled work): on a new object in one batch, else role by role with the columns
/// added since. The parent role's tables (its registry and ledger) come with the object's first
/// parent work ([`Host::parent_sql`]), or here when an earlier instance made them: the answer is
/// whether they exist.
/// How long an alarm that found the tables unmade waits before it tries again.
const UNREADY_RETRY_MS: i64 = 5_000;

/// A failure to make an object's tables, in words.
fn storage_problem(class: &str, e: &StoreError) -> String {
    format!("{class}: its SQLite storage failed ({e}); list {class:?} in a [[migrations]] new_sqlite_classes of wrangler.toml")
}

impl Host {
    /// Why this agent cannot serve now: its configuration, or tables that could not be made
    /// (tried again first).
    pub(crate) fn unready(&self) -> Option<String> {
        if let Some(problem) = &self.0.config_error {
            return Some(problem.clone());
        }
        self.0.storage_error.borrow().as_ref()?;
        match migrate(self.sql()) {
            Ok(parent_tables) => {
                self.0.parent_tables.set(parent_tables);
                *self.0.storage_error.borrow_mut() = None;
                None
            }
            Err(e) => {
                let problem = storage_problem(self.0.class, &e);
                *self.0.storage_error.borrow_mut() = Some(problem.clone());
                Some(problem)
            }
        }
    }
}

pub(crate) fn migrate(sql: &dyn Sql) -> Result<bool, StoreError> {
    let [_registry, _ledger, meta] = crate::parent::engine::SCHEMAS;
    let [child, chat] = crate::child::runs::SCHEMAS;
    let mut parent_tables = false;
    crate::store::migrate(sql, &[meta, child, chat, crate::schedule::SCHEMA, crate::state::SCHEMA], || {
        parent_tables = crate::parent::engine::has_tables(sql)?;
        if parent_tables {
            crate::parent::engine::migrate(sql)?;
        } else {
            sql.batch(meta)?;
        }
        ChildRuns::new(sql).migrate()?;
        sql.batch(crate::schedule::SCHEMA)?;
        sql.batch(crate::state::SCHEMA)
    })?;
    Ok(parent_tables)
}

/// A random number naming this instance's exchanges with children (see [`ParentEngine::new`]).
fn incarnation(io: &dyn Io) -> u32 {
    let id = io.random_id();
    id.bytes().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
}

/// Checks that every child class an agent's tools dispatch has its Durable Object binding.
fn check_bindings<A: Agent>(tools: &Tools<A>, io: &dyn Io) -> Option<String> {
    for entry in &tools.entries {
        if let crate::tools::Entry::Agent(tool) = entry {
            if !io.has_binding(tool.child.binding) {
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
