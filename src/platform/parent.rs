//! The parent host: binds the registry to a Durable Object, its WebSocket clients and the
//! children's stubs.
//!
//! A dispatch inserts the row, sends `started`, starts the child (idempotent), tails it, and
//! for every batch of lines read stores the frames and broadcasts them in one synchronous step.
//! A client that connects is accepted and replayed in one synchronous step too, so every frame
//! reaches it exactly once: in the replay if it was stored before, live if after.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use futures::channel::oneshot;
use futures::StreamExt;
use serde::Serialize;
use serde_json::{json, Value};
use wasm_bindgen::JsValue;
use worker::{
    Env, Method, Request, RequestInit, Response, State, Stub, WebSocket, WebSocketIncomingMessage, WebSocketPair,
};

use super::{json_error, now_ms, random_id, DoSql};
use crate::parent::registry::Forward;
use crate::parent::{
    validate_run_id, EventDelivery, Inserted, NewRun, Registry, RunOptions, RunRecord, RunResult, Terminal,
};
use crate::protocol::child_api::{self, StartRequest};
use crate::protocol::rpc::{self, ClientFrame, FrameError, RpcResponse};
use crate::protocol::tail::{ChunkKind, LineSplitter, OutcomeStatus, RunOutcome, TailLine};
use crate::protocol::{EventFrame, InterruptedReason};
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

/// A parent agent: declares its children and the methods clients may call.
#[allow(async_fn_in_trait)] // Workers are single-threaded; no `Send` bound is wanted.
pub trait ParentAgent: Sized + 'static {
    /// The class name (`Assistant`); clients address it as its kebab-case (`assistant`).
    const CLASS: &'static str;
    /// The child classes this parent dispatches.
    const CHILDREN: &'static [ChildClass];

    /// Serves an RPC call (`agent.call(method, args)`). The default knows no methods. Return
    /// `Err(message)` to reject the call with that message.
    async fn call(&self, parent: &ParentHost<Self>, method: &str, args: Vec<Value>) -> Result<Value, String> {
        let _ = (parent, args);
        Err(format!("Method {method} does not exist"))
    }
}

struct Inner<A> {
    state: State,
    env: Env,
    sql: DoSql,
    agent: A,
    /// Runs this instance is driving, with the callers waiting on them.
    inflight: RefCell<HashMap<String, Vec<oneshot::Sender<RunResult>>>>,
}

/// The parent's runtime. Clone is cheap (a shared handle). Hold one in your Durable Object and
/// delegate `fetch`, `websocket_message` and `websocket_close` to it.
pub struct ParentHost<A: ParentAgent>(Rc<Inner<A>>);

impl<A: ParentAgent> Clone for ParentHost<A> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

const CLIENT_TAG: &str = "agent-client";

impl<A: ParentAgent> ParentHost<A> {
    /// Creates the runtime and its tables.
    pub fn new(state: State, env: Env, agent: A) -> Self {
        let sql = DoSql(state.storage().sql());
        if let Err(e) = Registry::new(&sql).migrate().and_then(|_| sql.batch(meta::SCHEMA)) {
            worker::console_error!("agent-tools: parent schema failed: {e}");
        }
        Self(Rc::new(Inner { state, env, sql, agent, inflight: RefCell::new(HashMap::new()) }))
    }

    /// The agent.
    pub fn agent(&self) -> &A {
        &self.0.agent
    }

    /// The Worker environment.
    pub fn env(&self) -> &Env {
        &self.0.env
    }

    /// The run registry.
    pub fn registry(&self) -> Registry<'_, DoSql> {
        Registry::new(&self.0.sql)
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
        for ws in self.0.state.get_websockets_with_tag(CLIENT_TAG) {
            let _ = ws.send_with_str(text);
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
        if let Some(sub) = &path.sub {
            let Some(child) = A::CHILDREN.iter().find(|c| kebab_case(c.class) == sub.agent) else {
                return json_error(404, format!("{} has no child agent {:?}", A::CLASS, sub.agent));
            };
            if !self.has_agent_tool_run(child.class, &sub.name) {
                return json_error(404, format!("no {} run {:?} on this {}", child.class, sub.name, A::CLASS));
            }
            return json_error(501, "drill-in is not served yet");
        }
        let upgrade = req.headers().get("upgrade")?.unwrap_or_default();
        if upgrade.eq_ignore_ascii_case("websocket") {
            return self.connect(&path.name);
        }
        match path.rest.as_str() {
            "" => Response::from_json(&json!({ "agent": kebab_case(A::CLASS), "name": path.name })),
            other => json_error(404, format!("{} has no route {other}", A::CLASS)),
        }
    }

