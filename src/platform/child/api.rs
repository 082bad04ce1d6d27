//! The internal routes a parent calls: start, tail, inspect, cancel, clear.

use std::collections::HashMap;
use std::pin::Pin;

use futures::channel::mpsc;
use futures::future::{select, Either};
use futures::{Stream, StreamExt};
use serde_json::json;
use worker::{Method, Request, Response};

use super::{LiveRun, Turn};
use crate::agent::Agent;
use crate::cancel::CancelToken;
use crate::child::progress::Coalescer;
use crate::child::runs::{ChildRun, ChildStatus};
use crate::platform::{json_error, now_ms, AgentHost};
use crate::protocol::child_api::{CancelRequest, StartReply, StartRequest};
use crate::protocol::chunk;
use crate::protocol::tail::{OutcomeStatus, RunOutcome, TailLine};
use crate::run::ClearFilter;
use crate::store::meta;

type BodyStream = Pin<Box<dyn Stream<Item = worker::Result<Vec<u8>>>>>;

impl<A: Agent> AgentHost<A> {
    /// Serves the parent's internal requests.
    pub(crate) async fn serve_parent(&self, mut req: Request) -> worker::Result<Response> {
        let url = req.url()?;
        let query: HashMap<String, String> = url.query_pairs().into_owned().collect();
        let run_id = query.get("runId").cloned().unwrap_or_default();
        match (req.method(), url.path()) {
            (Method::Post, "/_agent_tools/start") => match req.json::<StartRequest>().await {
                Ok(start) => self.start(start),
                Err(e) => json_error(400, format!("malformed start request: {e}")),
            },
            (Method::Get, "/_agent_tools/tail") => {
                let after = query.get("after").and_then(|a| a.parse::<i64>().ok()).unwrap_or(-1);
                self.tail(&run_id, after)
            }
            (Method::Get, "/_agent_tools/inspect") => self.inspect_run(&run_id),
            (Method::Post, "/_agent_tools/cancel") => match req.json::<CancelRequest>().await {
                Ok(cancel) => self.cancel(cancel),
                Err(e) => json_error(400, format!("malformed cancel request: {e}")),
            },
            (Method::Post, "/_agent_tools/clear") => self.clear().await,
            (_, path) => json_error(404, format!("{} has no route {path}", A::CLASS)),
        }
    }

    fn start(&self, start: StartRequest) -> worker::Result<Response> {
        if start.run_id.is_empty() {
            return json_error(400, "start request without a runId");
        }
        for (key, value) in [
            ("parent_class", &start.parent_class),
            ("parent_name", &start.parent_name),
            ("run_id", &start.run_id),
            ("name", &start.child_name),
        ] {
            if value.is_empty() {
                continue;
            }
            if let Err(e) = meta::set(&self.0.sql, key, value) {
                return json_error(500, e.to_string());
            }
        }
        let (run, created) = match self.runs().start(&start.run_id, &start.input, start.terminal_only, now_ms()) {
            Ok(r) => r,
            Err(e) => return json_error(500, e.to_string()),
        };
        // A `starting` row with no turn here never began (the instance restarted in between):
        // beginning it now is safe, nothing of it was streamed yet.
        let begin = created || (run.status == ChildStatus::Starting && !self.0.live.borrow().contains_key(&run.run_id));
        let status = if begin { "running" } else { run.status.as_str() };
        if created {
            // A drill-in chat turn may have used this id before the run existed.
            self.0.chat.reset_stream(&run.run_id);
        }
        if begin {
            self.begin_turn(run);
        }
        Response::from_json(&StartReply { created, status: status.into() })
    }

