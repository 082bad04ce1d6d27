//! Where a run stands and how it ended: the one status and the one outcome the child records,
//! its tail's last line and its inspection carry, the parent's registry keeps, hooks read and a
//! sub-agent's chat turn reports.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::InterruptedReason;

/// Where a run is in its life. In SQL and JSON, its lowercase name (`"running"`, …).
///
/// ```
/// use agent_tools::RunStatus;
///
/// let status: RunStatus = "interrupted".parse().unwrap();
/// assert_eq!(status, RunStatus::Interrupted);
/// assert_eq!(status.to_string(), "interrupted");
/// assert!(!status.is_hard_terminal(), "dispatching the run again can repair it");
/// assert!("paused".parse::<RunStatus>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum RunStatus {
    /// Row inserted; the child has not accepted the run yet.
    Starting,
    /// The child accepted the run.
    Running,
    /// Finished with a result.
    Completed,
    /// Failed.
    Error,
    /// Cancelled.
    Aborted,
    /// Stopped without a logical outcome (the parent stopped waiting, or a restart cut the
    /// child's turn short and its policy is `seal`); dispatching the run again can repair it.
    Interrupted,
}

impl RunStatus {
    /// The SQL and wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Error => "error",
            Self::Aborted => "aborted",
            Self::Interrupted => "interrupted",
        }
    }

    /// Parses the SQL and wire spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "starting" => Self::Starting,
            "running" => Self::Running,
            "completed" => Self::Completed,
            "error" => Self::Error,
            "aborted" => Self::Aborted,
            "interrupted" => Self::Interrupted,
            _ => return None,
        })
    }

    /// `completed`, `error` and `aborted`: final, never overwritten.
    pub fn is_hard_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Error | Self::Aborted)
    }

    /// `starting` and `running`: holds a concurrency slot.
    pub fn is_live(self) -> bool {
        matches!(self, Self::Starting | Self::Running)
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A status spelling that names no [`RunStatus`].
///
/// ```
/// use agent_tools::{RunStatus, UnknownStatus};
///
/// assert_eq!("completed".parse::<RunStatus>(), Ok(RunStatus::Completed));
/// assert_eq!("done".parse::<RunStatus>(), Err(UnknownStatus("done".into())));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownStatus(pub String);

impl std::fmt::Display for UnknownStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unknown run status {:?}", self.0)
    }
}

impl std::error::Error for UnknownStatus {}

impl std::str::FromStr for RunStatus {
    type Err = UnknownStatus;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s).ok_or_else(|| UnknownStatus(s.to_owned()))
    }
}

/// How a run ended. On the wire (a tail's last line) it is an object tagged by its status:
/// `{"status":"completed","summary":..,"output"?}`, `{"status":"error","error":..}`,
/// `{"status":"aborted","error"?}`, `{"status":"interrupted","error",..}`.
///
/// New states may come in a minor version: match with a wildcard arm.
///
/// ```
/// use agent_tools::{Outcome, RunStatus};
///
/// let done = Outcome::completed("3 sources found");
/// assert_eq!((done.status(), done.summary()), (RunStatus::Completed, Some("3 sources found")));
/// let failed = Outcome::failed("the model refused");
/// assert_eq!(failed.error(), Some("the model refused"));
/// assert!(!failed.is_retryable(), "only an interrupted run can be dispatched again");
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
#[non_exhaustive]
pub enum Outcome {
    /// The child finished its work.
    Completed {
        /// Its summary (the answer's text).
        #[serde(default)]
        summary: String,
        /// Its structured output, when it has one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<Value>,
    },
    /// The run failed (the child's turn, its model, a refused dispatch).
    Error {
        /// Why, safe to surface.
        #[serde(default = "child_run_failed")]
        error: String,
    },
    /// The run was cancelled.
    Aborted {
        /// The reason given.
        #[serde(rename = "error", default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Stopped without a logical outcome; dispatching the same run id again can succeed.
    Interrupted {
        /// The human-readable cause.
        #[serde(default = "cut_short")]
        error: String,
        /// The machine-readable cause (a parent's; a child's sealed turn has none).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<InterruptedReason>,
        /// Whether the child was still working when the run stopped.
        #[serde(rename = "childStillRunning", default, skip_serializing_if = "Option::is_none")]
        child_still_running: Option<bool>,
    },
}

fn child_run_failed() -> String {
    "the child run failed".into()
}

fn cut_short() -> String {
    "the child's turn was cut short by a restart".into()
}

impl Outcome {
    /// Completed with `summary` and no structured output.
    pub fn completed(summary: impl Into<String>) -> Self {
        Self::Completed { summary: summary.into(), output: None }
    }

    /// Completed with `summary` and a structured `output`.
    pub fn completed_with(summary: impl Into<String>, output: Value) -> Self {
        Self::Completed { summary: summary.into(), output: Some(output) }
    }

    /// Failed with `error`.
    pub fn failed(error: impl Into<String>) -> Self {
        Self::Error { error: error.into() }
    }

    /// Cancelled, with the reason given.
    pub fn aborted(reason: Option<String>) -> Self {
        Self::Aborted { reason }
    }

    /// Interrupted for `reason`, in words `error`.
    pub fn interrupted(
        error: impl Into<String>,
        reason: Option<InterruptedReason>,
        child_still_running: Option<bool>,
    ) -> Self {
        Self::Interrupted { error: error.into(), reason, child_still_running }
    }

    /// A child's turn a restart cut short, sealed by its `seal` policy: the child is not
    /// running it.
    pub fn sealed(error: impl Into<String>) -> Self {
        Self::interrupted(error, None, Some(false))
    }

