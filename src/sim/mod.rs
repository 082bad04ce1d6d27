//! The deterministic simulation of the orchestration, over the code that ships: a parent agent
//! (`Lead`) and its children (`Worker`) hosted by the test kit's [`crate::testing::World`] — the
//! real host, engines, chat and wire protocol, over real SQLite, on a virtual clock — driven by
//! one seed. There is no second interpreter of the engines' actions: the host carries them out.
//!
//! The seed draws the runs (awaited or detached, their handlers — some failing, some slower
//! than the delivery lease — their budgets, `notify` and milestone notices, some suppressed by
//! the formatting hook), the children's turns (words, pace, silences, a milestone), the options
//! (recovery policy, cap and admission queue, re-attach budgets), and the faults: crashes of the
//! parent, of a child, of everything at once (a deploy); broken tails; dropped clients; cancels,
//! clears, re-dispatches and callers that give up; and in a hostile world, slow and lost hops
//! and tails that break at random, and storage statements that fail in every object's store
//! (3 % of them in three schedules out of ten).
//!
//! After every step: no frame's `(run, sequence)` names two frames, nothing follows a run's
//! terminal frame (the kit's clients check every frame); the cap is never exceeded; no finish
//! hook and no delivery of a slot runs twice at once; an awaited caller gets only a terminal
//! result, and only after the run's finish hook returned. At the end: every run ended, none
//! `error`; its replay in increasing sequence, ending with its terminal frame; no summary or
//! replayed attempt joins two attempts, and the replay's last attempt is the summary; a child's
//! milestone is in the replay; every caller that waited got its result; no slot leaked and no
//! clear owed; finish hooks exactly once unless something crashed or a statement failed; a
//! detached outcome delivered to a handler that can succeed, exactly once without a crash or a
//! storage failure, never past the dead letter, and a `notify` run's notice posted; every client
//! (steady, reconnected, late) in the same stock-reducer state; the chat's turns closed and
//! every reply a client assembled equal to the stored message.
//!
//! `cargo test --lib sim::` runs the kept regression seeds and then `SIM_SCHEDULES` (2 000)
//! seeded schedules from `SIM_BASE` (1); a failure prints the seed and the command that replays
//! it with a trace: `SIM_SEED=<seed> cargo test --lib sim::replay -- --nocapture`.

mod scenario;

/// The schedules `seeded_schedules_hold` runs unless `SIM_SCHEDULES` says otherwise.
const SCHEDULES: u64 = 2_000;

fn fail(seed: u64, problem: &str) -> ! {
    panic!(
        "seed {seed} broke an invariant: {problem}\nreplay it with a trace:\n  SIM_SEED={seed} cargo test --lib sim::replay -- --nocapture"
    )
}

#[test]
fn regression_seeds_hold() {
    for &seed in scenario::REGRESSIONS {
        if let Err(problem) = scenario::run(seed, false) {
            fail(seed, &problem);
        }
    }
}

#[test]
fn seeded_schedules_hold() {
    let schedules: u64 = std::env::var("SIM_SCHEDULES").ok().and_then(|s| s.parse().ok()).unwrap_or(SCHEDULES);
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
                    if let Err(problem) = scenario::run(seed, false) {
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

/// Replays `SIM_SEED` with a trace: the scenario, the objects' log lines and the parent
/// engine's events and decisions (a no-op without it).
#[test]
fn replay() {
    let Some(seed) = std::env::var("SIM_SEED").ok().and_then(|s| s.parse().ok()) else { return };
    if let Err(problem) = scenario::run(seed, true) {
        fail(seed, &problem);
    }
}
