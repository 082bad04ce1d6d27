//! The crate's error: what every fallible call of the library returns, and what an agent's own
//! hooks and tools return when they fail.

use std::fmt;

use crate::llm::ModelError;
use crate::store::StoreError;

/// Why a call failed.
///
/// Its [`Display`](fmt::Display) is the message alone, as clients and models see it: the text a
/// failed tool hands the model, the `error` of an RPC reply, the `error` of a run that ended
/// `error`. An agent's own code fails with [`Error::Failed`], most simply through `From`:
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
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// Input that does not fit what was asked: a value that fails its schema, a malformed run
    /// id, a payload that does not serialize or deserialize, arguments an RPC method refuses.
    Invalid(String),
    /// Nothing by that name: an RPC method the agent does not serve, a run or task it does not
    /// know.
    NotFound(String),
    /// The agent's SQLite storage failed a statement; the call changed nothing it reports as
    /// done.
    Storage(String),
    /// Another Durable Object, a binding or the network could not be reached, refused, or
    /// answered out of protocol.
    Unavailable(String),
    /// The model failed.
    Model(ModelError),
    /// A dispatch the engine turned away, writing nothing: over the concurrency cap (with
    /// [`crate::Admission::Reject`]), a run id of another class, an option detached runs do not
    /// take. Dispatching again can succeed once the cause is gone.
    Refused(String),
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
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Model(e) => e.fmt(f),
            Self::Invalid(m)
            | Self::NotFound(m)
            | Self::Storage(m)
            | Self::Unavailable(m)
            | Self::Refused(m)
            | Self::Cancelled(m)
            | Self::Config(m)
            | Self::Failed(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Model(e) => Some(e),
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
        Self::Storage(e.to_string())
    }
}

/// A value that does not (de)serialize: [`Error::Invalid`].
impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Self::Invalid(e.to_string())
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
        assert_eq!(Error::NotFound("Method m does not exist".into()).message(), "Method m does not exist");
        let model = Error::from(ModelError::Config("OPENAI_API_KEY is not set".into()));
        assert!(matches!(model, Error::Model(_)));
        assert_eq!(model.to_string(), "model provider misconfigured: OPENAI_API_KEY is not set");
        assert!(std::error::Error::source(&model).is_some());
        let bad: Result<i64, _> = serde_json::from_str("nope");
        assert!(matches!(Error::from(bad.unwrap_err()), Error::Invalid(_)));
    }
}
