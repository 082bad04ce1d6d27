//! The child → parent stream: one JSON object per line (NDJSON) on a streamed response body.
//!
//! A tail sends the stored chunks after the parent's cursor, then live chunks as the child
//! produces them, then one `end` line with the outcome. Stored chunks carry their index in the
//! child's log so a parent can resume a tail exactly where it stopped.
//!
//! A chunk's body is written into its line as the JSON it is (`"b":{"type":"text-delta",..}`),
//! not as a string holding that JSON: the child does not escape it and the parent does not
//! unescape it; the parent keeps the text it read. A line whose body is a string (as an
//! earlier version wrote) is read too.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

pub use super::outcome::Outcome;

/// How a chunk travels and is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChunkKind {
    /// An ordinary `UIMessageChunk`, stored in the child's log.
    Stored,
    /// A `data-agent-milestone` chunk: stored, and durable on both sides.
    Milestone,
    /// A transient `data-agent-progress` chunk: not in the log; only the latest counts.
    Progress,
    /// `data-agent-superseded`: the child's turn starts over (a restart cut the previous attempt
    /// short); stored, and the start of the run's current attempt.
    Superseded,
}

impl ChunkKind {
    /// Whether the chunk is kept in the logs (everything but progress).
    pub fn is_stored(self) -> bool {
        self != Self::Progress
    }
}

/// One line of a tail.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "t", rename_all = "lowercase")]
pub enum TailLine {
    /// A chunk. `i` is its index in the child's log (absent for progress).
    Chunk {
        /// Index in the child's log.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        i: Option<i64>,
        /// How it is kept.
        k: ChunkKind,
        /// The `UIMessageChunk` JSON.
        #[serde(serialize_with = "as_json")]
        b: String,
        /// What to keep for replay, when it differs from `b` (progress whose `data` is live-only).
        #[serde(default, skip_serializing_if = "Option::is_none", serialize_with = "as_optional_json")]
        r: Option<String>,
    },
    /// The run ended; the last line.
    End {
        /// The outcome.
        outcome: Outcome,
    },
}

/// A body written into the line as the JSON object it is. Any other text (which no chunk the
/// crate makes is: not an object, not JSON, or spread over lines) goes as a string, so the line
/// stays whole and the text is read back exactly.
fn as_json<S: serde::Serializer>(body: &str, serializer: S) -> Result<S::Ok, S::Error> {
    match serde_json::from_str::<&RawValue>(body) {
        Ok(raw) if body.starts_with('{') && raw.get().len() == body.len() && !body.contains('\n') => {
            raw.serialize(serializer)
        }
        _ => serializer.serialize_str(body),
    }
}

fn as_optional_json<S: serde::Serializer>(body: &Option<String>, serializer: S) -> Result<S::Ok, S::Error> {
    match body {
        Some(body) => as_json(body, serializer),
        None => serializer.serialize_none(),
    }
}

/// A body as it was read: the JSON's own text, or a string's contents.
fn body_text(raw: Box<RawValue>) -> Result<String, serde_json::Error> {
    if raw.get().starts_with('"') {
        return serde_json::from_str(raw.get());
    }
    Ok(Box::<str>::from(raw).into_string())
}

/// A tail line as it is read: every field of either kind, so serde reads it in one pass (an
/// internally tagged enum buffers the whole object first, then reads it again: a third of a
/// parent's parse time on a long run).
#[derive(Deserialize)]
struct RawLine {
    t: RawTag,
    #[serde(default)]
    i: Option<i64>,
    #[serde(default)]
    k: Option<ChunkKind>,
    #[serde(default)]
    b: Option<Box<RawValue>>,
    #[serde(default)]
    r: Option<Box<RawValue>>,
    #[serde(default)]
    outcome: Option<Outcome>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum RawTag {
    Chunk,
    End,
}

impl<'de> Deserialize<'de> for TailLine {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let raw = RawLine::deserialize(deserializer)?;
        match raw.t {
            RawTag::Chunk => Ok(Self::Chunk {
                i: raw.i,
                k: raw.k.ok_or_else(|| D::Error::missing_field("k"))?,
                b: body_text(raw.b.ok_or_else(|| D::Error::missing_field("b"))?).map_err(D::Error::custom)?,
                r: raw.r.map(body_text).transpose().map_err(D::Error::custom)?,
            }),
            RawTag::End => Ok(Self::End { outcome: raw.outcome.ok_or_else(|| D::Error::missing_field("outcome"))? }),
        }
    }
}

impl TailLine {
    /// The line, newline-terminated.
    pub fn to_line(&self) -> String {
        let mut s = serde_json::to_string(self).unwrap_or_default();
        s.push('\n');
        s
    }
}

