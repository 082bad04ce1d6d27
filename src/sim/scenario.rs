//! The scenario: its agents, its draws, what it does at each time, and what the end must show.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::cancel::CancelToken;
use crate::parent::registry::Registry;
use crate::prelude::*;
use crate::testing::{Client, Faults, ObjectRef, ScriptedModel, Step, World};
use crate::types::{AgentToolOptions, RecoveryPolicy, RunStatus};
use crate::{ClearFilter, HandlerTag, OnMilestones, RunInfo, RunResult};

/// Seeds that once found a bug, kept as regression cases: 9 (a child's end of turn half
/// written: its tails hung), 24 (a failed migration refused every request until eviction), 25
/// (a child's 500 at start ended the run `error`), 44 (a milestone read late replaced newer
/// progress in the replay only), 57 (a milestone lost to a failed statement), 178 (a chat chunk
/// the stream log refused never reached the clients), 1092 (a replay read that failed left the
/// client with half a replay: it never saw the run end).
pub(super) const REGRESSIONS: &[u64] = &[9, 24, 25, 44, 57, 178, 1092];

/// The simulated time a schedule runs for: long enough for every budget and stall to play out.
const HORIZON_MS: u64 = 30 * 60 * 1000;

/// When the random faults stop, so the world can settle.
const CALM_AFTER: Duration = Duration::from_secs(8);

/// The parent.
#[derive(Default)]
pub(super) struct Lead;

impl crate::AgentClass for Lead {
    const CLASS: &'static str = "Lead";
    const BINDING: &'static str = "Lead";
}

/// A child.
#[derive(Default)]
pub(super) struct Worker;

impl crate::AgentClass for Worker {
    const CLASS: &'static str = "Worker";
    const BINDING: &'static str = "Worker";
}

/// How a detached run's handler behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Handler {
    /// Succeeds.
    Ok,
    /// Fails on its first `n` attempts.
    FailFirst(usize),
    /// Always fails.
    Always,
}

/// What a child's turn does.
#[derive(Debug, Clone)]
pub(super) struct TurnScript {
    words: usize,
    step_ms: u64,
    /// After this many words, a silence of `stall_ms` (a slow or silent child).
    stall_after: Option<usize>,
    stall_ms: u64,
    /// Report the milestone `first-word` after the first word.
    milestone: bool,
}

/// One dispatch the scenario makes.
#[derive(Debug, Clone)]
pub(super) struct Planned {
    at: i64,
    run_id: String,
    /// Awaited (`None`) or detached with this handler.
    detached: Option<Handler>,
    /// The detached budgets (absolute, no-progress), ms.
    budgets: (Option<u64>, Option<u64>),
    script: TurnScript,
    /// A detached run that tells the chat when it ends (instead of a handler).
    notify: bool,
    /// A detached run that surfaces its milestone in the chat.
    on_milestones: bool,
    /// The formatting hook words its milestone as nothing (it is not posted).
    suppress_milestone: bool,
    /// How long its handler takes, ms (some longer than the delivery lease).
    handler_ms: u64,
}

/// Something the scenario does at a time.
#[derive(Debug, Clone)]
enum Ev {
    Dispatch(usize),
    Redispatch(String),
    Cancel(String),
    Abandon(String),
    ClearFinished,
    CrashParent,
    CrashChild(String),
    CrashAll,
    BreakTail(String),
    DropClient(usize),
}

