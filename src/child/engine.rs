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
use std::rc::Rc;

use serde_json::Value;

use super::progress::{Coalescer, Decision, Report};
use super::runs::{ChildRun, ChildRuns};
use crate::chat::store::StreamLog;
use crate::observability::EventType;
use crate::protocol::child_api::InspectionReply;
use crate::protocol::child_api::{StartReply, StartRequest};
use crate::protocol::chunk;
use crate::protocol::outcome::{Outcome, RunStatus};
use crate::protocol::tail::{ChunkKind, TailLine};
use crate::store::{Sql, StoreError};
use crate::types::{RecoveryAttempt, RecoveryPolicy};

/// The most attempts a run gets across restarts before `Rerun` gives up and seals it, unless
/// [`crate::AgentToolOptions::max_recovery_attempts`] says otherwise: a turn that keeps taking its
/// Durable Object down with it must not loop forever.
pub const MAX_ATTEMPTS: i64 = crate::types::DEFAULT_MAX_RECOVERY_ATTEMPTS as i64;

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
#[derive(Debug, Clone)]
struct LiveRun {
    subscribers: Vec<SubscriberId>,
    next_index: i64,
    terminal_only: bool,
    progress: Coalescer,
    /// Chunks emitted since the last flush, in order: stored and sent together.
    pending: Vec<Pending>,
    /// Milestones earlier attempts of the run reached: this attempt does not report them again
    /// (a milestone is reached once per run and name, however many attempts it takes).
    earlier_milestones: Vec<String>,
    /// Where the work of the run's recovery is measured from (see [`ChildRun::work_from`]).
    work_from: Option<i64>,
}

/// A chunk emitted but not yet stored nor sent.
#[derive(Debug, Clone)]
struct Pending {
    index: Option<i64>,
    kind: ChunkKind,
    body: String,
    kept: Option<String>,
    /// A kind the child's own chat clients get (when its chat stream is open at the flush).
    chat: bool,
}

/// The names of the milestones a run has reached so far (before the attempt about to begin):
/// those in its log, which every tail and replay carries. (A milestone the turn reported but
/// whose chunk a restart kept from the log was never seen: the new attempt may report it.)
fn earlier_milestones(sql: &(impl Sql + ?Sized), run_id: &str) -> Result<Vec<String>, StoreError> {
    ChildRuns::new(sql).logged_milestones(run_id)
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

impl From<StoreError> for TailError {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
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
    max_attempts: i64,
    max_work: Option<u64>,
    keep_recovering: KeepRecovering,
    live: HashMap<String, LiveRun>,
    next_subscriber: SubscriberId,
}

/// The agent's [`crate::Agent::should_keep_recovering`], asked before a re-run.
#[derive(Clone)]
pub struct KeepRecovering(pub Rc<dyn Fn(&RecoveryAttempt) -> bool>);

impl std::fmt::Debug for KeepRecovering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeepRecovering(..)")
    }
}

impl Default for KeepRecovering {
    fn default() -> Self {
        Self(Rc::new(|_| true))
    }
}

/// The chunks a run stored from log index `from` on, when its next index is `next_index`.
fn work_since(from: i64, next_index: i64) -> u64 {
    u64::try_from(next_index - from).unwrap_or(0)
}

/// `agent_tool:recovery:sealed`: the child sealed the run's `attempt`, for `reason`.
fn sealed_event(run_id: &str, attempt: i64, reason: &str) -> ChildAction {
    ChildAction::Observe(
        EventType::ChildSealed,
        serde_json::json!({ "runId": run_id, "attempt": attempt, "reason": reason }),
    )
}

/// Why a run gets another attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rerun {
    /// A restart cut its turn short.
    Restart,
    /// A parent dispatched it again after it was sealed.
    Redispatched,
}

const LOST_TURN: &str = "the child's turn stopped when its Durable Object restarted; its partial output is kept, \
     and dispatching the same run again runs it afresh";

impl ChildEngine {
    /// A fresh engine (a new instance: nothing is live).
    pub fn new(policy: RecoveryPolicy) -> Self {
        Self {
            policy,
            max_attempts: MAX_ATTEMPTS,
            max_work: Some(crate::types::DEFAULT_MAX_RECOVERY_WORK),
            keep_recovering: KeepRecovering::default(),
            live: HashMap::new(),
            next_subscriber: 0,
        }
    }

    /// With `Rerun`: at most `max_attempts` attempts a run, at most `max_work` chunks streamed
    /// from its first interruption on, each re-run asked of `keep` first.
    pub fn with_recovery(mut self, max_attempts: u32, max_work: Option<u64>, keep: KeepRecovering) -> Self {
        self.max_attempts = i64::from(max_attempts.max(1));
        self.max_work = max_work;
        self.keep_recovering = keep;
        self
    }

