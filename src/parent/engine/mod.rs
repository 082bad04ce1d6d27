//! The parent's side of its runs as a state machine: dispatch and admission, following a child
//! (tail, inspect, re-attach budgets), conclusion and delivery, cancel and clear, restart
//! recovery, the detached backbone (budgets, give-ups, deliveries) and watching a given-up child
//! for a late result.
//!
//! It takes what happened ([`ParentEvent`], a call such as [`ParentEngine::dispatch`], the
//! passing of time) with the time, keeps the registry and the ledger over [`Sql`], and returns
//! [`ParentAction`]s for the platform to carry out: send to clients, talk to a child, resolve a
//! waiting caller, call a hook, deliver an outcome. No I/O and no clock here: the platform drives
//! this code in a Durable Object and the deterministic simulation drives the same code natively.
//!
//! The contract it keeps:
//! - every exchange with a child carries a generation number, unique across instances; an answer
//!   to an exchange the engine has moved past (a tail it closed, an inspection that timed out, a
//!   start answered twice) is ignored, so late I/O can never act on a run twice;
//! - every decision is one unit of storage ([`crate::store::atomic`]): when a statement fails,
//!   the whole decision is rolled back, reported (`agent_tool:storage_failed`) and taken again
//!   from what storage holds (the run is followed again from its cursor; the alarm retries the
//!   rest), so a failure never skips a hook or a delivery silently;
//! - one deadline: [`ParentEngine::poll_timeout`] says when the engine next needs the time, and
//!   [`ParentEngine::handle_timeout`] takes it (no timer per run); [`ParentEngine::poll_alarm`]
//!   says when the durable alarm must fire, and [`ParentEngine::alarm`] takes it;
//! - a caller gets a run's result only after the run's finish hook returned.

use std::collections::{HashMap, VecDeque};

use serde_json::json;

use crate::error::{Error, Refused};
use crate::observability::EventType;
use crate::parent::detached::{Ledger, Slot};
use crate::parent::registry::{Registry, RunRecord};
use crate::protocol::Outcome;
use crate::store::{atomic, meta, Sql, StoreError};
use crate::types::{ms, AgentToolOptions, EventDelivery, RunResult, RunStatus};

mod clear;
mod conclude;
mod dispatch;
mod follow;
mod io;
mod recovery;

pub use clear::{Called, Cleared};
pub use io::*;

/// The pause before tailing a child again after its stream broke.
pub const RETAIL_PAUSE_MS: i64 = 250;
/// How long one inspection of a child may take before the engine counts it as timed out.
pub const INSPECT_TIMEOUT_MS: i64 = 2_000;
/// A recovery pass's whole inspection budget.
pub const RECOVERY_DEADLINE_MS: i64 = 5_000;
/// How soon a decision that a storage failure rolled back is taken again.
pub const STORAGE_RETRY_MS: i64 = 1_000;

/// How many times a start the child failed (a 5xx: its storage, an instance that could not
/// serve yet) is sent, a pause after each that doubles from [`START_RETRY_MS`], before the run
/// ends `error` with the child's answer.
pub const START_ATTEMPTS: u32 = 4;

/// The first pause before a failed start is sent again.
pub const START_RETRY_MS: i64 = 1_000;
/// The largest run input accepted (its JSON), in bytes.
pub const MAX_INPUT_BYTES: usize = 256 * 1024;
/// The largest `display` accepted (its JSON), in bytes.
pub const MAX_DISPLAY_BYTES: usize = 4 * 1024;

/// The most runs one retention pass clears (each deletes its child's storage too).
pub const RETENTION_BATCH: usize = 200;
/// Tails that fail to open in a row, while the child says the run is live, before the run is
/// sealed `not-tailable`.
pub const NOT_TAILABLE_AFTER: u32 = 3;
/// How long after a give-up the backbone keeps inspecting a child that was still running.
pub const WATCH_MS: i64 = 24 * 60 * 60 * 1000;

