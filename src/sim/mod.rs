//! A deterministic simulation of the orchestration: the parent and child engines the Worker
//! runs, in a simulated world of objects that crash (memory lost, SQLite storage kept), a
//! network that drops and delays hops and breaks tails, clients that drop and reconnect, slow
//! and silent children, failing handlers, and a clock, all driven by one seed. After every step
//! and at the end it checks the invariants docs/testing.md lists:
//!
//! - every run reaches a terminal status (after the faults stop);
//! - no summary, transcript or replay joins two attempts of a child's answer;
//! - a frame's `(run, sequence)` always names the same content, and a run's frames replay in
//!   increasing sequence;
//! - a client that dropped and reconnected ends in the same state (the stock reducer, ported)
//!   as one that never dropped and as a late client;
//! - detached handlers: exactly once without crashes, at least once with, never past the dead
//!   letter; the global finish hook at most once per run (exactly once without crashes); the
//!   concurrency cap never exceeded and no slot leaked; awaited callers only ever get a
//!   terminal result.
//!
//! `cargo test --lib sim::` runs the kept regression seeds and then `SIM_SCHEDULES` (10 000)
//! seeded schedules; a failure prints the seed and the command that replays it with a trace:
//! `SIM_SEED=<seed> cargo test --lib sim::replay -- --nocapture`.

pub(crate) use crate::testing::reducer;
mod shipped;
mod world;

use serde_json::Value;

use crate::parent::registry::Registry;
use crate::types::RunStatus;
use crate::types::{AgentToolOptions, RecoveryPolicy};
use world::{Handler, Planned, Rng, TurnScript, World};

/// Seeds that once found a bug, kept as regression cases.
const REGRESSIONS: &[u64] = &[4, 44, 53, 109, 203, 263, 382, 1295, 1829, 2600, 2824, 3318, 7448, 8112, 162137, 305742];

/// The simulated time a schedule runs for: long enough for every budget and stall to play out.
const HORIZON_MS: i64 = 30 * 60 * 1000;

/// Builds the scenario of `seed`.
fn scenario(seed: u64) -> (World, Option<usize>) {
    let mut rng = Rng::new(seed.wrapping_mul(0x2545_f491_4f6c_dd1d));
    let policy = if rng.chance(0.7) { RecoveryPolicy::Rerun } else { RecoveryPolicy::Seal };
    let cap = rng.chance(0.2).then_some(2usize);
    let runs = rng.range(1, 3) as usize;
    let mut planned = Vec::new();
    for i in 0..runs {
        let detached = rng.chance(0.4).then(|| match rng.range(0, 5) {
            0 => Handler::Always,
            1 => Handler::FailFirst(rng.range(1, 3)),
            _ => Handler::Ok,
        });
        let budgets = if detached.is_some() && rng.chance(0.3) {
            (Some(rng.range(20_000, 90_000) as u64), Some(rng.range(3_000, 20_000) as u64))
        } else {
            (None, None)
        };
        let words = rng.range(2, 6) as usize;
        let stall_after = rng.chance(0.15).then(|| rng.range(1, words as i64) as usize);
        planned.push(Planned {
            at: rng.range(0, 1_500),
            run_id: format!("r{i}"),
            detached,
            budgets,
            script: TurnScript {
                words,
                step_ms: rng.range(10, 150),
                stall_after,
                stall_ms: rng.range(1_000, 200_000),
                milestone: rng.chance(0.5),
            },
            notify: false,
            on_milestones: false,
        });
    }
    let options = AgentToolOptions {
        max_concurrent: cap,
        recovery_alarm: std::time::Duration::from_millis(rng.range(1_000, 10_000) as u64),
        reattach_no_progress_timeout: std::time::Duration::from_millis(rng.range(20_000, 120_000) as u64),
        reattach_max_window: rng
            .chance(0.2)
            .then(|| std::time::Duration::from_millis(rng.range(30_000, 300_000) as u64)),
        recovery: policy,
        ..AgentToolOptions::default()
    };
    let clients = rng.range(2, 3) as usize;
    let mut world = World::new(seed, options, policy, planned, clients);
    world.drop_rate = if rng.chance(0.3) { 0.05 } else { 0.0 };
    world.calm_after = 8_000;
    for _ in 0..rng.range(0, 3) {
        let at = rng.range(100, 7_000);
        let run = format!("r{}", rng.range(0, runs as i64 - 1));
        match rng.range(0, 4) {
            0 => world.crash_parent_at(at),
            1 => world.crash_child_at(at, &run),
            2 => world.break_tail_at(at, &run),
            _ => {
                let client = rng.range(0, clients as i64 - 1) as usize;
                world.drop_client_at(client, at, at + rng.range(100, 2_000));
            }
        }
    }
    if rng.chance(0.15) {
        world.cancel_at(rng.range(50, 6_000), &format!("r{}", rng.range(0, runs as i64 - 1)));
    }
    if rng.chance(0.3) {
        world.redispatch_at(rng.range(2_000, 9_000), &format!("r{}", rng.range(0, runs as i64 - 1)));
    }
    if rng.chance(0.05) {
        world.clear_at(rng.range(5_000, 7_500));
    }
    // Drawn last, so the draws above (and the regression seeds' scenarios) stay as they were.
    if rng.chance(0.15) {
        world.crash_all_at(rng.range(100, 7_000));
    }
    // The hostile network and storage, the queue, and the chat's notices: drawn after all the
    // rest, for the same reason.
    world.hostile = rng.chance(0.5);
    world.storage_fault_rate = if rng.chance(0.3) { 0.03 } else { 0.0 };
    if cap.is_some() && rng.chance(0.5) {
        world.queue_admissions();
    }
    for plan in &mut world.planned {
        if plan.detached.is_some() {
            plan.notify = rng.chance(0.3);
            plan.on_milestones = rng.chance(0.4);
        }
    }
    if rng.chance(0.2) {
        world.abandon_at(rng.range(50, 6_000), &format!("r{}", rng.range(0, runs as i64 - 1)));
    }
    (world, cap)
}

