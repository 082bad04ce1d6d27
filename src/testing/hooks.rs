//! The agent's hooks as the kit sees them: each call forwarded to the agent unchanged, and the
//! ones the contract bounds counted (the finish hook once per run, the detached handler per
//! attempt).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use serde_json::Value;

use super::world::ObjectRef;
use crate::agent::{Refusal, SubAgent};
use crate::cancel::CancelToken;
use crate::host::core::Host;
use crate::host::hooks::{Hooks, LocalFuture};
use crate::host::{HttpRequest, HttpResponse, TurnOutput};
use crate::observability::ObservabilityEvent;
use crate::types::{Milestone, ProgressSnapshot, RunInfo, RunResult, ScheduledTask};

/// Which run a hook call is of: its parent, its id and when it started (a run id dispatched
/// again after a clear is another run).
pub(crate) type RunKey = (ObjectRef, String, i64);

/// Hook calls, by run.
#[derive(Debug, Default)]
pub(crate) struct HookCounts {
    pub(crate) finish: BTreeMap<RunKey, usize>,
    pub(crate) detached: BTreeMap<RunKey, usize>,
    /// Finish hooks running now (a caller must not get the result before it returns).
    pub(crate) finishing: BTreeMap<RunKey, usize>,
}

/// An agent's hooks, counted.
pub(crate) struct Watched {
    pub(crate) inner: Rc<dyn Hooks>,
    pub(crate) counts: Rc<RefCell<HookCounts>>,
    pub(crate) object: ObjectRef,
}

impl Watched {
    fn key(&self, run: &RunInfo) -> RunKey {
        (self.object.clone(), run.run_id.clone(), run.started_at)
    }
}

impl Hooks for Watched {
    fn authorize<'a>(self: Rc<Self>, host: &Host, request: &'a HttpRequest) -> LocalFuture<'a, Result<(), Refusal>> {
        self.inner.clone().authorize(host, request)
    }

    fn call<'a>(
        self: Rc<Self>,
        host: &Host,
        method: &'a str,
        args: Vec<Value>,
    ) -> LocalFuture<'a, Result<Value, String>> {
        self.inner.clone().call(host, method, args)
    }

    fn on_request(self: Rc<Self>, host: &Host, request: HttpRequest) -> LocalFuture<'static, HttpResponse> {
        self.inner.clone().on_request(host, request)
    }

    fn on_schedule(self: Rc<Self>, host: &Host, task: ScheduledTask) -> LocalFuture<'static, ()> {
        self.inner.clone().on_schedule(host, task)
    }

    fn on_observability(&self, event: &ObservabilityEvent) {
        self.inner.on_observability(event)
    }

    fn validate_state_change(&self, next: &serde_json::Value) -> Result<(), String> {
        self.inner.validate_state_change(next)
    }

    fn on_state_changed<'a>(
        self: Rc<Self>,
        host: &Host,
        state: &'a serde_json::Value,
        source: &'a crate::StateSource,
    ) -> LocalFuture<'a, ()> {
        self.inner.clone().on_state_changed(host, state, source)
    }

    fn on_agent_tool_start<'a>(self: Rc<Self>, host: &Host, run: &'a RunInfo) -> LocalFuture<'a, ()> {
        self.inner.clone().on_agent_tool_start(host, run)
    }

    fn on_agent_tool_finish<'a>(
        self: Rc<Self>,
        host: &Host,
        run: &'a RunInfo,
        result: &'a RunResult,
    ) -> LocalFuture<'a, ()> {
        let key = self.key(run);
        *self.counts.borrow_mut().finish.entry(key.clone()).or_default() += 1;
        *self.counts.borrow_mut().finishing.entry(key.clone()).or_default() += 1;
        let hook = self.inner.clone().on_agent_tool_finish(host, run, result);
        let counts = self.counts.clone();
        Box::pin(async move {
            // Counted down when the hook returns, or when its object's crash drops it.
            let _done = Finishing { counts, key };
            hook.await;
        })
    }

    fn on_progress<'a>(
        self: Rc<Self>,
        host: &Host,
        run: &'a RunInfo,
        progress: &'a ProgressSnapshot,
    ) -> LocalFuture<'a, ()> {
        self.inner.clone().on_progress(host, run, progress)
    }

    fn on_detached_finish<'a>(
        self: Rc<Self>,
        host: &Host,
        handler: &'a Value,
        run: &'a RunInfo,
        result: &'a RunResult,
    ) -> LocalFuture<'a, Result<(), String>> {
        *self.counts.borrow_mut().detached.entry(self.key(run)).or_default() += 1;
        self.inner.clone().on_detached_finish(host, handler, run, result)
    }

    fn format_detached_completion(&self, run: &RunInfo, result: &RunResult) -> String {
        self.inner.format_detached_completion(run, result)
    }

    fn should_keep_recovering(&self, run: &crate::RecoveryAttempt) -> bool {
        self.inner.should_keep_recovering(run)
    }

    fn format_detached_milestone(&self, run: &RunInfo, milestone: &Milestone) -> String {
        self.inner.format_detached_milestone(run, milestone)
    }

    fn on_before_sub_agent<'a>(
        self: Rc<Self>,
        host: &Host,
        request: &'a HttpRequest,
        child: &'a SubAgent,
    ) -> LocalFuture<'a, Option<HttpResponse>> {
        self.inner.clone().on_before_sub_agent(host, request, child)
    }

    fn run_chat_turn(
        self: Rc<Self>,
        host: &Host,
        request_id: String,
        sender: Option<String>,
    ) -> LocalFuture<'static, ()> {
        self.inner.clone().run_chat_turn(host, request_id, sender)
    }

    fn continue_chat_turn(
        self: Rc<Self>,
        host: &Host,
        turn: crate::chat::journal::OpenTurn,
        max_attempts: u32,
        slot: Option<crate::host::chat::TurnSlot>,
        fresh: bool,
    ) -> LocalFuture<'static, crate::host::chat::ChatEnd> {
        self.inner.clone().continue_chat_turn(host, turn, max_attempts, slot, fresh)
    }

    fn run(
        self: Rc<Self>,
        host: &Host,
        run_id: String,
        input: Value,
        attempt: i64,
        cancel: CancelToken,
    ) -> LocalFuture<'static, Result<TurnOutput, String>> {
        self.inner.clone().run(host, run_id, input, attempt, cancel)
    }
}

struct Finishing {
    counts: Rc<RefCell<HookCounts>>,
    key: RunKey,
}

impl Drop for Finishing {
    fn drop(&mut self) {
        let mut counts = self.counts.borrow_mut();
        if let Some(n) = counts.finishing.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                counts.finishing.remove(&self.key);
            }
        }
    }
}