/// What the agents saw, for the checks.
#[derive(Default)]
struct Seen {
    /// Handler attempts and successes, by (run incarnation, slot: `Finish` or `GiveUp`).
    attempts: BTreeMap<(String, &'static str), usize>,
    delivered: BTreeMap<(String, &'static str), usize>,
    /// Handlers running now, by run.
    running: BTreeMap<String, usize>,
    problems: Vec<String>,
    /// Awaited callers still waiting, by run.
    waiting: BTreeMap<String, usize>,
    /// Runs whose last read of the child's stream broke off (recorded with what was read).
    drains_incomplete: std::collections::BTreeSet<String>,
    /// The signals of awaited callers, by run (a caller that gives up cancels its own).
    signals: BTreeMap<String, Vec<CancelToken>>,
}

/// A scenario and what its agents saw.
pub(super) struct Sim {
    plans: Vec<Planned>,
    options: AgentToolOptions,
    seen: RefCell<Seen>,
    hooks: Rc<RefCell<crate::testing::hooks::HookCounts>>,
    world: std::rc::Weak<crate::testing::world::WorldInner>,
}

thread_local! {
    static SIM: RefCell<Option<Rc<Sim>>> = const { RefCell::new(None) };
}

fn sim() -> Rc<Sim> {
    SIM.with(|s| s.borrow().clone()).expect("a simulation is running on this thread")
}

impl Sim {
    fn plan(&self, run_id: &str) -> Option<&Planned> {
        self.plans.iter().find(|p| p.run_id == run_id)
    }

    fn problem(&self, problem: String) {
        self.seen.borrow_mut().problems.push(problem);
    }
}

/// A run id dispatched again after a clear is another run: its deliveries are counted apart.
fn incarnation(run_id: &str, started_at: i64) -> String {
    format!("{run_id}@{started_at}")
}

/// Decrements a count when dropped: a caller or a handler whose task ended, or was killed with
/// its instance.
struct Count(&'static str, String);

impl Drop for Count {
    fn drop(&mut self) {
        let Some(sim) = SIM.with(|s| s.borrow().clone()) else { return };
        let mut seen = sim.seen.borrow_mut();
        let map = if self.0 == "waiting" { &mut seen.waiting } else { &mut seen.running };
        if let Some(n) = map.get_mut(&self.1) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.1);
            }
        }
    }
}

impl Agent for Lead {
    fn agent_tool_options(&self, _env: &Env) -> AgentToolOptions {
        sim().options.clone()
    }

    async fn on_detached_finish(
        &self,
        host: &AgentHost<Self>,
        _handler: &HandlerTag,
        run: &RunInfo,
        result: &RunResult,
    ) -> Result<(), Error> {
        let sim = sim();
        let Some(plan) = sim.plan(&run.run_id).cloned() else { return Ok(()) };
        // An `interrupted` outcome is delivered in a slot of its own (the give-up), the real
        // result that may follow it in the other.
        let slot = if result.status == RunStatus::Interrupted { "GiveUp" } else { "Finish" };
        // A delivery in flight is never handed over again: per run and slot (a give-up and the late
        // real result are two deliveries, each with its own lease).
        let key = format!("{}/{slot}", incarnation(&run.run_id, crate::types::epoch_ms(run.started_at)));
        let attempt = {
            let mut seen = sim.seen.borrow_mut();
            let running = seen.running.entry(key.clone()).or_default();
            *running += 1;
            let overlapping = *running > 1;
            let attempts = seen
                .attempts
                .entry((incarnation(&run.run_id, crate::types::epoch_ms(run.started_at)), slot))
                .or_default();
            *attempts += 1;
            let attempt = *attempts;
            if overlapping {
                seen.problems.push(format!("{key}: on_detached_finish called while a call of it ran"));
            }
            attempt
        };
        let _running = Count("running", key);
        host.sleep(Duration::from_millis(plan.handler_ms)).await;
        let fails = match plan.detached {
            Some(Handler::Always) => true,
            Some(Handler::FailFirst(n)) => attempt <= n,
            _ => false,
        };
        if fails {
            return Err(Error::invalid(format!("handler attempt {attempt} fails")));
        }
        *sim.seen
            .borrow_mut()
            .delivered
            .entry((incarnation(&run.run_id, crate::types::epoch_ms(run.started_at)), slot))
            .or_default() += 1;
        Ok(())
    }

    fn on_observability(&self, event: &crate::observability::ObservabilityEvent) {
        if event.kind == crate::observability::EventType::DrainIncomplete {
            if let Some(run_id) = event.payload["runId"].as_str() {
                sim().seen.borrow_mut().drains_incomplete.insert(run_id.to_owned());
            }
        }
    }

    fn format_detached_milestone(&self, run: &RunInfo, milestone: &crate::Milestone) -> String {
        match sim().plan(&run.run_id) {
            Some(plan) if plan.suppress_milestone => String::new(),
            _ => crate::milestone_line(run, milestone),
        }
    }
}

impl Agent for Worker {
    fn agent_tool_options(&self, _env: &Env) -> AgentToolOptions {
        sim().options.clone()
    }

