//! The child's side of a run as a state machine: it takes what happens (a start request, a
//! chunk the turn emits, a tail or an inspection the parent asks for, the turn's end, a cancel)
//! with the time, keeps the run's rows over [`Sql`], and returns [`ChildAction`]s for the
//! platform to carry out (begin or cancel the user's turn, write to a tail, send to the child's
//! own chat clients, set a timer). No I/O here, no clock of its own: the platform and the
//! deterministic simulation drive the same code.
//!
//! The invariants it keeps:
//! - a run's log takes every stored chunk once, with the next index, in the order emitted, and
//!   the same synchronous step sends it to every tail; a tail reads the log after its cursor
//!   and subscribes in one step, so it sees every chunk once, stored or live;
//! - a turn runs at most once per instance and run: a start of a run already live here begins
//!   nothing;
//! - a run whose turn is gone (the instance restarted) is healed once per activation, by the
//!   agent's [`RecoveryPolicy`]: `Rerun` starts a new attempt (a `data-agent-superseded`
//!   marker, then the turn again from the stored input), `Seal` ends it `interrupted`; either
//!   way no attempt's output is ever joined to another's.

use std::collections::HashMap;

use serde_json::Value;

use super::progress::{Coalescer, Decision, Report};
use super::runs::{ChildRun, ChildRuns, ChildStatus, Inspection};
use crate::chat::store::StreamLog;
use crate::observability::EventType;
use crate::protocol::child_api::{StartReply, StartRequest};
use crate::protocol::chunk;
use crate::protocol::tail::{ChunkKind, OutcomeStatus, RunOutcome, TailLine};
use crate::store::{Sql, StoreError};
use crate::types::RecoveryPolicy;

/// The most attempts a run gets across restarts before `Rerun` gives up and seals it: a turn
/// that keeps taking its Durable Object down with it must not loop forever.
pub const MAX_ATTEMPTS: i64 = 3;

/// A tail reader, as the platform knows it.
pub type SubscriberId = u64;

/// What the platform must do for the child.
#[derive(Debug, Clone, PartialEq)]
pub enum ChildAction {
    /// Run the agent's turn for this run (its attempt `attempt`).
    BeginTurn {
        /// The run.
        run_id: String,
        /// Its stored input.
        input: Value,
        /// Which attempt this is (from 1).
        attempt: i64,
    },
    /// Stop the run's turn.
    CancelTurn {
        /// The run.
        run_id: String,
        /// Why.
        reason: Option<String>,
    },
    /// Write a line to a tail.
    Send {
        /// The tail.
        subscriber: SubscriberId,
        /// One NDJSON line.
        line: Vec<u8>,
    },
    /// End a tail (after its `end` line).
    Close {
        /// The tail.
        subscriber: SubscriberId,
    },
    /// Send chunks to the child's own chat clients (a drill-in), if its chat stream is open.
    ChatSend {
        /// The run (its chat stream's id).
        run_id: String,
        /// The `UIMessageChunk`s' JSON, in order.
        bodies: Vec<String>,
    },
    /// Call [`ChildEngine::flush`] for the run once the turn yields (its first chunk since the
    /// last flush was buffered).
    FlushSoon {
        /// The run.
        run_id: String,
    },
    /// Mark the messages a restart cut short in the run's chat stream as superseded.
    SupersedeMessages {
        /// The run.
        run_id: String,
    },
    /// An observability event.
    Observe(EventType, Value),
}

/// A run whose turn runs in this instance.
#[derive(Debug)]
struct LiveRun {
    subscribers: Vec<SubscriberId>,
    next_index: i64,
    terminal_only: bool,
    progress: Coalescer,
    /// Chunks emitted since the last flush, in order: stored and sent together.
    pending: Vec<Pending>,
}

/// A chunk emitted but not yet stored nor sent.
#[derive(Debug)]
struct Pending {
    index: Option<i64>,
    kind: ChunkKind,
    body: String,
    kept: Option<String>,
    /// A kind the child's own chat clients get (when its chat stream is open at the flush).
    chat: bool,
}

/// Chunks a run buffers before it flushes without waiting for its turn to yield.
pub const FLUSH_EVERY: usize = 256;

/// Why a tail cannot start.
#[derive(Debug, Clone, PartialEq)]
pub enum TailError {
    /// The child has no such run.
    Unknown,
    /// The database failed.
    Store(StoreError),
}

