//! `UIMessage`s (what clients and the store hold) to [`ModelMessage`]s (what a model is sent).
//!
//! An assistant message is split into its steps at `step-start` parts: each step becomes one
//! assistant message with its text and tool calls, followed by one tool message per call. A call
//! without a result gets an error result, because providers refuse a call left unanswered.

use serde_json::Value;

use crate::chat::journal::ToolResult;
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

/// The tool's name of a tool part (`tool-<name>`, or a dynamic tool's `toolName`).
pub fn tool_name(part: &Value) -> Option<String> {
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
            Some("assistant") => assistant_message(message, &mut out),
            _ => {}
        }
    }
    out
}

/// What a tool part says of its call's result, if it has one: its output, its error, or the
/// denial of an approval (with its reason).
pub fn part_result(part: &Value, tool: &str) -> Option<ToolResult> {
    match part.get("state").and_then(Value::as_str)? {
        "output-available" => Some(ToolResult::Output(part.get("output").cloned().unwrap_or(Value::Null))),
        "output-error" => Some(ToolResult::Error(
            part.get("errorText").and_then(Value::as_str).unwrap_or("the tool failed").to_owned(),
        )),
        "output-denied" => {
            let reason = part.pointer("/approval/reason").and_then(Value::as_str).unwrap_or_default();
            Some(crate::chat::interaction::denied_result(tool, reason))
        }
        _ => None,
    }
}

/// One model step of an assistant message: its text, its tool calls, and each tool part.
pub struct MessageStep<'a> {
    /// The step's text.
    pub text: String,
    /// Its calls, in order, each with its part.
    pub calls: Vec<(ToolCall, &'a Value)>,
}

/// The model steps of an assistant message (split at `step-start` parts; empty ones left out).
pub fn message_steps(message: &Value) -> Vec<MessageStep<'_>> {
    parts(message)
        .split(|p| p.get("type").and_then(Value::as_str) == Some("step-start"))
        .filter_map(|step| {
            let text = text_parts(step);
            let calls: Vec<(ToolCall, &Value)> = step
                .iter()
                .filter_map(|part| {
                    let name = tool_name(part)?;
                    let id = part.get("toolCallId").and_then(Value::as_str)?;
                    if part.get("state").and_then(Value::as_str) == Some("input-streaming") {
                        return None;
                    }
                    let input = match part.get("input") {
                        Some(v @ Value::Object(_)) => v.clone(),
                        _ => Value::Object(Default::default()),
                    };
                    Some((ToolCall { id: id.to_owned(), name, input }, part))
                })
                .collect();
            (!text.is_empty() || !calls.is_empty()).then_some(MessageStep { text, calls })
        })
        .collect()
}

fn assistant_message(message: &Value, out: &mut Vec<ModelMessage>) {
    for step in message_steps(message) {
        let results = step.calls.iter().map(|(call, part)| {
            let output = part_result(part, &call.name)
                .map_or_else(|| Value::String("Error: the tool call did not complete".into()), |r| r.for_model());
            ModelMessage::Tool { call_id: call.id.clone(), name: call.name.clone(), output }
        });
        let results: Vec<ModelMessage> = results.collect();
        out.push(ModelMessage::Assistant {
            text: step.text,
            tool_calls: step.calls.into_iter().map(|(c, _)| c).collect(),
        });
        out.extend(results);
    }
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
