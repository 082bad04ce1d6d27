//! What the parent engine is told ([`ParentEvent`], [`Dispatch`]) and what it tells the
//! platform to do ([`ParentAction`]).

use serde_json::Value;

use crate::error::Error;
use crate::observability::EventType;
use crate::parent::detached::Slot;
use crate::parent::registry::{NewRun, RunRecord};
use crate::protocol::child_api::{InspectionReply, StartRequest};
use crate::protocol::tail::TailLine;
use crate::protocol::InterruptedReason;
use crate::types::{
    DetachedHandle, DetachedOptions, Milestone, MilestoneMode, ProgressSnapshot, RunInfo, RunResult, RunStatus,
};

/// Where a child lives: its binding and its Durable Object name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildAddress {
    /// The `[[durable_objects.bindings]]` name.
    pub binding: String,
    /// `<Parent>/<parent-name>/<run-id>`.
    pub name: String,
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
    /// The child answered that it failed (a 5xx: its storage failed, it could not serve yet):
    /// the start is sent again after a pause, up to [`super::START_ATTEMPTS`] times, then the run
    /// ends `error`.
    Failed(String),
    /// The child could not be reached (a deploy, an eviction, the network): the run ends
    /// `interrupted`, retryable, and dispatching its id again starts it afresh.
    Unreachable(String),
}

/// What happened, reported by the platform (or the simulation). Every exchange with a child
/// carries the generation it was begun with; an answer to an exchange the engine has moved past
/// is ignored.
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
    /// An inspection's answer: `Ok(None)` when the child does not know the run (yet). The
    /// engine times inspections out itself ([`super::INSPECT_TIMEOUT_MS`]).
    Inspected {
        /// The run.
        run_id: String,
        /// The exchange.
        gen: u64,
        /// The answer.
        result: Result<Option<InspectionReply>, InterruptedReason>,
    },
    /// A child answered a clear (`Err`: it could not be reached or failed; the alarm retries).
    ChildCleared {
        /// The run.
        run_id: String,
        /// The clear's exchange (an answer to a clear asked again since settles nothing).
        gen: u64,
        /// The answer.
        result: Result<(), String>,
    },
    /// A delivery the engine asked for ended.
    DeliveryDone {
        /// The run.
        run_id: String,
        /// The slot.
        slot: Slot,
        /// The delivery's exchange (a delivery of a run cleared meanwhile, or taken over after
        /// its lease, is not this one).
        gen: u64,
        /// The attempt (from 1).
        attempt: i64,
        /// `Err` is the handler's error.
        result: Result<(), String>,
    },
    /// A run's `on_agent_tool_finish` hook returned: its waiting callers get the result now.
    FinishHookDone {
        /// The run.
        run_id: String,
        /// The hook call's exchange (a call for a run cleared and dispatched again since, or
        /// called again, settles nothing).
        gen: u64,
    },
}

/// A hook of the agent's to call.
#[derive(Debug, Clone, PartialEq)]
pub enum HookCall {
    /// `on_agent_tool_start`.
    Start(RunInfo),
    /// `on_agent_tool_finish` (once per run); answer with [`ParentEvent::FinishHookDone`].
    /// With its exchange number ([`ParentEvent::FinishHookDone`] names it).
    Finish(RunInfo, RunResult, u64),
    /// `on_progress` (best-effort).
    Progress(RunInfo, ProgressSnapshot),
}

/// One delivery of a detached run's outcome: its slot, its exchange, its attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// The slot.
    pub slot: Slot,
    /// The exchange.
    pub gen: u64,
    /// The attempt (from 1).
    pub attempt: i64,
}

impl Delivery {
    /// Its answer, for the run `run_id`.
    pub fn done(self, run_id: String, result: Result<(), String>) -> ParentEvent {
        ParentEvent::DeliveryDone { run_id, slot: self.slot, gen: self.gen, attempt: self.attempt, result }
    }
}

/// What a chat notice is about.
#[derive(Debug, Clone, PartialEq)]
pub enum NoticeOf {
    /// A `notify` run's outcome: `format_detached_completion` words it.
    Outcome(RunResult),
    /// A milestone of an `on_milestones` run: `format_detached_milestone` words it.
    Milestone(Milestone),
}

/// A message the engine posts to the agent's chat. The platform words it with the agent's
/// formatting hook and hands the text back ([`super::ParentEngine::post_notice`]); an empty
/// text posts nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    /// The message id: `detached-finish:<run>:<status>` or `detached-ms:<run>:<name>`, so a
    /// notice is posted once however often it is offered.
    pub id: String,
    /// The run.
    pub run: RunInfo,
    /// What it says.
    pub of: NoticeOf,
    /// `metadata.source`.
    pub source: String,
    /// A user-role message followed by a model turn (`react`, and a finished `notify` run), or
    /// a synthetic assistant line (`narrate`).
    pub turn: bool,
    /// The delivery it settles, for an outcome.
    pub delivery: Option<Delivery>,
}

