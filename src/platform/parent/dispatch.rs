//! Dispatch: admit the run, start the child, tail it to its outcome, conclude; cancel; clear;
//! and the read-only views of the registry.

use futures::channel::oneshot;
use futures::future::{select, Either};
use serde::Serialize;
use serde_json::Value;
use wasm_bindgen::JsValue;
use worker::{Method, Request, RequestInit, Response, Stub};

use crate::agent::{Admission, Agent, AgentClass};
use crate::parent::agent_tool::ChildRef;
use crate::parent::registry::{Inserted, NewRun, RegistryError, RunRecord, Terminal};
use crate::platform::host::{missing_binding, Inflight};
use crate::platform::{now_ms, random_id, AgentHost};
use crate::protocol::child_api::{self, CancelRequest, StartRequest};
use crate::run::{
    validate_run_id, AgentToolChunk, ClearFilter, EventDelivery, Milestone, ProgressSnapshot, RunInfo, RunInspection,
    RunOptions, RunResult, RunStatus,
};

/// How a dispatch is admitted.
pub(crate) enum Admit {
    /// This caller drives the run (`fresh`: its row was just created).
    Drive { record: RunRecord, fresh: bool },
    /// Another dispatch of this instance drives it: wait for its result.
    Join(oneshot::Receiver<RunResult>),
    /// The run already ended.
    Finished(RunRecord),
    /// The cap is reached.
    Full(usize),
}

/// Removes a run's in-flight entry when its driver ends, however it ends: a dropped driver
/// (its chat turn was cancelled, say) still releases the callers joined to it.
pub(crate) struct InflightGuard<'a, A: Agent> {
    host: &'a AgentHost<A>,
    record: RunRecord,
    armed: bool,
}

impl<'a, A: Agent> InflightGuard<'a, A> {
    /// Guards the in-flight entry of `record`'s run (already registered).
    pub(crate) fn new(host: &'a AgentHost<A>, record: &RunRecord) -> Self {
        Self { host, record: record.clone(), armed: true }
    }

    /// The driver ended with `result`: release the entry and hand the result to the joined.
    pub(crate) fn finish(mut self, result: &RunResult) {
        self.armed = false;
        self.release(result);
    }

    /// The entry passes to another driver, which guards it from now on.
    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }

    fn release(&self, result: &RunResult) {
        let entry = self.host.0.inflight.borrow_mut().remove(&self.record.run_id);
        for tx in entry.map(|e| e.waiters).unwrap_or_default() {
            let _ = tx.send(result.clone());
        }
    }
}

impl<A: Agent> Drop for InflightGuard<'_, A> {
    fn drop(&mut self) {
        if self.armed {
            self.release(&self.host.current_result(&self.record));
        }
    }
}

impl<A: Agent> AgentHost<A> {
    /// Dispatches a run of child agent `C` and waits for its outcome (the TypeScript SDK's
    /// awaited `runAgentTool`). Fan out by joining several of these futures.
    ///
    /// Idempotent by run id: a known id returns its recorded result, joins the dispatch already
    /// under way, or re-attaches to its child; it never starts a second child. A run id of
    /// another class is refused. Over [`crate::AgentToolOptions::max_concurrent`], the dispatch
    /// is refused (writing nothing) or queued, as [`Admission`] says. Cancelling
    /// [`RunOptions::signal`] cancels the run.
    pub async fn run_agent_tool<C: AgentClass>(&self, options: RunOptions) -> RunResult {
        self.dispatch_awaited(ChildRef::of::<C>(), options).await
    }

    pub(crate) async fn dispatch_awaited(&self, child: ChildRef, options: RunOptions) -> RunResult {
        let new = match self.prepare(child, &options) {
            Ok(new) => new,
            Err((run_id, problem)) => return RunResult::refused(run_id, child.class, problem),
        };
        let run_id = new.run_id.clone();
        let (record, fresh) = loop {
            match self.admit(&new) {
                Err(problem) => return RunResult::refused(run_id, child.class, problem),
                Ok(Admit::Finished(record)) => return RunResult::from_record(&record),
                Ok(Admit::Join(rx)) => {
                    return match rx.await {
                        Ok(result) => result,
                        Err(_) => self.current_result_of(&run_id, child.class),
                    }
                }
                Ok(Admit::Full(limit)) => {
                    if self.options().admission == Admission::Queue {
                        self.slot_freed().await;
                        continue;
                    }
                    let message = format!(
                        "maxConcurrentAgentTools ({limit}) reached: {limit} runs are starting or running; \
                         retry when one finishes"
                    );
                    return RunResult::refused(run_id, child.class, message);
                }
                Ok(Admit::Drive { record, fresh }) => break (record, fresh),
            }
        };
        let guard = InflightGuard::new(self, &record);
        if fresh {
            self.broadcast(&record.started_frame().to_json());
            self.arm_alarm_in(self.options().recovery_alarm_ms).await;
            self.0.agent.on_agent_tool_start(self, &RunInfo::from_record(&record)).await;
        }
        let result = {
            let drive = self.drive(&record, &options.input, fresh);
            let signal = options.signal.clone().unwrap_or_default();
            let stop = signal.cancelled();
            futures::pin_mut!(drive, stop);
            match select(drive, stop).await {
                Either::Left((result, _)) => result,
                Either::Right((_, drive)) => {
                    let reason = signal.reason().unwrap_or_else(|| "cancelled by the caller".into());
                    self.cancel_agent_tool(&run_id, Some(reason)).await;
                    drive.await
                }
            }
        };
        guard.finish(&result);
        result
    }

