//! The built-in offline model (see [`OfflineModel`] for what it answers).

use std::time::Duration;

use super::{FinishReason, ModelEvent, ModelMessage, ModelRequest, ToolCall, ToolSpec};

/// The built-in offline model: deterministic text, streamed word by word at a set pace, no
/// network, no keys. It is what the demo and the tests run on; wrap it to build a model of your
/// own.
///
/// The same conversation always yields the same answer, so tests can assert it exactly, and the
/// demo works offline. It behaves like a small tool-using model:
///
/// 1. The last message is the user's, tools are offered, and the user asks for research (the
///    text starts with "research", "compare", "look into" or "find out about", after an
///    optional "please"): it reads **topics** from the rest (split on commas, "and", "vs") and
///    calls the first tool once per topic, all in one step, with `{"query": topic}` (or
///    `topic`/`text`, whichever the tool's schema has).
///    Or the user's message starts with the name of an offered tool (underscores read as
///    spaces: `publish QUIC`, `local time`): it calls that tool once, with the rest of the
///    message as its `query`/`topic`/`text`.
/// 2. The last messages are tool results: it answers with one line per result.
/// 3. Tools are offered but the user did not ask for research (a background run's
///    notification, say): it answers `Noted: ` and the message's first words.
/// 4. No tools (a child): it answers with [`OfflineModel::research_answer`] of the topics (a JSON object's
///    `query`/`topic`/`text`, else the text).
///
/// ```
/// use std::time::Duration;
/// use agent_tools::model::{ModelEvent, ModelMessage, ModelRequest, OfflineModel};
///
/// // Eight words, 20 ms apart when it streams in an agent.
/// let model = OfflineModel { words: 8, delay: Duration::from_millis(20) };
/// let request = ModelRequest::new(vec![ModelMessage::User("HTTP/3".into())], vec![]);
/// let text: String = model
///     .respond(&request)
///     .into_iter()
///     .filter_map(|e| match e {
///         ModelEvent::TextDelta(t) => Some(t),
///         _ => None,
///     })
///     .collect();
/// assert_eq!(text, OfflineModel::research_answer("HTTP/3", 8));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OfflineModel {
    /// Words in an answer.
    pub words: usize,
    /// Pause before each text delta (and each tool call).
    pub delay: Duration,
}

impl Default for OfflineModel {
    fn default() -> Self {
        Self { words: 24, delay: Duration::from_millis(60) }
    }
}

impl OfflineModel {
    /// What the offline model answers a research request about `query` with: `words` words
    /// (at least the lead-in `Findings on <query>:`), ending with a period.
    pub fn research_answer(query: &str, words: usize) -> String {
        research_answer(query, words)
    }

    /// The topics the offline model reads from a user message ("Research HTTP/3 and gRPC" →
    /// `["HTTP/3", "gRPC"]`; a JSON object's `query`, `topic` or `text`).
    pub fn topics(text: &str) -> Vec<String> {
        topics(text)
    }

    /// Every event of one step for `request`, without pauses.
    pub fn respond(&self, request: &ModelRequest) -> Vec<ModelEvent> {
        self.events(request).collect()
    }

    /// The events of [`OfflineModel::respond`], produced as they are taken: a long answer is not
    /// built before its first word goes out (100 000 words would take a while). Its size hint is
    /// exact.
    pub fn events(&self, request: &ModelRequest) -> Box<dyn Iterator<Item = ModelEvent>> {
        respond(request, self.words)
    }
}

const VOCABULARY: &[&str] = &[
    "latency",
    "throughput",
    "streams",
    "handshake",
    "congestion",
    "frames",
    "encryption",
    "multiplexing",
    "servers",
    "clients",
    "retries",
    "caching",
    "ordering",
    "backpressure",
    "deployment",
    "tradeoffs",
    "benchmarks",
    "adoption",
    "tooling",
    "reliability",
    "headers",
    "compression",
    "sessions",
    "routing",
];

