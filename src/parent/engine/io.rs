//! What the parent engine is told ([`ParentEvent`], [`Dispatch`]) and what it tells the
//! platform to do ([`ParentAction`]).

use serde_json::Value;

use crate::observability::EventType;
use crate::parent::detached::Slot;
use crate::parent::registry::{NewRun, RunRecord};
use crate::protocol::child_api::{InspectionReply, StartRequest};
use crate::protocol::tail::TailLine;
use crate::protocol::InterruptedReason;
use crate::types::{DetachedOptions, MilestoneMode, ProgressSnapshot, RunInfo, RunResult};

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
