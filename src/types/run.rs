//! The types of a run as its dispatcher sees them: options in, results out, and read-only views
//! of the registry (the TypeScript SDK's `RunAgentToolOptions`, `RunAgentToolResult`,
//! `AgentToolFailure`, `AgentToolRunInfo`, `AgentToolProgressSnapshot`, …).

use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cancel::CancelToken;
pub use crate::protocol::chunk::Progress;
#[doc(inline)]
pub use crate::protocol::outcome::UnknownStatus;
pub use crate::protocol::outcome::{Outcome, RunStatus};
pub use crate::protocol::InterruptedReason;

/// Whether a run's ordinary chunks reach clients. In JSON, `"full"` or `"terminal"` (the
/// TypeScript SDK's `eventDelivery`).
///
/// ```
/// use agent_tools::{EventDelivery, RunOptions};
///
/// // The clients see the run start, progress and end, not its words.
/// let options = RunOptions::new(serde_json::json!({ "query": "HTTP/3" })).event_delivery(EventDelivery::Terminal);
/// assert_eq!(options.event_delivery, EventDelivery::Terminal);
/// assert_eq!(serde_json::to_value(EventDelivery::Full).unwrap(), "full");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum EventDelivery {
    /// Every chunk is forwarded and replayed.
    #[default]
    Full,
    /// Only lifecycle, progress and milestone frames.
    Terminal,
}

impl EventDelivery {
    /// The SQL spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Terminal => "terminal",
        }
    }
}

/// Options of one dispatch ([`crate::AgentHost::run_agent_tool`]).
///
/// ```
/// use agent_tools::RunOptions;
/// use serde_json::json;
///
/// let options = RunOptions::new(json!({ "query": "HTTP/3" })).run_id("import-42").display_order(1);
/// assert_eq!(options.run_id.as_deref(), Some("import-42"));
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RunOptions {
    /// The child's input.
    pub input: Value,
    /// Run id; a fresh one (a v4 UUID) when absent. Dispatching a known id never starts a second
    /// child.
    pub run_id: Option<String>,
    /// The parent tool call this run belongs to (groups sibling runs in the UI).
    pub parent_tool_call_id: Option<String>,
    /// Sibling order under the tool call (default 0).
    pub display_order: Option<i64>,
    /// Overrides the default input preview (a string's first 500 characters; other input as
    /// JSON cut to 500).
    pub input_preview: Option<String>,
    /// UI metadata (`{name?, icon?, ...}`).
    pub display: Option<Value>,
    /// Chunk delivery mode (awaited runs only).
    pub event_delivery: EventDelivery,
    /// Cancels the awaited run when cancelled, as [`crate::AgentHost::cancel_agent_tool`] does
    /// (the TypeScript SDK's `signal`). A token cancelled before the run is admitted (already,
    /// or while the dispatch waits for a slot under [`crate::Admission::Queue`]) ends the call
    /// `aborted` with nothing written. A detached run ignores it.
    pub signal: Option<CancelToken>,
}

impl RunOptions {
    /// Options with this input and every other field at its default.
    pub fn new(input: Value) -> Self {
        Self { input, ..Self::default() }
    }

    /// Sets the run id.
    pub fn run_id(mut self, run_id: impl Into<String>) -> Self {
        self.run_id = Some(run_id.into());
        self
    }

    /// Sets the parent tool call id.
    pub fn parent_tool_call_id(mut self, id: impl Into<String>) -> Self {
        self.parent_tool_call_id = Some(id.into());
        self
    }

    /// Sets the sibling order.
    pub fn display_order(mut self, order: i64) -> Self {
        self.display_order = Some(order);
        self
    }

    /// Sets the input preview.
    pub fn input_preview(mut self, preview: impl Into<String>) -> Self {
        self.input_preview = Some(preview.into());
        self
    }

    /// Sets the UI metadata.
    pub fn display(mut self, display: Value) -> Self {
        self.display = Some(display);
        self
    }

    /// Sets the chunk delivery mode.
    pub fn event_delivery(mut self, delivery: EventDelivery) -> Self {
        self.event_delivery = delivery;
        self
    }

    /// Cancels the run when `signal` is cancelled.
    pub fn signal(mut self, signal: CancelToken) -> Self {
        self.signal = Some(signal);
        self
    }
}

