//! The chat protocol of `@cloudflare/ai-chat` as a state machine: typed client messages in,
//! typed frames out, over the chat's SQL store and an explicit `now`. The platform parses a
//! socket's text into a [`ChatMessage`], hands it to [`ChatState::receive`], and carries out the
//! [`ChatOutput`]s (send a frame to a connection, to every connection but some, run or cancel a
//! turn); a turn's life (waiting, beginning, streaming, ending) goes through the state too. No
//! sockets here, no clock: the Worker and a test drive the same code.
//!
//! What it keeps: one turn streams at a time; a connection that asked to resume the stream gets
//! no live chunk until it has its replay (replay and re-admission are one step); at most
//! [`MAX_QUEUED_TURNS`] turns wait per connection and [`MAX_WAITING_TURNS`] per agent; a client
//! cannot use a request id the agent reserves (a child's run ids); a finished turn's chunks
//! stay resumable until the next turn ends.

use std::collections::{BTreeSet, HashMap, HashSet};

use serde_json::{json, Map, Value};

use super::interaction::{Answer, Kind};
use super::store::{validate_message, ClientTools, Messages, StreamLog};
use crate::llm::ToolSpec;
use crate::store::{Sql, StoreError};

/// The most chat turns one connection may have waiting behind the running turn; more are
/// refused with an error response (nothing is stored) and the socket stays open.
pub const MAX_QUEUED_TURNS: usize = 4;

/// The most chat turns an agent holds waiting, from all its connections together (it runs
/// one at a time); more are refused the same way.
pub const MAX_WAITING_TURNS: usize = 32;

const RESPONSE: &str = "cf_agent_use_chat_response";

/// A chat frame a client sent, typed.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatMessage {
    /// `cf_agent_use_chat_request`: run a turn on these messages.
    Request {
        /// The request id (the response frames' id).
        id: String,
        /// `init.body`, or why the frame cannot be used (answered on `id`).
        body: Result<RequestBody, String>,
    },
    /// `cf_agent_chat_request_cancel`.
    Cancel {
        /// The request to cancel.
        id: String,
    },
    /// `cf_agent_chat_clear`.
    Clear,
    /// `cf_agent_chat_messages`: the client's transcript.
    Messages(Vec<Value>),
    /// `cf_agent_stream_resume_request`.
    ResumeRequest {
        /// Echoed back.
        probe_id: Value,
    },
    /// `cf_agent_stream_resume_ack`.
    ResumeAck {
        /// The stream the client resumes.
        id: String,
    },
    /// `cf_agent_tool_approval` (approval answers) or `cf_agent_tool_result` (a client-side
    /// tool's output): a person's answer to a call that waits.
    Answer {
        /// The call.
        call_id: String,
        /// What kind of answer the frame is.
        kind: Kind,
        /// The answer.
        answer: Answer,
        /// Whether the turn should go on once every waiting call is answered (`autoContinue`).
        auto_continue: bool,
    },
}

impl ChatMessage {
    /// Reads a client frame of type `kind`: `Ok(None)` for a frame that is not the chat's,
    /// `Err` with what is wrong with a malformed chat frame.
    pub fn parse(kind: &str, frame: &Map<String, Value>) -> Result<Option<Self>, String> {
        let id = |k: &str| frame.get(k).and_then(Value::as_str).map(str::to_owned);
        Ok(Some(match kind {
            "cf_agent_use_chat_request" => {
                let Some(request_id) = id("id").filter(|id| !id.is_empty() && id.len() <= 256) else {
                    return Err("cf_agent_use_chat_request needs a string \"id\" of 1 to 256 bytes".into());
                };
                Self::Request { id: request_id, body: request_body(frame) }
            }
            "cf_agent_chat_request_cancel" => match id("id") {
                Some(id) => Self::Cancel { id },
                None => return Err("cf_agent_chat_request_cancel needs a string \"id\"".into()),
            },
            "cf_agent_chat_clear" => Self::Clear,
            "cf_agent_chat_messages" => match frame.get("messages").and_then(Value::as_array) {
                Some(messages) => Self::Messages(messages.clone()),
                None => return Err("cf_agent_chat_messages needs a \"messages\" array".into()),
            },
            "cf_agent_stream_resume_request" => {
                Self::ResumeRequest { probe_id: frame.get("probeId").cloned().unwrap_or(Value::Null) }
            }
            "cf_agent_stream_resume_ack" => match id("id") {
                Some(id) => Self::ResumeAck { id },
                None => return Err("cf_agent_stream_resume_ack needs a string \"id\"".into()),
            },
            "cf_agent_tool_approval" | "cf_agent_tool_result" => return answer(kind, frame).map(Some),
            _ => return Ok(None),
        }))
    }
}

