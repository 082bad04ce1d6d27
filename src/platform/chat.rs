//! The chat agent on the platform, shared by parents and children: the `@cloudflare/ai-chat`
//! frames over hibernatable WebSockets, `GET …/get-messages`, the stream-resume handshake, and
//! running a turn (one at a time) that streams to every connected client and is persisted.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use futures::future::{select, Either};
use futures::lock::Mutex;
use serde_json::{json, Map, Value};
use wasm_bindgen::JsValue;
use worker::worker_sys::ext::WebSocketExt;
use worker::{State, WebSocket, WebSocketIncomingMessage};

use super::{now_ms, random_id, DoSql};
use crate::cancel::CancelToken;
use crate::chat::convert::to_model_messages;
use crate::chat::message::MessageBuilder;
use crate::chat::store::{validate_message, Messages, OpenStreams, StreamLog};
use crate::chat::turn::{run_turn, DynModel, DynToolBox, TurnOptions, TurnOutcome};
use crate::protocol::rpc::{self, ClientFrame, FrameError, RpcRequest, RpcResponse};
use crate::protocol::tail::ChunkKind;

/// Tag of every client socket.
pub const CLIENT_TAG: &str = "agent-client";

const RESPONSE: &str = "cf_agent_use_chat_response";

/// Accepts a client socket, giving it a connection id that survives hibernation: its
/// attachment is `{ id }`, built and read as a JS object (through `worker`'s
/// `serialize_attachment`, every socket's id would go through `serde_wasm_bindgen`).
pub fn accept(state: &State, ws: &WebSocket) -> String {
    let id = random_id();
    state.accept_websocket_with_tags(ws, &[CLIENT_TAG]);
    let attachment = js_sys::Object::new();
    let _ = js_sys::Reflect::set(&attachment, &JsValue::from_str("id"), &JsValue::from_str(&id));
    let _ = ws.as_ref().serialize_attachment(attachment.into());
    id
}

/// The connection id given by [`accept`] (empty for a socket with none).
pub fn connection_id(ws: &WebSocket) -> String {
    ws.as_ref()
        .deserialize_attachment()
        .ok()
        .filter(|a| a.is_object())
        .and_then(|a| js_sys::Reflect::get(&a, &JsValue::from_str("id")).ok())
        .and_then(|id| id.as_string())
        .unwrap_or_default()
}

/// The stream a turn is writing.
#[derive(Debug, Clone)]
pub struct ActiveStream {
    /// The chat request id: the id of every response frame and of the stream log (an
    /// agent-tool run's turn uses its run id).
    pub request_id: String,
    /// Cancels the turn.
    pub cancel: CancelToken,
    /// A resuming client is replayed the log after this index.
    pub replay_after: i64,
}

/// What a client frame asks of the host, once the chat has handled its own frames.
#[derive(Debug)]
pub enum ChatAction {
    /// Nothing more to do.
    Done,
    /// Answer this RPC call.
    Call(RpcRequest),
    /// Run a turn for this request, sent by this connection.
    RunTurn {
        /// The request id.
        request_id: String,
        /// The sender's connection id.
        sender: String,
    },
    /// Cancel the turn with this request id.
    Cancel {
        /// The request id.
        request_id: String,
    },
}

/// How one turn runs.
pub struct TurnSpec<'a> {
    /// Response frame id and stream log id.
    pub request_id: String,
    /// Whether the turn starts a new stream log under its id, dropping what an earlier turn of
    /// the same client request id stored (an agent-tool run keeps its log: it may already hold
    /// milestones).
    pub fresh_stream: bool,
    /// A client resuming the stream is replayed the log after this index (an agent-tool run's
    /// new attempt: not the superseded one before it).
    pub replay_after: i64,
    /// The connection that asked (it already has its messages).
    pub sender: Option<String>,
    /// System prompt.
    pub system: Option<String>,
    /// Step limit.
    pub max_steps: usize,
    /// Stores and sends one chunk; the host decides where chunks go besides the log.
    pub emit: &'a dyn Fn(String),
    /// Sends what `emit` may have held back, before the turn's final frame goes out.
    pub flush: &'a dyn Fn(),
    /// The cancel token of the turn.
    pub cancel: CancelToken,
}