    /// Checks a dispatch's run id and child binding, and describes its row; a refusal is the
    /// run id and why.
    pub(crate) fn prepare(&self, child: ChildRef, options: &RunOptions) -> Result<NewRun, (String, String)> {
        let run_id = options.run_id.clone().unwrap_or_else(random_id);
        if let Err(problem) = validate_run_id(&run_id) {
            return Err((run_id, problem));
        }
        if self.0.env.durable_object(child.binding).is_err() {
            return Err((run_id, missing_binding(A::CLASS, child.class, child.binding)));
        }
        Ok(NewRun {
            run_id,
            parent_tool_call_id: options.parent_tool_call_id.clone(),
            agent_type: child.class.to_owned(),
            binding: child.binding.to_owned(),
            input_preview: options
                .input_preview
                .clone()
                .or_else(|| crate::parent::registry::input_preview(&options.input)),
            display: options.display.clone(),
            display_order: options.display_order.unwrap_or(0),
            event_delivery: options.event_delivery,
        })
    }

    /// Looks the run up, checks the concurrency cap, inserts the row and registers the driver,
    /// all in one synchronous step: two dispatches can never both take the last slot, nor both
    /// drive one run.
    pub(crate) fn admit(&self, new: &NewRun) -> Result<Admit, String> {
        let registry = self.registry();
        let existing = registry.get(&new.run_id).map_err(|e| e.to_string())?;
        let (record, fresh) = match existing {
            Some(existing) => {
                if existing.agent_type != new.agent_type {
                    return Err(RegistryError::AgentTypeMismatch {
                        run_id: new.run_id.clone(),
                        existing: existing.agent_type,
                        requested: new.agent_type.clone(),
                    }
                    .to_string());
                }
                if existing.status.is_hard_terminal() {
                    return Ok(Admit::Finished(existing));
                }
                if let Some(entry) = self.0.inflight.borrow_mut().get_mut(&new.run_id) {
                    let (tx, rx) = oneshot::channel();
                    entry.waiters.push(tx);
                    return Ok(Admit::Join(rx));
                }
                (existing, false)
            }
            None => {
                if let Some(limit) = self.options().max_concurrent {
                    if registry.live_count().map_err(|e| e.to_string())? >= limit as i64 {
                        return Ok(Admit::Full(limit));
                    }
                }
                match registry.insert(new, now_ms()).map_err(|e| e.to_string())? {
                    Inserted::New(record) => (record, true),
                    Inserted::Existing(record) => (record, false),
                }
            }
        };
        self.0.inflight.borrow_mut().insert(new.run_id.clone(), Inflight::default());
        Ok(Admit::Drive { record, fresh })
    }

    /// Resolves when a run concludes (a slot may be free).
    async fn slot_freed(&self) {
        let (tx, rx) = oneshot::channel();
        self.0.slot_waiters.borrow_mut().push(tx);
        let _ = rx.await;
    }

    /// The stub of a known run's child.
    pub(crate) fn run_stub(&self, run: &RunRecord) -> Result<Stub, String> {
        let parent_name = self.name().ok_or("this agent does not know its own name yet")?;
        let binding = if run.binding.is_empty() { run.agent_type.as_str() } else { run.binding.as_str() };
        let namespace =
            self.0.env.durable_object(binding).map_err(|_| missing_binding(A::CLASS, &run.agent_type, binding))?;
        let id = namespace.id_from_name(&child_name::<A>(&parent_name, &run.run_id)).map_err(|e| e.to_string())?;
        id.get_stub().map_err(|e| e.to_string())
    }

    pub(crate) fn cancel_token(&self, run_id: &str) -> crate::cancel::CancelToken {
        self.0.inflight.borrow().get(run_id).map(|e| e.cancel.clone()).unwrap_or_default()
    }

