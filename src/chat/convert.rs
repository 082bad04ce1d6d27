//! `UIMessage`s (what clients and the store hold) to [`ModelMessage`]s (what a model is sent).
//!
//! An assistant message is split into its steps at `step-start` parts: each step becomes one
//! assistant message with its text and tool calls, followed by one tool message per call. A call
//! without a result gets an error result, because providers refuse a call left unanswered.

use serde_json::Value;

use crate::llm::{ModelMessage, ToolCall};

fn parts(message: &Value) -> &[Value] {
    message.get("parts").and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn text_parts(parts: &[Value]) -> String {
    parts
        .iter()
        .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("")
}

fn tool_name(part: &Value) -> Option<String> {
    if let Some(name) = part.get("toolName").and_then(Value::as_str) {
        return Some(name.to_owned());
    }
    part.get("type")?.as_str()?.strip_prefix("tool-").map(str::to_owned)
}

/// Converts a conversation, prefixed by `system` when given.
pub fn to_model_messages(system: Option<&str>, messages: &[Value]) -> Vec<ModelMessage> {
    let mut out = Vec::new();
    if let Some(system) = system.filter(|s| !s.is_empty()) {
        out.push(ModelMessage::System(system.to_owned()));
    }
    for message in messages {
        // An attempt a restart cut short, answered again by a later one.
        if message.pointer("/metadata/superseded") == Some(&Value::Bool(true)) {
            continue;
        }
        match message.get("role").and_then(Value::as_str) {
            Some("user") => out.push(ModelMessage::User(text_parts(parts(message)))),
            Some("system") => out.push(ModelMessage::System(text_parts(parts(message)))),
            Some("assistant") => {
                for step in parts(message).split(|p| p.get("type").and_then(Value::as_str) == Some("step-start")) {
                    assistant_step(step, &mut out);
                }
            }
            _ => {}
        }
    }
    out
}

fn assistant_step(step: &[Value], out: &mut Vec<ModelMessage>) {
    let text = text_parts(step);
    let mut calls = Vec::new();
    let mut results = Vec::new();
    for part in step {
        let (Some(name), Some(id)) = (tool_name(part), part.get("toolCallId").and_then(Value::as_str)) else {
            continue;
        };
        let state = part.get("state").and_then(Value::as_str).unwrap_or_default();
        if state == "input-streaming" {
            continue;
        }
        let input = match part.get("input") {
            Some(v @ Value::Object(_)) => v.clone(),
            _ => Value::Object(Default::default()),
        };
        calls.push(ToolCall { id: id.to_owned(), name: name.clone(), input });
        let output = match state {
            "output-available" => part.get("output").cloned().unwrap_or(Value::Null),
            "output-error" => Value::String(format!(
                "Error: {}",
                part.get("errorText").and_then(Value::as_str).unwrap_or("the tool failed")
            )),
            "output-denied" => Value::String("Error: the tool call was denied".into()),
            _ => Value::String("Error: the tool call did not complete".into()),
        };
        results.push(ModelMessage::Tool { call_id: id.to_owned(), name, output });
    }
    if text.is_empty() && calls.is_empty() {
        return;
    }
    out.push(ModelMessage::Assistant { text, tool_calls: calls });
    out.extend(results);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn steps_become_assistant_and_tool_messages() {
        let conversation = vec![
            json!({"id": "u", "role": "user", "parts": [{"type": "text", "text": "Research QUIC"}]}),
            json!({"id": "a", "role": "assistant", "parts": [
                {"type": "step-start"},
                {"type": "tool-research", "toolCallId": "c1", "state": "output-available", "input": {"query": "QUIC"}, "output": "fast"},
                {"type": "tool-research", "toolCallId": "c2", "state": "output-error", "input": {"query": "x"}, "errorText": "boom"},
                {"type": "tool-research", "toolCallId": "c3", "state": "input-available", "input": "not an object"},
                {"type": "step-start"},
                {"type": "text", "text": "QUIC is fast", "state": "done"}
            ]}),
        ];
        let got = to_model_messages(Some("be brief"), &conversation);
        assert_eq!(got[0], ModelMessage::System("be brief".into()));
        assert_eq!(got[1], ModelMessage::User("Research QUIC".into()));
        let ModelMessage::Assistant { text, tool_calls } = &got[2] else { panic!("{:?}", got[2]) };
        assert!(text.is_empty());
        assert_eq!(tool_calls.len(), 3);
        assert_eq!(tool_calls[2].input, json!({}), "non-object inputs become {{}}");
        assert_eq!(got[3], ModelMessage::Tool { call_id: "c1".into(), name: "research".into(), output: json!("fast") });
        assert_eq!(
            got[4],
            ModelMessage::Tool { call_id: "c2".into(), name: "research".into(), output: json!("Error: boom") }
        );
        assert!(
            matches!(&got[5], ModelMessage::Tool { output, .. } if output.as_str().unwrap().contains("did not complete"))
        );
        assert_eq!(got[6], ModelMessage::Assistant { text: "QUIC is fast".into(), tool_calls: vec![] });
        assert_eq!(got.len(), 7);
    }
}
