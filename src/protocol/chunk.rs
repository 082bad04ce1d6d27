//! AI SDK `UIMessageChunk` bodies (the `ai` package's UI message stream), built and classified.
//!
//! Bodies travel as JSON strings. The chat turn builds its chunks where it emits them
//! (`chat::turn`); these helpers build the agent-tool ones: the two reserved data parts and
//! `abort`.

use serde_json::{json, Map, Value};

/// Reserved chunk type for transient progress (`reportProgress` without a milestone).
pub const PROGRESS_PART: &str = "data-agent-progress";
/// Reserved chunk type for a durable milestone.
pub const MILESTONE_PART: &str = "data-agent-milestone";
/// Reserved chunk type that starts a run's new attempt: what came before it in the run's stream
/// is a superseded attempt (a restart cut it short), what comes after it is the run's answer.
pub const SUPERSEDED_PART: &str = "data-agent-superseded";

/// The marker chunk of a new attempt: `{"type":"data-agent-superseded","data":{"attempt":n,"reason":…}}`.
/// A non-transient data part, so every client's run state (live, reconnected or late) gets it
/// at the same place among the parts.
pub fn superseded(attempt: i64, reason: &str) -> String {
    json!({ "type": SUPERSEDED_PART, "data": { "attempt": attempt, "reason": reason } }).to_string()
}

/// `{"type":"abort"}`, with a reason when given.
pub fn abort(reason: Option<&str>) -> String {
    match reason {
        Some(r) => json!({ "type": "abort", "reason": r }).to_string(),
        None => json!({ "type": "abort" }).to_string(),
    }
}

/// A progress report from a child ([`crate::Turn::report_progress`], the TypeScript SDK's
/// `AgentToolProgress`).
///
/// ```
/// use agent_tools::Progress;
///
/// let step = Progress::fraction(0.6).phase("ingesting").message("3 of 5 files");
/// let milestone = Progress::milestone("sources-gathered").data(serde_json::json!({ "sources": 2 }));
/// # let _ = (step, milestone);
/// ```
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Progress {
    /// 0..1, drives a progress bar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<f64>,
    /// Human-readable status line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Coarse phase label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Present: a durable milestone with this name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub milestone: Option<String>,
    /// App-specific payload: live-only for progress unless `persist`, always kept for a
    /// milestone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// Keep `data` with the latest snapshot (the TypeScript SDK's `{ persist: true }`).
    #[serde(skip)]
    pub persist: bool,
}

impl Progress {
    /// A durable milestone named `name`.
    pub fn milestone(name: impl Into<String>) -> Self {
        Self { milestone: Some(name.into()), ..Self::default() }
    }

    /// Transient progress at `fraction` (0..1) of the way.
    pub fn fraction(fraction: f64) -> Self {
        Self { fraction: Some(fraction), ..Self::default() }
    }

    /// Transient progress with this status line and no fraction.
    pub fn status(message: impl Into<String>) -> Self {
        Self { message: Some(message.into()), ..Self::default() }
    }

    /// With this status line.
    pub fn message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }

    /// With this phase label.
    pub fn phase(mut self, phase: impl Into<String>) -> Self {
        self.phase = Some(phase.into());
        self
    }

    /// With this payload.
    pub fn data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    /// Keeps `data` with the snapshot.
    pub fn persist(mut self) -> Self {
        self.persist = true;
        self
    }

    fn wire_fields(&self, into: &mut Map<String, Value>) {
        if let Some(f) = self.fraction {
            into.insert("fraction".into(), json!(f));
        }
        if let Some(m) = &self.message {
            into.insert("message".into(), json!(m));
        }
        if let Some(p) = &self.phase {
            into.insert("phase".into(), json!(p));
        }
        if let Some(d) = &self.data {
            into.insert("data".into(), d.clone());
        }
    }
}

/// The transient progress chunk: `{"type":"data-agent-progress","id","transient":true,"data":{at,..}}`,
/// `at` the child's time (epoch ms) when it was sent.
pub fn progress(id: &str, at: i64, p: &Progress) -> String {
    let mut data = Map::new();
    data.insert("at".into(), json!(at));
    p.wire_fields(&mut data);
    json!({ "type": PROGRESS_PART, "id": id, "transient": true, "data": data }).to_string()
}

/// The durable milestone chunk: `{"type":"data-agent-milestone","data":{name,sequence,at,..}}`.
pub fn milestone(name: &str, sequence: i64, at: i64, p: &Progress) -> String {
    let mut data = Map::new();
    data.insert("name".into(), json!(name));
    data.insert("sequence".into(), json!(sequence));
    data.insert("at".into(), json!(at));
    p.wire_fields(&mut data);
    json!({ "type": MILESTONE_PART, "data": data }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each builder sets its field and only that one, and the chunk carries it: what a turn
    /// reports is what the parent and the clients read.
    #[test]
    fn each_builder_sets_its_field_on_the_wire() {
        let built = [
            (Progress::fraction(0.25), json!({ "at": 1, "fraction": 0.25 })),
            (Progress::status("reading"), json!({ "at": 1, "message": "reading" })),
            (
                Progress::fraction(1.0).message("done").phase("write"),
                json!({ "at": 1, "fraction": 1.0, "message": "done", "phase": "write" }),
            ),
            (Progress::status("x").data(json!({ "n": 2 })), json!({ "at": 1, "message": "x", "data": { "n": 2 } })),
        ];
        for (progress, data) in built {
            let chunk: Value = serde_json::from_str(&super::progress("p", 1, &progress)).unwrap();
            assert_eq!(chunk["data"], data, "{progress:?}");
        }
        let milestone = Progress::milestone("drafted");
        assert_eq!(
            (milestone.milestone.as_deref(), milestone.fraction, milestone.persist),
            (Some("drafted"), None, false)
        );
        assert!(Progress::fraction(0.5).data(json!(1)).persist().persist);
    }

    #[test]
    fn progress_and_milestone_shapes() {
        // parity: 76, 77
        let p = Progress { fraction: Some(0.5), phase: Some("reading".into()), ..Default::default() };
        assert_eq!(
            progress("p1", 41, &p),
            r#"{"data":{"at":41,"fraction":0.5,"phase":"reading"},"id":"p1","transient":true,"type":"data-agent-progress"}"#
        );
        let m = milestone("sources", 0, 42, &Progress::default());
        let v: Value = serde_json::from_str(&m).unwrap();
        assert_eq!(v["type"], MILESTONE_PART);
        assert_eq!(v["data"]["name"], "sources");
        assert_eq!(v["data"]["sequence"], 0);
    }
}

/// Whether a chunk body is one of the engine's own types, which an agent may not emit itself.
pub(crate) fn is_reserved(body: &str) -> bool {
    // Cheap on the hot path: only a body that mentions the prefix is parsed.
    body.contains("\"data-agent-")
        && serde_json::from_str::<Value>(body).ok().is_some_and(|v| {
            v.get("type")
                .and_then(Value::as_str)
                .is_some_and(|t| [PROGRESS_PART, MILESTONE_PART, SUPERSEDED_PART].contains(&t))
        })
}

#[cfg(test)]
mod reserved_tests {
    #[test]
    fn only_the_engines_own_types_are_reserved() {
        assert!(super::is_reserved(r#"{"type":"data-agent-progress","data":{}}"#));
        assert!(super::is_reserved(&super::superseded(1, "restart")));
        assert!(!super::is_reserved(r#"{"type":"data-agent-custom","data":{}}"#));
        assert!(!super::is_reserved(r#"{"type":"text-delta","id":"t","delta":"\"data-agent-progress"}"#));
    }
}