/// A tail that started: what the log holds after the cursor, then (when the run is live here)
/// the subscriber that will get the rest.
#[derive(Debug, Clone, PartialEq)]
pub struct TailStart {
    /// Lines to send first, in order (ending with the `end` line when the run is over).
    pub lines: Vec<Vec<u8>>,
    /// The live subscription, when the run is still going (and the backlog fit in one page).
    pub subscriber: Option<SubscriberId>,
    /// The page was full: send `lines`, then tail again after this log index (no subscription
    /// and no `end` line yet). A long backlog goes out a page at a time, never all in memory.
    pub more_after: Option<i64>,
}

/// The child role's in-memory state: the runs live in this instance. Everything else is in
/// SQL, so a fresh engine after a restart knows what the old one stored.
#[derive(Debug)]
pub struct ChildEngine {
    policy: RecoveryPolicy,
    live: HashMap<String, LiveRun>,
    next_subscriber: SubscriberId,
}

const LOST_TURN: &str = "the child's turn stopped when its Durable Object restarted; its partial output is kept, \
     and dispatching the same run again runs it afresh";

impl ChildEngine {
    /// A fresh engine (a new instance: nothing is live).
    pub fn new(policy: RecoveryPolicy) -> Self {
        Self { policy, live: HashMap::new(), next_subscriber: 0 }
    }

    /// Whether the run's turn runs here.
    pub fn is_live(&self, run_id: &str) -> bool {
        self.live.contains_key(run_id)
    }

    /// A parent's start: creates the run (idempotent by run id) and begins its turn, or starts
    /// a sealed run afresh, or heals one whose turn a restart took.
    pub fn start(
        &mut self,
        sql: &(impl Sql + ?Sized),
        start: &StartRequest,
        now: i64,
    ) -> Result<(StartReply, Vec<ChildAction>), StoreError> {
        let runs = ChildRuns::new(sql);
        let (run, created) = runs.start(&start.run_id, &start.input, start.terminal_only, now)?;
        let mut actions = Vec::new();
        if created {
            // A drill-in chat turn may have used this id before the run existed.
            StreamLog::new(sql).delete(&run.run_id)?;
            self.go_live(&run, 0);
            actions.push(ChildAction::BeginTurn { run_id: run.run_id.clone(), input: run.input.clone(), attempt: 1 });
            return Ok((StartReply { created, status: "running".into() }, actions));
        }
        let run = match run.status {
            // Sealed after a restart: a new dispatch runs it afresh.
            ChildStatus::Interrupted => {
                actions.extend(self.new_attempt(sql, &run, "redispatched")?);
                runs.get(&run.run_id)?.unwrap_or(run)
            }
            _ => self.reconcile(sql, run, now, &mut actions)?,
        };
        Ok((StartReply { created, status: run.status.as_str().into() }, actions))
    }

    /// A run known here with no turn here lost it to a restart (or never began one): heal it by
    /// the recovery policy, once. Returns the row as it is now.
    fn reconcile(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run: ChildRun,
        now: i64,
        actions: &mut Vec<ChildAction>,
    ) -> Result<ChildRun, StoreError> {
        if run.status.is_terminal() || self.is_live(&run.run_id) {
            return Ok(run);
        }
        let runs = ChildRuns::new(sql);
        let next_index = StreamLog::new(sql).next_index(&run.run_id)?;
        if next_index <= run.attempt_start {
            // Accepted, or begun again, but nothing of the attempt was streamed before the
            // instance restarted: beginning it now is no rerun.
            runs.mark_running(&run.run_id)?;
            self.go_live(&run, next_index);
            actions.push(ChildAction::BeginTurn {
                run_id: run.run_id.clone(),
                input: run.input.clone(),
                attempt: run.attempt,
            });
        } else if self.policy == RecoveryPolicy::Rerun && run.attempt < MAX_ATTEMPTS {
            actions.extend(self.new_attempt(sql, &run, "restart")?);
        } else {
            let error = if self.policy == RecoveryPolicy::Rerun {
                format!(
                    "the child's turn was cut short by a restart {MAX_ATTEMPTS} times; it is not run again by itself"
                )
            } else {
                LOST_TURN.to_owned()
            };
            let outcome =
                RunOutcome { status: OutcomeStatus::Interrupted, summary: None, output: None, error: Some(error) };
            runs.finish(&run.run_id, &outcome, now)?;
            actions.push(ChildAction::Observe(
                EventType::ChildSealed,
                serde_json::json!({ "runId": run.run_id, "attempt": run.attempt }),
            ));
        }
        Ok(runs.get(&run.run_id)?.unwrap_or(run))
    }