/// What every step must keep.
fn check_step(world: &World, cap: Option<usize>) -> Result<(), String> {
    if let Some(cap) = cap {
        if world.observed.max_live > cap as i64 {
            return Err(format!("{} runs were live at once, over the cap of {cap}", world.observed.max_live));
        }
    }
    if let Some((run, seq, first, second)) = world.observed.reused.first() {
        return Err(format!("run {run}: sequence {seq} named two frames:\n  {first}\n  {second}"));
    }
    if let Some((run, last, then)) = world.observed.out_of_order.first() {
        return Err(format!("run {run}: live sequence {then} after {last}"));
    }
    if let Some((run, status)) = world.observed.resolved.iter().find(|(_, s)| s.is_live()) {
        return Err(format!("an awaited caller of {run} was handed a {status:?} run"));
    }
    if let Some(run) = world.observed.past_dead_letter.first() {
        return Err(format!("{run}: a delivery was attempted past the dead letter"));
    }
    // At least once: called again only when the instance that called it died before it
    // returned (or could not record that it did), never while a call of it runs.
    if let Some(run) = world.observed.overlapping_hooks.first() {
        return Err(format!("{run}: on_agent_tool_finish called while a call of it ran"));
    }
    if let Some(((run, name), n)) = world.observed.notices.iter().find(|(_, n)| **n > 1) {
        return Err(format!("{run}: milestone {name} surfaced {n} times"));
    }
    if let Some(((run, status), n)) = world.observed.notified.iter().find(|(_, n)| **n > 1) {
        return Err(format!("{run}: its {status} outcome was posted to the chat {n} times"));
    }
    if let Some(run) = world.observed.early_results.first() {
        return Err(format!("a caller of {run} got its result before the run's finish hook returned"));
    }
    if let Some((run, at, frame)) = world.observed.after_terminal.first() {
        return Err(format!("run {run}: {frame} was broadcast after its terminal frame @{at}"));
    }
    if let Some((run, at, frame)) = world.observed.replay_after_terminal.first() {
        return Err(format!("run {run}: a replay sent {frame} after its terminal frame @{at}"));
    }
    let failed = world.parent_db.failures.get();
    let reported: usize = world.observed.storage_failures.values().sum();
    if failed != reported {
        return Err(format!("{failed} storage statements failed and {reported} failures were reported"));
    }
    Ok(())
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

/// `text` is a prefix of one attempt's answer (and the whole of it when `whole`).
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

/// What the end must show.
fn check_end(world: &mut World) -> Result<(), String> {
    let registry = Registry::new(world.parent_db.as_ref());
    let runs = registry.all().map_err(|e| e.to_string())?;
    for run in &runs {
        if run.status.is_live() {
            return Err(format!(
                "run {} is still {:?} at the end (driven: {}, alarm: {:?})",
                run.run_id,
                run.status,
                world.driving(&run.run_id),
                world.alarm()
            ));
        }
        // Nothing in the simulated world fails a run for real (its children never error), so
        // an `error` is a run lost to a fault: a restart must heal or seal, never fail.
        if run.status == RunStatus::Error {
            return Err(format!("run {} ended error: {:?}", run.run_id, run.error_message));
        }
        let plan = world.planned.iter().find(|p| p.run_id == run.run_id);
        let total = plan.map_or(0, |p| p.script.words);
        if run.status == RunStatus::Completed {
            one_attempt(run.summary.as_deref().unwrap_or_default(), Some(total))
                .map_err(|e| format!("run {}: the summary {e}", run.run_id))?;
        }
        // The child's transcript: every assistant message is one attempt's.
        for message in world.child_messages(&run.run_id) {
            if message["role"] == "assistant" {
                let text: String = message["parts"]
                    .as_array()
                    .map(|p| p.iter().filter(|p| p["type"] == "text").filter_map(|p| p["text"].as_str()).collect())
                    .unwrap_or_default();
                one_attempt(&text, None).map_err(|e| format!("run {}: the child's transcript {e}", run.run_id))?;
            }
        }
    }
    // Replay: in increasing sequence; each attempt's text on its own, the last one the summary.
    let frames = registry.replay().map_err(|e| e.to_string())?;
    for run in &runs {
        let mine: Vec<Value> = frames
            .iter()
            .map(|f| serde_json::to_value(f).unwrap_or(Value::Null))
            .filter(|f| f["event"]["runId"] == run.run_id.as_str())
            .collect();
        let seqs: Vec<i64> = mine.iter().filter_map(|f| f["sequence"].as_i64()).collect();
        if seqs.windows(2).any(|w| w[0] >= w[1]) {
            return Err(format!("run {}: replay sequences {seqs:?}", run.run_id));
        }
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
            one_attempt(segment, None).map_err(|e| {
                let frames: Vec<String> = mine.iter().map(|f| f.to_string()).collect();
                format!("run {}: a replayed attempt {e}; its frames:\n  {}", run.run_id, frames.join("\n  "))
            })?;
        }
        let drained = !world.observed.drains_incomplete.contains(&run.run_id);
        // Nothing is lost: a milestone the child reported is in the run's replay.
        let reported = world.planned.iter().any(|p| p.run_id == run.run_id && p.script.milestone);
        let milestone = mine
            .iter()
            .any(|f| f["event"]["body"].as_str().is_some_and(|b| b.contains(crate::protocol::chunk::MILESTONE_PART)));
        if reported && run.status == RunStatus::Completed && drained && !milestone {
            return Err(format!("run {}: the child's milestone is not in the replay", run.run_id));
        }
        if run.status == RunStatus::Completed && run.event_delivery == crate::types::EventDelivery::Full && drained {
            let last = segments.last().expect("one");
            if Some(last.as_str()) != run.summary.as_deref() {
                return Err(format!(
                    "run {}: the replay's last attempt {last:?} is not the summary {:?}",
                    run.run_id, run.summary
                ));
            }
        }
    }
    // Cleared runs: every child deleted its storage (a failed clear was asked again).
    let owed = registry.child_clears_pending().map_err(|e| e.to_string())?;
    if owed != 0 {
        return Err(format!("{owed} children still owe a clear at the end"));
    }
    for run_id in world.children_holding_runs() {
        if !runs.iter().any(|r| r.run_id == run_id) {
            return Err(format!("the child of cleared run {run_id} still holds it"));
        }
    }
    // Callers: every one that waited got its result (the queued ones too).
    if let Some((run, n)) = world.waiting_callers().first() {
        return Err(format!("{n} callers of {run} never got its result"));
    }
    // Slots: none leaked.
    let live = registry.live_count().map_err(|e| e.to_string())?;
    if live != 0 {
        return Err(format!("{live} runs still hold a slot"));
    }
    // Clients: the ones that stayed, the ones that came back, and a late one agree.
    let mut late = reducer::Client::new();
    for frame in &frames {
        late.receive(&serde_json::to_value(frame).unwrap_or(Value::Null));
    }
    let retained: Vec<&str> = runs.iter().map(|r| r.run_id.as_str()).collect();
    let expected = runs_by_id(&late.state_json(), &retained);
    for (i, client) in world.clients.iter().enumerate() {
        let got = runs_by_id(&client.reducer.state_json(), &retained);
        if got != expected {
            return Err(format!(
                "client {i} (reconnected: {}) disagrees with a late client:\n  it has   {got}\n  late has {expected}",
                client.reconnected
            ));
        }
    }
    // Deliveries and hooks.
    let crashed = world.observed.crashes > 0;
    for run in &runs {
        let Some(plan) = world.planned.iter().find(|p| p.run_id == run.run_id) else { continue };
        let hooks = world.observed.finish_hooks.get(&run.run_id).copied().unwrap_or(0);
        if hooks == 0 || (!crashed && world.parent_db.failures.get() == 0 && hooks != 1) {
            return Err(format!("run {}: on_agent_tool_finish fired {hooks} times (crashed: {crashed})", run.run_id));
        }
        let Some(handler) = plan.detached else { continue };
        // A `notify` run has no handler of its own: posting its notice is the delivery.
        let handler = if plan.notify { Handler::Ok } else { handler };
        for slot in ["Finish", "GiveUp"] {
            let key = (run.run_id.clone(), slot.to_owned());
            let attempts = world.observed.deliveries.get(&key).copied().unwrap_or(0);
            let delivered = world.observed.delivered.get(&key).copied().unwrap_or(0);
            if attempts > crate::parent::detached::MAX_ATTEMPTS {
                return Err(format!("run {}: {attempts} attempts at {slot}", run.run_id));
            }
            if handler == Handler::Always && delivered > 0 {
                return Err(format!("run {}: a handler that always fails was delivered", run.run_id));
            }
            let storage_failed = world.observed.storage_failures.get(&run.run_id).copied().unwrap_or(0) > 0;
            if !crashed && !storage_failed && delivered > 1 {
                return Err(format!("run {}: {slot} delivered {delivered} times without a crash", run.run_id));
            }
        }
        // The outcome the run ended with reached a handler that can succeed: at least once
        // (exactly once without a crash, above). A give-up is delivered in its own slot.
        let finish = world.observed.delivered.get(&(run.run_id.clone(), "Finish".to_owned())).copied().unwrap_or(0);
        let give_up = world.observed.delivered.get(&(run.run_id.clone(), "GiveUp".to_owned())).copied().unwrap_or(0);
        let gave_up = world.observed.deliveries.contains_key(&(run.run_id.clone(), "GiveUp".to_owned()));
        let delivered = match run.status {
            RunStatus::Interrupted if gave_up => give_up,
            // The teardown after a give-up aborts the child: the give-up was the outcome (and a
            // cancel after a give-up is delivered as the real one).
            RunStatus::Aborted if gave_up => give_up + finish,
            _ => finish,
        };
        if matches!(handler, Handler::Ok | Handler::FailFirst(_)) && delivered == 0 {
            return Err(format!("run {} ended {:?} and its handler never got it", run.run_id, run.status));
        }
        // A real outcome after a give-up is delivered too (soft means soft).
        if gave_up && matches!(run.status, RunStatus::Completed) && handler != Handler::Always && finish == 0 {
            return Err(format!("run {}: its late result after a give-up was never delivered", run.run_id));
        }
    }
    Ok(())
}

