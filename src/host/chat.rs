//! The chat agent on its host, shared by parents and children: carries out what the chat
//! protocol's state machine ([`crate::chat::protocol`]) decides over the object's client sockets,
//! and runs a turn (one at a time) that streams to every connected client and is persisted.

use std::cell::RefCell;
use std::rc::Rc;

use futures::future::{select, Either};
use futures::lock::Mutex;
use serde_json::Value;

use super::io::{Io, Socket};
use crate::cancel::CancelToken;
use crate::chat::convert::to_model_messages;
use crate::chat::message::MessageBuilder;
pub use crate::chat::protocol::ChatEnd;
use crate::chat::protocol::{ActiveStream, ChatFrame, ChatMessage, ChatOutput, ChatState};
use crate::chat::store::{Messages, OpenStreams, StreamLog};
use crate::chat::turn::{run_turn, DynModel, DynToolBox, TurnOptions, TurnOutcome};
use crate::protocol::rpc::{self, ClientFrame, FrameError, RpcRequest, RpcResponse};
use crate::protocol::tail::ChunkKind;
use crate::store::{Sql, StoreError};

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

/// The chat of one agent: its state machine, the running turn's cancel token, and the lock
/// that runs turns one at a time.
pub struct Chat {
    io: Rc<dyn Io>,
    state: RefCell<ChatState>,
    running: RefCell<Option<(String, CancelToken)>>,
    turns: Mutex<()>,
    /// Request ids a client may not use (they name streams the host writes itself).
    reserved: Option<fn(&dyn Sql, &str) -> bool>,
}

/// Ends the running turn's stream when the turn ends, however it ends (a dropped turn too).
struct RunningGuard<'a> {
    chat: &'a Chat,
    request_id: String,
}

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        let mut running = self.chat.running.borrow_mut();
        if running.as_ref().is_some_and(|(id, _)| *id == self.request_id) {
            *running = None;
        }
    }
}

impl Chat {
    /// The chat over this agent's SQL (its tables are the host's to create: see
    /// `host::migrate`). A turn that a restart cut short is saved as the partial message it had
    /// streamed.
    pub fn new(io: Rc<dyn Io>) -> Self {
        if let Err(e) = OpenStreams::new(io.sql()).recover(io.now()) {
            io.log(&format!("agent-tools: recovering interrupted chat streams failed: {e}"), true);
        }
        Self {
            io,
            state: RefCell::new(ChatState::default()),
            running: RefCell::new(None),
            turns: Mutex::new(()),
            reserved: None,
        }
    }

    /// Refuses client requests whose id `reserved` claims: a child's run ids, whose stream
    /// logs share the table with client turns.
    pub fn with_reserved_ids(mut self, reserved: fn(&dyn Sql, &str) -> bool) -> Self {
        self.reserved = Some(reserved);
        self
    }

    fn sql(&self) -> &dyn Sql {
        self.io.sql()
    }

    fn is_reserved(&self, request_id: &str) -> bool {
        self.reserved.is_some_and(|reserved| reserved(self.sql(), request_id))
    }

    /// Sends the state machine's frames, and hands back what is the host's to do.
    fn carry_out(&self, outputs: Vec<ChatOutput>) -> ChatAction {
        let mut action = ChatAction::Done;
        // The sockets are looked up once for the lot; their ids only when a frame is for some.
        let sockets = self.io.sockets();
        let mut ids: Option<Vec<String>> = None;
        for output in outputs {
            match output {
                ChatOutput::Send { to, frame } => {
                    let ids = ids.get_or_insert_with(|| sockets.iter().map(|s| s.id()).collect());
                    let text = frame.to_json();
                    for (socket, _) in sockets.iter().zip(ids.iter()).filter(|(_, id)| **id == to) {
                        socket.send(&text);
                    }
                }
                ChatOutput::Broadcast { frame, skip } => {
                    if sockets.is_empty() {
                        continue; // nobody watches: the frame is not even built
                    }
                    let text = frame.to_json();
                    if skip.is_empty() {
                        for socket in &sockets {
                            socket.send(&text);
                        }
                        continue;
                    }
                    let ids = ids.get_or_insert_with(|| sockets.iter().map(|s| s.id()).collect());
                    for (socket, _) in sockets.iter().zip(ids.iter()).filter(|(_, id)| !skip.contains(*id)) {
                        socket.send(&text);
                    }
                }
                ChatOutput::RunTurn { request_id, sender } => action = ChatAction::RunTurn { request_id, sender },
                ChatOutput::CancelTurn { request_id } => action = ChatAction::Cancel { request_id },
            }
        }
        action
    }