    /// The work a run streamed since a restart first cut it short, when that is past the
    /// bound: its next index is `next_index`. (Only a re-run under `Rerun` starts measuring.)
    fn over_budget(&self, work_from: Option<i64>, next_index: i64) -> Option<u64> {
        let work = work_since(work_from?, next_index);
        self.max_work.filter(|max| work > *max).map(|_| work)
    }

    /// The outcome of a run sealed for streaming `work` chunks past the bound.
    fn work_exceeded(&self, work: u64) -> Outcome {
        Outcome::sealed(format!(
            "the child's turn streamed {work} chunks since a restart first cut it short, past max_recovery_work ({}); \
             it was stopped and its partial output is kept",
            self.max_work.unwrap_or_default()
        ))
    }

    /// Whether the run's turn runs here.
    pub fn is_live(&self, run_id: &str) -> bool {
        self.live.contains_key(run_id)
    }

    /// A parent's start: creates the run (idempotent by run id) and begins its turn, or starts
    /// a sealed run afresh, or heals one whose turn a restart took. One unit, as each of the
    /// child's decisions (`unit`): a failed statement leaves neither storage nor memory changed.
    pub fn start(
        &mut self,
        sql: &(impl Sql + ?Sized),
        start: &StartRequest,
        now: i64,
    ) -> Result<(StartReply, Vec<ChildAction>), StoreError> {
        self.unit(sql, &start.run_id, |engine| engine.take_start(sql, start, now))
    }

