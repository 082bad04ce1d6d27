//! The simulated world: one parent, its children, its clients, a clock and a network, all
//! driven by one seed. Each object keeps its storage (a real SQLite database) across a crash and
//! loses its memory (its engine, its turn, its connections), exactly as a Durable Object does.
//! The engines are the ones the Worker runs; this file plays the platform's part.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use serde_json::{json, Value};

use super::reducer::Client as Reducer;
use crate::chat::message::MessageBuilder;
use crate::chat::store::{Messages, OpenStreams};
use crate::child::engine::{ChildAction, ChildEngine, SubscriberId, TailError};
use crate::child::progress::Report;
use crate::child::runs::ChildRuns;
use crate::parent::engine::{
    Admitted, Dispatch, HookCall, NoticeOf, ParentAction, ParentEngine, ParentEvent, StartError, TailOpenError,
    INSPECT_TIMEOUT_MS,
};
use crate::parent::registry::{NewRun, Registry};
use crate::protocol::child_api::{InspectionReply, StartRequest};
use crate::protocol::chunk::Progress;
use crate::protocol::tail::{ChunkKind, LineSplitter, OutcomeStatus, RunOutcome};
use crate::store::{meta, Sql, StoreError};
use crate::types::{AgentToolOptions, DetachedOptions, EventDelivery, RecoveryPolicy, RunResult, RunStatus};

/// A small, fast, seeded generator (SplitMix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % ((hi - lo + 1) as u64)) as i64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next() % 1_000_000) as f64 / 1_000_000.0 < p
    }
}

/// The parent's storage: a real SQLite database whose statements fail at random while faults
/// are on (`rate`), as a full disk or a storage hiccup would. A unit of work
/// ([`Sql::atomically`]) rolls back as a Durable Object's `transactionSync` does.
pub struct FaultyDb {
    /// The database.
    pub conn: rusqlite::Connection,
    rng: std::cell::RefCell<Rng>,
    /// The chance a statement fails now (0 outside the engine's calls).
    rate: std::cell::Cell<f64>,
    /// Statements failed so far.
    pub failures: std::cell::Cell<usize>,
}

impl FaultyDb {
    fn new(conn: rusqlite::Connection, seed: u64) -> Self {
        Self {
            conn,
            rng: std::cell::RefCell::new(Rng::new(seed ^ 0x5ee1)),
            rate: std::cell::Cell::new(0.0),
            failures: std::cell::Cell::new(0),
        }
    }

    fn fails(&self) -> Result<(), StoreError> {
        let rate = self.rate.get();
        if rate > 0.0 && self.rng.borrow_mut().chance(rate) {
            self.failures.set(self.failures.get() + 1);
            return Err(StoreError { message: "injected: the statement failed".into() });
        }
        Ok(())
    }
}

impl Sql for FaultyDb {
    fn exec(&self, sql: &str, params: &[crate::store::Value]) -> Result<Vec<crate::store::Row>, StoreError> {
        self.fails()?;
        self.conn.exec(sql, params)
    }

    fn batch(&self, sql: &str) -> Result<(), StoreError> {
        self.fails()?;
        self.conn.batch(sql)
    }

    fn atomically(&self, work: &mut dyn FnMut() -> Result<(), StoreError>) -> Result<(), StoreError> {
        self.conn.atomically(work)
    }
}

/// What a scripted child turn does.
#[derive(Debug, Clone)]
pub struct TurnScript {
    /// Words in its answer.
    pub words: usize,
    /// Pause between words, ms.
    pub step_ms: i64,
    /// After this many words, a silence of `stall_ms` (a slow or silent child).
    pub stall_after: Option<usize>,
    /// How long the silence lasts.
    pub stall_ms: i64,
    /// Report a milestone after the first word.
    pub milestone: bool,
}

/// How a detached run's handler behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    /// Succeeds.
    Ok,
    /// Fails on its first `n` attempts.
    FailFirst(i64),
    /// Always fails.
    Always,
}

/// The chunks a simulated child's tail reads at a time.
const SIM_TAIL_PAGE: usize = 3;

/// One dispatch the scenario makes.
#[derive(Debug, Clone)]
pub struct Planned {
    /// When.
    pub at: i64,
    /// Run id.
    pub run_id: String,
    /// Awaited (`None`) or detached with this handler.
    pub detached: Option<Handler>,
    /// The detached budgets (absolute, no-progress).
    pub budgets: (Option<u64>, Option<u64>),
    /// What the child's turn does.
    pub script: TurnScript,
    /// A detached run that tells the chat when it ends (instead of a handler).
    pub notify: bool,
    /// A detached run that surfaces its milestone in the chat.
    pub on_milestones: bool,
}

/// Something that happens at a time.
#[derive(Debug, Clone)]
enum Ev {
    Dispatch(usize),
    Redispatch(String),
    Cancel(String),
    /// An awaited run's callers give up (their signal is cancelled).
    Abandon(String),
    ClearFinished,
    /// A parent event, from I/O the parent incarnation `epoch` began.
    Parent {
        epoch: u64,
        event: ParentEvent,
    },
    Alarm,
    /// A request arriving at a child, sent by parent incarnation `epoch`.
    Child {
        run_id: String,
        epoch: u64,
        req: ChildReq,
    },
    /// The child's turn takes its next step.
    TurnStep {
        run_id: String,
        epoch: u64,
        attempt: i64,
    },
    /// The child's turn was cancelled and ends.
    TurnCancelled {
        run_id: String,
        epoch: u64,
        reason: Option<String>,
    },
    /// The child's one deadline (a coalescing window that holds progress back).
    ChildTimeout {
        run_id: String,
        epoch: u64,
    },
    /// The parent's one deadline ([`ParentEngine::poll_timeout`]).
    ParentTimeout {
        epoch: u64,
    },
    /// The agent's finish hook of a run returns (in parent incarnation `epoch`).
    HookReturns {
        run_id: String,
        epoch: u64,
    },
    /// A detached handler returns: it ran (`ok`: successfully), and the engine hears of it.
    Delivered {
        key: (String, String),
        /// How many times the run's id had been cleared when it was handed over (a delivery of
        /// a cleared run is not one of the run dispatched again under its id).
        clears: usize,
        ok: bool,
        epoch: u64,
        event: ParentEvent,
    },
    /// The child's turn yielded: its buffered chunks are stored and sent.
    FlushChunks {
        run_id: String,
        epoch: u64,
    },
    /// A line written to a tail arrives at the parent.
    Line {
        conn: u64,
        line: Vec<u8>,
    },
    /// A tail's stream ends at the parent.
    TailClosed {
        conn: u64,
    },
    CrashParent,
    CrashChild(String),
    BreakTail(String),
    Connect(usize),
    Drop(usize),
}

#[derive(Debug, Clone)]
enum ChildReq {
    Start(StartRequest, u64),
    Tail { after: i64, gen: u64 },
    Inspect { gen: u64 },
    Cancel(Option<String>),
    Clear,
}

/// A tail connection between a child and the parent.
#[derive(Debug, Clone)]
struct Conn {
    run_id: String,
    gen: u64,
    parent_epoch: u64,
    /// The incarnation of the child that holds the subscriber (its ids start again after a
    /// crash or a clear).
    child_epoch: u64,
    subscriber: Option<SubscriberId>,
    open: bool,
    /// When the last line arrives (lines on one connection keep their order).
    last_at: i64,
}

struct ChildObj {
    db: rusqlite::Connection,
    engine: Option<ChildEngine>,
    epoch: u64,
    turn: Option<Turn>,
    /// When its one timer is armed for.
    timer_at: Option<i64>,
}