/// The most chat turns one connection may have waiting behind the running turn; more are
/// refused with an error response (nothing is stored) and the socket stays open.
pub const MAX_QUEUED_TURNS: usize = 4;

/// The most chat turns an agent holds waiting, from all its connections together (it runs
/// one at a time); more are refused the same way.
pub const MAX_WAITING_TURNS: usize = 32;

/// The chat state of one agent.
pub struct Chat {
    sql: DoSql,
    active: RefCell<Option<ActiveStream>>,
    pending: RefCell<HashSet<String>>,
    last_stream: RefCell<Option<(String, i64)>>,
    /// Requests waiting for the turn before them, with the connection that sent each.
    waiting: RefCell<HashMap<String, Option<String>>>,
    /// Those of `waiting` cancelled meanwhile.
    cancelled: RefCell<HashSet<String>>,
    turns: Mutex<()>,
    /// Request ids a client may not use (they name streams the host writes itself).
    reserved: Option<fn(&DoSql, &str) -> bool>,
}

/// Clears the active stream when a turn ends, however it ends (a dropped turn too).
struct ActiveGuard<'a> {
    chat: &'a Chat,
    request_id: String,
}

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        let mut active = self.chat.active.borrow_mut();
        if active.as_ref().is_some_and(|a| a.request_id == self.request_id) {
            *active = None;
        }
    }
}

impl Chat {
    /// The chat over this agent's SQL (its tables are the host's to create: see
    /// `host::migrate`). A turn that a restart cut short is saved as the partial message it had
    /// streamed.
    pub fn new(sql: DoSql) -> Self {
        if let Err(e) = OpenStreams::new(&sql).recover(now_ms()) {
            worker::console_error!("agent-tools: recovering interrupted chat streams failed: {e}");
        }
        Self {
            sql,
            active: RefCell::new(None),
            pending: RefCell::new(HashSet::new()),
            last_stream: RefCell::new(None),
            waiting: RefCell::new(HashMap::new()),
            cancelled: RefCell::new(HashSet::new()),
            turns: Mutex::new(()),
            reserved: None,
        }
    }

    /// Refuses client requests whose id `reserved` claims: a child's run ids, whose stream
    /// logs share the table with client turns.
    pub fn with_reserved_ids(mut self, reserved: fn(&DoSql, &str) -> bool) -> Self {
        self.reserved = Some(reserved);
        self
    }

    /// Cancels a turn: the running one, or one still waiting for its turn (a cancel for any
    /// other id is ignored). Returns the running turn's stream, if that was the one.
    pub fn cancel(&self, request_id: &str, reason: &str) -> Option<ActiveStream> {
        match self.active().filter(|a| a.request_id == request_id) {
            Some(active) => {
                active.cancel.cancel(Some(reason.to_owned()));
                Some(active)
            }
            None => {
                if self.waiting.borrow().contains_key(request_id) {
                    self.cancelled.borrow_mut().insert(request_id.to_owned());
                }
                None
            }
        }
    }

    /// Forgets the stream log of `stream_id`.
    pub fn reset_stream(&self, stream_id: &str) {
        if let Err(e) = StreamLog::new(&self.sql).delete(stream_id) {
            worker::console_error!("agent-tools: clearing stream {stream_id} failed: {e}");
        }
    }

    /// Forgets every in-memory stream state (after the agent's storage was cleared).
    pub fn reset(&self) {
        *self.active.borrow_mut() = None;
        *self.last_stream.borrow_mut() = None;
        self.pending.borrow_mut().clear();
        self.waiting.borrow_mut().clear();
        self.cancelled.borrow_mut().clear();
    }

    /// The transcript.
    pub fn messages(&self) -> Vec<Value> {
        Messages::new(&self.sql).list().unwrap_or_default()
    }

    /// The stream being written, if any.
    pub fn active(&self) -> Option<ActiveStream> {
        self.active.borrow().clone()
    }

    /// Whether the stream of `request_id` is being written.
    pub fn is_streaming(&self, request_id: &str) -> bool {
        self.active.borrow().as_ref().is_some_and(|a| a.request_id == request_id)
    }

