//! The Workers AI binding's streamed output (`env.AI.run(model, {messages, tools, stream: true})`).
//!
//! Models answer either in the OpenAI chunk shape (`choices[0].delta…`, handled by
//! [`super::openai::StreamDecoder`]) or in Workers AI's own (`{"response": "…"}` deltas, and
//! `tool_calls: [{name, arguments}]`). This decoder accepts both.

use serde_json::Value;

use super::openai::StreamDecoder;
use super::{EventDecoder, FinishReason, InvalidToolCall, ModelError, ModelEvent, ToolCall};

/// Decodes a Workers AI stream.
#[derive(Debug, Default)]
pub struct WorkersAiDecoder {
    openai: StreamDecoder,
    saw_openai: bool,
    calls: Vec<(String, Value)>,
    done: bool,
}

impl EventDecoder for WorkersAiDecoder {
    fn feed(&mut self, data: &str) -> Result<Vec<ModelEvent>, ModelError> {
        if self.done {
            return Ok(Vec::new());
        }
        if data.trim() == "[DONE]" {
            if self.saw_openai {
                self.done = true;
                return self.openai.feed(data);
            }
            return self.end();
        }
        let chunk: Value = serde_json::from_str(data)
            .map_err(|e| ModelError::Protocol(format!("Workers AI event is not JSON ({e})")))?;
        if chunk.get("choices").is_some() {
            self.saw_openai = true;
            return self.openai.feed_chunk(&chunk);
        }
        let mut events = Vec::new();
        if let Some(text) = chunk.get("response").and_then(Value::as_str) {
            if !text.is_empty() {
                events.push(ModelEvent::TextDelta(text.to_owned()));
            }
        }
        if let Some(calls) = chunk.get("tool_calls").and_then(Value::as_array) {
            for call in calls {
                let f = call.get("function").unwrap_or(call);
                let name = f.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
                let args = f.get("arguments").cloned().unwrap_or(Value::Null);
                self.calls.push((name, args));
            }
        }
        Ok(events)
    }

    fn end(&mut self) -> Result<Vec<ModelEvent>, ModelError> {
        if self.done {
            return Ok(Vec::new());
        }
        self.done = true;
        if self.saw_openai {
            return self.openai.end();
        }
        let mut events = Vec::new();
        let has_calls = !self.calls.is_empty();
        for (n, (name, args)) in std::mem::take(&mut self.calls).into_iter().enumerate() {
            let id = format!("workers_ai_call_{n}");
            events.push(ModelEvent::ToolCallStart { id: id.clone(), name: name.clone() });
            let parsed = match args {
                Value::String(raw) => serde_json::from_str::<Value>(&raw).map_err(|e| InvalidToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    raw: raw.clone(),
                    error: e.to_string(),
                }),
                Value::Null => Ok(serde_json::json!({})),
                other => Ok(other),
            };
            events.push(ModelEvent::ToolCallReady(parsed.map(|input| ToolCall { id, name, input })));
        }
        events.push(ModelEvent::Finish(if has_calls { FinishReason::ToolCalls } else { FinishReason::Stop }));
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_shape_text_and_tools() {
        let mut d = WorkersAiDecoder::default();
        let mut events = d.feed(r#"{"response":"Hi"}"#).unwrap();
        events.extend(
            d.feed(r#"{"response":"","tool_calls":[{"name":"research","arguments":{"query":"QUIC"}}]}"#).unwrap(),
        );
        events.extend(d.feed("[DONE]").unwrap());
        assert_eq!(events[0], ModelEvent::TextDelta("Hi".into()));
        assert!(matches!(&events[2], ModelEvent::ToolCallReady(Ok(c)) if c.input["query"] == "QUIC"));
        assert_eq!(events.last(), Some(&ModelEvent::Finish(FinishReason::ToolCalls)));
    }

    #[test]
    fn openai_shape_is_delegated() {
        let mut d = WorkersAiDecoder::default();
        let mut events = d.feed(r#"{"choices":[{"delta":{"content":"x"},"finish_reason":"stop"}]}"#).unwrap();
        events.extend(d.end().unwrap());
        assert_eq!(events, vec![ModelEvent::TextDelta("x".into()), ModelEvent::Finish(FinishReason::Stop)]);
    }

    #[test]
    fn an_openai_shaped_stream_cut_short_is_an_error() {
        let mut d = WorkersAiDecoder::default();
        assert_eq!(
            d.feed(r#"{"choices":[{"delta":{"content":"x"}}]}"#).unwrap(),
            vec![ModelEvent::TextDelta("x".into())]
        );
        assert!(matches!(d.end(), Err(ModelError::Protocol(_))), "no finish reason and no [DONE]");
        let mut done = WorkersAiDecoder::default();
        done.feed(r#"{"choices":[{"delta":{"content":"x"}}]}"#).unwrap();
        assert!(done.feed("[DONE]").is_ok(), "an explicit [DONE] ends the stream");
        assert_eq!(done.end().unwrap(), vec![], "and nothing follows it");
    }
}
