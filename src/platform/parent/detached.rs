//! Detached runs on the platform: dispatch without waiting, deliver completion through the
//! ledger (at once on the fast path, again from the backbone), give up on budgets, and surface
//! milestones and completions in the chat.

use serde_json::{json, Value};

use super::dispatch::{Admit, InflightGuard};
use crate::agent::{Agent, AgentClass};
use crate::chat::store::Messages;
use crate::observability::EventType;
use crate::parent::agent_tool::ChildRef;
use crate::parent::detached::{
    budget_exceeded, finish_due, give_up_due, Claim, FinishDue, Slot, DEFAULT_NOTIFY_SOURCE, LIVE_WARNING, MAX_ATTEMPTS,
};
use crate::parent::registry::{RunRecord, Terminal};
use crate::platform::{now_ms, AgentHost};
use crate::protocol::InterruptedReason;
use crate::run::{
    DetachedHandle, DetachedOptions, EventDelivery, Milestone, MilestoneMode, OnMilestones, RunInfo, RunOptions,
    RunResult, RunStatus,
};

impl<A: Agent> AgentHost<A> {
    /// Dispatches a run of child agent `C` and returns at once (the TypeScript SDK's
    /// `runAgentTool` with `detached`); the run goes on in the background and its outcome is
    /// delivered durably (see [`DetachedOptions`]). No caller's signal reaches it: cancel it with
    /// [`AgentHost::cancel_agent_tool`]. A known run id returns its state and never starts a
    /// second child.
    ///
    /// ```
    /// use agent_tools::prelude::*;
    /// use agent_tools::{MilestoneMode, OnMilestones, RunInfo};
    /// use serde_json::{json, Value};
    ///
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// enum Handler {
    ///     ImportDone,
    /// }
    ///
    /// async fn start_import(host: &AgentHost<Assistant>, input: Value) -> String {
    ///     let detached = DetachedOptions {
    ///         on_finish: Some(json!(Handler::ImportDone)), // delivered to on_detached_finish, durably
    ///         max_budget_ms: Some(60 * 60 * 1000),
    ///         on_milestones: Some(OnMilestones { names: vec!["sources-gathered".into()], mode: MilestoneMode::Narrate }),
    ///         ..DetachedOptions::default()
    ///     };
    ///     let handle = host.run_agent_tool_detached::<Researcher>(RunOptions::new(input), detached).await;
    ///     handle.run_id // at once; the handle's status is "running", or "error" if the dispatch was refused
    /// }
    ///
    /// impl Agent for Assistant {
    ///     async fn on_detached_finish(
    ///         &self,
    ///         _host: &AgentHost<Self>,
    ///         handler: &Value,
    ///         run: &RunInfo,
    ///         result: &RunResult,
    ///     ) -> Result<(), String> {
    ///         match serde_json::from_value(handler.clone()) {
    ///             Ok(Handler::ImportDone) => Ok(println!("{} ended {:?}", run.run_id, result.status)),
    ///             Err(e) => Err(format!("unknown handler {handler}: {e}")), // retried, then dead-lettered
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
    ) -> DetachedHandle {
        self.dispatch_detached(ChildRef::of::<C>(), options, detached).await
    }

    pub(crate) async fn dispatch_detached(
        &self,
        child: ChildRef,
        options: RunOptions,
        mut detached: DetachedOptions,
    ) -> DetachedHandle {
        let refused = |run_id: String, error: String| DetachedHandle {
            run_id,
            agent_type: child.class.to_owned(),
            status: RunStatus::Error,
            error: Some(error),
        };
        if options.event_delivery == EventDelivery::Terminal {
            let run_id = options.run_id.clone().unwrap_or_default();
            return refused(run_id, "event_delivery \"terminal\" is not supported for detached runs".into());
        }
        let new = match self.prepare(child, &options) {
            Ok(new) => new,
            Err((run_id, problem)) => return refused(run_id, problem),
        };
        detached.max_budget_ms.get_or_insert(self.options().detached_max_budget_ms);
        detached.no_progress_budget_ms.get_or_insert(self.options().detached_no_progress_budget_ms);
        let running = |record: &RunRecord| DetachedHandle {
            run_id: record.run_id.clone(),
            agent_type: record.agent_type.clone(),
            status: if record.status.is_live() { RunStatus::Running } else { record.status },
            error: None,
        };
        let record = match self.admit(&new) {
            Err(problem) => return refused(new.run_id, problem),
            Ok(Admit::Full(limit)) => {
                let message = format!("maxConcurrentAgentTools ({limit}) reached; retry when a run finishes");
                return refused(new.run_id, message);
            }
            Ok(Admit::Finished(record)) => return running(&record),
            Ok(Admit::Join(_)) => {
                let record = self.registry().get(&new.run_id).ok().flatten();
                return record
                    .map_or_else(|| refused(new.run_id.clone(), "the run was cleared".into()), |r| running(&r));
            }
            Ok(Admit::Drive { record, fresh: false }) => {
                // Known here but nobody drives it (a restart): follow it again in the background.
                self.spawn_driver(record.clone(), options.input, false);
                return running(&record);
            }
            Ok(Admit::Drive { record, fresh: true }) => {
                // Still the synchronous step of the insert: a crash cannot leave it unconfigured.
                if let Err(e) = self.ledger().configure(&record.run_id, &detached, now_ms()) {
                    worker::console_error!("agent-tools: configuring detached run {} failed: {e}", record.run_id);
                }
                record
            }
        };
        let record = self.registry().get(&record.run_id).ok().flatten().unwrap_or(record);
        self.broadcast(&record.started_frame().to_json());
        self.0.backbone_quiet_ticks.set(0);
        self.spawn_driver(record.clone(), options.input, true);
        running(&record)
    }

    /// Drives a run in the background (the run's in-flight entry is already registered; the
    /// task, spawned synchronously here, guards it from then on). A fresh run first arms the
    /// backbone and calls `on_agent_tool_start`.
    fn spawn_driver(&self, record: RunRecord, input: Value, fresh: bool) {
        let host = self.clone();
        self.0.state.wait_until(async move {
            let guard = InflightGuard::new(&host, &record);
            if fresh {
                host.arm_alarm_in(host.cadence_ms()).await;
                let live = host.ledger().live_count().unwrap_or(0);
                if live >= LIVE_WARNING {
                    host.observe(EventType::DetachedLiveCountWarning, json!({ "live": live }));
                }
                host.0.agent.on_agent_tool_start(&host, &RunInfo::from_record(&record)).await;
            }
            let result = host.drive(&record, &input, fresh).await;
            guard.finish(&result);
        });
    }

    /// Delivers whatever a detached run's ledger has due: its outcome (`finish`) or a give-up.
    /// Safe to call any number of times: each slot is claimed under a lease.
    pub(crate) async fn deliver(&self, run_id: &str) {
        let Ok(Some(run)) = self.registry().get(run_id) else { return };
        let now = now_ms();
        match finish_due(&run) {
            FinishDue::No => {}
            FinishDue::Suppress => {
                let _ = self.ledger().delivered(run_id, Slot::Finish, now);
            }
            FinishDue::Deliver => self.deliver_slot(&run, Slot::Finish).await,
        }
        if give_up_due(&run) {
            self.deliver_slot(&run, Slot::GiveUp).await;
        }
    }

    async fn deliver_slot(&self, run: &RunRecord, slot: Slot) {
        let Ok(Claim::Claimed(attempt)) = self.ledger().claim(&run.run_id, slot, now_ms()) else { return };
        let result = RunResult::from_record(run);
        match self.deliver_outcome(run, &result).await {
            Ok(()) => {
                let _ = self.ledger().delivered(&run.run_id, slot, now_ms());
            }
            Err(error) => {
                let _ = self.ledger().failed(&run.run_id, slot);
                let dead = attempt >= MAX_ATTEMPTS;
                let payload = json!({ "runId": run.run_id, "slot": if slot == Slot::Finish { "finish" } else { "give_up" },
                                      "attempt": attempt, "deadLetter": dead, "error": error });
                self.observe(EventType::DetachedDeliveryFailed, payload);
            }
        }
    }

    /// One delivery: the global hook (once per run, however many attempts the handler takes),
    /// then the run's handler, or the chat notification.
    async fn deliver_outcome(&self, run: &RunRecord, result: &RunResult) -> Result<(), String> {
        let info = RunInfo::from_record(run);
        if self.registry().claim_finish_hook(&run.run_id, now_ms()).unwrap_or(false) {
            self.0.agent.on_agent_tool_finish(self, &info, result).await;
        }
        let Some(detached) = &run.detached else { return Ok(()) };
        if let Some(handler) = &detached.on_finish {
            return self.0.agent.on_detached_finish(self, handler, &info, result).await;
        }
        if detached.notify {
            let source = detached.notify_source.as_deref().unwrap_or(DEFAULT_NOTIFY_SOURCE);
            let text = self.0.agent.format_detached_completion(&info, result);
            if !text.is_empty() {
                let id = format!("detached-finish:{}:{}", run.run_id, result.status.as_str());
                let metadata = json!({ "source": source, "runId": run.run_id, "agentType": run.agent_type,
                                       "status": result.status });
                if self.inject(&id, "user", &text, metadata)? {
                    self.run_chat_turn(id, None).await;
                }
            }
        }
        Ok(())
    }

    /// Adds a synthetic message to the chat once (by id). `false` when it was already there.
    fn inject(&self, id: &str, role: &str, text: &str, metadata: Value) -> Result<bool, String> {
        let messages = self.messages();
        if messages.iter().any(|m| m.get("id").and_then(Value::as_str) == Some(id)) {
            return Ok(false);
        }
        let message =
            json!({ "id": id, "role": role, "parts": [{ "type": "text", "text": text }], "metadata": metadata });
        Messages::new(&self.0.sql).upsert(&message, now_ms()).map_err(|e| e.to_string())?;
        let transcript = json!({ "type": "cf_agent_chat_messages", "messages": self.messages() });
        self.broadcast(&transcript.to_string());
        Ok(true)
    }

    /// A milestone of a detached run arrived: surface it in the chat if the run asked for it,
    /// at most once per `(run, name)`. A `react` turn runs in the background: the run's tail
    /// is never held up by a model turn (nor by the turn it may queue behind).
    pub(crate) fn milestone_reached(&self, run: &RunRecord, milestone: &Value) {
        let Some(name) = milestone.get("name").and_then(Value::as_str) else { return };
        let run_id = &run.run_id;
        let Some(wanted) = run.detached.as_ref().and_then(|d| d.on_milestones.clone()) else { return };
        let Ok(wanted) = serde_json::from_value::<OnMilestones>(wanted) else { return };
        if !wanted.names.iter().any(|n| n == name)
            || !self.ledger().claim_milestone(run_id, name, now_ms()).unwrap_or(false)
        {
            return;
        }
        let Ok(typed) = serde_json::from_value::<Milestone>(milestone.clone()) else { return };
        let text = self.0.agent.format_detached_milestone(&RunInfo::from_record(run), &typed);
        if text.is_empty() {
            return;
        }
        let source =
            run.detached.as_ref().and_then(|d| d.notify_source.clone()).unwrap_or_else(|| DEFAULT_NOTIFY_SOURCE.into());
        let id = format!("detached-ms:{run_id}:{name}");
        let metadata = json!({ "source": source, "runId": run_id, "agentType": run.agent_type, "milestone": name });
        let (role, react) = match wanted.mode {
            MilestoneMode::Narrate => ("assistant", false),
            MilestoneMode::React => ("user", true),
        };
        match self.inject(&id, role, &text, metadata) {
            Ok(true) if react => {
                let host = self.clone();
                self.0.state.wait_until(async move { host.run_chat_turn(id, None).await });
            }
            Ok(_) => {}
            Err(e) => worker::console_error!("agent-tools: milestone notification for {run_id} failed: {e}"),
        }
    }

    /// The backbone's tick: recover undriven runs, deliver what is due, give up on exhausted
    /// budgets. Returns whether anything changed (the cadence starts over when it did).
    pub(crate) async fn backbone_tick(&self) -> bool {
        let mut changed = false;
        for run_id in self.ledger().outstanding().unwrap_or_default() {
            let Ok(Some(run)) = self.registry().get(&run_id) else { continue };
            if let Some(reason) = budget_exceeded(&run, now_ms()) {
                self.give_up(&run, reason).await;
                changed = true;
            }
            let before = self.registry().get(&run_id).ok().flatten();
            self.deliver(&run_id).await;
            changed |= before != self.registry().get(&run_id).ok().flatten();
        }
        changed
    }

    /// Gives up on a detached run: delivers `interrupted` with `reason`, tears the child down,
    /// and, if the child had finished anyway, records and delivers its real result. The
    /// `aborted` the teardown causes is never delivered.
    async fn give_up(&self, run: &RunRecord, reason: InterruptedReason) {
        if let Some(entry) = self.0.inflight.borrow().get(&run.run_id) {
            entry.cancel.cancel(None);
        }
        let error = match reason {
            InterruptedReason::BudgetExceeded => "the detached run used up its budget",
            _ => "the detached run made no progress within its budget",
        };
        let terminal =
            Terminal::Interrupted { error: error.into(), reason: Some(reason), child_still_running: Some(false) };
        self.conclude(run, terminal).await;
        let Ok(stub) = self.run_stub(run) else { return };
        self.tell_child_to_cancel(&stub, &run.run_id, Some(format!("given up: {}", reason.as_str()))).await;
        if let Ok(Some(inspection)) = self.inspect(&stub, &run.run_id).await {
            if let Some(outcome) =
                inspection.outcome().filter(|o| o.status == crate::protocol::tail::OutcomeStatus::Completed)
            {
                self.conclude(run, super::follow::terminal_from(outcome)).await;
            }
        }
    }

    /// The backbone's next delay.
    pub(crate) fn cadence_ms(&self) -> u64 {
        crate::parent::detached::cadence_ms(self.0.backbone_quiet_ticks.get(), &self.options().backbone_cadence_ms)
    }
}