    pub(crate) async fn drive(&self, record: &RunRecord, input: &Value, fresh: bool) -> RunResult {
        let stub = match self.run_stub(record) {
            Ok(stub) => stub,
            Err(e) => {
                let message = format!("could not reach {}: {e}", record.agent_type);
                return self.conclude(record, Terminal::Error { message }).await;
            }
        };
        let parent_name = self.name().unwrap_or_default();
        let start = StartRequest {
            run_id: record.run_id.clone(),
            input: input.clone(),
            parent_class: A::CLASS.to_owned(),
            child_name: child_name::<A>(&parent_name, &record.run_id),
            parent_name,
            terminal_only: record.event_delivery == EventDelivery::Terminal,
        };
        match send_json(&stub, Method::Post, &format!("{}/start", child_api::BASE), &start).await {
            Ok(mut resp) if resp.status_code() != 200 => {
                let body = resp.text().await.unwrap_or_default();
                let message =
                    format!("{} refused to start the run ({}): {body}", record.agent_type, resp.status_code());
                return self.conclude(record, Terminal::Error { message }).await;
            }
            Ok(_) => {}
            Err(e) => {
                let message = format!("could not start {}: {e}", record.agent_type);
                return self.conclude(record, Terminal::Error { message }).await;
            }
        }
        // A cancel that landed while the child was being started: make sure the child stops.
        if let Ok(Some(now)) = self.registry().get(&record.run_id) {
            if now.status.is_hard_terminal() {
                self.tell_child_to_cancel(&stub, &record.run_id, now.error_message.clone()).await;
                return RunResult::from_record(&now);
            }
        }
        let registry = self.registry();
        let _ = registry.mark_running(&record.run_id).and_then(|_| registry.reattach(&record.run_id));
        self.follow(record, &stub, !fresh).await
    }

    pub(crate) async fn tell_child_to_cancel(&self, stub: &Stub, run_id: &str, reason: Option<String>) {
        let cancel = CancelRequest { run_id: run_id.to_owned(), reason };
        let url = format!("{}/cancel", child_api::BASE);
        if let Err(e) = send_json(stub, Method::Post, &url, &cancel).await {
            worker::console_error!("agent-tools: cancelling {run_id} at the child failed: {e}");
        }
    }

    /// Cancels a run: the child stops its turn, the run ends `aborted`, and a caller waiting on
    /// it gets the result at once. Idempotent: an unknown or finished run is left as it is.
    pub async fn cancel_agent_tool(&self, run_id: &str, reason: Option<String>) {
        let Ok(Some(record)) = self.registry().get(run_id) else { return };
        if record.status.is_hard_terminal() {
            return;
        }
        if let Ok(stub) = self.run_stub(&record) {
            self.tell_child_to_cancel(&stub, run_id, reason.clone()).await;
        }
        self.conclude(&record, Terminal::Aborted { reason }).await;
        if let Some(entry) = self.0.inflight.borrow().get(run_id) {
            entry.cancel.cancel(None);
        }
    }

    /// Removes retained runs: cancels the live ones, deletes each child's storage and this
    /// agent's rows and frames. Cleared runs never replay again. Returns the cleared run ids.
    pub async fn clear_agent_tool_runs(&self, filter: &ClearFilter) -> Result<Vec<String>, String> {
        let runs = self.registry().matching(filter.status.as_deref(), filter.older_than).map_err(|e| e.to_string())?;
        let mut cleared = Vec::new();
        for run in runs {
            if !run.status.is_hard_terminal() {
                self.cancel_agent_tool(&run.run_id, Some("cleared".into())).await;
            }
            if let Ok(stub) = self.run_stub(&run) {
                let url = format!("{}/clear", child_api::BASE);
                let request = CancelRequest { run_id: run.run_id.clone(), reason: None };
                if let Err(e) = send_json(&stub, Method::Post, &url, &request).await {
                    worker::console_error!("agent-tools: clearing {} at the child failed: {e}", run.run_id);
                }
            }
            self.registry().delete(std::slice::from_ref(&run.run_id)).map_err(|e| e.to_string())?;
            cleared.push(run.run_id);
        }
        Ok(cleared)
    }

