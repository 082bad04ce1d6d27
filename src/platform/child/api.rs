//! The internal routes a parent calls: start, tail, inspect, cancel, clear.

use futures::channel::mpsc;
use futures::future::{select, Either};
use futures::StreamExt;
use serde_json::json;
use worker::Response;

use super::{status_str, BodyStream, ChildAgent, ChildHost, LiveRun, Turn};
use crate::cancel::CancelToken;
use crate::child::progress::Coalescer;
use crate::child::runs::{ChildRun, ChildStatus};
use crate::platform::{json_error, now_ms};
use crate::protocol::child_api::{CancelRequest, StartReply, StartRequest};
use crate::protocol::chunk;
use crate::protocol::tail::{OutcomeStatus, RunOutcome, TailLine};
use crate::store::meta;

impl<C: ChildAgent> ChildHost<C> {
    pub(super) fn start(&self, start: StartRequest) -> worker::Result<Response> {
        if start.run_id.is_empty() {
            return json_error(400, "start request without a runId");
        }
        for (key, value) in
            [("parent_class", &start.parent_class), ("parent_name", &start.parent_name), ("run_id", &start.run_id)]
        {
            if let Err(e) = meta::set(&self.core.sql, key, value) {
                return json_error(500, e.to_string());
            }
        }
        let (run, created) = match self.core.runs().start(&start.run_id, &start.input, start.terminal_only, now_ms()) {
            Ok(r) => r,
            Err(e) => return json_error(500, e.to_string()),
        };
        // A `starting` row with no turn here never began (the instance restarted in between):
        // beginning it now is safe, nothing of it was streamed yet.
        let begin =
            created || (run.status == ChildStatus::Starting && !self.core.live.borrow().contains_key(&run.run_id));
        let status = if begin { "running" } else { status_str(run.status) };
        if created {
            // A drill-in chat turn may have used this id before the run existed.
            self.core.chat.reset_stream(&run.run_id);
        }
        if begin {
            self.begin_turn(run);
        }
        Response::from_json(&StartReply { created, status: status.into() })
    }

    fn begin_turn(&self, run: ChildRun) {
        let cancel = CancelToken::new();
        let next_index = self.core.runs().next_index(&run.run_id).unwrap_or(0);
        let live = LiveRun {
            subscribers: Vec::new(),
            next_index,
            cancel: cancel.clone(),
            terminal_only: run.terminal_only,
            progress: Coalescer::default(),
        };
        self.core.live.borrow_mut().insert(run.run_id.clone(), live);
        let core = self.core.clone();
        let agent = self.agent.clone();
        self.core.state.wait_until(async move {
            let _ = core.runs().mark_running(&run.run_id);
            let turn = Turn::new(core.clone(), run.run_id.clone(), run.input, cancel.clone());
            let outcome = {
                let work = agent.run(&turn);
                let stop = cancel.cancelled();
                futures::pin_mut!(work, stop);
                let finished = match select(work, stop).await {
                    Either::Left((result, _)) => Some(result),
                    Either::Right(_) => None,
                };
                let aborted = |error| RunOutcome { status: OutcomeStatus::Aborted, summary: None, output: None, error };
                match finished {
                    _ if cancel.is_cancelled() => {
                        if finished.is_none() {
                            turn.emit(chunk::abort(cancel.reason().as_deref()));
                        }
                        aborted(cancel.reason())
                    }
                    Some(Ok(out)) => RunOutcome {
                        status: OutcomeStatus::Completed,
                        summary: Some(out.summary),
                        output: out.output,
                        error: None,
                    },
                    Some(Err(message)) => {
                        RunOutcome { status: OutcomeStatus::Error, summary: None, output: None, error: Some(message) }
                    }
                    None => aborted(cancel.reason()),
                }
            };
            core.seal(&run.run_id, &outcome);
        });
    }