/// The outcome of a run (the TypeScript SDK's `RunAgentToolResult` and
/// `AgentToolLifecycleResult`); over RPC it serializes in camelCase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct RunResult {
    /// Run id.
    pub run_id: String,
    /// Child class name.
    pub agent_type: String,
    /// Final status.
    pub status: RunStatus,
    /// Summary (completed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Structured output (completed, when the child has one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// Error, abort reason or interruption cause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Interrupted: machine-readable cause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<InterruptedReason>,
    /// Interrupted: whether the child still runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_still_running: Option<bool>,
}

/// What an agent tool returns to the model when its run does not complete (the TypeScript
/// SDK's `AgentToolFailure`): `{"ok":false,"status","error","retryable","reason"?,"childStillRunning"?}`.
/// `retryable` is true only for `interrupted`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct AgentToolFailure {
    /// The envelope's `"ok": false`: on the wire only, where it tells a failure from a result.
    ok: AlwaysFalse,
    /// `error`, `aborted` or `interrupted`.
    pub status: RunStatus,
    /// Human-readable, safe to surface.
    pub error: String,
    /// Whether dispatching the same run again can succeed.
    pub retryable: bool,
    /// Interrupted: machine-readable cause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<InterruptedReason>,
    /// Interrupted: whether the child was still working when the parent stopped waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_still_running: Option<bool>,
}

/// `false`, and nothing else, in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct AlwaysFalse;

impl Serialize for AlwaysFalse {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bool(false)
    }
}

impl<'de> Deserialize<'de> for AlwaysFalse {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match bool::deserialize(deserializer)? {
            false => Ok(Self),
            true => Err(serde::de::Error::custom("a failure envelope has \"ok\": false")),
        }
    }
}

impl AgentToolFailure {
    /// The envelope as JSON.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// A failed server-side tool call.
    ///
    /// ```
    /// use agent_tools::AgentToolFailure;
    ///
    /// let failure = AgentToolFailure::error("the index is offline");
    /// assert_eq!(
    ///     failure.to_value(),
    ///     serde_json::json!({ "ok": false, "status": "error", "error": "the index is offline", "retryable": false })
    /// );
    /// ```
    pub fn error(message: impl Into<String>) -> Self {
        Self {
            ok: AlwaysFalse,
            status: RunStatus::Error,
            error: message.into(),
            retryable: false,
            reason: None,
            child_still_running: None,
        }
    }
}

impl RunResult {
    /// A dispatch refused before any row was written (bad run id, cap reached, …).
    pub(crate) fn refused(run_id: impl Into<String>, agent_type: impl Into<String>, error: impl Into<String>) -> Self {
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

    /// A run that ended with `outcome` (for a hook's unit test, or an RPC method's answer).
    ///
    /// ```
    /// use agent_tools::{Outcome, RunResult, RunStatus};
    ///
    /// let result = RunResult::new("run-1", "Researcher", Outcome::completed("3 sources"));
    /// assert_eq!(result.status, RunStatus::Completed);
    /// assert_eq!(result.outcome(), Some(Outcome::completed("3 sources")));
    /// ```
    pub fn new(run_id: impl Into<String>, agent_type: impl Into<String>, outcome: Outcome) -> Self {
        Self {
            run_id: run_id.into(),
            agent_type: agent_type.into(),
            status: outcome.status(),
            summary: outcome.summary().map(str::to_owned),
            output: outcome.output().cloned(),
            error: outcome.error().map(str::to_owned),
            reason: outcome.interrupted_reason(),
            child_still_running: outcome.child_still_running(),
        }
    }

    /// How the run ended, as one of its states with what it carries: match on it instead of
    /// reading the optional fields. `None` while it is live (a detached run read as it runs).
    ///
    /// ```
    /// use agent_tools::{Outcome, RunResult};
    ///
    /// fn report(result: &RunResult) -> String {
    ///     match result.outcome() {
    ///         Some(Outcome::Completed { summary, .. }) => format!("done: {summary}"),
    ///         Some(Outcome::Interrupted { reason, .. }) => format!("interrupted ({reason:?}); retry it"),
    ///         Some(Outcome::Aborted { reason }) => format!("cancelled: {}", reason.unwrap_or_default()),
    ///         Some(other) => format!("failed: {}", other.error().unwrap_or_default()),
    ///         None => "still running".into(),
    ///     }
    /// }
    /// ```
    pub fn outcome(&self) -> Option<Outcome> {
        Outcome::from_parts(
            self.status,
            self.summary.clone(),
            self.output.clone(),
            self.error.clone(),
            self.reason,
            self.child_still_running,
        )
    }

    /// The failure envelope, for a run that did not complete.
    pub fn failure(&self) -> Option<AgentToolFailure> {
        if self.status == RunStatus::Completed {
            return None;
        }
        let interrupted = self.status == RunStatus::Interrupted;
        Some(AgentToolFailure {
            ok: AlwaysFalse,
            status: self.status,
            error: self.error.clone().unwrap_or_else(|| format!("agent tool run {}", self.status.as_str())),
            retryable: interrupted,
            reason: self.reason.filter(|_| interrupted),
            child_still_running: self.child_still_running.filter(|_| interrupted),
        })
    }

    /// What the parent's model sees: the summary on success (a tool with an output schema
    /// sends the validated output instead), else the failure envelope.
    pub fn for_model(&self) -> Value {
        match self.failure() {
            None => Value::String(self.summary.clone().unwrap_or_default()),
            Some(failure) => failure.to_value(),
        }
    }
}

/// A run as the registry knows it (the TypeScript SDK's `AgentToolRunInfo`): what hooks
/// receive, and what [`crate::AgentHost::agent_tool_runs`] lists.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct RunInfo {
    /// Run id.
    pub run_id: String,
    /// The parent tool call that spawned it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_tool_call_id: Option<String>,
    /// Child class name.
    pub agent_type: String,
    /// Input preview.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_preview: Option<String>,
    /// Status now.
    pub status: RunStatus,
    /// UI metadata.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub display: Option<Value>,
    /// `metadata.source` of a detached `notify` run's messages.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notify_source: Option<String>,
    /// Sibling order.
    pub display_order: i64,
    /// When it was dispatched (epoch milliseconds in JSON).
    #[serde(serialize_with = "epoch_ms::serialize")]
    pub started_at: SystemTime,
    /// When it ended (epoch milliseconds in JSON).
    #[serde(serialize_with = "epoch_ms::option::serialize", skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<SystemTime>,
    /// Whether it was dispatched detached.
    pub detached: bool,
    /// How many times the child ran the turn again after a restart cut it short
    /// ([`crate::RecoveryPolicy::Rerun`]).
    pub reruns: i64,
}