    /// Sends `text` to every client except `except` and those still resuming.
    pub fn broadcast(&self, state: &State, text: &str, except: Option<&str>) {
        self.broadcast_to(&state.get_websockets_with_tag(CLIENT_TAG), text, except);
    }

    /// Sends the transcript to every chat client but `except`; with none attached (a child run
    /// nobody drilled into), the messages are not even read.
    pub fn broadcast_transcript(&self, state: &State, except: Option<&str>) {
        let sockets = state.get_websockets_with_tag(CLIENT_TAG);
        if sockets.is_empty() {
            return;
        }
        let frame = json!({ "type": "cf_agent_chat_messages", "messages": self.messages() });
        self.broadcast_to(&sockets, &frame.to_string(), except);
    }

    fn broadcast_to(&self, sockets: &[WebSocket], text: &str, except: Option<&str>) {
        let pending = self.pending.borrow();
        for ws in sockets {
            if except.is_some() || !pending.is_empty() {
                let id = connection_id(ws);
                if Some(id.as_str()) == except || pending.contains(&id) {
                    continue;
                }
            }
            let _ = ws.send_with_str(text);
        }
    }

    /// Stores one chunk of a stream in the log.
    pub fn store(&self, stream_id: &str, index: i64, kind: ChunkKind, body: &str) -> bool {
        match StreamLog::new(&self.sql).append(stream_id, index, kind, body) {
            Ok(()) => true,
            Err(e) => {
                worker::console_error!("agent-tools: storing chunk {index} of {stream_id} failed: {e}");
                false
            }
        }
    }