    async fn run(&self, turn: &Turn<Self>) -> Result<TurnOutput, Error> {
        let Some(script) = sim().plan(turn.run_id()).map(|p| p.script.clone()) else {
            return Err(Error::invalid(format!("no script for {}", turn.run_id())));
        };
        let attempt = turn.attempt();
        turn.emit(json!({ "type": "start" }).to_string());
        turn.emit(json!({ "type": "text-start", "id": "t" }).to_string());
        for word in 0..script.words {
            turn.pause(Duration::from_millis(script.step_ms)).await;
            if turn.is_cancelled() {
                return Err(Error::Cancelled("cancelled".into()));
            }
            let delta = format!("a{attempt}w{word} ");
            turn.emit(json!({ "type": "text-delta", "id": "t", "delta": delta }).to_string());
            if word == 0 && script.milestone {
                turn.report_progress(Progress::milestone("first-word"));
            }
            turn.report_progress(Progress::fraction((word + 1) as f64 / script.words as f64));
            if script.stall_after == Some(word + 1) {
                turn.pause(Duration::from_millis(script.stall_ms)).await;
            }
        }
        turn.emit(json!({ "type": "text-end", "id": "t" }).to_string());
        turn.emit(json!({ "type": "finish" }).to_string());
        Ok(TurnOutput::new((0..script.words).map(|w| format!("a{attempt}w{w} ")).collect::<String>()))
    }
}

/// A deterministic generator for the scenario's draws (its own, fixed: a kept seed must keep
/// drawing the same scenario whatever generator the kit's scheduler uses).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % ((hi - lo + 1) as u64)) as i64
    }

    fn chance(&mut self, p: f64) -> bool {
        (self.next() % 1_000_000) as f64 / 1_000_000.0 < p
    }
}

/// The scenario of `seed`: its plan, its timeline, its faults and its client count.
fn scenario(seed: u64) -> (Sim, Vec<(i64, Ev)>, Faults, usize) {
    let mut rng = Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1);
    let policy = if rng.chance(0.7) { RecoveryPolicy::Rerun } else { RecoveryPolicy::Seal };
    let cap = rng.chance(0.2).then_some(2usize);
    let runs = rng.range(1, 3) as usize;
    let mut plans = Vec::new();
    for i in 0..runs {
        let detached = rng.chance(0.4).then(|| match rng.range(0, 4) {
            0 => Handler::Always,
            1 => Handler::FailFirst(rng.range(1, 3) as usize),
            _ => Handler::Ok,
        });
        let budgets = if detached.is_some() && rng.chance(0.3) {
            (Some(rng.range(20_000, 90_000) as u64), Some(rng.range(3_000, 20_000) as u64))
        } else {
            (None, None)
        };
        let words = rng.range(2, 6) as usize;
        let stall_after = rng.chance(0.15).then(|| rng.range(1, words as i64) as usize);
        let notify = detached.is_some() && rng.chance(0.3);
        plans.push(Planned {
            at: rng.range(0, 1_500),
            run_id: format!("r{i}"),
            detached,
            budgets,
            script: TurnScript {
                words,
                step_ms: rng.range(10, 150) as u64,
                stall_after,
                stall_ms: rng.range(1_000, 200_000) as u64,
                milestone: rng.chance(0.5),
            },
            notify,
            on_milestones: detached.is_some() && rng.chance(0.4),
            suppress_milestone: rng.chance(0.1),
            handler_ms: if rng.chance(0.2) { rng.range(1_000, 90_000) as u64 } else { rng.range(0, 500) as u64 },
        });
    }
    let mut options = AgentToolOptions::default()
        .recovery(policy)
        .recovery_alarm(Duration::from_millis(rng.range(1_000, 10_000) as u64))
        .reattach_no_progress_timeout(Duration::from_millis(rng.range(20_000, 120_000) as u64));
    if rng.chance(0.2) {
        options = options.reattach_max_window(Duration::from_millis(rng.range(30_000, 300_000) as u64));
    }
    if let Some(cap) = cap {
        options = options.max_concurrent(cap);
        if rng.chance(0.5) {
            options = options.admission(crate::Admission::Queue);
        }
    }
    let clients = rng.range(2, 3) as usize;
    let mut timeline: Vec<(i64, Ev)> = plans.iter().enumerate().map(|(i, p)| (p.at, Ev::Dispatch(i))).collect();
    let run = |rng: &mut Rng| format!("r{}", rng.range(0, runs as i64 - 1));
    for _ in 0..rng.range(0, 3) {
        let at = rng.range(100, 7_000);
        let ev = match rng.range(0, 3) {
            0 => Ev::CrashParent,
            1 => Ev::CrashChild(run(&mut rng)),
            2 => Ev::BreakTail(run(&mut rng)),
            _ => Ev::DropClient(rng.range(0, clients as i64 - 1) as usize),
        };
        timeline.push((at, ev));
    }
    if rng.chance(0.15) {
        timeline.push((rng.range(50, 6_000), Ev::Cancel(run(&mut rng))));
    }
    if rng.chance(0.3) {
        timeline.push((rng.range(2_000, 9_000), Ev::Redispatch(run(&mut rng))));
    }
    if rng.chance(0.05) {
        timeline.push((rng.range(5_000, 7_500), Ev::ClearFinished));
    }
    if rng.chance(0.15) {
        timeline.push((rng.range(100, 7_000), Ev::CrashAll));
    }
    if rng.chance(0.2) {
        timeline.push((rng.range(50, 6_000), Ev::Abandon(run(&mut rng))));
    }
    timeline.sort_by_key(|(at, _)| *at);
    let mut faults = Faults::none().until(CALM_AFTER);
    if rng.chance(0.5) {
        faults = faults.max_hop(Duration::from_millis(200)).drop_hop(0.05).break_tail(0.002);
    }
    if rng.chance(0.3) {
        faults = faults.storage(0.03);
    }
    // Drawn last, so the seeds kept before it was drawn still draw what they drew: sometimes a
    // recovery's work bound that a re-run passes (a turn streams up to ten chunks).
    if rng.chance(0.4) {
        options = options.max_recovery_work(Some(rng.range(0, 8) as u64));
    }
    let sim =
        Sim { plans, options, seen: RefCell::new(Seen::default()), hooks: Rc::default(), world: std::rc::Weak::new() };
    (sim, timeline, faults, clients)
}