/// How long an owed child clear waits before it is asked again.
pub const CHILD_CLEAR_RETRY_MS: i64 = 60_000;
/// How many times a child is asked to delete a deleted run's storage before the engine gives
/// up (with [`EventType::ChildClearFailed`]).
pub const MAX_CHILD_CLEAR_ATTEMPTS: i64 = 20;
/// Owed child clears asked again per alarm.
const CHILD_CLEAR_BATCH: usize = 50;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The child's start is under way.
    Starting,
    /// Its tail is being read.
    Tailing,
    /// It is being inspected (until `due`, when the inspection times out).
    Inspecting,
    /// Waiting to tail it again (at `due`).
    Waiting,
}

/// A run this instance drives.
#[derive(Debug, Clone)]
struct Driver {
    detached: bool,
    phase: Phase,
    gen: u64,
    /// Following a child this instance did not start, or whose tail broke: the re-attach
    /// budgets apply (awaited runs only; a detached run has its own).
    reattaching: bool,
    last_progress: i64,
    window_end: Option<i64>,
    failed_tails: u32,
    /// Starts the child failed (5xx) so far.
    failed_starts: u32,
    /// The wait ([`Phase::Waiting`]) is the pause before a failed start is sent again.
    start_again: bool,
    /// The child said the run ended; the tail is read once more for the chunks after the
    /// cursor before the outcome is recorded.
    draining: Option<Outcome>,
    /// Part of a recovery pass.
    recovering: bool,
    /// When the phase's wait ends ([`Phase::Inspecting`], [`Phase::Waiting`]).
    due: Option<i64>,
    /// What the run's chunk frames need from its row, fixed for the run: read once here, not
    /// for every batch of its tail.
    frames: Frames,
}

impl Driver {
    /// A driver of `record` in `phase`.
    fn new(record: &RunRecord, phase: Phase, reattaching: bool, now: i64) -> Self {
        Self {
            detached: record.detached.is_some(),
            phase,
            gen: 0,
            reattaching,
            last_progress: now,
            window_end: None,
            failed_tails: 0,
            failed_starts: 0,
            start_again: false,
            draining: None,
            recovering: false,
            due: None,
            frames: Frames::of(record),
        }
    }

    /// When this run next needs the time: the end of its wait, or, while a re-attached awaited
    /// run is followed, its silence budget and its window.
    fn deadline(&self, no_progress_ms: i64) -> Option<i64> {
        match self.phase {
            Phase::Inspecting | Phase::Waiting => self.due,
            Phase::Tailing if self.watched_for_silence() => {
                let silence = self.last_progress.saturating_add(no_progress_ms);
                Some(self.window_end.map_or(silence, |end| end.min(silence)))
            }
            Phase::Tailing | Phase::Starting => None,
        }
    }

    /// A re-attached awaited run whose child has not yet said it ended: the re-attach budgets
    /// apply (a detached run has its own, on the backbone; a drain reads what is stored).
    fn watched_for_silence(&self) -> bool {
        self.reattaching && !self.detached && self.draining.is_none()
    }
}

/// The parts of a run's row its chunk frames (and its end) depend on.
#[derive(Debug, Clone)]
struct Frames {
    parent_tool_call_id: Option<String>,
    /// `event_delivery: terminal`: ordinary chunks are not forwarded.
    terminal_only: bool,
}

impl Frames {
    fn of(record: &RunRecord) -> Self {
        Self {
            parent_tool_call_id: record.parent_tool_call_id.clone(),
            terminal_only: record.event_delivery == EventDelivery::Terminal,
        }
    }
}

/// A recovery pass under way: its queue, its deadline, its counts.
#[derive(Debug, Clone)]
struct Pass {
    queue: Vec<String>,
    deadline: i64,
    /// The row being inspected, and the exchange of its inspection.
    current: Option<(String, u64)>,
    runs: usize,
    finalized: usize,
    reattached: usize,
}

/// Why the engine inspects a run it does not drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Watch {
    /// A given-up child still ran: record its late real result.
    LateResult,
    /// A detached run was given up: record the child's result if it had completed anyway.
    GaveUp,
}