/// Reads an answer frame: `cf_agent_tool_approval {toolCallId, approved, autoContinue?,
/// reason?}` or `cf_agent_tool_result {toolCallId, output, state?, errorText?, autoContinue?}`.
fn answer(kind: &str, frame: &Map<String, Value>) -> Result<ChatMessage, String> {
    let Some(call_id) = frame.get("toolCallId").and_then(Value::as_str).filter(|id| !id.is_empty() && id.len() <= 256)
    else {
        return Err(format!("{kind} needs a string \"toolCallId\" of 1 to 256 bytes"));
    };
    let auto_continue = match frame.get("autoContinue") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(format!("{kind}'s \"autoContinue\" must be a boolean")),
    };
    let text = |key: &str| frame.get(key).and_then(Value::as_str).map(str::to_owned);
    let (kind, answer) = if kind == "cf_agent_tool_approval" {
        let answer = match frame.get("approved") {
            Some(Value::Bool(true)) => Answer::Approved,
            Some(Value::Bool(false)) => Answer::Denied(text("reason").unwrap_or_default()),
            _ => return Err("cf_agent_tool_approval needs a boolean \"approved\"".into()),
        };
        (Kind::Approval, answer)
    } else if frame.get("state").and_then(Value::as_str) == Some("output-error") {
        (Kind::Client, Answer::Failed(text("errorText").unwrap_or_else(|| "the client-side tool failed".into())))
    } else {
        (Kind::Client, Answer::Output(frame.get("output").cloned().unwrap_or(Value::Null)))
    };
    Ok(ChatMessage::Answer { call_id: call_id.to_owned(), kind, answer, auto_continue })
}

/// What a chat request carries in its `init.body`.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestBody {
    /// The client's transcript, its new message last.
    pub messages: Vec<Value>,
    /// The client-side tools it declares (`clientTools`), if it declares any.
    pub client_tools: Option<Vec<ToolSpec>>,
}

/// The most client-side tools one request may declare.
pub const MAX_CLIENT_TOOLS: usize = 64;

/// The body of a chat request's `init` (`{"method":"POST","body":"{\"messages\":[…]}"}`).
fn request_body(frame: &Map<String, Value>) -> Result<RequestBody, String> {
    let init = frame.get("init").and_then(Value::as_object);
    if init.and_then(|i| i.get("method")).and_then(Value::as_str) != Some("POST") {
        return Err("cf_agent_use_chat_request needs init.method \"POST\"".into());
    }
    let Some(body) = init.and_then(|i| i.get("body")).and_then(Value::as_str) else {
        return Err("cf_agent_use_chat_request needs init.body, a JSON string".into());
    };
    let body: Value = serde_json::from_str(body).map_err(|e| format!("init.body is not JSON: {e}"))?;
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return Err("init.body needs a \"messages\" array".into());
    };
    let client_tools = match body.get("clientTools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(tools)) if tools.is_empty() => None,
        Some(Value::Array(tools)) if tools.len() > MAX_CLIENT_TOOLS => {
            return Err(format!("init.body.clientTools may declare at most {MAX_CLIENT_TOOLS} tools"))
        }
        Some(Value::Array(tools)) => Some(tools.iter().enumerate().map(client_tool).collect::<Result<_, _>>()?),
        Some(_) => return Err("init.body.clientTools must be an array".into()),
    };
    Ok(RequestBody { messages: messages.clone(), client_tools })
}

/// One declared client-side tool (`{name, description?, parameters?}`), checked as a server
/// tool's declaration is.
fn client_tool((n, tool): (usize, &Value)) -> Result<ToolSpec, String> {
    let at = format!("init.body.clientTools[{n}]");
    let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
    if name.is_empty() || name.len() > 64 || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        return Err(format!("{at}.name must be 1 to 64 characters of [a-zA-Z0-9_-]"));
    }
    let description = tool.get("description").and_then(Value::as_str).unwrap_or_default();
    let schema = tool.get("parameters").cloned().unwrap_or_else(|| json!({ "type": "object" }));
    crate::schema::check_schema(&schema).map_err(|e| format!("{at}.parameters is not a usable JSON Schema: {e}"))?;
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err(format!("{at}.parameters must describe an object (\"type\": \"object\")"));
    }
    Ok(ToolSpec::new(name, description, schema))
}

/// A frame the chat sends a client, typed.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatFrame {
    /// A chunk of a response stream (`done: false`), or its end.
    Response {
        /// The request id.
        id: String,
        /// A `UIMessageChunk`'s JSON, an error message, or empty.
        body: String,
        /// The stream ended.
        done: bool,
        /// `body` is an error.
        error: bool,
        /// How the turn ended (`aborted`, `error`), on the end frame.
        outcome: Option<&'static str>,
        /// A chunk of a resume's replay, with its log index.
        replay: Option<Option<i64>>,
        /// The end of a resume's replay of a stream that goes on.
        replay_complete: bool,
        /// The stream goes on with the last assistant message (a turn that paused for a person):
        /// the stock client appends to that message instead of starting one.
        continuation: bool,
    },
    /// `cf_agent_chat_messages`: the transcript.
    Transcript(Vec<Value>),
    /// `cf_agent_chat_clear`.
    Cleared,
    /// `cf_agent_stream_resuming`: a stream is active; acknowledge to get its replay.
    Resuming {
        /// Its request id.
        id: String,
        /// The probe the client sent, if it sent one.
        probe_id: Option<Value>,
    },
    /// `cf_agent_stream_resume_none`: nothing to resume.
    ResumeNone {
        /// The probe the client sent.
        probe_id: Value,
    },
    /// `cf_agent_stream_pending`: a turn is about to stream (a continuation after an answer);
    /// `cf_agent_stream_resuming` follows when it begins.
    Pending {
        /// The probe the client sent.
        probe_id: Value,
    },
    /// `cf_agent_error`: a frame that could not be used (the socket stays open).
    Error(String),
    /// `cf_agent_message_updated`: a saved message changed (a call's part shows its answer).
    MessageUpdated(Value),
    /// `cf_agent_chat_recovering`: a turn a restart cut short is being continued (`true`), or
    /// no longer (`false`).
    Recovering {
        /// The turn's request id.
        id: String,
        /// Whether it is.
        recovering: bool,
    },
}