    fn failed(&self, step: &str, e: &StoreError) {
        self.io.log(&format!("agent-tools: the chat's {step} failed: {e}"), true);
    }

    /// Cancels a turn: the running one (its model stream is dropped) or one still waiting for
    /// its turn (a cancel for any other id is ignored). Returns whether it was the running one.
    pub fn cancel(&self, request_id: &str, reason: &str) -> bool {
        if !self.state.borrow_mut().cancel(request_id) {
            return false;
        }
        if let Some((_, token)) = self.running.borrow().as_ref().filter(|(id, _)| id == request_id) {
            token.cancel(Some(reason.to_owned()));
        }
        true
    }

    /// Forgets every in-memory stream state (after the agent's storage was cleared).
    pub fn reset(&self) {
        self.state.borrow_mut().reset();
        *self.running.borrow_mut() = None;
    }

    /// The transcript.
    pub fn messages(&self) -> Vec<Value> {
        Messages::new(self.sql()).list().unwrap_or_else(|e| {
            self.failed("transcript", &e);
            Vec::new()
        })
    }

    /// The stream being written, if any.
    pub fn active(&self) -> Option<ActiveStream> {
        self.state.borrow().active().cloned()
    }

    /// The running turn's cancel token, if one runs.
    pub fn running(&self) -> Option<CancelToken> {
        self.running.borrow().as_ref().map(|(_, token)| token.clone())
    }

    /// Whether the stream of `request_id` is being written.
    pub fn is_streaming(&self, request_id: &str) -> bool {
        self.state.borrow().is_streaming(request_id)
    }

    /// Sends the transcript to every chat client but `except` (with none attached, a child run
    /// nobody drilled into, the messages are not even read).
    pub fn broadcast_transcript(&self, except: Option<&str>) {
        if self.io.sockets().is_empty() {
            return;
        }
        let output = self.state.borrow().transcript(self.sql(), except);
        match output {
            Ok(output) => drop(self.carry_out(vec![output])),
            Err(e) => self.failed("transcript", &e),
        }
    }

    /// Sends chunks of request `request_id` to the chat clients (except those resuming), in
    /// order.
    pub fn send(&self, request_id: &str, bodies: &[String]) {
        let outputs = self.state.borrow().turn_chunks(request_id, bodies);
        self.carry_out(outputs);
    }

    /// Tells every client that request `request_id` failed before it began.
    pub fn fail_request(&self, request_id: &str, problem: &str) {
        let output = self.state.borrow().broadcast(ChatFrame::failed(request_id, problem.to_owned()), None);
        self.carry_out(vec![output]);
    }

    /// The frames a chat client gets first: `cf_agent_stream_resuming` while a stream is active
    /// (the connection then gets no live chunks until it acknowledges).
    pub fn on_connect(&self, socket: &dyn Socket) {
        for output in self.state.borrow_mut().on_connect(&socket.id()) {
            if let ChatOutput::Send { frame, .. } = output {
                socket.send(&frame.to_json());
            }
        }
    }

    /// Reads one client frame: chat frames are handled here and anything malformed or refused
    /// gets its error frame (the socket stays open); what is left for the host (an RPC call, a
    /// turn to run, a cancel) is returned.
    pub fn receive(&self, socket: &dyn Socket, message: Result<String, ()>) -> ChatAction {
        let frame = match message {
            Ok(text) => rpc::parse_client_frame(&text),
            Err(()) => Err(FrameError::Binary),
        };
        let reply = match frame {
            Ok(ClientFrame::Rpc(call)) => return ChatAction::Call(call),
            Ok(ClientFrame::Other { kind, frame }) => match ChatMessage::parse(&kind, &frame) {
                Ok(None) => return ChatAction::Done,
                Ok(Some(message)) => {
                    let connection = socket.id();
                    let reserved = |id: &str| self.is_reserved(id);
                    let outputs =
                        self.state.borrow_mut().receive(self.sql(), &connection, message, &reserved, self.io.now());
                    match outputs {
                        Ok(outputs) => return self.carry_out(outputs),
                        Err(e) => ChatFrame::Error(format!("the frame could not be handled: {e}")).to_json(),
                    }
                }
                Err(problem) => ChatFrame::Error(problem).to_json(),
            },
            Err(FrameError::BadRpc { id, problem }) => {
                RpcResponse::err(id, format!("malformed rpc frame: {problem}")).to_json()
            }
            Err(e) => rpc::protocol_error_frame(&e),
        };
        socket.send(&reply);
        ChatAction::Done
    }

