//! The parent → child requests (internal: the Worker entry never routes to a child).

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use super::outcome::{Outcome, RunStatus};

/// The host of every internal child URL (the Worker entry never forwards to it).
pub const HOST: &str = "agent-tools.internal";
/// Base of every internal child URL.
pub const BASE: &str = "https://agent-tools.internal/_agent_tools";

/// A run's input as the JSON text it is written once, when the run is dispatched: that text is
/// what the size limit measures, what the registry row keeps for recovery and what the child's
/// start carries, never serialized again.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RunInput(Box<RawValue>);

impl RunInput {
    /// The input's JSON text.
    pub fn of(value: &Value) -> Self {
        // A `Value` always serializes (its keys are strings); `null` would stand in otherwise.
        Self(serde_json::value::to_raw_value(value).unwrap_or_else(|_| RawValue::NULL.to_owned()))
    }

    /// Stored text back, when it is JSON.
    pub fn from_text(text: String) -> Option<Self> {
        RawValue::from_string(text).ok().map(Self)
    }

    /// The JSON text.
    pub fn as_str(&self) -> &str {
        self.0.get()
    }

    /// The text's length in bytes.
    pub fn len(&self) -> usize {
        self.as_str().len()
    }
}

impl Default for RunInput {
    fn default() -> Self {
        Self(RawValue::NULL.to_owned())
    }
}

impl PartialEq for RunInput {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl From<Value> for RunInput {
    fn from(value: Value) -> Self {
        Self::of(&value)
    }
}

/// `POST {BASE}/start`: begin a run (idempotent by run id).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartRequest {
    /// Run id.
    pub run_id: String,
    /// The input, as given to `run_agent_tool`.
    #[serde(default)]
    pub input: RunInput,
    /// The parent's class.
    pub parent_class: String,
    /// The parent's name.
    pub parent_name: String,
    /// The child's own Durable Object name (`<Parent>/<parent-name>/<run-id>`).
    #[serde(default)]
    pub child_name: String,
    /// `true` for `event_delivery: terminal`.
    #[serde(default)]
    pub terminal_only: bool,
    /// Answer with the run's tail after this log index instead of a [`StartReply`]: the start
    /// and the tail the parent opens next are one round trip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail_after: Option<i64>,
}

/// The child's answer to a start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartReply {
    /// Whether this request created the run (and began its turn).
    pub created: bool,
    /// The run's status now.
    pub status: String,
}

/// `POST {BASE}/cancel`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CancelRequest {
    /// Run id.
    pub run_id: String,
    /// Why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `POST {BASE}/message`: a message the parent sends a running run (its
/// [`crate::Turn::wait_for`] gets it); the first one of a name stays.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageRequest {
    /// Run id.
    pub run_id: String,
    /// The name the run waits for.
    pub name: String,
    /// The message.
    #[serde(default)]
    pub value: Value,
}

/// `GET {BASE}/tail?runId=..&after=..` streams NDJSON [`super::tail::TailLine`]s.
pub fn tail_url(run_id: &str, after: i64) -> String {
    format!("{BASE}/tail?runId={}&after={after}", crate::routing::percent_encode(run_id))
}

/// `GET {BASE}/inspect?runId=..` answers the inspection JSON, or `null` for an unknown run.
pub fn inspect_url(run_id: &str) -> String {
    format!("{BASE}/inspect?runId={}", crate::routing::percent_encode(run_id))
}

/// What the parent reads of a child's inspection (`GET {BASE}/inspect`); `null` on the wire
/// when the child does not know the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InspectionReply {
    /// Where the run stands on the child.
    pub status: RunStatus,
    /// How it ended: present exactly when `status` is not `starting` or `running`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    /// The attempt under way or last made.
    #[serde(default)]
    pub attempt: Option<i64>,
    /// The latest progress the run reported (`{fraction?, message?, phase?, at}`, `at` the
    /// child's time), kept on the child's row: a parent that was away when it was reported
    /// rebuilds the run's snapshot from it.
    #[serde(default)]
    pub progress: Option<Value>,
    /// How many chunks the run's log holds (its indexes run from 0).
    #[serde(default)]
    pub chunk_count: Option<i64>,
}

impl InspectionReply {
    /// A live run's reply (`starting` or `running`), with nothing else known.
    #[cfg(all(test, not(target_arch = "wasm32")))]
    pub fn live(status: RunStatus) -> Self {
        Self { status, outcome: None, attempt: None, progress: None, chunk_count: None }
    }

    /// An ended run's reply.
    #[cfg(all(test, not(target_arch = "wasm32")))]
    pub fn ended(outcome: Outcome) -> Self {
        Self { status: outcome.status(), outcome: Some(outcome), ..Self::live(RunStatus::Running) }
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;

    /// The URLs a parent calls its child at: on the internal host, at the route the child's
    /// router takes, with the run id (any characters) and the cursor read back as they were.
    #[test]
    fn the_tail_and_inspect_urls_carry_the_run_id_to_the_childs_routes() {
        use crate::routing::RequestUrl;
        let run_id = "r 1/&=?é";
        for (url, path, after) in [
            (tail_url(run_id, 41), "/_agent_tools/tail", Some("41")),
            (inspect_url(run_id), "/_agent_tools/inspect", None),
        ] {
            let url = RequestUrl::new(url);
            assert_eq!((url.host(), url.path()), (HOST, path));
            let query: std::collections::HashMap<String, String> = url.query_pairs().collect();
            assert_eq!(query.get("runId").map(String::as_str), Some(run_id), "{query:?}");
            assert_eq!(query.get("after").map(String::as_str), after);
        }
    }

    /// The input is written once: the start request carries the text as it was made (and as
    /// the registry stored it), not a re-serialization; stored text that is not JSON is no input.
    #[test]
    fn a_runs_input_is_one_text_from_dispatch_to_the_childs_start() {
        let stored = RunInput::from_text("{ \"query\" :\t\"HTTP/3\" }".to_owned()).unwrap();
        let start = StartRequest {
            run_id: "r".into(),
            input: stored.clone(),
            parent_class: "P".into(),
            parent_name: "p".into(),
            child_name: "P/p/r".into(),
            terminal_only: false,
            tail_after: None,
        };
        let wire = serde_json::to_string(&start).unwrap();
        assert!(wire.contains("\"input\":{ \"query\" :\t\"HTTP/3\" }"), "{wire}");
        let read: StartRequest = serde_json::from_str(&wire).unwrap();
        assert_eq!(read.input, stored);
        assert_eq!(stored.len(), stored.as_str().len());
        assert_eq!(RunInput::of(&serde_json::json!({"a": [1]})).as_str(), r#"{"a":[1]}"#);
        assert_eq!(RunInput::from_text("not json".into()), None);
        let no_input: StartRequest =
            serde_json::from_str(r#"{"runId":"r","parentClass":"P","parentName":"p"}"#).unwrap();
        assert_eq!(no_input.input.as_str(), "null");
    }
}