impl Notice {
    /// The message's role.
    pub fn role(&self) -> &'static str {
        if self.turn {
            "user"
        } else {
            "assistant"
        }
    }

    /// The message's metadata.
    pub fn metadata(&self) -> Value {
        let mut metadata = serde_json::json!({
            "source": self.source, "runId": self.run.run_id, "agentType": self.run.agent_type,
        });
        match &self.of {
            NoticeOf::Outcome(result) => metadata["status"] = serde_json::json!(result.status),
            NoticeOf::Milestone(milestone) => metadata["milestone"] = Value::from(milestone.name.as_str()),
        }
        metadata
    }

    /// A milestone notice of `run` (`key` names the run in message ids: see [`notice_key`]).
    pub(super) fn milestone(
        run: RunInfo,
        key: &str,
        milestone: Milestone,
        mode: MilestoneMode,
        source: String,
    ) -> Self {
        Self {
            id: format!("detached-ms:{key}:{}", milestone.name),
            run,
            of: NoticeOf::Milestone(milestone),
            source,
            turn: mode == MilestoneMode::React,
            delivery: None,
        }
    }
}

/// How a run is named in the ids of the chat messages it posts: its run id (the TypeScript
/// SDK's ids), and, for a run id that was cleared and dispatched again, `<run>@<started>` (its
/// `started` frame's sequence), so the new run's messages are not taken for the old one's.
pub(super) fn notice_key(run: &RunRecord) -> String {
    if run.started_seq == 0 {
        run.run_id.clone()
    } else {
        format!("{}@{}", run.run_id, run.started_seq)
    }
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
    /// Inspect the child; answer with `Inspected`.
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
    /// Delete the child's storage; answer with [`ParentEvent::ChildCleared`].
    ClearChild {
        /// The run.
        run_id: String,
        /// Where.
        to: ChildAddress,
        /// The exchange.
        gen: u64,
    },
    /// Hand `result` to every caller waiting on the run.
    Resolve {
        /// The run.
        run_id: String,
        /// Its result.
        result: RunResult,
    },
    /// Call a hook.
    Hook(HookCall),
    /// Hand a detached outcome to `on_detached_finish` with the run's handler tag; answer with
    /// [`ParentEvent::DeliveryDone`].
    Deliver {
        /// The run.
        run: RunInfo,
        /// The outcome.
        result: RunResult,
        /// The slot.
        slot: Slot,
        /// The delivery's exchange.
        gen: u64,
        /// The attempt.
        attempt: i64,
        /// The handler tag given at dispatch.
        handler: Value,
    },
    /// Word a notice with the agent's hook and post it ([`super::ParentEngine::post_notice`]).
    Notice(Notice),
    /// Send every chat client the transcript (a notice was posted).
    Transcript,
    /// Run a model turn on the chat (a notice asked for one), then answer the delivery, if any,
    /// with [`ParentEvent::DeliveryDone`].
    RunChatTurn {
        /// The turn's request id (the notice's message id).
        request_id: String,
        /// The run and the delivery the turn settles.
        delivery: Option<(String, Delivery)>,
    },
    /// An observability event.
    Observe(EventType, Value),
}

/// How a dispatch was admitted.
#[derive(Debug, Clone, PartialEq)]
pub enum Admitted {
    /// Nothing was started, for this reason: refused, writing nothing (an oversized dispatch,
    /// a run id of another class, the cap under [`crate::Admission::Reject`], a detached run over
    /// the cap), an input that does not fit, or a storage failure (rolled back whole).
    Refused(Error),
    /// The run already ended (or the caller gave up before it was admitted): its result.
    Finished(RunResult),
    /// This instance drives it now; wait for its [`ParentAction::Resolve`].
    Driving,
    /// It is already driven here; wait for its `Resolve`.
    Joined,
    /// Every slot is taken and the agent queues ([`crate::Admission::Queue`]): it is admitted
    /// when one frees; wait for its `Resolve`.
    Queued,
}

impl Admitted {
    /// The result of an awaited dispatch that does not wait (refused, or already over), or
    /// `None`: wait for its [`ParentAction::Resolve`].
    pub fn settled(self, run_id: &str, agent_type: &str) -> Option<RunResult> {
        match self {
            Self::Refused(error) => Some(RunResult::refused(run_id, agent_type, error.to_string())),
            Self::Finished(result) => Some(result),
            Self::Driving | Self::Joined | Self::Queued => None,
        }
    }

    /// What a detached dispatch returns at once: `running` for a run driven or queued here (an
    /// `interrupted` run dispatched again among them: it is followed again, though its row
    /// says `interrupted` until its child answers), the status a run already ended with, or
    /// `error` with why it was refused.
    pub fn handle(self, run_id: &str, agent_type: &str) -> DetachedHandle {
        let (status, error) = match self {
            Self::Refused(problem) => (RunStatus::Error, Some(problem)),
            Self::Finished(result) => (result.status, None),
            Self::Driving | Self::Joined | Self::Queued => (RunStatus::Running, None),
        };
        DetachedHandle { run_id: run_id.to_owned(), agent_type: agent_type.to_owned(), status, error }
    }
}

/// A dispatch.
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatch {
    /// The row to create (or find).
    pub new: NewRun,
    /// For a detached run, its configuration (budgets filled in by the engine).
    pub detached: Option<DetachedOptions>,
    /// The caller gave up before dispatching (its signal was cancelled, with this reason): a
    /// run not yet known is not started.
    pub abandoned: Option<String>,
}