    /// Starts the run's next attempt: the marker chunk first (stored, so every tail and every
    /// replay has it at the same place), then the turn again from the stored input.
    fn new_attempt(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run: &ChildRun,
        reason: &str,
    ) -> Result<Vec<ChildAction>, StoreError> {
        let log = StreamLog::new(sql);
        let marker_index = log.next_index(&run.run_id)?;
        let attempt = run.attempt + 1;
        log.append(&run.run_id, marker_index, ChunkKind::Superseded, &chunk::superseded(attempt, reason))?;
        ChildRuns::new(sql).begin_attempt(&run.run_id, marker_index + 1)?;
        self.go_live(run, marker_index + 1);
        Ok(vec![
            ChildAction::SupersedeMessages { run_id: run.run_id.clone() },
            ChildAction::Observe(
                EventType::ChildRerun,
                serde_json::json!({ "runId": run.run_id, "attempt": attempt, "reason": reason }),
            ),
            ChildAction::BeginTurn { run_id: run.run_id.clone(), input: run.input.clone(), attempt },
        ])
    }

    fn go_live(&mut self, run: &ChildRun, next_index: i64) {
        let live = LiveRun {
            subscribers: Vec::new(),
            next_index,
            terminal_only: run.terminal_only,
            progress: Coalescer::default(),
            pending: Vec::new(),
        };
        self.live.insert(run.run_id.clone(), live);
    }

    /// The turn streams one chunk: stored with the next index (progress is not stored), sent to
    /// the child's own chat clients when `chat_streaming` (its chat stream is open; ordinary
    /// chunks not under `terminal` delivery), and to every tail, in one step. `kept` is what
    /// the parent keeps for replay when it differs from `body`. `false` when the run is not
    /// live here (it ended).
    pub fn emit(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        kind: ChunkKind,
        body: String,
        kept: Option<String>,
        chat_streaming: bool,
    ) -> Result<(bool, Vec<ChildAction>), StoreError> {
        let Some(run) = self.live.get_mut(run_id) else { return Ok((false, Vec::new())) };
        let index = kind.is_stored().then(|| {
            run.next_index += 1;
            run.next_index - 1
        });
        let chat = match kind {
            ChunkKind::Stored => !run.terminal_only,
            ChunkKind::Progress | ChunkKind::Milestone => true,
            ChunkKind::Superseded => false,
        };
        run.pending.push(Pending { index, kind, body, kept, chat });
        if run.pending.len() >= FLUSH_EVERY {
            return Ok((true, self.flush(sql, run_id, chat_streaming)?));
        }
        let first = run.pending.len() == 1;
        Ok((true, if first { vec![ChildAction::FlushSoon { run_id: run_id.to_owned() }] } else { Vec::new() }))
    }

    /// Stores the chunks the run emitted since the last flush (a few statements for the lot)
    /// and, in the same step, sends them to its chat clients (when `chat_streaming`: its chat
    /// stream is open now) and, as one write, to every tail. Everything that reads the log or
    /// ends the run flushes first.
    pub fn flush(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        chat_streaming: bool,
    ) -> Result<Vec<ChildAction>, StoreError> {
        let Some(run) = self.live.get_mut(run_id) else { return Ok(Vec::new()) };
        if run.pending.is_empty() {
            return Ok(Vec::new());
        }
        let pending = std::mem::take(&mut run.pending);
        let stored: Vec<(i64, ChunkKind, &str)> =
            pending.iter().filter_map(|p| Some((p.index?, p.kind, p.body.as_str()))).collect();
        let appended = StreamLog::new(sql).append_many(run_id, &stored);
        drop(stored);
        if let Err(e) = appended {
            // Kept for the next flush (the append is idempotent by index): nothing the turn
            // emitted is lost to a failed statement.
            if let Some(run) = self.live.get_mut(run_id) {
                let later = std::mem::replace(&mut run.pending, pending);
                run.pending.extend(later);
            }
            return Err(e);
        }
        let mut actions = Vec::new();
        let mut lines = Vec::new();
        let mut chat = Vec::new();
        for p in pending {
            if chat_streaming && p.chat {
                chat.push(p.body.clone());
            }
            lines.extend(TailLine::Chunk { i: p.index, k: p.kind, b: p.body, r: p.kept }.to_line().into_bytes());
        }
        if !chat.is_empty() {
            actions.push(ChildAction::ChatSend { run_id: run_id.to_owned(), bodies: chat });
        }
        for &subscriber in &run.subscribers {
            actions.push(ChildAction::Send { subscriber, line: lines.clone() });
        }
        Ok(actions)
    }

