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

use serde_json::{json, Value};

use super::detached::{
    budget_exceeded, cadence_ms, finish_due, give_up_due, Claim, FinishDue, Ledger, Slot, DEFAULT_NOTIFY_SOURCE,
    LIVE_WARNING, MAX_ATTEMPTS,
};
use super::registry::{Forward, Inserted, NewRun, Registry, RegistryError, RunRecord, Terminal};
use crate::agent::{Admission, AgentToolOptions};
use crate::observability::EventType;
use crate::protocol::child_api::{InspectionReply, StartRequest};
use crate::protocol::tail::{ChunkKind, OutcomeStatus, RunOutcome, TailLine};
use crate::protocol::{EventFrame, InterruptedReason};
use crate::run::{
    ClearFilter, DetachedOptions, EventDelivery, MilestoneMode, OnMilestones, ProgressSnapshot, RunInfo, RunResult,
    RunStatus,
};
use crate::store::{meta, Sql, StoreError};

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

/// Why a dispatch is too big to take, if it is.
fn oversized(new: &NewRun, input: &Value) -> Option<String> {
    let input_bytes = input.to_string().len();
    if input_bytes > MAX_INPUT_BYTES {
        return Some(format!("the run's input is {input_bytes} bytes of JSON; at most {MAX_INPUT_BYTES} are accepted"));
    }
    let display_bytes = new.display.as_ref().map_or(0, |d| d.to_string().len());
    if display_bytes > MAX_DISPLAY_BYTES {
        return Some(format!(
            "the run's display is {display_bytes} bytes of JSON; at most {MAX_DISPLAY_BYTES} are accepted"
        ));
    }
    None
}

/// The most runs one retention pass clears (each deletes its child's storage too).
pub const RETENTION_BATCH: usize = 200;
/// Tails that fail to open in a row, while the child says the run is live, before the run is
/// sealed `not-tailable`.
pub const NOT_TAILABLE_AFTER: u32 = 3;
/// How long after a give-up the backbone keeps inspecting a child that was still running.
pub const WATCH_MS: i64 = 24 * 60 * 60 * 1000;

/// Where a child lives: its binding and its Durable Object name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildAddress {
    /// The `[[durable_objects.bindings]]` name.
    pub binding: String,
    /// `<Parent>/<parent-name>/<run-id>`.
    pub name: String,
}

/// A timer the engine asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    /// A re-attached child has been silent too long.
    Silence,
    /// Time to tail a child again after its stream broke.
    Retail,
    /// The re-attach window ends.
    Window,
}

/// Why a tail could not be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TailOpenError {
    /// The child answered with an HTTP error.
    Status(u16),
    /// The child could not be reached.
    Unreachable(String),
}

/// Why a start did not take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartError {
    /// The child answered and refused it (a real failure: the run ends `error`).
    Refused(String),
    /// The child could not be reached (a deploy, an eviction, the network): the run ends
    /// `interrupted`, retryable, and dispatching its id again starts it afresh.
    Unreachable(String),
}

/// How long an owed child clear waits before it is asked again.
pub const CHILD_CLEAR_RETRY_MS: i64 = 60_000;
/// How many times a child is asked to delete a deleted run's storage before the engine gives
/// up (with [`EventType::ChildClearFailed`]).
pub const MAX_CHILD_CLEAR_ATTEMPTS: i64 = 20;
/// Owed child clears asked again per alarm.
const CHILD_CLEAR_BATCH: usize = 50;

/// What happened, reported by the platform (or the simulation).
#[derive(Debug, Clone, PartialEq)]
pub enum ParentEvent {
    /// The child answered a start, refused it, or could not be reached.
    StartReplied {
        /// The run.
        run_id: String,
        /// The exchange.
        gen: u64,
        /// The answer.
        result: Result<(), StartError>,
    },
    /// A tail opened, or failed to.
    TailOpened {
        /// The run.
        run_id: String,
        /// The exchange.
        gen: u64,
        /// Whether it opened.
        result: Result<(), TailOpenError>,
    },
    /// Lines a tail brought.
    TailBatch {
        /// The run.
        run_id: String,
        /// The exchange.
        gen: u64,
        /// The lines, parsed.
        lines: Vec<TailLine>,
    },
    /// A tail sent what no child sends (a line past the limit): the run ends `error`.
    TailRefused {
        /// The run.
        run_id: String,
        /// The exchange.
        gen: u64,
        /// Why.
        error: String,
    },
    /// A tail ended without an `end` line (the child went away, or the stream broke).
    TailEnded {
        /// The run.
        run_id: String,
        /// The exchange.
        gen: u64,
    },
    /// An inspection's answer: `Ok(None)` when the child does not know the run (yet).
    Inspected {
        /// The run.
        run_id: String,
        /// The exchange.
        gen: u64,
        /// The answer.
        result: Result<Option<InspectionReply>, InterruptedReason>,
    },
    /// A timer fired.
    Timer {
        /// The run.
        run_id: String,
        /// The exchange it was set for.
        gen: u64,
        /// Which.
        timer: Timer,
    },
    /// A child answered a clear (`Err`: it could not be reached or failed; the alarm retries).
    ChildCleared {
        /// The run.
        run_id: String,
        /// The answer.
        result: Result<(), String>,
    },
    /// A delivery the engine asked for ended.
    DeliveryDone {
        /// The run.
        run_id: String,
        /// The slot.
        slot: Slot,
        /// The attempt (from 1).
        attempt: i64,
        /// `Err` is the handler's error.
        result: Result<(), String>,
    },
}

/// A hook of the agent's to call.
#[derive(Debug, Clone, PartialEq)]
pub enum HookCall {
    /// `on_agent_tool_start`.
    Start(RunInfo),
    /// `on_agent_tool_finish` (once per run).
    Finish(RunInfo, RunResult),
    /// `on_progress` (best-effort).
    Progress(RunInfo, ProgressSnapshot),
}

/// How a detached outcome is delivered.
#[derive(Debug, Clone, PartialEq)]
pub enum Delivery {
    /// To `on_detached_finish` with the run's handler tag.
    Handler(Value),
    /// As a chat message (id `detached-finish:<run>:<status>`) and a model turn.
    Notify {
        /// `metadata.source`.
        source: String,
    },
    /// Nothing beyond the global hook (already claimed separately).
    Nothing,
}

