//! The chat agent on its host, shared by parents and children: carries out what the chat
//! protocol's state machine ([`crate::chat::protocol`]) decides over the object's client sockets,
//! and runs a turn (one at a time) that streams to every connected client and is persisted.

use std::cell::RefCell;
use std::rc::Rc;

use futures::future::{select, Either};
use std::sync::Arc;

use futures::lock::{Mutex, OwnedMutexGuard};
use serde_json::Value;

use super::io::{Io, Socket};
use crate::cancel::CancelToken;
use crate::chat::convert::to_model_messages;
use crate::chat::interaction::{self, Answer, Interactions, Kind};
use crate::chat::journal::{self, Continuation, Held, Journal, OpenTurn, ToolResult, Waits};
use crate::chat::message::MessageBuilder;
pub use crate::chat::protocol::ChatEnd;
use crate::chat::protocol::{ChatFrame, ChatMessage, ChatOutput, ChatState};
use crate::chat::store::{Messages, OpenStreams, StreamLog};
use crate::chat::turn::{run_turn, DynModel, DynToolBox, NoRecord, Record, TurnOptions, TurnOutcome};
use crate::llm::ToolCall;
use crate::protocol::rpc::{self, ClientFrame, FrameError, RpcRequest, RpcResponse};
use crate::protocol::tail::ChunkKind;
use crate::store::{Sql, StoreError};
use crate::types::{ChatRecovery, InterruptedTurn};

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
    /// A client's `setState`: make this the agent's state.
    State(Value),
    /// A person answered a waiting call; if the paused turn may go on now, it is begun and
    /// waits in [`Chat::take_continuations`].
    Answered,
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
    /// A client's turn is kept in the journal as it goes (`None`: an agent-tool run's turn,
    /// which its run's recovery heals).
    pub durable: Option<Durable<'a>>,
}

/// The right to run the next turn, taken ahead ([`Chat::claim_slot`]).
pub struct TurnSlot(OwnedMutexGuard<()>);

/// How a durable turn is kept.
pub struct Durable<'a> {
    /// The stream log's last index so far.
    pub last_index: &'a dyn Fn() -> i64,
    /// The journal's turn and where it goes on, for a continuation.
    pub resume: Option<(OpenTurn, Continuation)>,
    /// The turn slot, when the caller took it ahead.
    pub slot: Option<TurnSlot>,
    /// The turn is continued after a restart (the clients are told it is recovering), not
    /// after a person's answer.
    pub recovering: bool,
}

/// The journal as a running turn writes it: each record names the log's last index, so a
/// continuation keeps the chunks it accounts for and drops the rest.
struct Keeper<'a> {
    chat: &'a Chat,
    request_id: &'a str,
    message_id: &'a str,
    last_index: &'a dyn Fn() -> i64,
}

/// How many times a chunk of a turn's stream is written before it goes out unlogged.
const APPEND_TRIES: usize = 3;

impl Record for Keeper<'_> {
    fn step(&self, step: usize, text: &str, calls: &[ToolCall]) {
        let kept = Journal::new(self.chat.sql()).step(self.request_id, step, text, calls, (self.last_index)());
        if let Err(e) = kept {
            self.chat.failed("turn's journal", &e);
        }
    }
    fn result(&self, call_id: &str, result: &ToolResult) {
        if let Err(e) = Journal::new(self.chat.sql()).result(self.request_id, call_id, result, (self.last_index)()) {
            self.chat.failed("turn's journal", &e);
        }
    }
    fn asks(&self, call: &ToolCall, kind: Kind) {
        let now = self.chat.io.now();
        let (approval, expires) = match kind {
            Kind::Approval => {
                (crate::chat::turn::approval_id(&call.id), self.chat.approval_timeout.get().map(|t| now + t))
            }
            Kind::Client => (String::new(), None),
        };
        let sql = self.chat.sql();
        let asked = Interactions::new(sql)
            .ask(&call.id, self.message_id, kind, &approval, &call.name, now, expires)
            .and_then(|()| Journal::new(sql).keep(self.request_id, (self.last_index)()));
        if let Err(e) = asked {
            self.chat.failed("waiting call", &e);
        }
    }
    fn started(&self, call_id: &str) {
        if let Err(e) = Journal::new(self.chat.sql()).started(self.request_id, call_id) {
            self.chat.failed("turn's journal", &e);
        }
    }
}

