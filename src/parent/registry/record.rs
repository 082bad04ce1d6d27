//! The registry's records: a run's status, what is known before it starts, its terminal
//! result, and its row with the frames it implies.

use serde_json::Value;

use crate::protocol::child_api::RunInput;
use crate::protocol::{AgentToolEvent, EventFrame, InterruptedReason, Outcome};
use crate::store::Row;
use crate::types::{EventDelivery, RunInfo, RunResult, RunStatus};

/// What a caller knows about a run before it starts.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NewRun {
    /// Run id (the caller's, or a fresh one).
    pub run_id: String,
    /// The parent tool call that spawned it.
    pub parent_tool_call_id: Option<String>,
    /// Child class name.
    pub agent_type: String,
    /// The child's Durable Object binding.
    pub binding: String,
    /// Input preview (see [`super::input_preview`]).
    pub input_preview: Option<String>,
    /// UI metadata.
    pub display: Option<Value>,
    /// Sibling order.
    pub display_order: i64,
    /// Chunk delivery mode.
    pub event_delivery: EventDelivery,
    /// The input, kept with the row so recovery can start the child again.
    pub input: RunInput,
}

/// One registry row.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    /// Run id.
    pub run_id: String,
    /// Spawning tool call.
    pub parent_tool_call_id: Option<String>,
    /// Child class name.
    pub agent_type: String,
    /// The child's Durable Object binding (empty for rows of the first schema: the class name).
    pub binding: String,
    /// Input preview.
    pub input_preview: Option<String>,
    /// Status.
    pub status: RunStatus,
    /// How it ended (`None` while `starting` or `running`).
    pub outcome: Option<Outcome>,
    /// UI metadata.
    pub display: Option<Value>,
    /// Sibling order.
    pub display_order: i64,
    /// Epoch ms.
    pub started_at: i64,
    /// Epoch ms.
    pub completed_at: Option<i64>,
    /// Chunk delivery mode.
    pub event_delivery: EventDelivery,
    /// The next frame sequence to hand out.
    pub next_seq: i64,
    /// Index of the last child chunk forwarded (-1: none); a re-attach tails after it.
    pub child_cursor: i64,
    /// Sequence of the current terminal frame.
    pub terminal_seq: Option<i64>,
    /// The latest progress chunk and its sequence.
    pub progress: Option<(i64, String)>,
    /// Last progress or milestone seen, epoch ms.
    pub last_signal_at: Option<i64>,
    /// The input as dispatched (`None` for rows of the first schema).
    pub input: Option<RunInput>,
    /// How many times the child started the run over after a restart.
    pub reruns: i64,
    /// The sequence of its `started` frame: 0, or where a cleared run of the same id stopped.
    pub started_seq: i64,
    /// Detached configuration and delivery ledger (`None` for an awaited run).
    pub detached: Option<DetachedState>,
}

/// A detached run's configuration and the state of its two delivery slots.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DetachedState {
    /// The app's completion handler tag (its own serialized type), if any.
    pub on_finish: Option<Value>,
    /// Notify the chat when the run finishes.
    pub notify: bool,
    /// The `metadata.source` of the messages it injects.
    pub notify_source: Option<String>,
    /// Milestones to surface in the chat (`{names, mode}`).
    pub on_milestones: Option<Value>,
    /// Absolute deadline, epoch ms.
    pub max_budget_at: Option<i64>,
    /// Longest silence after the first signal, ms (0: no limit).
    pub no_progress_budget_ms: Option<i64>,
    /// Last progress or milestone seen, epoch ms.
    pub last_signal_at: Option<i64>,
    /// The `finish` slot: claimed at, delivered at, attempts.
    pub finish: SlotState,
    /// The `give_up` slot.
    pub give_up: SlotState,
}

/// One delivery slot of the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlotState {
    /// When the last delivery attempt was claimed.
    pub claimed_at: Option<i64>,
    /// When delivery succeeded (or was settled without a handler).
    pub delivered_at: Option<i64>,
    /// Attempts so far.
    pub attempts: i64,
}

crate::store::columns!(pub(super) mod col {
    run_id, parent_tool_call_id, agent_type, input_preview, status, summary,
    output_json, error_message, interrupted_reason, child_still_running, display_json, display_order,
    started_at, completed_at, event_delivery, next_seq, child_cursor, terminal_seq,
    progress_json, progress_seq, detached, on_finish, notify_source, on_milestones_json,
    max_budget_at, no_progress_budget_ms, last_signal_at, finish_claimed_at, finish_delivered_at, finish_attempts,
    give_up_claimed_at, give_up_delivered_at, give_up_attempts, child_binding, notify, input_json,
    reruns, started_seq,
});
pub(super) use col::LIST as COLUMNS;

impl RunRecord {
    /// The run's result as its row records it.
    pub fn result(&self) -> RunResult {
        match &self.outcome {
            Some(outcome) => RunResult::new(&self.run_id, &self.agent_type, outcome.clone()),
            None => RunResult {
                run_id: self.run_id.clone(),
                agent_type: self.agent_type.clone(),
                status: self.status,
                summary: None,
                output: None,
                error: None,
                reason: None,
                child_still_running: None,
            },
        }
    }