    /// A progress report of the run's turn: a milestone is stored at once with the next
    /// sequence; plain progress is coalesced (see [`Coalescer`]) and its latest snapshot kept on
    /// the row.
    pub fn report_progress(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        report: Report,
        chat_streaming: bool,
        new_id: &dyn Fn() -> String,
        now: i64,
    ) -> Result<Vec<ChildAction>, StoreError> {
        let Some(run) = self.live.get_mut(run_id) else {
            return Ok(vec![ChildAction::Observe(
                EventType::ProgressIgnored,
                serde_json::json!({ "runId": run_id, "why": "report_progress outside a live run" }),
            )]);
        };
        let decision = run.progress.offer(report.clone(), now);
        if let Some(name) = report.progress.milestone.clone() {
            let sequence = ChildRuns::new(sql).add_milestone(run_id, &name, report.progress.data.as_ref(), now)?;
            let body = chunk::milestone(&name, sequence, now, &report.progress);
            return Ok(self.emit(sql, run_id, ChunkKind::Milestone, body, None, chat_streaming)?.1);
        }
        match decision {
            Decision::Emit(report) => self.send_progress(sql, run_id, &report, chat_streaming, new_id, now),
            // Held: its window's end is this engine's deadline (see `poll_timeout`).
            Decision::Defer { .. } | Decision::Replaced => Ok(Vec::new()),
        }
    }

    /// When the engine next needs the time (epoch ms): the end of a coalescing window that holds
    /// a report back. The platform calls [`Self::handle_timeout`] then.
    pub fn poll_timeout(&self) -> Option<i64> {
        self.live.values().filter_map(|run| run.progress.due()).min()
    }

    /// The time came: every coalescing window that ended sends the report it held back.
    /// `chat_streaming` says whether a run's chat stream is open.
    pub fn handle_timeout(
        &mut self,
        sql: &(impl Sql + ?Sized),
        chat_streaming: &dyn Fn(&str) -> bool,
        new_id: &dyn Fn() -> String,
        now: i64,
    ) -> Result<Vec<ChildAction>, StoreError> {
        let mut due: Vec<String> = self
            .live
            .iter()
            .filter(|(_, run)| run.progress.due().is_some_and(|at| at <= now))
            .map(|(id, _)| id.clone())
            .collect();
        due.sort();
        let mut actions = Vec::new();
        for run_id in due {
            actions.extend(self.flush_progress(sql, &run_id, chat_streaming(&run_id), new_id, now)?);
        }
        Ok(actions)
    }

    /// A coalescing window closed: sends the report it held back, if any.
    pub fn flush_progress(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        chat_streaming: bool,
        new_id: &dyn Fn() -> String,
        now: i64,
    ) -> Result<Vec<ChildAction>, StoreError> {
        let held = self.live.get_mut(run_id).and_then(|run| run.progress.flush(now));
        match held {
            Some(report) => self.send_progress(sql, run_id, &report, chat_streaming, new_id, now),
            None => Ok(Vec::new()),
        }
    }

    fn send_progress(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        report: &Report,
        chat_streaming: bool,
        new_id: &dyn Fn() -> String,
        now: i64,
    ) -> Result<Vec<ChildAction>, StoreError> {
        let snapshot = serde_json::to_value(report.kept()).unwrap_or(Value::Null);
        ChildRuns::new(sql).record_progress(run_id, &snapshot, now)?;
        let id = new_id();
        let live = chunk::progress(&id, &report.progress);
        let kept = (!report.persist && report.progress.data.is_some()).then(|| chunk::progress(&id, &report.kept()));
        Ok(self.emit(sql, run_id, ChunkKind::Progress, live, kept, chat_streaming)?.1)
    }

    /// The run's turn begins: the run is `running` from now on.
    pub fn turn_begins(&mut self, sql: &(impl Sql + ?Sized), run_id: &str) -> Result<(), StoreError> {
        ChildRuns::new(sql).mark_running(run_id).map(drop)
    }

