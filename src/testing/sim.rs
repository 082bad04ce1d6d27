//! Seeded schedules over a Worker's own agents: each seed picks the order ready work runs in and
//! when faults strike; the library's invariants are checked after every step and at the end,
//! then the test's own. A failing seed prints the line that replays it.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

use serde_json::Value;

use super::world::{Faults, ObjectRef, World};
use crate::parent::registry::Registry;
use crate::routing::parse_agent_path;

/// The env var that replays one seed: `AGENT_TOOLS_SEED=<seed> cargo test <test>`.
pub const SEED_VAR: &str = "AGENT_TOOLS_SEED";

/// An invariant of a test's own.
type Check = dyn Fn(&World) -> Result<(), String>;

/// Runs a scenario over many seeded worlds (see the module docs of [`crate::testing`]).
///
/// ```
/// # use agent_tools::prelude::*;
/// # #[derive(Default)] pub struct Planner;
/// # impl agent_tools::AgentClass for Planner { const CLASS: &'static str = "Planner"; const BINDING: &'static str = "Planner"; }
/// # impl Agent for Planner {}
/// use agent_tools::testing::{Faults, Simulation};
/// Simulation::new(|world| world.route::<Planner>())
///     .faults(Faults::chaos())
///     .schedules(20)
///     .run(|world| {
///         let client = world.connect("/agents/planner/p");
///         client.send_chat("hello");
///     });
/// ```
pub struct Simulation<S: Fn(World) -> World> {
    setup: S,
    faults: Faults,
    schedules: u64,
    base: u64,
    checks: Vec<Box<Check>>,
}

impl<S: Fn(World) -> World> std::fmt::Debug for Simulation<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simulation")
            .field("faults", &self.faults)
            .field("schedules", &self.schedules)
            .field("base", &self.base)
            .field("checks", &self.checks.len())
            .finish_non_exhaustive()
    }
}

impl<S: Fn(World) -> World> Simulation<S> {
    /// A simulation of the world `setup` builds (its agent classes, vars and models) from a
    /// seeded one. 100 schedules, no faults, until told otherwise.
    pub fn new(setup: S) -> Self {
        Self { setup, faults: Faults::default(), schedules: 100, base: 0, checks: Vec::new() }
    }

    /// The faults each world injects.
    pub fn faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    /// How many seeds to run (from the base seed on).
    pub fn schedules(mut self, n: u64) -> Self {
        self.schedules = n;
        self
    }

    /// The first seed (default 0).
    pub fn base(mut self, seed: u64) -> Self {
        self.base = seed;
        self
    }

    /// An invariant of the test's own, checked at the end of every schedule.
    pub fn check<E: std::fmt::Display>(mut self, check: impl Fn(&World) -> Result<(), E> + 'static) -> Self {
        self.checks.push(Box::new(move |world| check(world).map_err(|e| e.to_string())));
        self
    }

    /// Runs `scenario` in each seeded world, then lets the world settle with the faults over,
    /// and checks the invariants. `AGENT_TOOLS_SEED=<seed>` runs that seed only. Panics with
    /// the seed and the line that replays it at the first failure. Returns the faults injected
    /// over all the schedules.
    pub fn run(self, scenario: impl Fn(&World)) -> usize {
        let seeds: Vec<u64> = match std::env::var(SEED_VAR).ok().and_then(|s| s.parse().ok()) {
            Some(seed) => vec![seed],
            None => (self.base..self.base + self.schedules).collect(),
        };
        let mut injected = 0;
        for seed in seeds {
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                let world = (self.setup)(World::seeded(seed).faults(self.faults.clone()));
                scenario(&world);
                world.settle_after_faults(self.faults.until);
                let mut problems = Vec::new();
                if let Err(problem) = check_end(&world) {
                    problems.push(problem);
                }
                for check in &self.checks {
                    if let Err(problem) = check(&world) {
                        problems.push(problem);
                    }
                }
                (problems, world.injected_faults())
            }));
            match outcome {
                Ok((problems, n)) if problems.is_empty() => injected += n,
                Ok((problems, _)) => fail(seed, &problems.join("; ")),
                Err(panic) => {
                    eprintln!("seed {seed} panicked; replay it with {SEED_VAR}={seed} cargo test <this test>");
                    resume_unwind(panic)
                }
            }
        }
        injected
    }
}

