//! The language-model seam (public as `agent_tools::model`): models that drive a turn: the [`Model`] trait, the provider-neutral request and the events a
//! model streams, and the built-in providers' wire formats (their HTTP lives in `platform`).
//!
//! - `offline`: the built-in deterministic model (the default; no network, no keys).
//! - `openai`: OpenAI-compatible Chat Completions with streaming and tool calls (OpenAI,
//!   Workers AI's OpenAI-compatible endpoint, llama.cpp, vLLM, Ollama…).
//! - `sse`: the server-sent-events decoder both streaming providers use.

pub(crate) mod offline;
pub(crate) mod openai;
pub(crate) mod sse;
pub(crate) mod workers_ai;

pub use offline::OfflineModel;
pub use openai::OpenAiConfig;

/// A model that streams one step at a time: given the conversation and the tools, it streams
/// text and tool calls, then finishes. Implement it to plug in a provider of your own (a
/// different HTTP API, a wrapper that routes or records) or a scripted model for tests; return
/// it from [`crate::Agent::model`].
///
/// A turn is a loop of steps. Each step gets the whole conversation so far in
/// [`ModelRequest::messages`] (the system prompt, the user's message, then each earlier step's
/// [`ModelMessage::Assistant`] and one [`ModelMessage::Tool`] per call it made), so a step
/// knows where it is by reading it. A step that calls tools streams
/// [`ModelEvent::ToolCallReady`] for each call and ends with `Finish(FinishReason::ToolCalls)`: the turn
/// runs the calls (agent tools and ordinary tools alike, at once), appends their results, and
/// asks for the next step. A step that ends with any other reason (`FinishReason::Stop`) ends the turn; so
/// does [`crate::Agent::max_steps`].
///
/// A model that calls the agent's first tool, then answers with what it returned:
///
/// ```
/// use agent_tools::model::{FinishReason, Model, ModelError, ModelEvent, ModelMessage, ModelRequest, ToolCall};
/// use serde_json::json;
///
/// struct CallThenAnswer;
///
/// impl Model for CallThenAnswer {
///     async fn step(&self, request: &ModelRequest, on_event: &mut dyn FnMut(ModelEvent)) -> Result<(), ModelError> {
///         // Where the turn is: after a tool's result, answer; otherwise call the first tool.
///         match (request.messages.last(), request.tools.first()) {
///             (Some(ModelMessage::Tool { output, .. }), _) => {
///                 on_event(ModelEvent::TextDelta(format!("The tool said: {output}")));
///                 on_event(ModelEvent::Finish(FinishReason::Stop));
///             }
///             (_, Some(tool)) => {
///                 let call = ToolCall::new("call_1", tool.name.clone(), json!({ "query": "HTTP/3" }));
///                 on_event(ModelEvent::ToolCallReady(Ok(call)));
///                 on_event(ModelEvent::Finish(FinishReason::ToolCalls));
///             }
///             (_, None) => {
///                 on_event(ModelEvent::TextDelta("I have no tools.".into()));
///                 on_event(ModelEvent::Finish(FinishReason::Stop));
///             }
///         }
///         Ok(())
///     }
/// }
/// ```
///
/// [`ModelEvent::TextDelta`] streams text as it comes; `ToolCallStart`/`ToolCallDelta` are
/// optional (they stream a call's arguments to clients as they are typed). The test kit's
/// `ScriptedModel` (feature `testing`) is such a model, scripted step by step.
#[allow(async_fn_in_trait)] // Workers are single-threaded; no `Send` bound is wanted.
pub trait Model {
    /// Streams one step for `request`, handing each event to `on_event` as it arrives. A step
    /// that calls tools ends with `ModelEvent::Finish(FinishReason::ToolCalls)`; the turn runs them and
    /// asks for the next step.
    async fn step(&self, request: &ModelRequest, on_event: &mut dyn FnMut(ModelEvent)) -> Result<(), ModelError>;
}

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A tool call the model made.
///
/// ```
/// use agent_tools::model::ToolCall;
/// use serde_json::json;
///
/// let call = ToolCall::new("call_1", "research", json!({ "query": "QUIC" }));
/// assert_eq!((call.name.as_str(), &call.input["query"]), ("research", &json!("QUIC")));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ToolCall {
    /// Provider-assigned id (`call_…`), unique within the conversation.
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Parsed arguments.
    pub input: Value,
}

impl ToolCall {
    /// A call of tool `name` with `input`, under the provider's id.
    pub fn new(id: impl Into<String>, name: impl Into<String>, input: Value) -> Self {
        Self { id: id.into(), name: name.into(), input }
    }
}