/// The `runsById` of a reducer state, for the runs still retained.
fn runs_by_id(state: &Value, retained: &[&str]) -> Value {
    let mut out = serde_json::Map::new();
    if let Some(runs) = state["runsById"].as_object() {
        for (id, run) in runs {
            if retained.contains(&id.as_str()) {
                out.insert(id.clone(), run.clone());
            }
        }
    }
    Value::Object(out)
}

/// Runs one schedule; `Err` describes the first broken invariant.
fn run(seed: u64, tracing: bool) -> (Result<(), String>, Vec<String>) {
    let (mut world, cap) = scenario(seed);
    world.tracing = tracing;
    let mut result = world.run(HORIZON_MS, &mut |w| check_step(w, cap));
    if result.is_ok() {
        // A late client, and the clients still away, come back before the end is judged.
        result = check_end(&mut world);
    }
    (result, std::mem::take(&mut world.observed.trace))
}

fn fail(seed: u64, problem: &str) -> ! {
    panic!(
        "seed {seed} broke an invariant: {problem}\nreplay it with a trace:\n  SIM_SEED={seed} cargo test --lib sim::replay -- --nocapture"
    )
}

#[test]
fn regression_seeds_hold() {
    for &seed in REGRESSIONS {
        if let (Err(problem), _) = run(seed, false) {
            fail(seed, &problem);
        }
    }
}

