//! What a child serves its parent: start, tail, inspect, cancel, clear (typed calls; in a Worker
//! they travel as HTTP between the objects, see `platform/child_http.rs`).

use futures::channel::mpsc;
use futures::StreamExt;
use serde_json::json;

use crate::child::engine::{TailError, TailStart};
use crate::host::core::Host;
use crate::host::{ByteStream, ChildCall, ChildReply};
use crate::parent::registry::Registry;
use crate::protocol::child_api::StartRequest;
use crate::store::meta;
use crate::types::ClearFilter;

/// Live writes a child holds for one tail before it cuts a reader that does not keep up (each
/// write is one flush of the turn: at most 256 lines).
pub const TAIL_QUEUE: usize = 64;
/// Stored lines a tail reads from the log at a time: a long backlog is sent a page at a time,
/// each read when the reader has taken the one before, so its memory does not grow with it.
pub const TAIL_PAGE: usize = 1024;

fn refused(status: u16, body: impl Into<String>) -> ChildReply {
    ChildReply::Refused { status, body: body.into() }
}

/// How long a clear waits for the turns it cancelled to end before it deletes anyway.
const CLEAR_WAIT_MS: u64 = 30_000;

impl Host {
    /// Waits until no run's turn and no chat turn runs here, for at most `limit_ms`.
    async fn turns_ended(&self, limit_ms: u64) {
        let limit = self.0.io.sleep(limit_ms);
        futures::pin_mut!(limit);
        loop {
            let turns = !self.0.turns.borrow().is_empty();
            let chat = self.0.chat.running().is_some();
            if !turns && !chat {
                return;
            }
            let mut ended = Vec::new();
            if turns {
                let (sender, receiver) = futures::channel::oneshot::channel();
                self.0.turns_idle.borrow_mut().push(sender);
                ended.push(receiver);
            }
            if chat {
                ended.push(self.0.chat.when_idle());
            }
            if let futures::future::Either::Right(_) =
                futures::future::select(futures::future::select_all(ended), limit.as_mut()).await
            {
                return self.log_error(&format!("a clear waited {limit_ms} ms for turns to end; it deletes anyway"));
            }
        }
    }

    /// Serves a call of this agent's parent.
    pub(crate) async fn serve_child(&self, call: ChildCall) -> ChildReply {
        if let Some(problem) = self.unready() {
            return refused(500, problem);
        }
        match call {
            ChildCall::Start(start) => {
                // Started, then the tail in the same answer (or the start's error).
                let (run_id, after) = (start.run_id.clone(), start.tail_after.unwrap_or(-1));
                match self.start(start) {
                    Ok(()) => self.tail(&run_id, after),
                    Err(refusal) => refusal,
                }
            }
            ChildCall::Tail { run_id, after } => self.tail(&run_id, after),
            ChildCall::Inspect { run_id } => {
                let streaming = self.0.chat.is_streaming(&run_id);
                let result = self.0.child.borrow_mut().inspect(self.sql(), &run_id, streaming, self.now());
                match result {
                    Ok((inspection, actions)) => {
                        self.carry_out_child(actions);
                        ChildReply::Inspection(inspection.map(Box::new))
                    }
                    Err(e) => refused(500, e.to_string()),
                }
            }
            ChildCall::Cancel(cancel) => {
                let result = self.0.child.borrow_mut().cancel(self.sql(), &cancel.run_id, cancel.reason, self.now());
                match result {
                    Ok(actions) => self.carry_out_child(actions),
                    Err(e) => return refused(500, e.to_string()),
                }
                let status = self.runs().get(&cancel.run_id).ok().flatten().map(|r| r.status.as_str());
                ChildReply::Done(json!({ "status": status }))
            }
            ChildCall::Clear => self.clear().await,
            ChildCall::Message(message) => self.receive_message(message),
        }
    }

    /// A message from the parent for a run: kept (the first of a name stays), and the run's
    /// `wait_for` woken. A run that ended, or that this child does not know, refuses it.
    fn receive_message(&self, message: crate::protocol::child_api::MessageRequest) -> ChildReply {
        let run = match self.runs().get(&message.run_id) {
            Ok(Some(run)) => run,
            Ok(None) => return refused(404, format!("{} has no run {:?}", self.0.class, message.run_id)),
            Err(e) => return refused(500, e.to_string()),
        };
        if !run.status.is_live() {
            return refused(409, format!("run {:?} already ended ({})", message.run_id, run.status.as_str()));
        }
        match self.runs().put_message(&message.run_id, &message.name, &message.value, self.now()) {
            Ok(new) => {
                let key = (message.run_id, message.name);
                for waiter in self.0.inbox_waiters.borrow_mut().remove(&key).unwrap_or_default() {
                    let _ = waiter.send(());
                }
                ChildReply::Done(json!({ "stored": new }))
            }
            Err(e) => refused(500, e.to_string()),
        }
    }