#[derive(Debug, Clone)]
struct Turn {
    attempt: i64,
    script: TurnScript,
    next_word: usize,
    started: bool,
    builder_id: String,
}

/// A client of the parent: a stock reducer, connected or not.
pub struct SimClient {
    /// The reducer with its dedupe set (kept across reconnects, as the stock hook does).
    pub reducer: Reducer,
    /// Whether it is connected now.
    pub connected: bool,
    /// Whether it ever dropped and reconnected.
    pub reconnected: bool,
}

/// Everything the world observed, for the invariants.
#[derive(Default, Debug)]
pub struct Observed {
    /// Every frame content ever sent under `(run, sequence)` (live or replayed, `replay` aside).
    pub frames: BTreeMap<(String, i64), String>,
    /// A sequence reused for different content: `(run, sequence, first, second)`.
    pub reused: Vec<(String, i64, String, String)>,
    /// Live sequences of a run that did not increase: `(run, last, then)`.
    pub out_of_order: Vec<(String, i64, i64)>,
    /// `on_agent_tool_finish` calls per run.
    pub finish_hooks: BTreeMap<String, usize>,
    /// Delivery attempts per (run, slot), and those after a dead letter.
    pub deliveries: BTreeMap<(String, String), i64>,
    /// Successful deliveries per (run, slot).
    pub delivered: BTreeMap<(String, String), i64>,
    /// Attempts made past the limit.
    pub past_dead_letter: Vec<String>,
    /// Milestone notices posted per (run, name).
    pub notices: BTreeMap<(String, String), usize>,
    /// Milestone notices the engine offered per (run, name) (posted at most once each).
    pub notices_offered: BTreeMap<(String, String), usize>,
    /// Outcome notices posted per (run, status) (`notify` runs).
    pub notified: BTreeMap<(String, String), usize>,
    /// Runs whose finish hook is running.
    pub hooks_running: std::collections::BTreeSet<String>,
    /// Runs whose finish hook was called while a call of it was running.
    pub overlapping_hooks: Vec<String>,
    /// Runs whose caller got the result while the run's finish hook was still running.
    pub early_results: Vec<String>,
    /// How many times each run id was cleared.
    pub clears: BTreeMap<String, usize>,
    /// Frames broadcast after their run's hard terminal frame: `(run, terminal seq, frame)`.
    pub after_terminal: Vec<(String, i64, String)>,
    /// The same, in a replay.
    pub replay_after_terminal: Vec<(String, i64, String)>,
    /// Storage failures the engine reported, by run (`""` for those of no one run).
    pub storage_failures: BTreeMap<String, usize>,
    /// Results handed to awaited callers: (run, status).
    pub resolved: Vec<(String, RunStatus)>,
    /// The most live runs seen at once.
    pub max_live: i64,
    /// Crashes injected.
    pub crashes: usize,
    /// Runs recorded without their last chunks (their stream kept breaking off).
    pub drains_incomplete: std::collections::BTreeSet<String>,
    /// A trace of what happened, for a failing seed.
    pub trace: Vec<String>,
}

/// The world.
pub struct World {
    /// The generator.
    pub rng: Rng,
    /// Now, ms.
    pub now: i64,
    seq: u64,
    queue: BinaryHeap<Reverse<(i64, u64, usize)>>,
    events: Vec<Option<Ev>>,
    /// The parent's storage.
    pub parent_db: std::rc::Rc<FaultyDb>,
    /// The chance a statement of the parent's fails while faults are on.
    pub storage_fault_rate: f64,
    /// Whether I/O the engine moved past (a closed tail's lines, an earlier instance's answers,
    /// a reply sent twice) still reaches it, as a real network delivers it.
    pub hostile: bool,
    parent: Option<ParentEngine>,
    parent_epoch: u64,
    /// When the parent's one timer is armed for.
    parent_timer_at: Option<i64>,
    alarm_at: Option<i64>,
    children: BTreeMap<String, ChildObj>,
    conns: BTreeMap<u64, Conn>,
    next_conn: u64,
    /// The clients.
    pub clients: Vec<SimClient>,
    /// The last live sequence broadcast per run.
    last_live: BTreeMap<String, i64>,
    /// The sequence of each run's hard terminal frame, once broadcast.
    hard_ended: BTreeMap<String, i64>,
    /// Run ids with an awaited caller waiting.
    waiting: BTreeMap<String, usize>,
    /// The scenario's dispatches.
    pub planned: Vec<Planned>,
    options: AgentToolOptions,
    policy: RecoveryPolicy,
    /// The network drops a hop with this probability.
    pub drop_rate: f64,
    /// Faults stop after this time (the calm that lets everything settle).
    pub calm_after: i64,
    /// What was seen.
    pub observed: Observed,
    /// Whether the trace is kept (a replayed seed).
    pub tracing: bool,
    next_id: u64,
}

const PARENT: &str = "Parent";
const CHILD: &str = "Child";

fn memory() -> rusqlite::Connection {
    rusqlite::Connection::open_in_memory().expect("in-memory sqlite")
}

impl World {
    /// A world for a scenario.
    pub fn new(
        seed: u64,
        options: AgentToolOptions,
        policy: RecoveryPolicy,
        planned: Vec<Planned>,
        clients: usize,
    ) -> Self {
        let parent_db = memory();
        crate::parent::engine::migrate(&parent_db).expect("parent schema");
        meta::set(&parent_db, "name", "p").expect("parent name");
        parent_db.batch(crate::chat::store::SCHEMA).expect("chat schema");
        let parent_db = std::rc::Rc::new(FaultyDb::new(parent_db, seed));
        let mut world = Self {
            rng: Rng::new(seed),
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            events: Vec::new(),
            parent_db,
            storage_fault_rate: 0.0,
            hostile: false,
            parent: None,
            parent_epoch: 0,
            parent_timer_at: None,
            alarm_at: None,
            children: BTreeMap::new(),
            conns: BTreeMap::new(),
            next_conn: 0,
            clients: (0..clients)
                .map(|_| SimClient { reducer: Reducer::new(), connected: false, reconnected: false })
                .collect(),
            last_live: BTreeMap::new(),
            hard_ended: BTreeMap::new(),
            waiting: BTreeMap::new(),
            planned,
            options,
            policy,
            drop_rate: 0.0,
            calm_after: i64::MAX,
            observed: Observed::default(),
            tracing: false,
            next_id: 0,
        };
        for i in 0..world.planned.len() {
            let at = world.planned[i].at;
            world.schedule(at, Ev::Dispatch(i));
        }
        for i in 0..clients {
            world.schedule(0, Ev::Connect(i));
        }
        world
    }

    fn schedule(&mut self, at: i64, ev: Ev) {
        self.seq += 1;
        self.events.push(Some(ev));
        self.queue.push(Reverse((at.max(self.now), self.seq, self.events.len() - 1)));
    }

    fn trace(&mut self, what: impl FnOnce() -> String) {
        if self.tracing {
            let line = format!("{:>7} ms  {}", self.now, what());
            self.observed.trace.push(line);
        }
    }

    fn faults_allowed(&self) -> bool {
        self.now < self.calm_after
    }

    fn hop(&mut self) -> i64 {
        // Now and then a slow hop: answers overtake one another.
        if self.hostile && self.rng.chance(0.05) {
            return self.rng.range(100, 800);
        }
        self.rng.range(1, 15)
    }

