//! Dispatch: insert the row, start the child, tail it to its outcome, conclude; and cancel.

use futures::channel::oneshot;
use futures::StreamExt;
use serde::Serialize;
use serde_json::Value;
use wasm_bindgen::JsValue;
use worker::{Method, Request, RequestInit, Response, Stub};

use super::{ChildClass, ParentAgent, ParentHost};
use crate::parent::registry::{Forward, RegistryError};
use crate::parent::{
    validate_run_id, Admission, ClearFilter, EventDelivery, Inserted, NewRun, RunOptions, RunRecord, RunResult,
    Terminal,
};
use crate::platform::{now_ms, random_id};
use crate::protocol::child_api::{self, CancelRequest, StartRequest};
use crate::protocol::tail::{ChunkKind, LineSplitter, OutcomeStatus, RunOutcome, TailLine};
use crate::protocol::InterruptedReason;

impl<A: ParentAgent> ParentHost<A> {
    /// Dispatches a child run and waits for its outcome. Idempotent by run id: a known id
    /// returns its recorded result, or joins the dispatch already under way; it never starts a
    /// second child. Over `max_concurrent_agent_tools`, the dispatch is refused (writing
    /// nothing) or queued, as [`ParentAgent::admission`] says.
    pub async fn run_agent_tool(&self, child: &str, options: RunOptions) -> RunResult {
        let run_id = options.run_id.clone().unwrap_or_else(random_id);
        if let Err(problem) = validate_run_id(&run_id) {
            return RunResult::refused(run_id, child, problem);
        }
        let Some(class) = A::CHILDREN.iter().find(|c| c.class == child).copied() else {
            let known: Vec<&str> = A::CHILDREN.iter().map(|c| c.class).collect();
            return RunResult::refused(
                run_id,
                child,
                format!("unknown agent type {child:?}; {} dispatches {known:?}", A::CLASS),
            );
        };
        let new = NewRun {
            run_id: run_id.clone(),
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
        let record = loop {
            match self.admit(&new) {
                Err(problem) => return RunResult::refused(run_id, child, problem),
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
                Ok(Admit::New(record)) => {
                    self.broadcast_frame(&record.started_frame());
                    self.0.agent.on_agent_tool_start(self, &record).await;
                    break record;
                }
                Ok(Admit::Existing(record)) => {
                    if record.status.is_hard_terminal() {
                        return RunResult::from_record(&record);
                    }
                    let waiting = self.0.inflight.borrow_mut().get_mut(&run_id).map(|waiters| {
                        let (tx, rx) = oneshot::channel();
                        waiters.push(tx);
                        rx
                    });
                    if let Some(rx) = waiting {
                        return match rx.await {
                            Ok(result) => result,
                            Err(_) => self.current_result(&record),
                        };
                    }
                    break record;
                }
            }
        };
        self.0.inflight.borrow_mut().insert(run_id.clone(), Vec::new());
        let result = self.drive(&record, class, &options.input).await;
        let waiters = self.0.inflight.borrow_mut().remove(&run_id).unwrap_or_default();
        for tx in waiters {
            let _ = tx.send(result.clone());
        }
        result
    }

    /// Looks the run up, checks the concurrency cap and inserts the row, in one synchronous
    /// step: two dispatches can never both take the last slot.
    fn admit(&self, new: &NewRun) -> Result<Admit, String> {
        let registry = self.registry();
        if let Some(existing) = registry.get(&new.run_id).map_err(|e| e.to_string())? {
            if existing.agent_type != new.agent_type {
                return Err(RegistryError::AgentTypeMismatch {
                    run_id: new.run_id.clone(),
                    existing: existing.agent_type,
                    requested: new.agent_type.clone(),
                }
                .to_string());
            }
            return Ok(Admit::Existing(existing));
        }
        if let Some(limit) = self.0.agent.max_concurrent_agent_tools(&self.0.env) {
            if registry.live_count().map_err(|e| e.to_string())? >= limit as i64 {
                return Ok(Admit::Full(limit));
            }
        }
        match registry.insert(new, now_ms()).map_err(|e| e.to_string())? {
            Inserted::New(record) => Ok(Admit::New(record)),
            Inserted::Existing(record) => Ok(Admit::Existing(record)),
        }
    }

    /// Resolves when a run concludes (a slot may be free).
    async fn slot_freed(&self) {
        let (tx, rx) = oneshot::channel();
        self.0.slot_waiters.borrow_mut().push(tx);
        let _ = rx.await;
    }

    pub(super) fn child_stub(&self, class: ChildClass, run_id: &str) -> Result<Stub, String> {
        let parent_name = self.name().ok_or("this parent does not know its own name yet")?;
        let namespace = self.0.env.durable_object(class.binding).map_err(|e| e.to_string())?;
        let id =
            namespace.id_from_name(&format!("{}/{}/{}", A::CLASS, parent_name, run_id)).map_err(|e| e.to_string())?;
        id.get_stub().map_err(|e| e.to_string())
    }

    async fn drive(&self, record: &RunRecord, class: ChildClass, input: &Value) -> RunResult {
        let stub = match self.child_stub(class, &record.run_id) {
            Ok(stub) => stub,
            Err(e) => {
                return self
                    .conclude(record, Terminal::Error { message: format!("could not reach {}: {e}", class.class) })
                    .await
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
        if let Err(e) = self.registry().mark_running(&record.run_id) {
            worker::console_error!("agent-tools: marking {} running failed: {e}", record.run_id);
        }
        self.follow(record, &stub).await
    }

    /// Tails the child from the row's cursor to its outcome, forwarding every chunk.
    async fn follow(&self, record: &RunRecord, stub: &Stub) -> RunResult {
        let run_id = &record.run_id;
        let url = child_api::tail_url(run_id, record.child_cursor);
        let mut resp = match send_json(stub, Method::Get, &url, &()).await {
            Ok(resp) if resp.status_code() == 200 => resp,
            _ => return self.after_broken_tail(record, stub).await,
        };
        let Ok(mut body) = resp.stream() else { return self.after_broken_tail(record, stub).await };
        let mut lines = LineSplitter::default();
        while let Some(Ok(bytes)) = body.next().await {
            let mut batch: Vec<(ChunkKind, String)> = Vec::new();
            let mut cursor = None;
            let mut end = None;
            for line in lines.push(&bytes) {
                match line {
                    Ok(TailLine::Chunk { i, k, b }) => {
                        cursor = i.or(cursor);
                        let hidden = k == ChunkKind::Stored && record.event_delivery == EventDelivery::Terminal;
                        if !hidden {
                            batch.push((k, b));
                        }
                    }
                    Ok(TailLine::End { outcome }) => end = Some(outcome),
                    Err(e) => worker::console_error!("agent-tools: garbled tail line from {run_id}: {e}"),
                }
            }
            if !self.forward(record, &batch, cursor) {
                // The run was concluded elsewhere (cancelled, cleared): its row has the result.
                return self.current_result(record);
            }
            if let Some(outcome) = end {
                return self.conclude(record, terminal_from(outcome)).await;
            }
        }
        self.after_broken_tail(record, stub).await
    }

    /// Stores a batch of chunks and broadcasts their frames. `false` when the run is no
    /// longer live.
    fn forward(&self, record: &RunRecord, batch: &[(ChunkKind, String)], cursor: Option<i64>) -> bool {
        if batch.is_empty() && cursor.is_none() {
            return true;
        }
        let forwards: Vec<Forward<'_>> = batch.iter().map(|(kind, body)| Forward { kind: *kind, body }).collect();
        match self.registry().append(&record.run_id, &forwards, cursor, now_ms()) {
            Ok(Some(seqs)) => {
                for (seq, (_, body)) in seqs.into_iter().zip(batch) {
                    self.broadcast_frame(&record.chunk_frame(seq, body.clone()));
                }
                true
            }
            Ok(None) => false,
            Err(e) => {
                worker::console_error!("agent-tools: storing frames of {} failed: {e}", record.run_id);
                true
            }
        }
    }

    /// The tail ended without an outcome: ask the child where the run stands.
    async fn after_broken_tail(&self, record: &RunRecord, stub: &Stub) -> RunResult {
        let inspection = match send_json(stub, Method::Get, &child_api::inspect_url(&record.run_id), &()).await {
            Ok(mut resp) if resp.status_code() == 200 => resp.json::<Option<InspectionReply>>().await.ok().flatten(),
            _ => None,
        };
        if let Some(outcome) = inspection.and_then(|i| i.outcome()) {
            return self.conclude(record, terminal_from(outcome)).await;
        }
        self.conclude(
            record,
            Terminal::Interrupted {
                error: "the child's stream ended before its result; the child may still be running".into(),
                reason: Some(InterruptedReason::NotTailable),
                child_still_running: Some(true),
            },
        )
        .await
    }

    /// Cancels a run: the child stops its turn and the run ends `aborted`. Idempotent: an
    /// unknown or finished run is left as it is.
    pub async fn cancel_agent_tool(&self, run_id: &str, reason: Option<String>) {
        let Ok(Some(record)) = self.registry().get(run_id) else { return };
        if record.status.is_hard_terminal() {
            return;
        }
        if let Some(class) = A::CHILDREN.iter().find(|c| c.class == record.agent_type) {
            if let Ok(stub) = self.child_stub(*class, run_id) {
                let cancel = CancelRequest { run_id: run_id.to_owned(), reason: reason.clone() };
                let url = format!("{}/cancel", child_api::BASE);
                if let Err(e) = send_json(&stub, Method::Post, &url, &cancel).await {
                    worker::console_error!("agent-tools: cancelling {run_id} at the child failed: {e}");
                }
            }
        }
        self.conclude(&record, Terminal::Aborted { reason }).await;
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
            if let Some(class) = A::CHILDREN.iter().find(|c| c.class == run.agent_type) {
                if let Ok(stub) = self.child_stub(*class, &run.run_id) {
                    let url = format!("{}/clear", child_api::BASE);
                    let request = CancelRequest { run_id: run.run_id.clone(), reason: None };
                    if let Err(e) = send_json(&stub, Method::Post, &url, &request).await {
                        worker::console_error!("agent-tools: clearing {} at the child failed: {e}", run.run_id);
                    }
                }
            }
            self.registry().delete(std::slice::from_ref(&run.run_id)).map_err(|e| e.to_string())?;
            cleared.push(run.run_id);
        }
        Ok(cleared)
    }

    /// Records the terminal result (unless the row is already final), broadcasts its frame,
    /// frees its slot and fires `on_agent_tool_finish` (once: only the transition that wrote
    /// the row fires it).
    async fn conclude(&self, record: &RunRecord, terminal: Terminal) -> RunResult {
        match self.registry().finish(&record.run_id, &terminal, now_ms()) {
            Ok(Some(done)) => {
                if let Some(frame) = done.terminal_frame() {
                    self.broadcast_frame(&frame);
                }
                for waiter in self.0.slot_waiters.borrow_mut().drain(..) {
                    let _ = waiter.send(());
                }
                let result = RunResult::from_record(&done);
                self.0.agent.on_agent_tool_finish(self, &done, &result).await;
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

    fn current_result(&self, record: &RunRecord) -> RunResult {
        match self.registry().get(&record.run_id) {
            Ok(Some(now)) => RunResult::from_record(&now),
            _ => RunResult::from_record(record),
        }
    }
}

/// How a dispatch is admitted.
enum Admit {
    /// A new row.
    New(RunRecord),
    /// The run id is known.
    Existing(RunRecord),
    /// The cap is reached.
    Full(usize),
}

/// The parts of a child's inspection the parent reads.
#[derive(serde::Deserialize)]
struct InspectionReply {
    status: String,
    summary: Option<String>,
    output: Option<Value>,
    error: Option<String>,
}

impl InspectionReply {
    fn outcome(self) -> Option<RunOutcome> {
        let status = match self.status.as_str() {
            "completed" => OutcomeStatus::Completed,
            "error" => OutcomeStatus::Error,
            "aborted" => OutcomeStatus::Aborted,
            _ => return None,
        };
        Some(RunOutcome { status, summary: self.summary, output: self.output, error: self.error })
    }
}

fn terminal_from(outcome: RunOutcome) -> Terminal {
    match outcome.status {
        OutcomeStatus::Completed => {
            Terminal::Completed { summary: outcome.summary.unwrap_or_default(), output: outcome.output }
        }
        OutcomeStatus::Error => {
            Terminal::Error { message: outcome.error.unwrap_or_else(|| "the child run failed".into()) }
        }
        OutcomeStatus::Aborted => Terminal::Aborted { reason: outcome.error },
    }
}

async fn send_json<T: Serialize>(stub: &Stub, method: Method, url: &str, body: &T) -> worker::Result<Response> {
    let mut init = RequestInit::new();
    init.with_method(method.clone());
    if method != Method::Get {
        init.with_body(Some(JsValue::from_str(&serde_json::to_string(body)?)));
    }
    stub.fetch_with_request(Request::new_with_init(url, &init)?).await
}