    /// The parent could not inspect the child (`inspect-failed`, `inspect-timeout`); it may
    /// still run.
    pub fn inspect_failed(reason: InterruptedReason) -> Self {
        Self::interrupted(format!("the child could not be inspected ({})", reason.as_str()), Some(reason), Some(true))
    }

    /// The status this outcome ends a run with.
    pub fn status(&self) -> RunStatus {
        match self {
            Self::Completed { .. } => RunStatus::Completed,
            Self::Error { .. } => RunStatus::Error,
            Self::Aborted { .. } => RunStatus::Aborted,
            Self::Interrupted { .. } => RunStatus::Interrupted,
        }
    }

    /// The summary, for a completed run.
    pub fn summary(&self) -> Option<&str> {
        match self {
            Self::Completed { summary, .. } => Some(summary),
            _ => None,
        }
    }

    /// The structured output, for a completed run that has one.
    pub fn output(&self) -> Option<&Value> {
        match self {
            Self::Completed { output, .. } => output.as_ref(),
            _ => None,
        }
    }

    /// The error, the abort's reason or the interruption's cause, in words.
    pub fn error(&self) -> Option<&str> {
        match self {
            Self::Completed { .. } => None,
            Self::Error { error } | Self::Interrupted { error, .. } => Some(error),
            Self::Aborted { reason } => reason.as_deref(),
        }
    }

    /// The interruption's machine-readable cause.
    pub fn interrupted_reason(&self) -> Option<InterruptedReason> {
        match self {
            Self::Interrupted { reason, .. } => *reason,
            _ => None,
        }
    }

    /// Interrupted: whether the child was still working.
    pub fn child_still_running(&self) -> Option<bool> {
        match self {
            Self::Interrupted { child_still_running, .. } => *child_still_running,
            _ => None,
        }
    }

    /// Whether dispatching the same run again can succeed (only an interrupted run).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Interrupted { .. })
    }

    /// The outcome a status and the columns beside it describe, as rows and inspections keep
    /// them; `None` for a live status. A missing error reads as the default words.
    pub fn from_parts(
        status: RunStatus,
        summary: Option<String>,
        output: Option<Value>,
        error: Option<String>,
        reason: Option<InterruptedReason>,
        child_still_running: Option<bool>,
    ) -> Option<Self> {
        Some(match status {
            RunStatus::Starting | RunStatus::Running => return None,
            RunStatus::Completed => Self::Completed { summary: summary.unwrap_or_default(), output },
            RunStatus::Error => Self::Error { error: error.unwrap_or_else(child_run_failed) },
            RunStatus::Aborted => Self::Aborted { reason: error },
            RunStatus::Interrupted => {
                Self::Interrupted { error: error.unwrap_or_else(cut_short), reason, child_still_running }
            }
        })
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use serde_json::json;

    use super::*;

    /// Only an interrupted run can be dispatched again with success; a status no version wrote
    /// says which spelling it was.
    #[test]
    fn only_an_interrupted_run_is_retryable_and_an_unknown_status_names_itself() {
        let retryable = |o: Outcome| o.is_retryable();
        assert!(retryable(Outcome::sealed("a restart cut it short")));
        assert!(!retryable(Outcome::completed("done")));
        assert!(!retryable(Outcome::failed("boom")));
        assert!(!retryable(Outcome::aborted(None)));
        let unknown = "paused".parse::<RunStatus>().unwrap_err();
        assert_eq!(unknown.to_string(), r#"unknown run status "paused""#);
    }

    #[test]
    fn the_wire_shape_is_tagged_by_status() {
        let cases = [
            (
                Outcome::completed_with("s", json!({"k": 1})),
                json!({"status": "completed", "summary": "s", "output": {"k": 1}}),
            ),
            (Outcome::failed("boom"), json!({"status": "error", "error": "boom"})),
            (Outcome::aborted(Some("stop".into())), json!({"status": "aborted", "error": "stop"})),
            (Outcome::aborted(None), json!({"status": "aborted"})),
            (Outcome::sealed("cut"), json!({"status": "interrupted", "error": "cut", "childStillRunning": false})),
        ];
        for (outcome, wire) in cases {
            assert_eq!(serde_json::to_value(&outcome).unwrap(), wire);
            assert_eq!(serde_json::from_value::<Outcome>(wire).unwrap(), outcome);
        }
    }

    #[test]
    fn a_missing_error_reads_as_the_default_words_and_a_live_status_is_refused() {
        let failed: Outcome = serde_json::from_value(json!({"status": "error"})).unwrap();
        assert_eq!(failed.error(), Some("the child run failed"));
        assert!(serde_json::from_value::<Outcome>(json!({"status": "running"})).is_err());
        assert_eq!(Outcome::from_parts(RunStatus::Running, None, None, None, None, None), None);
        let cut = Outcome::from_parts(RunStatus::Interrupted, None, None, None, None, Some(true)).unwrap();
        assert_eq!(
            (cut.error(), cut.child_still_running()),
            (Some("the child's turn was cut short by a restart"), Some(true))
        );
    }

    #[test]
    fn statuses_round_trip_through_their_spelling() {
        for status in [
            RunStatus::Starting,
            RunStatus::Running,
            RunStatus::Completed,
            RunStatus::Error,
            RunStatus::Aborted,
            RunStatus::Interrupted,
        ] {
            assert_eq!(status.as_str().parse::<RunStatus>(), Ok(status));
            assert_eq!(serde_json::to_value(status).unwrap(), json!(status.as_str()));
        }
        assert_eq!("Running".parse::<RunStatus>(), Err(UnknownStatus("Running".into())));
    }
}