    /// Delivers a child's answer to the parent, now and then twice.
    fn reply(&mut self, at: i64, epoch: u64, event: ParentEvent) {
        if self.hostile && self.rng.chance(0.15) {
            let again = at + self.rng.range(1, 3_000);
            self.schedule(again, Ev::Parent { epoch, event: event.clone() });
        }
        self.schedule(at, Ev::Parent { epoch, event });
    }

    fn dropped(&mut self) -> bool {
        self.faults_allowed() && self.rng.chance(self.drop_rate)
    }

    /// The run ids whose child still has a run row.
    pub fn children_holding_runs(&self) -> Vec<String> {
        self.children
            .iter()
            .filter(|(run_id, child)| matches!(ChildRuns::new(&child.db).get(run_id), Ok(Some(_))))
            .map(|(run_id, _)| run_id.clone())
            .collect()
    }

    /// Schedules a crash of the parent at `at`.
    pub fn crash_parent_at(&mut self, at: i64) {
        self.schedule(at, Ev::CrashParent);
    }

    /// Schedules a crash of the child of run `run_id` at `at`.
    pub fn crash_child_at(&mut self, at: i64, run_id: &str) {
        self.schedule(at, Ev::CrashChild(run_id.to_owned()));
    }

    /// Schedules a crash of the whole runtime at `at` (a deploy, a SIGKILL): the parent and
    /// every child at the same instant.
    pub fn crash_all_at(&mut self, at: i64) {
        self.schedule(at, Ev::CrashParent);
        for run_id in self.planned.iter().map(|p| p.run_id.clone()).collect::<Vec<_>>() {
            self.schedule(at, Ev::CrashChild(run_id));
        }
    }

    /// Schedules a broken tail of run `run_id` at `at`.
    pub fn break_tail_at(&mut self, at: i64, run_id: &str) {
        self.schedule(at, Ev::BreakTail(run_id.to_owned()));
    }

    /// Schedules client `i` to drop at `at` and come back at `back`.
    pub fn drop_client_at(&mut self, i: usize, at: i64, back: i64) {
        self.schedule(at, Ev::Drop(i));
        self.schedule(back, Ev::Connect(i));
    }

    /// Schedules a cancel, a re-dispatch, a clear.
    pub fn cancel_at(&mut self, at: i64, run_id: &str) {
        self.schedule(at, Ev::Cancel(run_id.to_owned()));
    }

    /// Schedules a dispatch of a known run id again.
    pub fn redispatch_at(&mut self, at: i64, run_id: &str) {
        self.schedule(at, Ev::Redispatch(run_id.to_owned()));
    }

    /// Dispatches over the cap wait for a slot instead of being refused.
    pub fn queue_admissions(&mut self) {
        self.options.admission = crate::types::Admission::Queue;
    }

    /// Schedules the callers of run `run_id` to give up at `at`.
    pub fn abandon_at(&mut self, at: i64, run_id: &str) {
        self.schedule(at, Ev::Abandon(run_id.to_owned()));
    }

    /// The runs with callers still waiting for their result, and how many.
    pub fn waiting_callers(&self) -> Vec<(String, usize)> {
        self.waiting.iter().map(|(run, n)| (run.clone(), *n)).collect()
    }

    /// Schedules a clear of the finished runs.
    pub fn clear_at(&mut self, at: i64) {
        self.schedule(at, Ev::ClearFinished);
    }

    /// Runs until `until` or until nothing is left to do, checking `each` after every step.
    pub fn run(&mut self, until: i64, each: &mut dyn FnMut(&World) -> Result<(), String>) -> Result<(), String> {
        while let Some(Reverse((at, _, index))) = self.queue.pop() {
            if at > until {
                break;
            }
            self.now = at;
            let Some(ev) = self.events[index].take() else { continue };
            self.step(ev);
            each(self)?;
        }
        Ok(())
    }

    fn engine(&mut self) -> &mut ParentEngine {
        if self.parent.is_none() {
            // Each instance numbers its exchanges its own way (as the platform's random salt).
            let incarnation = self.parent_epoch as u32 + 1;
            self.parent = Some(ParentEngine::new(PARENT, self.options.clone(), incarnation));
        }
        self.parent.as_mut().expect("just made")
    }

    /// An event at the parent: a fresh instance wakes (starts recovery) first, as a Durable
    /// Object's first request does.
    fn parent_wake(&mut self) {
        if self.parent.is_none() {
            let actions = self.with_parent(|e, db, now| e.wake(db, now));
            self.trace(|| "parent activated".into());
            self.carry_out(actions);
        }
    }

    /// Calls the parent engine over its storage, which fails statements at random while
    /// faults are on (and never outside the engine's calls: the checks read it).
    fn with_parent<T>(&mut self, f: impl FnOnce(&mut ParentEngine, &FaultyDb, i64) -> T) -> T {
        let now = self.now;
        let db = self.parent_db.clone();
        db.rate.set(if self.faults_allowed() { self.storage_fault_rate } else { 0.0 });
        let out = f(self.engine(), &db, now);
        db.rate.set(0.0);
        out
    }