impl RunInfo {
    /// A run as a hook would see it: `status` since `started_at`, everything else
    /// unset (no tool call, preview, display, notify source; order 0; awaited; no re-runs). The
    /// fields are public: set the others after. For a hook's unit test:
    ///
    /// ```
    /// use agent_tools::{Milestone, RunInfo, RunStatus};
    ///
    /// let at = |s| std::time::UNIX_EPOCH + std::time::Duration::from_secs(s);
    /// let mut run = RunInfo::new("run-1", "Researcher", RunStatus::Running, at(1_700_000_000));
    /// run.detached = true;
    /// let milestone = Milestone::new("sources-gathered", 0, at(1_700_000_005));
    /// assert_eq!(
    ///     agent_tools::milestone_line(&run, &milestone),
    ///     "Background task \"Researcher\" (run run-1) reached milestone \"sources-gathered\"."
    /// );
    /// ```
    pub fn new(
        run_id: impl Into<String>,
        agent_type: impl Into<String>,
        status: RunStatus,
        started_at: SystemTime,
    ) -> Self {
        Self {
            run_id: run_id.into(),
            parent_tool_call_id: None,
            agent_type: agent_type.into(),
            input_preview: None,
            status,
            display: None,
            notify_source: None,
            display_order: 0,
            started_at,
            completed_at: None,
            detached: false,
            reruns: 0,
        }
    }
}

impl ProgressSnapshot {
    /// A signal sent at `at` that says nothing yet: set the fields it carries.
    ///
    /// ```
    /// use agent_tools::ProgressSnapshot;
    ///
    /// let mut progress = ProgressSnapshot::new(std::time::SystemTime::now());
    /// progress.fraction = Some(0.5);
    /// progress.phase = Some("reading".into());
    /// assert_eq!(progress.milestone, None);
    /// ```
    pub fn new(at: SystemTime) -> Self {
        Self { fraction: None, message: None, phase: None, milestone: None, at, data: None }
    }
}

impl Milestone {
    /// The milestone `name`, the run's `sequence`-th (from 0), reached at `at`, with no data
    /// (set [`Milestone::data`] after).
    ///
    /// ```
    /// use agent_tools::Milestone;
    ///
    /// let mut milestone = Milestone::new("drafted", 1, std::time::SystemTime::now());
    /// milestone.data = Some(serde_json::json!({ "words": 800 }));
    /// assert_eq!((milestone.name.as_str(), milestone.sequence), ("drafted", 1));
    /// ```
    pub fn new(name: impl Into<String>, sequence: i64, at: SystemTime) -> Self {
        Self { name: name.into(), sequence, at, data: None }
    }
}

