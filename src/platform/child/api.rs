//! The internal routes a parent calls: start, tail, inspect, cancel, clear.

use std::collections::HashMap;
use std::pin::Pin;

use futures::channel::mpsc;
use futures::{Stream, StreamExt};
use serde_json::json;
use worker::{Method, Request, Response};

use crate::child::engine::{TailError, TailStart};
use crate::platform::host::Host;
use crate::platform::{json_error, now_ms, parse_json};
use crate::protocol::child_api::{CancelRequest, StartRequest};
use crate::routing::RequestUrl;
use crate::store::meta;
use crate::types::ClearFilter;

/// Live writes a child holds for one tail before it cuts a reader that does not keep up (each
/// write is one flush of the turn: at most 256 lines).
pub const TAIL_QUEUE: usize = 64;
/// Stored lines a tail reads from the log at a time: a long backlog is sent a page at a time,
/// each read when the reader has taken the one before, so its memory does not grow with it.
pub const TAIL_PAGE: usize = 1024;

type BodyStream = Pin<Box<dyn Stream<Item = worker::Result<Vec<u8>>>>>;

impl Host {
    /// Serves the parent's internal requests.
    pub(crate) async fn serve_parent(&self, mut req: Request) -> worker::Result<Response> {
        let url = RequestUrl::of(&req);
        let query: HashMap<String, String> = url.query_pairs().collect();
        let run_id = query.get("runId").cloned().unwrap_or_default();
        match (req.method(), url.path()) {
            (Method::Post, "/_agent_tools/start") => match parse_json::<StartRequest>(req.text().await) {
                Ok(start) => match start.tail_after {
                    // Started, then the tail in the same response (or the start's error).
                    Some(after) => {
                        let run_id = start.run_id.clone();
                        let started = self.start(start)?;
                        if started.status_code() != 200 {
                            return Ok(started);
                        }
                        self.tail(&run_id, after)
                    }
                    None => self.start(start),
                },
                Err(e) => json_error(400, format!("malformed start request: {e}")),
            },
            (Method::Get, "/_agent_tools/tail") => {
                let after = query.get("after").and_then(|a| a.parse::<i64>().ok()).unwrap_or(-1);
                self.tail(&run_id, after)
            }
            (Method::Get, "/_agent_tools/inspect") => {
                let streaming = self.0.chat.is_streaming(&run_id);
                let result = self.0.child.borrow_mut().inspect(&self.0.sql, &run_id, streaming, now_ms());
                match result {
                    Ok((inspection, actions)) => {
                        self.carry_out_child(actions);
                        Response::from_json(&inspection)
                    }
                    Err(e) => json_error(500, e.to_string()),
                }
            }
            (Method::Post, "/_agent_tools/cancel") => match parse_json::<CancelRequest>(req.text().await) {
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
            (_, path) => json_error(404, format!("{} has no route {path}", self.0.class)),
        }
    }

    fn start(&self, start: StartRequest) -> worker::Result<Response> {
        if start.run_id.is_empty() {
            return json_error(400, "start request without a runId");
        }
        let identity: Vec<(&str, &str)> = [
            ("parent_class", &start.parent_class),
            ("parent_name", &start.parent_name),
            ("run_id", &start.run_id),
            ("name", &start.child_name),
        ]
        .into_iter()
        .filter(|(_, value)| !value.is_empty())
        .map(|(key, value)| (key, value.as_str()))
        .collect();
        if let Err(e) = meta::set_all(&self.0.sql, &identity) {
            return json_error(500, e.to_string());
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
        let streaming = self.0.chat.is_streaming(run_id);
        let result = self.0.child.borrow_mut().tail(&self.0.sql, run_id, after, TAIL_PAGE, streaming, now_ms());
        let (start, actions) = match result {
            Ok(started) => started,
            Err(TailError::Unknown) => return json_error(404, format!("{} has no run {run_id:?}", self.0.class)),
            Err(TailError::Store(e)) => return json_error(500, e.to_string()),
        };
        let body = TailBody::new(self.clone(), run_id.to_owned(), start);
        // The engine's actions (a rerun's turn) after the subscription: the tail sees it all.
        self.carry_out_child(actions);
        let body: BodyStream = Box::pin(futures::stream::unfold(body, TailBody::step).flatten());
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
        live.extend(self.0.chat.running()); // a drill-in chat turn
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
        match crate::platform::host::migrate(&self.0.sql) {
            Ok(parent_tables) => self.0.parent_tables.set(parent_tables),
            Err(e) => return json_error(500, e.to_string()),
        }
        Response::from_json(&json!({ "cleared": true }))
    }
}

/// A tail's body: the backlog a page at a time, then (for a live run) the subscription.
struct TailBody {
    host: Host,
    run_id: String,
    /// The page to send next and, when it was full, the log index to read on from.
    page: Option<(Vec<u8>, Option<i64>)>,
    /// The live lines, once the backlog is out and the run still goes on.
    live: Option<mpsc::Receiver<Vec<u8>>>,
}

impl TailBody {
    fn new(host: Host, run_id: String, start: TailStart) -> Self {
        let mut body = Self { host, run_id, page: None, live: None };
        body.take(start);
        body
    }

    /// Takes a page the engine read, and its subscription at once, in the same synchronous
    /// step: a line emitted after the read reaches the queue, never a missing sender.
    fn take(&mut self, start: TailStart) {
        if let Some(subscriber) = start.subscriber {
            // A bounded queue: a reader that falls [`TAIL_QUEUE`] writes behind is cut off and
            // tails again from its cursor (every line is in the log), so a slow parent never
            // grows this memory, and the turn itself never waits on a reader.
            let (tx, rx) = mpsc::channel(TAIL_QUEUE);
            self.host.0.subscribers.borrow_mut().insert(subscriber, tx);
            self.live = Some(rx);
        }
        self.page = Some((start.lines.concat(), start.more_after));
    }

    /// The current page; the next one is read (or the subscription taken) for the step after.
    async fn step(mut self) -> Option<(BodyStream, Self)> {
        let Some((page, more_after)) = self.page.take() else {
            // Lines queued while the reader was busy go out as one write.
            let live = self.live.take()?.ready_chunks(256).map(|lines| Ok(lines.concat()));
            return Some((Box::pin(live), self));
        };
        if let Some(after) = more_after {
            let streaming = self.host.0.chat.is_streaming(&self.run_id);
            let sql = &self.host.0.sql;
            let result = self.host.0.child.borrow_mut().tail(sql, &self.run_id, after, TAIL_PAGE, streaming, now_ms());
            match result {
                Ok((next, actions)) => {
                    self.take(next);
                    self.host.carry_out_child(actions);
                }
                // The run went away (cleared) between pages: the tail ends; a reader tails again.
                Err(e) => worker::console_error!("agent-tools: tailing {} failed: {e:?}", self.run_id),
            }
        }
        Some((Box::pin(futures::stream::iter((!page.is_empty()).then_some(Ok(page)))), self))
    }
}
