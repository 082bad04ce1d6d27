//! Randomized robustness tests: every parser that sees outside bytes is fed tens of thousands
//! of random and mutated inputs and must return an error, never panic (a panic in the Worker
//! resets the whole WASM instance). Deterministic: a fixed-seed xorshift generator.

use serde_json::{json, Value};

/// A random JSON value built from the keys and chunk types these parsers look for.
fn random_value(rng: &mut Rng, depth: usize) -> Value {
    const KEYS: &[&str] = &[
        "type",
        "id",
        "role",
        "parts",
        "text",
        "delta",
        "toolCallId",
        "toolName",
        "input",
        "output",
        "state",
        "data",
        "name",
        "query",
        "n",
        "messages",
        "metadata",
        "errorText",
    ];
    const STRINGS: &[&str] = &[
        "text-delta",
        "text-start",
        "text-end",
        "tool-input-available",
        "tool-output-available",
        "start",
        "finish",
        "abort",
        "error",
        "user",
        "assistant",
        "system",
        "tool-research",
        "data-agent-milestone",
        "",
        "é😀",
        "t",
        "m",
    ];
    match if depth == 0 { rng.below(4) } else { rng.below(7) } {
        0 => Value::Null,
        1 => json!(rng.below(3) == 0),
        2 => json!(rng.next() as i64 >> rng.below(64)),
        3 => json!(*rng.pick(STRINGS)),
        4 | 5 => Value::Object(
            (0..rng.below(6)).map(|_| (rng.pick(KEYS).to_string(), random_value(rng, depth - 1))).collect(),
        ),
        _ => Value::Array((0..rng.below(4)).map(|_| random_value(rng, depth - 1)).collect()),
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

const ATOMS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "\\",
    "\n",
    "\r\n",
    " ",
    "data:",
    "data: ",
    "[DONE]",
    "type",
    "rpc",
    "id",
    "method",
    "args",
    "null",
    "true",
    "-1",
    "1e999",
    "0",
    "\"t\"",
    "\"chunk\"",
    "\"end\"",
    "é",
    "😀",
    "東京",
    "%",
    "%2",
    "%ZZ",
    "%F0%9F",
    "/",
    "sub",
    "agents",
    "choices",
    "delta",
    "tool_calls",
    "index",
    "function",
    "arguments",
    "content",
    "finish_reason",
    "text-delta",
    "tool-input-available",
    "toolCallId",
    "{\"a\":",
    "\u{0}",
    "\u{7f}",
    "research ",
    "please ",
    "and",
    " vs ",
];

fn random_text(rng: &mut Rng) -> String {
    let n = rng.below(24);
    (0..n).map(|_| *rng.pick(ATOMS)).collect()
}

/// Valid JSON with a random change: a byte removed, duplicated or swapped.
fn mutated(rng: &mut Rng, base: &str) -> Vec<u8> {
    let mut bytes = base.as_bytes().to_vec();
    for _ in 0..=rng.below(3) {
        if bytes.is_empty() {
            break;
        }
        let i = rng.below(bytes.len());
        match rng.below(3) {
            0 => {
                bytes.remove(i);
            }
            1 => bytes.insert(i, bytes[i]),
            _ => bytes[i] = (rng.next() & 0xff) as u8,
        }
    }
    bytes
}

const ROUNDS: usize = 20_000;

#[test]
fn client_frames_never_panic() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let bases = [
        r#"{"type":"rpc","id":"1","method":"research","args":[["a"]]}"#,
        r#"{"type":"cf_agent_use_chat_request","id":"r","init":{"method":"POST","body":"{\"messages\":[]}"}}"#,
        r#"{"type":"cf_agent_stream_resume_ack","id":"x"}"#,
    ];
    for _ in 0..ROUNDS {
        let text = random_text(&mut rng);
        let _ = crate::protocol::rpc::parse_client_frame(&text);
        let base = rng_pick_owned(&mut rng, &bases);
        let bytes = mutated(&mut rng, base);
        let _ = crate::protocol::rpc::parse_client_frame(&String::from_utf8_lossy(&bytes));
    }
}