    fn step(&mut self, ev: Ev) {
        match ev {
            Ev::Dispatch(i) => {
                self.parent_wake();
                let plan = self.planned[i].clone();
                self.dispatch(&plan);
            }
            Ev::Redispatch(run_id) => {
                self.parent_wake();
                if let Some(plan) = self.planned.iter().find(|p| p.run_id == run_id).cloned() {
                    self.dispatch(&plan);
                }
            }
            Ev::Cancel(run_id) => {
                self.parent_wake();
                self.trace(|| format!("cancel {run_id}"));
                let called = self.with_parent(|e, db, now| e.cancel(db, &run_id, Some("cancelled".into()), now));
                self.carry_out(called.actions);
            }
            Ev::Abandon(run_id) => {
                if !self.waiting.contains_key(&run_id) {
                    return;
                }
                self.parent_wake();
                self.trace(|| format!("the callers of {run_id} give up"));
                let actions = self.with_parent(|e, db, now| e.abandon(db, &run_id, "the caller gave up".into(), now));
                self.carry_out(actions);
            }
            Ev::ClearFinished => {
                self.parent_wake();
                let filter = crate::types::ClearFilter {
                    status: Some(vec![RunStatus::Completed, RunStatus::Error, RunStatus::Aborted]),
                    older_than: None,
                };
                let called = self.with_parent(|e, db, now| e.clear(db, &filter, now));
                let actions = called.actions;
                let cleared = called.result.map(|c| c.runs).unwrap_or_default();
                {
                    self.trace(|| format!("cleared {cleared:?}"));
                    // The stock reducer cannot be told to forget a run (a `started` frame for
                    // a run it has as finished is ignored): an app that clears runs has its
                    // pages reset their local state (`resetLocalState()`), as docs/concepts.md says;
                    // a connected page takes the replay again at once, another when it connects.
                    if !cleared.is_empty() {
                        for i in 0..self.clients.len() {
                            self.clients[i].reducer.reset();
                            if self.clients[i].connected {
                                self.replay_to(i);
                            }
                        }
                    }
                    // A run dispatched again under a cleared id is a new run: count afresh.
                    let o = &mut self.observed;
                    for id in &cleared {
                        self.hard_ended.remove(id);
                        *o.clears.entry(id.clone()).or_default() += 1;
                        o.finish_hooks.remove(id);
                        o.notices.retain(|(run, _), _| run != id);
                        o.notified.retain(|(run, _), _| run != id);
                        o.deliveries.retain(|(run, _), _| run != id);
                        o.delivered.retain(|(run, _), _| run != id);
                    }
                    self.carry_out(actions);
                }
            }
            Ev::Parent { epoch, event } => {
                // I/O an earlier instance began still arrives now and then (a hook call does
                // not: it ran in the instance that crashed).
                let late = !matches!(event, ParentEvent::FinishHookDone { .. }) && self.hostile && self.rng.chance(0.5);
                if epoch != self.parent_epoch && !late {
                    return;
                }
                self.parent_wake();
                self.trace(|| format!("parent <- {}", describe(&event)));
                let actions = self.with_parent(|e, db, now| e.handle(db, event, now));
                self.carry_out(actions);
            }
            Ev::Alarm => {
                if self.alarm_at.is_some_and(|at| at <= self.now) {
                    self.alarm_at = None;
                    self.trace(|| "alarm".into());
                    let fresh = self.parent.is_none();
                    let actions = self.with_parent(|e, db, now| e.alarm(db, now));
                    if fresh {
                        self.trace(|| "parent activated by its alarm".into());
                    }
                    self.carry_out(actions);
                }
            }
            Ev::Child { run_id, epoch, req } => {
                if epoch != self.parent_epoch {
                    return; // the request's sender crashed before it went out
                }
                self.child_request(&run_id, req);
            }
            Ev::TurnStep { run_id, epoch, attempt } => self.turn_step(&run_id, epoch, attempt),
            Ev::TurnCancelled { run_id, epoch, reason } => {
                let Some(child) = self.children.get_mut(&run_id) else { return };
                if child.epoch != epoch || child.turn.is_none() {
                    return;
                }
                let abort = crate::protocol::chunk::abort(reason.as_deref());
                self.child_emit(&run_id, ChunkKind::Stored, abort);
                let outcome = RunOutcome { status: OutcomeStatus::Aborted, summary: None, output: None, error: reason };
                self.end_turn(&run_id, outcome);
            }
            Ev::ChildTimeout { run_id, epoch } => {
                let now = self.now;
                let id = self.fresh_id();
                let Some(child) = self.children.get_mut(&run_id) else { return };
                if child.epoch != epoch {
                    return;
                }
                child.timer_at = None;
                let Some(engine) = child.engine.as_mut() else { return };
                let actions =
                    engine.handle_timeout(&child.db, &|_| false, &move || id.clone(), now).expect("child store");
                self.child_actions(&run_id, actions);
            }
            Ev::HookReturns { run_id, epoch } => {
                if epoch != self.parent_epoch {
                    return;
                }
                self.observed.hooks_running.remove(&run_id);
                self.step(Ev::Parent { epoch, event: ParentEvent::FinishHookDone { run_id } });
            }
            Ev::Delivered { key, clears, ok, epoch, event } => {
                // The handler ran, whatever became of the instance that called it.
                if ok && clears == self.clears_of(&key.0) {
                    *self.observed.delivered.entry(key).or_default() += 1;
                }
                self.step(Ev::Parent { epoch, event });
            }
            Ev::ParentTimeout { epoch } => {
                if epoch != self.parent_epoch || self.parent.is_none() {
                    return;
                }
                self.parent_timer_at = None;
                let actions = self.with_parent(|e, db, now| e.handle_timeout(db, now));
                self.carry_out(actions);
            }
            Ev::FlushChunks { run_id, epoch } => {
                let Some(child) = self.children.get_mut(&run_id) else { return };
                if child.epoch != epoch {
                    return;
                }
                let Some(engine) = child.engine.as_mut() else { return };
                let actions = engine.flush(&child.db, &run_id, false).unwrap_or_default();
                self.child_actions(&run_id, actions);
            }
            Ev::Line { conn, line } => self.line(conn, line),
            Ev::TailClosed { conn } => {
                let Some(c) = self.conns.get(&conn).cloned() else { return };
                self.conns.remove(&conn);
                if c.parent_epoch == self.parent_epoch {
                    let event = ParentEvent::TailEnded { run_id: c.run_id.clone(), gen: c.gen };
                    self.schedule(self.now, Ev::Parent { epoch: c.parent_epoch, event });
                }
            }
            Ev::CrashParent => {
                if !self.faults_allowed() {
                    return;
                }
                self.trace(|| "CRASH parent".into());
                self.observed.crashes += 1;
                self.parent = None;
                self.parent_epoch += 1;
                self.parent_timer_at = None;
                // Hooks running in the instance die with it (and so do their callers).
                self.observed.hooks_running.clear();
                self.waiting.clear(); // the callers' connections died with it
                for conn in self.conns.values_mut() {
                    conn.open = false;
                }
                for client in &mut self.clients {
                    client.connected = false;
                }
                // Clients reconnect a little later (the stock client does).
                for i in 0..self.clients.len() {
                    let back = self.now + 300 + self.rng.range(0, 700);
                    self.clients[i].reconnected = true;
                    self.schedule(back, Ev::Connect(i));
                }
            }
            Ev::CrashChild(run_id) => {
                if !self.faults_allowed() {
                    return;
                }
                let Some(child) = self.children.get_mut(&run_id) else { return };
                child.engine = None;
                child.epoch += 1;
                child.turn = None;
                child.timer_at = None;
                self.observed.crashes += 1;
                self.trace(|| format!("CRASH child {run_id}"));
                let broken: Vec<u64> = self.conns.iter().filter(|(_, c)| c.run_id == run_id).map(|(k, _)| *k).collect();
                for conn in broken {
                    self.schedule(self.now + 1, Ev::TailClosed { conn });
                }
            }
            Ev::BreakTail(run_id) => {
                if !self.faults_allowed() {
                    return;
                }
                let broken: Vec<u64> = self.conns.iter().filter(|(_, c)| c.run_id == run_id).map(|(k, _)| *k).collect();
                for conn in broken {
                    self.trace(|| format!("tail of {run_id} breaks"));
                    if let Some(c) = self.conns.get_mut(&conn) {
                        c.open = false;
                    }
                    self.schedule(self.now + 1, Ev::TailClosed { conn });
                }
            }
            Ev::Connect(i) => {
                if self.clients[i].connected {
                    return;
                }
                self.parent_wake();
                self.replay_to(i);
                self.clients[i].connected = true;
            }
            Ev::Drop(i) => {
                if self.faults_allowed() && self.clients[i].connected {
                    self.trace(|| format!("client {i} drops"));
                    self.clients[i].connected = false;
                    self.clients[i].reconnected = true;
                }
            }
        }
    }

    /// Sends client `i` the replay a connection gets.
    fn replay_to(&mut self, i: usize) {
        let frames = Registry::new(self.parent_db.as_ref()).replay().unwrap_or_default();
        self.trace(|| format!("client {i} connects: {} replay frames", frames.len()));
        // In a replay too, a run's hard terminal frame is its last.
        let mut ended: BTreeMap<String, i64> = BTreeMap::new();
        for frame in &frames {
            let frame = serde_json::to_value(frame).unwrap_or(Value::Null);
            let run_id = frame["event"]["runId"].as_str().unwrap_or_default().to_owned();
            let (kind, seq) =
                (frame["event"]["kind"].as_str().unwrap_or_default(), frame["sequence"].as_i64().unwrap_or(-1));
            if let Some(&at) = ended.get(&run_id) {
                self.observed.replay_after_terminal.push((run_id.clone(), at, format!("{kind}@{seq}")));
            }
            if matches!(kind, "finished" | "error" | "aborted") {
                ended.insert(run_id, seq);
            }
        }
        for frame in frames {
            let text = frame.to_json();
            self.observe_frame(&text);
            self.clients[i].reducer.receive(&serde_json::from_str(&text).unwrap_or(Value::Null));
        }
    }

