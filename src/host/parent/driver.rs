//! Carries out what the parent engine decides: calls children, reads their tails, arms the
//! alarm and the one timer, sends frames to clients, resolves waiting callers, calls hooks and
//! delivers detached outcomes; and feeds what happened back to the engine. No decision about a
//! run is made here.

use futures::future::{select, Either};
use futures::StreamExt;

use crate::cancel::CancelToken;
use crate::host::core::Host;
use crate::host::{BoundedHook, ChildCall, ChildReply};
use crate::observability::{EventType, ObservabilityEvent};
use crate::parent::engine::{ChildAddress, HookCall, NoticeOf, ParentAction, ParentEvent, StartError, TailOpenError};
use crate::protocol::child_api::{CancelRequest, InspectionReply, StartRequest};
use crate::protocol::tail::LineSplitter;
use crate::protocol::InterruptedReason;

impl Host {
    /// Feeds what happened to the parent engine and carries out what it says.
    pub(crate) fn feed(&self, event: ParentEvent) {
        let now = self.now();
        #[cfg(all(test, not(target_arch = "wasm32")))]
        let traced = crate::host::io::TRACE.with(|t| t.get()).then(|| format!("{event:?}"));
        let actions = self.0.parent.borrow_mut().handle(self.parent_sql(), event, now);
        #[cfg(all(test, not(target_arch = "wasm32")))]
        if let Some(event) = traced {
            self.log(&format!("trace: {event} -> {actions:?}"));
        }
        self.carry_out(actions);
    }

    /// Carries out the engine's actions: the immediate ones (frames to clients, calls to
    /// children, results to callers) at once and in order, so frames leave in the order the
    /// engine numbered them; the ones that run the agent's code (hooks, deliveries, notices, chat
    /// turns) after them, in order, in a background task. Then the one timer is armed for the
    /// engines' next deadline, and the durable alarm for the parent engine's
    /// ([`crate::parent::engine::ParentEngine::poll_alarm`]).
    pub(crate) fn carry_out(&self, actions: Vec<ParentAction>) {
        let mut deferred = Vec::new();
        let mut frames = Vec::new();
        for action in actions {
            if let ParentAction::Broadcast(text) = action {
                // Consecutive frames go out together: the sockets are looked up once.
                frames.push(text);
                continue;
            }
            if !frames.is_empty() {
                self.broadcast_all(std::mem::take(&mut frames).into_iter());
            }
            match action {
                ParentAction::StartChild { run_id, gen, to, request } => self.start_child(run_id, gen, to, request),
                ParentAction::OpenTail { run_id, gen, to, after } => self.open_tail(run_id, gen, to, after),
                ParentAction::CloseTail { run_id } => {
                    if let Some(token) = self.0.tails.borrow_mut().remove(&run_id) {
                        token.cancel(None);
                    }
                }
                ParentAction::InspectChild { run_id, gen, to } => {
                    let call = self.0.io.call_child(&to, ChildCall::Inspect { run_id: run_id.clone() });
                    let host = self.clone();
                    self.spawn(async move {
                        let result = inspection(call.await);
                        host.feed(ParentEvent::Inspected { run_id, gen, result });
                    });
                }
                ParentAction::CancelChild { run_id, to, reason } => {
                    let call = CancelRequest { run_id: run_id.clone(), reason };
                    let call = self.0.io.call_child(&to, ChildCall::Cancel(call));
                    let host = self.clone();
                    self.spawn(async move {
                        if let Err(e) = done(call.await) {
                            host.log_error(&format!("cancelling {run_id} at the child failed: {e}"));
                        }
                    });
                }
                ParentAction::ClearChild { run_id, to, gen } => {
                    let call = self.0.io.call_child(&to, ChildCall::Clear);
                    let host = self.clone();
                    self.spawn(async move {
                        let result = done(call.await);
                        host.feed(ParentEvent::ChildCleared { run_id, gen, result });
                    });
                }
                ParentAction::Resolve { run_id, result } => {
                    for waiter in self.0.waiters.borrow_mut().remove(&run_id).unwrap_or_default() {
                        let _ = waiter.send(result.clone());
                    }
                }
                ParentAction::Transcript => self.0.chat.broadcast_transcript(None),
                ParentAction::Observe(kind, payload) => self.observe(kind, payload),
                ParentAction::Broadcast(_) => {}
                other => deferred.push(other),
            }
        }
        if !frames.is_empty() {
            self.broadcast_all(frames.into_iter());
        }
        // The alarm, when the engine wants it sooner than it is armed for.
        let alarm = self.0.parent.borrow().poll_alarm();
        if let Some(at) = alarm.filter(|at| self.0.alarm_at.get().is_none_or(|armed| armed > *at)) {
            let host = self.clone();
            self.spawn(async move { host.arm_alarm_at(at).await });
        }
        if !deferred.is_empty() {
            let host = self.clone();
            self.spawn(async move {
                for action in deferred {
                    host.run_deferred(action).await;
                }
            });
        }
        self.rearm_timer();
    }