    /// The run's turn is over, as the platform saw it: `returned` is what it returned (its
    /// summary and output, or its error), `None` when a cancel dropped it; `cancelled` holds the
    /// cancel's reason when the run was cancelled. A cancelled run ends `aborted` whatever its
    /// turn returned (a dropped turn's stream gets its `abort` chunk); otherwise the turn's
    /// result is the run's. Then [`Self::turn_ended`].
    #[allow(clippy::too_many_arguments)]
    pub fn turn_finished(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        returned: Option<Result<(String, Option<Value>), String>>,
        cancelled: Option<Option<String>>,
        chat_streaming: bool,
        new_id: &dyn Fn() -> String,
        now: i64,
    ) -> Result<Vec<ChildAction>, StoreError> {
        let mut actions = Vec::new();
        let aborted = |error| RunOutcome { status: OutcomeStatus::Aborted, summary: None, output: None, error };
        let outcome = match (returned, cancelled) {
            (returned, Some(reason)) => {
                if returned.is_none() {
                    let abort = chunk::abort(reason.as_deref());
                    actions.extend(self.emit(sql, run_id, ChunkKind::Stored, abort, None, chat_streaming)?.1);
                }
                aborted(reason)
            }
            (Some(Ok((summary, output))), None) => {
                RunOutcome { status: OutcomeStatus::Completed, summary: Some(summary), output, error: None }
            }
            (Some(Err(message)), None) => {
                RunOutcome { status: OutcomeStatus::Error, summary: None, output: None, error: Some(message) }
            }
            (None, None) => aborted(None),
        };
        actions.extend(self.turn_ended(sql, run_id, &outcome, chat_streaming, new_id, now)?);
        Ok(actions)
    }

    /// The run's turn ended with `outcome`: held progress goes out first, the outcome is
    /// recorded (unless the run already ended), every tail gets the `end` line and is closed.
    pub fn turn_ended(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        outcome: &RunOutcome,
        chat_streaming: bool,
        new_id: &dyn Fn() -> String,
        now: i64,
    ) -> Result<Vec<ChildAction>, StoreError> {
        let mut actions = self.flush_progress(sql, run_id, chat_streaming, new_id, now)?;
        actions.extend(self.flush(sql, run_id, chat_streaming)?);
        actions.extend(self.seal(sql, run_id, outcome, now)?);
        Ok(actions)
    }

    fn seal(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        outcome: &RunOutcome,
        now: i64,
    ) -> Result<Vec<ChildAction>, StoreError> {
        let runs = ChildRuns::new(sql);
        runs.finish(run_id, outcome, now)?;
        let stored = runs.get(run_id)?.and_then(|r| r.outcome());
        let line = TailLine::End { outcome: stored.unwrap_or_else(|| outcome.clone()) }.to_line().into_bytes();
        let mut actions = Vec::new();
        if let Some(run) = self.live.remove(run_id) {
            for subscriber in run.subscribers {
                actions.push(ChildAction::Send { subscriber, line: line.clone() });
                actions.push(ChildAction::Close { subscriber });
            }
        }
        Ok(actions)
    }

    /// A parent tails the run after log index `after`: the stored chunks, at most `page` of
    /// them, and once they are all out, for a live run, a subscription to the rest, in the same
    /// step (no gap, no duplicate); for an ended run, the `end` line. A full page asks for
    /// another ([`TailStart::more_after`]). A run that lost its turn is healed first.
    pub fn tail(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        after: i64,
        page: usize,
        chat_streaming: bool,
        now: i64,
    ) -> Result<(TailStart, Vec<ChildAction>), TailError> {
        let runs = ChildRuns::new(sql);
        let run = runs.get(run_id).map_err(TailError::Store)?.ok_or(TailError::Unknown)?;
        // What the turn emitted so far goes to the log (and the tails already open) first.
        let mut actions = self.flush(sql, run_id, chat_streaming).map_err(TailError::Store)?;
        let run = self.reconcile(sql, run, now, &mut actions).map_err(TailError::Store)?;
        let chunks = runs.chunks_after(run_id, after, page.max(1)).map_err(TailError::Store)?;
        if chunks.len() >= page.max(1) {
            let last = chunks.last().map_or(after, |c| c.index);
            let lines = chunks.into_iter().map(|c| TailLine::Chunk { i: Some(c.index), k: c.kind, b: c.body, r: None });
            let lines = lines.map(|l| l.to_line().into_bytes()).collect();
            return Ok((TailStart { lines, subscriber: None, more_after: Some(last) }, actions));
        }
        let mut lines: Vec<Vec<u8>> = chunks
            .into_iter()
            .map(|c| TailLine::Chunk { i: Some(c.index), k: c.kind, b: c.body, r: None }.to_line().into_bytes())
            .collect();
        let subscriber = match self.live.get_mut(run_id) {
            Some(live) => {
                self.next_subscriber += 1;
                live.subscribers.push(self.next_subscriber);
                Some(self.next_subscriber)
            }
            None => {
                if let Some(outcome) = run.outcome() {
                    lines.push(TailLine::End { outcome }.to_line().into_bytes());
                }
                None
            }
        };
        Ok((TailStart { lines, subscriber, more_after: None }, actions))
    }

