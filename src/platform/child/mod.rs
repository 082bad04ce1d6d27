//! The child role: an agent running agent-tool runs for its parent.
//!
//! A child serves its parent over internal routes (the Worker entry never routes here): `start`
//! begins a run and returns at once while the turn runs on; `tail` streams the stored chunks
//! after a cursor and then the live ones, with no gap and no duplicate between the two (the log
//! is read and the subscriber registered in one synchronous step, and every chunk is stored and
//! fanned out in one synchronous step); `inspect` and `cancel` do what they say. Clients reach
//! the child's own chat only through the parent's drill-in gate.

mod api;
mod turn;

use futures::channel::mpsc;

pub use turn::{Turn, TurnOutput};

use super::{now_ms, random_id, AgentHost};
use crate::agent::Agent;
use crate::cancel::CancelToken;
use crate::child::progress::{Coalescer, Report};
use crate::child::runs::ChildRun;
use crate::protocol::chunk;
use crate::protocol::tail::{ChunkKind, OutcomeStatus, RunOutcome, TailLine};

/// A run whose turn runs in this instance.
pub(crate) struct LiveRun {
    pub(crate) subscribers: Vec<mpsc::UnboundedSender<Vec<u8>>>,
    pub(crate) next_index: i64,
    pub(crate) cancel: CancelToken,
    pub(crate) terminal_only: bool,
    pub(crate) progress: Coalescer,
}

const LOST_TURN: &str =
    "the child's turn stopped when its Durable Object restarted; its partial output is kept, not re-run";

impl<A: Agent> AgentHost<A> {
    /// Stores a chunk, sends it to the agent's own chat clients, and fans it out to the tails,
    /// in one synchronous step. Progress is not stored. Chat clients get a run's chunks only
    /// while its chat stream is open (between its `start` and its final frame): a chat client
    /// would take a chunk outside that window for a new message.
    pub(crate) fn emit(&self, run_id: &str, kind: ChunkKind, body: String) -> bool {
        self.emit_kept(run_id, kind, body, None)
    }

    /// [`AgentHost::emit`], with what the parent keeps for replay when it differs from `body`.
    fn emit_kept(&self, run_id: &str, kind: ChunkKind, body: String, kept: Option<String>) -> bool {
        let inner = &self.0;
        let mut live = inner.live.borrow_mut();
        let Some(run) = live.get_mut(run_id) else { return false };
        let streaming = inner.chat.is_streaming(run_id);
        let index = match kind {
            ChunkKind::Progress => {
                if streaming {
                    inner.chat.send(&inner.state, run_id, &body);
                }
                None
            }
            ChunkKind::Stored | ChunkKind::Milestone => {
                let index = run.next_index;
                if !inner.chat.store(run_id, index, kind, &body) {
                    return false;
                }
                if streaming && (kind == ChunkKind::Milestone || !run.terminal_only) {
                    inner.chat.send(&inner.state, run_id, &body);
                }
                run.next_index += 1;
                Some(index)
            }
        };
        let line = TailLine::Chunk { i: index, k: kind, b: body, r: kept }.to_line().into_bytes();
        run.subscribers.retain(|s| s.unbounded_send(line.clone()).is_ok());
        true
    }

    /// Sends a progress report: live with its `data`, kept for replay without it unless
    /// persisted.
    pub(crate) fn emit_progress(&self, run_id: &str, report: &Report) {
        if let Ok(snapshot) = serde_json::to_value(report.kept()) {
            if let Err(e) = self.runs().record_progress(run_id, &snapshot, now_ms()) {
                worker::console_error!("agent-tools: progress of {run_id} failed: {e}");
            }
        }
        let id = random_id();
        let live = chunk::progress(&id, &report.progress);
        let kept = (!report.persist && report.progress.data.is_some()).then(|| chunk::progress(&id, &report.kept()));
        self.emit_kept(run_id, ChunkKind::Progress, live, kept);
    }

    /// Sends the progress report a burst held back, if any.
    pub(crate) fn flush_progress(&self, run_id: &str) {
        let held = self.0.live.borrow_mut().get_mut(run_id).and_then(|run| run.progress.flush(now_ms()));
        if let Some(report) = held {
            self.emit_progress(run_id, &report);
        }
    }

    /// Records the outcome (unless the run already ended), sends the `end` line to every tail
    /// and closes them. Held progress goes out first: the latest report is never lost.
    pub(crate) fn seal(&self, run_id: &str, outcome: &RunOutcome) {
        self.flush_progress(run_id);
        if let Err(e) = self.runs().finish(run_id, outcome, now_ms()) {
            worker::console_error!("agent-tools: sealing {run_id} failed: {e}");
        }
        let stored = self.runs().get(run_id).ok().flatten().and_then(|r| r.outcome());
        let line = TailLine::End { outcome: stored.unwrap_or_else(|| outcome.clone()) }.to_line().into_bytes();
        if let Some(run) = self.0.live.borrow_mut().remove(run_id) {
            for s in run.subscribers {
                let _ = s.unbounded_send(line.clone());
            }
        }
    }

    /// A `starting`/`running` row with no turn in this instance lost its turn in a restart:
    /// seal it with a clear error rather than leave it running forever.
    pub(crate) fn reconcile(&self, run: ChildRun) -> ChildRun {
        if run.status.is_terminal() || self.0.live.borrow().contains_key(&run.run_id) {
            return run;
        }
        let outcome =
            RunOutcome { status: OutcomeStatus::Error, summary: None, output: None, error: Some(LOST_TURN.into()) };
        self.seal(&run.run_id, &outcome);
        self.runs().get(&run.run_id).ok().flatten().unwrap_or(run)
    }
}