    fn dispatch(&mut self, plan: &Planned) {
        let new = NewRun {
            run_id: plan.run_id.clone(),
            parent_tool_call_id: Some(format!("call-{}", plan.run_id)),
            agent_type: CHILD.into(),
            binding: CHILD.into(),
            input_preview: Some(plan.run_id.clone()),
            display: None,
            display_order: 0,
            event_delivery: EventDelivery::Full,
            input: json!({ "run": plan.run_id }),
        };
        let detached = plan.detached.map(|_| DetachedOptions {
            on_finish: (!plan.notify).then(|| json!("handler")),
            notify: plan.notify,
            max_budget: plan.budgets.0.map(std::time::Duration::from_millis),
            no_progress_budget: plan.budgets.1.map(std::time::Duration::from_millis),
            on_milestones: plan.on_milestones.then(|| crate::types::OnMilestones {
                names: vec!["first-word".into()],
                mode: if plan.notify {
                    crate::types::MilestoneMode::React
                } else {
                    crate::types::MilestoneMode::Narrate
                },
            }),
            ..DetachedOptions::default()
        });
        let input = new.input.clone();
        let dispatch = Dispatch { new, detached, abandoned: None };
        let (admitted, actions) = self.with_parent(|e, db, now| e.dispatch(db, dispatch, input, now));
        self.trace(|| format!("dispatch {} -> {}", plan.run_id, admitted_name(&admitted)));
        if let (Admitted::Driving(_) | Admitted::Joined(_) | Admitted::Queued, None) = (&admitted, plan.detached) {
            *self.waiting.entry(plan.run_id.clone()).or_default() += 1;
        }
        if let Admitted::Finished(result) = &admitted {
            if plan.detached.is_none() {
                self.observed.resolved.push((plan.run_id.clone(), result.status));
            }
        }
        self.carry_out(actions);
        self.note_live();
    }

    fn note_live(&mut self) {
        let live = Registry::new(self.parent_db.as_ref()).live_count().unwrap_or(0);
        self.observed.max_live = self.observed.max_live.max(live);
    }

    fn observe_frame(&mut self, text: &str) {
        let Ok(mut frame) = serde_json::from_str::<Value>(text) else { return };
        let run_id = frame["event"]["runId"].as_str().unwrap_or_default().to_owned();
        let seq = frame["sequence"].as_i64().unwrap_or(-1);
        if let Value::Object(o) = &mut frame {
            o.remove("replay");
        }
        let content = frame.to_string();
        match self.observed.frames.get(&(run_id.clone(), seq)) {
            Some(seen) if *seen != content => {
                self.observed.reused.push((run_id, seq, seen.clone(), content));
            }
            Some(_) => {}
            None => {
                self.observed.frames.insert((run_id, seq), content);
            }
        }
    }

    fn carry_out(&mut self, actions: Vec<ParentAction>) {
        let epoch = self.parent_epoch;
        for action in actions {
            match action {
                ParentAction::Broadcast(text) => {
                    self.observe_frame(&text);
                    let frame: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                    // Live frames of a run go out in increasing sequence (a cleared id goes on
                    // from its high-water mark).
                    let run_id = frame["event"]["runId"].as_str().unwrap_or_default().to_owned();
                    let seq = frame["sequence"].as_i64().unwrap_or(-1);
                    if let Some(&last) = self.last_live.get(&run_id) {
                        if seq <= last {
                            self.observed.out_of_order.push((run_id.clone(), last, seq));
                        }
                    }
                    // Nothing of a run goes out after its hard terminal frame.
                    let kind = frame["event"]["kind"].as_str().unwrap_or_default();
                    if let Some(&ended) = self.hard_ended.get(&run_id) {
                        self.observed.after_terminal.push((run_id.clone(), ended, format!("{kind}@{seq}")));
                    }
                    if matches!(kind, "finished" | "error" | "aborted") {
                        self.hard_ended.insert(run_id.clone(), seq);
                    }
                    self.last_live.insert(run_id, seq);
                    for client in self.clients.iter_mut().filter(|c| c.connected) {
                        client.reducer.receive(&frame);
                    }
                }
                ParentAction::StartChild { run_id, gen, request, .. } => {
                    if self.dropped() {
                        let event = ParentEvent::StartReplied {
                            run_id,
                            gen,
                            result: Err(StartError::Unreachable("dropped".into())),
                        };
                        let at = self.now + 50;
                        self.schedule(at, Ev::Parent { epoch, event });
                    } else {
                        let at = self.now + self.hop();
                        self.schedule(at, Ev::Child { run_id, epoch, req: ChildReq::Start(request, gen) });
                    }
                }
                ParentAction::OpenTail { run_id, gen, after, .. } => {
                    if self.dropped() {
                        let event = ParentEvent::TailOpened {
                            run_id,
                            gen,
                            result: Err(TailOpenError::Unreachable("dropped".into())),
                        };
                        let at = self.now + 50;
                        self.schedule(at, Ev::Parent { epoch, event });
                    } else {
                        let at = self.now + self.hop();
                        self.schedule(at, Ev::Child { run_id, epoch, req: ChildReq::Tail { after, gen } });
                    }
                }
                ParentAction::CloseTail { run_id } => {
                    for conn in self.conns.values_mut().filter(|c| c.run_id == run_id) {
                        conn.open = false;
                    }
                }
                ParentAction::InspectChild { run_id, gen, .. } => {
                    // A dropped inspection never answers: the engine times it out.
                    if !self.dropped() {
                        let at = self.now + self.hop();
                        self.schedule(at, Ev::Child { run_id, epoch, req: ChildReq::Inspect { gen } });
                    }
                }
                ParentAction::CancelChild { run_id, reason, .. } => {
                    let at = self.now + self.hop();
                    self.schedule(at, Ev::Child { run_id, epoch, req: ChildReq::Cancel(reason) });
                }
                ParentAction::ClearChild { run_id, .. } => {
                    let at = self.now + self.hop();
                    if self.dropped() {
                        self.trace(|| format!("DROP clear {run_id}"));
                        let event = ParentEvent::ChildCleared { run_id, result: Err("dropped".into()) };
                        self.schedule(at, Ev::Parent { epoch, event });
                    } else {
                        self.schedule(at, Ev::Child { run_id, epoch, req: ChildReq::Clear });
                    }
                }
                ParentAction::ArmAlarm { at } => {
                    if self.alarm_at.is_none_or(|pending| at < pending) {
                        self.alarm_at = Some(at);
                        self.schedule(at, Ev::Alarm);
                    }
                }
                ParentAction::Resolve { run_id, result } => self.resolve(&run_id, &result),
                ParentAction::Hook(HookCall::Finish(run, _)) => {
                    *self.observed.finish_hooks.entry(run.run_id.clone()).or_default() += 1;
                    if self.observed.hooks_running.contains(&run.run_id) {
                        self.observed.overlapping_hooks.push(run.run_id.clone());
                    }
                    // The agent's hook takes a while (now and then a long while); its run's
                    // callers must not get the result before it returned.
                    self.observed.hooks_running.insert(run.run_id.clone());
                    let at = self.now + if self.rng.chance(0.2) { self.rng.range(500, 5_000) } else { self.hop() };
                    self.schedule(at, Ev::HookReturns { run_id: run.run_id, epoch });
                }
                ParentAction::Hook(_) | ParentAction::Transcript => {}
                ParentAction::Deliver { run, slot, gen, attempt, .. } => {
                    self.trace(|| format!("deliver {} {slot:?} #{attempt} ({gen})", run.run_id));
                    let key = (run.run_id.clone(), format!("{slot:?}"));
                    *self.observed.deliveries.entry(key.clone()).or_default() += 1;
                    if attempt > crate::parent::detached::MAX_ATTEMPTS {
                        self.observed.past_dead_letter.push(run.run_id.clone());
                    }
                    let handler = self.planned.iter().find(|p| p.run_id == run.run_id).and_then(|p| p.detached);
                    let ok = match handler {
                        Some(Handler::FailFirst(n)) => attempt > n,
                        Some(Handler::Always) => false,
                        _ => true,
                    };
                    let event = ParentEvent::DeliveryDone {
                        run_id: run.run_id,
                        slot,
                        gen,
                        attempt,
                        result: if ok { Ok(()) } else { Err("the handler failed".into()) },
                    };
                    // Now and then a handler slower than the delivery lease and the backbone's
                    // cadence: it must not be delivered again meanwhile.
                    let at = self.now + if self.rng.chance(0.1) { self.rng.range(60_000, 130_000) } else { self.hop() };
                    let clears = self.clears_of(&key.0);
                    self.schedule(at, Ev::Delivered { key, clears, ok, epoch, event });
                }
                ParentAction::Notice(notice) => {
                    self.trace(|| format!("notice {} ({:?})", notice.id, notice.delivery));
                    // The agent words it (now and then it suppresses a milestone with an empty text).
                    let milestone = matches!(notice.of, NoticeOf::Milestone(_));
                    let suppressed = milestone && self.rng.chance(0.1);
                    let text = if suppressed { String::new() } else { format!("notice {}", notice.id) };
                    if let NoticeOf::Milestone(milestone) = &notice.of {
                        let key = (notice.run.run_id.clone(), milestone.name.clone());
                        *self.observed.notices_offered.entry(key).or_default() += 1;
                    }
                    let of = notice.of.clone();
                    let run_id = notice.run.run_id.clone();
                    let delivery = notice.delivery;
                    if let Some(delivery) = delivery {
                        let key = (run_id.clone(), format!("{:?}", delivery.slot));
                        *self.observed.deliveries.entry(key).or_default() += 1;
                        if delivery.attempt > crate::parent::detached::MAX_ATTEMPTS {
                            self.observed.past_dead_letter.push(run_id.clone());
                        }
                    }
                    let posted = self.with_parent(|e, db, now| e.post_notice(db, notice, text, now));
                    if posted.iter().any(|a| matches!(a, ParentAction::Transcript)) {
                        match of {
                            NoticeOf::Milestone(milestone) => {
                                *self.observed.notices.entry((run_id, milestone.name)).or_default() += 1;
                            }
                            NoticeOf::Outcome(result) => {
                                let key = (run_id.clone(), result.status.as_str().to_owned());
                                *self.observed.notified.entry(key).or_default() += 1;
                                if let Some(delivery) = delivery {
                                    let key = (run_id, format!("{:?}", delivery.slot));
                                    *self.observed.delivered.entry(key).or_default() += 1;
                                }
                            }
                        }
                    }
                    self.carry_out(posted);
                }
                ParentAction::RunChatTurn { delivery, .. } => {
                    // The model's turn on the notice, then its delivery is settled.
                    if let Some((run_id, delivery)) = delivery {
                        let event = delivery.done(run_id, Ok(()));
                        let at = self.now + self.rng.range(20, 400);
                        self.schedule(at, Ev::Parent { epoch, event });
                    }
                }
                ParentAction::Observe(kind, payload) => {
                    self.trace(|| format!("observe {kind:?} {payload}"));
                    if kind == crate::observability::EventType::StorageFailed {
                        let run_id = payload["runId"].as_str().unwrap_or_default().to_owned();
                        *self.observed.storage_failures.entry(run_id).or_default() += 1;
                    }
                    if kind == crate::observability::EventType::DrainIncomplete {
                        let run_id = payload["runId"].as_str().unwrap_or_default().to_owned();
                        self.observed.drains_incomplete.insert(run_id);
                    }
                }
            }
        }
        self.note_live();
        self.rearm_parent();
    }

