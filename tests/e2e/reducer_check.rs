//! The Rust port of the stock client reducer (`src/testing/reducer.rs`, which the simulation uses
//! as "a stock client") checked against the stock TypeScript code itself (`agents@0.32.0`, run
//! by `tests/node/reducer-check.mjs`): a few thousand seeded frame sequences go through both,
//! and every final state must serialize to the same bytes, with the same fate for every frame.
//!
//! The sequences are mostly what a parent sends (a `started` frame, AI SDK `UIMessageChunk`
//! bodies, progress and milestones, a terminal event, several runs with and without a parent
//! tool call), then disturbed as a network and a reconnecting client disturb them (replays
//! marked `"replay": true`, duplicates, swaps, losses) and salted with frames no server sends
//! (unparseable bodies, odd types), which the port must take exactly as JavaScript does.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};

#[path = "../../src/testing/reducer.rs"]
mod reducer;

use reducer::{Client, Outcome};

/// The seed of every sequence.
const SEED: u64 = 0x5eed_0a11_7001_e7e5;
/// How many sequences.
const CASES: usize = 3000;
/// Where `Date.now()` starts for each case, on both sides (see the node script).
const CLOCK_START: u64 = 1_000_000;

/// A small seeded generator (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True `percent`% of the time.
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())].clone()
    }
}

/// JSON object text with its keys in the given order, as the AI SDK writes chunks (serde_json
/// here sorts keys; the port must keep the order a body has).
fn obj(fields: &[(&str, Value)]) -> String {
    let fields: Vec<String> = fields.iter().map(|(k, v)| format!("{}:{v}", json!(k))).collect();
    format!("{{{}}}", fields.join(","))
}

/// A chunk of a run's stream: its body, and whether it has no stored position (progress and
/// milestone frames reuse the next stored chunk's sequence without consuming it).
struct Chunk {
    body: Value,
    positionless: bool,
    unstored: bool,
}

impl Chunk {
    fn stored(body: String) -> Self {
        Self { body: Value::String(body), positionless: false, unstored: false }
    }

    fn positionless(body: String) -> Self {
        Self { body: Value::String(body), positionless: true, unstored: false }
    }
}

/// Text pieces for deltas: plain words, punctuation, escapes, astral characters.
const WORDS: &[&str] =
    &["Hello", " world", ", ", "HTTP/3", " is", " fast.", "\n", "🔎", "é", "\"quoted\"", "tab\t", "\u{2028}", "", "0"];
/// Tool names.
const TOOLS: &[&str] = &["search", "fetch_page", "calc"];
/// Run ids with which `localeCompare` decides the order (used when orders tie).
const TRICKY_IDS: &[&str] = &[
    "a", "A", "b", "B", "ab", "aB", "Ab", "a-b", "a_b", "a b", "a.b", "run-10", "run-9", "Run-9", "run~", "run$", "0",
    "10", "2", "x\u{1}", "x", "x\u{7f}y", "xy", "[x]", "{x}", "@x", "#x", "%x", "`x", "^x", "+x", "<x", "=x", ">x",
    "|x",
];

/// Builds the frame sequences.
struct Gen {
    rng: Rng,
    /// Ids handed out, to make progress ids unique (or repeat them on purpose).
    next_id: u64,
}

