use crate::parent::engine::testing::*;
use crate::types::Retention;

#[test]
fn retention_clears_the_oldest_finished_runs_and_their_children() {
    // parity: 39
    let options =
        AgentToolOptions { retention: Retention { max_runs: Some(2), max_age: None }, ..AgentToolOptions::default() };
    let (db, mut engine) = engine(options);
    let registry = Registry::new(&db);
    for i in 0..4 {
        let id = format!("r{i}");
        registry.insert(&new_run(&id, &json!(i)), i).unwrap();
        registry.finish(&id, &Outcome::Completed { summary: "s".into(), output: None }, 100 + i).unwrap();
    }
    let actions = engine.alarm(&db, 200);
    let cleared: Vec<&str> = actions
        .iter()
        .filter_map(|a| match a {
            ParentAction::ClearChild { run_id, .. } => Some(run_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(cleared, ["r0", "r1"]);
    let left: Vec<String> = registry.all().unwrap().into_iter().map(|r| r.run_id).collect();
    assert_eq!(left, ["r2", "r3"]);
    assert!(actions.iter().any(|a| matches!(a, ParentAction::Observe(EventType::Retention, _))));
    // A new dispatch trims too: the live run is never counted against the policy.
    assert!(matches!(dispatch(&mut engine, &db, "r4", json!(4)).0, Admitted::Driving));
    assert_eq!(registry.all().unwrap().len(), 3);
}

/// The re-arm at a full batch is what clears a backlog bigger than one batch: the alarm comes
/// back [`RETAIL_PAUSE_MS`] later for the rest, and not once the backlog is gone.
#[test]
fn retention_comes_back_soon_after_a_full_batch_only() {
    let retention = Retention { max_runs: Some(1), max_age: None };
    let (db, mut engine) = engine(AgentToolOptions { retention, ..AgentToolOptions::default() });
    let registry = Registry::new(&db);
    let total = RETENTION_BATCH as i64 + 6;
    for i in 0..total {
        let id = format!("r{i:04}");
        registry.insert(&new_run(&id, &json!(i)), i).unwrap();
        registry.finish(&id, &Outcome::Completed { summary: "s".into(), output: None }, 10_000 + i).unwrap();
    }
    // The alarm comes back after the pause (the children's clears ask for a minute later).
    let soon = |engine: &mut ParentEngine, now: i64| take_alarm(engine).is_some_and(|at| at <= now + RETAIL_PAUSE_MS);
    let cleared =
        |actions: &[ParentAction]| actions.iter().filter(|a| matches!(a, ParentAction::ClearChild { .. })).count();

    let first = engine.alarm(&db, 20_000);
    assert_eq!(cleared(&first), RETENTION_BATCH, "one batch at a time");
    assert_eq!(
        take_alarm(&mut engine),
        Some(20_000 + RETAIL_PAUSE_MS),
        "a full batch: back after the pause: {first:?}"
    );

    let now = 20_000 + RETAIL_PAUSE_MS;
    let second = engine.alarm(&db, now);
    assert_eq!(cleared(&second), 5, "the rest, the newest run kept");
    assert!(!soon(&mut engine, now), "the backlog is gone: no early return: {second:?}");
    assert_eq!(registry.all().unwrap().len(), 1);
}

/// Clearing cancels a live run (its child stops, the run ends `aborted` before it goes) and
/// leaves a finished one's outcome as it was: only live runs get a cancel.
#[test]
fn clearing_cancels_the_live_runs_only() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    assert!(matches!(dispatch(&mut engine, &db, "live", json!(1)).0, Admitted::Driving));
    let registry = Registry::new(&db);
    registry.insert(&new_run("done", &json!(2)), 5).unwrap();
    registry.finish("done", &Outcome::Completed { summary: "s".into(), output: None }, 6).unwrap();

    let Called { result, actions } = engine.clear(&db, &crate::types::ClearFilter::all(), 100);
    let mut runs = result.unwrap().runs;
    runs.sort();
    assert_eq!(runs, ["done", "live"]);
    let cancelled: Vec<&str> = actions
        .iter()
        .filter_map(|a| match a {
            ParentAction::CancelChild { run_id, reason, .. } => {
                assert_eq!(reason.as_deref(), Some("cleared"));
                Some(run_id.as_str())
            }
            _ => None,
        })
        .collect();
    assert_eq!(cancelled, ["live"], "{actions:?}");
    assert!(registry.all().unwrap().is_empty());
}

/// A clear asked again waits its retry interval before it is asked once more: a child that is
/// down is not asked at every alarm.
#[test]
fn a_child_clear_asked_again_waits_its_retry_interval() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    Registry::new(&db).owe_child_clear("gone", "Researcher", "Assistant/p/gone", 100).unwrap();
    let mut asked = |now: i64| {
        engine
            .retry_child_clears(&db, now)
            .unwrap()
            .iter()
            .filter(|a| matches!(a, ParentAction::ClearChild { run_id, .. } if run_id == "gone"))
            .count()
    };
    assert_eq!(asked(100), 1, "due: asked");
    assert_eq!(asked(101), 0, "asked a moment ago: not again yet");
    assert_eq!(asked(100 + CHILD_CLEAR_RETRY_MS - 1), 0);
    assert_eq!(asked(100 + CHILD_CLEAR_RETRY_MS), 1, "its interval passed: asked again");
}

/// A child that never confirms its clear is asked again up to [`MAX_CHILD_CLEAR_ATTEMPTS`]
/// times, then given up with an event: not sooner, and never forgotten silently.
#[test]
fn a_child_clear_is_given_up_after_its_attempts_and_not_before() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    Registry::new(&db).owe_child_clear("gone", "Researcher", "Assistant/p/gone", 0).unwrap();
    let (mut asked, mut given_up) = (0, None);
    for round in 0..MAX_CHILD_CLEAR_ATTEMPTS + 5 {
        for action in engine.retry_child_clears(&db, round * CHILD_CLEAR_RETRY_MS).unwrap() {
            match action {
                ParentAction::ClearChild { .. } => asked += 1,
                ParentAction::Observe(EventType::ChildClearFailed, detail) => {
                    given_up = Some(detail["attempts"].clone())
                }
                _ => {}
            }
        }
    }
    assert_eq!(asked, MAX_CHILD_CLEAR_ATTEMPTS, "asked again exactly as often as allowed");
    assert_eq!(given_up, Some(json!(MAX_CHILD_CLEAR_ATTEMPTS)), "then given up, with an event");
    assert_eq!(Registry::new(&db).child_clears_pending().unwrap(), 0);
}