    /// Forgets a client that went away and completes the close handshake.
    pub fn closed(&self, socket: &dyn Socket, code: u16, reason: &str) {
        self.state.borrow_mut().on_close(&socket.id());
        let code = if code == 1005 || code == 1006 { 1000 } else { code };
        socket.close(code, reason);
    }

    /// Runs the turn a chat client asked for: a fresh stream under its request id, each chunk
    /// stored, then sent to the clients.
    #[allow(clippy::too_many_arguments)]
    pub async fn run_client_turn(
        &self,
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
            match StreamLog::new(self.sql()).append(request_id, index, ChunkKind::Stored, &body) {
                Ok(()) => {
                    self.send(request_id, std::slice::from_ref(&body));
                    next.set(index + 1);
                }
                Err(e) => self.failed("stream", &e),
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
        self.run(spec, model, tools).await.1
    }

    /// Runs one turn over the transcript (after any turn already running), streaming through
    /// `spec.emit`, then persists the assistant message, sends the transcript to the other
    /// clients and the final frame to all. Returns the assistant message and the outcome.
    pub async fn run(&self, spec: TurnSpec<'_>, model: &dyn DynModel, tools: &dyn DynToolBox) -> (Value, ChatEnd) {
        self.state.borrow_mut().turn_waits(&spec.request_id, spec.sender.clone());
        let _turn = self.turns.lock().await;
        let begun =
            self.state.borrow_mut().turn_begins(self.sql(), &spec.request_id, spec.replay_after, spec.fresh_stream);
        match begun {
            Ok(Ok(())) => {}
            Ok(Err(end)) => {
                self.carry_out(vec![end]);
                return (Value::Null, ChatEnd::Aborted(Some("cancelled before it began".into())));
            }
            Err(e) => {
                self.failed("turn", &e);
                self.fail_request(&spec.request_id, &e.to_string());
                return (Value::Null, ChatEnd::Error(e.to_string()));
            }
        }
        *self.running.borrow_mut() = Some((spec.request_id.clone(), spec.cancel.clone()));
        let _running = RunningGuard { chat: self, request_id: spec.request_id.clone() };
        let history = to_model_messages(spec.system.as_deref(), &self.messages());
        let now = self.io.now();
        let message_id = format!("assistant_{now}_{}", self.io.random_id().chars().take(8).collect::<String>());
        if let Err(e) = OpenStreams::new(self.sql()).open(&spec.request_id, &spec.request_id, &message_id, now) {
            self.failed("stream", &e);
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
                        Some(r) => serde_json::json!({ "type": "abort", "reason": r }),
                        None => serde_json::json!({ "type": "abort" }),
                    };
                    emit(abort);
                    ChatEnd::Aborted(reason)
                }
            }
        };
        (spec.flush)();
        let message = builder.borrow().message();
        if let Err(e) = Messages::new(self.sql())
            .upsert(&message, self.io.now())
            .and_then(|_| OpenStreams::new(self.sql()).close(&spec.request_id))
        {
            self.failed("assistant message", &e);
        }
        let reserved = |id: &str| self.is_reserved(id);
        let ended = self.state.borrow_mut().turn_ends(
            self.sql(),
            &spec.request_id,
            &end,
            spec.sender.as_deref(),
            spec.fresh_stream,
            &reserved,
        );
        match ended {
            Ok(outputs) => drop(self.carry_out(outputs)),
            Err(e) => self.failed("turn's end", &e),
        }
        (message, end)
    }
}