const PARENT: &str = "p";

fn parent() -> ObjectRef {
    ObjectRef::of::<Lead>(PARENT)
}

/// Dispatches `plan` from the parent: an awaited caller (a task of the parent's, so it dies
/// with the parent's instance) or a detached run.
fn dispatch(world: &World, plan: &Planned) {
    let host = world.host::<Lead>(PARENT);
    let mut options = RunOptions::new(json!({ "run": plan.run_id }));
    options.run_id = Some(plan.run_id.clone());
    options.parent_tool_call_id = Some(format!("call-{}", plan.run_id));
    options.input_preview = Some(plan.run_id.clone());
    let run_id = plan.run_id.clone();
    match plan.detached {
        None => {
            let signal = CancelToken::new();
            options.signal = Some(signal.clone());
            {
                let sim = sim();
                let mut seen = sim.seen.borrow_mut();
                *seen.waiting.entry(run_id.clone()).or_default() += 1;
                seen.signals.entry(run_id.clone()).or_default().push(signal);
            }
            let caller = host.clone();
            host.spawn(async move {
                let _waiting = Count("waiting", run_id.clone());
                let result = caller.run_agent_tool::<Worker>(options).await;
                let sim = sim();
                if result.status.is_live() {
                    sim.problem(format!("an awaited caller of {run_id} was handed a {:?} run", result.status));
                }
                // A dispatch refused at admission writes nothing and runs no hook.
                let record = (sim.world.upgrade())
                    .and_then(|w| w.read_sql(&parent(), |sql| Registry::new(sql).get(&run_id)).ok())
                    .flatten();
                // A refusal (a storage failure at dispatch, the cap) is not the run's outcome.
                let recorded = record.as_ref().is_some_and(|r| r.status == result.status && !r.status.is_live());
                let key = (parent(), run_id.clone(), record.map_or(0, |r| r.started_at));
                let hooks = sim.hooks.borrow();
                let finished = hooks.finish.get(&key).copied().unwrap_or(0) > 0;
                if recorded && (!finished || hooks.finishing.get(&key).copied().unwrap_or(0) > 0) {
                    drop(hooks);
                    sim.problem(format!(
                        "a caller of {run_id} got its result ({:?}: {:?}) before the run's finish hook returned",
                        result.status, result.error
                    ));
                }
            });
        }
        Some(_) => {
            let mut detached = DetachedOptions::default();
            if plan.notify {
                detached = detached.notify();
            } else {
                detached = detached.on_finish(&"handler");
            }
            if let Some(ms) = plan.budgets.0 {
                detached = detached.max_budget(Duration::from_millis(ms));
            }
            if let Some(ms) = plan.budgets.1 {
                detached = detached.no_progress_budget(Duration::from_millis(ms));
            }
            if plan.on_milestones {
                detached = detached.on_milestones(match plan.notify {
                    true => OnMilestones::react(["first-word"]),
                    false => OnMilestones::narrate(["first-word"]),
                });
            }
            let caller = host.clone();
            host.spawn(async move {
                // A refusal (the cap, storage) is the caller's to see; the run was not started.
                let _ = caller.run_agent_tool_detached::<Worker>(options, detached).await;
            });
        }
    }
}