    /// The run as hooks and listings see it.
    pub fn info(&self) -> RunInfo {
        let r = self;
        RunInfo {
            run_id: r.run_id.clone(),
            parent_tool_call_id: r.parent_tool_call_id.clone(),
            agent_type: r.agent_type.clone(),
            input_preview: r.input_preview.clone(),
            status: r.status,
            display: r.display.clone(),
            notify_source: r.detached.as_ref().and_then(|d| d.notify_source.clone()),
            display_order: r.display_order,
            started_at: crate::types::time_of(r.started_at),
            completed_at: r.completed_at.map(crate::types::time_of),
            detached: r.detached.is_some(),
            reruns: r.reruns,
        }
    }

    pub(super) fn from_row(r: &Row) -> Self {
        // A spelling no version wrote reads as a failed run, never as a live one.
        let status = r.text(col::status).and_then(|s| RunStatus::parse(&s)).unwrap_or(RunStatus::Error);
        Self {
            run_id: r.text(col::run_id).unwrap_or_default(),
            parent_tool_call_id: r.text(col::parent_tool_call_id),
            agent_type: r.text(col::agent_type).unwrap_or_default(),
            binding: r.text(col::child_binding).unwrap_or_default(),
            input_preview: r.text(col::input_preview),
            status,
            outcome: Outcome::from_parts(
                status,
                r.text(col::summary),
                r.text(col::output_json).and_then(|s| serde_json::from_str(&s).ok()),
                r.text(col::error_message),
                r.text(col::interrupted_reason).and_then(|s| InterruptedReason::parse(&s)),
                r.int(col::child_still_running).map(|v| v != 0),
            ),
            display: r.text(col::display_json).and_then(|s| serde_json::from_str(&s).ok()),
            display_order: r.int(col::display_order).unwrap_or(0),
            started_at: r.int(col::started_at).unwrap_or(0),
            completed_at: r.int(col::completed_at),
            event_delivery: match r.text(col::event_delivery).as_deref() {
                Some("terminal") => EventDelivery::Terminal,
                _ => EventDelivery::Full,
            },
            next_seq: r.int(col::next_seq).unwrap_or(1),
            child_cursor: r.int(col::child_cursor).unwrap_or(-1),
            terminal_seq: r.int(col::terminal_seq),
            progress: match (r.int(col::progress_seq), r.text(col::progress_json)) {
                (Some(seq), Some(body)) => Some((seq, body)),
                _ => None,
            },
            last_signal_at: r.int(col::last_signal_at),
            input: r.text(col::input_json).and_then(RunInput::from_text),
            reruns: r.int(col::reruns).unwrap_or(0),
            started_seq: r.int(col::started_seq).unwrap_or(0),
            detached: (r.int(col::detached) == Some(1)).then(|| DetachedState {
                on_finish: r.text(col::on_finish).and_then(|s| serde_json::from_str(&s).ok()),
                notify: r.int(col::notify) == Some(1),
                notify_source: r.text(col::notify_source),
                on_milestones: r.text(col::on_milestones_json).and_then(|s| serde_json::from_str(&s).ok()),
                max_budget_at: r.int(col::max_budget_at),
                no_progress_budget_ms: r.int(col::no_progress_budget_ms),
                last_signal_at: r.int(col::last_signal_at),
                finish: SlotState {
                    claimed_at: r.int(col::finish_claimed_at),
                    delivered_at: r.int(col::finish_delivered_at),
                    attempts: r.int(col::finish_attempts).unwrap_or(0),
                },
                give_up: SlotState {
                    claimed_at: r.int(col::give_up_claimed_at),
                    delivered_at: r.int(col::give_up_delivered_at),
                    attempts: r.int(col::give_up_attempts).unwrap_or(0),
                },
            }),
        }
    }

    /// The `started` event.
    fn started_event(&self) -> AgentToolEvent {
        AgentToolEvent::Started {
            run_id: self.run_id.clone(),
            agent_type: self.agent_type.clone(),
            input_preview: self.input_preview.clone(),
            order: self.display_order,
            display: self.display.clone(),
        }
    }

    /// The terminal event, for a run that has one.
    fn terminal_event(&self) -> Option<AgentToolEvent> {
        let run_id = self.run_id.clone();
        Some(match self.outcome.clone()? {
            Outcome::Completed { summary, .. } => AgentToolEvent::Finished { run_id, summary },
            Outcome::Error { error } => AgentToolEvent::Error { run_id, error },
            Outcome::Aborted { reason } => AgentToolEvent::Aborted { run_id, reason },
            Outcome::Interrupted { error, reason, child_still_running } => {
                AgentToolEvent::Interrupted { run_id, error, reason, child_still_running }
            }
        })
    }

    /// The terminal frame, with its recorded sequence.
    pub fn terminal_frame(&self) -> Option<EventFrame> {
        let seq = self.terminal_seq?;
        Some(EventFrame::new(self.parent_tool_call_id.clone(), seq, self.terminal_event()?))
    }

    /// The `started` frame.
    pub fn started_frame(&self) -> EventFrame {
        EventFrame::new(self.parent_tool_call_id.clone(), self.started_seq, self.started_event())
    }

    /// A chunk frame of this run.
    pub fn chunk_frame(&self, seq: i64, body: String) -> EventFrame {
        EventFrame::chunk(self.parent_tool_call_id.clone(), seq, &self.run_id, body)
    }
}