/// A run's latest progress signal (the TypeScript SDK's `AgentToolProgressSnapshot`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ProgressSnapshot {
    /// 0..1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<f64>,
    /// Status line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Phase label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Set when the signal was a durable milestone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub milestone: Option<String>,
    /// When it was sent (epoch milliseconds in JSON).
    #[serde(with = "epoch_ms")]
    pub at: SystemTime,
    /// The payload (live signals carry it; a kept snapshot only when persisted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

/// A durable milestone a child reached (the TypeScript SDK's `AgentToolMilestone`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Milestone {
    /// Its name.
    pub name: String,
    /// Per-run ordinal from 0.
    pub sequence: i64,
    /// When it was reached (epoch milliseconds in JSON).
    #[serde(with = "epoch_ms")]
    pub at: SystemTime,
    /// Its payload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

/// A run's state with its result, progress and milestones
/// ([`crate::AgentHost::inspect_agent_tool_run`]).
///
/// What [`crate::AgentHost::inspect_agent_tool_run`] answers:
///
/// ```
/// # use agent_tools::prelude::*;
/// async fn report(host: &AgentHost<impl Agent>, run_id: &str) -> Result<String, Error> {
///     let Some(inspection) = host.inspect_agent_tool_run(run_id)? else {
///         return Ok(format!("no run {run_id}"));
///     };
///     let milestones: Vec<&str> = inspection.milestones.iter().map(|m| m.name.as_str()).collect();
///     Ok(match (&inspection.result, &inspection.progress) {
///         (Some(result), _) => format!("{}: {}", inspection.info.status, result.summary.clone().unwrap_or_default()),
///         (None, Some(progress)) => format!("running, {:?} done, past {milestones:?}", progress.fraction),
///         (None, None) => format!("{}", inspection.info.status),
///     })
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct RunInspection {
    /// The run.
    #[serde(flatten)]
    pub info: RunInfo,
    /// Its result, once terminal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<RunResult>,
    /// The latest progress kept for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<ProgressSnapshot>,
    /// Its milestones, by sequence.
    pub milestones: Vec<Milestone>,
}

/// One stored chunk of a run (the TypeScript SDK's `AgentToolStoredChunk`): its frame sequence
/// and the `UIMessageChunk` JSON.
///
/// What [`crate::AgentHost::agent_tool_chunks`] reads back: the chunks a run streamed, each with
/// the sequence it was sent with (pass the last one seen as `after` to read on from there):
///
/// ```
/// # use agent_tools::prelude::*;
/// async fn text_of(host: &AgentHost<impl Agent>, run_id: &str) -> Result<String, Error> {
///     let mut text = String::new();
///     for chunk in host.agent_tool_chunks(run_id, None).await? {
///         let body: serde_json::Value = serde_json::from_str(&chunk.body).map_err(|e| Error::json("a chunk", e))?;
///         if body["type"] == "text-delta" {
///             text.push_str(body["delta"].as_str().unwrap_or_default());
///         }
///     }
///     Ok(text)
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct AgentToolChunk {
    /// The frame sequence it was sent with (and replays with).
    pub sequence: i64,
    /// The chunk.
    pub body: String,
}

/// Which runs [`crate::AgentHost::clear_agent_tool_runs`] removes.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use agent_tools::{ClearFilter, RunStatus};
///
/// // Failed and aborted runs that started more than an hour ago.
/// let an_hour_ago = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
/// let filter = ClearFilter::all().status([RunStatus::Error, RunStatus::Aborted]).older_than(an_hour_ago);
/// assert_eq!(filter.status.as_deref(), Some(&[RunStatus::Error, RunStatus::Aborted][..]));
/// assert_eq!(ClearFilter::all().status, None, "every retained run");
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct ClearFilter {
    /// Only runs with one of these statuses (all, when `None`).
    pub status: Option<Vec<RunStatus>>,
    /// Only runs started before this time (all, when `None`).
    pub older_than: Option<SystemTime>,
}

impl ClearFilter {
    /// Every retained run.
    pub fn all() -> Self {
        Self::default()
    }

    /// Only runs with one of these statuses.
    pub fn status(mut self, statuses: impl IntoIterator<Item = RunStatus>) -> Self {
        self.status = Some(statuses.into_iter().collect());
        self
    }

