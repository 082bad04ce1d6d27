//! The crate's error: what every fallible call of the library returns, and what an agent's own
//! hooks and tools return when they fail.

use std::fmt;

use crate::llm::ModelError;
use crate::store::StoreError;

/// Why a call failed.
///
/// Its [`Display`](fmt::Display) is the message alone, as clients and models see it: the text a
/// failed tool hands the model, the `error` of an RPC reply, the `error` of a run that ended
/// `error`. The variants say what happened, each with a typed cause to match on ([`Invalid`],
/// [`NotFound`], [`StoreError`], [`Unavailable`], [`Refused`]); words alone are the last resort
/// (an agent's own failure, a cancel's reason, a wrong declaration). An agent's own code fails
/// with [`Error::Failed`], most simply through `From`:
///
/// ```
/// use agent_tools::Error;
///
/// fn half(n: i64) -> Result<i64, Error> {
///     if n % 2 != 0 {
///         return Err(format!("{n} is odd").into()); // Error::Failed
///     }
///     Ok(n / 2)
/// }
/// assert_eq!(half(3).unwrap_err().to_string(), "3 is odd");
/// ```
///
/// New variants may come in a minor version: match with a wildcard arm.
///
/// ```
/// use agent_tools::{Error, Refused};
///
/// fn advice(error: &Error) -> &'static str {
///     match error {
///         Error::Refused(Refused::CapReached { .. }) => "too many runs at once: try again when one ends",
///         Error::Unavailable(e) if e.retryable => "the child could not be reached: try again",
///         Error::Storage(_) => "the agent's storage failed: nothing was started",
///         _ => "failed",
///     }
/// }
/// assert_eq!(advice(&Error::Refused(Refused::CapReached { limit: 2 })), "too many runs at once: try again when one ends");
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// Input that does not fit what was asked: a value that fails its schema, a payload that
    /// does not serialize or deserialize, arguments an RPC method refuses.
    Invalid(Invalid),
    /// Nothing by that name: an RPC method the agent does not serve, a run it does not know.
    NotFound(NotFound),
    /// The agent's SQLite storage failed a statement; the call changed nothing it reports as
    /// done.
    Storage(StoreError),
    /// Another Durable Object, a binding or the network could not be reached, refused, or
    /// answered out of protocol; [`Unavailable::retryable`] says whether the same call can
    /// succeed later.
    Unavailable(Unavailable),
    /// The model failed.
    Model(ModelError),
    /// A dispatch or a message the engine turned away, writing nothing. Sending it again can
    /// succeed once the cause is gone.
    Refused(Refused),
    /// The work was cancelled; the reason.
    Cancelled(String),
    /// The agent's own declaration is wrong: its tools fail their checks, a binding is missing.
    Config(String),
    /// An agent's own failure, in its own words (a tool's, a hook's, an RPC method's).
    Failed(String),
}

impl Error {
    /// The message, as [`Display`](fmt::Display) writes it.
    pub fn message(&self) -> String {
        self.to_string()
    }

    /// Input refused in words ([`Invalid::Other`]): what an RPC method says of arguments it
    /// does not take.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::Invalid(Invalid::Other(message.into()))
    }

    /// A value that does not serialize, or does not read as the type asked for: `what` it is,
    /// and serde's words ([`Invalid::Json`]).
    pub fn json(what: impl Into<String>, error: impl fmt::Display) -> Self {
        Self::Invalid(Invalid::Json { what: what.into(), error: error.to_string() })
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Model(e) => e.fmt(f),
            Self::Invalid(e) => e.fmt(f),
            Self::NotFound(e) => e.fmt(f),
            Self::Storage(e) => e.fmt(f),
            Self::Unavailable(e) => e.fmt(f),
            Self::Refused(e) => e.fmt(f),
            Self::Cancelled(m) | Self::Config(m) | Self::Failed(m) => f.write_str(m),
        }
    }
}