/// An inspection of a run the engine does not drive: its exchange, why, and when it times out.
#[derive(Debug, Clone, Copy)]
struct Watching {
    gen: u64,
    watch: Watch,
    due: i64,
}

/// A dispatch waiting for a slot ([`crate::Admission::Queue`]).
#[derive(Debug, Clone)]
struct Queued {
    dispatch: Dispatch,
}

/// The parent role's in-memory state. Everything durable is in SQL, so a fresh engine after a
/// restart finds the runs nobody drives and recovers them.
#[derive(Debug)]
pub struct ParentEngine {
    class: String,
    /// This agent's name, once its identity holds it (it never changes).
    name: std::cell::OnceCell<String>,
    options: AgentToolOptions,
    drivers: HashMap<String, Driver>,
    watching: HashMap<String, Watching>,
    recovery_started: bool,
    /// The finish hooks an earlier instance owes were read and called again.
    owed_hooks_swept: bool,
    pass: Option<Pass>,
    quiet_ticks: usize,
    next_gen: u64,
    /// Dispatches waiting for a slot, first come first served.
    queue: VecDeque<Queued>,
    /// Runs whose finish hook is running, with the result their callers get once it returned.
    finishing: HashMap<String, (u64, Option<RunResult>)>,
    /// The exchange of the clear last asked of each run's child.
    clearing: HashMap<String, u64>,
    /// Deliveries handed to the platform and not yet answered: not claimed again meanwhile,
    /// however slow the handler (the lease is for an instance that crashed).
    in_flight: HashMap<(String, Slot), u64>,
    /// When the durable alarm must fire next ([`Self::poll_alarm`]); the earliest time any
    /// decision asked for since the alarm last fired.
    alarm: Option<i64>,
}

impl ParentEngine {
    /// A fresh engine for an agent of class `class`. `incarnation` makes this instance's
    /// exchange numbers its own: an answer to an earlier instance's exchange never matches one
    /// of this instance's (the platform passes a random number, the simulation a counter).
    pub fn new(class: &str, options: AgentToolOptions, incarnation: u32) -> Self {
        Self {
            class: class.to_owned(),
            name: std::cell::OnceCell::new(),
            options,
            drivers: HashMap::new(),
            watching: HashMap::new(),
            recovery_started: false,
            owed_hooks_swept: false,
            pass: None,
            quiet_ticks: 0,
            next_gen: u64::from(incarnation) << 32,
            queue: VecDeque::new(),
            finishing: HashMap::new(),
            clearing: HashMap::new(),
            in_flight: HashMap::new(),
            alarm: None,
        }
    }

    /// The object's storage was wiped (its own parent cleared it): nothing it drove, queued,
    /// finished or delivered is known any more, and its name is read again. Exchange numbers go
    /// on rising, so an answer to an exchange from before the wipe settles nothing.
    pub fn reset(&mut self) {
        let fresh = Self::new(&self.class, self.options.clone(), 0);
        *self = Self { next_gen: self.next_gen, ..fresh };
    }

    /// Whether this instance drives the run.
    #[cfg(test)]
    pub fn is_driving(&self, run_id: &str) -> bool {
        self.drivers.contains_key(run_id)
    }

    fn gen(&mut self) -> u64 {
        self.next_gen += 1;
        self.next_gen
    }

    fn address(&self, sql: &(impl Sql + ?Sized), run: &RunRecord) -> Result<ChildAddress, StoreError> {
        Ok(child_address(&self.class, &self.name(sql)?, run))
    }

    /// This agent's name from its identity (empty while it has none), read once.
    fn name(&self, sql: &(impl Sql + ?Sized)) -> Result<String, StoreError> {
        if let Some(name) = self.name.get() {
            return Ok(name.clone());
        }
        Ok(match meta::get(sql, "name")? {
            Some(name) => self.name.get_or_init(|| name).clone(),
            None => String::new(),
        })
    }

    // ----- units of work ------------------------------------------------------------------

