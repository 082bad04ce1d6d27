//! The parent's public calls: dispatch (awaited and detached), cancel, clear, and the
//! read-only views of the registry. Each asks the engine, carries out its actions, and waits
//! where a caller must.

use futures::channel::oneshot;
use futures::future::{select, Either};
use futures::StreamExt;
use serde_json::Value;

use crate::agent::Agent;
use crate::error::{Error, NotFound, Refused, Unavailable};
use crate::host::core::{missing_binding, AgentHost, Host};
use crate::host::{ChildCall, ChildReply};
use crate::parent::agent_tool::ChildRef;
use crate::parent::engine::{current_result, Admitted, Called, Cleared, Dispatch};
use crate::parent::outbox::{Outbox, Sent};
use crate::parent::registry::{NewRun, RunRecord};
use crate::protocol::child_api::{MessageRequest, RunInput};
use crate::protocol::tail::{LineSplitter, TailLine};
use crate::store::StoreError;
use crate::types::AgentClass;
use crate::types::{
    validate_run_id, AgentToolChunk, ClearFilter, DetachedHandle, DetachedOptions, EventDelivery, RunInfo,
    RunInspection, RunOptions, RunResult,
};

impl<A: Agent> AgentHost<A> {
    /// Dispatches a run of child agent `C` and waits for its outcome (the TypeScript SDK's
    /// awaited `runAgentTool`). Fan out by joining several of these futures.
    ///
    /// Idempotent by run id: a known id returns its recorded result, joins the dispatch already
    /// under way, or re-attaches to its child; it never starts a second child. A run id of
    /// another class is refused. Over [`crate::AgentToolOptions::max_concurrent`], the dispatch
    /// is refused (writing nothing) or queued, as [`crate::Admission`] says. Cancelling
    /// [`RunOptions::signal`] cancels the run.
    pub async fn run_agent_tool<C: AgentClass>(&self, options: RunOptions) -> RunResult {
        self.host.dispatch_awaited(ChildRef::of::<C>(), options).await
    }

    /// Dispatches a run of child agent `C` and returns at once (the TypeScript SDK's
    /// `runAgentTool` with `detached`); the run goes on in the background and its outcome is
    /// delivered durably (see [`DetachedOptions`]). No caller's signal reaches it: cancel it with
    /// [`AgentHost::cancel_agent_tool`]. A known run id never starts a second child: its handle
    /// says `running` while the run goes on, or the status it ended with (`error` included:
    /// an `Ok` handle is never a rejection). `Err` when nothing was started: [`Error::Refused`]
    /// when the engine turned the dispatch away (the TypeScript SDK's handle with status
    /// `error`), [`Error::Invalid`] for a malformed run id or a tag that does not serialize,
    /// [`Error::Config`] for a child class with no binding.
    ///
    /// ```
    /// use agent_tools::prelude::*;
    /// use agent_tools::{HandlerTag, OnMilestones, RunInfo};
    /// use std::time::Duration;
    /// use serde_json::Value;
    ///
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// enum Handler {
    ///     ImportDone,
    /// }
    ///
    /// async fn start_import(host: &AgentHost<Assistant>, input: Value) -> Result<String, Error> {
    ///     let detached = DetachedOptions::default()
    ///         .on_finish(&Handler::ImportDone) // delivered to on_detached_finish, durably
    ///         .max_budget(Duration::from_secs(60 * 60))
    ///         .on_milestones(OnMilestones::narrate(["sources-gathered"]));
    ///     let handle = host.run_agent_tool_detached::<Researcher>(RunOptions::new(input), detached).await?;
    ///     Ok(handle.run_id) // at once; the run goes on in the background
    /// }
    ///
    /// impl Agent for Assistant {
    ///     async fn on_detached_finish(
    ///         &self,
    ///         _host: &AgentHost<Self>,
    ///         handler: &HandlerTag,
    ///         run: &RunInfo,
    ///         result: &RunResult,
    ///     ) -> Result<(), Error> {
    ///         match handler.decode()? {
    ///             // An Err (a tag this version does not know) is retried, then dead-lettered.
    ///             Handler::ImportDone => Ok(println!("{} ended {:?}", run.run_id, result.status)),
    ///         }
    ///     }
    /// }
    /// # #[derive(Default)] pub struct Assistant;
    /// # #[derive(Default)] pub struct Researcher;
    /// # impl Agent for Researcher {}
    /// # agent_tools::durable_object!(Assistant);
    /// # agent_tools::durable_object!(Researcher);
    /// # fn main() {}
    /// ```
    pub async fn run_agent_tool_detached<C: AgentClass>(
        &self,
        options: RunOptions,
        detached: DetachedOptions,
    ) -> Result<DetachedHandle, Error> {
        if let Some(problem) = &detached.invalid_tag {
            return Err(Error::invalid(problem.clone()));
        }
        let handle = self.host.dispatch_detached(ChildRef::of::<C>(), options, detached).await;
        match handle.error {
            Some(error) => Err(error),
            None => Ok(handle),
        }
    }

