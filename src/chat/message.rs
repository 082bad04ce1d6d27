//! Builds an AI SDK `UIMessage` from the `UIMessageChunk`s of a stream, the way the server side
//! of `@cloudflare/ai-chat` persists it: tolerant of missing starts, tool parts typed
//! `tool-<name>`, transient data parts left out.

use serde_json::{json, Map, Value};

/// A `UIMessage` under construction.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageBuilder {
    id: String,
    role: String,
    parts: Vec<Value>,
    metadata: Option<Value>,
    text_parts: Vec<(String, String, usize)>,
}

fn get_str<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

impl MessageBuilder {
    /// An empty assistant message with this id.
    pub fn new(id: impl Into<String>) -> Self {
        Self { id: id.into(), role: "assistant".into(), parts: Vec::new(), metadata: None, text_parts: Vec::new() }
    }

    /// A saved message that a stream goes on with (a turn that paused for a person): new parts
    /// come after its parts.
    pub fn from_message(message: &Value) -> Self {
        let mut builder = Self::new(get_str(message, "id").unwrap_or_default());
        if let Some(parts) = message.get("parts").and_then(Value::as_array) {
            builder.parts = parts.clone();
        }
        builder.metadata = message.get("metadata").filter(|m| m.is_object()).cloned();
        builder
    }

    /// Whether any part was added.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    fn text_part(&mut self, kind: &str, id: &str) -> usize {
        if let Some(&(_, _, i)) = self.text_parts.iter().find(|(k, d, _)| k == kind && d == id) {
            return i;
        }
        self.parts.push(json!({ "type": kind, "text": "", "state": "streaming" }));
        let index = self.parts.len() - 1;
        self.text_parts.push((kind.to_owned(), id.to_owned(), index));
        index
    }

    fn tool_part(&mut self, call_id: &str, name: Option<&str>) -> Option<usize> {
        if let Some(i) = self.parts.iter().position(|p| get_str(p, "toolCallId") == Some(call_id)) {
            return Some(i);
        }
        let name = name?;
        self.parts.push(json!({
            "type": format!("tool-{name}"), "toolCallId": call_id, "state": "input-streaming"
        }));
        Some(self.parts.len() - 1)
    }

    /// Applies one chunk. Unknown or malformed chunks are ignored.
    pub fn apply(&mut self, chunk: &Value) {
        let Some(kind) = get_str(chunk, "type") else { return };
        let call_id = get_str(chunk, "toolCallId").unwrap_or_default().to_owned();
        let name = get_str(chunk, "toolName").map(str::to_owned);
        match kind {
            "start" => {
                if let Some(id) = get_str(chunk, "messageId") {
                    self.id = id.to_owned();
                }
                self.merge_metadata(chunk.get("messageMetadata"));
            }
            "message-metadata" | "finish" => self.merge_metadata(chunk.get("messageMetadata")),
            "start-step" => self.parts.push(json!({ "type": "step-start" })),
            "text-start" | "reasoning-start" => {
                let part = if kind == "text-start" { "text" } else { "reasoning" };
                self.text_part(part, get_str(chunk, "id").unwrap_or_default());
            }
            "text-delta" | "reasoning-delta" => {
                let part = if kind == "text-delta" { "text" } else { "reasoning" };
                let i = self.text_part(part, get_str(chunk, "id").unwrap_or_default());
                let delta = get_str(chunk, "delta").unwrap_or_default();
                match self.parts[i].get_mut("text") {
                    Some(Value::String(text)) => text.push_str(delta),
                    _ => self.parts[i]["text"] = Value::String(delta.to_owned()),
                }
            }
            "text-end" | "reasoning-end" => {
                let part = if kind == "text-end" { "text" } else { "reasoning" };
                let i = self.text_part(part, get_str(chunk, "id").unwrap_or_default());
                self.parts[i]["state"] = json!("done");
            }
            "tool-input-start" => {
                self.tool_part(&call_id, name.as_deref());
            }
            "tool-input-available" => {
                if let Some(i) = self.tool_part(&call_id, name.as_deref()) {
                    self.parts[i]["state"] = json!("input-available");
                    self.parts[i]["input"] = chunk.get("input").cloned().unwrap_or(json!({}));
                }
            }
            "tool-input-error" => {
                if let Some(i) = self.tool_part(&call_id, name.as_deref()) {
                    self.parts[i]["state"] = json!("output-error");
                    self.parts[i]["input"] = chunk.get("input").cloned().unwrap_or(Value::Null);
                    self.parts[i]["errorText"] = chunk.get("errorText").cloned().unwrap_or(json!(""));
                }
            }
            "tool-output-available" => {
                if let Some(i) = self.tool_part(&call_id, None) {
                    self.parts[i]["state"] = json!("output-available");
                    self.parts[i]["output"] = chunk.get("output").cloned().unwrap_or(Value::Null);
                }
            }
            "tool-output-error" => {
                if let Some(i) = self.tool_part(&call_id, None) {
                    self.parts[i]["state"] = json!("output-error");
                    self.parts[i]["errorText"] = chunk.get("errorText").cloned().unwrap_or(json!(""));
                }
            }
            "tool-approval-request" => {
                if let Some(i) = self.tool_part(&call_id, None) {
                    self.parts[i]["state"] = json!("approval-requested");
                    self.parts[i]["approval"] = json!({ "id": chunk.get("approvalId").cloned().unwrap_or(json!("")) });
                }
            }
            "tool-output-denied" => {
                if let Some(i) = self.tool_part(&call_id, None) {
                    self.parts[i]["state"] = json!("output-denied");
                }
            }
            data if data.starts_with("data-") => {
                if chunk.get("transient").and_then(Value::as_bool) == Some(true) {
                    return;
                }
                let mut part = Map::new();
                part.insert("type".into(), json!(data));
                if let Some(id) = chunk.get("id") {
                    part.insert("id".into(), id.clone());
                }
                part.insert("data".into(), chunk.get("data").cloned().unwrap_or(Value::Null));
                let existing = chunk.get("id").and_then(|id| {
                    self.parts.iter().position(|p| get_str(p, "type") == Some(data) && p.get("id") == Some(id))
                });
                match existing {
                    Some(i) => self.parts[i] = Value::Object(part),
                    None => self.parts.push(Value::Object(part)),
                }
            }
            _ => {}
        }
    }

    fn merge_metadata(&mut self, extra: Option<&Value>) {
        let Some(Value::Object(extra)) = extra else { return };
        let meta = self.metadata.get_or_insert_with(|| json!({}));
        if let Value::Object(m) = meta {
            for (k, v) in extra {
                m.insert(k.clone(), v.clone());
            }
        }
    }

    /// The message as JSON: `{id, role, parts, metadata?}`. Text still streaming is marked done.
    pub fn message(&self) -> Value {
        let parts: Vec<Value> = self
            .parts
            .iter()
            .map(|p| {
                let mut p = p.clone();
                if get_str(&p, "state") == Some("streaming") {
                    p["state"] = json!("done");
                }
                p
            })
            .collect();
        let mut m = json!({ "id": self.id, "role": self.role, "parts": parts });
        if let Some(meta) = &self.metadata {
            m["metadata"] = meta.clone();
        }
        m
    }
}

