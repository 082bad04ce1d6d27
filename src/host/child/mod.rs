//! The child role on the platform: the internal routes a parent calls (`api`), the running turn
//! (`turn`), and the driver that carries out what the child engine (`crate::child::engine`)
//! decides: begin or cancel the agent's turn, write to a tail, send to the child's own chat
//! clients, set a coalescing timer. Clients reach the child's own chat only through the
//! parent's drill-in gate.

mod api;

pub use api::{TAIL_PAGE, TAIL_QUEUE};
mod turn;

use futures::future::{select, Either};
use serde_json::Value;

pub use turn::{Turn, TurnOutput};

use super::core::Host;
use crate::cancel::CancelToken;
use crate::chat::store::StreamLog;
use crate::child::engine::ChildAction;
use crate::child::progress::Report;
use crate::observability::EventType;
use crate::protocol::tail::ChunkKind;

/// The pauses between attempts at recording the end of a run's turn when storage fails.
const END_RETRIES_MS: [u64; 4] = [1_000, 2_000, 4_000, 8_000];

/// A run's turn is over here (its end recorded, or given up): it leaves `turns`, and a clear
/// waiting for the turns to end hears of it. Dropped however the task ends (a crash too).
struct TurnEnded {
    host: Host,
    run_id: String,
}

impl Drop for TurnEnded {
    fn drop(&mut self) {
        let idle = {
            let mut turns = self.host.0.turns.borrow_mut();
            turns.remove(&self.run_id);
            turns.is_empty()
        };
        if idle {
            for waiter in self.host.0.turns_idle.take() {
                let _ = waiter.send(());
            }
        }
    }
}

/// How many times a progress report storage refused is made again at once.
const PROGRESS_TRIES: usize = 3;

impl Host {
    /// Carries out the child engine's actions.
    pub(crate) fn carry_out_child(&self, actions: Vec<ChildAction>) {
        for action in actions {
            match action {
                ChildAction::BeginTurn { run_id, input, attempt } => self.begin_turn(run_id, input, attempt),
                ChildAction::CancelTurn { run_id, reason } => {
                    if let Some(token) = self.0.turns.borrow().get(&run_id) {
                        token.cancel(reason);
                    }
                }
                ChildAction::Send { subscriber, line } => {
                    // Full (a reader too slow) or closed: either way it goes, and a parent
                    // tails again from its cursor.
                    let gone = match self.0.subscribers.borrow_mut().get_mut(&subscriber) {
                        Some(tx) => tx.try_send(line).is_err(),
                        None => true,
                    };
                    if gone {
                        self.0.subscribers.borrow_mut().remove(&subscriber);
                        self.0.child.borrow_mut().unsubscribe(subscriber);
                    }
                }
                ChildAction::Close { subscriber } => {
                    self.0.subscribers.borrow_mut().remove(&subscriber);
                }
                ChildAction::ChatSend { run_id, bodies } => self.0.chat.send(&run_id, &bodies),
                ChildAction::FlushSoon { run_id } => {
                    // Once the turn yields: what it emitted meanwhile goes out as one batch. A
                    // spawned task is first polled right after the running one yields, before
                    // any timer: a turn that yields on a timer (a paced or long offline answer,
                    // or a provider's next read) does not get to emit more first. (A `Delay` here
                    // would arm its timer only when first polled, after the turn's own, and the
                    // turn's first chunk waited for the next 255.)
                    let host = self.clone();
                    self.spawn(async move { host.child_flush_chunks(&run_id) });
                }
                ChildAction::SupersedeMessages { run_id } => {
                    if let Err(e) = StreamLog::new(self.sql()).mark_superseded(&run_id) {
                        self.log_error(&format!("marking the superseded attempt of {run_id} failed: {e}"));
                    }
                }
                ChildAction::Observe(kind, payload) => self.observe(kind, payload),
            }
        }
    }

    /// One chunk of a run's turn (see [`crate::child::engine::ChildEngine::emit`]).
    pub(crate) fn child_emit(&self, run_id: &str, kind: ChunkKind, body: String) -> bool {
        let streaming = self.0.chat.is_streaming(run_id);
        let now = self.now();
        let result = self.0.child.borrow_mut().emit(self.sql(), run_id, kind, body, None, streaming, now);
        match result {
            Ok((live, actions)) => {
                self.carry_out_child(actions);
                live
            }
            Err(e) => {
                self.log_error(&format!("storing a chunk of {run_id} failed: {e}"));
                false
            }
        }
    }

    /// Stores and sends what the run's turn emitted since the last flush.
    pub(crate) fn child_flush_chunks(&self, run_id: &str) {
        let streaming = self.0.chat.is_streaming(run_id);
        let result = self.0.child.borrow_mut().flush(self.sql(), run_id, streaming);
        self.child_result(run_id, result);
    }

