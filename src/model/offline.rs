//! The built-in offline model: deterministic text, streamed word by word at a set pace.
//!
//! The same prompt always yields the same answer, so tests can assert it exactly, and the demo
//! works with no network and no API keys.

/// How long and how fast the offline model answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OfflinePace {
    /// Words in an answer.
    pub words: usize,
    /// Pause before each text delta, in milliseconds.
    pub delay_ms: u64,
}

impl Default for OfflinePace {
    fn default() -> Self {
        Self { words: 24, delay_ms: 60 }
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
pub fn research_answer(query: &str, words: usize) -> String {
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

/// Splits text into streaming deltas, one word each, whitespace kept with the word before it,
/// so that concatenating the deltas gives the text back exactly.
pub fn deltas(text: &str) -> Vec<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