/// What is wrong with an input ([`Error::Invalid`]). New kinds may come in a minor version.
///
/// ```
/// use agent_tools::{Error, Invalid};
///
/// let error = Error::invalid("a run id may not contain '/'");
/// assert!(matches!(error, Error::Invalid(Invalid::Other(_))));
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Invalid {
    /// A tool's input fails its JSON Schema: the message is what the model is told.
    Input {
        /// The tool.
        tool: String,
        /// What is wrong, by JSON pointer (`/query: must be at least 3 characters long`).
        problem: String,
    },
    /// A value that does not serialize, or does not read as the type asked for.
    Json {
        /// What the value is (`the state`, `task 7 payload`, …).
        what: String,
        /// serde's words.
        error: String,
    },
    /// Anything else, in words: arguments an RPC method refuses, a malformed run id.
    Other(String),
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Input { tool, problem } => write!(f, "Invalid input for tool {tool}: {problem}"),
            Self::Json { what, error } => write!(f, "{what}: {error}"),
            Self::Other(message) => f.write_str(message),
        }
    }
}

/// What was not found ([`Error::NotFound`]). New kinds may come in a minor version.
///
/// ```
/// use agent_tools::{Error, NotFound};
///
/// let error = Error::NotFound(NotFound::Run("run-9".into()));
/// assert_eq!(error.to_string(), "no agent-tool run \"run-9\"");
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum NotFound {
    /// An RPC method the agent does not serve.
    Method(String),
    /// A run id the registry does not hold.
    Run(String),
    /// Anything else, in words.
    Other(String),
}

impl fmt::Display for NotFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Method(method) => write!(f, "Method {method} does not exist"),
            Self::Run(run_id) => write!(f, "no agent-tool run {run_id:?}"),
            Self::Other(message) => f.write_str(message),
        }
    }
}

/// Another object, a binding or the network that could not be reached, or answered out of
/// protocol ([`Error::Unavailable`]).
///
/// ```
/// use agent_tools::Unavailable;
///
/// assert!(Unavailable::answered(503, "the child is overloaded").retryable);
/// assert!(!Unavailable::answered(404, "no such child").retryable);
/// assert!(Unavailable::unreachable("connection reset").retryable);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Unavailable {
    /// What happened, in words.
    pub message: String,
    /// The HTTP status it answered with, when it answered.
    pub status: Option<u16>,
    /// Whether the same call can succeed later: not reached, a 5xx, a 429, a timeout; not a
    /// 4xx nor an answer out of protocol.
    pub retryable: bool,
}

impl Unavailable {
    /// It could not be reached (the network, a dropped connection, a timeout): retryable.
    pub fn unreachable(message: impl Into<String>) -> Self {
        Self { message: message.into(), status: None, retryable: true }
    }

    /// It answered `status`: retryable for a 5xx and a 429.
    pub fn answered(status: u16, message: impl Into<String>) -> Self {
        Self { message: message.into(), status: Some(status), retryable: status >= 500 || status == 429 }
    }