fn rng_pick_owned<'a>(rng: &mut Rng, items: &'a [&'a str]) -> &'a str {
    items[rng.below(items.len())]
}

#[test]
fn tail_lines_and_sse_never_panic_at_any_split() {
    let mut rng = Rng(7);
    for _ in 0..ROUNDS {
        let mut stream = Vec::new();
        for _ in 0..rng.below(6) {
            stream.extend(random_text(&mut rng).into_bytes());
            stream.push(if rng.below(2) == 0 { b'\n' } else { 0xff });
        }
        let split = if stream.is_empty() { 0 } else { rng.below(stream.len()) };
        let mut lines = crate::protocol::tail::LineSplitter::default();
        let _ = lines.push(&stream[..split]);
        let _ = lines.push(&stream[split..]);
        let mut sse = crate::llm::sse::SseDecoder::default();
        let _ = sse.push(&stream[..split]);
        let _ = sse.push(&stream[split..]);
        let _ = sse.finish();
    }
}

#[test]
fn provider_streams_never_panic() {
    use crate::llm::EventDecoder;
    let mut rng = Rng(11);
    let bases = [
        r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"t","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}]}"#,
        r#"{"response":"x","tool_calls":[{"name":"t","arguments":{"a":1}}]}"#,
    ];
    for _ in 0..ROUNDS {
        let mut openai = crate::llm::openai::StreamDecoder::default();
        let mut workers = crate::llm::workers_ai::WorkersAiDecoder::default();
        for _ in 0..rng.below(5) {
            let data = if rng.below(2) == 0 {
                random_text(&mut rng)
            } else {
                let base = rng_pick_owned(&mut rng, &bases);
                String::from_utf8_lossy(&mutated(&mut rng, base)).into_owned()
            };
            let _ = openai.feed(&data);
            let _ = workers.feed(&data);
        }
        let _ = openai.end();
        let _ = workers.end();
    }
}

#[test]
fn chunks_messages_schemas_and_paths_never_panic() {
    let mut rng = Rng(23);
    let schema = json!({"type": "object", "properties": {"query": {"type": "string", "minLength": 3},
        "n": {"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/missing"}]}}, "required": ["query"]});
    let bases = [
        r#"{"type":"text-delta","id":"t","delta":"x"}"#,
        r#"{"type":"tool-input-available","toolCallId":"c","toolName":"t","input":{}}"#,
        r#"{"type":"data-agent-milestone","id":"m","data":{"name":"n"}}"#,
        r#"{"query":"abc","n":1}"#,
    ];
    let mut builder = crate::chat::message::MessageBuilder::new("m");
    let mut parsed = 0;
    for round in 0..ROUNDS {
        // Mutated bytes mostly stop being JSON; every other round builds a random value of
        // the right vocabulary instead, so every round feeds the value consumers.
        let value = if round % 2 == 0 {
            let base = rng_pick_owned(&mut rng, &bases);
            serde_json::from_slice::<Value>(&mutated(&mut rng, base)).ok()
        } else {
            Some(random_value(&mut rng, 4))
        };
        if let Some(value) = value {
            parsed += 1;
            builder.apply(&value);
            let _ = crate::schema::validate(&schema, &value);
            let _ = crate::chat::store::validate_message(&value);
            let _ = crate::chat::convert::to_model_messages(None, &[value]);
        }
        let text = random_text(&mut rng);
        let _ = crate::routing::parse_agent_path(&text);
        let _ = crate::routing::percent_decode(&text);
        let _ = crate::llm::offline::topics(&text);
        let _ = crate::llm::offline::asks_for_research(&text);
        let _ = crate::parent::registry::input_preview(&Value::String(text.clone()));
        let _ = crate::types::validate_run_id(&text);
    }
    let _ = builder.message();
    assert!(parsed >= ROUNDS / 2, "the value consumers saw {parsed} of {ROUNDS} rounds");
}

#[test]
fn deeply_nested_json_is_an_error_not_a_stack_overflow() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert!(crate::protocol::rpc::parse_client_frame(&deep).is_err());
    let frame = format!(r#"{{"type":"rpc","id":"1","method":"m","args":{}}}"#, "[".repeat(10_000));
    assert!(crate::protocol::rpc::parse_client_frame(&frame).is_err());
}
