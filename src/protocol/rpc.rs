//! Frames a client sends to an agent, and the RPC replies (`agent.call()` of the Agents SDK).
//!
//! ```text
//! → {"type":"rpc","id":"1","method":"research","args":[...]}
//! ← {"type":"rpc","id":"1","success":true,"result":...,"done":true}
//! ← {"type":"rpc","id":"1","success":false,"error":"Method nope does not exist"}
//! ```

use serde::Serialize;
use serde_json::{Map, Value};

/// A parsed RPC request.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcRequest {
    /// Caller-chosen id, echoed in the reply.
    pub id: String,
    /// Method name.
    pub method: String,
    /// Positional arguments.
    pub args: Vec<Value>,
}

/// An RPC reply.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RpcResponse {
    /// Always `"rpc"`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The request's id.
    pub id: String,
    /// Whether the call succeeded.
    pub success: bool,
    /// The result, on success.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The error message, on failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `true` on a final successful reply.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub done: Option<bool>,
}

impl RpcResponse {
    /// A successful, final reply.
    pub fn ok(id: impl Into<String>, result: Value) -> Self {
        Self { kind: "rpc", id: id.into(), success: true, result: Some(result), error: None, done: Some(true) }
    }

    /// A failed reply; `agent.call()` rejects with `error`.
    pub fn err(id: impl Into<String>, error: impl Into<String>) -> Self {
        Self { kind: "rpc", id: id.into(), success: false, result: None, error: Some(error.into()), done: None }
    }

    /// Serializes the reply.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A client frame, classified by its `type`.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientFrame {
    /// An RPC call.
    Rpc(RpcRequest),
    /// Any other typed frame (chat frames, state updates); handled by the agent or ignored.
    Other {
        /// The frame's `type`.
        kind: String,
        /// The whole frame.
        frame: Map<String, Value>,
    },
}

/// Why a client frame was refused. The message is sent back to the client as is.
#[derive(Debug, Clone, PartialEq)]
pub enum FrameError {
    /// Binary frames carry nothing this protocol understands.
    Binary,
    /// Not JSON at all.
    NotJson(String),
    /// JSON, but not an object with a string `type`.
    Untyped,
    /// An `rpc` frame with a usable `id` but a wrong shape; the reply goes to that id.
    BadRpc {
        /// The request id to answer.
        id: String,
        /// What was wrong.
        problem: String,
    },
    /// An `rpc` frame without a string `id`.
    RpcWithoutId,
    /// Larger than [`MAX_FRAME_BYTES`]: refused unread (its size in bytes).
    TooLarge(usize),
}

/// The largest client frame an agent reads (4 MiB). A larger one is refused before it is
/// parsed, so its size never multiplies into a parsed value's.
pub const MAX_FRAME_BYTES: usize = 4 << 20;

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Binary => write!(f, "binary frames are not supported; send JSON text"),
            Self::NotJson(e) => write!(f, "frame is not valid JSON: {e}"),
            Self::Untyped => write!(f, "frame must be a JSON object with a string \"type\""),
            Self::BadRpc { problem, .. } => write!(f, "malformed rpc frame: {problem}"),
            Self::RpcWithoutId => write!(f, "malformed rpc frame: \"id\" must be a string"),
            Self::TooLarge(bytes) => {
                write!(f, "a frame of {bytes} bytes is over the limit of {MAX_FRAME_BYTES} bytes; it was not read")
            }
        }
    }
}

/// The frame sent back for a frame that could not be understood. The socket stays open.
pub fn protocol_error_frame(error: &FrameError) -> String {
    serde_json::json!({ "type": "cf_agent_error", "error": error.to_string() }).to_string()
}

/// Parses one text frame from a client.
pub fn parse_client_frame(text: &str) -> Result<ClientFrame, FrameError> {
    if text.len() > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(text.len()));
    }
    let value: Value = serde_json::from_str(text).map_err(|e| FrameError::NotJson(e.to_string()))?;
    let Value::Object(mut frame) = value else { return Err(FrameError::Untyped) };
    let kind = match frame.get("type") {
        Some(Value::String(s)) => s.clone(),
        _ => return Err(FrameError::Untyped),
    };
    if kind != "rpc" {
        return Ok(ClientFrame::Other { kind, frame });
    }
    let id = match frame.get("id") {
        Some(Value::String(s)) => s.clone(),
        _ => return Err(FrameError::RpcWithoutId),
    };
    let method = match frame.get("method") {
        Some(Value::String(s)) => s.clone(),
        _ => return Err(FrameError::BadRpc { id, problem: "\"method\" must be a string".into() }),
    };
    let args = match frame.remove("args") {
        Some(Value::Array(a)) => a,
        None => Vec::new(),
        Some(_) => return Err(FrameError::BadRpc { id, problem: "\"args\" must be an array".into() }),
    };
    Ok(ClientFrame::Rpc(RpcRequest { id, method, args }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rpc_and_other_frames() {
        let f = parse_client_frame(r#"{"type":"rpc","id":"7","method":"research","args":[1,"a"]}"#).unwrap();
        assert_eq!(
            f,
            ClientFrame::Rpc(RpcRequest {
                id: "7".into(),
                method: "research".into(),
                args: vec![serde_json::json!(1), serde_json::json!("a")]
            })
        );
        match parse_client_frame(r#"{"type":"cf_agent_chat_clear"}"#).unwrap() {
            ClientFrame::Other { kind, .. } => assert_eq!(kind, "cf_agent_chat_clear"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn refuses_malformed_frames_precisely() {
        assert!(matches!(parse_client_frame("{nope"), Err(FrameError::NotJson(_))));
        assert_eq!(parse_client_frame("[1]"), Err(FrameError::Untyped));
        assert_eq!(parse_client_frame(r#"{"type":5}"#), Err(FrameError::Untyped));
        assert_eq!(parse_client_frame(r#"{"type":"rpc","method":"x"}"#), Err(FrameError::RpcWithoutId));
        assert_eq!(
            parse_client_frame(r#"{"type":"rpc","id":"1","method":"x","args":{}}"#),
            Err(FrameError::BadRpc { id: "1".into(), problem: "\"args\" must be an array".into() })
        );
    }

    /// A frame over the limit is refused by its size, before it is parsed: a well-formed call
    /// one byte over is not answered as a call.
    #[test]
    fn an_oversized_frame_is_refused_unread() {
        let call =
            |padding: usize| format!(r#"{{"type":"rpc","id":"1","method":"runs","args":["{}"]}}"#, "x".repeat(padding));
        let overhead = call(0).len();
        assert!(matches!(parse_client_frame(&call(MAX_FRAME_BYTES - overhead)), Ok(ClientFrame::Rpc(_))));
        let over = call(MAX_FRAME_BYTES - overhead + 1);
        assert_eq!(parse_client_frame(&over), Err(FrameError::TooLarge(MAX_FRAME_BYTES + 1)));
        let message = protocol_error_frame(&FrameError::TooLarge(MAX_FRAME_BYTES + 1));
        assert!(message.contains("over the limit of 4194304 bytes"), "{message}");
    }

    #[test]
    fn replies_match_the_sdk_shape() {
        assert_eq!(
            RpcResponse::ok("1", serde_json::json!(3)).to_json(),
            r#"{"type":"rpc","id":"1","success":true,"result":3,"done":true}"#
        );
        assert_eq!(
            RpcResponse::err("1", "Method x does not exist").to_json(),
            r#"{"type":"rpc","id":"1","success":false,"error":"Method x does not exist"}"#
        );
    }
}