/// The chat of one agent: its state machine, the running turn's cancel token, and the lock
/// that runs turns one at a time.
pub struct Chat {
    io: Rc<dyn Io>,
    state: RefCell<ChatState>,
    running: RefCell<Option<(String, CancelToken)>>,
    /// The request id of the turn being continued after a restart, if one is.
    recovering: RefCell<Option<String>>,
    turns: Arc<Mutex<()>>,
    /// Request ids a client may not use (they name streams the host writes itself).
    reserved: Option<fn(&dyn Sql, &str) -> bool>,
    /// Whether this object serves as a sub-agent (it has agent-tool runs).
    sub_agent: Option<fn(&dyn Sql) -> bool>,
    /// How long an approval waits before it is denied (ms), if it is ever.
    approval_timeout: std::cell::Cell<Option<i64>>,
    /// Turns that paused for a person and may go on now, begun in the journal: the host runs
    /// them ([`Chat::take_continuations`]).
    continuations: RefCell<Vec<OpenTurn>>,
    /// Who waits for the running turn to end ([`Chat::when_idle`]).
    idle: RefCell<Vec<futures::channel::oneshot::Sender<()>>>,
}

/// Ends the running turn's stream when the turn ends, however it ends (a dropped turn too).
struct RunningGuard<'a> {
    chat: &'a Chat,
    request_id: String,
}

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        let ended = {
            let mut running = self.chat.running.borrow_mut();
            let ours = running.as_ref().is_some_and(|(id, _)| *id == self.request_id);
            if ours {
                *running = None;
            }
            ours
        };
        if ended {
            for waiter in self.chat.idle.take() {
                let _ = waiter.send(());
            }
        }
    }
}

impl Chat {
    /// The chat over this agent's SQL (its tables are the host's to create: see
    /// `host::migrate`). An agent-tool run's turn that a restart cut short is saved as the
    /// partial message it had streamed (its run's recovery runs it again); a client's turn is
    /// continued from its journal instead ([`Chat::continue_turn`]).
    pub fn new(io: Rc<dyn Io>) -> Self {
        if let Err(e) = OpenStreams::new(io.sql()).recover(io.now()) {
            io.log(&format!("agent-tools: recovering interrupted chat streams failed: {e}"), true);
        }
        Self {
            io,
            state: RefCell::new(ChatState::default()),
            running: RefCell::new(None),
            recovering: RefCell::new(None),
            turns: Arc::new(Mutex::new(())),
            reserved: None,
            sub_agent: None,
            approval_timeout: std::cell::Cell::new(None),
            continuations: RefCell::new(Vec::new()),
            idle: RefCell::new(Vec::new()),
        }
    }

    /// Denies an approval nobody answered within `timeout` (none: it waits as long as it takes).
    pub fn set_approval_timeout(&self, timeout: Option<std::time::Duration>) {
        self.approval_timeout.set(timeout.map(|t| i64::try_from(t.as_millis()).unwrap_or(i64::MAX)));
    }

    /// Refuses client requests whose id `reserved` claims: a child's run ids, whose stream
    /// logs share the table with client turns.
    pub fn with_reserved_ids(mut self, reserved: fn(&dyn Sql, &str) -> bool) -> Self {
        self.reserved = Some(reserved);
        self
    }

