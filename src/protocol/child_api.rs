//! The parent → child requests (internal: the Worker entry never routes to a child).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::outcome::{Outcome, RunStatus};

/// The host of every internal child URL (the Worker entry never forwards to it).
pub const HOST: &str = "agent-tools.internal";
/// Base of every internal child URL.
pub const BASE: &str = "https://agent-tools.internal/_agent_tools";

/// `POST {BASE}/start`: begin a run (idempotent by run id).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartRequest {
    /// Run id.
    pub run_id: String,
    /// The input, as given to `run_agent_tool`.
    #[serde(default)]
    pub input: Value,
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