#[test]
fn seeded_schedules_hold() {
    let schedules: u64 = std::env::var("SIM_SCHEDULES").ok().and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let base: u64 = std::env::var("SIM_BASE").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).min(8) as u64;
    let failure = std::sync::Mutex::new(None);
    std::thread::scope(|scope| {
        for t in 0..threads {
            let failure = &failure;
            scope.spawn(move || {
                let mut seed = base + t;
                while seed < base + schedules {
                    if failure.lock().map(|f| f.is_some()).unwrap_or(true) {
                        return;
                    }
                    if let (Err(problem), _) = run(seed, false) {
                        if let Ok(mut f) = failure.lock() {
                            f.get_or_insert((seed, problem));
                        }
                        return;
                    }
                    seed += threads;
                }
            });
        }
    });
    if let Some((seed, problem)) = failure.into_inner().ok().flatten() {
        fail(seed, &problem);
    }
}

/// Replays `SIM_SEED` with a trace (a no-op without it).
#[test]
fn replay() {
    let Some(seed) = std::env::var("SIM_SEED").ok().and_then(|s| s.parse().ok()) else { return };
    let (result, trace) = run(seed, true);
    for line in &trace {
        println!("{line}");
    }
    if let Err(problem) = result {
        fail(seed, &problem);
    }
}