    /// Cancels a run: the child stops its turn, the run ends `aborted`, and a caller waiting on
    /// it gets the result at once. Idempotent: an unknown or finished run is left as it is. An
    /// `Err` says storage failed and nothing changed.
    pub fn cancel_agent_tool(&self, run_id: &str, reason: Option<String>) -> Result<(), Error> {
        self.host.cancel_agent_tool(run_id, reason).map_err(Error::Storage)
    }

    /// Sends a running run the message `name` its [`crate::Turn::wait_for`] waits for: the
    /// seed's parent-mediated workflow (a child reports `needs-approval`, the parent asks a
    /// person, and sends the answer). The message is kept here until the child has it, so a
    /// deploy or a restart of either side loses nothing: the alarm delivers what could not be
    /// delivered at once. The first message of a name stays; sending it again is a no-op, and a
    /// different one is refused.
    ///
    /// `Err(NotFound)` for an unknown run, `Err(Refused)` for a run that ended or a name already
    /// sent with another value, `Err(Storage)` when nothing could be kept.
    ///
    /// ```
    /// use agent_tools::prelude::*;
    ///
    /// async fn approve(host: &AgentHost<impl Agent>, run_id: &str) -> Result<(), Error> {
    ///     host.send_to_agent_tool_run(run_id, "approval", &serde_json::json!({ "approved": true })).await
    /// }
    /// ```
    pub async fn send_to_agent_tool_run<T: serde::Serialize>(
        &self,
        run_id: &str,
        name: &str,
        message: &T,
    ) -> Result<(), Error> {
        let value = serde_json::to_value(message).map_err(|e| Error::json("the message does not serialize", e))?;
        self.host.send_to_agent_tool_run(run_id, name, value).await
    }

    /// Removes retained runs: cancels the live ones, deletes each child's storage and this
    /// agent's rows and frames. Cleared runs never replay again. Returns the cleared run ids.
    pub async fn clear_agent_tool_runs(&self, filter: &ClearFilter) -> Result<Vec<String>, Error> {
        self.host.clear_agent_tool_runs(filter).await.map_err(Error::Storage)
    }

    // ----- read-only views --------------------------------------------------------------

    /// Whether `run_id` is a known run of the child class `agent_type` (`Researcher::CLASS`, or
    /// the class a drill-in path names): the default drill-in gate's test, the TypeScript SDK's
    /// `hasAgentToolRun(className, runId)`. `Err(Storage)` when the registry could not be read
    /// (never a silent `false`).
    pub fn has_agent_tool_run(&self, agent_type: &str, run_id: &str) -> Result<bool, Error> {
        self.host.has_agent_tool_run(agent_type, run_id).map_err(Error::Storage)
    }

    /// Every retained run, oldest first. `Err(Storage)` when the registry could not be read
    /// (never a silent empty list).
    pub fn agent_tool_runs(&self) -> Result<Vec<RunInfo>, Error> {
        self.host.agent_tool_runs().map_err(Error::Storage)
    }

    /// One run with its result, latest progress and milestones; `Ok(None)` when the run is
    /// unknown here (never dispatched, or cleared): `None` never means "failed", a failed read
    /// is `Err(Storage)`.
    pub fn inspect_agent_tool_run(&self, run_id: &str) -> Result<Option<RunInspection>, Error> {
        self.host.inspect_agent_tool_run(run_id).map_err(Error::Storage)
    }