    fn begin_turn(&self, run: ChildRun) {
        let cancel = CancelToken::new();
        let next_index = self.runs().next_index(&run.run_id).unwrap_or(0);
        let live = LiveRun {
            subscribers: Vec::new(),
            next_index,
            cancel: cancel.clone(),
            terminal_only: run.terminal_only,
            progress: Coalescer::default(),
        };
        self.0.live.borrow_mut().insert(run.run_id.clone(), live);
        let host = self.clone();
        self.0.state.wait_until(async move {
            let _ = host.runs().mark_running(&run.run_id);
            let turn = Turn::new(host.clone(), run.run_id.clone(), run.input, cancel.clone());
            let outcome = {
                let work = host.0.agent.run(&turn);
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
            host.seal(&run.run_id, &outcome);
        });
    }

    fn tail(&self, run_id: &str, after: i64) -> worker::Result<Response> {
        let run = match self.runs().get(run_id) {
            Ok(Some(run)) => self.reconcile(run),
            Ok(None) => return json_error(404, format!("{} has no run {run_id:?}", A::CLASS)),
            Err(e) => return json_error(500, e.to_string()),
        };
        let chunks = match self.runs().chunks_after(run_id, after) {
            Ok(c) => c,
            Err(e) => return json_error(500, e.to_string()),
        };
        let lines: Vec<Vec<u8>> = chunks
            .into_iter()
            .map(|c| TailLine::Chunk { i: Some(c.index), k: c.kind, b: c.body, r: None }.to_line().into_bytes())
            .collect();
        let body: BodyStream = match self.0.live.borrow_mut().get_mut(run_id) {
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

    fn inspect_run(&self, run_id: &str) -> worker::Result<Response> {
        if let Ok(Some(run)) = self.runs().get(run_id) {
            self.reconcile(run);
        }
        match self.runs().inspect(run_id) {
            Ok(inspection) => Response::from_json(&inspection),
            Err(e) => json_error(500, e.to_string()),
        }
    }

    /// Deletes everything this child stored (its runs, its own children, stream, milestones
    /// and messages), after stopping any live turn. The instance is left empty, with its tables
    /// in place.
    async fn clear(&self) -> worker::Result<Response> {
        // A child with agent tools of its own clears its children first.
        if let Err(e) = self.clear_agent_tool_runs(&ClearFilter::default()).await {
            worker::console_error!("agent-tools: clearing the runs of a cleared child failed: {e}");
        }
        let mut live: Vec<CancelToken> = self.0.live.borrow().values().map(|run| run.cancel.clone()).collect();
        live.extend(self.0.chat.active().map(|chat| chat.cancel)); // a drill-in chat turn
        for token in live {
            token.cancel(Some("cleared".into()));
        }
        // Let the cancelled turns finish writing (runs seal and leave `live`, a chat turn saves
        // its message) before deleting, so nothing they write survives the clear.
        for _ in 0..200 {
            if self.0.live.borrow().is_empty() && self.0.chat.active().is_none() {
                break;
            }
            worker::Delay::from(std::time::Duration::from_millis(10)).await;
        }
        self.0.state.storage().delete_all().await?;
        self.0.chat.reset();
        if let Err(e) = crate::platform::host::migrate(&self.0.sql) {
            return json_error(500, e.to_string());
        }
        Response::from_json(&json!({ "cleared": true }))
    }

    fn cancel(&self, cancel: CancelRequest) -> worker::Result<Response> {
        let live = self.0.live.borrow().get(&cancel.run_id).map(|l| l.cancel.clone());
        match live {
            Some(token) => token.cancel(cancel.reason),
            None => {
                if let Ok(Some(run)) = self.runs().get(&cancel.run_id) {
                    if !run.status.is_terminal() {
                        let outcome = RunOutcome {
                            status: OutcomeStatus::Aborted,
                            summary: None,
                            output: None,
                            error: cancel.reason,
                        };
                        self.seal(&cancel.run_id, &outcome);
                    }
                }
            }
        }
        let status = self.runs().get(&cancel.run_id).ok().flatten().map(|r| r.status.as_str());
        Response::from_json(&json!({ "status": status }))
    }
}