impl ChatFrame {
    /// A request that failed before it began: its error and its end in one frame.
    pub fn failed(id: &str, problem: String) -> Self {
        Self::Response {
            id: id.to_owned(),
            body: problem,
            done: true,
            error: true,
            outcome: None,
            replay: None,
            replay_complete: false,
            continuation: false,
        }
    }

    /// The frame as the client reads it.
    pub fn to_json(&self) -> String {
        match self {
            Self::Response { id, body, done, error, outcome, replay, replay_complete, continuation } => {
                if !error && outcome.is_none() && replay.is_none() && !done && !continuation {
                    // The hot path: one frame a streamed chunk, written directly.
                    return format!(
                        r#"{{"type":"{RESPONSE}","id":{},"body":{},"done":false}}"#,
                        Value::from(id.as_str()),
                        Value::from(body.as_str())
                    );
                }
                let mut frame = json!({ "type": RESPONSE, "id": id, "body": body, "done": done });
                if *error {
                    frame["error"] = Value::Bool(true);
                }
                if let Some(outcome) = outcome {
                    frame["outcome"] = Value::from(*outcome);
                }
                if let Some(seq) = replay {
                    frame["replay"] = Value::Bool(true);
                    if let Some(seq) = seq {
                        frame["seq"] = Value::from(*seq);
                    }
                }
                if *replay_complete {
                    frame["replayComplete"] = Value::Bool(true);
                }
                if *continuation {
                    frame["continuation"] = Value::Bool(true);
                }
                frame.to_string()
            }
            Self::Transcript(messages) => json!({ "type": "cf_agent_chat_messages", "messages": messages }).to_string(),
            Self::Cleared => json!({ "type": "cf_agent_chat_clear" }).to_string(),
            Self::Resuming { id, probe_id: Some(probe) } => {
                json!({ "type": "cf_agent_stream_resuming", "id": id, "probeId": probe }).to_string()
            }
            Self::Resuming { id, probe_id: None } => {
                json!({ "type": "cf_agent_stream_resuming", "id": id }).to_string()
            }
            Self::ResumeNone { probe_id } => {
                json!({ "type": "cf_agent_stream_resume_none", "reason": "idle", "probeId": probe_id }).to_string()
            }
            Self::Pending { probe_id } => json!({ "type": "cf_agent_stream_pending", "probeId": probe_id }).to_string(),
            Self::Error(problem) => json!({ "type": "cf_agent_error", "error": problem }).to_string(),
            Self::MessageUpdated(message) => {
                json!({ "type": "cf_agent_message_updated", "message": message }).to_string()
            }
            Self::Recovering { id, recovering } => {
                json!({ "type": "cf_agent_chat_recovering", "recovering": recovering, "id": id }).to_string()
            }
        }
    }
}

/// What the platform must do for the chat.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatOutput {
    /// Send a frame to one connection.
    Send {
        /// The connection.
        to: String,
        /// The frame.
        frame: ChatFrame,
    },
    /// Send a frame to every chat connection but these (the sender, and those resuming).
    Broadcast {
        /// The frame.
        frame: ChatFrame,
        /// The connections that do not get it.
        skip: BTreeSet<String>,
    },
    /// Run a turn for this request (after the one running, if any).
    RunTurn {
        /// The request id.
        request_id: String,
        /// The connection that asked.
        sender: String,
    },
    /// Cancel this request's turn: the running one (its model stops) or one still waiting.
    CancelTurn {
        /// The request id.
        request_id: String,
    },
    /// A person answered a call that waits (the host records it: see
    /// [`crate::chat::interaction`]).
    Answer {
        /// The connection that answered (a refusal goes back to it).
        connection: String,
        /// The call.
        call_id: String,
        /// What kind of answer.
        kind: Kind,
        /// The answer.
        answer: Answer,
        /// `autoContinue`.
        auto_continue: bool,
    },
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

/// The stream a turn is writing.
#[derive(Debug, Clone, PartialEq)]
pub struct ActiveStream {
    /// The chat request id: the id of every response frame and of the stream log (an
    /// agent-tool run's turn uses its run id).
    pub request_id: String,
    /// A resuming client is replayed the log after this index.
    pub replay_after: i64,
    /// The stream goes on with a saved message (its frames say `continuation: true`).
    pub continuation: bool,
}

/// The chat's in-memory state (its transcript and stream logs are in SQL).
#[derive(Debug, Default)]
pub struct ChatState {
    active: Option<ActiveStream>,
    /// Connections that asked to resume and wait for their replay.
    resuming: HashSet<String>,
    /// The stream of the turn that ended last, and where its replay starts.
    last_stream: Option<(String, i64, bool)>,
    /// Requests waiting for the turn before them, with the connection that sent each.
    waiting: HashMap<String, Option<String>>,
    /// Those of `waiting` cancelled meanwhile.
    cancelled: HashSet<String>,
    /// Connections that asked to resume while a turn waited to begin, with their probes: told
    /// when it begins.
    parked: HashMap<String, Value>,
}