    pub(crate) fn child_progress(&self, run_id: &str, report: Report) {
        // A report is one unit: one that storage refused is made again, at once and then after
        // pauses (a milestone is durable; the turn goes on meanwhile).
        let milestone = report.progress.milestone.is_some();
        for _ in 0..PROGRESS_TRIES {
            match self.try_progress(run_id, report.clone()) {
                Ok(actions) => return self.carry_out_child(actions),
                Err(e) => self.child_result(run_id, Err(e)),
            }
        }
        if !milestone {
            return;
        }
        let host = self.clone();
        let run_id = run_id.to_owned();
        self.spawn(async move {
            for pause in END_RETRIES_MS {
                host.0.io.sleep(pause).await;
                match host.try_progress(&run_id, report.clone()) {
                    Ok(actions) => return host.carry_out_child(actions),
                    Err(e) => host.child_result(&run_id, Err(e)),
                }
            }
            host.log_error(&format!("a milestone of {run_id} was lost: storage kept failing"));
        });
    }

    fn try_progress(&self, run_id: &str, report: Report) -> Result<Vec<ChildAction>, crate::store::StoreError> {
        let streaming = self.0.chat.is_streaming(run_id);
        self.0.child.borrow_mut().report_progress(
            self.sql(),
            run_id,
            report,
            streaming,
            &|| self.0.io.random_id(),
            self.now(),
        )
    }

    /// The child engine's deadline came: held progress whose window closed goes out.
    pub(crate) fn child_timeout(&self, now: i64) {
        let chat = &self.0.chat;
        let result = self.0.child.borrow_mut().handle_timeout(
            self.sql(),
            &|run_id| chat.is_streaming(run_id),
            &|| self.0.io.random_id(),
            now,
        );
        self.child_result("(progress)", result);
    }

    fn child_result(&self, run_id: &str, result: Result<Vec<ChildAction>, crate::store::StoreError>) {
        match result {
            Ok(actions) => self.carry_out_child(actions),
            Err(e) => {
                self.log_error(&format!("a step of {run_id} failed: {e}"));
                self.observe(
                    EventType::StorageFailed,
                    serde_json::json!({ "runId": run_id, "step": "child", "error": e.to_string() }),
                );
            }
        }
    }

    /// Runs the agent's turn for a run in the background; a cancel drops it (and cancels the
    /// child runs it dispatched), and its end is recorded.
    fn begin_turn(&self, run_id: String, input: Value, attempt: i64) {
        let cancel = CancelToken::new();
        self.0.turns.borrow_mut().insert(run_id.clone(), cancel.clone());
        let host = self.clone();
        self.spawn(async move {
            let begun = host.0.child.borrow_mut().turn_begins(host.sql(), &run_id);
            if let Err(e) = begun {
                host.storage_failed("child turn", &e);
            }
            let returned = {
                let work = host.hooks().run(&host, run_id.clone(), input, attempt, cancel.clone());
                let stop = cancel.cancelled();
                futures::pin_mut!(work, stop);
                match select(work, stop).await {
                    Either::Left((result, _)) => Some(result),
                    Either::Right(_) => None,
                }
            };
            let returned = returned.map(|r| r.map(|out| (out.summary, out.output)));
            let cancelled = cancel.is_cancelled().then(|| cancel.reason());
            // The child runs this turn dispatched end with it when it was cancelled.
            let dispatched = host.0.turn_runs.borrow_mut().remove(&run_id).unwrap_or_default();
            if cancelled.is_some() {
                host.cancel_runs(&dispatched, "the run that dispatched it was cancelled").await;
            }
            // The end is one unit: a failed statement leaves the run as it was, so it is taken
            // again after a pause, and given up (the run healed as after a restart) when storage
            // keeps failing. The turn counts as running until its end is recorded (a clear waits
            // for that, so nothing it writes survives the clear).
            let _ended = TurnEnded { host: host.clone(), run_id: run_id.clone() };
            for pause in END_RETRIES_MS {
                let streaming = host.0.chat.is_streaming(&run_id);
                let new_id = || host.0.io.random_id();
                let result = host.0.child.borrow_mut().turn_finished(
                    host.sql(),
                    &run_id,
                    returned.clone(),
                    cancelled.clone(),
                    streaming,
                    &new_id,
                    host.now(),
                );
                match result {
                    Ok(actions) => return host.carry_out_child(actions),
                    Err(e) => host.child_result(&run_id, Err(e)),
                }
                host.0.io.sleep(pause).await;
            }
            let actions = host.0.child.borrow_mut().turn_lost(&run_id);
            host.carry_out_child(actions);
        });
    }
}