/// An engine whose object was wiped (its own parent cleared it) knows nothing it drove before,
/// and its exchange numbers go on rising (so an answer from before the wipe settles nothing).
#[test]
fn a_reset_engine_forgets_its_runs_and_its_exchange_numbers_go_on_rising() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    let (_, actions) = dispatch(&mut engine, &db, "r1", json!(1));
    let gen = gen_of(&actions, "start", "r1").expect("a start exchange");
    assert!(engine.is_driving("r1"));
    engine.reset();
    assert!(!engine.is_driving("r1"), "nothing is driven after the wipe");
    // The storage comes back empty; the same run id dispatched again is a new exchange.
    let (_, again) = dispatch(&mut engine, &db, "r1", json!(1));
    let new_gen = gen_of(&again, "start", "r1").expect("a start exchange");
    assert!(new_gen > gen, "exchange numbers go on rising: {gen} then {new_gen}");
}

/// An answer to a clear this instance asked again since (a slow child, an alarm's retry)
/// settles nothing: the owed clear is settled by the answer to the clear it waits for.
#[test]
fn an_answer_to_a_clear_asked_again_since_settles_nothing() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    let tail = started(&db, &mut engine, "r", None);
    let outcome = Outcome::completed("s");
    engine.handle(
        &db,
        ParentEvent::TailBatch {
            run_id: "r".into(),
            gen: tail,
            lines: vec![crate::protocol::tail::TailLine::End { outcome }],
        },
        12,
    );
    let called = engine.clear(&db, &crate::ClearFilter::default(), 20);
    let first = gen_of(&called.actions, "clear", "r").unwrap();
    let retried = engine.alarm(&db, 20 + CHILD_CLEAR_RETRY_MS);
    let second = gen_of(&retried, "clear", "r").expect("asked again");
    let answer = |gen| ParentEvent::ChildCleared { run_id: "r".into(), gen, result: Ok(()) };
    engine.handle(&db, answer(first), 20 + CHILD_CLEAR_RETRY_MS + 1);
    assert_eq!(Registry::new(&db).child_clears_pending().unwrap(), 1, "the first answer settles nothing");
    engine.handle(&db, answer(second), 20 + CHILD_CLEAR_RETRY_MS + 2);
    assert_eq!(Registry::new(&db).child_clears_pending().unwrap(), 0, "the answer it waits for does");
}

/// A clear whose answer may be lost keeps the alarm armed for its retry, even with nothing
/// else to wake the agent for.
#[test]
fn a_clear_arms_the_alarm_for_its_retry() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    let registry = Registry::new(&db);
    registry.insert(&new_run("r", &json!(1)), 1).unwrap();
    registry.finish("r", &Outcome::Completed { summary: "s".into(), output: None }, 2).unwrap();
    let called = engine.clear(&db, &crate::ClearFilter::default(), 20);
    assert!(gen_of(&called.actions, "clear", "r").is_some());
    assert_eq!(engine.poll_alarm(), Some(20 + CHILD_CLEAR_RETRY_MS), "{:?}", called.actions);
}