    /// Sends chunks of request `request_id` to the chat clients (except those resuming), in order.
    pub fn send(&self, state: &State, request_id: &str, bodies: &[String]) {
        // The sockets are looked up once for the lot.
        let sockets = state.get_websockets_with_tag(CLIENT_TAG);
        if sockets.is_empty() {
            return; // a child run nobody watches: skip building the frames
        }
        let id = Value::from(request_id);
        for body in bodies {
            let frame =
                format!(r#"{{"type":"{RESPONSE}","id":{id},"body":{},"done":false}}"#, Value::from(body.as_str()));
            self.broadcast_to(&sockets, &frame, None);
        }
    }

    /// Tells every client that request `request_id` failed before it began.
    pub fn fail_request(&self, state: &State, request_id: &str, problem: &str) {
        let frame = json!({ "type": RESPONSE, "id": request_id, "body": problem, "done": true, "error": true });
        self.broadcast(state, &frame.to_string(), None);
    }

    /// The frames a chat client gets first: `cf_agent_stream_resuming` while a stream is active
    /// (the connection then gets no live chunks until it acknowledges).
    pub fn on_connect(&self, ws: &WebSocket, connection: &str) {
        if let Some(active) = self.active() {
            self.pending.borrow_mut().insert(connection.to_owned());
            let _ =
                ws.send_with_str(json!({ "type": "cf_agent_stream_resuming", "id": active.request_id }).to_string());
        }
    }

    /// Forgets a closed connection.
    fn on_close(&self, connection: &str) {
        self.pending.borrow_mut().remove(connection);
    }

    /// Reads one client frame: chat frames are handled here and anything malformed or refused
    /// gets its error frame (the socket stays open); what is left for the host (an RPC call, a
    /// turn to run, a cancel) is returned.
    pub fn receive(&self, state: &State, ws: &WebSocket, message: WebSocketIncomingMessage) -> ChatAction {
        let frame = match message {
            WebSocketIncomingMessage::String(text) => rpc::parse_client_frame(&text),
            WebSocketIncomingMessage::Binary(_) => Err(FrameError::Binary),
        };
        let reply = match frame {
            Ok(ClientFrame::Rpc(call)) => return ChatAction::Call(call),
            Ok(ClientFrame::Other { kind, frame }) => match self.handle(state, ws, &kind, &frame) {
                None => return ChatAction::Done,
                Some(Ok(action)) => return action,
                Some(Err(problem)) => json!({ "type": "cf_agent_error", "error": problem }).to_string(),
            },
            Err(FrameError::BadRpc { id, problem }) => {
                RpcResponse::err(id, format!("malformed rpc frame: {problem}")).to_json()
            }
            Err(e) => rpc::protocol_error_frame(&e),
        };
        let _ = ws.send_with_str(reply);
        ChatAction::Done
    }

    /// Forgets a client that went away and completes the close handshake.
    pub fn closed(&self, ws: &WebSocket, code: usize, reason: String) {
        self.on_close(&connection_id(ws));
        let code = if code == 1005 || code == 1006 { 1000 } else { code as u16 };
        let _ = ws.close(Some(code), Some(reason));
    }

    /// Handles one chat frame. Returns `None` for frames that are not chat frames.
    fn handle(
        &self,
        state: &State,
        ws: &WebSocket,
        kind: &str,
        frame: &Map<String, Value>,
    ) -> Option<Result<ChatAction, String>> {
        let connection = connection_id(ws);
        let str_field = |k: &str| frame.get(k).and_then(Value::as_str).map(str::to_owned);
        Some(match kind {
            "cf_agent_use_chat_request" => self.on_request(state, ws, &connection, frame),
            "cf_agent_chat_request_cancel" => match str_field("id") {
                Some(request_id) => Ok(ChatAction::Cancel { request_id }),
                None => Err("cf_agent_chat_request_cancel needs a string \"id\"".into()),
            },
            "cf_agent_chat_clear" => {
                let _ = Messages::new(&self.sql).clear();
                self.broadcast(state, &json!({ "type": "cf_agent_chat_clear" }).to_string(), Some(&connection));
                Ok(ChatAction::Done)
            }
            "cf_agent_chat_messages" => match frame.get("messages").and_then(Value::as_array) {
                Some(messages) => self.persist_client(state, messages, &connection).map(|_| ChatAction::Done),
                None => Err("cf_agent_chat_messages needs a \"messages\" array".into()),
            },
            "cf_agent_stream_resume_request" => {
                let probe = frame.get("probeId").cloned().unwrap_or(Value::Null);
                let reply = match self.active() {
                    Some(active) => {
                        self.pending.borrow_mut().insert(connection);
                        json!({ "type": "cf_agent_stream_resuming", "id": active.request_id, "probeId": probe })
                    }
                    None => json!({ "type": "cf_agent_stream_resume_none", "reason": "idle", "probeId": probe }),
                };
                let _ = ws.send_with_str(reply.to_string());
                Ok(ChatAction::Done)
            }
            "cf_agent_stream_resume_ack" => match str_field("id") {
                Some(id) => {
                    self.on_resume_ack(ws, &connection, &id);
                    Ok(ChatAction::Done)
                }
                None => Err("cf_agent_stream_resume_ack needs a string \"id\"".into()),
            },
            "cf_agent_tool_result" | "cf_agent_tool_approval" => {
                Err(format!("{kind} is not supported: this agent has no client-side tools"))
            }
            _ => return None,
        })
    }

    fn persist_client(&self, state: &State, messages: &[Value], connection: &str) -> Result<(), String> {
        for m in messages {
            validate_message(m)?;
        }
        Messages::new(&self.sql).persist_client(messages, now_ms()).map_err(|e| e.to_string())?;
        self.broadcast_transcript(state, Some(connection));
        Ok(())
    }

    fn on_request(
        &self,
        state: &State,
        ws: &WebSocket,
        connection: &str,
        frame: &Map<String, Value>,
    ) -> Result<ChatAction, String> {
        let Some(request_id) = frame.get("id").and_then(Value::as_str).filter(|id| !id.is_empty() && id.len() <= 256)
        else {
            return Err("cf_agent_use_chat_request needs a string \"id\" of 1 to 256 bytes".into());
        };
        let fail = |problem: String| {
            let error = json!({ "type": RESPONSE, "id": request_id, "body": problem, "done": true, "error": true });
            let _ = ws.send_with_str(error.to_string());
            Ok(ChatAction::Done)
        };
        if self.reserved.is_some_and(|reserved| reserved(&self.sql, request_id)) {
            return fail(format!("request id {request_id:?} names an agent-tool run of this agent"));
        }
        let queued = self.waiting.borrow().values().filter(|c| c.as_deref() == Some(connection)).count();
        if queued >= MAX_QUEUED_TURNS {
            return fail(format!(
                "this connection already has {queued} chat turns waiting (at most {MAX_QUEUED_TURNS}); send again once one has run"
            ));
        }
        let waiting = self.waiting.borrow().len();
        if waiting >= MAX_WAITING_TURNS {
            return fail(format!(
                "this agent already has {waiting} chat turns waiting (at most {MAX_WAITING_TURNS}); send again once one has run"
            ));
        }
        let init = frame.get("init").and_then(Value::as_object);
        if init.and_then(|i| i.get("method")).and_then(Value::as_str) != Some("POST") {
            return fail("cf_agent_use_chat_request needs init.method \"POST\"".into());
        }
        let Some(body) = init.and_then(|i| i.get("body")).and_then(Value::as_str) else {
            return fail("cf_agent_use_chat_request needs init.body, a JSON string".into());
        };
        let body: Value = match serde_json::from_str(body) {
            Ok(b) => b,
            Err(e) => return fail(format!("init.body is not JSON: {e}")),
        };
        let Some(messages) = body.get("messages").and_then(Value::as_array) else {
            return fail("init.body needs a \"messages\" array".into());
        };
        if let Err(problem) = self.persist_client(state, messages, connection) {
            return fail(problem);
        }
        Ok(ChatAction::RunTurn { request_id: request_id.to_owned(), sender: connection.to_owned() })
    }

    fn on_resume_ack(&self, ws: &WebSocket, connection: &str, request_id: &str) {
        let active = self.active().filter(|a| a.request_id == request_id);
        let stream = match &active {
            Some(a) => Some((a.request_id.clone(), a.replay_after)),
            None => self.last_stream.borrow().clone().filter(|(s, _)| s == request_id),
        };
        let chunks =
            stream.map(|(s, after)| StreamLog::new(&self.sql).after(&s, after).unwrap_or_default()).unwrap_or_default();
        // Replay and re-admission in one synchronous step: no live chunk falls between them.
        for c in &chunks {
            let frame = json!({ "type": RESPONSE, "id": request_id, "body": c.body, "done": false, "replay": true, "seq": c.index });
            let _ = ws.send_with_str(frame.to_string());
        }
        let end = if active.is_some() {
            json!({ "type": RESPONSE, "id": request_id, "body": "", "done": false, "replay": true, "replayComplete": true })
        } else {
            json!({ "type": RESPONSE, "id": request_id, "body": "", "done": true, "replay": true })
        };
        let _ = ws.send_with_str(end.to_string());
        self.pending.borrow_mut().remove(connection);
    }

    /// Runs the turn a chat client asked for: a fresh stream under its request id, each chunk
    /// stored, then sent to the clients.
    #[allow(clippy::too_many_arguments)]
    pub async fn run_client_turn(
        &self,
        state: &State,
        request_id: &str,
        sender: Option<String>,
        system: Option<String>,
        max_steps: usize,
        model: &dyn DynModel,
        tools: &dyn DynToolBox,
    ) -> ChatEnd {
        let next = std::cell::Cell::new(0_i64);
        let emit = |body: String| {
            let index = next.get();
            if self.store(request_id, index, ChunkKind::Stored, &body) {
                self.send(state, request_id, std::slice::from_ref(&body));
                next.set(index + 1);
            }
        };
        let spec = TurnSpec {
            request_id: request_id.to_owned(),
            fresh_stream: true,
            replay_after: -1,
            sender,
            system,
            max_steps,
            emit: &emit,
            flush: &|| {},
            cancel: CancelToken::new(),
        };
        self.run(state, spec, model, tools).await.1
    }

    /// Runs one turn over the transcript (after any turn already running), streaming through
    /// `spec.emit`, then persists the assistant message, sends the transcript to the other
    /// clients and the final frame to all. Returns the assistant message and the outcome.
    pub async fn run(
        &self,
        state: &State,
        spec: TurnSpec<'_>,
        model: &dyn DynModel,
        tools: &dyn DynToolBox,
    ) -> (Value, ChatEnd) {
        self.waiting.borrow_mut().insert(spec.request_id.clone(), spec.sender.clone());
        let _turn = self.turns.lock().await;
        self.waiting.borrow_mut().remove(&spec.request_id);
        if self.cancelled.borrow_mut().remove(&spec.request_id) {
            let done =
                json!({ "type": RESPONSE, "id": spec.request_id, "body": "", "done": true, "outcome": "aborted" });
            self.broadcast(state, &done.to_string(), None);
            return (Value::Null, ChatEnd::Aborted(Some("cancelled before it began".into())));
        }
        let history = to_model_messages(spec.system.as_deref(), &self.messages());
        if spec.fresh_stream {
            self.reset_stream(&spec.request_id);
        }
        *self.active.borrow_mut() = Some(ActiveStream {
            request_id: spec.request_id.clone(),
            cancel: spec.cancel.clone(),
            replay_after: spec.replay_after,
        });
        let _active = ActiveGuard { chat: self, request_id: spec.request_id.clone() };
        let message_id = format!("assistant_{}_{}", now_ms(), random_id().chars().take(8).collect::<String>());
        if let Err(e) = OpenStreams::new(&self.sql).open(&spec.request_id, &spec.request_id, &message_id, now_ms()) {
            worker::console_error!("agent-tools: marking stream {} open failed: {e}", spec.request_id);
        }
        let builder = RefCell::new(MessageBuilder::new(message_id.clone()));
        let emit = |chunk: Value| {
            builder.borrow_mut().apply(&chunk);
            (spec.emit)(chunk.to_string());
        };
        let options = TurnOptions { message_id, max_steps: spec.max_steps };
        let end = {
            let turn = run_turn(model, tools, history, &options, &emit);
            let stop = spec.cancel.cancelled();
            futures::pin_mut!(turn, stop);
            match select(turn, stop).await {
                Either::Left((TurnOutcome::Completed { .. }, _)) => ChatEnd::Completed,
                Either::Left((TurnOutcome::Failed(e), _)) => ChatEnd::Error(e),
                Either::Right(_) => {
                    let reason = spec.cancel.reason();
                    let abort = match &reason {
                        Some(r) => json!({ "type": "abort", "reason": r }),
                        None => json!({ "type": "abort" }),
                    };
                    emit(abort);
                    ChatEnd::Aborted(reason)
                }
            }
        };
        (spec.flush)();
        let message = builder.borrow().message();
        if let Err(e) = Messages::new(&self.sql)
            .upsert(&message, now_ms())
            .and_then(|_| OpenStreams::new(&self.sql).close(&spec.request_id))
        {
            worker::console_error!("agent-tools: saving the assistant message failed: {e}");
        }
        *self.active.borrow_mut() = None;
        *self.last_stream.borrow_mut() = Some((spec.request_id.clone(), spec.replay_after));
        if spec.fresh_stream {
            // Only the last turn's chunks can still be asked for (a resume right after it
            // ended); a child's run stream is its parent's to read.
            let reserved = self.reserved;
            let sql = &self.sql;
            if let Err(e) = StreamLog::new(sql).prune(&spec.request_id, |id| reserved.is_some_and(|r| r(sql, id))) {
                worker::console_error!("agent-tools: pruning finished chat streams failed: {e}");
            }
        }
        self.pending.borrow_mut().clear();
        self.broadcast_transcript(state, spec.sender.as_deref());
        let id = &spec.request_id;
        let done = match &end {
            ChatEnd::Completed => json!({ "type": RESPONSE, "id": id, "body": "", "done": true }),
            ChatEnd::Error(e) => {
                self.broadcast(
                    state,
                    &json!({ "type": RESPONSE, "id": id, "body": e, "done": false, "error": true }).to_string(),
                    None,
                );
                json!({ "type": RESPONSE, "id": id, "body": "", "done": true, "outcome": "error" })
            }
            ChatEnd::Aborted(_) => {
                json!({ "type": RESPONSE, "id": id, "body": "", "done": true, "outcome": "aborted" })
            }
        };
        self.broadcast(state, &done.to_string(), None);
        (message, end)
    }
}

/// How a chat turn ended.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatEnd {
    /// The model finished.
    Completed,
    /// The model failed.
    Error(String),
    /// The turn was cancelled.
    Aborted(Option<String>),
}