impl ChatState {
    /// The stream being written, if any.
    #[cfg(test)]
    pub fn active(&self) -> Option<&ActiveStream> {
        self.active.as_ref()
    }

    /// Whether the stream of `request_id` is being written.
    pub fn is_streaming(&self, request_id: &str) -> bool {
        self.active.as_ref().is_some_and(|a| a.request_id == request_id)
    }

    /// The connections a live frame skips: those resuming, and `also`.
    fn skip(&self, also: Option<&str>) -> BTreeSet<String> {
        self.resuming.iter().cloned().chain(also.map(str::to_owned)).collect()
    }

    /// A frame to every connection but those resuming and `except`.
    pub fn broadcast(&self, frame: ChatFrame, except: Option<&str>) -> ChatOutput {
        ChatOutput::Broadcast { frame, skip: self.skip(except) }
    }

    /// The transcript to every connection but those resuming and `except`.
    pub fn transcript(&self, sql: &(impl Sql + ?Sized), except: Option<&str>) -> Result<ChatOutput, StoreError> {
        Ok(self.broadcast(ChatFrame::Transcript(Messages::new(sql).list()?), except))
    }

    /// A connection opened: while a stream is active it is told so, and gets no live chunk
    /// until it acknowledges (then its replay, then live).
    pub fn on_connect(&mut self, connection: &str) -> Vec<ChatOutput> {
        let Some(active) = &self.active else { return Vec::new() };
        let frame = ChatFrame::Resuming { id: active.request_id.clone(), probe_id: None };
        self.resuming.insert(connection.to_owned());
        vec![ChatOutput::Send { to: connection.to_owned(), frame }]
    }

    /// Offers the active stream again to `connections` (a continuation's: what they showed of
    /// it changed), as to a connection that just opened: each acknowledges to get its replay.
    pub fn offer_stream(&mut self, connections: &[String]) -> Vec<ChatOutput> {
        let fresh: Vec<&String> = connections.iter().filter(|c| !self.resuming.contains(*c)).collect();
        fresh.into_iter().flat_map(|c| self.on_connect(c)).collect()
    }

    /// Whether the turn of `request_id` waits for the one before it.
    pub fn is_waiting(&self, request_id: &str) -> bool {
        self.waiting.contains_key(request_id)
    }

    /// A connection closed.
    pub fn on_close(&mut self, connection: &str) {
        self.resuming.remove(connection);
        self.parked.remove(connection);
    }

    /// The connections that wait for a stream to begin are offered it (they acknowledge to get
    /// its replay); with no turn left to begin, they are told nothing streams.
    fn unpark(&mut self) -> Vec<ChatOutput> {
        if self.active.is_none() && !self.waiting.is_empty() {
            return Vec::new();
        }
        let parked: Vec<(String, Value)> = self.parked.drain().collect();
        parked
            .into_iter()
            .map(|(connection, probe_id)| {
                let frame = match &self.active {
                    Some(active) => {
                        self.resuming.insert(connection.clone());
                        ChatFrame::Resuming { id: active.request_id.clone(), probe_id: Some(probe_id) }
                    }
                    None => ChatFrame::ResumeNone { probe_id },
                };
                ChatOutput::Send { to: connection, frame }
            })
            .collect()
    }

    /// A chat message from `connection`. `reserved` says whether a request id names a stream
    /// the agent writes itself (a child's run).
    pub fn receive(
        &mut self,
        sql: &(impl Sql + ?Sized),
        connection: &str,
        message: ChatMessage,
        reserved: &dyn Fn(&str) -> bool,
        now: i64,
    ) -> Result<Vec<ChatOutput>, StoreError> {
        let send = |frame| vec![ChatOutput::Send { to: connection.to_owned(), frame }];
        Ok(match message {
            ChatMessage::Request { id, body } => self.request(sql, connection, id, body, reserved, now)?,
            ChatMessage::Cancel { id } => vec![ChatOutput::CancelTurn { request_id: id }],
            ChatMessage::Clear => {
                Messages::new(sql).clear()?;
                vec![self.broadcast(ChatFrame::Cleared, Some(connection))]
            }
            ChatMessage::Messages(messages) => match self.persist(sql, connection, &messages, now)? {
                Ok(transcript) => vec![transcript],
                Err(problem) => send(ChatFrame::Error(problem)),
            },
            ChatMessage::ResumeRequest { probe_id } => match &self.active {
                Some(active) => {
                    let frame = ChatFrame::Resuming { id: active.request_id.clone(), probe_id: Some(probe_id) };
                    self.resuming.insert(connection.to_owned());
                    send(frame)
                }
                // A turn is about to stream (a continuation a client's answer started): the
                // client waits, and is offered the stream when it begins.
                None if !self.waiting.is_empty() => {
                    self.parked.insert(connection.to_owned(), probe_id.clone());
                    send(ChatFrame::Pending { probe_id })
                }
                None => send(ChatFrame::ResumeNone { probe_id }),
            },
            ChatMessage::ResumeAck { id } => self.resume(sql, connection, &id)?,
            ChatMessage::Answer { call_id, kind, answer, auto_continue } => {
                vec![ChatOutput::Answer { connection: connection.to_owned(), call_id, kind, answer, auto_continue }]
            }
        })
    }