    /// The run's stored chunks (its `UIMessageChunk`s and milestones), after `after_sequence`
    /// (all with `None`). Empty for an unknown run. For a run dispatched with
    /// `EventDelivery::Full` they are the frames this agent keeps, with the sequences they were
    /// sent with; for `EventDelivery::Terminal` (whose chunks never reached this agent) they are
    /// read from the child, which keeps its whole stream, and `sequence` is the chunk's index in
    /// the child's log (a live run's chunks so far). `Err(Storage)` when this agent's registry
    /// could not be read, `Err(Unavailable)` when a `Terminal` run's child could not be read.
    pub async fn agent_tool_chunks(
        &self,
        run_id: &str,
        after_sequence: Option<i64>,
    ) -> Result<Vec<AgentToolChunk>, Error> {
        self.host.agent_tool_chunks(run_id, after_sequence).await
    }
}

/// The calls above, on the host every agent class shares (documented there).
impl Host {
    pub(crate) async fn dispatch_awaited(&self, child: ChildRef, options: RunOptions) -> RunResult {
        let new = match self.prepare(child, &options) {
            Ok(new) => new,
            Err((run_id, error)) => return RunResult::refused(run_id, child.class, error.to_string()),
        };
        let run_id = new.run_id.clone();
        let signal = options.signal.clone().unwrap_or_default();
        let reason = || signal.reason().unwrap_or_else(|| "cancelled by the caller".into());
        let abandoned = signal.is_cancelled().then(reason);
        let dispatch = Dispatch { new, detached: None, abandoned };
        let (admitted, actions) = self.0.parent.borrow_mut().dispatch(self.parent_sql(), dispatch, self.now());
        let Some(result) = admitted.settled(&run_id, child.class) else {
            // Driven, joined or queued: wait for its result, or for the caller to give up.
            let (tx, rx) = oneshot::channel();
            self.0.waiters.borrow_mut().entry(run_id.clone()).or_default().push(tx);
            self.carry_out(actions);
            let stop = signal.cancelled();
            futures::pin_mut!(rx, stop);
            let rx = match select(rx, stop).await {
                Either::Left((result, _)) => return result.unwrap_or_else(|_| self.lost(&run_id, child.class)),
                Either::Right((_, rx)) => rx,
            };
            let actions = self.0.parent.borrow_mut().abandon(self.parent_sql(), &run_id, reason(), self.now());
            self.carry_out(actions);
            return rx.await.unwrap_or_else(|_| self.lost(&run_id, child.class));
        };
        self.carry_out(actions);
        result
    }

    /// The result of a run whose waiter was dropped unanswered: its row's.
    fn lost(&self, run_id: &str, agent_type: &str) -> RunResult {
        current_result(self.parent_sql(), run_id, agent_type).unwrap_or_else(|e| {
            RunResult::refused(run_id, agent_type, format!("the run's result could not be read: {e}"))
        })
    }

    /// Checks a dispatch's run id and child binding, and describes its row; a refusal is the
    /// run id and why.
    pub(crate) fn prepare(&self, child: ChildRef, options: &RunOptions) -> Result<NewRun, (String, Error)> {
        let run_id = options.run_id.clone().unwrap_or_else(|| self.0.io.random_id());
        if let Err(problem) = validate_run_id(&run_id) {
            return Err((run_id, Error::invalid(problem)));
        }
        if !self.0.io.has_binding(child.binding) {
            return Err((run_id, Error::Config(missing_binding(self.0.class, child.class, child.binding))));
        }
        Ok(NewRun {
            run_id,
            parent_tool_call_id: options.parent_tool_call_id.clone(),
            agent_type: child.class.to_owned(),
            binding: child.binding.to_owned(),
            // Cut to 500 characters, given or made from the input.
            input_preview: crate::parent::registry::input_preview(
                &options.input_preview.clone().map_or_else(|| options.input.clone(), Value::String),
            ),
            display: options.display.clone(),
            display_order: options.display_order.unwrap_or(0),
            event_delivery: options.event_delivery,
            input: RunInput::of(&options.input),
        })
    }

