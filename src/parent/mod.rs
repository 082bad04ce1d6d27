//! The parent room: the run registry, dispatch options and results.

pub mod agent_tool;
pub mod detached;
pub mod registry;

use serde::Serialize;
use serde_json::Value;

pub use agent_tool::AgentTool;
pub use registry::{EventDelivery, Inserted, NewRun, Registry, RunRecord, RunStatus, Terminal};

use crate::protocol::InterruptedReason;

/// Options of one dispatch (`run_agent_tool`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunOptions {
    /// The child's input.
    pub input: Value,
    /// Run id; a fresh one when absent. Dispatching a known id never starts a second child.
    pub run_id: Option<String>,
    /// The parent tool call this run belongs to (groups sibling runs in the UI).
    pub parent_tool_call_id: Option<String>,
    /// Sibling order under the tool call (default 0).
    pub display_order: Option<i64>,
    /// Overrides the default input preview.
    pub input_preview: Option<String>,
    /// UI metadata (`{name?, icon?, ...}`).
    pub display: Option<Value>,
    /// Chunk delivery mode.
    pub event_delivery: EventDelivery,
}

/// The outcome of a run, as returned to the dispatcher (and over RPC, in camelCase).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunResult {
    /// Run id.
    pub run_id: String,
    /// Child class name.
    pub agent_type: String,
    /// Final status.
    pub status: RunStatus,
    /// Summary (completed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Structured output (completed, when the child has one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// Error, abort reason or interruption cause.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Interrupted: machine-readable cause.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<InterruptedReason>,
    /// Interrupted: whether the child still runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub child_still_running: Option<bool>,
}

impl RunResult {
    /// The result a registry row records.
    pub fn from_record(r: &RunRecord) -> Self {
        Self {
            run_id: r.run_id.clone(),
            agent_type: r.agent_type.clone(),
            status: r.status,
            summary: r.summary.clone(),
            output: r.output_json.as_deref().and_then(|s| serde_json::from_str(s).ok()),
            error: r.error_message.clone(),
            reason: r.interrupted_reason,
            child_still_running: r.child_still_running,
        }
    }

    /// A dispatch refused before any row was written (bad run id, unknown class, …).
    pub fn refused(run_id: impl Into<String>, agent_type: impl Into<String>, error: impl Into<String>) -> Self {
        Self {
            run_id: run_id.into(),
            agent_type: agent_type.into(),
            status: RunStatus::Error,
            summary: None,
            output: None,
            error: Some(error.into()),
            reason: None,
            child_still_running: None,
        }
    }

    /// What the parent's model sees: the summary on success (a tool with an output schema
    /// sends the validated output instead, see [`AgentTool::result_for_model`]), else the
    /// failure envelope `{"ok":false,"status","error","retryable","reason"?,"childStillRunning"?}`,
    /// where `retryable` is true only for `interrupted`.
    pub fn for_model(&self) -> Value {
        match self.status {
            RunStatus::Completed => Value::String(self.summary.clone().unwrap_or_default()),
            status => {
                let mut failure = serde_json::json!({
                    "ok": false,
                    "status": status,
                    "error": self.error.clone().unwrap_or_else(|| format!("agent tool run {}", status.as_str())),
                    "retryable": status == RunStatus::Interrupted,
                });
                if status == RunStatus::Interrupted {
                    if let Some(reason) = self.reason {
                        failure["reason"] = Value::from(reason.as_str());
                    }
                    if let Some(still) = self.child_still_running {
                        failure["childStillRunning"] = Value::from(still);
                    }
                }
                failure
            }
        }
    }
}

/// What happens to a dispatch when `max_concurrent_agent_tools` runs are already live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Admission {
    /// Refuse it at once with a clear error, writing nothing: a retry of the same run id
    /// succeeds once a slot is free. The default, because a caller (usually a model turn) should
    /// learn about back-pressure rather than wait without bound.
    #[default]
    Reject,
    /// Hold it until a slot frees, then dispatch it (first come, first served).
    Queue,
}

/// Which runs `clear_agent_tool_runs` removes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClearFilter {
    /// Only runs with one of these statuses (all, when `None`).
    pub status: Option<Vec<RunStatus>>,
    /// Only runs started before this time, epoch ms (all, when `None`).
    pub older_than: Option<i64>,
}

/// Checks a caller-supplied run id: 1–256 characters, no control characters.
pub fn validate_run_id(run_id: &str) -> Result<(), String> {
    if run_id.is_empty() {
        return Err("run id must not be empty".into());
    }
    if run_id.chars().count() > 256 {
        return Err("run id must be at most 256 characters".into());
    }
    if run_id.chars().any(char::is_control) {
        return Err("run id must not contain control characters".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn result(status: RunStatus) -> RunResult {
        RunResult { status, ..RunResult::refused("r", "Researcher", "boom") }
    }

    #[test]
    fn the_model_sees_a_summary_output_or_failure_envelope() {
        let mut done = result(RunStatus::Completed);
        done.summary = Some("text".into());
        done.output = Some(json!({"k": 1}));
        assert_eq!(done.for_model(), json!("text"), "the summary, not the output, without an output schema");
        assert_eq!(
            result(RunStatus::Error).for_model(),
            json!({"ok": false, "status": "error", "error": "boom", "retryable": false})
        );
        assert_eq!(result(RunStatus::Aborted).for_model()["retryable"], json!(false));
        let mut interrupted = result(RunStatus::Interrupted);
        interrupted.reason = Some(InterruptedReason::NoProgress);
        interrupted.child_still_running = Some(true);
        assert_eq!(
            interrupted.for_model(),
            json!({"ok": false, "status": "interrupted", "error": "boom", "retryable": true,
                   "reason": "no-progress", "childStillRunning": true})
        );
    }

    #[test]
    fn run_ids_are_checked() {
        assert!(validate_run_id("agent-tool:call_1").is_ok());
        assert!(validate_run_id("").is_err());
        assert!(validate_run_id(&"x".repeat(257)).is_err());
        assert!(validate_run_id("a\nb").is_err());
    }
}