/// FNV-1a: a stable hash, so answers never change between builds.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// The answer to a research `query`: `words` words (at least the lead-in), ending with a period.
pub(crate) fn research_answer(query: &str, words: usize) -> String {
    research_deltas(query, words).collect()
}

/// [`deltas`] of [`research_answer`], made one word at a time as they are taken.
fn research_deltas(query: &str, words: usize) -> impl Iterator<Item = String> {
    let topic = query.trim();
    let lead = format!("Findings on {topic}:");
    let more = words.saturating_sub(lead.split_whitespace().count());
    let mut lead = deltas(&lead);
    // The text goes on with " <word>" `more` times, then ".": each delta keeps the space
    // after it.
    if let Some(last) = lead.last_mut() {
        last.push(if more == 0 { '.' } else { ' ' });
    }
    let mut h = fnv1a(topic);
    let rest = (0..more).map(move |n| {
        h = h.rotate_left(13).wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(1);
        let mut word = VOCABULARY[(h % VOCABULARY.len() as u64) as usize].to_owned();
        word.push(if n + 1 == more { '.' } else { ' ' });
        word
    });
    lead.into_iter().chain(rest)
}

/// Splits text into streaming deltas, one word each, whitespace kept with the word before it,
/// so that concatenating the deltas gives the text back exactly.
pub(crate) fn deltas(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut current = String::new();
    let mut in_space = false;
    for c in text.chars() {
        if c.is_whitespace() {
            in_space = true;
        } else if in_space {
            out.push(std::mem::take(&mut current));
            in_space = false;
        }
        current.push(c);
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

const VERBS: [&str; 4] = ["research ", "compare ", "look into ", "find out about "];

/// Whether a user message asks for research (see the module docs).
pub(crate) fn asks_for_research(text: &str) -> bool {
    let mut rest = text.trim();
    if rest.get(..7).is_some_and(|head| head.eq_ignore_ascii_case("please ")) {
        rest = rest[7..].trim_start();
    }
    VERBS.iter().any(|verb| rest.get(..verb.len()).is_some_and(|head| head.eq_ignore_ascii_case(verb)))
}

/// Reads the topics of a user message (see the module docs).
pub(crate) fn topics(text: &str) -> Vec<String> {
    if let Ok(serde_json::Value::Object(o)) = serde_json::from_str::<serde_json::Value>(text) {
        if let Some(q) = ["query", "topic", "text"].iter().find_map(|k| o.get(*k).and_then(|v| v.as_str())) {
            return vec![q.trim().to_owned()];
        }
    }
    let mut rest = text.trim();
    for lead in ["please ", "research ", "compare ", "look into ", "find out about "] {
        if rest.get(..lead.len()).is_some_and(|head| head.eq_ignore_ascii_case(lead)) {
            rest = rest[lead.len()..].trim_start();
        }
    }
    let rest = rest.trim_end_matches(['.', '?', '!']);
    let mut out = vec![rest.to_owned()];
    for sep in [",", " and ", " vs ", " vs. ", " & "] {
        out = out.iter().flat_map(|t| t.split(sep).map(str::to_owned).collect::<Vec<_>>()).collect();
    }
    out.into_iter().map(|t| t.trim().to_owned()).filter(|t| !t.is_empty()).collect()
}

/// The offered tool a user message starts with by name (underscores read as spaces), with the
/// rest of the message.
fn named_tool<'a>(tools: &'a [ToolSpec], text: &'a str) -> Option<(&'a ToolSpec, &'a str)> {
    let text = text.trim();
    tools.iter().find_map(|tool| {
        let name = tool.name.replace('_', " ");
        let head = text.get(..name.len()).filter(|head| head.eq_ignore_ascii_case(&name))?;
        let rest = &text[head.len()..];
        (rest.is_empty() || rest.starts_with(char::is_whitespace)).then(|| (tool, rest.trim()))
    })
}

/// The input of a call about `topic`: as its `query`, `topic` or `text`, else as the one
/// string the schema requires.
fn tool_input(tool: &ToolSpec, topic: &str) -> serde_json::Value {
    let props = tool.input_schema.get("properties");
    let key = ["query", "topic", "text"].into_iter().find(|k| props.and_then(|p| p.get(*k)).is_some());
    let required = tool.input_schema.get("required").and_then(|r| r.as_array()).map_or(&[][..], Vec::as_slice);
    let only = match required {
        [serde_json::Value::String(k)]
            if props.and_then(|p| p.get(k)).and_then(|p| p.get("type")) == Some(&"string".into()) =>
        {
            Some(k.as_str())
        }
        _ => None,
    };
    match key.or(only) {
        Some(k) => serde_json::json!({ k: topic }),
        None => serde_json::json!({}),
    }
}

/// One step of the offline model: every event it streams for `request`. Call ids are
/// `offline_call_<step>_<n>` so they are unique within a conversation.
pub(crate) fn respond(request: &ModelRequest, words: usize) -> Box<dyn Iterator<Item = ModelEvent>> {
    let step = request.messages.iter().filter(|m| matches!(m, ModelMessage::Assistant { .. })).count();
    let last_user = request.messages.iter().rev().find_map(|m| match m {
        ModelMessage::User(t) => Some(t.as_str()),
        _ => None,
    });
    let mut events = Vec::new();
    match request.messages.last() {
        Some(ModelMessage::User(text))
            if !request.tools.is_empty() && asks_for_research(text) && !topics(text).is_empty() =>
        {
            let tool = &request.tools[0];
            for (n, topic) in topics(text).iter().enumerate() {
                let id = format!("offline_call_{step}_{n}");
                let input = tool_input(tool, topic);
                events.push(ModelEvent::ToolCallStart { id: id.clone(), name: tool.name.clone() });
                events.push(ModelEvent::ToolCallDelta { id: id.clone(), delta: input.to_string() });
                events.push(ModelEvent::ToolCallReady(Ok(ToolCall { id, name: tool.name.clone(), input })));
            }
            events.push(ModelEvent::Finish(FinishReason::ToolCalls));
            return Box::new(events.into_iter());
        }
        Some(ModelMessage::Tool { .. }) => {
            let calls: Vec<&ToolCall> = request
                .messages
                .iter()
                .filter_map(|m| match m {
                    ModelMessage::Assistant { tool_calls, .. } => Some(tool_calls.iter()),
                    _ => None,
                })
                .flatten()
                .collect();
            let mut text = String::from("Here is what I found:");
            for m in request
                .messages
                .iter()
                .rev()
                .take_while(|m| matches!(m, ModelMessage::Tool { .. }))
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
            {
                if let ModelMessage::Tool { call_id, output, .. } = m {
                    let label = calls
                        .iter()
                        .find(|c| &c.id == call_id)
                        .and_then(|c| c.input.as_object()?.values().find_map(|v| v.as_str().map(str::to_owned)))
                        .unwrap_or_else(|| call_id.clone());
                    let result = match output {
                        serde_json::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    text.push_str(&format!("\n- {label}: {result}"));
                }
            }
            events.extend(deltas(&text).into_iter().map(ModelEvent::TextDelta));
        }
        Some(ModelMessage::User(text)) if !request.tools.is_empty() => {
            if let Some((tool, rest)) = named_tool(&request.tools, text) {
                let id = format!("offline_call_{step}_0");
                let input = tool_input(tool, rest.trim_end_matches(['.', '?', '!']));
                events.push(ModelEvent::ToolCallStart { id: id.clone(), name: tool.name.clone() });
                events.push(ModelEvent::ToolCallDelta { id: id.clone(), delta: input.to_string() });
                events.push(ModelEvent::ToolCallReady(Ok(ToolCall { id, name: tool.name.clone(), input })));
                events.push(ModelEvent::Finish(FinishReason::ToolCalls));
                return Box::new(events.into_iter());
            }
            let gist: Vec<&str> = text.split_whitespace().take(12).collect();
            events.extend(deltas(&format!("Noted: {}", gist.join(" "))).into_iter().map(ModelEvent::TextDelta));
        }
        _ => {
            let topic = last_user.map(|t| topics(t).join(" and ")).unwrap_or_default();
            let answer = research_deltas(&topic, words).map(ModelEvent::TextDelta);
            return Box::new(answer.chain(std::iter::once(ModelEvent::Finish(FinishReason::Stop))));
        }
    }
    events.push(ModelEvent::Finish(FinishReason::Stop));
    Box::new(events.into_iter())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The answer as it was built before it was made lazily: the text never changes.
    fn eager_answer(query: &str, words: usize) -> String {
        let topic = query.trim();
        let mut out = format!("Findings on {topic}:");
        let lead = out.split_whitespace().count();
        let mut h = fnv1a(topic);
        for _ in lead..words {
            h = h.rotate_left(13).wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(1);
            out.push(' ');
            out.push_str(VOCABULARY[(h % VOCABULARY.len() as u64) as usize]);
        }
        out.push('.');
        out
    }

    #[test]
    fn the_lazy_answer_is_the_eager_one_delta_for_delta() {
        for query in ["QUIC", " HTTP/3 ", "a  b", "", "東京 and ソウル", "x\ny"] {
            for words in [0, 1, 3, 4, 5, 24, 1000] {
                let want = eager_answer(query, words);
                assert_eq!(research_deltas(query, words).collect::<Vec<_>>(), deltas(&want), "{query:?} {words}");
                assert_eq!(research_answer(query, words), want);
                let lazy = research_deltas(query, words);
                assert_eq!(lazy.size_hint(), (deltas(&want).len(), Some(deltas(&want).len())), "exact size hint");
            }
        }
    }

    #[test]
    fn topics_are_read_like_a_person_would() {
        assert_eq!(topics("Research HTTP/3 and gRPC"), vec!["HTTP/3", "gRPC"]);
        assert_eq!(topics("compare Rust, Go and Zig."), vec!["Rust", "Go", "Zig"]);
        assert_eq!(topics("{\n  \"query\": \"WebTransport\"\n}"), vec!["WebTransport"]);
        assert_eq!(topics("QUIC"), vec!["QUIC"]);
        assert!(topics("  ").is_empty());
        // Multi-byte text never splits a character (a panic would reset the whole instance).
        assert_eq!(topics("😀😀 hi"), vec!["😀😀 hi"]);
        assert_eq!(topics("Research 東京 and ソウル"), vec!["東京", "ソウル"]);
        assert_eq!(topics("ré"), vec!["ré"]);
    }

    fn research_tool() -> ToolSpec {
        ToolSpec {
            name: "research".into(),
            description: "d".into(),
            input_schema: json!({"type": "object", "properties": {"query": {"type": "string"}}}),
        }
    }

    #[test]
    fn two_topics_make_two_tool_calls_in_one_step() {
        let req = ModelRequest {
            messages: vec![ModelMessage::User("Research HTTP/3 and gRPC".into())],
            tools: vec![research_tool()],
        };
        let calls: Vec<ToolCall> = respond(&req, 10)
            .filter_map(|e| match e {
                ModelEvent::ToolCallReady(Ok(c)) => Some(c),
                _ => None,
            })
            .collect();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].input, json!({"query": "HTTP/3"}));
        assert_eq!(calls[1].input, json!({"query": "gRPC"}));
        assert_ne!(calls[0].id, calls[1].id);
    }

    #[test]
    fn a_message_that_names_a_tool_calls_it_with_the_rest() {
        let publish =
            ToolSpec::new("publish", "d", json!({"type": "object", "properties": {"query": {"type": "string"}}}));
        let clock = ToolSpec::new("local_time", "d", json!({"type": "object"}));
        let tools = vec![research_tool(), publish, clock];
        let call = |text: &str| {
            let req = ModelRequest { messages: vec![ModelMessage::User(text.into())], tools: tools.clone() };
            respond(&req, 10).find_map(|e| match e {
                ModelEvent::ToolCallReady(Ok(c)) => Some((c.name, c.input)),
                _ => None,
            })
        };
        assert_eq!(call("Publish QUIC."), Some(("publish".into(), json!({"query": "QUIC"}))));
        assert_eq!(call("local time please"), Some(("local_time".into(), json!({}))));
        assert_eq!(call("publisher of note"), None, "a whole word only");
        let review = ToolSpec::new(
            "review",
            "d",
            json!({"type": "object", "properties": {"run_id": {"type": "string"}}, "required": ["run_id"]}),
        );
        let req = ModelRequest { messages: vec![ModelMessage::User("review bg-1".into())], tools: vec![review] };
        let input = respond(&req, 10).find_map(|e| match e {
            ModelEvent::ToolCallReady(Ok(c)) => Some(c.input),
            _ => None,
        });
        assert_eq!(input, Some(json!({"run_id": "bg-1"})), "the one string the schema requires");
        assert_eq!(call("Research QUIC").map(|c| c.0), Some("research".into()), "research first");
    }

    #[test]
    fn only_a_research_request_calls_tools() {
        assert!(asks_for_research("Research HTTP/3"));
        assert!(asks_for_research("please compare A and B"));
        assert!(!asks_for_research("Background run r1 (Researcher) completed: Findings on x"));
        assert!(!asks_for_research("résumé"));
        let req = ModelRequest {
            messages: vec![ModelMessage::User("Background run r1 completed: fine".into())],
            tools: vec![research_tool()],
        };
        let events: Vec<ModelEvent> = respond(&req, 5).collect();
        assert!(events.iter().all(|e| !matches!(e, ModelEvent::ToolCallStart { .. })));
        let text: String = events
            .into_iter()
            .filter_map(|e| match e {
                ModelEvent::TextDelta(t) => Some(t),
                _ => None,
            })
            .collect();
        assert_eq!(text, "Noted: Background run r1 completed: fine");
    }

    #[test]
    fn tool_results_become_the_answer() {
        let call = ToolCall { id: "c".into(), name: "research".into(), input: json!({"query": "QUIC"}) };
        let req = ModelRequest {
            messages: vec![
                ModelMessage::User("Research QUIC".into()),
                ModelMessage::Assistant { text: String::new(), tool_calls: vec![call] },
                ModelMessage::Tool { call_id: "c".into(), name: "research".into(), output: json!("fast") },
            ],
            tools: vec![research_tool()],
        };
        let text: String = respond(&req, 10)
            .filter_map(|e| match e {
                ModelEvent::TextDelta(t) => Some(t),
                _ => None,
            })
            .collect();
        assert_eq!(text, "Here is what I found:\n- QUIC: fast");
    }

    #[test]
    fn without_tools_it_researches_the_text() {
        let req = ModelRequest { messages: vec![ModelMessage::User("{\"query\":\"QUIC\"}".into())], tools: vec![] };
        let text: String = respond(&req, 9)
            .filter_map(|e| match e {
                ModelEvent::TextDelta(t) => Some(t),
                _ => None,
            })
            .collect();
        assert_eq!(text, research_answer("QUIC", 9));
    }

    #[test]
    fn answers_are_deterministic_and_sized() {
        let a = research_answer("HTTP/3", 20);
        assert_eq!(a, research_answer("HTTP/3", 20));
        assert_ne!(a, research_answer("gRPC", 20));
        assert_eq!(a.split_whitespace().count(), 20);
        assert!(a.starts_with("Findings on HTTP/3: "));
        assert!(a.ends_with('.'));
        assert_eq!(research_answer("x", 0), "Findings on x:.");
    }

    #[test]
    fn deltas_concatenate_back() {
        for text in ["one two  three", " lead", "trail ", "", "a"] {
            assert_eq!(deltas(text).concat(), text);
        }
        assert_eq!(deltas("one two three").len(), 3);
    }
}
