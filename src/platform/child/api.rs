//! The internal routes a parent calls: start, tail, inspect, cancel, clear.

use std::collections::HashMap;
use std::pin::Pin;

use futures::channel::mpsc;

/// Live lines a child holds for one tail before it cuts a reader that does not keep up.
pub(crate) const TAIL_QUEUE: usize = 4096;
use futures::{Stream, StreamExt};
use serde_json::json;
use worker::{Method, Request, Response};

use crate::agent::Agent;
use crate::child::engine::TailError;
use crate::platform::{json_error, now_ms, AgentHost};
use crate::protocol::child_api::{CancelRequest, StartRequest};
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
            (Method::Get, "/_agent_tools/inspect") => {
                let result = self.0.child.borrow_mut().inspect(&self.0.sql, &run_id, now_ms());
                match result {
                    Ok((inspection, actions)) => {
                        self.carry_out_child(actions);
                        Response::from_json(&inspection)
                    }
                    Err(e) => json_error(500, e.to_string()),
                }
            }
            (Method::Post, "/_agent_tools/cancel") => match req.json::<CancelRequest>().await {
                Ok(cancel) => {
                    let result = self.0.child.borrow_mut().cancel(&self.0.sql, &cancel.run_id, cancel.reason, now_ms());
                    match result {
                        Ok(actions) => self.carry_out_child(actions),
                        Err(e) => return json_error(500, e.to_string()),
                    }
                    let status = self.runs().get(&cancel.run_id).ok().flatten().map(|r| r.status.as_str());
                    Response::from_json(&json!({ "status": status }))
                }
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
        let result = self.0.child.borrow_mut().start(&self.0.sql, &start, now_ms());
        match result {
            Ok((reply, actions)) => {
                self.carry_out_child(actions);
                Response::from_json(&reply)
            }
            Err(e) => json_error(500, e.to_string()),
        }
    }

    fn tail(&self, run_id: &str, after: i64) -> worker::Result<Response> {
        let result = self.0.child.borrow_mut().tail(&self.0.sql, run_id, after, now_ms());
        let (start, actions) = match result {
            Ok(started) => started,
            Err(TailError::Unknown) => return json_error(404, format!("{} has no run {run_id:?}", A::CLASS)),
            Err(TailError::Store(e)) => return json_error(500, e.to_string()),
        };
        let body: BodyStream = match start.subscriber {
            Some(subscriber) => {
                // The stored lines first, then the live ones through a bounded queue: a reader
                // that falls [`TAIL_QUEUE`] lines behind is cut off and tails again from its
                // cursor (the lines are in the log), so a slow parent never grows this memory.
                let (tx, rx) = mpsc::channel(TAIL_QUEUE);
                self.0.subscribers.borrow_mut().insert(subscriber, tx);
                let backlog = start.lines.concat();
                let backlog = futures::stream::iter((!backlog.is_empty()).then_some(Ok(backlog)));
                // Lines queued while the reader was busy go out as one write.
                Box::pin(backlog.chain(rx.ready_chunks(256).map(|lines| Ok(lines.concat()))))
            }
            None => {
                let all = start.lines.concat();
                Box::pin(futures::stream::iter((!all.is_empty()).then_some(Ok(all))))
            }
        };
        // The engine's actions (a rerun's turn) after the subscription: the tail sees it all.
        self.carry_out_child(actions);
        let mut resp = Response::from_stream(body)?;
        resp.headers_mut().set("content-type", "application/x-ndjson")?;
        Ok(resp)
    }

    /// Deletes everything this child stored (its runs, its own children, stream, milestones
    /// and messages), after stopping any live turn. The instance is left empty, with its tables
    /// in place.
    async fn clear(&self) -> worker::Result<Response> {
        // A child with agent tools of its own clears its children first.
        if let Err(e) = self.clear_agent_tool_runs(&ClearFilter::default()).await {
            worker::console_error!("agent-tools: clearing the runs of a cleared child failed: {e}");
        }
        let mut live: Vec<_> = self.0.turns.borrow().values().cloned().collect();
        live.extend(self.0.chat.active().map(|chat| chat.cancel)); // a drill-in chat turn
        for token in live {
            token.cancel(Some("cleared".into()));
        }
        // Let the cancelled turns finish writing (runs seal, a chat turn saves its message)
        // before deleting, so nothing they write survives the clear.
        for _ in 0..200 {
            if self.0.turns.borrow().is_empty() && self.0.chat.active().is_none() {
                break;
            }
            worker::Delay::from(std::time::Duration::from_millis(10)).await;
        }
        self.0.state.storage().delete_all().await?;
        self.0.chat.reset();
        self.0.child.borrow_mut().reset();
        if let Err(e) = crate::platform::host::migrate(&self.0.sql) {
            return json_error(500, e.to_string());
        }
        Response::from_json(&json!({ "cleared": true }))
    }
}