    /// Runs what calls the agent's own code, then tells the engine it returned.
    async fn run_deferred(&self, action: ParentAction) {
        match action {
            ParentAction::Hook(HookCall::Start(run)) => self.hooks().on_agent_tool_start(self, &run).await,
            ParentAction::Hook(HookCall::Finish(run, result, gen)) => {
                let running = self.0.io.hook_begins(BoundedHook::Finish, &run);
                self.hooks().on_agent_tool_finish(self, &run, &result).await;
                drop(running);
                self.feed(ParentEvent::FinishHookDone { run_id: run.run_id, gen });
            }
            ParentAction::Hook(HookCall::Progress(run, progress)) => {
                self.hooks().on_progress(self, &run, &progress).await
            }
            ParentAction::Deliver { run, result, slot, gen, attempt, handler } => {
                let running = self.0.io.hook_begins(BoundedHook::Delivery, &run);
                let outcome = self.hooks().on_detached_finish(self, &handler, &run, &result).await;
                drop(running);
                self.feed(ParentEvent::DeliveryDone { run_id: run.run_id, slot, gen, attempt, result: outcome });
            }
            ParentAction::Notice(notice) => {
                let text = match &notice.of {
                    NoticeOf::Outcome(result) => self.0.hooks.format_detached_completion(&notice.run, result),
                    NoticeOf::Milestone(milestone) => self.0.hooks.format_detached_milestone(&notice.run, milestone),
                };
                let now = self.now();
                let actions = self.0.parent.borrow_mut().post_notice(self.parent_sql(), notice, text, now);
                self.carry_out(actions);
            }
            ParentAction::RunChatTurn { request_id, delivery } => {
                self.run_chat_turn(request_id, None).await;
                if let Some((run_id, delivery)) = delivery {
                    self.feed(delivery.done(run_id, Ok(())));
                }
            }
            // Carried out at once by `carry_out`.
            _ => {}
        }
    }

    /// Arms the object's one timer for the engines' next deadline (an earlier one already
    /// armed stays: when it fires it finds nothing due and arms the next). A timer armed for a
    /// later time is cancelled: no sleeping task outlives its purpose.
    pub(crate) fn rearm_timer(&self) {
        let parent = self.0.parent.borrow().poll_timeout();
        let child = self.0.child.borrow().poll_timeout();
        let Some(at) = parent.into_iter().chain(child).min() else { return };
        if self.0.timer_at.get().is_some_and(|armed| armed <= at) {
            return;
        }
        let token = CancelToken::new();
        if let Some(earlier) = self.0.timer.replace(Some(token.clone())) {
            earlier.cancel(None);
        }
        self.0.timer_at.set(Some(at));
        let sleep = self.0.io.sleep((at - self.now()).max(1) as u64);
        let host = self.clone();
        self.spawn(async move {
            futures::future::select(sleep, Box::pin(token.cancelled())).await;
            // A later arm for an earlier time took over.
            if token.is_cancelled() {
                return;
            }
            host.0.timer.replace(None);
            host.0.timer_at.set(None);
            let now = host.now();
            let actions = host.0.parent.borrow_mut().handle_timeout(host.parent_sql(), now);
            host.carry_out(actions);
            host.child_timeout(now);
            host.rearm_timer();
        });
    }

