//! Dispatch: admit the run, start the child, tail it to its outcome, conclude; cancel; clear.

use futures::channel::oneshot;
use serde::Serialize;
use serde_json::Value;
use wasm_bindgen::JsValue;
use worker::{Method, Request, RequestInit, Response, Stub};

use super::{ChildClass, Inflight, ParentAgent, ParentHost};
use crate::cancel::CancelToken;
use crate::parent::registry::RegistryError;
use crate::parent::{
    validate_run_id, Admission, ClearFilter, EventDelivery, Inserted, NewRun, RunOptions, RunRecord, RunResult,
    RunStatus, Terminal,
};
use crate::platform::{now_ms, random_id};
use crate::protocol::child_api::{self, CancelRequest, StartRequest};

/// How a dispatch is admitted.
pub(super) enum Admit {
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
pub(super) struct InflightGuard<'a, A: ParentAgent> {
    host: &'a ParentHost<A>,
    record: RunRecord,
    armed: bool,
}

impl<'a, A: ParentAgent> InflightGuard<'a, A> {
    /// Guards the in-flight entry of `record`'s run (already registered).
    pub(super) fn new(host: &'a ParentHost<A>, record: &RunRecord) -> Self {
        Self { host, record: record.clone(), armed: true }
    }

    /// The driver ended with `result`: release the entry and hand the result to the joined.
    pub(super) fn finish(mut self, result: &RunResult) {
        self.armed = false;
        self.release(result);
    }

    /// The entry passes to another driver, which guards it from now on.
    pub(super) fn disarm(mut self) {
        self.armed = false;
    }

    fn release(&self, result: &RunResult) {
        let entry = self.host.0.inflight.borrow_mut().remove(&self.record.run_id);
        for tx in entry.map(|e| e.waiters).unwrap_or_default() {
            let _ = tx.send(result.clone());
        }
    }
}

impl<A: ParentAgent> Drop for InflightGuard<'_, A> {
    fn drop(&mut self) {
        if self.armed {
            self.release(&self.host.current_result(&self.record));
        }
    }
}

impl<A: ParentAgent> ParentHost<A> {
    /// Dispatches a child run and waits for its outcome. Idempotent by run id: a known id
    /// returns its recorded result, joins the dispatch already under way, or re-attaches to its
    /// child; it never starts a second child. Over `max_concurrent_agent_tools`, the dispatch is
    /// refused (writing nothing) or queued, as [`ParentAgent::admission`] says.
    pub async fn run_agent_tool(&self, child: &str, options: RunOptions) -> RunResult {
        let (class, new) = match self.prepare(child, &options) {
            Ok(prepared) => prepared,
            Err(refused) => return refused,
        };
        let run_id = new.run_id.clone();
        let (record, fresh) = loop {
            match self.admit(&new) {
                Err(problem) => return RunResult::refused(run_id, child, problem),
                Ok(Admit::Finished(record)) => return RunResult::from_record(&record),
                Ok(Admit::Join(rx)) => {
                    return match rx.await {
                        Ok(result) => result,
                        Err(_) => self.current_result_of(&run_id, child),
                    }
                }
                Ok(Admit::Full(limit)) => {
                    if self.0.agent.admission(&self.0.env) == Admission::Queue {
                        self.slot_freed().await;
                        continue;
                    }
                    let message = format!(
                        "maxConcurrentAgentTools ({limit}) reached: {limit} runs are starting or running; \
                         retry when one finishes"
                    );
                    return RunResult::refused(run_id, child, message);
                }
                Ok(Admit::Drive { record, fresh }) => break (record, fresh),
            }
        };
        let guard = InflightGuard::new(self, &record);
        if fresh {
            self.broadcast_frame(&record.started_frame());
            self.arm_alarm_in(self.0.agent.recovery_alarm_ms(&self.0.env)).await;
            self.0.agent.on_agent_tool_start(self, &record).await;
        }
        let result = self.drive(&record, class, &options.input, fresh).await;
        guard.finish(&result);
        result
    }

    /// Checks a dispatch's run id and child class, and describes its row.
    pub(super) fn prepare(&self, child: &str, options: &RunOptions) -> Result<(ChildClass, NewRun), RunResult> {
        let run_id = options.run_id.clone().unwrap_or_else(random_id);
        if let Err(problem) = validate_run_id(&run_id) {
            return Err(RunResult::refused(run_id, child, problem));
        }
        let Some(class) = Self::child_class(child) else {
            let known: Vec<&str> = A::CHILDREN.iter().map(|c| c.class).collect();
            let problem = format!("unknown agent type {child:?}; {} dispatches {known:?}", A::CLASS);
            return Err(RunResult::refused(run_id, child, problem));
        };
        let new = NewRun {
            run_id,
            parent_tool_call_id: options.parent_tool_call_id.clone(),
            agent_type: class.class.to_owned(),
            input_preview: options
                .input_preview
                .clone()
                .or_else(|| crate::parent::registry::input_preview(&options.input)),
            display: options.display.clone(),
            display_order: options.display_order.unwrap_or(0),
            event_delivery: options.event_delivery,
        };
        Ok((class, new))
    }