    /// Takes one decision as one unit of storage. When a statement fails, everything the
    /// decision wrote is rolled back and [`Self::trouble`] takes over: nothing is half done.
    fn unit(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: Option<&str>,
        step: &'static str,
        now: i64,
        work: impl FnOnce(&mut Self) -> Result<Vec<ParentAction>, StoreError>,
    ) -> Vec<ParentAction> {
        match atomic(sql, || work(self)) {
            Ok(actions) => actions,
            Err(error) => self.trouble(run_id, step, &error, now),
        }
    }

    /// A decision was rolled back: it is reported, and taken again from what storage holds. A
    /// driven run is followed again from its cursor after a pause (its tail, or the inspection
    /// that follows, decides afresh); everything else is the alarm's to retry (recovery of
    /// undriven runs, the backbone's deliveries, the sweep of owed finish hooks).
    fn trouble(&mut self, run_id: Option<&str>, step: &str, error: &StoreError, now: i64) -> Vec<ParentAction> {
        let payload = json!({ "runId": run_id, "step": step, "error": error.to_string() });
        let mut actions = vec![ParentAction::Observe(EventType::StorageFailed, payload)];
        if let Some(run_id) = run_id {
            self.watching.remove(run_id);
            if let Some(pass) = self.pass.as_mut().filter(|p| p.current.as_ref().is_some_and(|(id, _)| id == run_id)) {
                pass.current = None;
            }
            let gen = self.gen();
            if let Some(driver) = self.drivers.get_mut(run_id) {
                driver.gen = gen;
                driver.phase = Phase::Waiting;
                driver.due = Some(now + STORAGE_RETRY_MS);
                driver.draining = None;
                driver.recovering = false;
                actions.push(ParentAction::CloseTail { run_id: run_id.to_owned() });
            }
        }
        self.wake_at(now + STORAGE_RETRY_MS);
        actions
    }

    /// What follows any call: dispatches queued for a slot are admitted while slots are free,
    /// and a recovery pass whose row was settled moves on.
    fn settle(&mut self, sql: &(impl Sql + ?Sized), now: i64) -> Vec<ParentAction> {
        let mut actions = self.admit_queued(sql, now);
        actions.extend(self.advance_recovery(sql, now));
        actions
    }

    // ----- events and time ----------------------------------------------------------------

    /// Handles what happened.
    pub fn handle(&mut self, sql: &(impl Sql + ?Sized), event: ParentEvent, now: i64) -> Vec<ParentAction> {
        let run_id = event_run(&event).to_owned();
        // A returned hook hands its run's callers their result whatever the storage does (a
        // failed write of its return only means a restart calls it again).
        let mut actions = match &event {
            ParentEvent::FinishHookDone { run_id, gen } => match self.finish_hook_done(run_id, *gen) {
                Some(actions) => actions,
                // A call this instance no longer waits for: it settles nothing.
                None => return Vec::new(),
            },
            ParentEvent::ChildCleared { run_id, gen, .. } if self.clearing.get(run_id) != Some(gen) => {
                return Vec::new();
            }
            _ => Vec::new(),
        };
        actions.extend(self.unit(sql, Some(&run_id), "event", now, |e| e.on_event(sql, event, now)));
        actions.extend(self.settle(sql, now));
        self.account(actions)
    }