    pub(super) fn tail(&self, run_id: &str, after: i64) -> worker::Result<Response> {
        let run = match self.core.runs().get(run_id) {
            Ok(Some(run)) => self.core.reconcile(run),
            Ok(None) => return json_error(404, format!("{} has no run {run_id:?}", C::CLASS)),
            Err(e) => return json_error(500, e.to_string()),
        };
        let chunks = match self.core.runs().chunks_after(run_id, after) {
            Ok(c) => c,
            Err(e) => return json_error(500, e.to_string()),
        };
        let lines: Vec<Vec<u8>> = chunks
            .into_iter()
            .map(|c| TailLine::Chunk { i: Some(c.index), k: c.kind, b: c.body, r: None }.to_line().into_bytes())
            .collect();
        let body: BodyStream = match self.core.live.borrow_mut().get_mut(run_id) {
            Some(live) => {
                let (tx, rx) = mpsc::unbounded();
                for line in lines {
                    let _ = tx.unbounded_send(line);
                }
                live.subscribers.push(tx);
                // Lines queued while the reader was busy go out as one write.
                Box::pin(rx.ready_chunks(256).map(|lines| Ok(lines.concat())))
            }
            None => {
                let mut lines = lines;
                if let Some(outcome) = run.outcome() {
                    lines.push(TailLine::End { outcome }.to_line().into_bytes());
                }
                let all = lines.concat();
                Box::pin(futures::stream::iter((!all.is_empty()).then_some(Ok(all))))
            }
        };
        let mut resp = Response::from_stream(body)?;
        resp.headers_mut().set("content-type", "application/x-ndjson")?;
        Ok(resp)
    }

    pub(super) fn inspect(&self, run_id: &str) -> worker::Result<Response> {
        if let Ok(Some(run)) = self.core.runs().get(run_id) {
            self.core.reconcile(run);
        }
        match self.core.runs().inspect(run_id) {
            Ok(inspection) => Response::from_json(&inspection),
            Err(e) => json_error(500, e.to_string()),
        }
    }

    /// Deletes everything this child stored (its run, stream, milestones and messages), after
    /// stopping any live turn. The instance is left empty, with its tables in place.
    pub(super) async fn clear(&self) -> worker::Result<Response> {
        let mut live: Vec<CancelToken> = self.core.live.borrow().values().map(|run| run.cancel.clone()).collect();
        live.extend(self.core.chat.active().map(|chat| chat.cancel)); // a drill-in chat turn
        for token in live {
            token.cancel(Some("cleared".into()));
        }
        // Let the cancelled turns finish writing (runs seal and leave `live`, a chat turn saves
        // its message) before deleting, so nothing they write survives the clear.
        for _ in 0..200 {
            if self.core.live.borrow().is_empty() && self.core.chat.active().is_none() {
                break;
            }
            worker::Delay::from(std::time::Duration::from_millis(10)).await;
        }
        self.core.state.storage().delete_all().await?;
        self.core.chat.reset();
        if let Err(e) = self.core.runs().migrate().and_then(|_| crate::store::Sql::batch(&self.core.sql, meta::SCHEMA))
        {
            return json_error(500, e.to_string());
        }
        Response::from_json(&json!({ "cleared": true }))
    }

    pub(super) fn cancel(&self, cancel: CancelRequest) -> worker::Result<Response> {
        let live = self.core.live.borrow().get(&cancel.run_id).map(|l| l.cancel.clone());
        match live {
            Some(token) => token.cancel(cancel.reason),
            None => {
                if let Ok(Some(run)) = self.core.runs().get(&cancel.run_id) {
                    if !run.status.is_terminal() {
                        let outcome = RunOutcome {
                            status: OutcomeStatus::Aborted,
                            summary: None,
                            output: None,
                            error: cancel.reason,
                        };
                        self.core.seal(&cancel.run_id, &outcome);
                    }
                }
            }
        }
        let status = self.core.runs().get(&cancel.run_id).ok().flatten().map(|r| status_str(r.status));
        Response::from_json(&json!({ "status": status }))
    }
}