    fn clears_of(&self, run_id: &str) -> usize {
        self.observed.clears.get(run_id).copied().unwrap_or(0)
    }

    /// Arms the parent's one timer for its engine's deadline, as the platform does.
    fn rearm_parent(&mut self) {
        let Some(at) = self.parent.as_ref().and_then(ParentEngine::poll_timeout) else { return };
        if self.parent_timer_at.is_some_and(|armed| armed <= at) {
            return;
        }
        self.parent_timer_at = Some(at);
        let epoch = self.parent_epoch;
        self.schedule(at, Ev::ParentTimeout { epoch });
    }

    /// Arms a child's one timer for its engine's deadline.
    fn rearm_child(&mut self, run_id: &str) {
        let Some(child) = self.children.get_mut(run_id) else { return };
        let Some(at) = child.engine.as_ref().and_then(ChildEngine::poll_timeout) else { return };
        if child.timer_at.is_some_and(|armed| armed <= at) {
            return;
        }
        child.timer_at = Some(at);
        let epoch = child.epoch;
        self.schedule(at, Ev::ChildTimeout { run_id: run_id.to_owned(), epoch });
    }

    fn resolve(&mut self, run_id: &str, result: &RunResult) {
        if self.observed.hooks_running.contains(run_id) {
            self.observed.early_results.push(run_id.to_owned());
        }
        if let Some(n) = self.waiting.remove(run_id) {
            for _ in 0..n {
                self.observed.resolved.push((run_id.to_owned(), result.status));
            }
        }
    }

    // ----- children -----------------------------------------------------------------------

    fn child(&mut self, run_id: &str) -> &mut ChildObj {
        let policy = self.policy;
        let now = self.now;
        let child = self.children.entry(run_id.to_owned()).or_insert_with(|| {
            let db = memory();
            ChildRuns::new(&db).migrate().expect("child schema");
            db.batch(crate::chat::store::SCHEMA).expect("chat schema");
            ChildObj { db, engine: None, epoch: 0, turn: None, timer_at: None }
        });
        if child.engine.is_none() {
            // A fresh instance: what a restart cut short in its chat is saved, marked.
            let _ = OpenStreams::new(&child.db).recover(now);
            child.engine = Some(ChildEngine::new(policy));
        }
        child
    }