    /// Only runs started before `time` (`host.now() - Duration::from_secs(3600)`: an hour ago).
    pub fn older_than(mut self, time: SystemTime) -> Self {
        self.older_than = Some(time);
        self
    }
}

/// A task scheduled with [`crate::AgentHost::schedule`], handed to
/// [`crate::Agent::on_schedule`] when it is due.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use agent_tools::ScheduledTask;
/// use serde::Deserialize;
/// use serde_json::json;
///
/// #[derive(Deserialize, Debug, PartialEq)]
/// struct Reminder {
///     text: String,
/// }
///
/// // What `on_schedule` receives for `host.schedule_in(delay, &json!({ "text": "stand-up" }))`.
/// let task = ScheduledTask::new("task-1", UNIX_EPOCH + Duration::from_secs(1_700_000_000), json!({ "text": "stand-up" }));
/// assert_eq!(task.payload::<Reminder>()?, Reminder { text: "stand-up".into() });
/// # Ok::<(), agent_tools::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ScheduledTask {
    /// Its id (returned by `schedule`).
    pub id: String,
    /// When it was due.
    pub at: SystemTime,
    /// Its payload, as scheduled.
    pub payload: Value,
}

impl ScheduledTask {
    /// The task `id`, due `at`, with `payload` (what [`crate::AgentHost::schedule`] stored): for
    /// an agent's own tests of [`crate::Agent::on_schedule`].
    pub fn new(id: impl Into<String>, at: SystemTime, payload: Value) -> Self {
        Self { id: id.into(), at, payload }
    }

    /// The payload as the type it was scheduled with.
    pub fn payload<T: serde::de::DeserializeOwned>(&self) -> Result<T, crate::Error> {
        serde_json::from_value(self.payload.clone())
            .map_err(|e| crate::Error::json(format!("task {} payload", self.id), e))
    }
}

