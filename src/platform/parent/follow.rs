//! Following a child: tail its stream from the last chunk seen, forward every chunk, inspect it
//! when the stream breaks and tail it again, within the re-attach budgets.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures::future::{select, Either};
use futures::StreamExt;
use serde_json::Value;
use worker::{Delay, Method, Stub};

use super::dispatch::send_json;
use crate::agent::Agent;
use crate::parent::registry::{Forward, RunRecord, Terminal};
use crate::platform::{now_ms, AgentHost};
use crate::protocol::child_api;
use crate::protocol::tail::{ChunkKind, LineSplitter, OutcomeStatus, RunOutcome, TailLine};
use crate::protocol::InterruptedReason;
use crate::run::{EventDelivery, ProgressSnapshot, RunInfo, RunResult};

/// How long one inspection of a child may take.
const INSPECT_TIMEOUT_MS: u64 = 2_000;
/// The pause before tailing a child again after its stream broke.
const RETAIL_PAUSE_MS: u64 = 250;

impl<A: Agent> AgentHost<A> {
    /// Tails the child from the last chunk seen to its outcome, forwarding every chunk. A broken
    /// tail is inspected and tailed again from where it stopped. Once re-attaching (a run this
    /// instance did not start, or whose tail broke), the child must keep making progress
    /// (`reattach_no_progress_timeout_ms`) within `reattach_max_window_ms`.
    pub(crate) async fn follow(&self, record: &RunRecord, stub: &Stub, reattaching: bool) -> RunResult {
        let run_id = &record.run_id;
        let cancel = self.cancel_token(run_id);
        let no_progress_ms = self.options().reattach_no_progress_timeout_ms;
        let max_window = self.options().reattach_max_window_ms;
        let mut window_end = max_window.filter(|_| reattaching).map(|ms| now_ms() + ms as i64);
        let mut reattaching = reattaching;
        let mut last_progress = now_ms();
        loop {
            let cursor = self.registry().get(run_id).ok().flatten().map_or(record.child_cursor, |r| r.child_cursor);
            if let Ok(mut resp) = send_json(stub, Method::Get, &child_api::tail_url(run_id, cursor), &()).await {
                if let (200, Ok(mut body)) = (resp.status_code(), resp.stream()) {
                    let mut lines = LineSplitter::default();
                    loop {
                        let quiet: Pin<Box<dyn Future<Output = ()>>> = if reattaching {
                            let wait = no_progress_ms.saturating_sub((now_ms() - last_progress).max(0) as u64);
                            Box::pin(Delay::from(Duration::from_millis(wait.max(1))))
                        } else {
                            Box::pin(futures::future::pending())
                        };
                        let next = body.next();
                        let stop = cancel.cancelled();
                        futures::pin_mut!(next, stop);
                        let bytes = match select(next, select(stop, quiet)).await {
                            Either::Left((Some(Ok(bytes)), _)) => bytes,
                            Either::Left(_) => break, // the stream ended or broke
                            Either::Right((Either::Left(_), _)) => return self.current_result(record),
                            Either::Right((Either::Right(_), _)) => break,
                        };
                        last_progress = now_ms();
                        let (batch, cursor, end) = parse_batch(&mut lines, &bytes, record);
                        let live = self.forward(record, &batch, cursor);
                        self.signals(record, &batch).await;
                        if let Some(outcome) = end {
                            if cancel.is_cancelled() {
                                // Concluded by whoever cancelled (a cancel, a give-up).
                                return self.current_result(record);
                            }
                            return self.conclude(record, terminal_from(outcome)).await;
                        }
                        if !live {
                            // Concluded elsewhere (cancelled, cleared): its row has the result.
                            return self.current_result(record);
                        }
                    }
                }
            }
            // The tail ended without an outcome: ask the child where the run stands.
            if !reattaching {
                reattaching = true;
                window_end = max_window.map(|ms| now_ms() + ms as i64);
            }
            let inspected = self.inspect(stub, run_id).await;
            if cancel.is_cancelled() {
                return self.current_result(record); // as above: never overwrite that
            }
            match inspected {
                Ok(Some(inspection)) => {
                    if let Some(outcome) = inspection.outcome() {
                        return self.conclude(record, terminal_from(outcome)).await;
                    }
                }
                Ok(None) => {} // unknown yet: keep waiting, within the budget
                Err(reason) => return self.conclude(record, Terminal::inspect_failed(reason)).await,
            }
            if window_end.is_some_and(|end| now_ms() >= end) {
                self.tell_child_to_cancel(stub, run_id, Some("window-exceeded".into())).await;
                let terminal = Terminal::Interrupted {
                    error: "the re-attach window ran out; the child was torn down".into(),
                    reason: Some(InterruptedReason::WindowExceeded),
                    child_still_running: Some(false),
                };
                return self.conclude(record, terminal).await;
            }
            if now_ms() - last_progress >= no_progress_ms as i64 {
                let terminal = Terminal::Interrupted {
                    error: format!("the child made no progress for {no_progress_ms} ms; it may still be running"),
                    reason: Some(InterruptedReason::NoProgress),
                    child_still_running: Some(true),
                };
                return self.conclude(record, terminal).await;
            }
            Delay::from(Duration::from_millis(RETAIL_PAUSE_MS)).await;
        }
    }