/// The text of a `UIMessage`'s text parts, concatenated.
pub fn text_of(message: &Value) -> String {
    message
        .get("parts")
        .and_then(Value::as_array)
        .map(|parts| {
            parts.iter().filter(|p| get_str(p, "type") == Some("text")).filter_map(|p| get_str(p, "text")).collect()
        })
        .unwrap_or_default()
}

/// A user message with one text part.
pub fn user_text(id: impl Into<String>, text: impl Into<String>) -> Value {
    json!({ "id": id.into(), "role": "user", "parts": [{ "type": "text", "text": text.into() }] })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(chunks: &[Value]) -> Value {
        let mut b = MessageBuilder::new("m0");
        for c in chunks {
            b.apply(c);
        }
        b.message()
    }

    #[test]
    fn text_and_tool_parts() {
        let m = build(&[
            json!({"type": "start", "messageId": "msg-1"}),
            json!({"type": "start-step"}),
            json!({"type": "text-start", "id": "t"}),
            json!({"type": "text-delta", "id": "t", "delta": "Hel"}),
            json!({"type": "text-delta", "id": "t", "delta": "lo"}),
            json!({"type": "text-end", "id": "t"}),
            json!({"type": "tool-input-start", "toolCallId": "c1", "toolName": "research"}),
            json!({"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": "{}"}),
            json!({"type": "tool-input-available", "toolCallId": "c1", "toolName": "research", "input": {"query": "x"}}),
            json!({"type": "tool-output-available", "toolCallId": "c1", "output": "done"}),
            json!({"type": "data-agent-progress", "transient": true, "data": {"fraction": 0.5}}),
            json!({"type": "data-agent-milestone", "data": {"name": "m", "sequence": 0}}),
            json!({"type": "finish-step"}),
            json!({"type": "finish", "messageMetadata": {"finishReason": "stop"}}),
        ]);
        assert_eq!(m["id"], "msg-1");
        assert_eq!(m["role"], "assistant");
        let parts = m["parts"].as_array().unwrap();
        assert_eq!(parts[0], json!({"type": "step-start"}));
        assert_eq!(parts[1], json!({"type": "text", "text": "Hello", "state": "done"}));
        assert_eq!(
            parts[2],
            json!({"type": "tool-research", "toolCallId": "c1",
                   "state": "output-available", "input": {"query": "x"}, "output": "done"}),
            "a static tool's part is named by its type, as the AI SDK builds it"
        );
        assert_eq!(parts[3]["type"], "data-agent-milestone", "transient progress is not persisted");
        assert_eq!(parts.len(), 4);
        assert_eq!(m["metadata"], json!({"finishReason": "stop"}));
        assert_eq!(text_of(&m), "Hello");
    }

    #[test]
    fn tolerant_of_missing_starts_and_garbage() {
        let m = build(&[
            json!({"type": "text-delta", "id": "t", "delta": "x"}),
            json!({"type": "tool-output-available", "toolCallId": "unknown", "output": 1}),
            json!({"no": "type"}),
            json!({"type": "tool-input-error", "toolCallId": "c", "toolName": "t", "input": "{bad", "errorText": "bad json"}),
        ]);
        let parts = m["parts"].as_array().unwrap();
        assert_eq!(parts[0]["text"], "x");
        assert_eq!(parts[1]["state"], "output-error");
        assert_eq!(parts.len(), 2);
    }
}