/// What the platform must do.
#[derive(Debug, Clone, PartialEq)]
pub enum ParentAction {
    /// Send a text frame to every connected client.
    Broadcast(String),
    /// Send the child a start (idempotent); answer with [`ParentEvent::StartReplied`].
    StartChild {
        /// The run.
        run_id: String,
        /// The exchange.
        gen: u64,
        /// Where.
        to: ChildAddress,
        /// What.
        request: StartRequest,
    },
    /// Tail the child after log index `after`; answer with `TailOpened`, then `TailBatch`es,
    /// then `TailEnded` unless the engine closed it first.
    OpenTail {
        /// The run.
        run_id: String,
        /// The exchange.
        gen: u64,
        /// Where.
        to: ChildAddress,
        /// The child log cursor.
        after: i64,
    },
    /// Stop reading the run's tail (no more events from it).
    CloseTail {
        /// The run.
        run_id: String,
    },
    /// Inspect the child (within [`INSPECT_TIMEOUT_MS`]); answer with `Inspected`.
    InspectChild {
        /// The run.
        run_id: String,
        /// The exchange.
        gen: u64,
        /// Where.
        to: ChildAddress,
    },
    /// Tell the child to stop the run (no answer needed).
    CancelChild {
        /// The run.
        run_id: String,
        /// Where.
        to: ChildAddress,
        /// Why.
        reason: Option<String>,
    },
    /// Delete the child's storage (no answer needed).
    ClearChild {
        /// The run.
        run_id: String,
        /// Where.
        to: ChildAddress,
    },
    /// Fire [`ParentEvent::Timer`] at `at`.
    SetTimer {
        /// The run.
        run_id: String,
        /// The exchange.
        gen: u64,
        /// Which.
        timer: Timer,
        /// Epoch ms.
        at: i64,
    },
    /// Make sure the agent's alarm fires by `at`.
    ArmAlarm {
        /// Epoch ms.
        at: i64,
    },
    /// Hand `result` to every caller waiting on the run.
    Resolve {
        /// The run.
        run_id: String,
        /// Its result.
        result: RunResult,
    },
    /// A run concluded: dispatches queued for a slot may try again.
    SlotFreed,
    /// Call a hook.
    Hook(HookCall),
    /// Deliver a detached outcome; answer with [`ParentEvent::DeliveryDone`].
    Deliver {
        /// The run.
        run: RunInfo,
        /// The outcome.
        result: RunResult,
        /// The slot.
        slot: Slot,
        /// The attempt.
        attempt: i64,
        /// How.
        delivery: Delivery,
    },
    /// Surface a milestone of a detached run in the chat (id `detached-ms:<run>:<name>`), once.
    MilestoneNotice {
        /// The run.
        run: RunInfo,
        /// The milestone chunk's `data` (`{name, sequence, at, …}`).
        milestone: Value,
        /// Narrate or react.
        mode: MilestoneMode,
        /// `metadata.source`.
        source: String,
    },
    /// An observability event.
    Observe(EventType, Value),
}

/// How a dispatch was admitted.
#[derive(Debug, Clone, PartialEq)]
pub enum Admitted {
    /// Refused, writing nothing.
    Refused(String),
    /// The run already ended: its result.
    Finished(RunResult),
    /// This instance drives it now; wait for its [`ParentAction::Resolve`].
    Driving(RunRecord),
    /// It is already driven here; wait for its `Resolve`.
    Joined(RunRecord),
    /// `max_concurrent` runs are live.
    Full(usize),
}

