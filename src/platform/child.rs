//! The child host: binds [`crate::child::runs`] to a Durable Object.
//!
//! A child serves its parent only (the Worker entry never routes here): `start` begins a run
//! and returns at once while the turn runs on; `tail` streams the stored chunks after a cursor
//! and then the live ones, with no gap and no duplicate between the two (the log is read and
//! the subscriber registered in one synchronous step, and every chunk is stored and fanned out
//! in one synchronous step); `inspect` and `cancel` do what they say.

use std::cell::RefCell;
use std::collections::HashMap;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use futures::channel::mpsc;
use futures::future::{select, Either};
use futures::{Stream, StreamExt};
use serde_json::Value;
use worker::{Delay, Env, Method, Request, Response, State};

use super::{json_error, now_ms, random_id, DoSql};
use crate::cancel::{CancelToken, Cancelled};
use crate::child::runs::{ChildRun, ChildRuns, ChildStatus};
use crate::protocol::child_api::{CancelRequest, StartReply, StartRequest};
use crate::protocol::chunk::{self, Progress};
use crate::protocol::tail::{ChunkKind, OutcomeStatus, RunOutcome, TailLine};
use crate::store::meta;

/// What a finished turn hands back.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TurnOutput {
    /// Short text for display and for the parent's model.
    pub summary: String,
    /// Structured output, when the agent has one.
    pub output: Option<Value>,
}

/// A child agent: runs one turn per run.
#[allow(async_fn_in_trait)] // Workers are single-threaded; no `Send` bound is wanted.
pub trait ChildAgent: 'static {
    /// The class name (`Researcher`): the `agentType` of its runs.
    const CLASS: &'static str;

    /// Runs the turn for `turn.input()`, streaming chunks through [`Turn::emit`]. An `Err`
    /// ends the run as `error` with that message. A cancel drops this future.
    async fn run(&self, turn: &Turn) -> Result<TurnOutput, String>;
}

struct LiveRun {
    subscribers: Vec<mpsc::UnboundedSender<Vec<u8>>>,
    next_index: i64,
    cancel: CancelToken,
}

struct ChildCore {
    state: State,
    env: Env,
    sql: DoSql,
    live: RefCell<HashMap<String, LiveRun>>,
}

const LOST_TURN: &str =
    "the child's turn stopped when its Durable Object restarted; its partial output is kept, not re-run";

impl ChildCore {
    fn runs(&self) -> ChildRuns<'_, DoSql> {
        ChildRuns::new(&self.sql)
    }

    /// Stores a chunk and fans it out to the tails, in one synchronous step.
    fn emit(&self, run_id: &str, kind: ChunkKind, body: String) -> bool {
        let mut live = self.live.borrow_mut();
        let Some(run) = live.get_mut(run_id) else { return false };
        let index = match kind {
            ChunkKind::Progress => None,
            ChunkKind::Stored | ChunkKind::Milestone => {
                let index = run.next_index;
                if let Err(e) = self.runs().append_chunk(run_id, index, kind, &body) {
                    worker::console_error!("agent-tools: storing chunk {index} of {run_id} failed: {e}");
                    return false;
                }
                run.next_index += 1;
                Some(index)
            }
        };
        let line = TailLine::Chunk { i: index, k: kind, b: body }.to_line().into_bytes();
        run.subscribers.retain(|s| s.unbounded_send(line.clone()).is_ok());
        true
    }

    /// Records the outcome (unless the run already ended), sends the `end` line to every tail
    /// and closes them.
    fn seal(&self, run_id: &str, outcome: &RunOutcome) {
        if let Err(e) = self.runs().finish(run_id, outcome, now_ms()) {
            worker::console_error!("agent-tools: sealing {run_id} failed: {e}");
        }
        let stored = self.runs().get(run_id).ok().flatten().and_then(|r| r.outcome());
        let line = TailLine::End { outcome: stored.unwrap_or_else(|| outcome.clone()) }.to_line().into_bytes();
        if let Some(run) = self.live.borrow_mut().remove(run_id) {
            for s in run.subscribers {
                let _ = s.unbounded_send(line.clone());
            }
        }
    }

    /// A `starting`/`running` row with no turn in this instance lost its turn in a restart:
    /// seal it with a clear error rather than leave it running forever.
    fn reconcile(&self, run: ChildRun) -> ChildRun {
        if run.status.is_terminal() || self.live.borrow().contains_key(&run.run_id) {
            return run;
        }
        let outcome =
            RunOutcome { status: OutcomeStatus::Error, summary: None, output: None, error: Some(LOST_TURN.into()) };
        self.seal(&run.run_id, &outcome);
        self.runs().get(&run.run_id).ok().flatten().unwrap_or(run)
    }
}

