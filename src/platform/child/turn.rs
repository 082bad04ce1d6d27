//! The running agent-tool turn, as a child agent sees it.

use std::rc::Rc;
use std::time::Duration;

use futures::future::select;
use serde_json::{json, Value};
use worker::{Delay, Env};

use super::{ChildAgent, ChildCore, TurnOutput};
use crate::cancel::{CancelToken, Cancelled};
use crate::chat::message::text_of;
use crate::chat::store::Messages;
use crate::chat::turn::ToolBox;
use crate::child::progress::{Decision, Report};
use crate::model::{ToolCall, ToolSpec};
use crate::platform::chat::{ChatEnd, TurnSpec};
use crate::platform::model::PlatformModel;
use crate::platform::now_ms;
use crate::protocol::chunk::{self, Progress};
use crate::protocol::tail::ChunkKind;

/// A child agent's tools, bound to a turn.
pub struct ChildTools<'a, C: ChildAgent> {
    /// The agent.
    pub agent: &'a C,
    /// The agent-tool run, if the turn is one.
    pub turn: Option<&'a Turn>,
}

impl<C: ChildAgent> ToolBox for ChildTools<'_, C> {
    fn specs(&self) -> Vec<ToolSpec> {
        self.agent.tools()
    }
    async fn execute(&self, call: &ToolCall, _order: usize) -> Result<Value, String> {
        self.agent.execute_tool(self.turn, call).await
    }
}

/// The running agent-tool turn.
pub struct Turn {
    core: Rc<ChildCore>,
    run_id: String,
    input: Value,
    cancel: CancelToken,
}

impl Turn {
    pub(super) fn new(core: Rc<ChildCore>, run_id: String, input: Value, cancel: CancelToken) -> Self {
        Self { core, run_id, input, cancel }
    }

    /// The run id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The input the parent dispatched.
    pub fn input(&self) -> &Value {
        &self.input
    }

    /// The Worker environment (vars, secrets, bindings).
    pub fn env(&self) -> &Env {
        &self.core.env
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
    /// chat clients and to every tail. Returns `false` once the run has ended.
    pub fn emit(&self, body: String) -> bool {
        self.core.emit(&self.run_id, ChunkKind::Stored, body)
    }

    /// Reports progress. With a `milestone` it is durable: stored with the next per-run
    /// sequence, kept in the log, never coalesced. Otherwise it is transient: the latest
    /// snapshot sent is kept on the run row (`data` only with `persist`) and the frame is sent
    /// live, bursts coalesced to one per 200 ms, latest-wins (`fraction >= 1` always goes at
    /// once); a report held back is written when it goes out.
    pub fn report_progress(&self, progress: Progress, persist: bool) {
        let now = now_ms();
        let runs = self.core.runs();
        let report = Report { progress, persist };
        let decision = match self.core.live.borrow_mut().get_mut(&self.run_id) {
            Some(run) => run.progress.offer(report.clone(), now),
            None => {
                worker::console_warn!("agent-tools: report_progress outside a live run of {} is ignored", self.run_id);
                return;
            }
        };
        if let Some(name) = report.progress.milestone.clone() {
            match runs.add_milestone(&self.run_id, &name, report.progress.data.as_ref(), now) {
                Ok(sequence) => {
                    let body = chunk::milestone(&name, sequence, now, &report.progress);
                    self.core.emit(&self.run_id, ChunkKind::Milestone, body);
                }
                Err(e) => worker::console_error!("agent-tools: milestone {name} of {} failed: {e}", self.run_id),
            }
            return;
        }
        match decision {
            Decision::Emit(report) => self.core.emit_progress(&self.run_id, &report),
            Decision::Defer { flush_at } => {
                let (core, run_id) = (self.core.clone(), self.run_id.clone());
                self.core.state.wait_until(async move {
                    let wait = (flush_at - now_ms()).max(0) as u64;
                    Delay::from(Duration::from_millis(wait)).await;
                    core.flush_progress(&run_id);
                });
            }
            Decision::Replaced => {}
        }
    }

    /// Waits `ms` milliseconds, or less if the run is cancelled meanwhile.
    pub async fn pause(&self, ms: u64) {
        if ms == 0 {
            return;
        }
        let delay = Delay::from(Duration::from_millis(ms));
        let cancelled = self.cancel.cancelled();
        futures::pin_mut!(delay, cancelled);
        select(delay, cancelled).await;
    }

    /// Runs the run as a chat turn: the input becomes a user message
    /// ([`ChildAgent::format_agent_tool_input`]), the agent's model answers (with its tools),
    /// and the summary and output come from the assistant message.
    pub async fn chat<C: ChildAgent>(&self, agent: &C) -> Result<TurnOutput, String> {
        let core = &self.core;
        let user = agent.format_agent_tool_input(&self.input, &self.run_id);
        Messages::new(&core.sql).upsert(&user, now_ms()).map_err(|e| e.to_string())?;
        let transcript = json!({ "type": "cf_agent_chat_messages", "messages": core.chat.messages() });
        core.chat.broadcast(&core.state, &transcript.to_string(), None);
        let provider = agent.model(&core.env, Some(&self.input)).map_err(|e| e.to_string())?;
        let model = PlatformModel { provider, env: &core.env };
        let tools = ChildTools { agent, turn: Some(self) };
        let emit = |body: String| {
            self.emit(body);
        };
        let spec = TurnSpec {
            request_id: self.run_id.clone(),
            fresh_stream: false,
            sender: None,
            system: agent.system_prompt(),
            max_steps: agent.max_steps(),
            emit: &emit,
            cancel: self.cancel.clone(),
        };
        let (message, end) = core.chat.run(&core.state, spec, &model, &tools).await;
        match end {
            ChatEnd::Completed => {
                let output = agent.get_agent_tool_output(self, &message);
                let summary = agent.get_agent_tool_summary(&text_of(&message), output.as_ref());
                Ok(TurnOutput { summary, output })
            }
            ChatEnd::Error(e) => Err(e),
            ChatEnd::Aborted(reason) => Err(reason.unwrap_or_else(|| "cancelled".into())),
        }
    }
}