    fn connect(&self, name: &str) -> worker::Result<Response> {
        let pair = WebSocketPair::new()?;
        self.0.state.accept_websocket_with_tags(&pair.server, &[CLIENT_TAG]);
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

    /// Handles one client frame: RPC calls; anything malformed gets an error frame and the
    /// socket stays open.
    pub async fn websocket_message(&self, ws: WebSocket, message: WebSocketIncomingMessage) -> worker::Result<()> {
        let frame = match message {
            WebSocketIncomingMessage::String(text) => rpc::parse_client_frame(&text),
            WebSocketIncomingMessage::Binary(_) => Err(FrameError::Binary),
        };
        match frame {
            Ok(ClientFrame::Rpc(call)) => {
                let reply = match self.0.agent.call(self, &call.method, call.args).await {
                    Ok(result) => RpcResponse::ok(call.id, result),
                    Err(error) => RpcResponse::err(call.id, error),
                };
                let _ = ws.send_with_str(reply.to_json());
            }
            Ok(ClientFrame::Other { .. }) => {}
            Err(FrameError::BadRpc { id, problem }) => {
                let _ = ws.send_with_str(RpcResponse::err(id, format!("malformed rpc frame: {problem}")).to_json());
            }
            Err(e) => {
                let _ = ws.send_with_str(rpc::protocol_error_frame(&e));
            }
        }
        Ok(())
    }

    /// Handles a client going away.
    pub async fn websocket_close(&self, ws: WebSocket, code: usize, reason: String) -> worker::Result<()> {
        let code = if code == 1005 || code == 1006 { 1000 } else { code as u16 };
        let _ = ws.close(Some(code), Some(reason));
        Ok(())
    }

    /// Dispatches a child run and waits for its outcome. Idempotent by run id: a known id
    /// returns its recorded result, or joins the dispatch already under way; it never starts a
    /// second child.
    pub async fn run_agent_tool(&self, child: &str, options: RunOptions) -> RunResult {
        let run_id = options.run_id.clone().unwrap_or_else(random_id);
        if let Err(problem) = validate_run_id(&run_id) {
            return RunResult::refused(run_id, child, problem);
        }
        let Some(class) = A::CHILDREN.iter().find(|c| c.class == child).copied() else {
            let known: Vec<&str> = A::CHILDREN.iter().map(|c| c.class).collect();
            return RunResult::refused(
                run_id,
                child,
                format!("unknown agent type {child:?}; {} dispatches {known:?}", A::CLASS),
            );
        };
        let new = NewRun {
            run_id: run_id.clone(),
            parent_tool_call_id: options.parent_tool_call_id.clone(),
            agent_type: class.class.to_owned(),
            input_preview: options
                .input_preview
                .clone()
                .or_else(|| crate::parent::registry::input_preview(&options.input)),
            display: options.display.clone(),
            display_order: options.display_order.unwrap_or(0),
            event_delivery: options.event_delivery,
        };
        let record = match self.registry().insert(&new, now_ms()) {
            Err(e) => return RunResult::refused(run_id, child, e.to_string()),
            Ok(Inserted::New(record)) => {
                self.broadcast_frame(&record.started_frame());
                record
            }
            Ok(Inserted::Existing(record)) => {
                if record.status.is_hard_terminal() {
                    return RunResult::from_record(&record);
                }
                let waiting = self.0.inflight.borrow_mut().get_mut(&run_id).map(|waiters| {
                    let (tx, rx) = oneshot::channel();
                    waiters.push(tx);
                    rx
                });
                if let Some(rx) = waiting {
                    return match rx.await {
                        Ok(result) => result,
                        Err(_) => self.current_result(&record),
                    };
                }
                record
            }
        };
        self.0.inflight.borrow_mut().insert(run_id.clone(), Vec::new());
        let result = self.drive(&record, class, &options.input).await;
        let waiters = self.0.inflight.borrow_mut().remove(&run_id).unwrap_or_default();
        for tx in waiters {
            let _ = tx.send(result.clone());
        }
        result
    }

    fn child_stub(&self, class: ChildClass, run_id: &str) -> Result<Stub, String> {
        let parent_name = self.name().ok_or("this parent does not know its own name yet")?;
        let namespace = self.0.env.durable_object(class.binding).map_err(|e| e.to_string())?;
        let id =
            namespace.id_from_name(&format!("{}/{}/{}", A::CLASS, parent_name, run_id)).map_err(|e| e.to_string())?;
        id.get_stub().map_err(|e| e.to_string())
    }

    async fn drive(&self, record: &RunRecord, class: ChildClass, input: &Value) -> RunResult {
        let stub = match self.child_stub(class, &record.run_id) {
            Ok(stub) => stub,
            Err(e) => {
                return self
                    .conclude(record, Terminal::Error { message: format!("could not reach {}: {e}", class.class) })
            }
        };
        let start = StartRequest {
            run_id: record.run_id.clone(),
            input: input.clone(),
            parent_class: A::CLASS.to_owned(),
            parent_name: self.name().unwrap_or_default(),
            terminal_only: record.event_delivery == EventDelivery::Terminal,
        };
        match send_json(&stub, Method::Post, &format!("{}/start", child_api::BASE), &start).await {
            Ok(mut resp) if resp.status_code() != 200 => {
                let body = resp.text().await.unwrap_or_default();
                let message = format!("{} refused to start the run ({}): {body}", class.class, resp.status_code());
                return self.conclude(record, Terminal::Error { message });
            }
            Ok(_) => {}
            Err(e) => {
                let message = format!("could not start {}: {e}", class.class);
                return self.conclude(record, Terminal::Error { message });
            }
        }
        if let Err(e) = self.registry().mark_running(&record.run_id) {
            worker::console_error!("agent-tools: marking {} running failed: {e}", record.run_id);
        }
        self.follow(record, &stub).await
    }

    /// Tails the child from the row's cursor to its outcome, forwarding every chunk.
    async fn follow(&self, record: &RunRecord, stub: &Stub) -> RunResult {
        let run_id = &record.run_id;
        let url = child_api::tail_url(run_id, record.child_cursor);
        let mut resp = match send_json(stub, Method::Get, &url, &()).await {
            Ok(resp) if resp.status_code() == 200 => resp,
            _ => return self.after_broken_tail(record, stub).await,
        };
        let Ok(mut body) = resp.stream() else { return self.after_broken_tail(record, stub).await };
        let mut lines = LineSplitter::default();
        while let Some(Ok(bytes)) = body.next().await {
            let mut batch: Vec<(ChunkKind, String)> = Vec::new();
            let mut cursor = None;
            let mut end = None;
            for line in lines.push(&bytes) {
                match line {
                    Ok(TailLine::Chunk { i, k, b }) => {
                        cursor = i.or(cursor);
                        let hidden = k == ChunkKind::Stored && record.event_delivery == EventDelivery::Terminal;
                        if !hidden {
                            batch.push((k, b));
                        }
                    }
                    Ok(TailLine::End { outcome }) => end = Some(outcome),
                    Err(e) => worker::console_error!("agent-tools: garbled tail line from {run_id}: {e}"),
                }
            }
            if !self.forward(record, &batch, cursor) {
                // The run was concluded elsewhere (cancelled, cleared): its row has the result.
                return self.current_result(record);
            }
            if let Some(outcome) = end {
                return self.conclude(record, terminal_from(outcome));
            }
        }
        self.after_broken_tail(record, stub).await
    }

    /// Stores a batch of chunks and broadcasts their frames. `false` when the run is no
    /// longer live.
    fn forward(&self, record: &RunRecord, batch: &[(ChunkKind, String)], cursor: Option<i64>) -> bool {
        if batch.is_empty() && cursor.is_none() {
            return true;
        }
        let forwards: Vec<Forward<'_>> = batch.iter().map(|(kind, body)| Forward { kind: *kind, body }).collect();
        match self.registry().append(&record.run_id, &forwards, cursor, now_ms()) {
            Ok(Some(seqs)) => {
                for (seq, (_, body)) in seqs.into_iter().zip(batch) {
                    self.broadcast_frame(&record.chunk_frame(seq, body.clone()));
                }
                true
            }
            Ok(None) => false,
            Err(e) => {
                worker::console_error!("agent-tools: storing frames of {} failed: {e}", record.run_id);
                true
            }
        }
    }

    /// The tail ended without an outcome: ask the child where the run stands.
    async fn after_broken_tail(&self, record: &RunRecord, stub: &Stub) -> RunResult {
        let inspection = match send_json(stub, Method::Get, &child_api::inspect_url(&record.run_id), &()).await {
            Ok(mut resp) if resp.status_code() == 200 => resp.json::<Option<InspectionReply>>().await.ok().flatten(),
            _ => None,
        };
        if let Some(outcome) = inspection.and_then(|i| i.outcome()) {
            return self.conclude(record, terminal_from(outcome));
        }
        self.conclude(
            record,
            Terminal::Interrupted {
                error: "the child's stream ended before its result; the child may still be running".into(),
                reason: Some(InterruptedReason::NotTailable),
                child_still_running: Some(true),
            },
        )
    }

    /// Records the terminal result (unless the row is already final) and broadcasts its frame.
    fn conclude(&self, record: &RunRecord, terminal: Terminal) -> RunResult {
        match self.registry().finish(&record.run_id, &terminal, now_ms()) {
            Ok(Some(done)) => {
                if let Some(frame) = done.terminal_frame() {
                    self.broadcast_frame(&frame);
                }
                RunResult::from_record(&done)
            }
            Ok(None) => self.current_result(record),
            Err(e) => {
                worker::console_error!("agent-tools: recording the end of {} failed: {e}", record.run_id);
                RunResult {
                    status: terminal.status(),
                    ..RunResult::refused(&record.run_id, &record.agent_type, e.to_string())
                }
            }
        }
    }

    fn current_result(&self, record: &RunRecord) -> RunResult {
        match self.registry().get(&record.run_id) {
            Ok(Some(now)) => RunResult::from_record(&now),
            _ => RunResult::from_record(record),
        }
    }
}

/// The parts of a child's inspection the parent reads.
#[derive(serde::Deserialize)]
struct InspectionReply {
    status: String,
    summary: Option<String>,
    output: Option<Value>,
    error: Option<String>,
}

impl InspectionReply {
    fn outcome(self) -> Option<RunOutcome> {
        let status = match self.status.as_str() {
            "completed" => OutcomeStatus::Completed,
            "error" => OutcomeStatus::Error,
            "aborted" => OutcomeStatus::Aborted,
            _ => return None,
        };
        Some(RunOutcome { status, summary: self.summary, output: self.output, error: self.error })
    }
}

fn terminal_from(outcome: RunOutcome) -> Terminal {
    match outcome.status {
        OutcomeStatus::Completed => {
            Terminal::Completed { summary: outcome.summary.unwrap_or_default(), output: outcome.output }
        }
        OutcomeStatus::Error => {
            Terminal::Error { message: outcome.error.unwrap_or_else(|| "the child run failed".into()) }
        }
        OutcomeStatus::Aborted => Terminal::Aborted { reason: outcome.error },
    }
}

async fn send_json<T: Serialize>(stub: &Stub, method: Method, url: &str, body: &T) -> worker::Result<Response> {
    let mut init = RequestInit::new();
    init.with_method(method.clone());
    if method != Method::Get {
        init.with_body(Some(JsValue::from_str(&serde_json::to_string(body)?)));
    }
    stub.fetch_with_request(Request::new_with_init(url, &init)?).await
}