fn fail(seed: u64, problem: &str) -> ! {
    panic!(
        "seed {seed} broke an invariant: {problem}\nreplay it: {SEED_VAR}={seed} cargo test <this test> -- --nocapture"
    )
}

/// The library's invariants once a world settled: every run ended; each run's replay is in
/// increasing sequence and ends with its terminal frame; no child owes a clear; every ended
/// run's finish hook ran (exactly once when nothing crashed); every client connected to a
/// parent holds the same state of its retained runs as a client that connects now.
pub(crate) fn check_end(world: &World) -> Result<(), String> {
    check_turns(world)?;
    for object in world.objects() {
        let Some((runs, frames, owed)) = world.with_sql(&object, |sql| {
            if !crate::parent::engine::has_tables(sql).unwrap_or(false) {
                return Ok(None);
            }
            let registry = Registry::new(sql);
            Ok(Some((registry.all()?, registry.replay()?, registry.child_clears_pending()?)))
        })?
        else {
            continue;
        };
        for run in &runs {
            if run.status.is_live() {
                return Err(format!("{object}: run {} is still {:?} after the world settled", run.run_id, run.status));
            }
            let key = (object.clone(), run.run_id.clone(), run.started_at);
            let hooks = world.0.hooks.borrow().finish.get(&key).copied().unwrap_or(0);
            // At least once; exactly once unless an instance crashed or a statement failed (the
            // record that it returned was lost, so it is called again).
            let storage_failed = world.objects().iter().any(|o| world.failed_statements(o) > 0);
            if hooks == 0 || (hooks > 1 && !world.0.crashed.get() && !storage_failed) {
                return Err(format!(
                    "{object}: the finish hook of {} ({:?}, {:?}) ran {hooks} times",
                    run.run_id, run.status, run.outcome
                ));
            }
            let mine: Vec<Value> = (frames.iter())
                .map(|f| serde_json::to_value(f).unwrap_or(Value::Null))
                .filter(|f| f["event"]["runId"] == run.run_id.as_str())
                .collect();
            let sequences: Vec<i64> = mine.iter().filter_map(|f| f["sequence"].as_i64()).collect();
            if sequences.windows(2).any(|w| w[0] >= w[1]) {
                return Err(format!("{object}: run {}'s replay is out of order: {sequences:?}", run.run_id));
            }
            let last = mine.last().and_then(|f| f["event"]["kind"].as_str()).unwrap_or_default();
            if !mine.is_empty() && !["finished", "error", "aborted", "interrupted"].contains(&last) {
                return Err(format!(
                    "{object}: run {}'s replay ends with {last:?}, not its terminal frame",
                    run.run_id
                ));
            }
        }
        if owed != 0 {
            return Err(format!("{object}: {owed} children still owe a clear"));
        }
        let retained: Vec<&str> = runs.iter().map(|r| r.run_id.as_str()).collect();
        let clients = world.clients_of(&object);
        if clients.is_empty() {
            continue;
        }
        let class = world.class_name(&object.binding).unwrap_or_default();
        let path = format!("/agents/{}/{}", crate::routing::kebab_case(class), object.name);
        let late = world.try_connect(&path).map_err(|e| e.to_string())?;
        world.settle();
        let expected = runs_by_id(&late.runs(), &retained);
        for client in clients {
            let state = runs_by_id(&client.runs_json(), &retained);
            if state != expected {
                return Err(format!(
                    "{object}: a client that stayed (or reconnected) holds {state}, a client connecting now {expected}"
                ));
            }
        }
        late.close();
    }
    Ok(())
}