    /// Inspects the child within [`INSPECT_TIMEOUT_MS`]: `Ok(None)` when it does not know the
    /// run (yet).
    pub(crate) async fn inspect(
        &self,
        stub: &Stub,
        run_id: &str,
    ) -> Result<Option<InspectionReply>, InterruptedReason> {
        let url = child_api::inspect_url(run_id);
        let request = send_json(stub, Method::Get, &url, &());
        let timeout = Delay::from(Duration::from_millis(INSPECT_TIMEOUT_MS));
        futures::pin_mut!(request, timeout);
        let mut resp = match select(request, timeout).await {
            Either::Left((Ok(resp), _)) if resp.status_code() == 200 => resp,
            Either::Left(_) => return Err(InterruptedReason::InspectFailed),
            Either::Right(_) => return Err(InterruptedReason::InspectTimeout),
        };
        resp.json::<Option<InspectionReply>>().await.map_err(|_| InterruptedReason::InspectFailed)
    }

    /// Hands the progress and milestones of a batch to `on_progress`, and a detached run's
    /// milestones to its chat notifications.
    async fn signals(&self, record: &RunRecord, batch: &[Chunk]) {
        let mut info = None;
        for chunk in batch.iter().filter(|c| c.kind != ChunkKind::Stored) {
            let Ok(mut body) = serde_json::from_str::<Value>(&chunk.body) else { continue };
            let mut data = body.get_mut("data").map_or(Value::Null, Value::take);
            if chunk.kind == ChunkKind::Milestone {
                if record.detached.is_some() {
                    self.milestone_reached(record, &data);
                }
                if let Some(name) = data.get("name").cloned() {
                    data["milestone"] = name;
                }
            }
            if let Value::Object(o) = &mut data {
                o.entry("at").or_insert(Value::from(now_ms()));
            }
            let Ok(snapshot) = serde_json::from_value::<ProgressSnapshot>(data) else { continue };
            let info = info.get_or_insert_with(|| RunInfo::from_record(record));
            self.0.agent.on_progress(self, info, &snapshot).await;
        }
    }

    /// Stores a batch of chunks and broadcasts their frames. `false` when the run is no
    /// longer live.
    fn forward(&self, record: &RunRecord, batch: &[Chunk], cursor: Option<i64>) -> bool {
        if batch.is_empty() && cursor.is_none() {
            return true;
        }
        let forwards: Vec<Forward<'_>> =
            batch.iter().map(|c| Forward { kind: c.kind, body: &c.body, replay: c.kept.as_deref() }).collect();
        match self.registry().append(&record.run_id, &forwards, cursor, now_ms()) {
            Ok(Some(seqs)) => {
                self.broadcast_all(
                    seqs.into_iter()
                        .zip(batch)
                        .map(|(seq, chunk)| record.chunk_frame(seq, chunk.body.clone()).to_json()),
                );
                true
            }
            Ok(None) => false,
            Err(e) => {
                worker::console_error!("agent-tools: storing frames of {} failed: {e}", record.run_id);
                true
            }
        }
    }
}

/// A chunk read from a tail.
struct Chunk {
    kind: ChunkKind,
    body: String,
    /// What to keep for replay instead of `body`.
    kept: Option<String>,
}

/// Splits what a read brought into the chunks to forward, the child cursor reached and the
/// outcome, if the run ended.
fn parse_batch(
    lines: &mut LineSplitter,
    bytes: &[u8],
    record: &RunRecord,
) -> (Vec<Chunk>, Option<i64>, Option<RunOutcome>) {
    let mut batch = Vec::new();
    let mut cursor = None;
    let mut end = None;
    for line in lines.push(bytes) {
        match line {
            Ok(TailLine::Chunk { i, k, b, r }) => {
                cursor = i.or(cursor);
                let hidden = k == ChunkKind::Stored && record.event_delivery == EventDelivery::Terminal;
                if !hidden {
                    batch.push(Chunk { kind: k, body: b, kept: r });
                }
            }
            Ok(TailLine::End { outcome }) => end = Some(outcome),
            Err(e) => worker::console_error!("agent-tools: garbled tail line from {}: {e}", record.run_id),
        }
    }
    (batch, cursor, end)
}

/// The parts of a child's inspection the parent reads.
#[derive(serde::Deserialize)]
pub(crate) struct InspectionReply {
    status: String,
    summary: Option<String>,
    output: Option<Value>,
    error: Option<String>,
}

impl InspectionReply {
    /// The outcome, if the run ended.
    pub(crate) fn outcome(&self) -> Option<RunOutcome> {
        let status = match self.status.as_str() {
            "completed" => OutcomeStatus::Completed,
            "error" => OutcomeStatus::Error,
            "aborted" => OutcomeStatus::Aborted,
            _ => return None,
        };
        Some(RunOutcome {
            status,
            summary: self.summary.clone(),
            output: self.output.clone(),
            error: self.error.clone(),
        })
    }
}

pub(crate) fn terminal_from(outcome: RunOutcome) -> Terminal {
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
