//! The running agent-tool run, as the child agent sees it.

use std::time::Duration;

use futures::future::select;
use serde_json::Value;

use crate::agent::Agent;
use crate::cancel::{CancelToken, Cancelled};
use crate::chat::message::text_of;
use crate::chat::store::Messages;
use crate::chat::turn::DynModel;
use crate::child::progress::Report;
use crate::child::runs::ChildRuns;
use crate::error::Error;
use crate::host::chat::{ChatEnd, TurnSpec};
use crate::host::tools::HostTools;
use crate::host::{AgentHost, Env};
use crate::protocol::chunk::Progress;
use crate::protocol::tail::ChunkKind;

/// What a finished run hands back.
///
/// ```
/// use agent_tools::prelude::*;
/// use serde_json::json;
///
/// /// A workflow child: it counts the words of its input, with no model.
/// #[derive(Default)]
/// pub struct Counter;
///
/// impl Agent for Counter {
///     async fn run(&self, turn: &Turn<Self>) -> Result<TurnOutput, Error> {
///         let text = turn.input_json().as_str().unwrap_or_default();
///         let words = text.split_whitespace().count();
///         Ok(TurnOutput::new(format!("{words} words")).output(json!({ "words": words })))
///     }
/// }
/// # agent_tools::durable_object!(Counter, unchecked);
/// # fn main() {}
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub struct TurnOutput {
    /// Short text for display and for the parent's model.
    pub summary: String,
    /// Structured output, when the agent has one.
    pub output: Option<Value>,
}

impl TurnOutput {
    /// A run's output: its summary, and no structured output.
    pub fn new(summary: impl Into<String>) -> Self {
        Self { summary: summary.into(), output: None }
    }

    /// With this structured output.
    pub fn output(mut self, output: Value) -> Self {
        self.output = Some(output);
        self
    }
}

/// The agent-tool run an agent is executing for its parent ([`Agent::run`]).
pub struct Turn<A: Agent> {
    host: AgentHost<A>,
    run_id: String,
    input: Value,
    attempt: i64,
    cancel: CancelToken,
}