    fn start(&self, start: StartRequest) -> Result<(), ChildReply> {
        if start.run_id.is_empty() {
            return Err(refused(400, "start request without a runId"));
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
        meta::set_all(self.sql(), &identity).map_err(|e| refused(500, e.to_string()))?;
        let result = self.0.child.borrow_mut().start(self.sql(), &start, self.now());
        let (_, actions) = result.map_err(|e| refused(500, e.to_string()))?;
        self.carry_out_child(actions);
        Ok(())
    }

    fn tail(&self, run_id: &str, after: i64) -> ChildReply {
        let streaming = self.0.chat.is_streaming(run_id);
        let result = self.0.child.borrow_mut().tail(self.sql(), run_id, after, TAIL_PAGE, streaming, self.now());
        let (start, actions) = match result {
            Ok(started) => started,
            Err(TailError::Unknown) => return refused(404, format!("{} has no run {run_id:?}", self.0.class)),
            Err(TailError::Store(e)) => return refused(500, e.to_string()),
        };
        let body = TailBody::new(self.clone(), run_id.to_owned(), start);
        // The engine's actions (a rerun's turn) after the subscription: the tail sees it all.
        self.carry_out_child(actions);
        let body: ByteStream = Box::pin(futures::stream::unfold(body, TailBody::step).flatten());
        ChildReply::Tail(body)
    }

    /// Deletes everything this child stored (its runs, its own children, stream, milestones
    /// and messages), after stopping any live turn. The instance is left empty, with its tables
    /// in place.
    async fn clear(&self) -> ChildReply {
        // A child with agent tools of its own clears its children first.
        if let Err(e) = self.clear_agent_tool_runs(&ClearFilter::default()).await {
            self.log_error(&format!("clearing the runs of a cleared child failed: {e}"));
        }
        // What it still owes its own children survives its wipe: they are asked again.
        let owed = match self.0.parent_tables.get() {
            true => Registry::new(self.sql()).owed_child_clears().unwrap_or_else(|e| {
                self.storage_failed("owed child clears", &e);
                Vec::new()
            }),
            false => Vec::new(),
        };
        let mut live: Vec<_> = self.0.turns.borrow().values().cloned().collect();
        live.extend(self.0.chat.running()); // a drill-in chat turn
        for token in live {
            token.cancel(Some("cleared".into()));
        }
        // Let the cancelled turns finish writing (runs seal, a chat turn saves its message)
        // before deleting, so nothing they write survives the clear: woken when they end, for
        // at most CLEAR_WAIT_MS.
        self.turns_ended(CLEAR_WAIT_MS).await;
        if let Err(e) = self.0.io.delete_all().await {
            return refused(500, e);
        }
        // The wipe took the alarm with it.
        self.0.alarm_at.set(None);
        self.0.chat.reset();
        self.0.child.borrow_mut().reset();
        self.0.parent.borrow_mut().reset();
        match crate::host::core::migrate(self.sql()) {
            Ok(parent_tables) => self.0.parent_tables.set(parent_tables),
            Err(e) => return refused(500, e.to_string()),
        }
        if let Some(first) = owed.iter().map(|o| o.next_at).min() {
            if let Err(e) = Registry::new(self.parent_sql()).restore_owed_child_clears(&owed) {
                return refused(500, e.to_string());
            }
            self.arm_alarm_at(first.max(self.now())).await;
        }
        ChildReply::Done(json!({ "cleared": true }))
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
    async fn step(mut self) -> Option<(ByteStream, Self)> {
        let Some((page, more_after)) = self.page.take() else {
            // Lines queued while the reader was busy go out as one write.
            let live = self.live.take()?.ready_chunks(256).map(|lines| Ok(lines.concat()));
            return Some((Box::pin(live), self));
        };
        if let Some(after) = more_after {
            let streaming = self.host.0.chat.is_streaming(&self.run_id);
            let now = self.host.now();
            let result =
                self.host.0.child.borrow_mut().tail(self.host.sql(), &self.run_id, after, TAIL_PAGE, streaming, now);
            match result {
                Ok((next, actions)) => {
                    self.take(next);
                    self.host.carry_out_child(actions);
                }
                // The run went away (cleared) between pages: the tail ends; a reader tails again.
                Err(e) => self.host.log_error(&format!("tailing {} failed: {e:?}", self.run_id)),
            }
        }
        Some((Box::pin(futures::stream::iter((!page.is_empty()).then_some(Ok(page)))), self))
    }
}