    /// Says whether the object serves as a sub-agent: a drill-in client's answer frames are
    /// then refused as unsupported (a sub-agent's turn has no person to ask; its parent asks).
    pub fn with_sub_agent_check(mut self, sub_agent: fn(&dyn Sql) -> bool) -> Self {
        self.sub_agent = Some(sub_agent);
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
                ChatOutput::Answer { connection, call_id, kind, answer, auto_continue } => {
                    match self.answer(&call_id, kind, &answer, auto_continue) {
                        Ok(()) => action = ChatAction::Answered,
                        Err(problem) => {
                            let text = ChatFrame::Error(problem).to_json();
                            for (socket, _) in
                                sockets.iter().zip(sockets.iter().map(|s| s.id())).filter(|(_, id)| *id == connection)
                            {
                                socket.send(&text);
                            }
                        }
                    }
                }
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

    /// A turn is asked for: it waits for its time (a cancel finds it from now on).
    pub fn waits(&self, request_id: &str, sender: Option<String>) {
        self.state.borrow_mut().turn_waits(request_id, sender);
    }

    /// A turn asked for with [`Chat::waits`] is over, or never began (its model could not be
    /// made): it waits no more.
    pub fn done_waiting(&self, request_id: &str) {
        let outputs = self.state.borrow_mut().turn_dropped(request_id);
        self.carry_out(outputs);
    }

    /// Takes the turn slot now, if it is free (a new instance's continuation goes before any
    /// turn a client asks for in the same event).
    pub fn claim_slot(&self) -> Option<TurnSlot> {
        self.turns.try_lock_owned().map(TurnSlot)
    }

    /// A person's answer to call `call_id`: recorded if the call waits for it and nobody
    /// answered first (else `Err` with why, for the sender), shown in the call's part of the
    /// saved message (every client gets `cf_agent_message_updated`), and, when every waiting call
    /// of the message is answered, the paused turn is begun again ([`Chat::take_continuations`]).
    /// One synchronous step: a restart finds all of it or none.
    pub fn answer(&self, call_id: &str, kind: Kind, answer: &Answer, auto_continue: bool) -> Result<(), String> {
        let sql = self.sql();
        let answered = match Interactions::new(sql).answer(call_id, kind, answer, auto_continue, self.io.now()) {
            Ok(Ok(answered)) => answered,
            Ok(Err(interaction::Refused::Unknown(id))) => {
                // Its turn went on already: the message shows what the first answer said.
                let shown = self.messages().iter().find_map(|m| {
                    let parts = m.get("parts")?.as_array()?;
                    let part = parts.iter().find(|p| p.get("toolCallId").and_then(Value::as_str) == Some(&id))?;
                    interaction::shown_answer(part)
                });
                let frame = match kind {
                    Kind::Approval => "cf_agent_tool_approval",
                    Kind::Client => "cf_agent_tool_result",
                };
                return Err(match shown {
                    Some(first) => interaction::Refused::AlreadyAnswered { call_id: id, first }.to_string(),
                    None if self.sub_agent.is_some_and(|sub| sub(sql)) => {
                        format!("{frame} is not supported: this agent has no client-side tools")
                    }
                    None => interaction::Refused::Unknown(id).to_string(),
                });
            }
            Ok(Err(refused)) => return Err(refused.to_string()),
            Err(e) => {
                self.failed("answer", &e);
                return Err(format!("the answer could not be stored: {e}"));
            }
        };
        self.show(&answered);
        self.begin_continuation(&answered.message_id);
        Ok(())
    }

    /// Shows a call's question or answer in its saved message, and sends every client the
    /// message (a message a turn is still writing shows it when the turn saves it).
    fn show(&self, waiting: &interaction::Interaction) {
        if self.writing(&waiting.message_id) {
            return;
        }
        let now = self.io.now();
        let messages = Messages::new(self.sql());
        let shown = messages.get(&waiting.message_id).and_then(|found| {
            let Some((mut message, ord)) = found else { return Ok(None) };
            if !interaction::show(&mut message, waiting) {
                return Ok(None);
            }
            messages.upsert_at(&message, ord, now).map(|()| Some(message))
        });
        match shown {
            Ok(Some(message)) => {
                let output = self.state.borrow().broadcast(ChatFrame::MessageUpdated(message), None);
                self.carry_out(vec![output]);
            }
            Ok(None) => {}
            Err(e) => self.failed("assistant message", &e),
        }
    }

    /// Whether an open turn writes message `message_id`.
    fn writing(&self, message_id: &str) -> bool {
        match Journal::new(self.sql()).open() {
            Ok(open) => open.iter().any(|t| t.message_id == message_id),
            Err(e) => {
                self.failed("turn's journal", &e);
                true
            }
        }
    }

    /// If the turn of `message_id` paused and every waiting call is answered: begins its
    /// continuation in the journal (the answers shown in its message, the approved calls marked
    /// to run), for the host to run.
    fn begin_continuation(&self, message_id: &str) {
        let sql = self.sql();
        if !matches!(Interactions::new(sql).ready(message_id), Ok(true)) || self.writing(message_id) {
            return;
        }
        let now = self.io.now();
        let request_id = format!("continue_{now}_{}", self.io.random_id().chars().take(8).collect::<String>());
        let begun = Messages::new(sql).get(message_id).and_then(|found| {
            let Some((mut message, ord)) = found else { return Ok(None) };
            for answered in Interactions::new(sql).take(message_id)? {
                interaction::show(&mut message, &answered);
            }
            Messages::new(sql).upsert_at(&message, ord, now)?;
            Journal::new(sql).begin_continuation(&request_id, &message, ord, now).map(Some)
        });
        match begun {
            Ok(Some(turn)) => self.continuations.borrow_mut().push(turn),
            Ok(None) => {}
            Err(e) => self.failed("turn's continuation", &e),
        }
    }

    /// The turns that may go on after a person's answers, begun in the journal: the caller runs
    /// each ([`Chat::continue_turn`], not as a recovery).
    pub fn take_continuations(&self) -> Vec<OpenTurn> {
        std::mem::take(&mut *self.continuations.borrow_mut())
    }

    /// Denies the approvals whose time ran out (the turn goes on with the denial). Returns when
    /// the next one runs out, if one can.
    pub fn expire_approvals(&self) -> Option<i64> {
        let sql = self.sql();
        let expired = Interactions::new(sql).expired(self.io.now()).unwrap_or_else(|e| {
            self.failed("waiting calls", &e);
            Vec::new()
        });
        for waiting in expired {
            let seconds = self.approval_timeout.get().map_or(0, |t| t / 1000);
            let reason = format!("nobody answered within {seconds} s");
            if let Err(problem) = self.answer(&waiting.call_id, Kind::Approval, &Answer::Denied(reason), true) {
                self.io.log(&format!("agent-tools: an approval ran out but could not be denied: {problem}"), true);
            }
        }
        Interactions::new(sql).next_expiry().unwrap_or_else(|e| {
            self.failed("waiting calls", &e);
            None
        })
    }

    /// A new message was sent: the calls still waiting are answered for it (denied, their
    /// parts closed), so no old question stays open under a newer turn.
    fn supersede_waiting(&self) {
        let sql = self.sql();
        let open = match Interactions::new(sql).clear() {
            Ok(open) => open,
            Err(e) => return self.failed("waiting calls", &e),
        };
        for mut waiting in open {
            waiting.answer = Some(match waiting.kind {
                Kind::Approval => Answer::Denied("a new message was sent before it was answered".into()),
                Kind::Client => Answer::Failed("a new message was sent before the client answered".into()),
            });
            self.show(&waiting);
        }
    }

    /// Tells every client whether the turn of `request_id` is being recovered
    /// (`cf_agent_chat_recovering`, which the stock client shows as `isRecovering`).
    fn broadcast_recovering(&self, request_id: &str, recovering: bool) {
        if !recovering {
            self.recovering.borrow_mut().take();
        }
        let frame = ChatFrame::Recovering { id: request_id.to_owned(), recovering };
        let output = self.state.borrow().broadcast(frame, None);
        self.carry_out(vec![output]);
    }

    /// The message a turn writes, rebuilt from the first `kept + 1` chunks of its log (a
    /// continuation's), after the saved message when the turn `continues` one, or empty.
    fn kept_message(&self, request_id: &str, message_id: &str, kept: i64, continues: bool) -> MessageBuilder {
        let saved = match continues.then(|| Messages::new(self.sql()).get(message_id)) {
            Some(Ok(Some((message, _)))) => Some(message),
            Some(Err(e)) => {
                self.failed("assistant message", &e);
                None
            }
            _ => None,
        };
        let mut builder =
            saved.map_or_else(|| MessageBuilder::new(message_id.to_owned()), |m| MessageBuilder::from_message(&m));
        if kept < 0 {
            return builder;
        }
        match StreamLog::new(self.sql()).page_after(request_id, -1, kept + 1) {
            Ok(chunks) => {
                for chunk in chunks.iter().filter_map(|c| serde_json::from_str::<Value>(&c.body).ok()) {
                    builder.apply(&chunk);
                }
            }
            Err(e) => self.failed("stream", &e),
        }
        builder
    }

    /// Saves a turn's message, in one step: a durable turn's in its place, its journal gone and
    /// the messages held meanwhile after it. Returns how many held messages joined.
    fn save(&self, request_id: &str, turn: Option<&OpenTurn>, message: &Value) -> usize {
        let now = self.io.now();
        let saved = match turn {
            Some(turn) => Messages::new(self.sql())
                .upsert_at(message, turn.ord, now)
                .and_then(|()| Journal::new(self.sql()).end(request_id))
                .and_then(|()| Held::new(self.sql()).release(now)),
            None => Messages::new(self.sql()).upsert(message, now).map(|()| 0),
        }
        .and_then(|released| OpenStreams::new(self.sql()).close(request_id).map(|()| released));
        saved.unwrap_or_else(|e| {
            self.failed("assistant message", &e);
            0
        })
    }

    /// Ends a turn whose journal could not begin (nothing of it streamed).
    fn end_unbegun(&self, spec: &TurnSpec<'_>, problem: String) -> (Value, ChatEnd) {
        let end = ChatEnd::Error(problem);
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
        (Value::Null, end)
    }

    /// Whether the turn of `request_id` runs here or waits for its time.
    pub fn is_live(&self, request_id: &str) -> bool {
        self.running.borrow().as_ref().is_some_and(|(id, _)| id == request_id)
            || self.state.borrow().is_waiting(request_id)
    }

    /// The transcript.
    pub fn messages(&self) -> Vec<Value> {
        Messages::new(self.sql()).list().unwrap_or_else(|e| {
            self.failed("transcript", &e);
            Vec::new()
        })
    }

    /// Resolves when the turn running now has ended (at once when none runs).
    pub fn when_idle(&self) -> futures::channel::oneshot::Receiver<()> {
        let (sender, ended) = futures::channel::oneshot::channel();
        match self.running.borrow().is_some() {
            true => self.idle.borrow_mut().push(sender),
            false => drop(sender.send(())),
        }
        ended
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
        if let Some(id) = self.recovering.borrow().clone() {
            socket.send(&ChatFrame::Recovering { id, recovering: true }.to_json());
        }
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
            Ok(ClientFrame::Other { kind, frame }) if kind == "cf_agent_state" => match frame.get("state") {
                Some(state) => return ChatAction::State(state.clone()),
                None => crate::state::error_frame("cf_agent_state needs a \"state\""),
            },
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
    /// stored, then sent to the clients; the turn kept in the journal as it goes.
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
        self.client_turn(request_id, sender, system, max_steps, model, tools, None).await
    }

    /// Continues a turn from its journal's `turn`: after a person's answers (`fresh`: the turn
    /// [`Chat::take_continuations`] gave), or after a restart cut it short: then it is one
    /// attempt more, the log is cut back to what the journal accounts for, the clients are told
    /// it is recovering and offered the stream again, and `decide` (the agent's
    /// [`crate::Agent::on_chat_recovery`]) says whether it goes on; past `max_attempts`
    /// continuations it does not. (`decide` is asked for a `fresh` turn too: it declines one
    /// whose model cannot be made.)
    #[allow(clippy::too_many_arguments)]
    pub async fn continue_turn(
        &self,
        turn: OpenTurn,
        system: Option<String>,
        max_steps: usize,
        model: &dyn DynModel,
        tools: &dyn DynToolBox,
        max_attempts: u32,
        decide: &dyn Fn(&InterruptedTurn) -> ChatRecovery,
        slot: Option<TurnSlot>,
        fresh: bool,
    ) -> ChatEnd {
        let request_id = turn.request_id.clone();
        let sql = self.sql();
        let journal = Journal::new(sql);
        let begun = if fresh { Ok(turn) } else { journal.next_attempt(&request_id) }.and_then(|turn| {
            StreamLog::new(sql).truncate_after(&request_id, turn.log_keep)?;
            let steps = journal.steps(&request_id)?;
            let results = journal.results(&request_id)?;
            let asked = Interactions::new(sql).of_message(&turn.message_id)?.into_iter().map(|i| i.call_id).collect();
            let waits = Waits { approved: journal.approved(&request_id)?, asked };
            Ok((turn, steps, results, waits))
        });
        let (turn, steps, results, waits) = match begun {
            Ok(begun) => begun,
            Err(e) => {
                // Tried again by the next instance (the journal is unchanged, or one attempt on).
                self.failed("turn's continuation", &e);
                return ChatEnd::Error(e.to_string());
            }
        };
        let plan = journal::plan(&steps, &results, &waits, |name| tools.redo_dyn(name));
        let interrupted = InterruptedTurn {
            request_id: request_id.clone(),
            attempt: turn.attempts as u32 - 1,
            partial_text: steps.iter().map(|s| s.text.as_str()).collect::<Vec<_>>().join(""),
            pending_tools: plan.pending.iter().map(|(c, _)| c.name.clone()).collect(),
        };
        let exhausted = if fresh { None } else { journal::exhausted(turn.attempts, max_attempts) };
        let refusal = match exhausted {
            Some(reason) => Some(reason),
            None => match decide(&interrupted) {
                ChatRecovery::Continue => None,
                ChatRecovery::Decline(reason) => Some(reason),
            },
        };
        let plan = match refusal {
            None => plan,
            // Ended, not continued: every call left open gets its "interrupted" result, so no tool
            // part stays open, then the turn ends with the reason.
            Some(reason) => Continuation {
                pending: plan.pending.into_iter().map(|(c, _)| (c, journal::Redo::Interrupted)).collect(),
                refused: Some(reason),
                ..plan
            },
        };
        self.client_turn(&request_id, None, system, max_steps, model, tools, Some((turn, plan, slot, !fresh))).await
    }

    #[allow(clippy::too_many_arguments)]
    async fn client_turn(
        &self,
        request_id: &str,
        sender: Option<String>,
        system: Option<String>,
        max_steps: usize,
        model: &dyn DynModel,
        tools: &dyn DynToolBox,
        resume: Option<(OpenTurn, Continuation, Option<TurnSlot>, bool)>,
    ) -> ChatEnd {
        let first = resume.as_ref().map_or(0, |(turn, ..)| turn.log_keep + 1);
        let (resume, slot, recovering) = match resume {
            Some((turn, plan, slot, recovering)) => (Some((turn, plan)), slot, recovering),
            None => (None, None, false),
        };
        let next = std::cell::Cell::new(first);
        let emit = |body: String| {
            let index = next.get();
            let log = StreamLog::new(self.sql());
            // A statement that failed is tried again; a chunk the log never takes still goes to
            // the clients (the saved message holds it: what they show must too), and a client
            // that resumes the stream misses it until the message is saved.
            let mut stored = log.append(request_id, index, ChunkKind::Stored, &body);
            for _ in 1..APPEND_TRIES {
                if stored.is_ok() {
                    break;
                }
                stored = log.append(request_id, index, ChunkKind::Stored, &body);
            }
            match stored {
                Ok(()) => next.set(index + 1),
                Err(e) => self.failed("stream", &e),
            }
            self.send(request_id, std::slice::from_ref(&body));
        };
        let spec = TurnSpec {
            request_id: request_id.to_owned(),
            // A continuation keeps what its log holds.
            fresh_stream: resume.is_none(),
            replay_after: -1,
            sender,
            system,
            max_steps,
            emit: &emit,
            flush: &|| {},
            cancel: CancelToken::new(),
            durable: Some(Durable { last_index: &|| next.get() - 1, resume, slot, recovering }),
        };
        self.run(spec, model, tools).await.1
    }

    /// Runs one turn over the transcript (after any turn already running), streaming through
    /// `spec.emit`, then persists the assistant message, sends the transcript to the other
    /// clients and the final frame to all. Returns the assistant message and the outcome.
    pub async fn run(&self, mut spec: TurnSpec<'_>, model: &dyn DynModel, tools: &dyn DynToolBox) -> (Value, ChatEnd) {
        self.state.borrow_mut().turn_waits(&spec.request_id, spec.sender.clone());
        let slot = spec.durable.as_mut().and_then(|d| d.slot.take());
        let _turn = match slot {
            Some(TurnSlot(slot)) => slot,
            None => self.turns.clone().lock_owned().await,
        };
        let resumed =
            spec.durable.as_ref().and_then(|d| d.resume.as_ref().map(|(turn, _)| (turn.continues, d.recovering)));
        let (continues, recovering) = resumed.unwrap_or((false, false));
        let begun = self.state.borrow_mut().turn_begins(
            self.sql(),
            &spec.request_id,
            spec.replay_after,
            spec.fresh_stream,
            continues,
        );
        match begun {
            Ok(Ok(offered)) => drop(self.carry_out(offered)),
            Ok(Err(end)) => {
                self.carry_out(end);
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
        if recovering {
            // Every client is told, and offered the stream from its start: what it showed of the
            // cut step goes, the continuation follows.
            *self.recovering.borrow_mut() = Some(spec.request_id.clone());
            self.broadcast_recovering(&spec.request_id, true);
            let connections: Vec<String> = self.io.sockets().iter().map(|s| s.id()).collect();
            let outputs = self.state.borrow_mut().offer_stream(&connections);
            self.carry_out(outputs);
        }
        let now = self.io.now();
        let new_id = || format!("assistant_{now}_{}", self.io.random_id().chars().take(8).collect::<String>());
        let (durable, resume) = match &mut spec.durable {
            Some(d) => (Some(d.last_index), d.resume.take()),
            None => (None, None),
        };
        if resume.is_none() && durable.is_some() {
            // A new message answers whatever still waited.
            self.supersede_waiting();
        }
        // A durable turn takes its place in the transcript now, in the journal.
        let turn = match (&resume, durable) {
            (Some((turn, _)), _) => Some(turn.clone()),
            (None, Some(_)) => match Journal::new(self.sql()).begin(&spec.request_id, &new_id(), now) {
                Ok(turn) => Some(turn),
                Err(e) => {
                    self.failed("turn", &e);
                    return self.end_unbegun(&spec, e.to_string());
                }
            },
            (None, None) => None,
        };
        let message_id = turn.as_ref().map_or_else(new_id, |t| t.message_id.clone());
        let options_message_id = message_id.clone();
        // The history: the conversation before the turn (not its own message, were it saved).
        let before: Vec<Value> =
            self.messages().into_iter().filter(|m| m.get("id").and_then(Value::as_str) != Some(&message_id)).collect();
        let history = to_model_messages(spec.system.as_deref(), &before);
        if let Err(e) = OpenStreams::new(self.sql()).open(&spec.request_id, &spec.request_id, &message_id, now) {
            self.failed("stream", &e);
        }
        let kept = resume.as_ref().map_or(-1, |(turn, _)| turn.log_keep);
        let builder = self.kept_message(&spec.request_id, &message_id, kept, continues);
        let builder = RefCell::new(builder);
        let emit = |chunk: Value| {
            builder.borrow_mut().apply(&chunk);
            (spec.emit)(chunk.to_string());
        };
        let keeper = durable.map(|last_index| Keeper {
            chat: self,
            request_id: &spec.request_id,
            message_id: &options_message_id,
            last_index,
        });
        let record: &dyn Record = match &keeper {
            Some(keeper) => keeper,
            None => &NoRecord,
        };
        let options = TurnOptions {
            message_id: options_message_id.clone(),
            max_steps: spec.max_steps,
            emit_start: kept < 0,
            resume: resume.map(|(_, plan)| plan),
        };
        let end = {
            let turn = run_turn(model, tools, history, &options, &emit, record);
            let stop = spec.cancel.cancelled();
            futures::pin_mut!(turn, stop);
            match select(turn, stop).await {
                Either::Left((TurnOutcome::Completed { .. } | TurnOutcome::Paused { .. }, _)) => ChatEnd::Completed,
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
        let mut message = builder.borrow().message();
        if let (Some(_), ChatEnd::Error(reason)) = (&turn, &end) {
            // A reload shows why the turn ended (the stream's error is not a part).
            message["metadata"]["error"] = Value::String(reason.clone());
        }
        if turn.is_some() {
            // Each waiting call shows its question, or the answer that came while the turn ran.
            match Interactions::new(self.sql()).of_message(&options_message_id) {
                Ok(waiting) => {
                    for w in &waiting {
                        interaction::show(&mut message, w);
                    }
                }
                Err(e) => self.failed("waiting calls", &e),
            }
        }
        let released = self.save(&spec.request_id, turn.as_ref(), &message);
        if turn.is_some() {
            // Answered already: the turn goes on (the host runs it).
            self.begin_continuation(&options_message_id);
        }
        if turn.as_ref().is_some_and(|t| t.attempts > 1) {
            self.broadcast_recovering(&spec.request_id, false);
        }
        let reserved = |id: &str| self.is_reserved(id);
        // Messages that waited for the turn join every client's transcript, the sender's too.
        let sender = if released > 0 { None } else { spec.sender.as_deref() };
        let ended =
            self.state.borrow_mut().turn_ends(self.sql(), &spec.request_id, &end, sender, spec.fresh_stream, &reserved);
        match ended {
            Ok(outputs) => drop(self.carry_out(outputs)),
            Err(e) => self.failed("turn's end", &e),
        }
        (message, end)
    }
}