#[test]
fn shipped_regression_seeds_hold() {
    for &seed in shipped::REGRESSIONS {
        if let Err(problem) = shipped::run(seed) {
            fail(seed, &problem);
        }
    }
}

#[test]
fn shipped_schedules_hold() {
    let schedules: u64 = std::env::var("SIM_SCHEDULES").ok().and_then(|s| s.parse().ok()).unwrap_or(2_000);
    let base: u64 = std::env::var("SIM_BASE").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    if let Some(seed) = std::env::var("SIM_SEED").ok().and_then(|s| s.parse().ok()) {
        if let Err(problem) = shipped::run(seed) {
            fail(seed, &problem);
        }
        return;
    }
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).min(8) as u64;
    let failure = std::sync::Mutex::new(None);
    std::thread::scope(|scope| {
        for t in 0..threads {
            let failure = &failure;
            scope.spawn(move || {
                let mut seed = base + t;
                while seed < base + schedules {
                    if failure.lock().map(|f| f.is_some()).unwrap_or(true) {
                        return;
                    }
                    if let Err(problem) = shipped::run(seed) {
                        if let Ok(mut f) = failure.lock() {
                            f.get_or_insert((seed, problem));
                        }
                        return;
                    }
                    seed += threads;
                }
            });
        }
    });
    if let Some((seed, problem)) = failure.into_inner().ok().flatten() {
        fail(seed, &problem);
    }
}