    fn child_request(&mut self, run_id: &str, req: ChildReq) {
        let now = self.now;
        let parent_epoch = self.parent_epoch;
        match req {
            ChildReq::Start(request, gen) => {
                let child = self.child(run_id);
                let engine = child.engine.as_mut().expect("activated");
                let result = engine.start(&child.db, &request, now);
                let (reply, actions) = match result {
                    Ok((reply, actions)) => (Ok(reply), actions),
                    Err(e) => (Err(e.to_string()), Vec::new()),
                };
                self.trace(|| format!("child {run_id} <- start: {reply:?}"));
                self.child_actions(run_id, actions);
                let event = ParentEvent::StartReplied {
                    run_id: run_id.to_owned(),
                    gen,
                    result: reply.map(|_| ()).map_err(StartError::Refused),
                };
                let at = self.now + self.hop();
                self.reply(at, parent_epoch, event);
            }
            ChildReq::Tail { after, gen } => {
                let child = self.child(run_id);
                let engine = child.engine.as_mut().expect("activated");
                // Small pages, so a tail's backlog often takes several (read one after another,
                // as the platform's tail body does).
                let mut result = engine.tail(&child.db, run_id, after, SIM_TAIL_PAGE, false, now);
                while let Ok((start, actions)) = &mut result {
                    let Some(more) = start.more_after else { break };
                    match engine.tail(&child.db, run_id, more, SIM_TAIL_PAGE, false, now) {
                        Ok((next, more_actions)) => {
                            start.lines.extend(next.lines);
                            start.subscriber = next.subscriber;
                            start.more_after = next.more_after;
                            actions.extend(more_actions);
                        }
                        Err(e) => result = Err(e),
                    }
                }
                let at = self.now + self.hop();
                let (start, actions) = match result {
                    Ok(started) => started,
                    Err(TailError::Unknown) => {
                        let event = ParentEvent::TailOpened {
                            run_id: run_id.to_owned(),
                            gen,
                            result: Err(TailOpenError::Status(404)),
                        };
                        self.schedule(at, Ev::Parent { epoch: parent_epoch, event });
                        return;
                    }
                    Err(TailError::Store(e)) => panic!("child store failed: {e}"),
                };
                let child_epoch = self.children.get(run_id).map_or(0, |c| c.epoch);
                self.next_conn += 1;
                let conn = self.next_conn;
                self.conns.insert(
                    conn,
                    Conn {
                        run_id: run_id.to_owned(),
                        gen,
                        parent_epoch,
                        child_epoch,
                        subscriber: start.subscriber,
                        open: true,
                        last_at: at,
                    },
                );
                let event = ParentEvent::TailOpened { run_id: run_id.to_owned(), gen, result: Ok(()) };
                self.schedule(at, Ev::Parent { epoch: parent_epoch, event });
                for line in start.lines {
                    self.send_line(conn, line);
                }
                if start.subscriber.is_none() {
                    let at = self.conns[&conn].last_at + 1;
                    self.schedule(at, Ev::TailClosed { conn });
                }
                self.child_actions(run_id, actions);
            }
            ChildReq::Inspect { gen } => {
                let child = self.child(run_id);
                let engine = child.engine.as_mut().expect("activated");
                let (inspection, actions) = engine.inspect(&child.db, run_id, false, now).expect("child store");
                self.child_actions(run_id, actions);
                let reply: Option<InspectionReply> =
                    inspection.and_then(|i| serde_json::from_value(serde_json::to_value(i).ok()?).ok());
                self.trace(|| format!("child {run_id} <- inspect: {:?}", reply.as_ref().map(|r| r.status.clone())));
                let slow = self.faults_allowed() && self.rng.chance(0.05);
                let at = self.now + if slow { INSPECT_TIMEOUT_MS + 500 } else { self.hop() };
                let event = ParentEvent::Inspected { run_id: run_id.to_owned(), gen, result: Ok(reply) };
                self.reply(at, parent_epoch, event);
            }
            ChildReq::Cancel(reason) => {
                let child = self.child(run_id);
                let engine = child.engine.as_mut().expect("activated");
                let actions = engine.cancel(&child.db, run_id, reason, now).expect("child store");
                self.child_actions(run_id, actions);
            }
            ChildReq::Clear => {
                if let Some(child) = self.children.get_mut(run_id) {
                    let db = memory();
                    ChildRuns::new(&db).migrate().expect("child schema");
                    child.db = db;
                    child.engine = None;
                    child.turn = None;
                    child.epoch += 1;
                    child.timer_at = None;
                }
                let event = ParentEvent::ChildCleared { run_id: run_id.to_owned(), result: Ok(()) };
                let at = self.now + self.hop();
                self.schedule(at, Ev::Parent { epoch: parent_epoch, event });
            }
        }
    }

    fn child_actions(&mut self, run_id: &str, actions: Vec<ChildAction>) {
        for action in actions {
            match action {
                ChildAction::BeginTurn { attempt, .. } => {
                    let script = self.planned.iter().find(|p| p.run_id == run_id).map(|p| p.script.clone());
                    let script = script.unwrap_or(TurnScript {
                        words: 3,
                        step_ms: 20,
                        stall_after: None,
                        stall_ms: 0,
                        milestone: false,
                    });
                    self.next_id += 1;
                    let builder_id = format!("m{}", self.next_id);
                    let child = self.children.get_mut(run_id).expect("a child begins its own turn");
                    let _ = OpenStreams::new(&child.db).open(run_id, run_id, &builder_id, 0);
                    child.turn = Some(Turn { attempt, script, next_word: 0, started: false, builder_id });
                    let epoch = child.epoch;
                    self.trace(|| format!("child {run_id} begins attempt {attempt}"));
                    let at = self.now + 5;
                    self.schedule(at, Ev::TurnStep { run_id: run_id.to_owned(), epoch, attempt });
                }
                ChildAction::CancelTurn { reason, .. } => {
                    let epoch = self.children.get(run_id).map_or(0, |c| c.epoch);
                    self.schedule(self.now, Ev::TurnCancelled { run_id: run_id.to_owned(), epoch, reason });
                }
                ChildAction::Send { subscriber, line } => {
                    let conn = self.subscriber_conn(run_id, subscriber);
                    match conn {
                        Some(conn) if self.conns[&conn].open => self.send_line(conn, line),
                        _ => {
                            if let Some(engine) = self.children.get_mut(run_id).and_then(|c| c.engine.as_mut()) {
                                engine.unsubscribe(subscriber);
                            }
                        }
                    }
                }
                ChildAction::Close { subscriber } => {
                    let conn = self.subscriber_conn(run_id, subscriber);
                    if let Some(conn) = conn {
                        let at = self.conns[&conn].last_at + 1;
                        self.schedule(at, Ev::TailClosed { conn });
                    }
                }
                ChildAction::ChatSend { .. } => {}
                ChildAction::FlushSoon { .. } => {
                    // Usually at once; now and then a little later, so that several chunks
                    // wait together and a crash can take them unsent.
                    let epoch = self.children.get(run_id).map_or(0, |c| c.epoch);
                    let at = self.now + if self.rng.chance(0.3) { self.rng.range(1, 60) } else { 0 };
                    self.schedule(at, Ev::FlushChunks { run_id: run_id.to_owned(), epoch });
                }
                ChildAction::SupersedeMessages { .. } => {
                    if let Some(child) = self.children.get(run_id) {
                        let _ = crate::chat::store::StreamLog::new(&child.db).mark_superseded(run_id);
                    }
                }
                ChildAction::Observe(kind, payload) => self.trace(|| format!("child observe {kind:?} {payload}")),
            }
        }
        self.rearm_child(run_id);
    }

    /// The connection of a child's subscriber (of the child as it is now).
    fn subscriber_conn(&self, run_id: &str, subscriber: SubscriberId) -> Option<u64> {
        let epoch = self.children.get(run_id).map_or(0, |c| c.epoch);
        self.conns
            .iter()
            .find(|(_, c)| c.run_id == run_id && c.child_epoch == epoch && c.subscriber == Some(subscriber))
            .map(|(k, _)| *k)
    }

    fn send_line(&mut self, conn: u64, line: Vec<u8>) {
        let hop = self.hop();
        let c = self.conns.get_mut(&conn).expect("a known connection");
        c.last_at = (c.last_at + 1).max(self.now + hop);
        let at = c.last_at;
        self.schedule(at, Ev::Line { conn, line });
    }