    /// It answered out of protocol (a reply of the wrong kind, a body that does not read):
    /// not retryable.
    pub fn out_of_protocol(message: impl Into<String>) -> Self {
        Self { message: message.into(), status: None, retryable: false }
    }
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Why a dispatch or a message was turned away, writing nothing ([`Error::Refused`]). New
/// reasons may come in a minor version.
///
/// ```
/// use agent_tools::{Error, Refused};
///
/// fn tell(error: &Error) -> &'static str {
///     match error {
///         Error::Refused(Refused::CapReached { .. }) => "busy: try again when a run ends",
///         Error::Refused(Refused::TooLarge { .. }) => "the input is too large",
///         Error::Refused(_) => "refused",
///         _ => "failed",
///     }
/// }
/// assert_eq!(tell(&Error::Refused(Refused::CapReached { limit: 4 })), "busy: try again when a run ends");
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Refused {
    /// `max_concurrent_agent_tools` runs are starting or running (with
    /// [`crate::Admission::Reject`], or a detached dispatch, which never queues).
    CapReached {
        /// The cap.
        limit: usize,
    },
    /// The run id belongs to a run of another child class.
    OtherClass {
        /// The run id.
        run_id: String,
        /// The class it belongs to.
        existing: String,
        /// The class asked for.
        requested: String,
    },
    /// A detached run was asked for [`crate::EventDelivery::Terminal`].
    TerminalDeliveryDetached,
    /// The run's input or display is larger than the limit.
    TooLarge {
        /// `input` or `display`.
        what: &'static str,
        /// Its size, in bytes of JSON.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// The run id was cleared and its child has not yet deleted its storage: dispatch it again
    /// shortly.
    ClearPending {
        /// The run id.
        run_id: String,
    },
    /// A message for a run that already ended.
    Ended {
        /// The run id.
        run_id: String,
        /// How it ended.
        status: crate::protocol::outcome::RunStatus,
    },
    /// A message of a name the run was already sent (the first one stays).
    AlreadySent {
        /// The run id.
        run_id: String,
        /// The message's name.
        name: String,
        /// What was sent first, as JSON.
        first: String,
    },
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CapReached { limit } => write!(
                f,
                "maxConcurrentAgentTools ({limit}) reached: {limit} runs are starting or running; retry when one finishes"
            ),
            Self::OtherClass { run_id, existing, requested } => write!(
                f,
                "run id {run_id:?} already belongs to a {existing} run; it cannot be dispatched as {requested}"
            ),
            Self::TerminalDeliveryDetached => {
                f.write_str("event_delivery \"terminal\" is not supported for detached runs")
            }
            Self::TooLarge { what, bytes, limit } => {
                write!(f, "the run's {what} is {bytes} bytes of JSON; at most {limit} are accepted")
            }
            Self::ClearPending { run_id } => write!(
                f,
                "run id {run_id:?} was cleared and its child has not yet deleted its storage; dispatch it again shortly"
            ),
            Self::Ended { run_id, status } => write!(f, "run {run_id:?} already ended ({status})"),
            Self::AlreadySent { run_id, name, first } => {
                write!(f, "run {run_id:?} was already sent {name:?}: {first}")
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Model(e) => Some(e),
            Self::Storage(e) => Some(e),
            _ => None,
        }
    }
}

/// An agent's own failure: [`Error::Failed`] with this message.
impl From<String> for Error {
    fn from(message: String) -> Self {
        Self::Failed(message)
    }
}

/// An agent's own failure: [`Error::Failed`] with this message.
impl From<&str> for Error {
    fn from(message: &str) -> Self {
        Self::Failed(message.to_owned())
    }
}

impl From<ModelError> for Error {
    fn from(e: ModelError) -> Self {
        Self::Model(e)
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        Self::Storage(e)
    }
}

impl From<Refused> for Error {
    fn from(e: Refused) -> Self {
        Self::Refused(e)
    }
}

impl From<Unavailable> for Error {
    fn from(e: Unavailable) -> Self {
        Self::Unavailable(e)
    }
}

/// A value that does not (de)serialize: [`Invalid::Json`].
impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Self::json("a JSON value", e)
    }
}

/// A Worker's fetch handler can `?` the crate's errors.
impl From<Error> for worker::Error {
    fn from(e: Error) -> Self {
        worker::Error::RustError(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_is_the_display_and_failures_convert() {
        assert_eq!(Error::from("no such city").to_string(), "no such city");
        assert_eq!(Error::from(String::from("x")), Error::Failed("x".into()));
        assert_eq!(Error::NotFound(NotFound::Method("m".into())).message(), "Method m does not exist");
        let storage = Error::from(StoreError { message: "disk I/O error".into() });
        assert_eq!(storage.to_string(), "storage error: disk I/O error");
        assert!(std::error::Error::source(&storage).is_some());
        assert!(Unavailable::answered(503, "busy").retryable && !Unavailable::answered(400, "bad").retryable);
        assert!(!Unavailable::out_of_protocol("a reply of the wrong kind").retryable);
        let model = Error::from(ModelError::Config("OPENAI_API_KEY is not set".into()));
        assert!(matches!(model, Error::Model(_)));
        assert_eq!(model.to_string(), "model provider misconfigured: OPENAI_API_KEY is not set");
        assert!(std::error::Error::source(&model).is_some());
        let bad: Result<i64, _> = serde_json::from_str("nope");
        assert!(matches!(Error::from(bad.unwrap_err()), Error::Invalid(_)));
    }
}