    pub(crate) async fn dispatch_detached(
        &self,
        child: ChildRef,
        options: RunOptions,
        detached: DetachedOptions,
    ) -> DetachedHandle {
        let new = match self.prepare(child, &options) {
            Ok(new) => new,
            Err((run_id, problem)) => return Admitted::Refused(problem).handle(&run_id, child.class),
        };
        let run_id = new.run_id.clone();
        let dispatch = Dispatch { new, detached: Some(detached), abandoned: None };
        let (admitted, actions) = self.0.parent.borrow_mut().dispatch(self.parent_sql(), dispatch, self.now());
        self.carry_out(actions);
        admitted.handle(&run_id, child.class)
    }

    pub(crate) fn cancel_agent_tool(&self, run_id: &str, reason: Option<String>) -> Result<(), StoreError> {
        let Called { result, actions } =
            self.0.parent.borrow_mut().cancel(self.parent_sql(), run_id, reason, self.now());
        self.carry_out(actions);
        result
    }

    pub(crate) async fn send_to_agent_tool_run(&self, run_id: &str, name: &str, value: Value) -> Result<(), Error> {
        let Some(run) = self.registry().get(run_id)? else {
            return Err(Error::NotFound(NotFound::Run(run_id.to_owned())));
        };
        if !run.status.is_live() {
            return Err(Refused::Ended { run_id: run_id.to_owned(), status: run.status }.into());
        }
        let outbox = Outbox::new(self.parent_sql());
        match outbox.send(run_id, name, &value, self.now())? {
            Sent::New | Sent::Again => {}
            Sent::Taken(first) => {
                let (run_id, name) = (run_id.to_owned(), name.to_owned());
                return Err(Refused::AlreadySent { run_id, name, first: first.to_string() }.into());
            }
        }
        self.deliver_messages(Some(run_id)).await;
        Ok(())
    }

    /// Delivers the messages children do not have yet (of `run_id` only, when given); what a
    /// child could not take now is tried again by the alarm, which is armed while runs live.
    pub(crate) async fn deliver_messages(&self, run_id: Option<&str>) {
        if !self.0.parent_tables.get() {
            return;
        }
        let outbox = Outbox::new(self.parent_sql());
        let pending = match outbox.pending(run_id) {
            Ok(pending) => pending,
            Err(e) => return self.storage_failed("messages to children", &e),
        };
        let parent = match self.own_name() {
            Ok(parent) => parent,
            // Tried again by the alarm.
            Err(e) => return self.log_error(&format!("messages to children wait: {e}")),
        };
        for message in pending {
            let Ok(Some(run)) = self.registry().get(&message.run_id) else { continue };
            let to = crate::parent::engine::child_address(self.0.class, &parent, &run);
            let request =
                MessageRequest { run_id: message.run_id.clone(), name: message.name.clone(), value: message.value };
            let delivered = match self.0.io.call_child(&to, ChildCall::Message(request)).await {
                Ok(ChildReply::Done(_)) => true,
                // The child's run ended or is gone: it can never take it.
                Ok(ChildReply::Refused { status: 404 | 409, .. }) => true,
                Ok(ChildReply::Refused { body, .. }) | Err(body) => {
                    self.log_error(&format!(
                        "sending {:?} to {} failed (tried again): {body}",
                        message.name, message.run_id
                    ));
                    false
                }
                Ok(_) => false,
            };
            if delivered {
                if let Err(e) = Outbox::new(self.parent_sql()).delivered(&message.run_id, &message.name, self.now()) {
                    self.storage_failed("messages to children", &e);
                }
            } else {
                let retry = self.now() + crate::parent::engine::MESSAGE_RETRY_MS;
                self.arm_alarm_at(retry).await;
            }
        }
    }