/// A dispatch.
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatch {
    /// The row to create (or find).
    pub new: NewRun,
    /// For a detached run, its configuration (budgets filled in by the engine).
    pub detached: Option<DetachedOptions>,
}

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

    // ----- dispatch -----------------------------------------------------------------------

    /// Admits a dispatch: looks the run id up, checks the cap, inserts the row (configured, for
    /// a detached run) and starts driving it, all in one synchronous step, so two dispatches
    /// can never both take the last slot nor both drive one run.
    pub fn dispatch(
        &mut self,
        sql: &(impl Sql + ?Sized),
        dispatch: Dispatch,
        input: Value,
        now: i64,
    ) -> (Admitted, Vec<ParentAction>) {
        let registry = Registry::new(sql);
        let new = dispatch.new;
        if let Some(problem) = oversized(&new, &input) {
            return (Admitted::Refused(problem), Vec::new());
        }
        let existing = match registry.get(&new.run_id) {
            Ok(existing) => existing,
            Err(e) => return (Admitted::Refused(e.to_string()), Vec::new()),
        };
        if let Some(existing) = existing {
            if existing.agent_type != new.agent_type {
                let error = RegistryError::AgentTypeMismatch {
                    run_id: new.run_id.clone(),
                    existing: existing.agent_type,
                    requested: new.agent_type.clone(),
                };
                return (Admitted::Refused(error.to_string()), Vec::new());
            }
            if existing.status.is_hard_terminal() {
                return (Admitted::Finished(RunResult::from_record(&existing)), Vec::new());
            }
            if self.drivers.contains_key(&new.run_id) {
                return (Admitted::Joined(existing), Vec::new());
            }
            // Known but driven by nobody (a restart, or a soft `interrupted` dispatched again):
            // follow it again; the child's start is idempotent.
            self.watching.remove(&new.run_id);
            let input = existing.input.clone().unwrap_or(input);
            let detached = existing.detached.is_some();
            let actions = self.drive(sql, &existing, input, detached, true, now);
            return (Admitted::Driving(existing), actions);
        }
        // A deleted run whose child has not yet deleted its storage: starting it now would find
        // the old run there. Refused (nothing written) and the clear asked again.
        if let Ok(Some((binding, name))) = registry.child_clear_owed(&new.run_id) {
            let problem = format!(
                "run id {:?} was cleared and its child has not yet deleted its storage; dispatch it again shortly",
                new.run_id
            );
            let retry = ParentAction::ClearChild { run_id: new.run_id.clone(), to: ChildAddress { binding, name } };
            return (Admitted::Refused(problem), vec![retry]);
        }
        if let Some(limit) = self.options.max_concurrent {
            match registry.live_count() {
                Ok(live) if live >= limit as i64 => return (Admitted::Full(limit), Vec::new()),
                Ok(_) => {}
                Err(e) => return (Admitted::Refused(e.to_string()), Vec::new()),
            }
        }
        let record = match registry.insert(&new, now) {
            Ok(Inserted::New(record)) => record,
            Ok(Inserted::Existing(record)) => return (Admitted::Joined(record), Vec::new()),
            Err(e) => return (Admitted::Refused(e.to_string()), Vec::new()),
        };
        let mut actions = Vec::new();
        let detached = dispatch.detached.is_some();
        let mut record = record;
        if let Some(mut options) = dispatch.detached {
            options.max_budget_ms.get_or_insert(self.options.detached_max_budget_ms);
            options.no_progress_budget_ms.get_or_insert(self.options.detached_no_progress_budget_ms);
            if let Err(e) = Ledger::new(sql).configure(&record.run_id, &options, now) {
                return (Admitted::Refused(e.to_string()), Vec::new());
            }
            // The row as configured.
            record = registry.get(&record.run_id).ok().flatten().unwrap_or(record);
            self.quiet_ticks = 0;
            actions.push(ParentAction::ArmAlarm { at: now + self.cadence() as i64 });
            let live = Ledger::new(sql).live_count().unwrap_or(0);
            if live >= LIVE_WARNING {
                actions.push(ParentAction::Observe(EventType::DetachedLiveCountWarning, json!({ "live": live })));
            }
        } else {
            actions.push(ParentAction::ArmAlarm { at: now + self.options.recovery_alarm_ms as i64 });
        }
        actions.extend(self.retain(sql, now));
        actions.insert(0, ParentAction::Broadcast(record.started_frame().to_json()));
        actions.push(ParentAction::Hook(HookCall::Start(RunInfo::from_record(&record))));
        actions.extend(self.drive(sql, &record, input, detached, false, now));
        (Admitted::Driving(record), actions)
    }

    /// Starts driving a run: the child's start (idempotent), then its tail.
    fn drive(
        &mut self,
        sql: &(impl Sql + ?Sized),
        record: &RunRecord,
        input: Value,
        detached: bool,
        reattaching: bool,
        now: i64,
    ) -> Vec<ParentAction> {
        let gen = self.gen();
        let driver = Driver {
            detached,
            phase: Phase::Starting,
            gen,
            reattaching,
            last_progress: now,
            window_end: None,
            failed_tails: 0,
            draining: None,
            recovering: false,
            frames: Frames::of(record),
        };
        self.drivers.insert(record.run_id.clone(), driver);
        vec![self.start_action(sql, record, input, gen)]
    }

    fn start_action(&self, sql: &(impl Sql + ?Sized), record: &RunRecord, input: Value, gen: u64) -> ParentAction {
        let to = self.address(sql, record);
        let request = StartRequest {
            run_id: record.run_id.clone(),
            input,
            parent_class: self.class.clone(),
            parent_name: self.name(sql),
            child_name: to.name.clone(),
            terminal_only: record.event_delivery == EventDelivery::Terminal,
            // The tail this start is followed by, from where it will start (the platform may
            // open it in the same round trip; see `ParentAction::OpenTail`).
            tail_after: Some(record.child_cursor),
        };
        ParentAction::StartChild { run_id: record.run_id.clone(), gen, to, request }
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

    fn on_start_replied(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        gen: u64,
        result: Result<(), StartError>,
        now: i64,
    ) -> Vec<ParentAction> {
        if self.current(run_id, gen).is_none() {
            return Vec::new();
        }
        let registry = Registry::new(sql);
        let Ok(Some(record)) = registry.get(run_id) else { return self.forget(sql, run_id) };
        match result {
            Ok(()) => {}
            Err(StartError::Refused(message)) => return self.conclude(sql, &record, Terminal::Error { message }, now),
            Err(StartError::Unreachable(message)) => {
                let terminal = Terminal::Interrupted {
                    error: format!("the child could not be reached to start the run ({message}); dispatch it again"),
                    reason: Some(InterruptedReason::InspectFailed),
                    child_still_running: Some(false),
                };
                return self.conclude(sql, &record, terminal, now);
            }
        }
        if record.status.is_hard_terminal() {
            // A cancel landed while the child was being started: make sure the child stops.
            let mut actions = vec![ParentAction::CancelChild {
                run_id: run_id.to_owned(),
                to: self.address(sql, &record),
                reason: record.error_message.clone(),
            }];
            actions.push(ParentAction::Resolve { run_id: run_id.to_owned(), result: RunResult::from_record(&record) });
            self.drivers.remove(run_id);
            return actions;
        }
        // `starting` becomes `running`; an `interrupted` run dispatched again is live again.
        // Neither changes where the tail starts.
        let marked = match record.status {
            RunStatus::Starting => registry.mark_running(run_id).map(drop),
            RunStatus::Interrupted => registry.reattach(run_id).map(drop),
            _ => Ok(()),
        };
        if marked.is_err() {
            return self.forget(sql, run_id);
        }
        self.open_tail_at(sql, &record, now)
    }

    fn open_tail(&mut self, sql: &(impl Sql + ?Sized), run_id: &str, now: i64) -> Vec<ParentAction> {
        let Ok(Some(record)) = Registry::new(sql).get(run_id) else { return self.forget(sql, run_id) };
        self.open_tail_at(sql, &record, now)
    }

    /// Opens the run's tail after its child cursor (`record` is its row as it is now).
    fn open_tail_at(&mut self, sql: &(impl Sql + ?Sized), record: &RunRecord, now: i64) -> Vec<ParentAction> {
        let run_id = record.run_id.as_str();
        let gen = self.gen();
        let no_progress = self.options.reattach_no_progress_timeout_ms as i64;
        let to = self.address(sql, record);
        let Some(driver) = self.drivers.get_mut(run_id) else { return Vec::new() };
        driver.gen = gen;
        driver.phase = Phase::Tailing;
        let mut actions =
            vec![ParentAction::OpenTail { run_id: run_id.to_owned(), gen, to, after: record.child_cursor }];
        if driver.reattaching && !driver.detached {
            let at = driver.last_progress.max(now - no_progress) + no_progress;
            actions.push(ParentAction::SetTimer { run_id: run_id.to_owned(), gen, timer: Timer::Silence, at });
            if let Some(end) = driver.window_end {
                actions.push(ParentAction::SetTimer { run_id: run_id.to_owned(), gen, timer: Timer::Window, at: end });
            }
        }
        actions
    }

    fn on_tail_batch(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        gen: u64,
        lines: Vec<TailLine>,
        now: i64,
    ) -> Vec<ParentAction> {
        let no_progress = self.options.reattach_no_progress_timeout_ms as i64;
        let Some(driver) = self.current(run_id, gen) else { return Vec::new() };
        driver.last_progress = now;
        driver.failed_tails = 0;
        let rearm = driver.reattaching && !driver.detached;
        let frames = driver.frames.clone();
        let mut actions = Vec::new();
        let mut forwards: Vec<(ChunkKind, String, Option<String>)> = Vec::new();
        let mut cursor = None;
        let mut end = None;
        for line in lines {
            match line {
                TailLine::Chunk { i, k, b, r } => {
                    cursor = i.or(cursor);
                    // A re-run's marker is lifecycle: it goes out (and is counted) either way.
                    if !(frames.terminal_only && k == ChunkKind::Stored) {
                        forwards.push((k, b, r));
                    }
                }
                TailLine::End { outcome } => end = Some(outcome),
            }
        }
        if !forwards.is_empty() || cursor.is_some() {
            let batch: Vec<Forward<'_>> = forwards
                .iter()
                .map(|(kind, body, kept)| Forward { kind: *kind, body, replay: kept.as_deref() })
                .collect();
            // The append checks the run is still live here (it updates only a live row).
            match Registry::new(sql).append(run_id, &batch, cursor, now) {
                Ok(Some(seqs)) => {
                    for (seq, (_, body, _)) in seqs.into_iter().zip(&forwards) {
                        let frame = EventFrame::chunk(frames.parent_tool_call_id.clone(), seq, run_id, body.clone());
                        actions.push(ParentAction::Broadcast(frame.to_json()));
                    }
                    let signalled =
                        forwards.iter().any(|(k, _, _)| matches!(k, ChunkKind::Progress | ChunkKind::Milestone));
                    if signalled {
                        if let Ok(Some(record)) = Registry::new(sql).get(run_id) {
                            actions.extend(self.signals(sql, &record, &forwards, now));
                        }
                    }
                }
                // The run is no longer live (concluded elsewhere, or cleared): its row has the
                // result.
                Ok(None) => {
                    actions.push(ParentAction::CloseTail { run_id: run_id.to_owned() });
                    actions.extend(self.forget(sql, run_id));
                    return actions;
                }
                Err(e) => actions.extend(store_err(e)),
            }
        }
        if let Some(outcome) = end {
            actions.push(ParentAction::CloseTail { run_id: run_id.to_owned() });
            // The finish writes only a live row; a gone one is forgotten.
            actions.extend(self.conclude_run(sql, run_id, &frames.agent_type, terminal_from(outcome), now));
        } else if rearm {
            actions.push(ParentAction::SetTimer {
                run_id: run_id.to_owned(),
                gen,
                timer: Timer::Silence,
                at: now + no_progress,
            });
        }
        actions
    }

    /// Progress and milestones of a forwarded batch: `on_progress`, and a detached run's
    /// milestone notices.
    fn signals(
        &mut self,
        sql: &(impl Sql + ?Sized),
        record: &RunRecord,
        forwards: &[(ChunkKind, String, Option<String>)],
        now: i64,
    ) -> Vec<ParentAction> {
        let mut actions = Vec::new();
        let info = RunInfo::from_record(record);
        for (kind, body, _) in
            forwards.iter().filter(|(k, _, _)| matches!(k, ChunkKind::Progress | ChunkKind::Milestone))
        {
            let Ok(mut chunk) = serde_json::from_str::<Value>(body) else { continue };
            let mut data = chunk.get_mut("data").map_or(Value::Null, Value::take);
            if *kind == ChunkKind::Milestone {
                actions.extend(self.milestone_notice(sql, record, &data, now));
                if let Some(name) = data.get("name").cloned() {
                    data["milestone"] = name;
                }
            }
            if let Value::Object(o) = &mut data {
                o.entry("at").or_insert(Value::from(now));
            }
            if let Ok(snapshot) = serde_json::from_value::<ProgressSnapshot>(data) {
                actions.push(ParentAction::Hook(HookCall::Progress(info.clone(), snapshot)));
            }
        }
        actions
    }

    /// A milestone of a detached run that asked for it: one notice per `(run, name)`.
    fn milestone_notice(
        &mut self,
        sql: &(impl Sql + ?Sized),
        record: &RunRecord,
        milestone: &Value,
        now: i64,
    ) -> Vec<ParentAction> {
        let Some(detached) = &record.detached else { return Vec::new() };
        let Some(name) = milestone.get("name").and_then(Value::as_str) else { return Vec::new() };
        let Some(wanted) = detached.on_milestones.clone().and_then(|w| serde_json::from_value::<OnMilestones>(w).ok())
        else {
            return Vec::new();
        };
        if !wanted.names.iter().any(|n| n == name)
            || !Ledger::new(sql).claim_milestone(&record.run_id, name, now).unwrap_or(false)
        {
            return Vec::new();
        }
        let source = detached.notify_source.clone().unwrap_or_else(|| DEFAULT_NOTIFY_SOURCE.into());
        vec![ParentAction::MilestoneNotice {
            run: RunInfo::from_record(record),
            milestone: milestone.clone(),
            mode: wanted.mode,
            source,
        }]
    }

    /// The tail ended without an outcome: ask the child where the run stands (a run whose
    /// outcome was already known records it).
    fn on_tail_ended(&mut self, sql: &(impl Sql + ?Sized), run_id: &str, gen: u64, now: i64) -> Vec<ParentAction> {
        let max_window = self.options.reattach_max_window_ms;
        let next = self.gen();
        let Some(driver) = self.current(run_id, gen) else { return Vec::new() };
        if driver.draining.is_some() && driver.failed_tails < NOT_TAILABLE_AFTER {
            // The drain broke off: read again after a pause (a batch that brought chunks
            // resets the count, so a stream that keeps breaking but moves on is read to the end).
            driver.gen = next;
            driver.phase = Phase::Waiting;
            return vec![
                ParentAction::CloseTail { run_id: run_id.to_owned() },
                ParentAction::SetTimer {
                    run_id: run_id.to_owned(),
                    gen: next,
                    timer: Timer::Retail,
                    at: now + RETAIL_PAUSE_MS,
                },
            ];
        }
        if let Some(outcome) = driver.draining.take() {
            let Ok(Some(record)) = Registry::new(sql).get(run_id) else { return self.forget(sql, run_id) };
            let mut actions = vec![ParentAction::Observe(
                EventType::DrainIncomplete,
                json!({ "runId": run_id, "status": outcome.status.as_str() }),
            )];
            actions.extend(self.conclude(sql, &record, terminal_from(outcome), now));
            return actions;
        }
        if !driver.reattaching {
            driver.reattaching = true;
        }
        if driver.window_end.is_none() && !driver.detached {
            driver.window_end = max_window.map(|ms| now.saturating_add(ms as i64));
        }
        driver.gen = next;
        driver.phase = Phase::Inspecting;
        let Ok(Some(record)) = Registry::new(sql).get(run_id) else { return self.forget(sql, run_id) };
        let to = self.address(sql, &record);
        vec![
            ParentAction::CloseTail { run_id: run_id.to_owned() },
            ParentAction::InspectChild { run_id: run_id.to_owned(), gen: next, to },
        ]
    }

    fn on_timer(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        gen: u64,
        timer: Timer,
        now: i64,
    ) -> Vec<ParentAction> {
        let no_progress = self.options.reattach_no_progress_timeout_ms as i64;
        let Some(driver) = self.current(run_id, gen) else { return Vec::new() };
        let draining = driver.draining.is_some();
        match (timer, driver.phase) {
            (Timer::Retail, Phase::Waiting) => self.open_tail(sql, run_id, now),
            // The child has finished: its stored chunks are being read, no budget applies.
            (Timer::Silence | Timer::Window, _) if draining => Vec::new(),
            // Silent past the budget, or past the window, while tailing: stop reading and ask
            // the child (the decision follows its answer).
            (Timer::Silence, Phase::Tailing) if now - driver.last_progress >= no_progress => {
                self.on_tail_ended(sql, run_id, gen, now)
            }
            (Timer::Window, Phase::Tailing) if driver.window_end.is_some_and(|end| now >= end) => {
                self.on_tail_ended(sql, run_id, gen, now)
            }
            _ => Vec::new(),
        }
    }

    fn on_inspected(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        gen: u64,
        result: Result<Option<InspectionReply>, InterruptedReason>,
        now: i64,
    ) -> Vec<ParentAction> {
        if let Some((watch_gen, watch)) = self.watching.get(run_id).copied() {
            if watch_gen == gen {
                self.watching.remove(run_id);
                return self.on_watch_inspected(sql, run_id, watch, result, now);
            }
        }
        if self.current(run_id, gen).is_none() {
            // The row the recovery pass waits on was concluded meanwhile (a cancel): move on.
            let waited_on =
                self.pass.as_ref().and_then(|p| p.current.as_ref()).is_some_and(|(id, g)| id == run_id && *g == gen);
            if waited_on {
                if let Some(pass) = self.pass.as_mut() {
                    pass.current = None;
                }
                return self.next_recovery_row(sql, now);
            }
            return Vec::new();
        }
        let driver = self.drivers.get_mut(run_id).expect("checked above");
        let recovering = driver.recovering;
        driver.recovering = false;
        let mut actions = Vec::new();
        if recovering {
            actions.extend(self.recovery_row_inspected(run_id, &result));
        }
        let record = match Registry::new(sql).get(run_id) {
            Ok(Some(record)) if record.status.is_live() || record.status == RunStatus::Interrupted => record,
            // Concluded meanwhile (a cancel) or cleared: nothing to decide.
            _ => {
                actions.extend(self.forget(sql, run_id));
                if recovering {
                    actions.extend(self.next_recovery_row(sql, now));
                }
                return actions;
            }
        };
        let driver = self.drivers.get_mut(run_id).expect("checked above");
        let decision = match result {
            Err(reason) => Decide::Conclude(Terminal::inspect_failed(reason)),
            Ok(Some(inspection)) => match inspection.outcome() {
                // The run ended: read the chunks stored after the cursor first, then record it.
                Some(outcome) => Decide::Drain(outcome),
                None => driver.keep_waiting(&self.options, now),
            },
            // The child does not know the run: its start was lost. Send it again.
            Ok(None) => match record.input.clone() {
                Some(input) => Decide::Restart(input),
                None => Decide::Conclude(Terminal::Error {
                    message: "the child never accepted the run and its input was not kept; dispatch it again".into(),
                }),
            },
        };
        actions.extend(self.decide(sql, &record, decision, now));
        if recovering {
            actions.extend(self.next_recovery_row(sql, now));
        }
        actions
    }

    fn decide(
        &mut self,
        sql: &(impl Sql + ?Sized),
        record: &RunRecord,
        decision: Decide,
        now: i64,
    ) -> Vec<ParentAction> {
        let run_id = &record.run_id;
        match decision {
            Decide::Conclude(terminal) => self.conclude(sql, record, terminal, now),
            Decide::TearDown(terminal) => {
                let mut actions = vec![ParentAction::CancelChild {
                    run_id: run_id.clone(),
                    to: self.address(sql, record),
                    reason: Some("window-exceeded".into()),
                }];
                actions.extend(self.conclude(sql, record, terminal, now));
                actions
            }
            Decide::Drain(outcome) => {
                if let Some(driver) = self.drivers.get_mut(run_id) {
                    driver.draining = Some(outcome);
                }
                self.open_tail(sql, run_id, now)
            }
            Decide::Restart(input) => {
                let gen = self.gen();
                if let Some(driver) = self.drivers.get_mut(run_id) {
                    driver.gen = gen;
                    driver.phase = Phase::Starting;
                }
                vec![self.start_action(sql, record, input, gen)]
            }
            Decide::Retail => {
                let gen = self.gen();
                let Some(driver) = self.drivers.get_mut(run_id) else { return Vec::new() };
                driver.gen = gen;
                driver.phase = Phase::Waiting;
                vec![ParentAction::SetTimer {
                    run_id: run_id.clone(),
                    gen,
                    timer: Timer::Retail,
                    at: now + RETAIL_PAUSE_MS,
                }]
            }
        }
    }

    // ----- conclusion ---------------------------------------------------------------------

    /// Records the terminal result (unless the row is already final), broadcasts its frame,
    /// frees the slot, resolves the callers, and delivers it: `on_agent_tool_finish` once per
    /// run for an awaited run, the ledger for a detached one. The run is no longer driven.
    fn conclude(
        &mut self,
        sql: &(impl Sql + ?Sized),
        record: &RunRecord,
        terminal: Terminal,
        now: i64,
    ) -> Vec<ParentAction> {
        self.conclude_run(sql, &record.run_id, &record.agent_type, terminal, now)
    }

    /// [`Self::conclude`] by the run's id and agent type (its row is read by the finish).
    fn conclude_run(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        agent_type: &str,
        terminal: Terminal,
        now: i64,
    ) -> Vec<ParentAction> {
        self.drivers.remove(run_id);
        let registry = Registry::new(sql);
        let mut actions = vec![ParentAction::CloseTail { run_id: run_id.to_owned() }];
        match registry.finish(run_id, &terminal, now) {
            Ok(Some(done)) => {
                if let Some(frame) = done.terminal_frame() {
                    actions.push(ParentAction::Broadcast(frame.to_json()));
                }
                actions.push(ParentAction::SlotFreed);
                let result = RunResult::from_record(&done);
                if done.detached.is_some() {
                    actions.extend(self.deliveries(sql, &done, now));
                    self.quiet_ticks = 0;
                    actions.push(ParentAction::ArmAlarm { at: now + self.cadence() as i64 });
                } else if registry.claim_finish_hook(&done.run_id, now).unwrap_or(false) {
                    actions.push(ParentAction::Hook(HookCall::Finish(RunInfo::from_record(&done), result.clone())));
                }
                if done.child_still_running == Some(true) {
                    // Soft: the child goes on; the backbone watches it for a late result.
                    actions.push(ParentAction::ArmAlarm { at: now + self.cadence() as i64 });
                }
                actions.push(ParentAction::Resolve { run_id: done.run_id.clone(), result });
            }
            Ok(None) => actions.extend(self.forget(sql, run_id)),
            Err(e) => {
                let result =
                    RunResult { status: terminal.status(), ..RunResult::refused(run_id, agent_type, e.to_string()) };
                actions.push(ParentAction::Resolve { run_id: run_id.to_owned(), result });
            }
        }
        actions
    }

    /// Stops driving a run and hands its waiting callers what its row says.
    fn forget(&mut self, sql: &(impl Sql + ?Sized), run_id: &str) -> Vec<ParentAction> {
        self.drivers.remove(run_id);
        vec![ParentAction::Resolve { run_id: run_id.to_owned(), result: current_result(sql, run_id, "") }]
    }

    // ----- cancel and clear ---------------------------------------------------------------

    /// Cancels a run: the child is told to stop, the run ends `aborted`, and a caller waiting
    /// on it gets the result at once. Idempotent: an unknown or finished run is left as it is.
    pub fn cancel(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        reason: Option<String>,
        now: i64,
    ) -> Vec<ParentAction> {
        let Ok(Some(record)) = Registry::new(sql).get(run_id) else { return Vec::new() };
        if record.status.is_hard_terminal() {
            return Vec::new();
        }
        self.watching.remove(run_id);
        let mut actions = vec![ParentAction::CancelChild {
            run_id: run_id.to_owned(),
            to: self.address(sql, &record),
            reason: reason.clone(),
        }];
        actions.extend(self.conclude(sql, &record, Terminal::Aborted { reason }, now));
        actions
    }

    /// Clears finished runs past the retention policy (at most [`RETENTION_BATCH`] at a time;
    /// the alarm comes back soon for the rest). Runs with a delivery still owed stay.
    pub fn retain(&mut self, sql: &(impl Sql + ?Sized), now: i64) -> Vec<ParentAction> {
        let policy = self.options.retention;
        if policy.max_runs.is_none() && policy.max_age_ms.is_none() {
            return Vec::new();
        }
        let registry = Registry::new(sql);
        let ended_before = policy.max_age_ms.map(|ms| now.saturating_sub(ms as i64));
        let Ok(candidates) = registry.beyond_retention(policy.max_runs, ended_before, RETENTION_BATCH) else {
            return Vec::new();
        };
        if candidates.is_empty() {
            return Vec::new();
        }
        let owed = Ledger::new(sql).outstanding().unwrap_or_default();
        let doomed: Vec<String> = candidates.into_iter().filter(|id| !owed.contains(id)).collect();
        let mut actions = Vec::new();
        for run_id in &doomed {
            let Ok(Some(record)) = registry.get(run_id) else { continue };
            actions.push(self.clear_child(sql, &record, now));
            self.watching.remove(run_id);
        }
        if registry.delete(&doomed).is_err() {
            return Vec::new();
        }
        if doomed.len() == RETENTION_BATCH {
            actions.push(ParentAction::ArmAlarm { at: now + RETAIL_PAUSE_MS });
        }
        if !doomed.is_empty() {
            actions.push(ParentAction::Observe(
                EventType::Retention,
                json!({ "cleared": doomed.len(), "maxRuns": policy.max_runs, "maxAgeMs": policy.max_age_ms }),
            ));
        }
        actions
    }

    /// Removes the runs `filter` matches: the live ones are cancelled, each child's storage is
    /// deleted and the rows and frames too (each run id keeps its sequence high-water mark).
    /// Returns the cleared run ids.
    pub fn clear(
        &mut self,
        sql: &(impl Sql + ?Sized),
        filter: &ClearFilter,
        now: i64,
    ) -> Result<(Vec<String>, Vec<ParentAction>), StoreError> {
        let registry = Registry::new(sql);
        let runs = registry.matching(filter.status.as_deref(), filter.older_than)?;
        let mut actions = Vec::new();
        let mut cleared = Vec::new();
        for run in runs {
            if !run.status.is_hard_terminal() {
                actions.extend(self.cancel(sql, &run.run_id, Some("cleared".into()), now));
            }
            actions.push(self.clear_child(sql, &run, now));
            registry.delete(std::slice::from_ref(&run.run_id))?;
            self.watching.remove(&run.run_id);
            cleared.push(run.run_id);
        }
        Ok((cleared, actions))
    }

    /// Asks the child of a run being deleted to delete its storage, and keeps that owed until
    /// the child says it did (the alarm retries a failed call).
    fn clear_child(&self, sql: &(impl Sql + ?Sized), run: &RunRecord, now: i64) -> ParentAction {
        let to = self.address(sql, run);
        if let Err(e) =
            Registry::new(sql).owe_child_clear(&run.run_id, &to.binding, &to.name, now + CHILD_CLEAR_RETRY_MS)
        {
            return ParentAction::Observe(
                EventType::ChildClearFailed,
                json!({ "runId": run.run_id, "error": e.to_string() }),
            );
        }
        ParentAction::ClearChild { run_id: run.run_id.clone(), to }
    }

    /// The owed clears that are due again, asked again; one tried
    /// [`MAX_CHILD_CLEAR_ATTEMPTS`] times is given up with an event.
    fn retry_child_clears(&self, sql: &(impl Sql + ?Sized), now: i64) -> Vec<ParentAction> {
        let registry = Registry::new(sql);
        let Ok(due) = registry.child_clears_due(now, now + CHILD_CLEAR_RETRY_MS, CHILD_CLEAR_BATCH) else {
            return Vec::new();
        };
        let mut actions = Vec::new();
        for (run_id, binding, name, attempts) in due {
            if attempts > MAX_CHILD_CLEAR_ATTEMPTS {
                let _ = registry.child_cleared(&run_id);
                actions.push(ParentAction::Observe(
                    EventType::ChildClearFailed,
                    json!({ "runId": run_id, "child": name, "attempts": attempts - 1 }),
                ));
                continue;
            }
            actions.push(ParentAction::ClearChild { run_id, to: ChildAddress { binding, name } });
        }
        actions
    }

    // ----- recovery, backbone, watching ---------------------------------------------------

    /// The first event of a fresh instance: starts recovery once, without holding it up.
    pub fn wake(&mut self, sql: &(impl Sql + ?Sized), now: i64) -> Vec<ParentAction> {
        if self.recovery_started {
            return Vec::new();
        }
        self.recovery_started = true;
        self.begin_recovery(sql, now)
    }

    /// The alarm: recovery (if it never ran here), the backbone's tick, and the next alarm.
    pub fn alarm(&mut self, sql: &(impl Sql + ?Sized), now: i64) -> Vec<ParentAction> {
        self.recovery_started = true;
        let mut actions = self.begin_recovery(sql, now);
        let changed = self.backbone_tick(sql, now, &mut actions);
        self.quiet_ticks = if changed { 0 } else { self.quiet_ticks + 1 };
        actions.extend(self.watch_tick(sql, now));
        actions.extend(self.retain(sql, now));
        actions.extend(self.retry_child_clears(sql, now));
        let registry = Registry::new(sql);
        let mut next: Option<i64> = None;
        let mut sooner = |at: i64| next = Some(next.map_or(at, |n: i64| n.min(at)));
        let live = registry.live_count().unwrap_or(0);
        if live > 0 {
            sooner(now + self.options.recovery_alarm_ms as i64);
        }
        if let (Some(max_age), Ok(Some(oldest))) = (self.options.retention.max_age_ms, registry.oldest_finished_at()) {
            // The oldest finished run comes of age then (never sooner than a second from now).
            sooner((oldest + max_age as i64).max(now + 1000));
        }
        if registry.child_clears_pending().unwrap_or(0) > 0 {
            sooner(now + CHILD_CLEAR_RETRY_MS);
        }
        let watched = registry.watched(now, WATCH_MS).map(|w| w.len()).unwrap_or(0);
        let outstanding = Ledger::new(sql).outstanding().map(|o| o.len()).unwrap_or(0);
        if watched > 0 || outstanding > 0 {
            sooner(now + self.cadence() as i64);
        }
        if let Some(at) = next {
            actions.push(ParentAction::ArmAlarm { at });
        }
        actions.push(ParentAction::Observe(
            EventType::Alarm,
            json!({ "live": live, "outstanding": outstanding, "watched": watched, "nextInMs": next.map(|at| at - now) }),
        ));
        actions
    }

    fn cadence(&self) -> u64 {
        cadence_ms(self.quiet_ticks, &self.options.backbone_cadence_ms)
    }

    /// Finds the live runs nobody drives (a restart left them) and inspects them one by one,
    /// within [`RECOVERY_DEADLINE_MS`] for the whole pass.
    fn begin_recovery(&mut self, sql: &(impl Sql + ?Sized), now: i64) -> Vec<ParentAction> {
        if self.pass.is_some() {
            return Vec::new();
        }
        let Ok(all) = Registry::new(sql).all() else { return Vec::new() };
        let undriven: Vec<RunRecord> =
            all.into_iter().filter(|r| r.status.is_live() && !self.drivers.contains_key(&r.run_id)).collect();
        if undriven.is_empty() {
            return Vec::new();
        }
        let mut actions = vec![ParentAction::Observe(EventType::RecoveryBegin, json!({ "runs": undriven.len() }))];
        let window = self.options.reattach_max_window_ms;
        for record in &undriven {
            self.watching.remove(&record.run_id);
            let detached = record.detached.is_some();
            let driver = Driver {
                detached,
                phase: Phase::Inspecting,
                gen: 0,
                reattaching: true,
                last_progress: now,
                window_end: window.filter(|_| !detached).map(|ms| now.saturating_add(ms as i64)),
                failed_tails: 0,
                draining: None,
                recovering: true,
                frames: Frames::of(record),
            };
            self.drivers.insert(record.run_id.clone(), driver);
        }
        self.pass = Some(Pass {
            queue: undriven.iter().rev().map(|r| r.run_id.clone()).collect(),
            deadline: now + RECOVERY_DEADLINE_MS,
            current: None,
            runs: undriven.len(),
            finalized: 0,
            reattached: 0,
        });
        actions.extend(self.next_recovery_row(sql, now));
        actions
    }

    /// Inspects the next run of the pass, or ends the pass.
    fn next_recovery_row(&mut self, sql: &(impl Sql + ?Sized), now: i64) -> Vec<ParentAction> {
        let mut actions = Vec::new();
        loop {
            let Some(pass) = self.pass.as_mut() else { return actions };
            let Some(run_id) = pass.queue.pop() else {
                let pass = self.pass.take().expect("checked above");
                actions.push(ParentAction::Observe(
                    EventType::RecoveryComplete,
                    json!({ "runs": pass.runs, "finalized": pass.finalized, "reattached": pass.reattached }),
                ));
                return actions;
            };
            let deadline = pass.deadline;
            let record = match Registry::new(sql).get(&run_id) {
                Ok(Some(record)) if record.status.is_live() => record,
                // Concluded (a cancel) or cleared before its turn: nothing to recover.
                _ => {
                    if self.drivers.get(&run_id).is_none_or(|d| d.recovering) {
                        self.drivers.remove(&run_id);
                    }
                    continue;
                }
            };
            actions.push(ParentAction::Observe(
                EventType::RecoveryRow,
                json!({ "runId": run_id, "agentType": record.agent_type, "status": record.status }),
            ));
            if now >= deadline {
                actions.push(ParentAction::Observe(EventType::RecoveryDeadline, json!({ "runId": run_id })));
                let terminal = Terminal::Interrupted {
                    error: "recovery ran out of time before this run could be inspected".into(),
                    reason: Some(InterruptedReason::RecoveryDeadline),
                    child_still_running: None,
                };
                actions.extend(self.conclude(sql, &record, terminal, now));
                if let Some(pass) = self.pass.as_mut() {
                    pass.finalized += 1;
                }
                continue;
            }
            let gen = self.gen();
            let to = self.address(sql, &record);
            if let Some(driver) = self.drivers.get_mut(&run_id) {
                driver.gen = gen;
                driver.recovering = true;
            }
            if let Some(pass) = self.pass.as_mut() {
                pass.current = Some((run_id.clone(), gen));
            }
            actions.push(ParentAction::InspectChild { run_id, gen, to });
            return actions;
        }
    }

    /// Counts and reports one inspected run of a recovery pass, then moves the pass on.
    fn recovery_row_inspected(
        &mut self,
        run_id: &str,
        result: &Result<Option<InspectionReply>, InterruptedReason>,
    ) -> Vec<ParentAction> {
        let mut actions = Vec::new();
        if let Some(pass) = self.pass.as_mut() {
            if pass.current.as_ref().is_some_and(|(id, _)| id == run_id) {
                pass.current = None;
                match result {
                    Err(reason) => {
                        pass.finalized += 1;
                        actions.push(ParentAction::Observe(
                            EventType::RecoveryFailed,
                            json!({ "runId": run_id, "error": reason.as_str() }),
                        ));
                    }
                    Ok(Some(inspection)) if inspection.outcome().is_some() => pass.finalized += 1,
                    Ok(_) => {
                        pass.reattached += 1;
                        actions.push(ParentAction::Observe(EventType::RecoveryReattach, json!({ "runId": run_id })));
                    }
                }
            }
        }
        actions
    }

    /// The detached backbone: give up on exhausted budgets, deliver what is due. Returns
    /// whether anything changed (the cadence starts over when it did).
    fn backbone_tick(&mut self, sql: &(impl Sql + ?Sized), now: i64, actions: &mut Vec<ParentAction>) -> bool {
        let mut changed = false;
        for run_id in Ledger::new(sql).outstanding().unwrap_or_default() {
            let Ok(Some(run)) = Registry::new(sql).get(&run_id) else { continue };
            if let Some(reason) = budget_exceeded(&run, now) {
                actions.extend(self.give_up(sql, &run, reason, now));
                changed = true;
                continue;
            }
            let delivered = self.deliveries(sql, &run, now);
            changed |= !delivered.is_empty();
            actions.extend(delivered);
        }
        changed
    }

    /// Gives up on a detached run: `interrupted` first (delivered through the `give_up` slot,
    /// and handed to any caller joined to it), then the child is torn down, then inspected:
    /// a child that had completed anyway still gets its real result recorded.
    fn give_up(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run: &RunRecord,
        reason: InterruptedReason,
        now: i64,
    ) -> Vec<ParentAction> {
        let error = match reason {
            InterruptedReason::BudgetExceeded => "the detached run used up its budget",
            _ => "the detached run made no progress within its budget",
        };
        let terminal =
            Terminal::Interrupted { error: error.into(), reason: Some(reason), child_still_running: Some(false) };
        let to = self.address(sql, run);
        let mut actions = self.conclude(sql, run, terminal, now);
        actions.push(ParentAction::CancelChild {
            run_id: run.run_id.clone(),
            to: to.clone(),
            reason: Some(format!("given up: {}", reason.as_str())),
        });
        let gen = self.gen();
        self.watching.insert(run.run_id.clone(), (gen, Watch::GaveUp));
        actions.push(ParentAction::InspectChild { run_id: run.run_id.clone(), gen, to });
        actions
    }

    /// Inspects the given-up runs whose child was still running, for a late real result.
    fn watch_tick(&mut self, sql: &(impl Sql + ?Sized), now: i64) -> Vec<ParentAction> {
        let Ok(watched) = Registry::new(sql).watched(now, WATCH_MS) else { return Vec::new() };
        let mut actions = Vec::new();
        for run in watched {
            if self.drivers.contains_key(&run.run_id) || self.watching.contains_key(&run.run_id) {
                continue;
            }
            let gen = self.gen();
            self.watching.insert(run.run_id.clone(), (gen, Watch::LateResult));
            actions.push(ParentAction::InspectChild { run_id: run.run_id.clone(), gen, to: self.address(sql, &run) });
        }
        actions
    }

    fn on_watch_inspected(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        watch: Watch,
        result: Result<Option<InspectionReply>, InterruptedReason>,
        now: i64,
    ) -> Vec<ParentAction> {
        let Ok(Some(outcome)) = result.map(|i| i.and_then(|i| i.outcome())) else { return Vec::new() };
        let Ok(Some(record)) = Registry::new(sql).get(run_id) else { return Vec::new() };
        if record.status != RunStatus::Interrupted || self.drivers.contains_key(run_id) {
            return Vec::new();
        }
        let wanted = match watch {
            Watch::GaveUp => outcome.status == OutcomeStatus::Completed,
            Watch::LateResult => matches!(outcome.status, OutcomeStatus::Completed | OutcomeStatus::Error),
        };
        if !wanted {
            return Vec::new();
        }
        // A late real result: follow the child again to take the chunks it stored after the
        // cursor, then record the result (which repairs the soft `interrupted`, once).
        if Registry::new(sql).reattach(run_id).is_err() {
            return Vec::new();
        }
        let mut actions = vec![ParentAction::Observe(
            EventType::LateResult,
            json!({ "runId": run_id, "status": outcome.status.as_str() }),
        )];
        let driver = Driver {
            detached: record.detached.is_some(),
            phase: Phase::Tailing,
            gen: 0,
            reattaching: true,
            last_progress: now,
            window_end: None,
            failed_tails: 0,
            draining: Some(outcome),
            recovering: false,
            frames: Frames::of(&record),
        };
        self.drivers.insert(run_id.to_owned(), driver);
        actions.extend(self.open_tail(sql, run_id, now));
        actions
    }

    /// What a detached run's ledger has due: its outcome (`finish`) or a give-up, each claimed
    /// under a lease; the global hook once per run.
    fn deliveries(&mut self, sql: &(impl Sql + ?Sized), run: &RunRecord, now: i64) -> Vec<ParentAction> {
        let Some(detached) = &run.detached else { return Vec::new() };
        let ledger = Ledger::new(sql);
        let mut actions = Vec::new();
        let mut slots = Vec::new();
        match finish_due(run) {
            FinishDue::No => {}
            FinishDue::Suppress => {
                let _ = ledger.delivered(&run.run_id, Slot::Finish, now);
            }
            FinishDue::Deliver => slots.push(Slot::Finish),
        }
        if give_up_due(run) {
            slots.push(Slot::GiveUp);
        }
        for slot in slots {
            let Ok(Claim::Claimed(attempt)) = ledger.claim(&run.run_id, slot, now) else { continue };
            let info = RunInfo::from_record(run);
            let result = RunResult::from_record(run);
            if Registry::new(sql).claim_finish_hook(&run.run_id, now).unwrap_or(false) {
                actions.push(ParentAction::Hook(HookCall::Finish(info.clone(), result.clone())));
            }
            let delivery = match (&detached.on_finish, detached.notify) {
                (Some(handler), _) => Delivery::Handler(handler.clone()),
                (None, true) => Delivery::Notify {
                    source: detached.notify_source.clone().unwrap_or_else(|| DEFAULT_NOTIFY_SOURCE.into()),
                },
                (None, false) => Delivery::Nothing,
            };
            actions.push(ParentAction::Deliver { run: info, result, slot, attempt, delivery });
        }
        actions
    }

    fn on_delivery_done(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        slot: Slot,
        attempt: i64,
        result: Result<(), String>,
        now: i64,
    ) -> Vec<ParentAction> {
        let ledger = Ledger::new(sql);
        match result {
            Ok(()) => {
                let _ = ledger.delivered(run_id, slot, now);
                Vec::new()
            }
            Err(error) => {
                let _ = ledger.failed(run_id, slot);
                let dead = attempt >= MAX_ATTEMPTS;
                let slot = if slot == Slot::Finish { "finish" } else { "give_up" };
                vec![
                    ParentAction::Observe(
                        EventType::DetachedDeliveryFailed,
                        json!({ "runId": run_id, "slot": slot, "attempt": attempt, "deadLetter": dead, "error": error }),
                    ),
                    ParentAction::ArmAlarm { at: now + self.cadence() as i64 },
                ]
            }
        }
    }
}