/// The longest tail line a parent accepts (one chunk, and what replay keeps of it, in one line).
pub const MAX_TAIL_LINE_BYTES: usize = 1 << 20;

/// A tail line past [`MAX_TAIL_LINE_BYTES`]: the stream is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineTooLong;

impl std::fmt::Display for LineTooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the child sent a tail line longer than {} bytes", MAX_TAIL_LINE_BYTES)
    }
}

/// Splits a byte stream into lines, across read boundaries.
#[derive(Debug, Default)]
pub struct LineSplitter {
    pending: Vec<u8>,
}

impl LineSplitter {
    /// Feeds bytes; returns the complete lines they finish, parsed. A line that is not a valid
    /// [`TailLine`] is returned as an error string; a line longer than
    /// [`MAX_TAIL_LINE_BYTES`] (complete or not) fails the whole stream.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<Result<TailLine, String>>, LineTooLong> {
        let mut out = Vec::new();
        let mut rest = bytes;
        // A line begun in an earlier read: completed by the first newline here.
        if !self.pending.is_empty() {
            let Some(pos) = rest.iter().position(|&b| b == b'\n') else {
                self.pending.extend_from_slice(rest);
                return if self.pending.len() > MAX_TAIL_LINE_BYTES { Err(LineTooLong) } else { Ok(out) };
            };
            self.pending.extend_from_slice(&rest[..pos]);
            let line = std::mem::take(&mut self.pending);
            Self::parse(&line, &mut out)?;
            rest = &rest[pos + 1..];
        }
        // The whole lines of this read, parsed where they are (no copy).
        while let Some(pos) = rest.iter().position(|&b| b == b'\n') {
            Self::parse(&rest[..pos], &mut out)?;
            rest = &rest[pos + 1..];
        }
        if rest.len() > MAX_TAIL_LINE_BYTES {
            return Err(LineTooLong);
        }
        self.pending.extend_from_slice(rest);
        Ok(out)
    }

    fn parse(line: &[u8], out: &mut Vec<Result<TailLine, String>>) -> Result<(), LineTooLong> {
        if line.len() > MAX_TAIL_LINE_BYTES {
            return Err(LineTooLong);
        }
        if !line.is_empty() {
            out.push(serde_json::from_slice(line).map_err(|e| e.to_string()));
        }
        Ok(())
    }

    /// Whether bytes are left that did not end in a newline.
    #[cfg(test)]
    pub fn has_partial(&self) -> bool {
        !self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind but progress is kept in the logs; a line too long says the bound.
    #[test]
    fn what_is_stored_and_what_a_long_line_says() {
        let stored: Vec<bool> = [ChunkKind::Stored, ChunkKind::Milestone, ChunkKind::Progress, ChunkKind::Superseded]
            .map(ChunkKind::is_stored)
            .into();
        assert_eq!(stored, [true, true, false, true]);
        assert_eq!(
            LineTooLong.to_string(),
            format!("the child sent a tail line longer than {MAX_TAIL_LINE_BYTES} bytes")
        );
    }

    #[test]
    fn lines_survive_arbitrary_splits() {
        let lines = [
            TailLine::Chunk { i: Some(0), k: ChunkKind::Stored, b: r#"{"type":"start"}"#.into(), r: None },
            TailLine::Chunk {
                i: None,
                k: ChunkKind::Progress,
                b: r#"{"type":"data-agent-progress","data":{"data":1}}"#.into(),
                r: Some(r#"{"type":"data-agent-progress","data":{}}"#.into()),
            },
            TailLine::End { outcome: Outcome::completed("done\nok") },
        ];
        let bytes: String = lines.iter().map(TailLine::to_line).collect();
        for split in 0..bytes.len() {
            let mut s = LineSplitter::default();
            let mut got = s.push(&bytes.as_bytes()[..split]).unwrap();
            got.extend(s.push(&bytes.as_bytes()[split..]).unwrap());
            let got: Vec<TailLine> = got.into_iter().map(Result::unwrap).collect();
            assert_eq!(got, lines);
            assert!(!s.has_partial());
        }
    }

    #[test]
    fn a_line_missing_its_kinds_fields_is_refused_and_unknown_fields_are_ignored() {
        for bad in [
            r#"{"t":"chunk","b":"x"}"#,
            r#"{"t":"chunk","k":"stored"}"#,
            r#"{"t":"end"}"#,
            r#"{"t":"x"}"#,
            r#"{"b":"x"}"#,
        ] {
            assert!(serde_json::from_str::<TailLine>(bad).is_err(), "{bad} must be refused");
        }
        let line: TailLine =
            serde_json::from_str(r#"{"t":"chunk","i":3,"k":"milestone","b":"{}","extra":[1]}"#).unwrap();
        assert_eq!(line, TailLine::Chunk { i: Some(3), k: ChunkKind::Milestone, b: "{}".into(), r: None });
    }

    /// A body that is a JSON object travels as that JSON, unescaped, and comes back as the same
    /// text; any other body travels as a string and comes back exactly; a line from an earlier
    /// version (every body a string) is read as before.
    #[test]
    fn a_chunks_body_travels_as_its_own_json_and_comes_back_as_the_same_text() {
        let object = r#"{"type":"text-delta","delta":"a \"quoted\" word"}"#;
        let line = TailLine::Chunk { i: Some(1), k: ChunkKind::Stored, b: object.into(), r: None }.to_line();
        assert_eq!(line, format!("{{\"t\":\"chunk\",\"i\":1,\"k\":\"stored\",\"b\":{object}}}\n"));
        for body in [object, r#""a string""#, "not json", "{\n}", " {}", "{} ", "[1]"] {
            let sent = TailLine::Chunk { i: None, k: ChunkKind::Progress, b: body.into(), r: Some(body.into()) };
            let read: TailLine = serde_json::from_str(&sent.to_line()).unwrap();
            assert_eq!(read, sent, "{body:?}");
        }
        let earlier = format!(r#"{{"t":"chunk","i":2,"k":"stored","b":{}}}"#, serde_json::to_string(object).unwrap());
        let read: TailLine = serde_json::from_str(&earlier).unwrap();
        assert_eq!(read, TailLine::Chunk { i: Some(2), k: ChunkKind::Stored, b: object.into(), r: None });
    }

    #[test]
    fn a_garbled_line_is_an_error_not_a_panic() {
        let mut s = LineSplitter::default();
        let got = s.push(b"{\"t\":\"chunk\"}\n").unwrap();
        assert!(got[0].is_err());
    }

    #[test]
    fn a_line_past_the_limit_fails_the_stream_before_it_ends() {
        let mut s = LineSplitter::default();
        let half = vec![b'x'; MAX_TAIL_LINE_BYTES / 2 + 1];
        assert!(s.push(&half).unwrap().is_empty());
        assert_eq!(s.push(&half), Err(LineTooLong), "no newline needed: memory stays bounded");
        let mut s = LineSplitter::default();
        let mut whole = vec![b'x'; MAX_TAIL_LINE_BYTES + 1];
        whole.push(b'\n');
        assert_eq!(s.push(&whole), Err(LineTooLong));
    }

    /// The bound is inclusive: a line of exactly `MAX_TAIL_LINE_BYTES` is read, whether it
    /// comes whole, as a read's unfinished tail, or across reads; one byte more is refused
    /// each way.
    #[test]
    fn a_line_of_exactly_the_bound_is_read_and_one_more_byte_is_refused() {
        // A garbled line (an error item, not a refusal) of `len` bytes: only its length matters.
        let line = |len: usize| vec![b'x'; len];
        let newline = |mut v: Vec<u8>| {
            v.push(b'\n');
            v
        };
        let max = MAX_TAIL_LINE_BYTES;
        // Whole, in one read, after a short line.
        let mut read = newline(b"y".to_vec());
        read.extend(newline(line(max)));
        assert_eq!(LineSplitter::default().push(&read).map(|l| l.len()), Ok(2));
        let mut read = newline(b"y".to_vec());
        read.extend(newline(line(max + 1)));
        assert_eq!(LineSplitter::default().push(&read), Err(LineTooLong));
        // As the unfinished rest of a read, then finished by the next.
        let mut s = LineSplitter::default();
        assert_eq!(s.push(&line(max)).map(|l| l.len()), Ok(0));
        assert_eq!(s.push(b"\n").map(|l| l.len()), Ok(1));
        assert_eq!(LineSplitter::default().push(&line(max + 1)), Err(LineTooLong));
        // Across reads: the pending part reaches the bound exactly, then a byte more.
        let mut s = LineSplitter::default();
        assert_eq!(s.push(&line(max / 2)).map(|l| l.len()), Ok(0));
        assert_eq!(s.push(&line(max - max / 2)).map(|l| l.len()), Ok(0));
        assert_eq!(s.push(b"\n").map(|l| l.len()), Ok(1));
        let mut s = LineSplitter::default();
        assert_eq!(s.push(&line(max / 2)).map(|l| l.len()), Ok(0));
        assert_eq!(s.push(&line(max - max / 2 + 1)), Err(LineTooLong));
    }
}