    pub(crate) async fn clear_agent_tool_runs(&self, filter: &ClearFilter) -> Result<Vec<String>, StoreError> {
        // An object with no registry has no runs: nothing to clear, and no tables to make for it.
        if !self.0.parent_tables.get() {
            return Ok(Vec::new());
        }
        let Called { result, actions } = self.0.parent.borrow_mut().clear(self.parent_sql(), filter, self.now());
        self.carry_out(actions);
        // The messages of cleared runs go with them.
        if let Err(e) = Outbox::new(self.parent_sql()).prune() {
            self.storage_failed("messages to children", &e);
        }
        match result {
            Ok(Cleared { runs, failed: None }) => Ok(runs),
            Ok(Cleared { runs, failed: Some(e) }) => Err(StoreError {
                message: format!(
                    "{}; {} runs were cleared before it, the rest are as they were",
                    e.message,
                    runs.len()
                ),
            }),
            Err(e) => Err(e),
        }
    }

    // ----- read-only views --------------------------------------------------------------

    pub(crate) fn has_agent_tool_run(&self, agent_type: &str, run_id: &str) -> Result<bool, StoreError> {
        self.registry().has_run(agent_type, run_id).map_err(|e| self.read_failed("has_agent_tool_run", e))
    }

    pub(crate) fn agent_tool_runs(&self) -> Result<Vec<RunInfo>, StoreError> {
        let runs = self.registry().all().map_err(|e| self.read_failed("agent_tool_runs", e))?;
        Ok(runs.iter().map(RunRecord::info).collect())
    }

    pub(crate) fn inspect_agent_tool_run(&self, run_id: &str) -> Result<Option<RunInspection>, StoreError> {
        self.registry().inspection(run_id).map_err(|e| self.read_failed("inspect", e))
    }

    /// A read of the registry failed: reported (`agent_tool:storage_failed`), and passed on.
    fn read_failed(&self, step: &str, e: StoreError) -> StoreError {
        self.storage_failed(step, &e);
        e
    }

    pub(crate) async fn agent_tool_chunks(
        &self,
        run_id: &str,
        after: Option<i64>,
    ) -> Result<Vec<AgentToolChunk>, Error> {
        let record = match self.registry().get(run_id) {
            Ok(Some(record)) => record,
            Ok(None) => return Ok(Vec::new()),
            Err(e) => return Err(Error::Storage(self.read_failed("agent_tool_chunks", e))),
        };
        if record.event_delivery == EventDelivery::Terminal {
            return self.child_chunks(&record, after.unwrap_or(-1)).await.map_err(|e| {
                Error::Unavailable(Unavailable::unreachable(format!(
                    "reading the chunks of {run_id} from its child failed: {e}"
                )))
            });
        }
        let frames = self.registry().frames(run_id, after.unwrap_or(-1));
        let frames = frames.map_err(|e| Error::Storage(self.read_failed("agent_tool_chunks", e)))?;
        Ok(frames.into_iter().map(|(sequence, body)| AgentToolChunk { sequence, body }).collect())
    }

    /// A run's chunks after log index `after`, read from its child: the log's size first (a
    /// live run's tail would wait for more), then its tail up to there.
    async fn child_chunks(&self, record: &RunRecord, after: i64) -> Result<Vec<AgentToolChunk>, String> {
        let to = crate::parent::engine::child_address(self.0.class, &self.own_name()?, record);
        let run_id = record.run_id.clone();
        let count = match self.0.io.call_child(&to, ChildCall::Inspect { run_id: run_id.clone() }).await? {
            ChildReply::Inspection(Some(reply)) => reply.chunk_count.unwrap_or(0),
            ChildReply::Inspection(None) => return Ok(Vec::new()),
            _ => return Err("the child did not answer the inspection".into()),
        };
        let mut out = Vec::new();
        if count - 1 <= after {
            return Ok(out);
        }
        let ChildReply::Tail(mut body) = self.0.io.call_child(&to, ChildCall::Tail { run_id, after }).await? else {
            return Err("the child did not answer the tail".into());
        };
        let mut lines = LineSplitter::default();
        while let Some(bytes) = body.next().await {
            for line in lines.push(&bytes?).map_err(|e| e.to_string())? {
                match line? {
                    TailLine::Chunk { i: Some(i), b, r, .. } => {
                        out.push(AgentToolChunk { sequence: i, body: r.unwrap_or(b) });
                        if i >= count - 1 {
                            return Ok(out);
                        }
                    }
                    TailLine::Chunk { .. } => {}
                    TailLine::End { .. } => return Ok(out),
                }
            }
        }
        Ok(out)
    }
}