fn crash(world: &World, object: &ObjectRef) {
    world.crash(object);
}

/// Carries out one event of the timeline.
fn happen(world: &World, clients: &[Client], ev: &Ev) {
    let sim = sim();
    match ev {
        Ev::Dispatch(i) => dispatch(world, &sim.plans[*i]),
        Ev::Redispatch(run_id) => {
            if let Some(plan) = sim.plan(run_id) {
                dispatch(world, plan)
            }
        }
        Ev::Cancel(run_id) => {
            let host = world.host::<Lead>(PARENT);
            let _ = host.cancel_agent_tool(run_id, Some("cancelled".into()));
        }
        Ev::Abandon(run_id) => {
            let signals = sim.seen.borrow_mut().signals.remove(run_id).unwrap_or_default();
            for signal in signals {
                signal.cancel(Some("the caller gave up".into()));
            }
        }
        Ev::ClearFinished => {
            let host = world.host::<Lead>(PARENT);
            let filter = ClearFilter {
                status: Some(vec![RunStatus::Completed, RunStatus::Error, RunStatus::Aborted]),
                older_than: None,
            };
            let cleared = world.block_on(async move { host.clear_agent_tool_runs(&filter).await });
            // The stock reducer cannot be told to forget a run: an app that clears runs has its
            // pages reset their local state (docs/concepts.md).
            if cleared.is_ok_and(|c| !c.is_empty()) {
                for client in clients {
                    client.reset_local_state();
                }
            }
        }
        Ev::CrashParent => crash(world, &parent()),
        Ev::CrashChild(run_id) => {
            if let Some(child) = child_of(world, run_id) {
                crash(world, &child);
            }
        }
        Ev::CrashAll => {
            for object in world.objects() {
                crash(world, &object);
            }
        }
        Ev::BreakTail(run_id) => {
            if let Some(child) = child_of(world, run_id) {
                world.break_tails_to(&child);
            }
        }
        Ev::DropClient(i) => {
            if let Some(client) = clients.get(*i).filter(|c| c.is_open()) {
                client.drop_connection();
            }
        }
    }
}

/// The child object of a run, once the world has it.
fn child_of(world: &World, run_id: &str) -> Option<ObjectRef> {
    world.objects_of::<Worker>().into_iter().find(|o| o.name.ends_with(&format!("/{run_id}")))
}

/// Runs one schedule; `Err` describes the first broken invariant.
pub(super) fn run(seed: u64, tracing: bool) -> Result<(), String> {
    let (sim, timeline, faults, clients) = scenario(seed);
    let world = World::seeded(seed)
        .route::<Lead>()
        .agent::<Worker>()
        .model::<Lead>(ScriptedModel::new().otherwise(|_| Step::new().text("noted")))
        .faults(faults);
    if tracing {
        world.echo_logs();
    }
    crate::host::io::TRACE.with(|t| t.set(tracing));
    let sim = Rc::new(Sim { hooks: world.0.hooks.clone(), world: Rc::downgrade(&world.0), ..sim });
    SIM.with(|s| *s.borrow_mut() = Some(sim.clone()));
    let outcome =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drive(&world, &sim, &timeline, clients, tracing)));
    SIM.with(|s| *s.borrow_mut() = None);
    drop(world);
    match outcome {
        Ok(result) => result,
        Err(panic) => Err(panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic".into())),
    }
}