    /// Keeps a transcript a client sent, and sends it to the other clients: `Err` (inner) with
    /// what is wrong with a message.
    fn persist(
        &self,
        sql: &(impl Sql + ?Sized),
        connection: &str,
        messages: &[Value],
        now: i64,
    ) -> Result<Result<ChatOutput, String>, StoreError> {
        if let Err(problem) = messages.iter().try_for_each(validate_message) {
            return Ok(Err(problem));
        }
        Messages::new(sql).persist_client(messages, now)?;
        Ok(Ok(self.transcript(sql, Some(connection))?))
    }

    fn request(
        &mut self,
        sql: &(impl Sql + ?Sized),
        connection: &str,
        request_id: String,
        body: Result<RequestBody, String>,
        reserved: &dyn Fn(&str) -> bool,
        now: i64,
    ) -> Result<Vec<ChatOutput>, StoreError> {
        let fail = |problem: String| {
            vec![ChatOutput::Send { to: connection.to_owned(), frame: ChatFrame::failed(&request_id, problem) }]
        };
        if reserved(&request_id) {
            return Ok(fail(format!("request id {request_id:?} names an agent-tool run of this agent")));
        }
        let queued = self.waiting.values().filter(|c| c.as_deref() == Some(connection)).count();
        if queued >= MAX_QUEUED_TURNS {
            return Ok(fail(format!(
                "this connection already has {queued} chat turns waiting (at most {MAX_QUEUED_TURNS}); send again once one has run"
            )));
        }
        let waiting = self.waiting.len();
        if waiting >= MAX_WAITING_TURNS {
            return Ok(fail(format!(
                "this agent already has {waiting} chat turns waiting (at most {MAX_WAITING_TURNS}); send again once one has run"
            )));
        }
        let body = match body {
            Ok(body) => body,
            Err(problem) => return Ok(fail(problem)),
        };
        let transcript = match self.persist(sql, connection, &body.messages, now)? {
            Ok(transcript) => transcript,
            Err(problem) => return Ok(fail(problem)),
        };
        if let Some(tools) = &body.client_tools {
            ClientTools::new(sql).set(tools)?;
        }
        Ok(vec![transcript, ChatOutput::RunTurn { request_id, sender: connection.to_owned() }])
    }

    /// A resuming connection acknowledged `request_id`'s stream: its replay (the active
    /// stream's, or the one that just ended) and its re-admission to live chunks, in one step.
    fn resume(
        &mut self,
        sql: &(impl Sql + ?Sized),
        connection: &str,
        request_id: &str,
    ) -> Result<Vec<ChatOutput>, StoreError> {
        let active = self.active.as_ref().filter(|a| a.request_id == request_id);
        let stream = match active {
            Some(a) => Some((a.request_id.clone(), a.replay_after, a.continuation)),
            None => self.last_stream.clone().filter(|(s, _, _)| s == request_id),
        };
        let continuation = stream.as_ref().is_some_and(|(_, _, c)| *c);
        let chunks = match stream {
            Some((stream, after, _)) => StreamLog::new(sql).after(&stream, after)?,
            None => Vec::new(),
        };
        let mut outputs: Vec<ChatOutput> = chunks
            .into_iter()
            .map(|c| ChatOutput::Send {
                to: connection.to_owned(),
                frame: ChatFrame::Response {
                    id: request_id.to_owned(),
                    body: c.body,
                    done: false,
                    error: false,
                    outcome: None,
                    replay: Some(Some(c.index)),
                    replay_complete: false,
                    continuation,
                },
            })
            .collect();
        let live = active.is_some();
        outputs.push(ChatOutput::Send {
            to: connection.to_owned(),
            frame: ChatFrame::Response {
                id: request_id.to_owned(),
                body: String::new(),
                done: !live,
                error: false,
                outcome: None,
                replay: Some(None),
                replay_complete: live,
                continuation,
            },
        });
        self.resuming.remove(connection);
        Ok(outputs)
    }

    /// Cancels a turn: `true` when it is the running one (its model must stop); one still
    /// waiting is dropped when its time comes; a cancel for any other id is ignored.
    pub fn cancel(&mut self, request_id: &str) -> bool {
        if self.is_streaming(request_id) {
            return true;
        }
        if self.waiting.contains_key(request_id) {
            self.cancelled.insert(request_id.to_owned());
        }
        false
    }

    /// A turn waits for the one before it.
    pub fn turn_waits(&mut self, request_id: &str, sender: Option<String>) {
        self.waiting.insert(request_id.to_owned(), sender);
    }

    /// A turn that was waiting will not begin (it failed before it could): it waits no more.
    /// Returns what connections waiting for a stream are told.
    pub fn turn_dropped(&mut self, request_id: &str) -> Vec<ChatOutput> {
        self.waiting.remove(request_id);
        self.cancelled.remove(request_id);
        self.unpark()
    }

