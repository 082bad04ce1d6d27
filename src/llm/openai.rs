//! OpenAI-compatible Chat Completions: the request body and the streamed response, as pure
//! functions. One implementation serves OpenAI, Workers AI's OpenAI-compatible endpoint and
//! local servers (llama.cpp, vLLM, Ollama).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use super::{
    EventDecoder, FinishReason, InvalidToolCall, ModelError, ModelEvent, ModelMessage, ModelRequest, ToolCall,
};

/// Where and what to call. Its `Debug` never shows the key.
///
/// ```
/// use std::time::Duration;
/// use agent_tools::model::OpenAiConfig;
///
/// let config = OpenAiConfig::new("http://127.0.0.1:8080/v1", "llama-3.1-8b")
///     .api_key("sk-local")
///     .stall_timeout(Duration::from_secs(10));
/// assert_eq!(config.endpoint(), "http://127.0.0.1:8080/v1/chat/completions");
/// assert!(!format!("{config:?}").contains("sk-local"), "Debug never shows the key");
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OpenAiConfig {
    /// Base URL up to and including the API version, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    /// Bearer token, if the server wants one.
    pub api_key: Option<String>,
    /// Model name.
    pub model: String,
    /// Give up when no byte arrives for this long.
    pub stall_timeout: Duration,
}

impl std::fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("stall_timeout", &self.stall_timeout)
            .finish()
    }
}

impl OpenAiConfig {
    /// `model` at `base_url` (up to and including the API version), no key, a 30 s stall
    /// timeout.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self { base_url: base_url.into(), api_key: None, model: model.into(), stall_timeout: Duration::from_secs(30) }
    }

    /// With this bearer token.
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// Giving up when no byte arrives for `timeout`.
    pub fn stall_timeout(mut self, timeout: Duration) -> Self {
        self.stall_timeout = timeout;
        self
    }

    /// The Chat Completions endpoint.
    pub fn endpoint(&self) -> String {
        format!("{}/chat/completions", self.base_url.trim_end_matches('/'))
    }
}

