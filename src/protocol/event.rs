//! `agent-tool-event` frames: what a parent tells its clients about child runs.
//!
//! ```text
//! {"type":"agent-tool-event","parentToolCallId"?:string,"sequence":number,"replay"?:true,"event":EVENT}
//! ```
//! A frame's `sequence` is per run and names one frame forever: live, on replay and after a
//! re-attach. The stock client deduplicates on it, so renumbering would drop frames.

use serde::{Deserialize, Serialize};

/// Why a run was sealed `interrupted` (wire spelling in kebab-case).
///
/// ```
/// use agent_tools::InterruptedReason;
///
/// assert_eq!(InterruptedReason::NoProgress.as_str(), "no-progress");
/// assert_eq!(InterruptedReason::parse("budget-exceeded"), Some(InterruptedReason::BudgetExceeded));
/// assert_eq!(InterruptedReason::parse("tired"), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum InterruptedReason {
    /// The child went silent for the whole no-progress window.
    NoProgress,
    /// The re-attach window ran out; the child was torn down.
    WindowExceeded,
    /// The child's stream could not be tailed.
    NotTailable,
    /// Inspecting the child timed out.
    InspectTimeout,
    /// Inspecting the child failed.
    InspectFailed,
    /// Recovery as a whole ran past its deadline.
    RecoveryDeadline,
    /// A detached run used up its budget.
    BudgetExceeded,
}

impl InterruptedReason {
    /// The wire spelling, e.g. `"no-progress"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoProgress => "no-progress",
            Self::WindowExceeded => "window-exceeded",
            Self::NotTailable => "not-tailable",
            Self::InspectTimeout => "inspect-timeout",
            Self::InspectFailed => "inspect-failed",
            Self::RecoveryDeadline => "recovery-deadline",
            Self::BudgetExceeded => "budget-exceeded",
        }
    }

    /// Parses the wire spelling.
    pub fn parse(s: &str) -> Option<Self> {
        serde_json::from_value(serde_json::Value::String(s.to_owned())).ok()
    }
}

/// One event about one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum AgentToolEvent {
    /// The run exists; always sequence 0.
    #[serde(rename_all = "camelCase")]
    Started {
        /// Run id.
        run_id: String,
        /// Child class name.
        agent_type: String,
        /// Short preview of the input.
        #[serde(skip_serializing_if = "Option::is_none")]
        input_preview: Option<String>,
        /// Sibling order under the parent tool call.
        order: i64,
        /// UI metadata (`{name?, icon?, ...}`).
        #[serde(skip_serializing_if = "Option::is_none")]
        display: Option<serde_json::Value>,
    },
    /// One AI SDK `UIMessageChunk` of the child's stream, as a JSON string.
    #[serde(rename_all = "camelCase")]
    Chunk {
        /// Run id.
        run_id: String,
        /// The chunk, serialized.
        body: String,
    },
    /// The run completed.
    #[serde(rename_all = "camelCase")]
    Finished {
        /// Run id.
        run_id: String,
        /// The child's summary.
        summary: String,
    },
    /// The run failed.
    #[serde(rename_all = "camelCase")]
    Error {
        /// Run id.
        run_id: String,
        /// What went wrong.
        error: String,
    },
    /// The run was cancelled.
    #[serde(rename_all = "camelCase")]
    Aborted {
        /// Run id.
        run_id: String,
        /// Why, if given.
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// The parent stopped waiting without a logical outcome.
    #[serde(rename_all = "camelCase")]
    Interrupted {
        /// Run id.
        run_id: String,
        /// Human-readable cause.
        error: String,
        /// Machine-readable cause.
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<InterruptedReason>,
        /// Whether the child was still working when the parent stopped waiting.
        #[serde(skip_serializing_if = "Option::is_none")]
        child_still_running: Option<bool>,
    },
    /// An event kept as it was first sent (a soft terminal a later one replaced), sent again
    /// byte for byte. Kept as its JSON text, not parsed back into its variant: the derived parse
    /// of this internally tagged enum is ≈ 25 KB of the Worker, for a frame only replay reads.
    #[serde(untagged)]
    Stored(StoredEvent),
}

/// The JSON text of an event as it was first sent.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StoredEvent(Box<serde_json::value::RawValue>);

impl StoredEvent {
    /// The event `text` is, if it is JSON.
    pub fn new(text: String) -> Option<Self> {
        serde_json::value::RawValue::from_string(text).ok().map(Self)
    }
}

impl PartialEq for StoredEvent {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get()
    }
}