    fn on_event(
        &mut self,
        sql: &(impl Sql + ?Sized),
        event: ParentEvent,
        now: i64,
    ) -> Result<Vec<ParentAction>, StoreError> {
        match event {
            ParentEvent::StartReplied { run_id, gen, result } => self.on_start_replied(sql, &run_id, gen, result, now),
            ParentEvent::TailOpened { run_id, gen, result: Ok(()) } => {
                let _ = (run_id, gen);
                Ok(Vec::new())
            }
            ParentEvent::TailOpened { run_id, gen, result: Err(_) } => {
                let Some(driver) = self.current(&run_id, gen) else { return Ok(Vec::new()) };
                driver.failed_tails += 1;
                self.on_tail_ended(sql, &run_id, now)
            }
            ParentEvent::TailBatch { run_id, gen, lines } => self.on_tail_batch(sql, &run_id, gen, lines, now),
            ParentEvent::TailRefused { run_id, gen, error } => self.on_tail_refused(sql, &run_id, gen, error, now),
            ParentEvent::TailEnded { run_id, gen } => {
                let Some(driver) = self.current(&run_id, gen) else { return Ok(Vec::new()) };
                // A drain ends with the outcome's line; without it, it is a failed read.
                if driver.draining.is_some() {
                    driver.failed_tails += 1;
                }
                self.on_tail_ended(sql, &run_id, now)
            }
            ParentEvent::Inspected { run_id, gen, result } => self.on_inspected(sql, &run_id, gen, result, now),
            ParentEvent::ChildCleared { run_id, result: Ok(()), .. } => {
                self.clearing.remove(&run_id);
                Registry::new(sql).child_cleared(&run_id)?;
                Ok(Vec::new())
            }
            // Asked again by the alarm, which stays armed while a clear is owed (see
            // `clear_child` and `next_alarm`).
            ParentEvent::ChildCleared { result: Err(_), .. } => Ok(Vec::new()),
            ParentEvent::DeliveryDone { run_id, slot, gen, attempt, result } => {
                let delivery = Delivery { slot, gen, attempt };
                self.on_delivery_done(sql, &run_id, delivery, result, now)
            }
            ParentEvent::FinishHookDone { run_id, .. } => {
                Registry::new(sql).finish_hook_returned(&run_id, now)?;
                Ok(Vec::new())
            }
        }
    }

    /// This instance no longer drives the run: a recovery pass waiting on its inspection moves
    /// on (its answer will not be heard).
    fn stop_driving(&mut self, run_id: &str) {
        self.drivers.remove(run_id);
        if let Some(pass) = self.pass.as_mut() {
            if pass.current.as_ref().is_some_and(|(id, _)| id == run_id) {
                pass.current = None;
            }
        }
    }

    /// The driver of `run_id` if `gen` is its current exchange.
    fn current(&mut self, run_id: &str, gen: u64) -> Option<&mut Driver> {
        self.drivers.get_mut(run_id).filter(|d| d.gen == gen)
    }

    /// The durable alarm must fire by `at` (an earlier time asked for stays).
    fn wake_at(&mut self, at: i64) {
        self.alarm = Some(self.alarm.map_or(at, |earlier| earlier.min(at)));
    }

    /// When the durable alarm must fire next (epoch ms), if ever: the platform keeps the
    /// object's one alarm armed for it and calls [`Self::alarm`] then. Pulled after every
    /// batch of actions, as [`Self::poll_timeout`] is for the in-memory deadlines: the
    /// backbone's cadence while detached runs or given-up children are outstanding, recovery
    /// while runs are live, a child's clear owed, a retry after a storage failure.
    pub fn poll_alarm(&self) -> Option<i64> {
        self.alarm
    }

    /// When the engine next needs the time (epoch ms), if ever: the platform calls
    /// [`Self::handle_timeout`] then. One deadline for every run, as quinn-proto's
    /// `poll_timeout`.
    pub fn poll_timeout(&self) -> Option<i64> {
        let no_progress = ms(self.options.reattach_no_progress_timeout);
        let drivers = self.drivers.values().filter_map(|d| d.deadline(no_progress));
        drivers.chain(self.watching.values().map(|w| w.due)).min()
    }

    /// The time came: every wait that ended is taken up (a tail opened again, an inspection
    /// timed out, a silent or over-long re-attach stopped).
    pub fn handle_timeout(&mut self, sql: &(impl Sql + ?Sized), now: i64) -> Vec<ParentAction> {
        let no_progress = ms(self.options.reattach_no_progress_timeout);
        let mut due: Vec<String> = self
            .drivers
            .iter()
            .filter(|(_, d)| d.deadline(no_progress).is_some_and(|at| at <= now))
            .map(|(id, _)| id.clone())
            .collect();
        due.sort();
        let mut actions = Vec::new();
        for run_id in due {
            actions.extend(self.unit(sql, Some(&run_id), "timeout", now, |e| e.on_due(sql, &run_id, now)));
        }
        // An inspection of a run nobody drives that never came back: the next tick asks again.
        self.watching.retain(|_, w| w.due > now);
        actions.extend(self.settle(sql, now));
        self.account(actions)
    }