    /// Starts a child's run; its answer is the run's tail, kept for the engine's next
    /// `OpenTail` of that run (one round trip for both).
    fn start_child(&self, run_id: String, gen: u64, to: ChildAddress, request: StartRequest) {
        let tail_after = request.tail_after.unwrap_or(-1);
        let call = self.0.io.call_child(&to, ChildCall::Start(request));
        let host = self.clone();
        self.spawn(async move {
            let result = match call.await {
                Ok(ChildReply::Tail(stream)) => {
                    host.0.started_tails.borrow_mut().insert(run_id.clone(), (tail_after, stream));
                    Ok(())
                }
                Ok(ChildReply::Refused { status, body }) if status >= 500 => {
                    Err(StartError::Failed(format!("{} failed to start the run ({status}): {body}", to.binding)))
                }
                Ok(ChildReply::Refused { status, body }) => {
                    Err(StartError::Refused(format!("{} refused to start the run ({status}): {body}", to.binding)))
                }
                Ok(_) => Err(StartError::Refused(format!("{} answered the start out of turn", to.binding))),
                Err(e) => Err(StartError::Unreachable(format!("{}: {e}", to.binding))),
            };
            host.feed(ParentEvent::StartReplied { run_id: run_id.clone(), gen, result });
            // Not taken (the run ended meanwhile): dropping it closes the tail.
            host.0.started_tails.borrow_mut().remove(&run_id);
        });
    }

    /// Emits an observability event: a JSON log line and the agent's hook.
    pub(crate) fn observe(&self, kind: EventType, payload: serde_json::Value) {
        let event = ObservabilityEvent {
            kind,
            agent: self.0.class.to_owned(),
            name: self.name().unwrap_or_default(),
            payload,
            timestamp: crate::types::time_of(self.now()),
        };
        self.log(&event.to_line());
        self.0.hooks.on_observability(&event);
    }

    /// Reads a child's tail until it ends or the engine closes it, feeding every read's lines.
    fn open_tail(&self, run_id: String, gen: u64, to: ChildAddress, after: i64) {
        let stop = CancelToken::new();
        if let Some(old) = self.0.tails.borrow_mut().insert(run_id.clone(), stop.clone()) {
            old.cancel(None);
        }
        let started = self.0.started_tails.borrow_mut().remove(&run_id).filter(|(from, _)| *from == after);
        let call = match started {
            Some(_) => None,
            None => Some(self.0.io.call_child(&to, ChildCall::Tail { run_id: run_id.clone(), after })),
        };
        let host = self.clone();
        self.spawn(async move {
            let opened = match (started, call) {
                (Some((_, stream)), _) => Ok(stream),
                (None, Some(call)) => match call.await {
                    Ok(ChildReply::Tail(stream)) => Ok(stream),
                    Ok(ChildReply::Refused { status, .. }) => Err(TailOpenError::Status(status)),
                    Ok(_) => Err(TailOpenError::Unreachable("the child answered out of turn".into())),
                    Err(e) => Err(TailOpenError::Unreachable(e)),
                },
                (None, None) => Err(TailOpenError::Unreachable("no tail was asked for".into())),
            };
            let mut body = match opened {
                Ok(body) => body,
                Err(e) => return host.feed(ParentEvent::TailOpened { run_id, gen, result: Err(e) }),
            };
            host.feed(ParentEvent::TailOpened { run_id: run_id.clone(), gen, result: Ok(()) });
            let mut splitter = LineSplitter::default();
            loop {
                let next = body.next();
                let stopped = stop.cancelled();
                futures::pin_mut!(next, stopped);
                let bytes = match select(next, stopped).await {
                    Either::Left((Some(Ok(bytes)), _)) => bytes,
                    Either::Left(_) => break,
                    Either::Right(_) => return,
                };
                let pushed = match splitter.push(&bytes) {
                    Ok(pushed) => pushed,
                    Err(too_long) => {
                        let error = too_long.to_string();
                        return host.feed(ParentEvent::TailRefused { run_id, gen, error });
                    }
                };
                let mut lines = Vec::new();
                for line in pushed {
                    match line {
                        Ok(line) => lines.push(line),
                        Err(e) => host.log_error(&format!("garbled tail line from {run_id}: {e}")),
                    }
                }
                if !lines.is_empty() {
                    host.feed(ParentEvent::TailBatch { run_id: run_id.clone(), gen, lines });
                }
                if stop.is_cancelled() {
                    return;
                }
            }
            if !stop.is_cancelled() {
                host.feed(ParentEvent::TailEnded { run_id, gen });
            }
        });
    }
}

