//! Structured events of the agent-tool engine: one JSON line each (visible in `wrangler tail`)
//! and a hook ([`crate::Agent::on_observability`]) to subscribe in Rust.
//!
//! ```text
//! {"type":"agent_tool:recovery:row","agent":"Assistant","name":"alice","payload":{...},"timestamp":1700000000000}
//! ```

use std::time::SystemTime;

use serde::Serialize;
use serde_json::Value;

/// What happened.
///
/// ```
/// # use agent_tools::prelude::*;
/// use agent_tools::observability::EventType;
/// # #[derive(Default)] pub struct Assistant;
/// # agent_tools::durable_object!(Assistant, unchecked);
/// # fn main() {}
///
/// impl Agent for Assistant {
///     fn on_observability(&self, event: &ObservabilityEvent) {
///         if event.kind == EventType::RecoveryRow {
///             // Count recovered runs in your own metrics.
///         }
///     }
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub enum EventType {
    /// Recovery started on a fresh instance; payload `{runs}`.
    #[serde(rename = "agent_tool:recovery:begin")]
    RecoveryBegin,
    /// One live run is being recovered; payload `{runId, agentType, status}`.
    #[serde(rename = "agent_tool:recovery:row")]
    RecoveryRow,
    /// The recovery deadline passed; payload `{runId}`.
    #[serde(rename = "agent_tool:recovery:deadline")]
    RecoveryDeadline,
    /// A live child is being followed again; payload `{runId, cursor}`.
    #[serde(rename = "agent_tool:recovery:reattach")]
    RecoveryReattach,
    /// Recovery finished; payload `{runs, finalized, reattached}`.
    #[serde(rename = "agent_tool:recovery:complete")]
    RecoveryComplete,
    /// Recovery of a run failed; payload `{runId, error}`.
    #[serde(rename = "agent_tool:recovery:failed")]
    RecoveryFailed,
    /// Delivering a detached run's completion failed; payload `{runId, error}`.
    #[serde(rename = "agent_tool:detached:delivery_failed")]
    DetachedDeliveryFailed,
    /// A storage statement failed: the decision it belonged to was rolled back as a whole and is
    /// taken again (the run is followed again from what storage holds, the alarm retries the
    /// rest); payload `{runId?, step, error}`.
    #[serde(rename = "agent_tool:storage_failed")]
    StorageFailed,
    /// Many detached runs are live at once; payload `{live}`.
    #[serde(rename = "agent_tool:detached:live_count_warning")]
    DetachedLiveCountWarning,
    /// A child runs a turn again that a restart cut short (recovery policy `rerun`); payload
    /// `{runId, attempt, reason}`.
    #[serde(rename = "agent_tool:recovery:rerun")]
    ChildRerun,
    /// A child sealed a run whose turn a restart cut short, or whose recovery ran away; payload
    /// `{runId, attempt, reason}`, the reason one of `sealed_by_policy` (policy `seal`),
    /// `max_attempts_exceeded`, `recovery_aborted` (`should_keep_recovering` said no) and
    /// `work_budget_exceeded` (`max_recovery_work` passed, live or before a re-run).
    #[serde(rename = "agent_tool:recovery:sealed")]
    ChildSealed,
    /// A late real result repaired a run the parent had stopped waiting for; payload
    /// `{runId, status}`.
    #[serde(rename = "agent_tool:recovery:late_result")]
    LateResult,
    /// A run's outcome was recorded without the chunks the child stored after the parent's
    /// cursor: its stream could not be read to the end (three tries in a row broke off). The
    /// result is the child's; the parent's replay lacks the run's last chunks (the child's own
    /// transcript has them). Payload `{runId, status}`.
    #[serde(rename = "agent_tool:recovery:drain_incomplete")]
    DrainIncomplete,
    /// The agent's alarm ran (recovery, the detached backbone, watches of runs given up on):
    /// payload `{live, outstanding, watched, nextInMs}`: the runs still live, the deliveries
    /// still owed, the runs watched for a late result, and when it fires next (`null`: not
    /// again until new work arms it).
    #[serde(rename = "agent_tool:alarm")]
    Alarm,
    /// Finished runs past the retention policy were cleared; payload `{cleared, maxRuns,
    /// maxAgeMs}`.
    #[serde(rename = "agent_tool:retention")]
    Retention,
    /// The child of a deleted run could not be made to delete its storage after
    /// [`crate::limits::MAX_CHILD_CLEAR_ATTEMPTS`] tries, a minute apart; payload `{runId,
    /// child}`. Its storage stays until it is cleared by hand.
    #[serde(rename = "agent_tool:retention:child_clear_failed")]
    ChildClearFailed,
    /// A chat turn that a restart cut short is continued by this instance; payload
    /// `{requestId, attempt}` (the continuation's number, from 1).
    #[serde(rename = "agent_tool:chat:continue")]
    ChatContinue,
    /// A continued chat turn ended; payload `{requestId, outcome}` (`completed`, `error` with
    /// `error`, or `aborted`).
    #[serde(rename = "agent_tool:chat:continued")]
    ChatContinued,
    /// `report_progress` was called outside a live run and ignored; payload `{runId, why}`.
    #[serde(rename = "agent_tool:progress:ignored")]
    ProgressIgnored,
}

/// One event.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use agent_tools::observability::{EventType, ObservabilityEvent};
/// use serde_json::json;
///
/// let event = ObservabilityEvent::new(
///     EventType::RecoveryRow,
///     "Assistant",
///     "alice",
///     json!({ "runId": "r1" }),
///     UNIX_EPOCH + Duration::from_millis(1_700_000_000_000),
/// );
/// assert_eq!(
///     event.to_line(),
///     r#"{"type":"agent_tool:recovery:row","agent":"Assistant","name":"alice","payload":{"runId":"r1"},"timestamp":1700000000000}"#
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ObservabilityEvent {
    /// What happened.
    #[serde(rename = "type")]
    pub kind: EventType,
    /// The agent class.
    pub agent: String,
    /// The agent instance's name.
    pub name: String,
    /// Details.
    pub payload: Value,
    /// When (in JSON: milliseconds since the Unix epoch).
    #[serde(with = "crate::types::epoch_ms_serde")]
    pub timestamp: SystemTime,
}

impl ObservabilityEvent {
    /// The event `kind` on the agent `agent` named `name`, with its `payload`, at `timestamp`:
    /// for an agent's own tests of [`crate::Agent::on_observability`].
    pub fn new(
        kind: EventType,
        agent: impl Into<String>,
        name: impl Into<String>,
        payload: Value,
        timestamp: SystemTime,
    ) -> Self {
        Self { kind, agent: agent.into(), name: name.into(), payload, timestamp }
    }

    /// The JSON log line.
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_serialize_as_one_line_with_the_sdk_names() {
        let e = ObservabilityEvent {
            kind: EventType::RecoveryRow,
            agent: "Assistant".into(),
            name: "alice".into(),
            payload: serde_json::json!({"runId": "r1"}),
            timestamp: crate::types::time_of(5),
        };
        assert_eq!(
            e.to_line(),
            r#"{"type":"agent_tool:recovery:row","agent":"Assistant","name":"alice","payload":{"runId":"r1"},"timestamp":5}"#
        );
    }
}