/// The run, its attempt and whether it was cancelled (the input is not listed: it may be large).
impl<A: Agent> std::fmt::Debug for Turn<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turn")
            .field("run_id", &self.run_id)
            .field("attempt", &self.attempt)
            .field("cancelled", &self.cancel.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl<A: Agent> Turn<A> {
    pub(crate) fn new(host: AgentHost<A>, run_id: String, input: Value, attempt: i64, cancel: CancelToken) -> Self {
        Self { host, run_id, input, attempt, cancel }
    }

    /// Which attempt this is: 1, or more when a restart cut an earlier one short and the run is
    /// being run again ([`crate::RecoveryPolicy::Rerun`]). Tools with side effects can use it
    /// to stay idempotent.
    pub fn attempt(&self) -> i64 {
        self.attempt
    }

    /// The agent running the turn.
    pub fn host(&self) -> &AgentHost<A> {
        &self.host
    }

    /// The run id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The input the parent dispatched, as the type the tool declared it with
    /// ([`crate::AgentTool::input`]): the parent validated it against that type's schema before
    /// the run started, so this fails only when the types disagree.
    ///
    /// ```
    /// use agent_tools::prelude::*;
    ///
    /// #[derive(serde::Deserialize, schemars::JsonSchema)]
    /// struct Research {
    ///     query: String,
    /// }
    ///
    /// #[derive(Default)]
    /// pub struct Researcher;
    ///
    /// impl Agent for Researcher {
    ///     async fn run(&self, turn: &Turn<Self>) -> Result<TurnOutput, Error> {
    ///         let Research { query } = turn.input()?;
    ///         turn.report_progress(Progress::status(format!("researching {query}")));
    ///         turn.chat().await
    ///     }
    /// }
    /// # agent_tools::durable_object!(Researcher);
    /// # fn main() {}
    /// ```
    pub fn input<T: serde::de::DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_value(self.input.clone())
            .map_err(|e| Error::json(format!("run {}'s input is not the tool's input type", self.run_id), e))
    }

    /// The input the parent dispatched, as JSON.
    pub fn input_json(&self) -> &Value {
        &self.input
    }

    /// The Worker environment (vars, secrets, bindings).
    pub fn env(&self) -> &Env {
        self.host.env()
    }

    /// Whether the run was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Resolves when the run is cancelled.
    pub fn cancelled(&self) -> Cancelled {
        self.cancel.cancelled()
    }

    /// Streams one `UIMessageChunk` (JSON): stored in the run's log, sent to the child's own
    /// chat clients and to every tail. Returns `false` once the run has ended, or when the
    /// chunk is one of the engine's own (`data-agent-progress`, `data-agent-milestone`,
    /// `data-agent-superseded`: use [`Turn::report_progress`]), which is refused with a log line.
    pub fn emit(&self, body: String) -> bool {
        if crate::protocol::chunk::is_reserved(&body) {
            self.host.host.log_error(&format!("{} emitted a reserved chunk type; use report_progress", self.run_id));
            return false;
        }
        self.host.host.child_emit(&self.run_id, ChunkKind::Stored, body)
    }

    /// Reports progress (the TypeScript SDK's `reportProgress`). With a `milestone` it is
    /// durable: stored with the next per-run sequence, kept in the log, never coalesced.
    /// Otherwise it is transient: the latest snapshot is kept on the run row (`data` only with
    /// [`Progress::persist`]) and the frame is sent live, bursts coalesced to one per 200 ms,
    /// latest-wins (`fraction >= 1` always goes at once); a report held back is sent when its
    /// window closes.
    pub fn report_progress(&self, progress: Progress) {
        self.host.host.child_progress(&self.run_id, Report { persist: progress.persist, progress });
    }

    /// Waits for the message `name` from the parent (`AgentHost::send_to_agent_tool_run`) and
    /// returns it as `T`: the seed's parent-mediated workflow, where a run reports a milestone
    /// (say `needs-approval`, in `react` mode), its parent asks a person, and sends the answer.
    ///
    /// The message is kept in the child's storage, so a run that a restart cut short and runs
    /// again ([`crate::RecoveryPolicy::Rerun`]) gets it at once when it waits again; the parent
    /// keeps sending it until the child has it. `Err` when the run is cancelled meanwhile, or
    /// when the message is not a `T`. The wait counts against a detached run's no-progress
    /// budget (one hour by default): a run that may wait longer sets its own.
    ///
    /// ```
    /// use agent_tools::prelude::*;
    ///
    /// #[derive(serde::Deserialize)]
    /// struct Decision {
    ///     approved: bool,
    /// }
    ///
    /// #[derive(Default)]
    /// pub struct Writer;
    ///
    /// impl Agent for Writer {
    ///     async fn run(&self, turn: &Turn<Self>) -> Result<TurnOutput, Error> {
    ///         turn.report_progress(Progress::milestone("needs-approval").data(serde_json::json!({"draft": "…"})));
    ///         let decision: Decision = turn.wait_for("approval").await?;
    ///         Ok(TurnOutput::new(if decision.approved { "published" } else { "kept as a draft" }))
    ///     }
    /// }
    /// # agent_tools::durable_object!(Writer, unchecked);
    /// # fn main() {}
    /// ```
    pub async fn wait_for<T: serde::de::DeserializeOwned>(&self, name: &str) -> Result<T, Error> {
        let key = (self.run_id.clone(), name.to_owned());
        loop {
            let kept = ChildRuns::new(self.host.host.sql()).message(&self.run_id, name);
            match kept {
                Ok(Some(value)) => {
                    return serde_json::from_value(value)
                        .map_err(|e| Error::json(format!("the message {name:?} is not what the run waits for"), e))
                }
                Ok(None) => {}
                Err(e) => return Err(Error::Storage(e)),
            }
            let (sender, arrived) = futures::channel::oneshot::channel();
            self.host.host.0.inbox_waiters.borrow_mut().entry(key.clone()).or_default().push(sender);
            let cancelled = self.cancel.cancelled();
            futures::pin_mut!(cancelled);
            if let futures::future::Either::Right(_) = select(arrived, cancelled).await {
                return Err(Error::Cancelled(self.cancel.reason().unwrap_or_else(|| "cancelled".into())));
            }
        }
    }

    /// Waits `duration`, or less if the run is cancelled meanwhile.
    pub async fn pause(&self, duration: Duration) {
        if duration.is_zero() {
            return;
        }
        let delay = self.host.host.0.io.sleep(crate::types::ms(duration) as u64);
        let cancelled = self.cancel.cancelled();
        futures::pin_mut!(delay, cancelled);
        select(delay, cancelled).await;
    }

    /// Runs the run as a chat turn: the input becomes a user message
    /// ([`Agent::format_agent_tool_input`]), the agent's model answers (with its tools), and the
    /// summary and output come from the assistant message.
    pub async fn chat(&self) -> Result<TurnOutput, Error> {
        let host = &self.host;
        let inner = &host.host.0;
        let agent = &host.parts.agent;
        let user = agent.format_agent_tool_input(&self.input, &self.run_id);
        Messages::new(inner.io.sql()).upsert(&user, inner.io.now())?;
        inner.chat.broadcast_transcript(None);
        let scripted = inner.io.model();
        let own;
        let model: &dyn DynModel = match &scripted {
            Some(model) => &**model,
            None => {
                own = agent.model(inner.io.env(), Some(&self.input))?;
                &own
            }
        };
        let tools = HostTools { host, request_id: &self.run_id, turn: Some(self) };
        // The turn builds its chunks from a fixed set of types, never a reserved one: no check.
        let emit = |body: String| {
            self.host.host.child_emit(&self.run_id, ChunkKind::Stored, body);
        };
        let replay_after =
            self.host.host.runs().get(&self.run_id).ok().flatten().map_or(-1, |run| run.attempt_start - 1);
        let spec = TurnSpec {
            request_id: self.run_id.clone(),
            fresh_stream: false,
            replay_after,
            sender: None,
            system: agent.system_prompt(),
            max_steps: agent.max_steps(),
            emit: &emit,
            flush: &|| self.host.host.child_flush_chunks(&self.run_id),
            cancel: self.cancel.clone(),
            durable: None,
        };
        let (message, end) = inner.chat.run(spec, model, &tools).await;
        match end {
            ChatEnd::Completed => {
                let output = agent.agent_tool_output(self, &message);
                let summary = agent.agent_tool_summary(&self.run_id, &text_of(&message), output.as_ref());
                Ok(TurnOutput { summary, output })
            }
            ChatEnd::Error(e) => Err(Error::Failed(e)),
            ChatEnd::Aborted(reason) => Err(Error::Cancelled(reason.unwrap_or_else(|| "cancelled".into()))),
        }
    }
}