    /// Records the terminal result (unless the row is already final), broadcasts its frame,
    /// frees its slot and delivers it: `on_agent_tool_finish` once per run for an awaited run,
    /// the ledger for a detached one.
    pub(crate) async fn conclude(&self, record: &RunRecord, terminal: Terminal) -> RunResult {
        let now = now_ms();
        match self.registry().finish(&record.run_id, &terminal, now) {
            Ok(Some(done)) => {
                if let Some(frame) = done.terminal_frame() {
                    self.broadcast(&frame.to_json());
                }
                for waiter in self.0.slot_waiters.borrow_mut().drain(..) {
                    let _ = waiter.send(());
                }
                let result = RunResult::from_record(&done);
                if done.detached.is_some() {
                    // Delivered through the ledger (handler, notify, the global hook), at once
                    // here and again by the backbone if this attempt fails.
                    let host = self.clone();
                    let run_id = done.run_id.clone();
                    self.0.state.wait_until(async move { host.deliver(&run_id).await });
                } else if self.registry().claim_finish_hook(&done.run_id, now).unwrap_or(false) {
                    self.0.agent.on_agent_tool_finish(self, &RunInfo::from_record(&done), &result).await;
                }
                result
            }
            Ok(None) => self.current_result(record),
            Err(e) => {
                worker::console_error!("agent-tools: recording the end of {} failed: {e}", record.run_id);
                RunResult {
                    status: terminal.status(),
                    ..RunResult::refused(&record.run_id, &record.agent_type, e.to_string())
                }
            }
        }
    }

    /// The run's recorded result; a run whose row is gone was cleared.
    pub(crate) fn current_result(&self, record: &RunRecord) -> RunResult {
        self.current_result_of(&record.run_id, &record.agent_type)
    }

    fn current_result_of(&self, run_id: &str, agent_type: &str) -> RunResult {
        match self.registry().get(run_id) {
            Ok(Some(now)) => RunResult::from_record(&now),
            _ => RunResult {
                status: RunStatus::Aborted,
                ..RunResult::refused(run_id, agent_type, "the run was cleared")
            },
        }
    }

    // ----- read-only views --------------------------------------------------------------

    /// Whether `run_id` is a known run of child agent `C` (the default drill-in gate's test).
    pub fn has_agent_tool_run<C: AgentClass>(&self, run_id: &str) -> bool {
        self.has_agent_tool_run_of(C::CLASS, run_id)
    }

    /// Whether `run_id` is a known run of the class named `agent_type`.
    pub fn has_agent_tool_run_of(&self, agent_type: &str, run_id: &str) -> bool {
        self.registry().has_run(agent_type, run_id).unwrap_or(false)
    }

    /// Every retained run, oldest first.
    pub fn agent_tool_runs(&self) -> Vec<RunInfo> {
        self.registry().all().unwrap_or_default().iter().map(RunInfo::from_record).collect()
    }

    /// One run with its result, latest progress and milestones; `None` when the run is
    /// unknown here (never dispatched, or cleared). `None` never means "failed".
    pub fn inspect_agent_tool_run(&self, run_id: &str) -> Option<RunInspection> {
        let record = self.registry().get(run_id).ok().flatten()?;
        let result = (!record.status.is_live()).then(|| RunResult::from_record(&record));
        let progress = record.progress.as_ref().and_then(|(_, body)| {
            let data = serde_json::from_str::<Value>(body).ok()?.get("data").cloned()?;
            serde_json::from_value::<ProgressSnapshot>(with_at(data, record.last_signal_at.unwrap_or(0))).ok()
        });
        let milestones = self
            .registry()
            .milestones(run_id)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(_, body)| {
                let data = serde_json::from_str::<Value>(&body).ok()?.get("data").cloned()?;
                serde_json::from_value::<Milestone>(data).ok()
            })
            .collect();
        Some(RunInspection { info: RunInfo::from_record(&record), result, progress, milestones })
    }

    /// The run's stored chunks (its `UIMessageChunk`s and milestones) with the frame sequences
    /// they were sent with, after `after_sequence` (all with `None`). Empty for an unknown run.
    pub fn get_agent_tool_chunks(&self, run_id: &str, after_sequence: Option<i64>) -> Vec<AgentToolChunk> {
        self.registry()
            .frames(run_id, after_sequence.unwrap_or(-1))
            .unwrap_or_default()
            .into_iter()
            .map(|(sequence, body)| AgentToolChunk { sequence, body })
            .collect()
    }
}

/// `data` with an `at` field (0) when it has none, so a snapshot parses.
fn with_at(mut data: Value, at: i64) -> Value {
    if let Value::Object(o) = &mut data {
        o.entry("at").or_insert(Value::from(at));
    }
    data
}

/// A child's Durable Object name: scoped by its parent, so two parents never share a child.
pub(crate) fn child_name<A: AgentClass>(parent_name: &str, run_id: &str) -> String {
    format!("{}/{parent_name}/{run_id}", A::CLASS)
}

pub(crate) async fn send_json<T: Serialize>(
    stub: &Stub,
    method: Method,
    url: &str,
    body: &T,
) -> worker::Result<Response> {
    let mut init = RequestInit::new();
    init.with_method(method.clone());
    if method != Method::Get {
        init.with_body(Some(JsValue::from_str(&serde_json::to_string(body)?)));
    }
    stub.fetch_with_request(Request::new_with_init(url, &init)?).await
}