fn drive(world: &World, sim: &Rc<Sim>, timeline: &[(i64, Ev)], clients: usize, tracing: bool) -> Result<(), String> {
    let cap = sim.options.max_concurrent;
    world.check_each_step(move |inner| {
        let Some(cap) = cap else { return Ok(()) };
        let live = inner
            .read_sql(&parent(), |sql| match crate::parent::engine::has_tables(sql)? {
                true => Registry::new(sql).live_count(),
                false => Ok(0),
            })
            .unwrap_or(0);
        match live > cap as i64 {
            true => Err(format!("{live} runs were live at once, over the cap of {cap}")),
            false => Ok(()),
        }
    });
    let hooks = sim.hooks.clone();
    world.check_each_step(move |_| match hooks.borrow().finishing.iter().find(|(_, n)| **n > 1) {
        Some(((_, run, _), n)) => Err(format!("{run}: on_agent_tool_finish ran {n} times at once")),
        None => Ok(()),
    });
    let path = "/agents/lead/p";
    let clients: Vec<Client> = (0..clients).map(|_| world.connect(path)).collect();
    let start = crate::testing::world::START_MS;
    if tracing {
        eprintln!("options: {:?}", sim.options);
        for plan in &sim.plans {
            eprintln!("plan: {plan:?}");
        }
        for (at, ev) in timeline {
            eprintln!("@{at}: {ev:?}");
        }
    }
    for (at, ev) in timeline {
        let now = world.now_ms() - start;
        if *at > now {
            world.advance(Duration::from_millis((*at - now) as u64));
        }
        happen(world, &clients, ev);
        step_problems(world, sim)?;
    }
    world.advance(Duration::from_millis(HORIZON_MS.saturating_sub((world.now_ms() - start) as u64)));
    step_problems(world, sim)?;
    crate::testing::sim::check_end(world)?;
    check_end(world, sim)
}

fn step_problems(world: &World, sim: &Sim) -> Result<(), String> {
    if let Some(problem) = world.step_problem() {
        return Err(problem);
    }
    match sim.seen.borrow().problems.first() {
        Some(problem) => Err(problem.clone()),
        None => Ok(()),
    }
}

/// The words of a text: `a<attempt>w<index>` each.
fn words(text: &str) -> Vec<(i64, i64)> {
    text.split_whitespace()
        .filter_map(|w| {
            let (a, i) = w.strip_prefix('a')?.split_once('w')?;
            Some((a.parse().ok()?, i.parse().ok()?))
        })
        .collect()
}

/// `text` is a prefix of one attempt's answer (and the whole of it when `whole_of`).
fn one_attempt(text: &str, whole_of: Option<usize>) -> Result<(), String> {
    let w = words(text);
    let Some(&(attempt, _)) = w.first() else { return Ok(()) };
    for (k, &(a, i)) in w.iter().enumerate() {
        if a != attempt || i != k as i64 {
            return Err(format!("{text:?} joins attempts or skips words"));
        }
    }
    if let Some(total) = whole_of {
        if w.len() != total {
            return Err(format!("{text:?} is not a whole answer of {total} words"));
        }
    }
    Ok(())
}