/// One message of the conversation, in the shape every provider maps from.
///
/// ```
/// use agent_tools::model::{ModelMessage, ToolCall};
/// use serde_json::json;
///
/// // A step that called a tool, then the tool's result: what the next step is shown.
/// let conversation = vec![
///     ModelMessage::User("Research QUIC".into()),
///     ModelMessage::Assistant {
///         text: String::new(),
///         tool_calls: vec![ToolCall::new("call_1", "research", json!({ "query": "QUIC" }))],
///     },
///     ModelMessage::Tool { call_id: "call_1".into(), name: "research".into(), output: json!("QUIC runs over UDP.") },
/// ];
/// assert!(matches!(conversation.last(), Some(ModelMessage::Tool { call_id, .. }) if call_id == "call_1"));
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ModelMessage {
    /// Instructions.
    System(String),
    /// What the user said.
    User(String),
    /// What the model said in one step: text and the tool calls it made.
    Assistant {
        /// Text.
        text: String,
        /// Tool calls.
        tool_calls: Vec<ToolCall>,
    },
    /// A tool's result.
    Tool {
        /// The call it answers.
        call_id: String,
        /// The tool name.
        name: String,
        /// The result (a string is sent as is, anything else as JSON).
        output: Value,
    },
}

/// A tool as the model sees it.
///
/// ```
/// use agent_tools::model::ToolSpec;
/// use serde_json::json;
///
/// let spec = ToolSpec::new(
///     "word_count",
///     "Count the words of a text.",
///     json!({ "type": "object", "properties": { "text": { "type": "string" } }, "required": ["text"] }),
/// );
/// assert_eq!(spec.input_schema["required"][0], "text");
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ToolSpec {
    /// Name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of its input.
    pub input_schema: Value,
}

impl ToolSpec {
    /// A tool as the model sees it.
    pub fn new(name: impl Into<String>, description: impl Into<String>, input_schema: Value) -> Self {
        Self { name: name.into(), description: description.into(), input_schema }
    }
}

/// What a model is asked.
///
/// ```
/// use agent_tools::model::{ModelEvent, ModelMessage, ModelRequest, OfflineModel, ToolSpec};
/// use serde_json::json;
///
/// let schema = json!({ "type": "object", "properties": { "query": { "type": "string" } } });
/// let request = ModelRequest::new(
///     vec![ModelMessage::User("Research QUIC".into())],
///     vec![ToolSpec::new("research", "Research a topic.", schema)],
/// );
/// // The offline model calls the offered tool for a research request.
/// let events = OfflineModel::default().respond(&request);
/// assert!(events.iter().any(|e| matches!(e, ModelEvent::ToolCallStart { name, .. } if name == "research")));
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub struct ModelRequest {
    /// The conversation so far.
    pub messages: Vec<ModelMessage>,
    /// The tools it may call.
    pub tools: Vec<ToolSpec>,
}

/// What a model streams.
///
/// What a [`Model`] of your own sends for one step that answers in text (see [`Model`] for a
/// whole one):
///
/// ```
/// use agent_tools::model::{FinishReason, ModelEvent};
///
/// fn answer(on_event: &mut dyn FnMut(ModelEvent)) {
///     for word in ["QUIC ", "runs ", "over ", "UDP."] {
///         on_event(ModelEvent::TextDelta(word.into()));
///     }
///     on_event(ModelEvent::Finish(FinishReason::Stop));
/// }
///
/// let mut text = String::new();
/// answer(&mut |event| if let ModelEvent::TextDelta(delta) = event { text.push_str(&delta) });
/// assert_eq!(text, "QUIC runs over UDP.");
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ModelEvent {
    /// A piece of text.
    TextDelta(String),
    /// A tool call began.
    ToolCallStart {
        /// Call id.
        id: String,
        /// Tool name.
        name: String,
    },
    /// A piece of a tool call's JSON arguments.
    ToolCallDelta {
        /// Call id.
        id: String,
        /// Argument text.
        delta: String,
    },
    /// A tool call is complete. Arguments that are not valid JSON arrive as `Err` with the raw
    /// text, so the call fails on its own without ending the turn.
    ToolCallReady(Result<ToolCall, InvalidToolCall>),
    /// The step ended, and why.
    Finish(FinishReason),
}

/// Why a model's step ended (the AI SDK's `finishReason`, as the `finish` chunk spells it).
///
/// ```
/// use agent_tools::model::FinishReason;
///
/// assert_eq!(FinishReason::ToolCalls.to_string(), "tool-calls");
/// assert_eq!(FinishReason::from_openai("stop"), FinishReason::Stop);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FinishReason {
    /// The model finished its answer (`stop`).
    Stop,
    /// The model called tools and waits for their results (`tool-calls`): the turn runs them and
    /// asks for the next step.
    ToolCalls,
    /// The provider's output limit cut it (`length`).
    Length,
    /// The provider's content filter stopped it (`content-filter`).
    ContentFilter,
    /// Any other reason a provider gave (`other`).
    Other,
}