    fn take_start(
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
            self.go_live(&run, 0, Vec::new(), None);
            actions.push(ChildAction::BeginTurn { run_id: run.run_id.clone(), input: run.input.clone(), attempt: 1 });
            return Ok((StartReply { created, status: "running".into() }, actions));
        }
        let run = match run.status {
            // Sealed after a restart: a new dispatch runs it afresh.
            RunStatus::Interrupted => {
                actions.extend(self.new_attempt(sql, &run, Rerun::Redispatched)?);
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
        if !run.status.is_live() || self.is_live(&run.run_id) {
            return Ok(run);
        }
        let runs = ChildRuns::new(sql);
        let next_index = StreamLog::new(sql).next_index(&run.run_id)?;
        if next_index <= run.attempt_start {
            // Accepted, or begun again, but nothing of the attempt was streamed before the
            // instance restarted: beginning it now is no rerun.
            runs.mark_running(&run.run_id)?;
            self.go_live(&run, next_index, earlier_milestones(sql, &run.run_id)?, run.work_from);
            actions.push(ChildAction::BeginTurn {
                run_id: run.run_id.clone(),
                input: run.input.clone(),
                attempt: run.attempt,
            });
        } else if let Some(work) = self.over_budget(run.work_from, next_index) {
            // A runaway that a restart cut short again: no re-run (the bound a live turn meets
            // as it streams, met here before its next attempt).
            actions.extend(self.seal_lost_turn(sql, &run, &self.work_exceeded(work), "work_budget_exceeded", now)?);
        } else if self.policy == RecoveryPolicy::Rerun
            && run.attempt < self.max_attempts
            && (self.keep_recovering.0)(&RecoveryAttempt {
                run_id: run.run_id.clone(),
                attempt: u32::try_from(run.attempt).unwrap_or(u32::MAX),
                chunks: u64::try_from(next_index).unwrap_or(0),
                work: run.work_from.map_or(0, |from| work_since(from, next_index)),
            })
        {
            actions.extend(self.new_attempt(sql, &run, Rerun::Restart)?);
        } else {
            let (error, reason) = match self.policy {
                RecoveryPolicy::Rerun if run.attempt >= self.max_attempts => (
                    format!(
                        "the child's turn was cut short by a restart {} times; it is not run again by itself",
                        run.attempt
                    ),
                    "max_attempts_exceeded",
                ),
                RecoveryPolicy::Rerun => (
                    format!(
                        "the child's turn was cut short by a restart after {} attempt(s), and should_keep_recovering \
                         declined another; its partial output is kept",
                        run.attempt
                    ),
                    "recovery_aborted",
                ),
                RecoveryPolicy::Seal => (LOST_TURN.to_owned(), "sealed_by_policy"),
            };
            actions.extend(self.seal_lost_turn(sql, &run, &Outcome::sealed(error), reason, now)?);
        }
        Ok(runs.get(&run.run_id)?.unwrap_or(run))
    }

    /// Ends a run that lost its turn, without running it again: `reason` says which bound or
    /// policy sealed it.
    fn seal_lost_turn(
        &self,
        sql: &(impl Sql + ?Sized),
        run: &ChildRun,
        outcome: &Outcome,
        reason: &str,
        now: i64,
    ) -> Result<Vec<ChildAction>, StoreError> {
        ChildRuns::new(sql).finish(&run.run_id, outcome, now)?;
        Ok(vec![sealed_event(&run.run_id, run.attempt, reason)])
    }

    /// Starts the run's next attempt: the marker chunk first (stored, so every tail and every
    /// replay has it at the same place), then the turn again from the stored input. A re-run
    /// after a restart measures the recovery's work from the first one on; a new dispatch
    /// begins afresh, unmeasured.
    fn new_attempt(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run: &ChildRun,
        why: Rerun,
    ) -> Result<Vec<ChildAction>, StoreError> {
        let log = StreamLog::new(sql);
        let marker_index = log.next_index(&run.run_id)?;
        let attempt = run.attempt + 1;
        let reason = match why {
            Rerun::Restart => "restart",
            Rerun::Redispatched => "redispatched",
        };
        let work_from = match why {
            Rerun::Restart => Some(run.work_from.unwrap_or(marker_index + 1)),
            Rerun::Redispatched => None,
        };
        log.append(&run.run_id, marker_index, ChunkKind::Superseded, &chunk::superseded(attempt, reason))?;
        ChildRuns::new(sql).begin_attempt(&run.run_id, marker_index + 1, work_from)?;
        self.go_live(run, marker_index + 1, earlier_milestones(sql, &run.run_id)?, work_from);
        Ok(vec![
            ChildAction::SupersedeMessages { run_id: run.run_id.clone() },
            ChildAction::Observe(
                EventType::ChildRerun,
                serde_json::json!({ "runId": run.run_id, "attempt": attempt, "reason": reason }),
            ),
            ChildAction::BeginTurn { run_id: run.run_id.clone(), input: run.input.clone(), attempt },
        ])
    }

    fn go_live(&mut self, run: &ChildRun, next_index: i64, earlier_milestones: Vec<String>, work_from: Option<i64>) {
        let live = LiveRun {
            subscribers: Vec::new(),
            next_index,
            terminal_only: run.terminal_only,
            progress: Coalescer::default(),
            pending: Vec::new(),
            earlier_milestones,
            work_from,
        };
        self.live.insert(run.run_id.clone(), live);
    }

    /// The run's turn begins: the run is `running` from now on.
    pub fn turn_begins(&mut self, sql: &(impl Sql + ?Sized), run_id: &str) -> Result<(), StoreError> {
        ChildRuns::new(sql).mark_running(run_id).map(drop)
    }

    /// The run's turn is over, as the platform saw it: `returned` is what it returned (its
    /// summary and output, or its error), `None` when a cancel dropped it; `cancelled` holds the
    /// cancel's reason when the run was cancelled. A cancelled run ends `aborted` whatever its
    /// turn returned (a dropped turn's stream gets its `abort` chunk); otherwise the turn's
    /// result is the run's. Then [`Self::turn_ended`], all as one unit.
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
        self.unit(sql, run_id, |engine| {
            engine.finish_turn(sql, run_id, returned, cancelled, chat_streaming, new_id, now)
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn finish_turn(
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
        let aborted = Outcome::aborted;
        let outcome = match (returned, cancelled) {
            (returned, Some(reason)) => {
                if returned.is_none() {
                    let abort = chunk::abort(reason.as_deref());
                    actions.extend(self.emit(sql, run_id, ChunkKind::Stored, abort, None, chat_streaming, now)?.1);
                }
                aborted(reason)
            }
            (Some(Ok((summary, output))), None) => Outcome::Completed { summary, output },
            (Some(Err(message)), None) => Outcome::failed(message),
            (None, None) => aborted(None),
        };
        actions.extend(self.end_turn(sql, run_id, &outcome, chat_streaming, new_id, now)?);
        Ok(actions)
    }

    /// The run's turn ended with `outcome`: held progress goes out first, the outcome is
    /// recorded (unless the run already ended), every tail gets the `end` line and is closed.
    /// One unit: when a statement fails, storage and the run's memory are as they were (the
    /// chunks it held are still held, no tail was sent anything), so the platform can take the
    /// same end again ([`Self::turn_lost`] when it gives up).
    #[cfg(test)]
    pub fn turn_ended(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        outcome: &Outcome,
        chat_streaming: bool,
        new_id: &dyn Fn() -> String,
        now: i64,
    ) -> Result<Vec<ChildAction>, StoreError> {
        self.unit(sql, run_id, |engine| engine.end_turn(sql, run_id, outcome, chat_streaming, new_id, now))
    }

    fn end_turn(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        outcome: &Outcome,
        chat_streaming: bool,
        new_id: &dyn Fn() -> String,
        now: i64,
    ) -> Result<Vec<ChildAction>, StoreError> {
        let mut actions = self.flush_progress(sql, run_id, chat_streaming, new_id, now)?;
        actions.extend(self.flush(sql, run_id, chat_streaming)?);
        actions.extend(self.seal(sql, run_id, outcome, now)?);
        Ok(actions)
    }

    /// Runs `work` as one unit of storage for `run_id`: when it fails, its statements are rolled
    /// back and the run's memory (held chunks, next index, progress window, tails, whether its
    /// turn runs here) is restored.
    pub(super) fn unit<T, E: From<StoreError>>(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        work: impl FnOnce(&mut Self) -> Result<T, E>,
    ) -> Result<T, E> {
        let before = self.live.get(run_id).cloned();
        let done = crate::store::atomic(sql, || work(self));
        if done.is_err() {
            match before {
                Some(run) => self.live.insert(run_id.to_owned(), run),
                None => self.live.remove(run_id),
            };
        }
        done
    }

    /// The platform could not record the end of the run's turn (storage kept failing): the run
    /// is no longer live here, and its tails are closed without an `end` line, so each parent
    /// asks where the run stands and the next request heals it by the recovery policy, as after
    /// a restart (what the turn emitted and could not store is lost with it).
    pub fn turn_lost(&mut self, run_id: &str) -> Vec<ChildAction> {
        let Some(run) = self.live.remove(run_id) else { return Vec::new() };
        let mut actions: Vec<ChildAction> =
            run.subscribers.into_iter().map(|subscriber| ChildAction::Close { subscriber }).collect();
        actions.push(ChildAction::Observe(
            EventType::StorageFailed,
            serde_json::json!({ "runId": run_id, "step": "child turn end", "error": "the end of the turn could not be stored; the run is healed by its recovery policy" }),
        ));
        actions
    }

    fn seal(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        outcome: &Outcome,
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
        self.unit(sql, run_id, |engine| engine.open_tail(sql, run_id, after, page, chat_streaming, now))
    }

    fn open_tail(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        after: i64,
        page: usize,
        chat_streaming: bool,
        now: i64,
    ) -> Result<(TailStart, Vec<ChildAction>), TailError> {
        let runs = ChildRuns::new(sql);
        let run = runs.get(run_id)?.ok_or(TailError::Unknown)?;
        // What the turn emitted so far goes to the log (and the tails already open) first.
        let mut actions = self.flush(sql, run_id, chat_streaming)?;
        let run = self.reconcile(sql, run, now, &mut actions)?;
        let chunks = runs.chunks_after(run_id, after, page.max(1))?;
        let full = chunks.len() >= page.max(1);
        let last = chunks.last().map_or(after, |c| c.index);
        let mut lines: Vec<Vec<u8>> = chunks
            .into_iter()
            .map(|c| TailLine::Chunk { i: Some(c.index), k: c.kind, b: c.body, r: None }.to_line().into_bytes())
            .collect();
        if full {
            return Ok((TailStart { lines, subscriber: None, more_after: Some(last) }, actions));
        }
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
    ) -> Result<(Option<InspectionReply>, Vec<ChildAction>), StoreError> {
        self.unit(sql, run_id, |engine| engine.take_inspection(sql, run_id, chat_streaming, now))
    }

    fn take_inspection(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        chat_streaming: bool,
        now: i64,
    ) -> Result<(Option<InspectionReply>, Vec<ChildAction>), StoreError> {
        let runs = ChildRuns::new(sql);
        let mut actions = self.flush(sql, run_id, chat_streaming)?;
        let Some(run) = runs.get(run_id)? else { return Ok((None, actions)) };
        self.reconcile(sql, run, now, &mut actions)?;
        // Read again: reconciling may have ended it.
        let reply = match runs.get(run_id)? {
            Some(run) => Some(run.reply(runs.next_index(run_id)?)),
            None => None,
        };
        Ok((reply, actions))
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
        // The row is written only while it is live (an ended or unknown run stays as it is).
        self.unit(sql, run_id, |engine| engine.seal(sql, run_id, &Outcome::aborted(reason), now))
    }

    /// The instance's storage was wiped (a parent cleared the child): nothing is live.
    pub fn reset(&mut self) {
        self.live.clear();
    }
}

mod stream;

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests;