    /// A tail went away (its reader closed): it gets nothing more. The run goes on.
    pub fn unsubscribe(&mut self, subscriber: SubscriberId) {
        for run in self.live.values_mut() {
            run.subscribers.retain(|s| *s != subscriber);
        }
    }

    /// A parent asks where the run stands. `None` when the run is unknown here (the parent
    /// keeps waiting: it is never "failed"). A run that lost its turn is healed first.
    pub fn inspect(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        chat_streaming: bool,
        now: i64,
    ) -> Result<(Option<Inspection>, Vec<ChildAction>), StoreError> {
        let runs = ChildRuns::new(sql);
        let mut actions = self.flush(sql, run_id, chat_streaming)?;
        if let Some(run) = runs.get(run_id)? {
            self.reconcile(sql, run, now, &mut actions)?;
        }
        Ok((runs.inspect(run_id)?, actions))
    }

    /// A parent cancels the run: a live turn is stopped (it ends `aborted` when its future is
    /// dropped); a run with no turn here is recorded `aborted` at once.
    pub fn cancel(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        reason: Option<String>,
        now: i64,
    ) -> Result<Vec<ChildAction>, StoreError> {
        if self.is_live(run_id) {
            return Ok(vec![ChildAction::CancelTurn { run_id: run_id.to_owned(), reason }]);
        }
        match ChildRuns::new(sql).get(run_id)? {
            Some(run) if !run.status.is_terminal() => {
                let outcome = RunOutcome { status: OutcomeStatus::Aborted, summary: None, output: None, error: reason };
                self.seal(sql, run_id, &outcome, now)
            }
            _ => Ok(Vec::new()),
        }
    }