impl FinishReason {
    /// The wire spelling: `stop`, `tool-calls`, `length`, `content-filter` or `other`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::ToolCalls => "tool-calls",
            Self::Length => "length",
            Self::ContentFilter => "content-filter",
            Self::Other => "other",
        }
    }

    /// The reason an OpenAI-compatible provider gives (`stop`, `tool_calls`, `function_call`,
    /// `length`, `content_filter`); anything else is [`FinishReason::Other`].
    ///
    /// ```
    /// use agent_tools::model::FinishReason;
    /// assert_eq!(FinishReason::from_openai("tool_calls"), FinishReason::ToolCalls);
    /// assert_eq!(FinishReason::from_openai("tool_calls").as_str(), "tool-calls");
    /// assert_eq!(FinishReason::from_openai("eos"), FinishReason::Other);
    /// ```
    pub fn from_openai(raw: &str) -> Self {
        match raw {
            "stop" => Self::Stop,
            "tool_calls" | "function_call" => Self::ToolCalls,
            "length" => Self::Length,
            "content_filter" => Self::ContentFilter,
            _ => Self::Other,
        }
    }
}

impl std::fmt::Display for FinishReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Turns a provider's streamed event data (one SSE `data:` payload at a time) into
/// [`ModelEvent`]s.
pub(crate) trait EventDecoder {
    /// Feeds one event's data.
    fn feed(&mut self, data: &str) -> Result<Vec<ModelEvent>, ModelError>;
    /// The stream ended: completes what is pending, or says the stream was cut short.
    fn end(&mut self) -> Result<Vec<ModelEvent>, ModelError>;
}

/// A tool call whose arguments were not valid JSON.
///
/// ```
/// use agent_tools::model::{InvalidToolCall, ModelEvent};
///
/// // A provider sent arguments that are not JSON: the call fails on its own, the turn goes on.
/// let bad = InvalidToolCall::new("call_2", "research", "{\"query\": ", "EOF while parsing");
/// let event = ModelEvent::ToolCallReady(Err(bad));
/// assert!(matches!(event, ModelEvent::ToolCallReady(Err(InvalidToolCall { ref raw, .. })) if raw.ends_with(": ")));
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct InvalidToolCall {
    /// Call id.
    pub id: String,
    /// Tool name.
    pub name: String,
    /// The raw argument text.
    pub raw: String,
    /// The parse error.
    pub error: String,
}

impl ModelRequest {
    /// A request with this conversation and these tools.
    pub fn new(messages: Vec<ModelMessage>, tools: Vec<ToolSpec>) -> Self {
        Self { messages, tools }
    }
}

impl InvalidToolCall {
    /// A call of `name` whose argument text `raw` failed to parse with `error`.
    pub fn new(
        id: impl Into<String>,
        name: impl Into<String>,
        raw: impl Into<String>,
        error: impl Into<String>,
    ) -> Self {
        Self { id: id.into(), name: name.into(), raw: raw.into(), error: error.into() }
    }
}

/// Why a model call failed. Each ends the turn with an error part.
///
/// ```
/// use std::time::Duration;
/// use agent_tools::model::ModelError;
///
/// let stalled = ModelError::Stalled { after: Duration::from_secs(30) };
/// assert_eq!(stalled.to_string(), "model provider sent nothing for 30000 ms");
/// // A provider's HTTP error names the status and the log line's id, never the provider's body.
/// let http = ModelError::Http { status: 401, id: "e-7".into() };
/// assert!(http.to_string().contains("HTTP 401") && http.to_string().contains("e-7"));
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ModelError {
    /// The provider answered with an HTTP error. Its body can hold what clients must not see
    /// (an OpenAI 401 quotes the masked key): it goes to the Worker's log under `id`, and the
    /// error clients get names the status and the id only.
    Http {
        /// Status code.
        status: u16,
        /// The id the log line carries.
        id: String,
    },
    /// The provider reported an error inside its stream. Its words can hold what clients must
    /// not see: the built-in providers log `detail` under `id` and clear it, and the error
    /// clients get names the id only.
    Reported {
        /// The id the log line carries.
        id: String,
        /// The provider's words (empty once logged).
        detail: String,
    },
    /// The stream did not follow the protocol.
    Protocol(String),
    /// Nothing arrived for this long.
    Stalled {
        /// How long nothing arrived.
        after: std::time::Duration,
    },
    /// The request could not be made.
    Network(String),
    /// The configuration is incomplete.
    Config(String),
}

impl std::fmt::Display for ModelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Http { status, id } => {
                write!(f, "model provider answered HTTP {status} (error {id}; the details are in the Worker's log)")
            }
            Self::Reported { id, .. } => {
                write!(f, "model provider reported an error (error {id}; the details are in the Worker's log)")
            }
            Self::Protocol(e) => write!(f, "model provider sent a malformed stream: {e}"),
            Self::Stalled { after } => write!(f, "model provider sent nothing for {} ms", after.as_millis()),
            Self::Network(e) => write!(f, "model provider unreachable: {e}"),
            Self::Config(e) => write!(f, "model provider misconfigured: {e}"),
        }
    }
}

impl std::error::Error for ModelError {}