    fn on_due(&mut self, sql: &(impl Sql + ?Sized), run_id: &str, now: i64) -> Result<Vec<ParentAction>, StoreError> {
        let Some(driver) = self.drivers.get(run_id) else { return Ok(Vec::new()) };
        match driver.phase {
            Phase::Waiting if driver.start_again => self.start_again(sql, run_id, now),
            Phase::Waiting => self.open_tail(sql, run_id, now),
            Phase::Inspecting => {
                let gen = driver.gen;
                self.on_inspected(sql, run_id, gen, Err(crate::protocol::InterruptedReason::InspectTimeout), now)
            }
            // Silent past the budget, or past the window, while tailing: stop reading and ask
            // the child (the decision follows its answer).
            Phase::Tailing => self.on_tail_ended(sql, run_id, now),
            Phase::Starting => Ok(Vec::new()),
        }
    }
}

/// The run an event is about.
fn event_run(event: &ParentEvent) -> &str {
    match event {
        ParentEvent::StartReplied { run_id, .. }
        | ParentEvent::TailOpened { run_id, .. }
        | ParentEvent::TailBatch { run_id, .. }
        | ParentEvent::TailRefused { run_id, .. }
        | ParentEvent::TailEnded { run_id, .. }
        | ParentEvent::Inspected { run_id, .. }
        | ParentEvent::ChildCleared { run_id, .. }
        | ParentEvent::DeliveryDone { run_id, .. }
        | ParentEvent::FinishHookDone { run_id, .. } => run_id,
    }
}

/// The parent role's tables (the registry, the ledger, the identity), as [`migrate`] creates
/// them on a new store.
pub const SCHEMAS: [&str; 3] = [super::registry::SCHEMA, super::detached::LEDGER_SCHEMA, meta::SCHEMA];

/// Makes the parent role's own tables (the registry and the ledger) on a store that has none:
/// what an object does at its first parent work, every column already there.
pub fn create_tables(sql: &(impl Sql + ?Sized)) -> Result<(), StoreError> {
    sql.batch(&[super::registry::SCHEMA, super::detached::LEDGER_SCHEMA].concat())
}

/// Whether the store has the parent role's tables (an earlier instance made them).
pub fn has_tables(sql: &(impl Sql + ?Sized)) -> Result<bool, StoreError> {
    crate::store::has_table(sql, "agent_tool_runs")
}

/// Creates the parent role's tables if missing (the registry, the ledger, the identity).
pub fn migrate(sql: &(impl Sql + ?Sized)) -> Result<(), StoreError> {
    Registry::new(sql).migrate()?;
    Ledger::new(sql).migrate()?;
    sql.batch(meta::SCHEMA)
}

/// How soon a message a child could not take is sent again (ms).
pub const MESSAGE_RETRY_MS: i64 = 2_000;

/// Where a run's child lives: its binding (the class name for rows of the first schema) and a
/// name scoped by its parent, so two parents never share a child.
pub fn child_address(parent_class: &str, parent_name: &str, run: &RunRecord) -> ChildAddress {
    let binding = if run.binding.is_empty() { run.agent_type.clone() } else { run.binding.clone() };
    ChildAddress { binding, name: format!("{parent_class}/{parent_name}/{}", run.run_id) }
}

/// The result a waiting caller gets for a run: its row's, or `aborted` when it was cleared.
pub fn current_result(sql: &(impl Sql + ?Sized), run_id: &str, agent_type: &str) -> Result<RunResult, StoreError> {
    Ok(match Registry::new(sql).get(run_id)? {
        Some(record) => record.result(),
        None => {
            RunResult { status: RunStatus::Aborted, ..RunResult::refused(run_id, agent_type, "the run was cleared") }
        }
    })
}

#[cfg(all(test, not(target_arch = "wasm32")))]
pub(crate) mod testing;
