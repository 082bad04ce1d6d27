//! The parent's side of its runs as a state machine: dispatch and admission, following a child
//! (tail, inspect, re-attach budgets), cancel and clear, restart recovery, the detached
//! backbone (budgets, give-ups, deliveries) and watching a given-up child for a late result.
//!
//! It takes what happened ([`ParentEvent`], or a call such as [`ParentEngine::dispatch`]) with
//! the time, keeps the registry and the ledger over [`Sql`], and returns [`ParentAction`]s for
//! the platform to carry out: send to clients, talk to a child, set a timer, resolve a waiting
//! caller, call a hook, deliver an outcome. No I/O and no clock here: the platform drives this
//! code in a Durable Object and the deterministic simulation drives the same code natively.
//!
//! Every exchange with a child carries a generation number; an event from an exchange the
//! engine has moved past (a tail it closed, a timer it replaced) is ignored, so late I/O can
//! never act on a run twice.

use std::collections::HashMap;

use serde_json::json;

use crate::observability::EventType;
use crate::parent::detached::Ledger;
use crate::parent::registry::{Registry, RunRecord, Terminal};
use crate::protocol::tail::{OutcomeStatus, RunOutcome};
use crate::store::{meta, Sql, StoreError};
use crate::types::{Admission, AgentToolOptions, EventDelivery, RunResult, RunStatus};

mod clear;
mod conclude;
mod dispatch;
mod follow;
mod io;
mod recovery;

pub use io::*;

/// The pause before tailing a child again after its stream broke.
pub const RETAIL_PAUSE_MS: i64 = 250;
/// How long one inspection of a child may take (the platform enforces it).
pub const INSPECT_TIMEOUT_MS: i64 = 2_000;
/// A recovery pass's whole inspection budget.
pub const RECOVERY_DEADLINE_MS: i64 = 5_000;
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
    Starting,
    Tailing,
    Inspecting,
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
    /// The child said the run ended; the tail is read once more for the chunks after the
    /// cursor before the outcome is recorded.
    draining: Option<RunOutcome>,
    /// Part of a recovery pass.
    recovering: bool,
    /// What the run's chunk frames need from its row, fixed for the run: read once here, not
    /// for every batch of its tail.
    frames: Frames,
}

/// The parts of a run's row its chunk frames (and its end) depend on.
#[derive(Debug, Clone)]
struct Frames {
    agent_type: String,
    parent_tool_call_id: Option<String>,
    /// `event_delivery: terminal`: ordinary chunks are not forwarded.
    terminal_only: bool,
}