/// What to do after an inspection.
enum Decide {
    Conclude(Terminal),
    TearDown(Terminal),
    Drain(RunOutcome),
    Restart(Value),
    Retail,
}

impl Driver {
    /// The child says the run is live: wait more, within the re-attach budgets (a detached run
    /// is bounded by its own budgets instead, on the backbone).
    fn keep_waiting(&self, options: &AgentToolOptions, now: i64) -> Decide {
        if self.failed_tails >= NOT_TAILABLE_AFTER {
            return Decide::Conclude(Terminal::Interrupted {
                error: format!(
                    "the child's stream could not be tailed ({NOT_TAILABLE_AFTER} attempts); it may still be running"
                ),
                reason: Some(InterruptedReason::NotTailable),
                child_still_running: Some(true),
            });
        }
        if self.detached {
            return Decide::Retail;
        }
        if self.window_end.is_some_and(|end| now >= end) {
            return Decide::TearDown(Terminal::Interrupted {
                error: "the re-attach window ran out; the child was torn down".into(),
                reason: Some(InterruptedReason::WindowExceeded),
                child_still_running: Some(false),
            });
        }
        let no_progress = options.reattach_no_progress_timeout_ms as i64;
        if now - self.last_progress >= no_progress {
            return Decide::Conclude(Terminal::Interrupted {
                error: format!("the child made no progress for {no_progress} ms; it may still be running"),
                reason: Some(InterruptedReason::NoProgress),
                child_still_running: Some(true),
            });
        }
        Decide::Retail
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
        Ok(Some(record)) => RunResult::from_record(&record),
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
    use crate::agent::Retention;
    use crate::store::sqlite;

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