    /// Looks the run up, checks the concurrency cap, inserts the row and registers the driver,
    /// all in one synchronous step: two dispatches can never both take the last slot, nor both
    /// drive one run.
    pub(super) fn admit(&self, new: &NewRun) -> Result<Admit, String> {
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
                if let Some(limit) = self.0.agent.max_concurrent_agent_tools(&self.0.env) {
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

    /// The child class dispatched as `agent_type`.
    pub(super) fn child_class(agent_type: &str) -> Option<ChildClass> {
        A::CHILDREN.iter().find(|c| c.class == agent_type).copied()
    }

    /// The stub of a known run's child; `None` when its class is no longer dispatched here.
    pub(super) fn run_stub(&self, run: &RunRecord) -> Option<Stub> {
        Self::child_class(&run.agent_type).and_then(|class| self.child_stub(class, &run.run_id).ok())
    }

    pub(super) fn child_stub(&self, class: ChildClass, run_id: &str) -> Result<Stub, String> {
        let parent_name = self.name().ok_or("this parent does not know its own name yet")?;
        let namespace = self.0.env.durable_object(class.binding).map_err(|e| e.to_string())?;
        let id =
            namespace.id_from_name(&format!("{}/{}/{}", A::CLASS, parent_name, run_id)).map_err(|e| e.to_string())?;
        id.get_stub().map_err(|e| e.to_string())
    }

    pub(super) fn cancel_token(&self, run_id: &str) -> CancelToken {
        self.0.inflight.borrow().get(run_id).map(|e| e.cancel.clone()).unwrap_or_default()
    }

    pub(super) async fn drive(&self, record: &RunRecord, class: ChildClass, input: &Value, fresh: bool) -> RunResult {
        let stub = match self.child_stub(class, &record.run_id) {
            Ok(stub) => stub,
            Err(e) => {
                let message = format!("could not reach {}: {e}", class.class);
                return self.conclude(record, Terminal::Error { message }).await;
            }
        };
        let start = StartRequest {
            run_id: record.run_id.clone(),
            input: input.clone(),
            parent_class: A::CLASS.to_owned(),
            parent_name: self.name().unwrap_or_default(),
            terminal_only: record.event_delivery == EventDelivery::Terminal,
        };
        match send_json(&stub, Method::Post, &format!("{}/start", child_api::BASE), &start).await {
            Ok(mut resp) if resp.status_code() != 200 => {
                let body = resp.text().await.unwrap_or_default();
                let message = format!("{} refused to start the run ({}): {body}", class.class, resp.status_code());
                return self.conclude(record, Terminal::Error { message }).await;
            }
            Ok(_) => {}
            Err(e) => {
                let message = format!("could not start {}: {e}", class.class);
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

    pub(super) async fn tell_child_to_cancel(&self, stub: &Stub, run_id: &str, reason: Option<String>) {
        let cancel = CancelRequest { run_id: run_id.to_owned(), reason };
        let url = format!("{}/cancel", child_api::BASE);
        if let Err(e) = send_json(stub, Method::Post, &url, &cancel).await {
            worker::console_error!("agent-tools: cancelling {run_id} at the child failed: {e}");
        }
    }

    /// Cancels a run: the child stops its turn, the run ends `aborted`, and a caller waiting on
    /// it here gets the result at once. Idempotent: an unknown or finished run is left as it is.
    pub async fn cancel_agent_tool(&self, run_id: &str, reason: Option<String>) {
        let Ok(Some(record)) = self.registry().get(run_id) else { return };
        if record.status.is_hard_terminal() {
            return;
        }
        if let Some(stub) = self.run_stub(&record) {
            self.tell_child_to_cancel(&stub, run_id, reason.clone()).await;
        }
        self.conclude(&record, Terminal::Aborted { reason }).await;
        if let Some(entry) = self.0.inflight.borrow().get(run_id) {
            entry.cancel.cancel(None);
        }
    }

    /// Removes retained runs: cancels the live ones, deletes each child's storage and the
    /// parent's rows and frames. Cleared runs never replay again. Returns the cleared run ids.
    pub async fn clear_agent_tool_runs(&self, filter: &ClearFilter) -> Result<Vec<String>, String> {
        let runs = self.registry().matching(filter.status.as_deref(), filter.older_than).map_err(|e| e.to_string())?;
        let mut cleared = Vec::new();
        for run in runs {
            if !run.status.is_hard_terminal() {
                self.cancel_agent_tool(&run.run_id, Some("cleared".into())).await;
            }
            if let Some(stub) = self.run_stub(&run) {
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
    /// frees its slot and fires `on_agent_tool_finish` once per run.
    pub(super) async fn conclude(&self, record: &RunRecord, terminal: Terminal) -> RunResult {
        let now = now_ms();
        match self.registry().finish(&record.run_id, &terminal, now) {
            Ok(Some(done)) => {
                if let Some(frame) = done.terminal_frame() {
                    self.broadcast_frame(&frame);
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
                    self.0.agent.on_agent_tool_finish(self, &done, &result).await;
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
    pub(super) fn current_result(&self, record: &RunRecord) -> RunResult {
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
}

pub(super) async fn send_json<T: Serialize>(
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