/// Checks a caller-supplied run id: 1–256 characters, no control characters.
pub(crate) fn validate_run_id(run_id: &str) -> Result<(), String> {
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

    /// Row 22: the failure envelope has `reason` and `childStillRunning` only when the status is
    /// `interrupted`, even when a result of another status carries them.
    /// Each setter sets its own field and keeps the others.
    #[test]
    fn each_run_option_setter_sets_its_field_and_keeps_the_rest() {
        let signal = crate::CancelToken::new();
        let o = RunOptions::new(serde_json::json!({ "query": "QUIC" }))
            .run_id("r1")
            .parent_tool_call_id("call_1")
            .display_order(3)
            .input_preview("QUIC")
            .display(serde_json::json!({ "title": "Research" }))
            .event_delivery(EventDelivery::Terminal)
            .signal(signal.clone());
        assert_eq!(o.input, serde_json::json!({ "query": "QUIC" }));
        assert_eq!(
            (o.run_id.as_deref(), o.parent_tool_call_id.as_deref(), o.display_order, o.input_preview.as_deref()),
            (Some("r1"), Some("call_1"), Some(3), Some("QUIC"))
        );
        assert_eq!(
            (o.display, o.event_delivery),
            (Some(serde_json::json!({ "title": "Research" })), EventDelivery::Terminal)
        );
        assert!(o.signal.is_some());
        assert_ne!(EventDelivery::default(), EventDelivery::Terminal);
    }

    #[test]
    fn a_failures_reason_and_child_still_running_are_only_for_interrupted() {
        // parity: 22
        for status in [RunStatus::Error, RunStatus::Aborted, RunStatus::Interrupted] {
            let result = RunResult {
                reason: Some(InterruptedReason::NoProgress),
                child_still_running: Some(true),
                ..result(status)
            };
            let envelope = result.for_model();
            let interrupted = status == RunStatus::Interrupted;
            assert_eq!(envelope["reason"].as_str(), interrupted.then_some("no-progress"), "{status}");
            assert_eq!(envelope["childStillRunning"].as_bool(), interrupted.then_some(true), "{status}");
            assert_eq!(envelope.get("reason").is_some(), interrupted, "absent, not null: {envelope}");
            assert_eq!((envelope["ok"].as_bool(), envelope["status"].as_str()), (Some(false), Some(status.as_str())));
        }
    }

    #[test]
    fn the_model_sees_a_summary_or_the_failure_envelope() {
        // parity: 19, 20, 24
        let mut done = result(RunStatus::Completed);
        done.summary = Some("text".into());
        done.output = Some(json!({"k": 1}));
        assert_eq!(done.for_model(), json!("text"), "the summary, not the output, without an output schema");
        assert_eq!(done.failure(), None);
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
        let typed = interrupted.failure().unwrap();
        assert!(typed.retryable);
        assert_eq!(serde_json::from_value::<AgentToolFailure>(interrupted.for_model()).unwrap(), typed);
    }

    #[test]
    fn the_outcome_is_the_state_with_what_it_carries() {
        let mut done = result(RunStatus::Completed);
        done.summary = Some("text".into());
        done.output = Some(json!({"k": 1}));
        assert_eq!(done.outcome(), Some(Outcome::completed_with("text", json!({"k": 1}))));
        assert_eq!(result(RunStatus::Error).outcome(), Some(Outcome::failed("boom")));
        assert_eq!(result(RunStatus::Aborted).outcome(), Some(Outcome::aborted(Some("boom".into()))));
        let mut interrupted = result(RunStatus::Interrupted);
        interrupted.reason = Some(InterruptedReason::NoProgress);
        interrupted.child_still_running = Some(true);
        let back = Outcome::interrupted("boom", Some(InterruptedReason::NoProgress), Some(true));
        assert_eq!(interrupted.outcome(), Some(back.clone()));
        assert_eq!(RunResult::new(&interrupted.run_id, &interrupted.agent_type, back), interrupted);
        assert_eq!(result(RunStatus::Running).outcome(), None);
    }

    #[test]
    fn run_ids_are_checked() {
        assert!(validate_run_id("agent-tool:call_1").is_ok());
        assert!(validate_run_id("").is_err());
        assert!(validate_run_id(&"x".repeat(257)).is_err());
        assert!(validate_run_id(&"x".repeat(256)).is_ok(), "256 characters is the bound itself");
        assert!(validate_run_id(&"é".repeat(256)).is_ok(), "characters, not bytes");
        assert!(validate_run_id("a\nb").is_err());
    }

    /// The failure envelope reads back only with `"ok": false`: a result (`"ok": true`) is not
    /// taken for a failure.
    #[test]
    fn a_failure_envelope_reads_back_only_with_ok_false() {
        let failure = json!({ "ok": false, "status": "error", "error": "boom", "retryable": false });
        let read: AgentToolFailure = serde_json::from_value(failure.clone()).expect("a failure");
        assert_eq!((read.status, read.error.as_str()), (RunStatus::Error, "boom"));
        assert_eq!(serde_json::to_value(&read).unwrap(), failure);
        let mut success = failure;
        success["ok"] = json!(true);
        assert!(serde_json::from_value::<AgentToolFailure>(success).is_err());
    }

    /// Each `ClearFilter` setter sets its own field and keeps the other.
    #[test]
    fn a_clear_filter_chain_sets_both_fields() {
        let at = crate::types::time_of(1_700_000_000_000);
        let filter = ClearFilter::all().status([RunStatus::Error]).older_than(at);
        assert_eq!((filter.status, filter.older_than), (Some(vec![RunStatus::Error]), Some(at)));
        let filter = ClearFilter::all().older_than(at).status([RunStatus::Aborted]);
        assert_eq!((filter.status, filter.older_than), (Some(vec![RunStatus::Aborted]), Some(at)));
        assert_eq!(ClearFilter::all(), ClearFilter { status: None, older_than: None });
    }

    #[test]
    fn scheduled_payloads_come_back_typed() {
        let task = ScheduledTask { id: "t".into(), at: crate::types::time_of(5), payload: json!({"n": 3}) };
        #[derive(serde::Deserialize, PartialEq, Debug)]
        struct P {
            n: u8,
        }
        assert_eq!(task.payload::<P>(), Ok(P { n: 3 }));
        assert!(task.payload::<String>().is_err());
    }
}

/// A time as JSON carries it: milliseconds since the Unix epoch (a whole number; one with a
/// fraction, as JavaScript's clocks may give, is rounded).
pub(crate) mod epoch_ms {
    use std::time::SystemTime;

    use serde::{Deserialize, Deserializer, Serializer};

    use crate::types::{epoch_ms, time_of};

    pub fn serialize<S: Serializer>(time: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i64(epoch_ms(*time))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
        Ok(time_of(f64::deserialize(d)?.round() as i64))
    }

    /// The same for an optional time (`None`: `null`), written only.
    pub mod option {
        use super::*;

        pub fn serialize<S: Serializer>(time: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
            match time {
                Some(time) => super::serialize(time, s),
                None => s.serialize_none(),
            }
        }
    }
}