    /// A turn's time came: `Err` with the frame that ends it at once when it was cancelled while
    /// it waited; else it is the active stream (a fresh stream drops what an earlier turn of the
    /// same request id stored), and the connections that waited for a stream are offered it.
    pub fn turn_begins(
        &mut self,
        sql: &(impl Sql + ?Sized),
        request_id: &str,
        replay_after: i64,
        fresh_stream: bool,
        continuation: bool,
    ) -> Result<Result<Vec<ChatOutput>, Vec<ChatOutput>>, StoreError> {
        self.waiting.remove(request_id);
        if self.cancelled.remove(request_id) {
            let end = ChatFrame::Response {
                id: request_id.to_owned(),
                body: String::new(),
                done: true,
                error: false,
                outcome: Some("aborted"),
                replay: None,
                replay_complete: false,
                continuation: false,
            };
            let mut ended = vec![self.broadcast(end, None)];
            ended.extend(self.unpark());
            return Ok(Err(ended));
        }
        if fresh_stream {
            StreamLog::new(sql).delete(request_id)?;
        }
        self.active = Some(ActiveStream { request_id: request_id.to_owned(), replay_after, continuation });
        Ok(Ok(self.unpark()))
    }

    /// A turn's chunks, to the clients (not those resuming: they get them in their replay).
    pub fn turn_chunks(&self, request_id: &str, bodies: &[String]) -> Vec<ChatOutput> {
        let continuation = self.active.as_ref().is_some_and(|a| a.request_id == request_id && a.continuation);
        let frame = |body: &String| ChatFrame::Response {
            id: request_id.to_owned(),
            body: body.clone(),
            done: false,
            error: false,
            outcome: None,
            replay: None,
            replay_complete: false,
            continuation,
        };
        bodies.iter().map(|body| self.broadcast(frame(body), None)).collect()
    }