/// What the end must show, beyond the kit's own invariants.
fn check_end(world: &World, sim: &Sim) -> Result<(), String> {
    let (runs, frames, live) = world.with_sql(&parent(), |sql| {
        let registry = Registry::new(sql);
        Ok((registry.all()?, registry.replay()?, registry.live_count()?))
    })?;
    for run in &runs {
        // Nothing in this world fails a run for real (its children never fail), so an `error`
        // is a run lost to a fault: a restart must heal or seal, never fail.
        if run.status == RunStatus::Error {
            return Err(format!("run {} ended error: {:?}", run.run_id, run.outcome));
        }
        let total = sim.plan(&run.run_id).map_or(0, |p| p.script.words);
        if run.status == RunStatus::Completed {
            one_attempt(run.outcome.as_ref().and_then(Outcome::summary).unwrap_or_default(), Some(total))
                .map_err(|e| format!("run {}: the summary {e}", run.run_id))?;
        }
    }
    // Replay: each attempt's text on its own, the last one the summary.
    for run in &runs {
        let mine: Vec<Value> = (frames.iter())
            .map(|f| serde_json::to_value(f).unwrap_or(Value::Null))
            .filter(|f| f["event"]["runId"] == run.run_id.as_str())
            .collect();
        let mut segments = vec![String::new()];
        for f in &mine {
            let Some(body) = f["event"]["body"].as_str() else { continue };
            let Ok(chunk) = serde_json::from_str::<Value>(body) else { continue };
            match chunk["type"].as_str() {
                Some("text-delta") => segments.last_mut().expect("one").push_str(chunk["delta"].as_str().unwrap_or("")),
                Some(crate::protocol::chunk::SUPERSEDED_PART) => segments.push(String::new()),
                _ => {}
            }
        }
        for segment in &segments {
            one_attempt(segment, None).map_err(|e| format!("run {}: a replayed attempt {e}", run.run_id))?;
        }
        let milestone = mine
            .iter()
            .any(|f| f["event"]["body"].as_str().is_some_and(|b| b.contains(crate::protocol::chunk::MILESTONE_PART)));
        // What a drain that broke off did not read is not in the replay (the engine records
        // the outcome anyway, and says so: `agent_tool:recovery:drain_incomplete`).
        let drained = !sim.seen.borrow().drains_incomplete.contains(&run.run_id);
        let reported = sim.plan(&run.run_id).is_some_and(|p| p.script.milestone);
        if reported && run.status == RunStatus::Completed && drained && !milestone {
            return Err(format!("run {}: the child's milestone is not in the replay", run.run_id));
        }
        if run.status == RunStatus::Completed && run.event_delivery == crate::types::EventDelivery::Full && drained {
            let last = segments.last().expect("one");
            if Some(last.as_str()) != run.outcome.as_ref().and_then(Outcome::summary) {
                return Err(format!(
                    "run {}: the replay's last attempt {last:?} is not the summary {:?}",
                    run.run_id, run.outcome
                ));
            }
        }
    }
    if live != 0 {
        return Err(format!("{live} runs still hold a slot"));
    }
    let seen = sim.seen.borrow();
    if let Some((run, n)) = seen.waiting.iter().next() {
        return Err(format!("{n} callers of {run} never got its result"));
    }
    // Deliveries.
    let crashed = world.0.crashed.get();
    let storage_failed = world.objects().iter().any(|o| world.failed_statements(o) > 0);
    let messages = world.with_sql(&parent(), |sql| crate::chat::store::Messages::new(sql).list())?;
    for run in &runs {
        let Some(plan) = sim.plan(&run.run_id) else { continue };
        let Some(handler) = plan.detached else { continue };
        let count = |map: &BTreeMap<(String, &'static str), usize>, slot| {
            map.get(&(incarnation(&run.run_id, run.started_at), slot)).copied().unwrap_or(0)
        };
        if plan.notify {
            // Posting its notice is the delivery.
            let posted = messages
                .iter()
                .filter_map(|m| m["id"].as_str())
                .any(|id| id.starts_with("detached-finish:") && id.contains(&run.run_id));
            if !posted {
                return Err(format!("run {} ended {:?} and its notice was never posted", run.run_id, run.status));
            }
            continue;
        }
        for slot in ["Finish", "GiveUp"] {
            let attempts = count(&seen.attempts, slot);
            let delivered = count(&seen.delivered, slot);
            if attempts as i64 > crate::parent::detached::MAX_ATTEMPTS {
                return Err(format!("run {}: {attempts} attempts at {slot}", run.run_id));
            }
            if handler == Handler::Always && delivered > 0 {
                return Err(format!("run {}: a handler that always fails was delivered", run.run_id));
            }
            if !crashed && !storage_failed && delivered > 1 {
                return Err(format!("run {}: {slot} delivered {delivered} times without a crash", run.run_id));
            }
        }
        let (finish, give_up) = (count(&seen.delivered, "Finish"), count(&seen.delivered, "GiveUp"));
        let gave_up = count(&seen.attempts, "GiveUp") > 0;
        let delivered = match run.status {
            RunStatus::Interrupted if gave_up => give_up,
            RunStatus::Aborted if gave_up => give_up + finish,
            _ => finish,
        };
        if matches!(handler, Handler::Ok | Handler::FailFirst(_)) && delivered == 0 {
            return Err(format!("run {} ended {:?} and its handler never got it", run.run_id, run.status));
        }
    }
    Ok(())
}