    fn line(&mut self, conn: u64, line: Vec<u8>) {
        let hostile = self.hostile && self.rng.chance(0.5);
        let Some(c) = self.conns.get_mut(&conn) else { return };
        // Lines in flight when the tail closed, or when the instance that opened it crashed,
        // still arrive now and then, with the tail's old exchange number.
        if (!c.open || c.parent_epoch != self.parent_epoch) && !hostile {
            return;
        }
        let lines: Vec<_> =
            LineSplitter::default().push(&line).unwrap_or_default().into_iter().filter_map(Result::ok).collect();
        let (run_id, gen) = (c.run_id.clone(), c.gen);
        if lines.is_empty() {
            return;
        }
        let event = ParentEvent::TailBatch { run_id, gen, lines };
        self.step(Ev::Parent { epoch: self.parent_epoch, event });
    }

    fn child_emit(&mut self, run_id: &str, kind: ChunkKind, body: String) {
        let Some(child) = self.children.get_mut(run_id) else { return };
        let Some(engine) = child.engine.as_mut() else { return };
        let (_, actions) = engine.emit(&child.db, run_id, kind, body, None, false).expect("child store");
        self.child_actions(run_id, actions);
    }

    fn fresh_id(&mut self) -> String {
        self.next_id += 1;
        format!("id{}", self.next_id)
    }

    fn turn_step(&mut self, run_id: &str, epoch: u64, attempt: i64) {
        let now = self.now;
        let (id_a, id_b) = (self.fresh_id(), self.fresh_id());
        let Some(child) = self.children.get_mut(run_id) else { return };
        if child.epoch != epoch {
            return;
        }
        let Some(turn) = child.turn.as_mut() else { return };
        if turn.attempt != attempt {
            return;
        }
        if !turn.started {
            turn.started = true;
            let id = turn.builder_id.clone();
            self.child_emit(run_id, ChunkKind::Stored, json!({ "type": "start", "messageId": id }).to_string());
            self.child_emit(run_id, ChunkKind::Stored, json!({ "type": "text-start", "id": "t" }).to_string());
        } else {
            let (word, total, milestone) = (turn.next_word, turn.script.words, turn.script.milestone);
            if word < total {
                turn.next_word += 1;
                let delta = format!("a{attempt}w{word} ");
                self.child_emit(
                    run_id,
                    ChunkKind::Stored,
                    json!({ "type": "text-delta", "id": "t", "delta": delta }).to_string(),
                );
                if word == 0 && milestone {
                    let child = self.children.get_mut(run_id).expect("still here");
                    if let Some(engine) = child.engine.as_mut() {
                        let report = Report { progress: Progress::milestone("first-word"), persist: false };
                        let id = id_a.clone();
                        let actions = engine
                            .report_progress(&child.db, run_id, report, false, &move || id.clone(), now)
                            .unwrap_or_default();
                        self.child_actions(run_id, actions);
                    }
                }
                let child = self.children.get_mut(run_id).expect("still here");
                if let Some(engine) = child.engine.as_mut() {
                    let fraction = (word + 1) as f64 / total as f64;
                    let report = Report {
                        progress: Progress { fraction: Some(fraction), ..Progress::default() },
                        persist: false,
                    };
                    let id = id_b.clone();
                    let actions = engine
                        .report_progress(&child.db, run_id, report, false, &move || id.clone(), now)
                        .unwrap_or_default();
                    self.child_actions(run_id, actions);
                }
            } else {
                self.child_emit(run_id, ChunkKind::Stored, json!({ "type": "text-end", "id": "t" }).to_string());
                self.child_emit(run_id, ChunkKind::Stored, json!({ "type": "finish" }).to_string());
                let summary: String = (0..total).map(|w| format!("a{attempt}w{w} ")).collect();
                let outcome =
                    RunOutcome { status: OutcomeStatus::Completed, summary: Some(summary), output: None, error: None };
                self.end_turn(run_id, outcome);
                return;
            }
        }
        let Some(turn) = self.children.get(run_id).and_then(|c| c.turn.as_ref()) else { return };
        let stall = turn.script.stall_after == Some(turn.next_word) && turn.next_word > 0;
        let pause = if stall { turn.script.stall_ms } else { turn.script.step_ms };
        let at = self.now + pause;
        self.schedule(at, Ev::TurnStep { run_id: run_id.to_owned(), epoch, attempt });
    }

    fn end_turn(&mut self, run_id: &str, outcome: RunOutcome) {
        let now = self.now;
        let Some(child) = self.children.get_mut(run_id) else { return };
        let Some(turn) = child.turn.take() else { return };
        // The chat saves the attempt's message, built from this attempt's chunks only.
        let mut builder = MessageBuilder::new(turn.builder_id.clone());
        let start = ChildRuns::new(&child.db).get(run_id).ok().flatten().map_or(0, |r| r.attempt_start);
        for chunk in crate::chat::store::StreamLog::new(&child.db).after(run_id, start - 1).unwrap_or_default() {
            if let Ok(chunk) = serde_json::from_str::<Value>(&chunk.body) {
                builder.apply(&chunk);
            }
        }
        let _ = Messages::new(&child.db).upsert(&builder.message(), now);
        let _ = OpenStreams::new(&child.db).close(run_id);
        self.next_id += 1;
        let id = format!("id{}", self.next_id);
        let Some(child) = self.children.get_mut(run_id) else { return };
        let Some(engine) = child.engine.as_mut() else { return };
        let actions =
            engine.turn_ended(&child.db, run_id, &outcome, false, &move || id.clone(), now).expect("child store");
        self.trace(|| format!("child {run_id} attempt {} ends {:?}", turn.attempt, outcome.status));
        self.child_actions(run_id, actions);
    }

    /// The child's transcript of a run (its chat messages).
    pub fn child_messages(&self, run_id: &str) -> Vec<Value> {
        self.children.get(run_id).map(|c| Messages::new(&c.db).list().unwrap_or_default()).unwrap_or_default()
    }

    /// Whether the parent engine drives the run now.
    pub fn driving(&self, run_id: &str) -> bool {
        self.parent.as_ref().is_some_and(|p| p.is_driving(run_id))
    }

    /// The pending alarm.
    pub fn alarm(&self) -> Option<i64> {
        self.alarm_at
    }
}

fn admitted_name(a: &Admitted) -> &'static str {
    match a {
        Admitted::Refused(_) => "refused",
        Admitted::Finished(_) => "finished",
        Admitted::Driving(_) => "driving",
        Admitted::Joined(_) => "joined",
        Admitted::Queued => "queued",
    }
}

fn describe(event: &ParentEvent) -> String {
    match event {
        ParentEvent::StartReplied { run_id, gen, result } => format!("start {run_id}#{gen} {result:?}"),
        ParentEvent::TailOpened { run_id, gen, result } => format!("tail opened {run_id}#{gen} {result:?}"),
        ParentEvent::TailBatch { run_id, gen, lines } => format!("tail {run_id}#{gen}: {} lines", lines.len()),
        ParentEvent::TailEnded { run_id, gen } => format!("tail ended {run_id}#{gen}"),
        ParentEvent::TailRefused { run_id, gen, error } => format!("tail refused {run_id}#{gen}: {error}"),
        ParentEvent::Inspected { run_id, gen, result } => {
            format!("inspected {run_id}#{gen}: {:?}", result.as_ref().map(|r| r.as_ref().map(|i| i.status.clone())))
        }
        ParentEvent::FinishHookDone { run_id } => format!("finish hook of {run_id} returned"),
        ParentEvent::DeliveryDone { run_id, slot, attempt, result, .. } => {
            format!("delivered {run_id} {slot:?} #{attempt}: {result:?}")
        }
        ParentEvent::ChildCleared { run_id, result } => format!("child {run_id} cleared: {result:?}"),
    }
}