impl Gen {
    fn id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}{:08x}", self.next_id.wrapping_mul(0x9e37_79b9) & 0xffff_ffff)
    }

    fn text(&mut self) -> String {
        (0..1 + self.rng.below(3)).map(|_| self.rng.pick(WORDS)).collect()
    }

    /// A small JSON payload, sometimes with numbers JavaScript prints its own way.
    fn payload(&mut self) -> Value {
        match self.rng.below(9) {
            0 => json!({"temp": self.rng.below(40), "unit": "C"}),
            1 => json!([1, "two", null, {"three": 3.5}]),
            2 => json!("plain"),
            3 => Value::Null,
            4 => json!({
                "big": self.rng.pick(&[1e21, 1e20, 1.2345678901234567e20, 123e25]),
                "small": self.rng.pick(&[1.5e-7, 1e-6, 0.000123, 5e-324]),
                "neg": -0.0,
                "frac": 0.1,
                "int": 9_007_199_254_740_993u64,
            }),
            5 => json!({"10": "ten", "2": "two", "b": 1, "a": {"1": true}}),
            6 => json!({"nested": {"deep": [[[]], {}]}}),
            7 => {
                // Doubles of every magnitude, which both sides must print the same.
                let doubles: Vec<Value> = (0..4)
                    .map(|_| f64::from_bits(self.rng.next()))
                    .filter(|d| d.is_finite())
                    .map(|d| json!(d))
                    .collect();
                json!(doubles)
            }
            _ => json!(self.text()),
        }
    }

    fn provider_metadata(&mut self) -> Value {
        match self.rng.below(10) {
            0 => json!("ab"),
            1 => json!(["x", "y"]),
            2 => json!(7),
            _ => json!({"anthropic": {"signature": self.id("sig-")}}),
        }
    }

    /// A text or reasoning block.
    fn text_block(&mut self, out: &mut Vec<Chunk>, kind: &str) {
        let id = self.id("b-");
        let skip_start = self.rng.chance(10);
        if !skip_start {
            out.push(Chunk::stored(obj(&[("type", json!(format!("{kind}-start"))), ("id", json!(id))])));
        }
        for _ in 0..1 + self.rng.below(5) {
            let mut fields = vec![("type", json!(format!("{kind}-delta"))), ("id", json!(id))];
            match self.rng.below(20) {
                0 => fields.push(("delta", json!(self.rng.below(10)))),
                1 => fields.push(("delta", Value::Null)),
                2 => {}
                3 => fields.push(("delta", json!({"odd": true}))),
                4 => fields.push(("delta", json!(["x", null]))),
                _ => fields.push(("delta", json!(self.text()))),
            }
            if kind == "reasoning" && self.rng.chance(30) {
                fields.push(("providerMetadata", self.provider_metadata()));
            }
            out.push(Chunk::stored(obj(&fields)));
            if self.rng.chance(4) {
                // An emoji split between two deltas, as UTF-16 halves.
                out.push(Chunk::stored(format!(r#"{{"type":"{kind}-delta","id":"{id}","delta":"\ud83d"}}"#)));
                out.push(Chunk::stored(format!(r#"{{"type":"{kind}-delta","id":"{id}","delta":"\ude00!"}}"#)));
            }
        }
        if self.rng.chance(85) {
            let mut fields = vec![("type", json!(format!("{kind}-end"))), ("id", json!(id))];
            if kind == "reasoning" && self.rng.chance(40) {
                fields.push(("providerMetadata", self.provider_metadata()));
            }
            out.push(Chunk::stored(obj(&fields)));
        }
    }

    /// A tool input, maybe an approval, and an outcome.
    fn tool_block(&mut self, out: &mut Vec<Chunk>, call_ids: &mut Vec<Value>) {
        let call_id = if !call_ids.is_empty() && self.rng.chance(15) {
            self.rng.pick(call_ids)
        } else if self.rng.chance(3) {
            json!(self.rng.below(3))
        } else {
            json!(self.id("call-"))
        };
        call_ids.push(call_id.clone());
        let name = self.rng.pick(TOOLS);
        let streamed = self.rng.chance(70);
        if streamed {
            let mut fields = vec![("type", json!("tool-input-start")), ("toolCallId", call_id.clone())];
            if !self.rng.chance(3) {
                fields.push(("toolName", json!(name)));
            }
            if self.rng.chance(20) {
                fields.push(("providerExecuted", json!(self.rng.chance(50))));
            }
            if self.rng.chance(15) {
                fields.push(("providerMetadata", self.provider_metadata()));
            }
            if self.rng.chance(15) {
                fields.push(("title", json!("Searching")));
            }
            out.push(Chunk::stored(obj(&fields)));
            for piece in ["{\"q\":", "\"http", "/3\"}"].iter().take(self.rng.below(4)) {
                let mut fields = vec![
                    ("type", json!("tool-input-delta")),
                    ("toolCallId", call_id.clone()),
                    ("inputTextDelta", json!(piece)),
                ];
                if self.rng.chance(20) {
                    fields.push(("input", json!({"q": "partial"})));
                }
                out.push(Chunk::stored(obj(&fields)));
            }
        }
        let input = match self.rng.below(12) {
            0 => json!("{\"q\":\"as a string\"}"),
            1 => json!(" \u{a0}{\"q\":1}"),
            2 => json!("[1,2]"),
            3 => Value::Null,
            4 => json!([{"q": 1}]),
            5 => json!("{broken"),
            _ => json!({"q": "http/3", "n": self.rng.below(5)}),
        };
        let mut fields = vec![("type", json!("tool-input-available")), ("toolCallId", call_id.clone())];
        fields.push(("toolName", json!(name)));
        if !self.rng.chance(5) {
            fields.push(("input", input.clone()));
        }
        if self.rng.chance(10) {
            fields.push(("providerExecuted", json!(true)));
        }
        let approval = self.rng.chance(20);
        if self.rng.chance(15) {
            let error =
                [("type", json!("tool-input-error")), ("toolCallId", call_id.clone()), ("toolName", json!(name))];
            let mut error = error.to_vec();
            error.push(("input", input));
            error.push(("errorText", json!("invalid input")));
            out.push(Chunk::stored(obj(&error)));
        } else if approval && self.rng.chance(50) {
            // The approval request before the input (a late tool-input-available).
            out.push(Chunk::stored(obj(&[
                ("type", json!("tool-approval-request")),
                ("approvalId", json!(self.id("ap-"))),
                ("toolCallId", call_id.clone()),
            ])));
            out.push(Chunk::stored(obj(&fields)));
        } else {
            out.push(Chunk::stored(obj(&fields)));
            if approval {
                let mut request = vec![
                    ("type", json!("tool-approval-request")),
                    ("approvalId", json!(self.id("ap-"))),
                    ("toolCallId", call_id.clone()),
                ];
                if self.rng.chance(50) {
                    request.push(("approvalDescriptor", json!({"summary": "Allow?"})));
                }
                out.push(Chunk::stored(obj(&request)));
                if self.rng.chance(40) {
                    out.push(Chunk::stored(obj(&[
                        ("type", json!("tool-output-denied")),
                        ("toolCallId", call_id.clone()),
                    ])));
                }
            }
        }
        match self.rng.below(10) {
            0..=5 => {
                if self.rng.chance(20) {
                    out.push(Chunk::stored(obj(&[
                        ("type", json!("tool-output-available")),
                        ("toolCallId", call_id.clone()),
                        ("output", json!({"partial": true})),
                        ("preliminary", json!(true)),
                    ])));
                }
                let mut fields = vec![("type", json!("tool-output-available")), ("toolCallId", call_id.clone())];
                if !self.rng.chance(5) {
                    fields.push(("output", self.payload()));
                }
                out.push(Chunk::stored(obj(&fields)));
            }
            6 | 7 => out.push(Chunk::stored(obj(&[
                ("type", json!("tool-output-error")),
                ("toolCallId", call_id.clone()),
                ("errorText", json!("boom")),
            ]))),
            8 => out.push(Chunk::stored(obj(&[("type", json!("tool-output-denied")), ("toolCallId", call_id)]))),
            _ => {}
        }
    }

    /// A developer data part, or the reserved progress and milestone parts.
    fn data_block(
        &mut self,
        out: &mut Vec<Chunk>,
        data_ids: &mut Vec<String>,
        progress_ids: &mut Vec<String>,
        milestone: &mut u64,
    ) {
        match self.rng.below(10) {
            0..=3 => {
                let kind = self.rng.pick(&["data-weather", "data-notes"]);
                let mut fields = vec![("type", json!(kind))];
                if self.rng.chance(60) {
                    let id = if !data_ids.is_empty() && self.rng.chance(50) {
                        self.rng.pick(data_ids)
                    } else {
                        self.id("d-")
                    };
                    data_ids.push(id.clone());
                    fields.push(("id", json!(id)));
                } else if self.rng.chance(10) {
                    fields.push(("id", json!(self.rng.below(2))));
                }
                if !self.rng.chance(5) {
                    fields.push(("data", self.payload()));
                }
                if self.rng.chance(20) {
                    fields.push(("transient", json!(self.rng.chance(70))));
                }
                out.push(Chunk::stored(obj(&fields)));
            }
            4..=6 => {
                let id = if !progress_ids.is_empty() && self.rng.chance(10) {
                    self.rng.pick(progress_ids)
                } else {
                    self.id("p-")
                };
                progress_ids.push(id.clone());
                let mut data = vec![("fraction", json!(self.rng.below(11) as f64 / 10.0))];
                if self.rng.chance(60) {
                    data.push(("message", json!(self.text())));
                }
                if self.rng.chance(40) {
                    data.push(("phase", json!(self.rng.pick(&["search", "read", "write"]))));
                }
                if self.rng.chance(20) {
                    data.push(("data", self.payload()));
                }
                let data: serde_json::Map<String, Value> = data.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
                let mut fields = vec![("type", json!("data-agent-progress"))];
                if !self.rng.chance(10) {
                    fields.push(("id", json!(id)));
                }
                fields.push(("transient", json!(true)));
                fields.push(("data", Value::Object(data)));
                out.push(Chunk::positionless(obj(&fields)));
            }
            _ => {
                if !self.rng.chance(15) {
                    *milestone += 1;
                }
                let mut data = serde_json::Map::new();
                if !self.rng.chance(5) {
                    data.insert("name".into(), json!(self.rng.pick(&["sources-gathered", "draft", "review"])));
                }
                if !self.rng.chance(5) {
                    data.insert("sequence".into(), json!(*milestone));
                }
                if !self.rng.chance(10) {
                    data.insert("at".into(), json!(CLOCK_START + self.rng.below(80) as u64));
                }
                if self.rng.chance(40) {
                    data.insert("fraction".into(), json!(0.5));
                }
                if self.rng.chance(40) {
                    data.insert("message".into(), json!(self.text()));
                }
                if self.rng.chance(20) {
                    data.insert("phase".into(), json!("review"));
                }
                if self.rng.chance(20) {
                    data.insert("data".into(), self.payload());
                }
                out.push(Chunk::positionless(obj(&[
                    ("type", json!("data-agent-milestone")),
                    ("data", Value::Object(data)),
                ])));
            }
        }
    }

    /// Chunks no well-behaved stream has (some in pairs that must meet).
    fn odd_chunks(&mut self, out: &mut Vec<Chunk>) {
        let bodies: &[&str] = self.rng.pick(&[
            &[""],
            &["{not json"],
            &["null"],
            &["5"],
            &["\"text-start\""],
            &["[]"],
            &["{}"],
            &[r#"{"type":5}"#],
            &[r#"{"type":null}"#],
            &[r#"{"type":""}"#],
            &[r#"{"type":"custom-thing"}"#],
            &[r#"{"type":"text-delta","delta":"a","delta":"b"}"#],
            &[concat!(
                r#"{"type":"data-stats","id":"s","data":{"b":1e400,"a":-0,"10":5e-324,"#,
                r#""2":123456789012345678901234567890,"x":1.7976931348623157e308}}"#
            )],
            &[r#"{"type":"data-agent-progress","data":{"fraction":"half"}}"#],
            &[r#"{"type":"data-agent-milestone","data":null}"#],
            &[r#"{"type":"data-agent-milestone","data":{"name":"inf","sequence":1e400,"at":1e400}}"#],
            &[
                r#"{"type":"data-agent-milestone","data":{"name":"zero","sequence":0,"at":1000004}}"#,
                r#"{"type":"data-agent-milestone","data":{"name":"minus-zero","sequence":-0,"at":1000005}}"#,
            ],
            &[r#"{"type":"data-n","id":0,"data":"zero"}"#, r#"{"type":"data-n","id":-0,"data":"minus zero"}"#],
            &[r#"{"type":"data-n","id":[],"data":1}"#, r#"{"type":"data-n","id":[],"data":2}"#],
            &[
                r#"{"type":"text-delta","delta":2}"#,
                r#"{"type":"text-delta","delta":3.5}"#,
                r#"{"type":"text-delta","delta":true}"#,
            ],
            &[r#"{"type":"tool-input-start","toolCallId":"inf","toolName":1e400}"#],
            &[r#"["data-agent-progress"]"#],
            &[r#"{"type":"text-delta","id":"t","delta":"\ud800"}"#],
            &["{\"type\":\"text-delta\",\"delta\":\"x\"} "],
            &["\u{feff}{\"type\":\"text-start\"}"],
            &[r#"{"type":"reasoning-delta","delta":"r","providerMetadata":"ab"}"#],
            &[r#"{"type":"tool-input-start","toolCallId":{"o":1},"toolName":["a",null]}"#],
            &[r#"{"type":"tool-output-available","toolCallId":""}"#],
            &[r#"{"__proto__":{"type":"text-start"},"type":"data-proto","data":{"__proto__":1}}"#],
            &[r#"{"type":"step-start"}"#],
            &[r#"{"type":"file","mediaType":"image/png","url":"data:,"}"#],
            &[r#"{"type":"source-url","sourceId":"s1","url":"https://example.com"}"#],
            &[r#"{"type":"source-document","sourceId":"s2","mediaType":"text/plain","title":"Doc"}"#],
            &[r#"{"type":"message-metadata","messageMetadata":{"a":1}}"#],
        ]);
        out.extend(bodies.iter().map(|body| Chunk::stored((*body).to_owned())));
    }

    /// A run's stream.
    fn stream(&mut self) -> Vec<Chunk> {
        let mut out = Vec::new();
        let (mut call_ids, mut data_ids, mut progress_ids, mut milestone) = (Vec::new(), Vec::new(), Vec::new(), 0);
        if self.rng.chance(80) {
            out.push(Chunk::stored(obj(&[("type", json!("start")), ("messageId", json!(self.id("m-")))])));
        }
        for _ in 0..1 + self.rng.below(4) {
            out.push(Chunk::stored(obj(&[("type", json!("start-step"))])));
            for _ in 0..1 + self.rng.below(4) {
                match self.rng.below(12) {
                    0..=3 => self.text_block(&mut out, "text"),
                    4 => self.text_block(&mut out, "reasoning"),
                    5 | 6 => self.tool_block(&mut out, &mut call_ids),
                    7..=9 => self.data_block(&mut out, &mut data_ids, &mut progress_ids, &mut milestone),
                    _ => self.odd_chunks(&mut out),
                }
            }
            out.push(Chunk::stored(obj(&[("type", json!("finish-step"))])));
        }
        match self.rng.below(10) {
            0 => out.push(Chunk::stored(obj(&[("type", json!("abort")), ("reason", json!("user"))]))),
            1 => out.push(Chunk::stored(obj(&[("type", json!("error")), ("errorText", json!("model failed"))]))),
            _ => out.push(Chunk::stored(obj(&[("type", json!("finish")), ("finishReason", json!("stop"))]))),
        }
        for chunk in &mut out {
            if !chunk.positionless && self.rng.chance(2) {
                chunk.unstored = true;
            }
        }
        out
    }

    fn run_id(&mut self, index: usize) -> Value {
        match self.rng.below(100) {
            0..=14 => json!(self.rng.pick(TRICKY_IDS)),
            15 => json!(self.rng.pick(&["constructor", "__proto__", "toString", "hasOwnProperty"])),
            16 => json!(7),
            17 => json!("7"),
            _ => json!(format!("run-{index}-{}", self.id(""))),
        }
    }

    fn parent_tool_call_id(&mut self) -> Option<Value> {
        match self.rng.below(100) {
            0..=34 => None,
            35 => Some(json!("")),
            36 => Some(json!(0)),
            37 => Some(json!(3)),
            38 => Some(json!("12")),
            39 => Some(json!(self.rng.pick(&["__proto__", "valueOf"]))),
            40 => Some(Value::Null),
            _ => Some(json!(self.rng.pick(&["call_1", "call_2", "call_3"]))),
        }
    }

    fn order(&mut self, index: usize) -> Option<Value> {
        match self.rng.below(100) {
            0..=39 => Some(json!(index)),
            40..=79 => Some(json!(self.rng.below(2))),
            80 => None,
            81 => Some(json!("1")),
            82 => Some(json!(1.5)),
            83 => Some(Value::Null),
            84 => Some(json!([1])),
            85 => Some(json!({"o": 1})),
            86 => Some(json!("abc")),
            87 => Some(json!(-1)),
            88 => Some(json!(" 0x1 ")),
            _ => Some(json!(0)),
        }
    }

    /// One run's frames in the order its parent sends them.
    fn run_frames(&mut self, index: usize) -> Vec<Value> {
        let run_id = self.run_id(index);
        let parent = self.parent_tool_call_id();
        let frame = |sequence: u64, event: Value| {
            let mut frame = json!({"type": "agent-tool-event", "sequence": sequence, "event": event});
            if let Some(parent) = &parent {
                frame["parentToolCallId"] = parent.clone();
            }
            frame
        };
        let mut frames = Vec::new();
        let mut started = json!({"kind": "started", "runId": run_id, "agentType": "Researcher"});
        if self.rng.chance(80) {
            started["inputPreview"] = json!(self.text());
        }
        if let Some(order) = self.order(index) {
            started["order"] = order;
        }
        if self.rng.chance(50) {
            started["display"] = json!({"name": "Researcher", "icon": "🔎"});
        }
        frames.push(frame(0, started.clone()));
        let mut sequence = 1;
        for chunk in self.stream() {
            let mut event = json!({"kind": "chunk", "runId": run_id, "body": chunk.body});
            if chunk.unstored {
                event["unstoredId"] = json!(self.id("u-"));
            }
            frames.push(frame(sequence, event));
            if !chunk.positionless && !chunk.unstored {
                sequence += 1;
            }
        }
        let terminals = match self.rng.below(100) {
            0..=14 => 0,
            15..=89 => 1,
            _ => 2,
        };
        for _ in 0..terminals {
            let event = match self.rng.below(4) {
                0 => json!({"kind": "finished", "runId": run_id, "summary": self.text()}),
                1 => json!({"kind": "error", "runId": run_id, "error": "child failed"}),
                2 if self.rng.chance(50) => json!({"kind": "aborted", "runId": run_id}),
                2 => json!({"kind": "aborted", "runId": run_id, "reason": "cancelled"}),
                _ => {
                    let mut event = json!({"kind": "interrupted", "runId": run_id, "error": "no progress"});
                    if self.rng.chance(70) {
                        event["reason"] = json!(self.rng.pick(&["no-progress", "window-exceeded", "inspect-timeout"]));
                    }
                    if self.rng.chance(70) {
                        event["childStillRunning"] = json!(self.rng.chance(50));
                    }
                    event
                }
            };
            frames.push(frame(sequence, event));
        }
        if self.rng.chance(5) {
            // A parent that re-announces a run (after a restart).
            frames.push(frame(0, started));
        }
        frames
    }

    /// A frame as a buggy or foreign sender might write it.
    fn mangle(&mut self, frame: &mut Value) {
        if !frame.is_object() || !frame["event"].is_object() {
            return;
        }
        match self.rng.below(14) {
            0 => frame["event"] = Value::Null,
            1 => frame["event"] = json!("started"),
            2 => frame["event"] = json!([1]),
            3 => {
                if let Some(map) = frame.as_object_mut() {
                    map.remove("event");
                }
            }
            4 => frame["event"]["kind"] = json!("paused"),
            5 => frame["event"]["kind"] = json!(1),
            6 => frame["event"]["body"] = json!(5),
            7 => frame["event"]["body"] = json!(["data-agent-progress", "x"]),
            8 => frame["event"]["body"] = json!(["{\"type\":\"text-start\"}"]),
            9 => frame["event"]["body"] = json!({"includes": 1}),
            10 => frame["sequence"] = json!(self.rng.pick(&[json!("3"), json!(2.5), Value::Null, json!([1, 2])])),
            11 => frame["event"]["unstoredId"] = json!(self.rng.pick(&[json!(null), json!(1), json!("u")])),
            12 => frame["event"]["runId"] = json!(self.rng.below(3)),
            _ => {
                if let Some(event) = frame["event"].as_object_mut() {
                    event.remove(if self.rng.chance(50) { "body" } else { "runId" });
                }
            }
        }
    }

    /// Frames that are not `agent-tool-event`s, or barely.
    fn noise(&mut self) -> Value {
        self.rng.pick(&[
            json!({"type": "cf_agent_state", "state": {}}),
            json!({"type": "agent-tool-events"}),
            Value::Null,
            json!(5),
            json!("agent-tool-event"),
            json!([{"type": "agent-tool-event"}]),
            json!({"type": "agent-tool-event"}),
            json!({"type": "agent-tool-event", "event": {}}),
            json!({"type": "agent-tool-event", "event": {"kind": "chunk"}}),
            json!({
                "type": "agent-tool-event",
                "sequence": 1,
                "event": {"kind": "chunk", "runId": "ghost", "body": "{}"},
            }),
            json!({"type": "agent-tool-event", "event": {"kind": "finished", "runId": "ghost", "summary": "?"}}),
        ])
    }

    /// Many runs that only `started` and a terminal event, whose order is mostly a tie: the
    /// sort and `localeCompare` decide.
    fn sort_case(&mut self) -> Vec<Value> {
        let mut frames = Vec::new();
        let parents = [None, Some(json!("call_1")), Some(json!(2))];
        for i in 0..2 + self.rng.below(12) {
            let order = match self.rng.below(10) {
                0..=5 => json!(0),
                6 => json!(self.rng.below(3)),
                _ => self.order(i).unwrap_or(Value::Null),
            };
            let run_id = if self.rng.chance(80) { json!(self.rng.pick(TRICKY_IDS)) } else { self.run_id(i) };
            let mut frame = json!({
                "type": "agent-tool-event",
                "sequence": 0,
                "event": {"kind": "started", "runId": run_id, "agentType": "Researcher", "order": order},
            });
            if let Some(parent) = self.rng.pick(&parents) {
                frame["parentToolCallId"] = parent;
            }
            frames.push(frame.clone());
            if self.rng.chance(30) {
                frame["sequence"] = json!(1);
                frame["event"] = json!({"kind": "finished", "runId": run_id, "summary": "done"});
                frames.push(frame);
            }
        }
        frames
    }

    /// One case: some runs' frames interleaved, then disturbed.
    fn case(&mut self) -> Vec<Value> {
        if self.rng.chance(10) {
            return self.sort_case();
        }
        let mut scripts: Vec<std::collections::VecDeque<Value>> =
            (0..1 + self.rng.below(4)).map(|i| self.run_frames(i).into()).collect();
        let mut frames = Vec::new();
        while !scripts.is_empty() {
            let i = self.rng.below(scripts.len());
            match scripts[i].pop_front() {
                Some(frame) => frames.push(frame),
                None => {
                    scripts.remove(i);
                }
            }
        }
        let replayed = |frame: &Value| {
            let mut frame = frame.clone();
            frame["replay"] = json!(true);
            frame
        };
        // A reconnect: the parent replays everything it stored so far (not progress).
        for _ in 0..[0, 0, 1, 2][self.rng.below(4)] {
            let at = self.rng.below(frames.len() + 1);
            let replay: Vec<Value> = frames[..at]
                .iter()
                .filter(|f| !f["event"]["body"].as_str().is_some_and(|b| b.contains("data-agent-progress")))
                .map(replayed)
                .collect();
            frames.splice(at..at, replay);
        }
        // Single frames delivered twice, swapped with a neighbour, lost.
        let mut i = 0;
        while i < frames.len() {
            if self.rng.chance(5) {
                let copy = replayed(&frames[i]);
                let at = i + 1 + self.rng.below(frames.len() - i);
                frames.insert(at, copy);
            }
            if i + 1 < frames.len() && self.rng.chance(3) {
                frames.swap(i, i + 1);
            }
            if self.rng.chance(2) {
                frames.remove(i);
                continue;
            }
            i += 1;
        }
        if self.rng.chance(10) {
            for _ in 0..1 + self.rng.below(3) {
                let at = self.rng.below(frames.len() + 1);
                let noise = self.noise();
                frames.insert(at, noise);
            }
        }
        if self.rng.chance(15) && !frames.is_empty() {
            let at = self.rng.below(frames.len());
            let mut frame = frames[at].clone();
            self.mangle(&mut frame);
            frames.insert(at, frame);
        }
        frames
    }
}

/// What the node script calls each [`Outcome`].
fn outcome_name(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Ignored => "ignored",
        Outcome::KeyThrew(_) => "key-threw",
        Outcome::Duplicate => "duplicate",
        Outcome::Applied => "applied",
        Outcome::Unchanged => "unchanged",
        Outcome::Threw(_) => "threw",
    }
}

/// A client whose `Date.now()` counts like the node script's.
fn counting_client() -> Client {
    let clock = Arc::new(AtomicU64::new(CLOCK_START));
    Client::with_clock(move || clock.fetch_add(1, Ordering::SeqCst) as f64)
}

/// Runs `input` (JSON lines) through the node script; its output lines.
fn run_node(input: String) -> Vec<String> {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut child = Command::new("node")
        .arg("tests/node/reducer-check.mjs")
        .current_dir(root)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("node runs (Node 20, and `npm install` done in the crate root)");
    let mut stdin = child.stdin.take().expect("node's stdin is piped");
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = child.wait_with_output().expect("node's output");
    writer.join().expect("the writer thread").expect("node reads its input");
    assert!(output.status.success(), "node failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("node prints UTF-8").lines().map(str::to_owned).collect()
}

#[test]
fn the_port_matches_the_stock_reducer_frame_for_frame() {
    let started = std::time::Instant::now();
    let mut gen = Gen { rng: Rng(SEED), next_id: 0 };
    let cases: Vec<Vec<Value>> = (0..CASES).map(|_| gen.case()).collect();
    let input: String =
        cases.iter().enumerate().map(|(n, frames)| format!("{}\n", json!({"case": n, "frames": frames}))).collect();
    let js_lines = run_node(input);
    let node_time = started.elapsed();
    assert_eq!(js_lines.len(), CASES, "node answered every case");

    let mut tally: BTreeMap<&str, usize> = BTreeMap::new();
    let mut mismatches = Vec::new();
    let mut port_time = std::time::Duration::ZERO;
    for (n, (frames, js_line)) in cases.iter().zip(&js_lines).enumerate() {
        let mut client = counting_client();
        let receiving = std::time::Instant::now();
        let outcomes: Vec<&str> = frames.iter().map(|f| outcome_name(&client.receive(f))).collect();
        port_time += receiving.elapsed();
        for outcome in &outcomes {
            *tally.entry(outcome).or_default() += 1;
        }
        let rust_line =
            format!("{{\"case\":{n},\"state\":{},\"outcomes\":{}}}", client.state_string(), json!(outcomes));
        if &rust_line != js_line {
            mismatches.push((n, rust_line));
            continue;
        }
        // The serde view agrees too (where serde can read the line: no lone surrogates).
        if let Ok(js) = serde_json::from_str::<Value>(js_line) {
            if js["state"] != client.state_json() {
                mismatches.push((n, format!("state_json differs: {}", client.state_json())));
            }
        }
    }
    eprintln!(
        "reducer check: {CASES} cases, {} frames: {tally:?} (generation and node {node_time:?}, the port \
         {port_time:?}, in all {:?})",
        tally.values().sum::<usize>(),
        started.elapsed()
    );
    if let Some((n, rust_line)) = mismatches.first() {
        let pretty = |line: &str| {
            serde_json::from_str::<Value>(line)
                .ok()
                .and_then(|v| serde_json::to_string_pretty(&v).ok())
                .unwrap_or_else(|| line.to_owned())
        };
        let js_line = &js_lines[*n];
        let at = rust_line.bytes().zip(js_line.bytes()).take_while(|(a, b)| a == b).count();
        panic!(
            "{} of {CASES} cases differ; the first, case {n}, first differing at byte {at}:\nframes:\n{}\n\
             rust:\n{}\njavascript:\n{}",
            mismatches.len(),
            serde_json::to_string_pretty(&cases[*n]).unwrap_or_default(),
            pretty(rust_line),
            pretty(js_line),
        );
    }
    for outcome in ["ignored", "key-threw", "duplicate", "applied", "unchanged", "threw"] {
        assert!(tally.contains_key(outcome), "the cases exercise the outcome {outcome:?}: {tally:?}");
    }
}