/// The running turn, as the agent sees it.
pub struct Turn {
    core: Rc<ChildCore>,
    run_id: String,
    input: Value,
    cancel: CancelToken,
}

impl Turn {
    /// The run id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }
    /// The input the parent dispatched.
    pub fn input(&self) -> &Value {
        &self.input
    }
    /// The Worker environment (vars, secrets, bindings).
    pub fn env(&self) -> &Env {
        &self.core.env
    }
    /// Whether the run was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }
    /// Resolves when the run is cancelled.
    pub fn cancelled(&self) -> Cancelled {
        self.cancel.cancelled()
    }

    /// Streams one `UIMessageChunk` (JSON): stored in the run's log, then sent to every tail.
    /// Returns `false` once the run has ended.
    pub fn emit(&self, body: String) -> bool {
        self.core.emit(&self.run_id, ChunkKind::Stored, body)
    }

    /// Reports progress. With a `milestone` it is durable: stored with the next per-run
    /// sequence and kept in the log. Otherwise it is transient: sent live, and the latest
    /// snapshot kept on the run row (`data` only with `persist`).
    pub fn report_progress(&self, progress: Progress, persist: bool) {
        let now = now_ms();
        let runs = self.core.runs();
        if let Some(name) = progress.milestone.clone() {
            match runs.add_milestone(&self.run_id, &name, progress.data.as_ref(), now) {
                Ok(sequence) => {
                    self.core.emit(
                        &self.run_id,
                        ChunkKind::Milestone,
                        chunk::milestone(&name, sequence, now, &progress),
                    );
                }
                Err(e) => worker::console_error!("agent-tools: milestone {name} of {} failed: {e}", self.run_id),
            }
            return;
        }
        let mut snapshot = progress.clone();
        if !persist {
            snapshot.data = None;
        }
        if let Ok(snapshot) = serde_json::to_value(&snapshot) {
            if let Err(e) = runs.record_progress(&self.run_id, &snapshot, now) {
                worker::console_error!("agent-tools: progress of {} failed: {e}", self.run_id);
            }
        }
        self.core.emit(&self.run_id, ChunkKind::Progress, chunk::progress(&random_id(), &progress));
    }

    /// Waits `ms` milliseconds, or less if the run is cancelled meanwhile.
    pub async fn pause(&self, ms: u64) {
        if ms == 0 {
            return;
        }
        let delay = Delay::from(Duration::from_millis(ms));
        let cancelled = self.cancel.cancelled();
        futures::pin_mut!(delay, cancelled);
        select(delay, cancelled).await;
    }
}

/// Binds a [`ChildAgent`] to its Durable Object. Delegate `fetch` to [`ChildHost::fetch`].
pub struct ChildHost<C: ChildAgent> {
    core: Rc<ChildCore>,
    agent: Rc<C>,
}

type BodyStream = Pin<Box<dyn Stream<Item = worker::Result<Vec<u8>>>>>;

impl<C: ChildAgent> ChildHost<C> {
    /// Creates the host and its tables.
    pub fn new(state: State, env: Env, agent: C) -> Self {
        let sql = DoSql(state.storage().sql());
        let runs = ChildRuns::new(&sql);
        if let Err(e) = runs.migrate().and_then(|_| crate::store::Sql::batch(&sql, meta::SCHEMA)) {
            worker::console_error!("agent-tools: child schema failed: {e}");
        }
        let core = Rc::new(ChildCore { state, env, sql, live: RefCell::new(HashMap::new()) });
        Self { core, agent: Rc::new(agent) }
    }