    /// A turn ended with its message saved: the resuming connections are released, the
    /// transcript goes to every client but the sender, then the turn's error (if any) and its
    /// end. A fresh stream's finished predecessors are pruned (only the last turn can still be
    /// resumed; a reserved stream, a child's run, is its parent's to read).
    pub fn turn_ends(
        &mut self,
        sql: &(impl Sql + ?Sized),
        request_id: &str,
        end: &ChatEnd,
        sender: Option<&str>,
        fresh_stream: bool,
        reserved: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<ChatOutput>, StoreError> {
        let (replay_after, continuation) = self
            .active
            .take()
            .filter(|a| a.request_id == request_id)
            .map_or((-1, false), |a| (a.replay_after, a.continuation));
        self.last_stream = Some((request_id.to_owned(), replay_after, continuation));
        if fresh_stream {
            StreamLog::new(sql).prune(request_id, reserved)?;
        }
        self.resuming.clear();
        let mut outputs = vec![self.transcript(sql, sender)?];
        let end_frame = |outcome| ChatFrame::Response {
            id: request_id.to_owned(),
            body: String::new(),
            done: true,
            error: false,
            outcome,
            replay: None,
            replay_complete: false,
            continuation,
        };
        match end {
            ChatEnd::Completed => outputs.push(self.broadcast(end_frame(None), None)),
            ChatEnd::Error(e) => {
                let error = ChatFrame::Response {
                    id: request_id.to_owned(),
                    body: e.clone(),
                    done: false,
                    error: true,
                    outcome: None,
                    replay: None,
                    replay_complete: false,
                    continuation,
                };
                outputs.push(self.broadcast(error, None));
                outputs.push(self.broadcast(end_frame(Some("error")), None));
            }
            ChatEnd::Aborted(_) => outputs.push(self.broadcast(end_frame(Some("aborted")), None)),
        }
        Ok(outputs)
    }

    /// Forgets everything in memory (the agent's storage was cleared).
    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::protocol::tail::ChunkKind;
    use crate::store::sqlite;

    fn db() -> rusqlite::Connection {
        let db = sqlite::memory();
        db.batch(super::super::store::SCHEMA).unwrap();
        db
    }

    fn request(id: &str, text: &str) -> ChatMessage {
        let message = json!({ "id": format!("u-{id}"), "role": "user", "parts": [{ "type": "text", "text": text }] });
        ChatMessage::Request { id: id.into(), body: Ok(RequestBody { messages: vec![message], client_tools: None }) }
    }

    fn sent_to(outputs: &[ChatOutput], connection: &str) -> Vec<Value> {
        outputs
            .iter()
            .filter_map(|o| match o {
                ChatOutput::Send { to, frame } if to == connection => serde_json::from_str(&frame.to_json()).ok(),
                ChatOutput::Broadcast { frame, skip } if !skip.contains(connection) => {
                    serde_json::from_str(&frame.to_json()).ok()
                }
                _ => None,
            })
            .collect()
    }

    const NONE_RESERVED: &dyn Fn(&str) -> bool = &|_| false;

    #[test]
    fn client_frames_parse_to_typed_messages_or_precise_errors() {
        let frame = |v: Value| v.as_object().unwrap().clone();
        let cases: [(&str, Value, Result<&str, &str>); 8] = [
            ("cf_agent_use_chat_request", json!({}), Err("needs a string \"id\"")),
            ("cf_agent_use_chat_request", json!({"id": "r", "init": {"method": "GET"}}), Ok("request")),
            ("cf_agent_chat_request_cancel", json!({"id": 3}), Err("needs a string \"id\"")),
            ("cf_agent_chat_request_cancel", json!({"id": "r"}), Ok("cancel")),
            ("cf_agent_chat_messages", json!({"messages": {}}), Err("needs a \"messages\" array")),
            ("cf_agent_stream_resume_ack", json!({}), Err("needs a string \"id\"")),
            ("cf_agent_tool_result", json!({}), Err("needs a string \"toolCallId\"")),
            ("cf_agent_state", json!({}), Ok("not chat")),
        ];
        for (kind, value, expected) in cases {
            let got = match ChatMessage::parse(kind, &frame(value)) {
                Ok(None) => Ok("not chat"),
                Ok(Some(ChatMessage::Request { body, .. })) => {
                    assert!(body.unwrap_err().contains("init.method"), "{kind}");
                    Ok("request")
                }
                Ok(Some(ChatMessage::Cancel { .. })) => Ok("cancel"),
                Ok(Some(other)) => panic!("{kind}: {other:?}"),
                Err(problem) => Err(problem),
            };
            match (got, expected) {
                (Ok(g), Ok(e)) => assert_eq!(g, e, "{kind}"),
                (Err(g), Err(e)) => assert!(g.contains(e), "{kind}: {g}"),
                (g, e) => panic!("{kind}: got {g:?}, expected {e:?}"),
            }
        }
    }

    #[test]
    fn answer_frames_parse_to_typed_answers_or_precise_errors() {
        let parse = |kind: &str, v: Value| ChatMessage::parse(kind, v.as_object().unwrap());
        let approval =
            parse("cf_agent_tool_approval", json!({"toolCallId": "c1", "approved": true, "autoContinue": true}));
        assert_eq!(
            approval,
            Ok(Some(ChatMessage::Answer {
                call_id: "c1".into(),
                kind: Kind::Approval,
                answer: Answer::Approved,
                auto_continue: true
            }))
        );
        let denied = parse("cf_agent_tool_approval", json!({"toolCallId": "c1", "approved": false, "reason": "no"}));
        assert!(
            matches!(denied, Ok(Some(ChatMessage::Answer { answer: Answer::Denied(r), auto_continue: false, .. })) if r == "no")
        );
        let failed = parse(
            "cf_agent_tool_result",
            json!({"toolCallId": "c2", "toolName": "t", "output": null, "state": "output-error", "errorText": "x"}),
        );
        assert!(
            matches!(failed, Ok(Some(ChatMessage::Answer { kind: Kind::Client, answer: Answer::Failed(e), .. })) if e == "x")
        );
        let output = parse("cf_agent_tool_result", json!({"toolCallId": "c2", "output": {"a": 1}}));
        assert!(
            matches!(output, Ok(Some(ChatMessage::Answer { answer: Answer::Output(o), .. })) if o == json!({"a": 1}))
        );
        for (kind, frame, problem) in [
            ("cf_agent_tool_approval", json!({"toolCallId": "c1"}), "needs a boolean \"approved\""),
            ("cf_agent_tool_approval", json!({"toolCallId": "", "approved": true}), "needs a string \"toolCallId\""),
            (
                "cf_agent_tool_result",
                json!({"toolCallId": "c", "autoContinue": "yes"}),
                "\"autoContinue\" must be a boolean",
            ),
        ] {
            let error = parse(kind, frame).unwrap_err();
            assert!(error.contains(problem), "{kind}: {error}");
        }
    }

    #[test]
    fn declared_client_tools_are_checked_as_server_tools_are() {
        let frame = |tools: Value| {
            let body = json!({"messages": [], "clientTools": tools}).to_string();
            json!({"id": "r", "init": {"method": "POST", "body": body}}).as_object().unwrap().clone()
        };
        let body = |tools: Value| match ChatMessage::parse("cf_agent_use_chat_request", &frame(tools)) {
            Ok(Some(ChatMessage::Request { body, .. })) => body,
            other => panic!("{other:?}"),
        };
        let ok =
            body(json!([{"name": "where", "description": "Location.", "parameters": {"type": "object"}}])).unwrap();
        assert_eq!(ok.client_tools.unwrap()[0].name, "where");
        assert_eq!(body(json!([])).unwrap().client_tools, None, "an empty list declares nothing");
        let too_many: Vec<Value> = (0..=MAX_CLIENT_TOOLS).map(|n| json!({"name": format!("t{n}")})).collect();
        assert!(body(json!(too_many)).unwrap_err().contains("at most 64 tools"));
        assert!(body(json!([{"name": "x", "parameters": {"type": "string"}}]))
            .unwrap_err()
            .contains("must describe an object"));
        assert!(body(json!({})).unwrap_err().contains("must be an array"));
    }

    #[test]
    fn a_request_is_stored_then_run_and_bad_ones_are_answered_on_their_id() {
        let db = db();
        let mut chat = ChatState::default();
        let outputs = chat.receive(&db, "c1", request("r1", "hi"), NONE_RESERVED, 1).unwrap();
        assert!(
            matches!(outputs.last(), Some(ChatOutput::RunTurn { request_id, sender }) if request_id == "r1" && sender == "c1")
        );
        assert_eq!(Messages::new(&db).list().unwrap().len(), 1);
        // The other clients get the transcript; the sender already has it.
        assert!(sent_to(&outputs, "c1").is_empty());
        assert_eq!(sent_to(&outputs, "c2")[0]["type"], "cf_agent_chat_messages");
        // A reserved id, a bad message: a failed response on that id, nothing stored.
        let reserved: &dyn Fn(&str) -> bool = &|id| id == "run-1";
        let outputs = chat.receive(&db, "c1", request("run-1", "x"), reserved, 2).unwrap();
        let frames = sent_to(&outputs, "c1");
        assert_eq!((frames[0]["id"].as_str(), frames[0]["error"].as_bool()), (Some("run-1"), Some(true)));
        let bad = ChatMessage::Request {
            id: "r2".into(),
            body: Ok(RequestBody { messages: vec![json!({"id": "m"})], client_tools: None }),
        };
        let frames = sent_to(&chat.receive(&db, "c1", bad, NONE_RESERVED, 3).unwrap(), "c1");
        assert!(frames[0]["body"].as_str().unwrap().contains("role"), "{frames:?}");
        assert_eq!(Messages::new(&db).list().unwrap().len(), 1);
    }

    #[test]
    fn waiting_turns_are_bounded_per_connection() {
        let db = db();
        let mut chat = ChatState::default();
        for n in 0..MAX_QUEUED_TURNS {
            chat.turn_waits(&format!("r{n}"), Some("c1".into()));
        }
        let outputs = chat.receive(&db, "c1", request("one-more", "x"), NONE_RESERVED, 1).unwrap();
        assert!(sent_to(&outputs, "c1")[0]["body"].as_str().unwrap().contains("at most 4"));
        let outputs = chat.receive(&db, "c2", request("theirs", "x"), NONE_RESERVED, 1).unwrap();
        assert!(matches!(outputs.last(), Some(ChatOutput::RunTurn { .. })), "another connection is not held up");
    }

    #[test]
    fn a_resuming_connection_gets_its_replay_then_live_chunks_each_once() {
        let db = db();
        let mut chat = ChatState::default();
        assert_eq!(chat.turn_begins(&db, "r1", -1, true, false).unwrap(), Ok(vec![]));
        let log = StreamLog::new(&db);
        log.append("r1", 0, ChunkKind::Stored, "{\"n\":0}").unwrap();
        // A client connects mid-stream: told to resume, and skipped by live chunks.
        assert_eq!(sent_to(&chat.on_connect("c2"), "c2")[0]["type"], "cf_agent_stream_resuming");
        log.append("r1", 1, ChunkKind::Stored, "{\"n\":1}").unwrap();
        let live = chat.turn_chunks("r1", &["{\"n\":1}".to_owned()]);
        assert_eq!(sent_to(&live, "c1").len(), 1);
        assert!(sent_to(&live, "c2").is_empty(), "the replay will have it");
        let replay = chat.receive(&db, "c2", ChatMessage::ResumeAck { id: "r1".into() }, NONE_RESERVED, 2).unwrap();
        let frames = sent_to(&replay, "c2");
        let seqs: Vec<i64> = frames.iter().filter_map(|f| f["seq"].as_i64()).collect();
        assert_eq!(seqs, [0, 1]);
        assert_eq!(frames.last().unwrap()["replayComplete"], true);
        let live = chat.turn_chunks("r1", &["{\"n\":2}".to_owned()]);
        assert_eq!(sent_to(&live, "c2").len(), 1, "live again");
        let end = chat.turn_ends(&db, "r1", &ChatEnd::Completed, Some("c1"), true, NONE_RESERVED).unwrap();
        assert_eq!(sent_to(&end, "c2").last().unwrap()["done"], true);
        // Right after the end, a resume replays the finished stream and says it is done.
        let late = chat.receive(&db, "c3", ChatMessage::ResumeAck { id: "r1".into() }, NONE_RESERVED, 3).unwrap();
        assert_eq!(sent_to(&late, "c3").last().unwrap()["done"], true);
    }

    #[test]
    fn a_probe_while_a_turn_waits_to_begin_is_answered_when_it_begins() {
        let db = db();
        let mut chat = ChatState::default();
        chat.turn_waits("k1", None);
        let probe = ChatMessage::ResumeRequest { probe_id: json!("p1") };
        let pending = chat.receive(&db, "c1", probe.clone(), NONE_RESERVED, 1).unwrap();
        assert_eq!(sent_to(&pending, "c1"), [json!({"type": "cf_agent_stream_pending", "probeId": "p1"})]);
        let Ok(Ok(offered)) = chat.turn_begins(&db, "k1", -1, true, true) else { panic!("began") };
        assert_eq!(sent_to(&offered, "c1"), [json!({"type": "cf_agent_stream_resuming", "id": "k1", "probeId": "p1"})]);
        // It resumes (gets no live chunk until its replay), like any connection offered a stream.
        assert!(sent_to(&chat.turn_chunks("k1", &["{}".to_owned()]), "c1").is_empty());
        // A turn that never begins releases its waiting connections.
        let _ = chat.turn_ends(&db, "k1", &ChatEnd::Completed, None, true, NONE_RESERVED).unwrap();
        chat.turn_waits("k3", None);
        chat.receive(&db, "c3", probe, NONE_RESERVED, 3).unwrap();
        let released = chat.turn_dropped("k3");
        assert_eq!(sent_to(&released, "c3")[0]["type"], "cf_agent_stream_resume_none");
    }

    #[test]
    fn a_turn_cancelled_while_it_waited_ends_at_once() {
        let db = db();
        let mut chat = ChatState::default();
        chat.turn_waits("r1", Some("c1".into()));
        assert!(!chat.cancel("r1"), "not the running turn");
        let Ok(Err(end)) = chat.turn_begins(&db, "r1", -1, true, false) else { panic!("ended at once") };
        assert_eq!(sent_to(&end, "c1")[0]["outcome"], "aborted");
        assert!(chat.active().is_none());
        assert!(!chat.cancel("nobody"), "an unknown id is ignored");
    }
}