/// The chat's invariants once a world settled: no turn is left open and no injected message
/// left waiting; no answer keeps a tool part open (`input-streaming`, `input-available`) but a
/// partial a restart saved for a re-run; and each reply a client assembled is the stored message
/// with its id.
pub(crate) fn check_turns(world: &World) -> Result<(), String> {
    for object in world.objects() {
        let (open, held, messages, waiting) = world.with_sql(&object, |sql| {
            let open = crate::chat::journal::Journal::new(sql).open()?;
            let held = sql.one("SELECT count(*) FROM chat_held_messages", &[])?.and_then(|r| r.int(0)).unwrap_or(0);
            let waiting: Vec<String> =
                crate::chat::interaction::Interactions::new(sql).unanswered()?.into_iter().map(|i| i.call_id).collect();
            Ok((open, held, crate::chat::store::Messages::new(sql).list()?, waiting))
        })?;
        if let Some(turn) = open.first() {
            return Err(format!("{object}: chat turn {} is still open after the world settled", turn.request_id));
        }
        if held != 0 {
            return Err(format!("{object}: {held} injected messages still wait for a turn"));
        }
        for message in &messages {
            let meta = &message["metadata"];
            if meta["interrupted"] == Value::Bool(true) || meta["superseded"] == Value::Bool(true) {
                continue;
            }
            let parts = message["parts"].as_array().into_iter().flatten();
            // A call that waits for a person (a client-side tool's output) is open by design.
            if let Some(open) = parts
                .filter(|p| p["type"].as_str().is_some_and(|t| t.starts_with("tool-")))
                .filter(|p| !waiting.iter().any(|w| p["toolCallId"] == w.as_str()))
                .find(|p| matches!(p["state"].as_str(), Some("input-streaming" | "input-available")))
            {
                return Err(format!("{object}: message {} keeps a tool part open: {open}", message["id"]));
            }
        }
        for client in world.clients_of(&object) {
            for reply in client.finished_replies() {
                let Some(stored) = messages.iter().find(|m| m["id"] == reply["id"]) else { continue };
                if stored["parts"] != reply["parts"] {
                    return Err(format!(
                        "{object}: a client shows {} as {}, the store holds {}",
                        reply["id"], reply["parts"], stored["parts"]
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The `runsById` of a reducer state, for the runs still retained.
fn runs_by_id(state: &Value, retained: &[&str]) -> Value {
    let mut out = serde_json::Map::new();
    if let Some(runs) = state["runsById"].as_object() {
        for (id, run) in runs.iter().filter(|(id, _)| retained.contains(&id.as_str())) {
            let mut run = run.clone();
            // The stock reducer stamps a progress snapshot with the time the client heard it
            // (`Date.now()`), so it differs between clients by design.
            if let Some(progress) = run.get_mut("progress").and_then(Value::as_object_mut) {
                progress.remove("at");
            }
            out.insert(id.clone(), run);
        }
    }
    Value::Object(out)
}

impl World {
    /// Runs until the faults are over, then until nothing happens for a while, every dropped
    /// client back.
    pub(crate) fn settle_after_faults(&self, until: std::time::Duration) {
        let end = crate::types::time_of(super::world::START_MS) + until;
        if let Ok(left) = end.duration_since(self.now()) {
            self.advance(left);
        }
        self.settle();
    }

    /// The clients connected to `object` itself (not drilled in to a child).
    pub(crate) fn clients_of(&self, object: &ObjectRef) -> Vec<std::rc::Rc<super::client::Inbox>> {
        let clients = self.0.clients.borrow();
        clients
            .iter()
            .filter_map(std::rc::Weak::upgrade)
            .filter(|c| c.listening())
            .filter(|c| {
                let class = self.class_name(&object.binding).unwrap_or_default();
                parse_agent_path(&c.path).is_some_and(|p| {
                    p.sub.is_none() && p.name == object.name && p.agent == crate::routing::kebab_case(class)
                })
            })
            .collect()
    }
}