impl Frames {
    fn of(record: &RunRecord) -> Self {
        Self {
            agent_type: record.agent_type.clone(),
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

/// The parent role's in-memory state. Everything durable is in SQL, so a fresh engine after a
/// restart finds the runs nobody drives and recovers them.
#[derive(Debug)]
pub struct ParentEngine {
    class: String,
    /// This agent's name, once its identity holds it (it never changes).
    name: std::cell::OnceCell<String>,
    options: AgentToolOptions,
    drivers: HashMap<String, Driver>,
    watching: HashMap<String, (u64, Watch)>,
    recovery_started: bool,
    pass: Option<Pass>,
    quiet_ticks: usize,
    next_gen: u64,
}

fn store_err(e: StoreError) -> Vec<ParentAction> {
    vec![ParentAction::Observe(EventType::RecoveryFailed, json!({ "error": e.to_string() }))]
}

impl ParentEngine {
    /// A fresh engine for an agent of class `class`.
    pub fn new(class: &str, options: AgentToolOptions) -> Self {
        Self {
            class: class.to_owned(),
            name: std::cell::OnceCell::new(),
            options,
            drivers: HashMap::new(),
            watching: HashMap::new(),
            recovery_started: false,
            pass: None,
            quiet_ticks: 0,
            next_gen: 0,
        }
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

    fn address(&self, sql: &(impl Sql + ?Sized), run: &RunRecord) -> ChildAddress {
        child_address(&self.class, &self.name(sql), run)
    }

    /// This agent's name from its identity (empty while it has none), read once.
    fn name(&self, sql: &(impl Sql + ?Sized)) -> String {
        if let Some(name) = self.name.get() {
            return name.clone();
        }
        match meta::get(sql, "name").ok().flatten() {
            Some(name) => self.name.get_or_init(|| name).clone(),
            None => String::new(),
        }
    }

    // ----- events -------------------------------------------------------------------------

    /// Handles what happened.
    pub fn handle(&mut self, sql: &(impl Sql + ?Sized), event: ParentEvent, now: i64) -> Vec<ParentAction> {
        match event {
            ParentEvent::StartReplied { run_id, gen, result } => self.on_start_replied(sql, &run_id, gen, result, now),
            ParentEvent::TailOpened { run_id, gen, result } => match result {
                Ok(()) => Vec::new(),
                Err(_) => {
                    if let Some(d) = self.current(&run_id, gen) {
                        d.failed_tails += 1;
                    }
                    self.on_tail_ended(sql, &run_id, gen, now)
                }
            },
            ParentEvent::TailBatch { run_id, gen, lines } => self.on_tail_batch(sql, &run_id, gen, lines, now),
            ParentEvent::TailRefused { run_id, gen, error } => {
                if self.current(&run_id, gen).is_none() {
                    return Vec::new();
                }
                let Ok(Some(record)) = Registry::new(sql).get(&run_id) else { return self.forget(sql, &run_id) };
                let mut actions = vec![ParentAction::CancelChild {
                    run_id: run_id.clone(),
                    to: self.address(sql, &record),
                    reason: Some(error.clone()),
                }];
                actions.extend(self.conclude(sql, &record, Terminal::Error { message: error }, now));
                actions
            }
            ParentEvent::TailEnded { run_id, gen } => {
                // A drain ends with the outcome's line; without it, it is a failed read.
                if let Some(d) = self.current(&run_id, gen).filter(|d| d.draining.is_some()) {
                    d.failed_tails += 1;
                }
                self.on_tail_ended(sql, &run_id, gen, now)
            }
            ParentEvent::Inspected { run_id, gen, result } => self.on_inspected(sql, &run_id, gen, result, now),
            ParentEvent::Timer { run_id, gen, timer } => self.on_timer(sql, &run_id, gen, timer, now),
            ParentEvent::ChildCleared { run_id, result } => match result {
                Ok(()) => Registry::new(sql).child_cleared(&run_id).err().map(store_err).unwrap_or_default(),
                // Retried by the alarm.
                Err(_) => vec![ParentAction::ArmAlarm { at: now + CHILD_CLEAR_RETRY_MS }],
            },
            ParentEvent::DeliveryDone { run_id, slot, attempt, result } => {
                self.on_delivery_done(sql, &run_id, slot, attempt, result, now)
            }
        }
    }

    /// The driver of `run_id` if `gen` is its current exchange.
    fn current(&mut self, run_id: &str, gen: u64) -> Option<&mut Driver> {
        self.drivers.get_mut(run_id).filter(|d| d.gen == gen)
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

/// Where a run's child lives: its binding (the class name for rows of the first schema) and a
/// name scoped by its parent, so two parents never share a child.
pub fn child_address(parent_class: &str, parent_name: &str, run: &RunRecord) -> ChildAddress {
    let binding = if run.binding.is_empty() { run.agent_type.clone() } else { run.binding.clone() };
    ChildAddress { binding, name: format!("{parent_class}/{parent_name}/{}", run.run_id) }
}

/// The result a waiting caller gets for a run: its row's, or `aborted` when it was cleared.
pub fn current_result(sql: &(impl Sql + ?Sized), run_id: &str, agent_type: &str) -> RunResult {
    match Registry::new(sql).get(run_id) {
        Ok(Some(record)) => record.result(),
        _ => RunResult { status: RunStatus::Aborted, ..RunResult::refused(run_id, agent_type, "the run was cleared") },
    }
}

/// The terminal a child's outcome records.
pub fn terminal_from(outcome: RunOutcome) -> Terminal {
    match outcome.status {
        OutcomeStatus::Completed => {
            Terminal::Completed { summary: outcome.summary.unwrap_or_default(), output: outcome.output }
        }
        OutcomeStatus::Error => {
            Terminal::Error { message: outcome.error.unwrap_or_else(|| "the child run failed".into()) }
        }
        OutcomeStatus::Aborted => Terminal::Aborted { reason: outcome.error },
        OutcomeStatus::Interrupted => Terminal::Interrupted {
            error: outcome.error.unwrap_or_else(|| "the child's turn was cut short by a restart".into()),
            reason: None,
            child_still_running: Some(false),
        },
    }
}

/// Admission in words, for a dispatch over the cap that must not queue.
pub fn cap_message(limit: usize) -> String {
    format!("maxConcurrentAgentTools ({limit}) reached: {limit} runs are starting or running; retry when one finishes")
}

/// Whether a dispatch over the cap waits for a slot.
pub fn queues(options: &AgentToolOptions) -> bool {
    options.admission == Admission::Queue
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::observability::EventType;
    use crate::parent::registry::{NewRun, Registry, Terminal};
    use crate::store::sqlite;
    use crate::types::{EventDelivery, Retention};
    use serde_json::{json, Value};

    fn new_run(id: &str, input: &Value, display: Option<Value>) -> NewRun {
        NewRun {
            run_id: id.into(),
            parent_tool_call_id: None,
            agent_type: "Child".into(),
            binding: "Child".into(),
            input_preview: None,
            display,
            display_order: 0,
            event_delivery: EventDelivery::Full,
            input: input.clone(),
        }
    }

    fn dispatch(engine: &mut ParentEngine, db: &rusqlite::Connection, id: &str, input: Value) -> Admitted {
        let new = new_run(id, &input, None);
        engine.dispatch(db, Dispatch { new, detached: None }, input, 10).0
    }

    #[test]
    fn oversized_input_or_display_is_refused_before_anything_is_written() {
        let db = sqlite::memory();
        migrate(&db).unwrap();
        let mut engine = ParentEngine::new("Parent", AgentToolOptions::default());
        let big = Value::String("x".repeat(MAX_INPUT_BYTES));
        let Admitted::Refused(why) = dispatch(&mut engine, &db, "big", big) else { panic!("refused") };
        assert!(why.contains("at most 262144"), "{why}");
        let display = Some(json!({ "name": "y".repeat(MAX_DISPLAY_BYTES) }));
        let new = new_run("wide", &json!("ok"), display);
        let (admitted, actions) = engine.dispatch(&db, Dispatch { new, detached: None }, json!("ok"), 10);
        assert!(matches!(admitted, Admitted::Refused(ref why) if why.contains("display")));
        assert!(actions.is_empty());
        assert!(Registry::new(&db).all().unwrap().is_empty(), "no row");
        assert!(matches!(dispatch(&mut engine, &db, "fine", json!("ok")), Admitted::Driving(_)));
    }

    #[test]
    fn retention_clears_the_oldest_finished_runs_and_their_children() {
        let db = sqlite::memory();
        migrate(&db).unwrap();
        let options = AgentToolOptions {
            retention: Retention { max_runs: Some(2), max_age_ms: None },
            ..AgentToolOptions::default()
        };
        let mut engine = ParentEngine::new("Parent", options);
        let registry = Registry::new(&db);
        for i in 0..4 {
            let id = format!("r{i}");
            registry.insert(&new_run(&id, &json!(i), None), i).unwrap();
            registry.finish(&id, &Terminal::Completed { summary: "s".into(), output: None }, 100 + i).unwrap();
        }
        let actions = engine.alarm(&db, 200);
        let cleared: Vec<&str> = actions
            .iter()
            .filter_map(|a| match a {
                ParentAction::ClearChild { run_id, .. } => Some(run_id.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(cleared, ["r0", "r1"]);
        let left: Vec<String> = registry.all().unwrap().into_iter().map(|r| r.run_id).collect();
        assert_eq!(left, ["r2", "r3"]);
        assert!(actions.iter().any(|a| matches!(a, ParentAction::Observe(EventType::Retention, _))));
        // A new dispatch trims too: the live run is never counted against the policy.
        assert!(matches!(dispatch(&mut engine, &db, "r4", json!(4)), Admitted::Driving(_)));
        assert_eq!(registry.all().unwrap().len(), 3);
    }
}