    /// The instance's storage was wiped (a parent cleared the child): nothing is live.
    pub fn reset(&mut self) {
        self.live.clear();
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::store::sqlite;
    use serde_json::json;

    fn db() -> rusqlite::Connection {
        let db = sqlite::memory();
        ChildRuns::new(&db).migrate().unwrap();
        db
    }

    /// Emits a stored chunk and flushes it, as the platform does once the turn yields.
    fn emit_now(engine: &mut ChildEngine, db: &rusqlite::Connection, body: String) -> Vec<ChildAction> {
        let (_, mut actions) = engine.emit(db, "r", ChunkKind::Stored, body, None, false).unwrap();
        actions.extend(engine.flush(db, "r", false).unwrap());
        actions
    }

    #[test]
    fn emitted_chunks_are_stored_and_sent_together_once_the_turn_yields() {
        let db = db();
        let mut engine = ChildEngine::new(RecoveryPolicy::Rerun);
        engine.start(&db, &start("r"), 1).unwrap();
        let (tail, _) = engine.tail(&db, "r", -1, usize::MAX, false, 1).unwrap();
        let sub = tail.subscriber.unwrap();
        let (_, first) = engine.emit(&db, "r", ChunkKind::Stored, "{\"n\":0}".into(), None, false).unwrap();
        assert!(matches!(&first[..], [ChildAction::FlushSoon { .. }]), "one flush asked, on the first");
        let (_, second) = engine.emit(&db, "r", ChunkKind::Stored, "{\"n\":1}".into(), None, false).unwrap();
        assert!(second.is_empty());
        assert_eq!(StreamLog::new(&db).next_index("r").unwrap(), 0, "nothing stored before the flush");
        // A tail opened meanwhile flushes first: it reads both, and the open tail gets them too.
        let (late, actions) = engine.tail(&db, "r", -1, usize::MAX, false, 2).unwrap();
        assert_eq!(late.lines.len(), 2);
        let [ChildAction::Send { subscriber, line }] = &actions[..] else { panic!("{actions:?}") };
        assert_eq!((*subscriber, line.iter().filter(|b| **b == b'\n').count()), (sub, 2), "one write, two lines");
        assert!(engine.flush(&db, "r", false).unwrap().is_empty(), "nothing left");
        // A long burst flushes by itself.
        let mut flushed = 0;
        for n in 0..FLUSH_EVERY {
            let (_, actions) = engine.emit(&db, "r", ChunkKind::Stored, format!("{{\"m\":{n}}}"), None, false).unwrap();
            flushed += actions.iter().filter(|a| matches!(a, ChildAction::Send { .. })).count();
        }
        assert_eq!(flushed, 2, "the burst went out to both tails at its bound");
    }

    fn start(run_id: &str) -> StartRequest {
        StartRequest {
            run_id: run_id.into(),
            input: json!({"query": "q"}),
            parent_class: "P".into(),
            parent_name: "p".into(),
            child_name: format!("P/p/{run_id}"),
            terminal_only: false,
            tail_after: None,
        }
    }

    fn id() -> String {
        "id".into()
    }

    fn begins(actions: &[ChildAction]) -> Vec<i64> {
        actions
            .iter()
            .filter_map(|a| match a {
                ChildAction::BeginTurn { attempt, .. } => Some(*attempt),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_start_begins_one_turn_and_a_second_start_none() {
        let db = db();
        let mut engine = ChildEngine::new(RecoveryPolicy::Rerun);
        let (reply, actions) = engine.start(&db, &start("r"), 1).unwrap();
        assert!(reply.created);
        assert_eq!(begins(&actions), [1]);
        let (reply, actions) = engine.start(&db, &start("r"), 2).unwrap();
        assert!(!reply.created);
        assert_eq!(reply.status, "starting");
        assert!(begins(&actions).is_empty(), "a second start never begins a second turn");
    }

    #[test]
    fn a_tail_gets_the_log_then_live_chunks_then_the_end() {
        let db = db();
        let mut engine = ChildEngine::new(RecoveryPolicy::Rerun);
        engine.start(&db, &start("r"), 1).unwrap();
        emit_now(&mut engine, &db, "{\"n\":0}".into());
        let (tail, _) = engine.tail(&db, "r", -1, usize::MAX, false, 2).unwrap();
        assert_eq!(tail.lines.len(), 1);
        let sub = tail.subscriber.unwrap();
        let actions = emit_now(&mut engine, &db, "{\"n\":1}".into());
        assert!(
            matches!(&actions[..], [ChildAction::FlushSoon { .. }, ChildAction::Send { subscriber, .. }] if *subscriber == sub)
        );
        let done =
            RunOutcome { status: OutcomeStatus::Completed, summary: Some("s".into()), output: None, error: None };
        let actions = engine.turn_ended(&db, "r", &done, false, &id, 3).unwrap();
        assert!(matches!(&actions[..], [ChildAction::Send { .. }, ChildAction::Close { .. }]));
        let (tail, _) = engine.tail(&db, "r", 0, usize::MAX, false, 4).unwrap();
        assert_eq!(tail.lines.len(), 2, "the rest of the log and the end line");
        assert!(tail.subscriber.is_none());
    }

    #[test]
    fn a_long_backlog_goes_out_a_page_at_a_time_then_the_subscription() {
        let db = db();
        let mut engine = ChildEngine::new(RecoveryPolicy::Rerun);
        engine.start(&db, &start("r"), 1).unwrap();
        for n in 0..5 {
            emit_now(&mut engine, &db, format!("{{\"n\":{n}}}"));
        }
        let (first, _) = engine.tail(&db, "r", -1, 2, false, 2).unwrap();
        assert_eq!((first.lines.len(), first.more_after, first.subscriber), (2, Some(1), None));
        let (second, _) = engine.tail(&db, "r", 1, 2, false, 2).unwrap();
        assert_eq!((second.lines.len(), second.more_after), (2, Some(3)));
        // A chunk stored between pages is in a later one: nothing is skipped.
        emit_now(&mut engine, &db, "{\"n\":5}".into());
        let (third, _) = engine.tail(&db, "r", 3, 2, false, 2).unwrap();
        assert_eq!((third.lines.len(), third.more_after), (2, Some(5)));
        let (last, _) = engine.tail(&db, "r", 5, 2, false, 2).unwrap();
        assert!(last.lines.is_empty() && last.more_after.is_none());
        let sub = last.subscriber.expect("subscribed once the backlog is out");
        let actions = emit_now(&mut engine, &db, "{\"n\":6}".into());
        assert!(
            matches!(&actions[..], [ChildAction::FlushSoon { .. }, ChildAction::Send { subscriber, .. }] if *subscriber == sub)
        );
    }

    #[test]
    fn a_lost_turn_reruns_once_per_activation_behind_a_marker() {
        let db = db();
        let mut before = ChildEngine::new(RecoveryPolicy::Rerun);
        before.start(&db, &start("r"), 1).unwrap();
        emit_now(&mut before, &db, "{\"partial\":1}".into());
        // The instance restarts: a new engine over the same storage.
        let mut after = ChildEngine::new(RecoveryPolicy::Rerun);
        let (inspection, actions) = after.inspect(&db, "r", false, 5).unwrap();
        assert_eq!(begins(&actions), [2]);
        let inspection = inspection.unwrap();
        assert_eq!((inspection.run.status, inspection.run.attempt), (ChildStatus::Running, 2));
        let (_, again) = after.inspect(&db, "r", false, 6).unwrap();
        assert!(begins(&again).is_empty(), "never re-run twice for one restart");
        let (tail, _) = after.tail(&db, "r", -1, usize::MAX, false, 7).unwrap();
        assert_eq!(tail.lines.len(), 2, "the partial chunk and the marker");
        assert!(String::from_utf8_lossy(&tail.lines[1]).contains("\"k\":\"superseded\""));
    }

    #[test]
    fn sealing_keeps_the_partial_and_a_new_start_runs_afresh() {
        let db = db();
        let mut before = ChildEngine::new(RecoveryPolicy::Seal);
        before.start(&db, &start("r"), 1).unwrap();
        emit_now(&mut before, &db, "{\"partial\":1}".into());
        let mut after = ChildEngine::new(RecoveryPolicy::Seal);
        let (inspection, actions) = after.inspect(&db, "r", false, 5).unwrap();
        assert!(begins(&actions).is_empty());
        assert_eq!(inspection.unwrap().run.status, ChildStatus::Interrupted);
        let (reply, actions) = after.start(&db, &start("r"), 6).unwrap();
        assert_eq!((reply.created, reply.status.as_str()), (false, "running"));
        assert_eq!(begins(&actions), [2], "a new dispatch runs it afresh");
    }

    #[test]
    fn reruns_are_bounded() {
        let db = db();
        let mut engine = ChildEngine::new(RecoveryPolicy::Rerun);
        engine.start(&db, &start("r"), 1).unwrap();
        emit_now(&mut engine, &db, "{\"partial\":1}".into());
        for attempt in 2..=MAX_ATTEMPTS {
            engine = ChildEngine::new(RecoveryPolicy::Rerun);
            assert_eq!(begins(&engine.inspect(&db, "r", false, 5).unwrap().1), [attempt]);
            emit_now(&mut engine, &db, "{\"partial\":1}".into());
        }
        engine = ChildEngine::new(RecoveryPolicy::Rerun);
        let (inspection, actions) = engine.inspect(&db, "r", false, 9).unwrap();
        assert!(begins(&actions).is_empty());
        assert_eq!(inspection.unwrap().run.status, ChildStatus::Interrupted);
    }

    #[test]
    fn a_turn_cut_short_before_it_said_anything_begins_again_as_the_same_attempt() {
        let db = db();
        let mut before = ChildEngine::new(RecoveryPolicy::Seal);
        before.start(&db, &start("r"), 1).unwrap();
        ChildRuns::new(&db).mark_running("r").unwrap();
        // Even under `seal`: nothing was streamed, so nothing is lost or repeated.
        let mut after = ChildEngine::new(RecoveryPolicy::Seal);
        let (inspection, actions) = after.inspect(&db, "r", false, 5).unwrap();
        assert_eq!(begins(&actions), [1]);
        assert_eq!(inspection.unwrap().run.status, ChildStatus::Running);
        let (tail, _) = after.tail(&db, "r", -1, usize::MAX, false, 6).unwrap();
        assert!(tail.lines.is_empty(), "no marker: there is no earlier attempt to set apart");
    }
}