/// An inspection's answer: `Ok(None)` when the child does not know the run (yet); any failure
/// to ask is `inspect-failed`. The engine times the inspection out itself.
fn inspection(reply: Result<ChildReply, String>) -> Result<Option<InspectionReply>, InterruptedReason> {
    match reply {
        Ok(ChildReply::Inspection(reply)) => Ok(reply.map(|reply| *reply)),
        _ => Err(InterruptedReason::InspectFailed),
    }
}

/// Whether a cancel or a clear was done.
fn done(reply: Result<ChildReply, String>) -> Result<(), String> {
    match reply {
        Ok(ChildReply::Done(_)) => Ok(()),
        Ok(ChildReply::Refused { status, body }) => Err(format!("the child answered {status}: {body}")),
        Ok(_) => Err("the child answered out of turn".to_owned()),
        Err(e) => Err(e),
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use std::time::Duration;

    use crate::child::progress::Report;
    use crate::protocol::child_api::StartRequest;
    use crate::protocol::chunk::Progress;
    use crate::testing::world::ObjectRef;
    use crate::testing::World;
    use crate::types::AgentClass;

    #[derive(Default)]
    struct Solo;

    impl AgentClass for Solo {
        const CLASS: &'static str = "Solo";
        const BINDING: &'static str = "Solo";
    }

    impl crate::Agent for Solo {}

    /// The object's one timer: a timer armed for an earlier time replaces the one armed for a
    /// later time, and the replaced one's task ends at once (it does not sleep until its time).
    #[test]
    fn an_earlier_timer_replaces_a_later_one_and_its_task_ends() {
        let world = World::new().agent::<Solo>();
        let host = world.host::<Solo>("t").host;
        let (_, _, owner) = world.0.live(&ObjectRef::of::<Solo>("t"));
        let report = || Report { progress: Progress { fraction: Some(0.5), ..Progress::default() }, persist: false };
        let id = || "id".to_owned();
        for run in ["a", "b"] {
            let start = StartRequest {
                run_id: run.into(),
                input: Default::default(),
                parent_class: "P".into(),
                parent_name: "p".into(),
                child_name: format!("P/p/{run}"),
                terminal_only: false,
                tail_after: None,
            };
            host.0.child.borrow_mut().start(host.sql(), &start, world.now_ms()).unwrap();
        }
        let report_now = |run: &str| {
            host.0.child.borrow_mut().report_progress(host.sql(), run, report(), false, &id, world.now_ms()).unwrap();
        };
        // Each run's first report goes out; a second within its window is held to the window's end.
        report_now("a");
        world.advance(Duration::from_millis(150));
        report_now("b");
        world.advance(Duration::from_millis(10));
        report_now("b"); // held until 150 + 200
        host.rearm_timer();
        assert_eq!(host.0.timer_at.get(), Some(world.now_ms() + 190));
        assert_eq!(world.0.exec.tasks_of(owner), 1, "one timer sleeps");
        report_now("a"); // held until 0 + 200: earlier
        host.rearm_timer();
        assert_eq!(host.0.timer_at.get(), Some(world.now_ms() + 40));
        world.advance(Duration::ZERO);
        assert_eq!(world.0.exec.tasks_of(owner), 1, "the later timer's task ended when it was replaced");
    }
}