fn content_text(output: &Value) -> String {
    match output {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The JSON body of a streaming Chat Completions request.
pub fn request_body(model: &str, request: &ModelRequest) -> Value {
    let messages: Vec<Value> = request
        .messages
        .iter()
        .map(|m| match m {
            ModelMessage::System(text) => json!({ "role": "system", "content": text }),
            ModelMessage::User(text) => json!({ "role": "user", "content": text }),
            ModelMessage::Assistant { text, tool_calls } => {
                let mut msg =
                    json!({ "role": "assistant", "content": if text.is_empty() { Value::Null } else { json!(text) } });
                if !tool_calls.is_empty() {
                    msg["tool_calls"] = tool_calls
                        .iter()
                        .map(|c| {
                            json!({ "id": c.id, "type": "function",
                                    "function": { "name": c.name, "arguments": c.input.to_string() } })
                        })
                        .collect();
                }
                msg
            }
            ModelMessage::Tool { call_id, output, .. } => {
                json!({ "role": "tool", "tool_call_id": call_id, "content": content_text(output) })
            }
        })
        .collect();
    let mut body = json!({ "model": model, "messages": messages, "stream": true });
    if !request.tools.is_empty() {
        body["tools"] = request
            .tools
            .iter()
            .map(|t| {
                json!({ "type": "function",
                        "function": { "name": t.name, "description": t.description, "parameters": t.input_schema } })
            })
            .collect();
    }
    body
}

#[derive(Debug, Default)]
struct PartialCall {
    id: Option<String>,
    name: Option<String>,
    args: String,
    announced: bool,
}

/// Turns the `data` payloads of a Chat Completions stream into [`ModelEvent`]s.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    calls: BTreeMap<u64, PartialCall>,
    finish_reason: Option<FinishReason>,
    done: bool,
}

impl EventDecoder for StreamDecoder {
    fn feed(&mut self, data: &str) -> Result<Vec<ModelEvent>, ModelError> {
        if self.done {
            return Ok(Vec::new());
        }
        if data.trim() == "[DONE]" {
            self.done = true;
            return self.flush();
        }
        let chunk: Value =
            serde_json::from_str(data).map_err(|e| ModelError::Protocol(format!("an event is not JSON ({e})")))?;
        self.feed_chunk(&chunk)
    }

    fn end(&mut self) -> Result<Vec<ModelEvent>, ModelError> {
        if self.done {
            return Ok(Vec::new());
        }
        if self.finish_reason.is_none() {
            return Err(ModelError::Protocol("the stream ended before the model finished".into()));
        }
        self.done = true;
        self.flush()
    }
}

impl StreamDecoder {
    /// Feeds one event's already parsed chunk.
    pub fn feed_chunk(&mut self, chunk: &Value) -> Result<Vec<ModelEvent>, ModelError> {
        if self.done {
            return Ok(Vec::new());
        }
        if let Some(error) = chunk.get("error") {
            // The provider's words may quote a key or an internal detail: they go to the log
            // under an id, and clients get the id.
            let message = error.get("message").and_then(Value::as_str).map_or_else(|| error.to_string(), str::to_owned);
            return Err(ModelError::Reported { id: String::new(), detail: message.chars().take(2000).collect() });
        }
        let mut events = Vec::new();
        let Some(choice) = chunk.get("choices").and_then(|c| c.get(0)) else {
            return Ok(events); // usage-only chunks and keep-alives carry no choice
        };
        let delta = choice.get("delta").unwrap_or(&Value::Null);
        if let Some(text) = delta.get("content").and_then(Value::as_str) {
            if !text.is_empty() {
                events.push(ModelEvent::TextDelta(text.to_owned()));
            }
        }
        if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
            for (position, call) in calls.iter().enumerate() {
                let index = call.get("index").and_then(Value::as_u64).unwrap_or(position as u64);
                let partial = self.calls.entry(index).or_default();
                if let Some(id) = call.get("id").and_then(Value::as_str) {
                    partial.id.get_or_insert_with(|| id.to_owned());
                }
                let function = call.get("function").unwrap_or(&Value::Null);
                if let Some(name) = function.get("name").and_then(Value::as_str) {
                    partial.name.get_or_insert_with(|| name.to_owned());
                }
                if !partial.announced {
                    if let (Some(id), Some(name)) = (&partial.id, &partial.name) {
                        partial.announced = true;
                        events.push(ModelEvent::ToolCallStart { id: id.clone(), name: name.clone() });
                        if !partial.args.is_empty() {
                            events.push(ModelEvent::ToolCallDelta { id: id.clone(), delta: partial.args.clone() });
                        }
                    }
                }
                if let Some(args) = function.get("arguments").and_then(Value::as_str) {
                    partial.args.push_str(args);
                    if let (true, Some(id)) = (partial.announced, &partial.id) {
                        if !args.is_empty() {
                            events.push(ModelEvent::ToolCallDelta { id: id.clone(), delta: args.to_owned() });
                        }
                    }
                }
            }
        }
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish_reason = Some(FinishReason::from_openai(reason));
        }
        Ok(events)
    }

    fn flush(&mut self) -> Result<Vec<ModelEvent>, ModelError> {
        let mut events = Vec::new();
        let has_calls = !self.calls.is_empty();
        for (index, call) in std::mem::take(&mut self.calls) {
            let id = call.id.unwrap_or_else(|| format!("call_{index}"));
            let Some(name) = call.name else {
                return Err(ModelError::Protocol(format!("tool call {id} has no function name")));
            };
            if !call.announced {
                events.push(ModelEvent::ToolCallStart { id: id.clone(), name: name.clone() });
            }
            let raw = if call.args.trim().is_empty() { "{}" } else { call.args.as_str() };
            events.push(ModelEvent::ToolCallReady(match serde_json::from_str::<Value>(raw) {
                Ok(input) => Ok(ToolCall { id, name, input }),
                Err(e) => Err(InvalidToolCall { id, name, raw: call.args.clone(), error: e.to_string() }),
            }));
        }
        let reason =
            self.finish_reason.take().unwrap_or(if has_calls { FinishReason::ToolCalls } else { FinishReason::Stop });
        events.push(ModelEvent::Finish(reason));
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::ToolSpec;

    fn decode(events: &[&str]) -> Result<Vec<ModelEvent>, ModelError> {
        let mut d = StreamDecoder::default();
        let mut out = Vec::new();
        for e in events {
            out.extend(d.feed(e)?);
        }
        out.extend(d.end()?);
        Ok(out)
    }

    #[test]
    fn text_then_stop() {
        let got = decode(&[
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"Hel"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
            "[DONE]",
        ])
        .unwrap();
        assert_eq!(
            got,
            vec![
                ModelEvent::TextDelta("Hel".into()),
                ModelEvent::TextDelta("lo".into()),
                ModelEvent::Finish(FinishReason::Stop)
            ]
        );
    }

    #[test]
    fn parallel_tool_calls_split_across_chunks() {
        let got = decode(&[
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"research","arguments":""}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"que"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"id":"call_b","function":{"name":"research","arguments":"{\"query\":"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"ry\":\"HTTP/3\"}"}},{"index":1,"function":{"arguments":"\"gRPC\"}"}}]}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#,
            "[DONE]",
        ])
        .unwrap();
        let ready: Vec<ToolCall> = got
            .iter()
            .filter_map(|e| match e {
                ModelEvent::ToolCallReady(Ok(c)) => Some(c.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(
            ready,
            vec![
                ToolCall { id: "call_a".into(), name: "research".into(), input: json!({"query": "HTTP/3"}) },
                ToolCall { id: "call_b".into(), name: "research".into(), input: json!({"query": "gRPC"}) },
            ]
        );
        let deltas: String = got
            .iter()
            .filter_map(|e| match e {
                ModelEvent::ToolCallDelta { id, delta } if id == "call_a" => Some(delta.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(deltas, "{\"query\":\"HTTP/3\"}");
        assert_eq!(got.last(), Some(&ModelEvent::Finish(FinishReason::ToolCalls)));
    }

    #[test]
    fn bad_arguments_fail_only_their_call() {
        let got = decode(&[
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"t","arguments":"{oops"}},{"index":1,"id":"d","function":{"name":"t","arguments":"{\"q\":1}"}}]},"finish_reason":"tool_calls"}]}"#,
        ])
        .unwrap();
        let ready: Vec<&Result<ToolCall, InvalidToolCall>> = got
            .iter()
            .filter_map(|e| match e {
                ModelEvent::ToolCallReady(r) => Some(r),
                _ => None,
            })
            .collect();
        assert_eq!(ready.len(), 2, "{got:?}");
        assert!(matches!(ready[0], Err(InvalidToolCall { id, raw, .. }) if id == "c" && raw == "{oops"));
        assert!(
            matches!(ready[1], Ok(call) if call.id == "d" && call.input == serde_json::json!({"q": 1})),
            "the other call is unharmed"
        );
    }

    #[test]
    fn malformed_streams_are_errors() {
        assert!(matches!(decode(&["not json"]), Err(ModelError::Protocol(m)) if m.contains("not JSON")));
        assert!(matches!(
            decode(&[r#"{"choices":[{"delta":{"content":"x"}}]}"#]),
            Err(ModelError::Protocol(m)) if m.contains("ended before")
        ));
        assert!(matches!(
            decode(&[r#"{"error":{"message":"quota"}}"#]),
            Err(ModelError::Reported { detail, .. }) if detail == "quota"
        ));
        // What clients see names no content of the provider's.
        let Err(shown) = decode(&["{\"secret\": sk-123"]) else { panic!("an error") };
        assert!(!shown.to_string().contains("sk-"), "{shown}");
    }

    #[test]
    fn request_maps_every_message_kind() {
        let call = ToolCall { id: "c1".into(), name: "research".into(), input: json!({"query": "x"}) };
        let req = ModelRequest {
            messages: vec![
                ModelMessage::System("be brief".into()),
                ModelMessage::User("hi".into()),
                ModelMessage::Assistant { text: String::new(), tool_calls: vec![call] },
                ModelMessage::Tool { call_id: "c1".into(), name: "research".into(), output: json!({"ok": false}) },
            ],
            tools: vec![ToolSpec {
                name: "research".into(),
                description: "d".into(),
                input_schema: json!({"type": "object"}),
            }],
        };
        let body = request_body("m", &req);
        assert_eq!(body["stream"], true);
        assert_eq!(body["messages"][2]["content"], Value::Null);
        assert_eq!(body["messages"][2]["tool_calls"][0]["function"]["arguments"], "{\"query\":\"x\"}");
        assert_eq!(body["messages"][3], json!({"role": "tool", "tool_call_id": "c1", "content": "{\"ok\":false}"}));
        assert_eq!(body["tools"][0]["function"]["parameters"], json!({"type": "object"}));
    }
}