impl AgentToolEvent {
    /// The run this event is about.
    #[cfg(test)]
    pub fn run_id(&self) -> String {
        match self {
            Self::Started { run_id, .. }
            | Self::Chunk { run_id, .. }
            | Self::Finished { run_id, .. }
            | Self::Error { run_id, .. }
            | Self::Aborted { run_id, .. }
            | Self::Interrupted { run_id, .. } => run_id.clone(),
            Self::Stored(event) => serde_json::from_str::<serde_json::Value>(event.0.get())
                .ok()
                .and_then(|e| e.get("runId")?.as_str().map(str::to_owned))
                .unwrap_or_default(),
        }
    }
}

/// The whole frame as it goes over the parent's WebSocket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventFrame {
    /// Always `"agent-tool-event"`.
    #[serde(rename = "type")]
    pub kind: FrameType,
    /// The parent tool call that spawned the run, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_tool_call_id: Option<String>,
    /// Per-run frame number; see the module docs.
    pub sequence: i64,
    /// Present (and `true`) on frames sent by replay.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay: Option<bool>,
    /// The event.
    pub event: AgentToolEvent,
}

/// The constant `type` tag of an [`EventFrame`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum FrameType {
    /// `"agent-tool-event"`.
    #[default]
    #[serde(rename = "agent-tool-event")]
    AgentToolEvent,
}

impl EventFrame {
    /// A live frame.
    pub fn new(parent_tool_call_id: Option<String>, sequence: i64, event: AgentToolEvent) -> Self {
        Self { kind: FrameType::AgentToolEvent, parent_tool_call_id, sequence, replay: None, event }
    }

    /// A chunk frame of run `run_id`.
    pub fn chunk(parent_tool_call_id: Option<String>, sequence: i64, run_id: &str, body: String) -> Self {
        Self::new(parent_tool_call_id, sequence, AgentToolEvent::Chunk { run_id: run_id.to_owned(), body })
    }

    /// The same frame marked as replayed.
    pub fn replayed(mut self) -> Self {
        self.replay = Some(true);
        self
    }

    /// Serializes the frame (infallible for these types).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored event is its text: the same text is the same event, another text another (a
    /// replayed frame compares equal to the one sent only when it is byte for byte the same).
    #[test]
    fn stored_events_are_equal_by_their_text() {
        let event = |text: &str| StoredEvent::new(text.to_owned()).expect("JSON");
        assert_eq!(event(r#"{"kind":"started","runId":"r"}"#), event(r#"{"kind":"started","runId":"r"}"#));
        assert_ne!(event(r#"{"kind":"started","runId":"r"}"#), event(r#"{"kind":"started","runId":"s"}"#));
        assert_ne!(event(r#"{"a":1,"b":2}"#), event(r#"{"b":2,"a":1}"#), "by text, not by value");
        assert!(StoredEvent::new("not json".into()).is_none());
    }

    #[test]
    fn frames_match_the_typescript_wire_shape() {
        // parity: 16, 27
        let started = EventFrame::new(
            Some("call_1".into()),
            0,
            AgentToolEvent::Started {
                run_id: "r1".into(),
                agent_type: "Researcher".into(),
                input_preview: Some("HTTP/3".into()),
                order: 1,
                display: None,
            },
        );
        assert_eq!(
            started.to_json(),
            r#"{"type":"agent-tool-event","parentToolCallId":"call_1","sequence":0,"event":{"kind":"started","runId":"r1","agentType":"Researcher","inputPreview":"HTTP/3","order":1}}"#
        );
        let interrupted = EventFrame::new(
            None,
            7,
            AgentToolEvent::Interrupted {
                run_id: "r1".into(),
                error: "gone".into(),
                reason: Some(InterruptedReason::NoProgress),
                child_still_running: Some(true),
            },
        )
        .replayed();
        assert_eq!(
            interrupted.to_json(),
            r#"{"type":"agent-tool-event","sequence":7,"replay":true,"event":{"kind":"interrupted","runId":"r1","error":"gone","reason":"no-progress","childStillRunning":true}}"#
        );
    }

    #[test]
    fn reasons_round_trip() {
        // parity: 23
        for r in [
            InterruptedReason::NoProgress,
            InterruptedReason::WindowExceeded,
            InterruptedReason::NotTailable,
            InterruptedReason::InspectTimeout,
            InterruptedReason::InspectFailed,
            InterruptedReason::RecoveryDeadline,
            InterruptedReason::BudgetExceeded,
        ] {
            assert_eq!(InterruptedReason::parse(r.as_str()), Some(r));
        }
        assert_eq!(InterruptedReason::parse("nope"), None);
    }
}