    /// The agent.
    pub fn agent(&self) -> &C {
        &self.agent
    }

    /// Serves the parent's requests.
    pub async fn fetch(&self, mut req: Request) -> worker::Result<Response> {
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
            (Method::Get, "/_agent_tools/inspect") => self.inspect(&run_id),
            (Method::Post, "/_agent_tools/cancel") => match req.json::<CancelRequest>().await {
                Ok(cancel) => self.cancel(cancel),
                Err(e) => json_error(400, format!("malformed cancel request: {e}")),
            },
            (_, path) => json_error(404, format!("{} has no route {path}", C::CLASS)),
        }
    }

    fn start(&self, start: StartRequest) -> worker::Result<Response> {
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
        if begin {
            self.begin_turn(run);
        }
        Response::from_json(&StartReply { created, status: status.into() })
    }

    fn begin_turn(&self, run: ChildRun) {
        let cancel = CancelToken::new();
        let next_index = self.core.runs().next_index(&run.run_id).unwrap_or(0);
        self.core
            .live
            .borrow_mut()
            .insert(run.run_id.clone(), LiveRun { subscribers: Vec::new(), next_index, cancel: cancel.clone() });
        let core = self.core.clone();
        let agent = self.agent.clone();
        self.core.state.wait_until(async move {
            let _ = core.runs().mark_running(&run.run_id);
            let turn =
                Turn { core: core.clone(), run_id: run.run_id.clone(), input: run.input, cancel: cancel.clone() };
            let outcome = {
                let work = agent.run(&turn);
                let stop = cancel.cancelled();
                futures::pin_mut!(work, stop);
                match select(work, stop).await {
                    Either::Left((Ok(out), _)) => RunOutcome {
                        status: OutcomeStatus::Completed,
                        summary: Some(out.summary),
                        output: out.output,
                        error: None,
                    },
                    Either::Left((Err(message), _)) => {
                        turn.emit(chunk::error(&message));
                        RunOutcome { status: OutcomeStatus::Error, summary: None, output: None, error: Some(message) }
                    }
                    Either::Right(((), _)) => {
                        let reason = cancel.reason();
                        turn.emit(chunk::abort(reason.as_deref()));
                        RunOutcome { status: OutcomeStatus::Aborted, summary: None, output: None, error: reason }
                    }
                }
            };
            core.seal(&run.run_id, &outcome);
        });
    }

    fn tail(&self, run_id: &str, after: i64) -> worker::Result<Response> {
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
            .map(|c| TailLine::Chunk { i: Some(c.index), k: c.kind, b: c.body }.to_line().into_bytes())
            .collect();
        let body: BodyStream = match self.core.live.borrow_mut().get_mut(run_id) {
            Some(live) => {
                let (tx, rx) = mpsc::unbounded();
                for line in lines {
                    let _ = tx.unbounded_send(line);
                }
                live.subscribers.push(tx);
                Box::pin(rx.map(Ok))
            }
            None => {
                let mut lines = lines;
                if let Some(outcome) = run.outcome() {
                    lines.push(TailLine::End { outcome }.to_line().into_bytes());
                }
                Box::pin(futures::stream::iter(lines).map(Ok))
            }
        };
        let mut resp = Response::from_stream(body)?;
        resp.headers_mut().set("content-type", "application/x-ndjson")?;
        Ok(resp)
    }

    fn inspect(&self, run_id: &str) -> worker::Result<Response> {
        if let Ok(Some(run)) = self.core.runs().get(run_id) {
            self.core.reconcile(run);
        }
        match self.core.runs().inspect(run_id) {
            Ok(inspection) => Response::from_json(&inspection),
            Err(e) => json_error(500, e.to_string()),
        }
    }

    fn cancel(&self, cancel: CancelRequest) -> worker::Result<Response> {
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
        Response::from_json(&serde_json::json!({ "status": status }))
    }
}

fn status_str(s: ChildStatus) -> &'static str {
    match s {
        ChildStatus::Starting => "starting",
        ChildStatus::Running => "running",
        ChildStatus::Completed => "completed",
        ChildStatus::Error => "error",
        ChildStatus::Aborted => "aborted",
    }
}
