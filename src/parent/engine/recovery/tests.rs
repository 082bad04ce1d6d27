use super::*;
use crate::parent::engine::testing::*;
use crate::protocol::tail::{ChunkKind, TailLine};
use crate::types::{DetachedOptions, Retention};

fn end(gen: u64, id: &str) -> ParentEvent {
    let outcome = Outcome::completed("done");
    ParentEvent::TailBatch { run_id: id.into(), gen, lines: vec![TailLine::End { outcome }] }
}

fn observed(actions: &[ParentAction]) -> Vec<EventType> {
    actions
        .iter()
        .filter_map(|a| match a {
            ParentAction::Observe(kind, _) => Some(*kind),
            _ => None,
        })
        .collect()
}

/// A failed statement rolls the whole decision back, is reported, and the decision is
/// taken again: the run is followed again from its cursor and concluded once, its finish
/// hook fired once.
#[test]
fn a_failed_statement_is_reported_and_the_decision_taken_again() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    let db = FailOn::new(db, "finish_hook_at = ?").failing(1);
    let tail = started(&db, &mut engine, "r", None);
    let actions = engine.handle(&db, end(tail, "r"), 12);
    assert_eq!(observed(&actions), [EventType::StorageFailed], "{actions:?}");
    assert!(actions.iter().all(|a| !matches!(a, ParentAction::Broadcast(_) | ParentAction::Hook(_))));
    assert!(Registry::new(&db).get("r").unwrap().unwrap().status.is_live(), "the finish was rolled back too");
    // After the pause the run is tailed again from its cursor; the child's end comes again.
    let due = engine.poll_timeout().unwrap();
    assert_eq!(due, 12 + STORAGE_RETRY_MS);
    let tail = gen_of(&engine.handle_timeout(&db, due), "tail", "r").unwrap();
    let actions = engine.handle(&db, end(tail, "r"), due + 1);
    assert_eq!(actions.iter().filter(|a| matches!(a, ParentAction::Hook(HookCall::Finish(..)))).count(), 1);
    assert_eq!(Registry::new(&db).get("r").unwrap().unwrap().status, RunStatus::Completed);
}

#[test]
fn a_recovery_pass_inspects_each_undriven_run_and_seals_those_past_its_deadline() {
    // parity: 149
    // A restart: the runs are live and nobody drives them.
    let (db, mut engine) = restarted_with_live_runs(["a", "b", "c", "d"]);
    let mut actions = engine.wake(&db, 100);
    assert_eq!(observed(&actions), [EventType::RecoveryBegin]);
    assert!(engine.wake(&db, 101).is_empty(), "once");
    let mut inspected = Vec::new();
    let mut rows = Vec::new();
    let mut elapsed = Vec::new();
    // No child answers: each inspection times out on the engine's own deadline, one after
    // another, until the pass's deadline seals the rest without asking. Each row is reported
    // once the pass is done with it, with the status it ends in, its reason and the time since
    // the pass began.
    let complete = loop {
        inspected.extend(actions.iter().filter_map(|a| match a {
            ParentAction::InspectChild { run_id, .. } => Some(run_id.clone()),
            _ => None,
        }));
        rows.extend(actions.iter().filter_map(|a| match a {
            ParentAction::Observe(EventType::RecoveryRow, payload) => {
                Some((payload["runId"].clone(), payload["status"].clone(), payload["reason"].clone()))
            }
            _ => None,
        }));
        elapsed.extend(actions.iter().filter_map(|a| match a {
            ParentAction::Observe(EventType::RecoveryRow, payload) => payload["elapsedMs"].as_i64(),
            _ => None,
        }));
        if let Some(ParentAction::Observe(_, summary)) =
            actions.iter().find(|a| matches!(a, ParentAction::Observe(EventType::RecoveryComplete, _)))
        {
            break Some(summary.clone());
        }
        let due = engine.poll_timeout().expect("an inspection under way");
        actions = engine.handle_timeout(&db, due);
    };
    assert_eq!(inspected, ["a", "b", "c"], "one at a time, until the deadline");
    assert_eq!(
        complete,
        Some(json!({ "runs": 4, "finalized": 4, "reattached": 0 })),
        "the pass's summary counts every row it sealed"
    );
    let row = |id: &str, reason: &str| (json!(id), json!("interrupted"), json!(reason));
    assert_eq!(
        rows,
        [
            row("a", "inspect-timeout"),
            row("b", "inspect-timeout"),
            row("c", "inspect-timeout"),
            row("d", "recovery-deadline")
        ]
    );
    assert_eq!(elapsed[..2], [INSPECT_TIMEOUT_MS, 2 * INSPECT_TIMEOUT_MS], "since the pass began");
    assert!(elapsed[3] >= RECOVERY_DEADLINE_MS, "{elapsed:?}");
    let reasons: Vec<_> = ["a", "b", "c", "d"]
        .iter()
        .map(|id| {
            Registry::new(&db)
                .get(id)
                .unwrap()
                .unwrap()
                .outcome
                .and_then(|o| o.interrupted_reason())
                .map(|r| r.as_str())
        })
        .collect();
    assert_eq!(
        reasons,
        [Some("inspect-timeout"), Some("inspect-timeout"), Some("inspect-timeout"), Some("recovery-deadline")]
    );
}

#[test]
fn the_backbone_gives_up_on_an_exhausted_budget_and_records_a_late_completion() {
    // parity: 55
    let (db, mut engine) = engine(AgentToolOptions::default());
    let budget = Some(DetachedOptions {
        on_finish: Some(json!("h")),
        max_budget: Some(std::time::Duration::from_millis(1_000)),
        ..Default::default()
    });
    started(&db, &mut engine, "r", budget);
    let actions = engine.alarm(&db, 2_000);
    let row = Registry::new(&db).get("r").unwrap().unwrap();
    assert_eq!(
        (row.status, row.outcome.as_ref().and_then(Outcome::interrupted_reason)),
        (RunStatus::Interrupted, Some(InterruptedReason::BudgetExceeded))
    );
    assert_eq!(row.outcome.as_ref().and_then(Outcome::error), Some("the detached run used up its budget"));
    assert!(actions.iter().any(|a| matches!(a, ParentAction::CancelChild { .. })), "torn down");
    // The child is asked for a late result, within the inspection's own timeout.
    assert!(gen_of(&actions, "inspect", "r").is_some());
    assert_eq!(engine.poll_timeout(), Some(2_000 + INSPECT_TIMEOUT_MS));
    assert!(actions.iter().any(|a| matches!(a, ParentAction::Deliver { slot: Slot::GiveUp, .. })));
    // The child had completed anyway: its real result is recorded (soft means soft).
    let actions = late_completion(&mut engine, &db, &actions, 2_001);
    assert!(observed(&actions).contains(&EventType::LateResult));
    let tail = gen_of(&actions, "tail", "r").unwrap();
    engine.handle(&db, ParentEvent::TailEnded { run_id: "r".into(), gen: tail }, 2_002);
    let tail = gen_of(&engine.handle_timeout(&db, 2_002 + RETAIL_PAUSE_MS), "tail", "r").unwrap();
    engine.handle(&db, end(tail, "r"), 2_400);
    assert_eq!(Registry::new(&db).get("r").unwrap().unwrap().status, RunStatus::Completed);
}

#[test]
fn a_recovery_pass_moves_on_when_the_run_it_waits_on_is_concluded_meanwhile() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    started(&db, &mut engine, "a", None);
    started(&db, &mut engine, "b", None);
    let mut engine = ParentEngine::new("Parent", AgentToolOptions::default(), 2);
    let actions = engine.wake(&db, 100);
    assert!(gen_of(&actions, "inspect", "a").is_some());
    // `a` is cancelled while its inspection is under way: its answer will never be heard,
    // and the pass goes on to `b` at once.
    let actions = engine.cancel(&db, "a", None, 101).actions;
    assert!(gen_of(&actions, "inspect", "b").is_some(), "{actions:?}");
}

fn finish_hooks(actions: &[ParentAction]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            ParentAction::Hook(HookCall::Finish(run, ..)) => Some(run.run_id.clone()),
            _ => None,
        })
        .collect()
}

/// The finish hook is at least once: one an instance called and never saw return (it died
/// first) is called again by the next instance; one that returned is not; a failed write of
/// its return still hands the callers their result.
#[test]
fn a_finish_hook_that_never_returned_is_called_again_after_a_restart() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    let mut gens = Vec::new();
    for id in ["returned", "lost"] {
        let tail = started(&db, &mut engine, id, None);
        let actions = engine.handle(&db, end(tail, id), 12);
        assert_eq!(finish_hooks(&actions), [id]);
        gens.push(gen_of(&actions, "finish", id).unwrap());
    }
    let actions = engine.handle(&db, ParentEvent::FinishHookDone { run_id: "returned".into(), gen: gens[0] }, 13);
    assert_eq!(resolved(&actions), [("returned".to_owned(), RunStatus::Completed)]);
    // A restart before the other hook returned.
    let mut engine = ParentEngine::new("Parent", AgentToolOptions::default(), 2);
    let actions = engine.wake(&db, 100);
    assert_eq!(finish_hooks(&actions), ["lost"]);
    let gen = gen_of(&actions, "finish", "lost").unwrap();
    // Its return, written this time, is the last call.
    let db = FailOn::new(db, "finish_hook_done_at = ?").failing(1);
    let actions = engine.handle(&db, ParentEvent::FinishHookDone { run_id: "lost".into(), gen }, 101);
    assert_eq!(observed(&actions), [EventType::StorageFailed], "the failed write is reported");
    let mut engine = ParentEngine::new("Parent", AgentToolOptions::default(), 3);
    let actions = engine.alarm(&db, 200);
    assert_eq!(finish_hooks(&actions), ["lost"], "its return was not recorded");
    let gen = gen_of(&actions, "finish", "lost").unwrap();
    engine.handle(&db, ParentEvent::FinishHookDone { run_id: "lost".into(), gen }, 201);
    let mut engine = ParentEngine::new("Parent", AgentToolOptions::default(), 4);
    assert!(finish_hooks(&engine.wake(&db, 300)).is_empty(), "every hook returned");
}

/// A fresh instance whose read of the owed finish hooks fails reports it and reads them at
/// the next alarm (it read them once, at its first event, and never again).
#[test]
fn an_owed_finish_hook_whose_read_failed_is_called_at_the_next_alarm() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    let tail = started(&db, &mut engine, "lost", None);
    assert_eq!(finish_hooks(&engine.handle(&db, end(tail, "lost"), 12)), ["lost"]);
    // A restart before the hook returned; the new instance's first read of what it owes fails.
    let db = FailOn::new(db, "finish_hook_done_at IS NULL").failing(1);
    let mut engine = ParentEngine::new("Parent", AgentToolOptions::default(), 2);
    let actions = engine.wake(&db, 100);
    assert_eq!(observed(&actions), [EventType::StorageFailed], "{actions:?}");
    assert!(finish_hooks(&actions).is_empty());
    let retry = engine.poll_alarm().expect("an alarm to retry");
    assert_eq!(finish_hooks(&engine.alarm(&db, retry)), ["lost"], "read again");
    assert!(finish_hooks(&engine.alarm(&db, retry + 1)).is_empty(), "once");
}

/// The object's one alarm also fires for others (the scheduler, a chat turn's deadline): an
/// alarm before the time the engine asked for keeps that time (a failed start's retry here),
/// and one at it takes it up.
#[test]
fn an_alarm_before_the_time_asked_for_keeps_it() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    let (_, actions) = dispatch(&mut engine, &db, "r", json!(1));
    let start = gen_of(&actions, "start", "r").unwrap();
    let failed = Err(StartError::Failed("Worker failed to start the run (500): storage".into()));
    engine.handle(&db, ParentEvent::StartReplied { run_id: "r".into(), gen: start, result: failed }, 20);
    let retry = 20 + START_RETRY_MS;
    assert_eq!(engine.poll_alarm(), Some(retry), "the retry is sooner than the recovery alarm");
    engine.alarm(&db, 500);
    assert_eq!(engine.poll_alarm(), Some(retry), "asked for later: kept");
    engine.alarm(&db, retry);
    assert!(engine.poll_alarm().is_some_and(|at| at > retry), "taken up: {:?}", engine.poll_alarm());
}

/// A parent restarted with these runs live and undriven.
fn restarted_with_live_runs<const N: usize>(ids: [&str; N]) -> (rusqlite::Connection, ParentEngine) {
    let (db, mut engine) = engine(AgentToolOptions::default());
    for id in ids {
        started(&db, &mut engine, id, None);
    }
    (db, ParentEngine::new("Parent", AgentToolOptions::default(), 2))
}

fn inspected(actions: &[ParentAction]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            ParentAction::InspectChild { run_id, .. } => Some(run_id.clone()),
            _ => None,
        })
        .collect()
}

/// A failed step moves a recovery pass on only when it is about the row being inspected (the
/// pass inspects the next row, and the failed one is followed again after a pause); a failure
/// about another run leaves the pass waiting for its row's answer. Either way the alarm is due
/// [`STORAGE_RETRY_MS`] later, for the work only it takes up again.
#[test]
fn a_failed_step_moves_the_recovery_pass_on_only_for_its_own_row() {
    let (db, mut engine) = restarted_with_live_runs(["a", "b"]);
    let db = FailOn::new(db, "FROM agent_tool_runs WHERE run_id = ?");
    let actions = engine.wake(&db, 100);
    assert_eq!(inspected(&actions), ["a"]);
    let a = gen_of(&actions, "inspect", "a").unwrap();
    take_alarm(&mut engine);
    db.times.set(1);
    let actions = engine.abandon(&db, "x", "gone".into(), 101);
    assert_eq!(observed(&actions), [EventType::StorageFailed], "{actions:?}");
    assert!(inspected(&actions).is_empty(), "the pass waits for a's answer: {actions:?}");
    assert_eq!(take_alarm(&mut engine), Some(101 + STORAGE_RETRY_MS), "the alarm takes the failed step up again");
    db.times.set(1);
    let live = Ok(Some(crate::protocol::child_api::InspectionReply::live(RunStatus::Running)));
    let actions = engine.handle(&db, ParentEvent::Inspected { run_id: "a".into(), gen: a, result: live }, 102);
    assert!(observed(&actions).contains(&EventType::StorageFailed), "{actions:?}");
    assert_eq!(inspected(&actions), ["b"], "the pass moved on: {actions:?}");
    assert_eq!(engine.poll_timeout(), Some(102 + STORAGE_RETRY_MS.min(INSPECT_TIMEOUT_MS)));
}

/// A watched child's inspection that never comes back is forgotten when it times out, so the
/// next tick asks again; one still in flight is not asked twice.
#[test]
fn a_watch_whose_inspection_never_returns_is_asked_again_and_one_in_flight_is_not() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    let registry = Registry::new(&db);
    let gave_up = Outcome::Interrupted {
        error: "silent".into(),
        reason: Some(InterruptedReason::NoProgress),
        child_still_running: Some(true),
    };
    registry.insert(&new_run("a", &json!(1)), 1).unwrap();
    registry.finish("a", &gave_up, 2).unwrap();
    assert_eq!(inspected(&engine.alarm(&db, 1_000)), ["a"]);
    registry.insert(&new_run("b", &json!(1)), 3).unwrap();
    registry.finish("b", &gave_up, 4).unwrap();
    assert_eq!(inspected(&engine.alarm(&db, 1_000 + INSPECT_TIMEOUT_MS / 2)), ["b"], "a's is still in flight");
    let due = engine.poll_timeout().expect("a's inspection times out");
    assert_eq!(due, 1_000 + INSPECT_TIMEOUT_MS);
    engine.handle_timeout(&db, due);
    assert_eq!(inspected(&engine.alarm(&db, due + 1)), ["a"], "a asked again; b's is still in flight");
}

/// The child of run `r` answers the inspection in `actions`: it completed, with "late".
fn late_completion(engine: &mut ParentEngine, db: &impl Sql, actions: &[ParentAction], now: i64) -> Vec<ParentAction> {
    let gen = gen_of(actions, "inspect", "r").expect("an inspection of the child");
    let done = Ok(Some(crate::protocol::child_api::InspectionReply {
        attempt: Some(1),
        ..crate::protocol::child_api::InspectionReply::ended(Outcome::completed("late"))
    }));
    engine.handle(db, ParentEvent::Inspected { run_id: "r".into(), gen, result: done }, now)
}

/// A detached run that went silent past its no-progress budget is given up softly, as the
/// seed has it: `interrupted`/`no-progress` with the child left running (not torn down), and
/// a late completion is still recorded (and so delivered) once.
#[test]
fn a_silent_detached_run_is_given_up_softly_and_its_late_result_recorded() {
    // parity: 103
    let (db, mut engine) = engine(AgentToolOptions::default());
    let silent = DetachedOptions {
        on_finish: Some(json!("h")),
        no_progress_budget: Some(std::time::Duration::from_millis(300)),
        max_budget: Some(std::time::Duration::from_millis(60_000)),
        ..Default::default()
    };
    let tail = started(&db, &mut engine, "r", Some(silent));
    // One progress signal, then silence.
    let progress = TailLine::Chunk {
        i: Some(0),
        k: ChunkKind::Progress,
        b: "{\"type\":\"data-agent-progress\",\"data\":{\"fraction\":0.1}}".into(),
        r: None,
    };
    engine.handle(&db, ParentEvent::TailBatch { run_id: "r".into(), gen: tail, lines: vec![progress] }, 20);
    let actions = engine.alarm(&db, 1_000);
    let row = Registry::new(&db).get("r").unwrap().unwrap();
    assert_eq!(
        (
            row.status,
            row.outcome.as_ref().and_then(Outcome::interrupted_reason),
            row.outcome.as_ref().and_then(Outcome::child_still_running)
        ),
        (RunStatus::Interrupted, Some(InterruptedReason::NoProgress), Some(true))
    );
    assert!(!actions.iter().any(|a| matches!(a, ParentAction::CancelChild { .. })), "the child is left running");
    assert!(actions.iter().any(|a| matches!(a, ParentAction::Deliver { slot: Slot::GiveUp, .. })));
    let actions = late_completion(&mut engine, &db, &actions, 1_001);
    assert!(observed(&actions).contains(&EventType::LateResult), "{actions:?}");
}

/// A row the recovery pass could not reach in time is sealed with its child left running
/// (`childStillRunning: true`), and the backbone watches it: a late result repairs it.
#[test]
fn a_row_past_the_recovery_deadline_is_watched_for_its_late_result() {
    // parity: 145
    // Four live rows whose children never answer, the last one `r`: the pass reaches its
    // deadline before it.
    let (db, mut engine) = restarted_with_live_runs(["a", "b", "c", "r"]);
    let mut actions = engine.wake(&db, 100);
    let mut now = 100;
    while !observed(&actions).contains(&EventType::RecoveryComplete) {
        now = engine.poll_timeout().expect("a deadline");
        actions = engine.handle_timeout(&db, now);
    }
    let sealed = Registry::new(&db).get("r").unwrap().unwrap();
    assert_eq!(
        (
            sealed.outcome.as_ref().and_then(Outcome::interrupted_reason),
            sealed.outcome.as_ref().and_then(Outcome::child_still_running)
        ),
        (Some(InterruptedReason::RecoveryDeadline), Some(true))
    );
    let later = now + 10_000;
    let actions = engine.alarm(&db, later);
    let actions = late_completion(&mut engine, &db, &actions, later + 1);
    assert!(observed(&actions).contains(&EventType::LateResult), "{actions:?}");
}

/// When the alarm fires next, for each reason it has: live runs (the recovery alarm), the
/// oldest finished run coming of age (never sooner than a second), a child owing a clear, and
/// the backbone's cadence for detached runs; the soonest wins, and with no reason, no alarm.
#[test]
fn the_next_alarm_is_the_soonest_of_its_reasons() {
    use std::time::Duration;
    const NOW: i64 = 1_000_000;
    let next = |setup: &dyn Fn(&rusqlite::Connection, &mut ParentEngine), retention: Retention| {
        let options = AgentToolOptions { retention, ..AgentToolOptions::default() };
        let (db, mut engine) = engine(options);
        setup(&db, &mut engine);
        take_alarm(&mut engine);
        engine.next_alarm(&db, NOW).unwrap();
        take_alarm(&mut engine).map(|at| at - NOW)
    };
    let finished_at = |at: i64| {
        move |db: &rusqlite::Connection, _: &mut ParentEngine| {
            let registry = Registry::new(db);
            registry.insert(&new_run("f", &json!(1)), at - 10).unwrap();
            registry.finish("f", &Outcome::Completed { summary: "s".into(), output: None }, at).unwrap();
        }
    };
    let two_seconds = Retention { max_runs: None, max_age: Some(Duration::from_secs(2)) };
    let detached = |quiet: usize| {
        move |db: &rusqlite::Connection, engine: &mut ParentEngine| {
            let dispatch =
                Dispatch { new: new_run("d", &json!(1)), detached: Some(Default::default()), abandoned: None };
            engine.dispatch(db, dispatch, 10);
            engine.quiet_ticks = quiet;
        }
    };

    assert_eq!(next(&|_, _| {}, Retention::default()), None, "nothing to wake for");
    let live = |db: &rusqlite::Connection, _: &mut ParentEngine| {
        Registry::new(db).insert(&new_run("l", &json!(1)), 5).unwrap();
    };
    assert_eq!(next(&live, Retention::default()), Some(10_000), "live runs: the recovery alarm");
    assert_eq!(next(&finished_at(NOW - 500), two_seconds), Some(1_500), "when the oldest run comes of age");
    assert_eq!(next(&finished_at(NOW - 1_900), two_seconds), Some(1_000), "never sooner than a second");
    assert_eq!(next(&finished_at(NOW - 500), Retention::forever()), None, "no age limit: no alarm for age");
    let owing = |db: &rusqlite::Connection, _: &mut ParentEngine| {
        Registry::new(db).owe_child_clear("gone", "Child", "Parent/p/gone", NOW).unwrap();
    };
    assert_eq!(next(&owing, Retention::default()), Some(CHILD_CLEAR_RETRY_MS), "a clear owed");
    let watched = |db: &rusqlite::Connection, _: &mut ParentEngine| {
        let registry = Registry::new(db);
        registry.insert(&new_run("w", &json!(1)), NOW - 100).unwrap();
        let given_up = Outcome::Interrupted {
            error: "no progress".into(),
            reason: Some(InterruptedReason::NoProgress),
            child_still_running: Some(true),
        };
        registry.finish("w", &given_up, NOW - 50).unwrap();
    };
    assert_eq!(next(&watched, Retention::forever()), Some(5_000), "a child watched for its late result: the cadence");
    assert_eq!(
        next(&detached(0), Retention::default()),
        Some(5_000),
        "the backbone's first beat, before the recovery alarm"
    );
    assert_eq!(
        next(&detached(3), Retention::default()),
        Some(10_000),
        "a quiet backbone: the recovery alarm is sooner"
    );
}

/// The backbone's cadence slows while its passes change nothing and starts over when one does.
/// A milestone kept in the registry whose notice was never posted (forwarded while no
/// instance could post it) is offered by the backbone, with its name and its data.
#[test]
fn the_backbone_offers_a_stored_milestone_whose_notice_was_never_posted() {
    use crate::parent::registry::Forward;
    use crate::types::Milestone;
    let (db, mut engine) = engine(AgentToolOptions::default());
    let options = DetachedOptions::default().on_milestones(crate::types::OnMilestones::narrate(["parsed"]));
    started(&db, &mut engine, "r", Some(options));
    let body = json!({
        "type": "data-agent-milestone", "id": "m-1",
        "data": { "name": "parsed", "sequence": 0, "at": 500, "data": { "pages": 3 } },
    })
    .to_string();
    let milestone = Forward { kind: ChunkKind::Milestone, body: &body, replay: None };
    Registry::new(&db).append("r", &[milestone], None, 600).unwrap();
    let notices: Vec<Notice> = engine
        .alarm(&db, 1_000)
        .into_iter()
        .filter_map(|a| match a {
            ParentAction::Notice(notice) => Some(notice),
            _ => None,
        })
        .collect();
    let offered: Vec<&Milestone> = notices
        .iter()
        .filter_map(|n| match &n.of {
            NoticeOf::Milestone(m) => Some(m),
            NoticeOf::Outcome(_) => None,
        })
        .collect();
    assert_eq!(offered.len(), 1, "{offered:?}");
    assert_eq!((offered[0].name.as_str(), &offered[0].data), ("parsed", &Some(json!({ "pages": 3 }))));
    // Its message says whose run it was and which milestone.
    let metadata =
        json!({ "source": "detached-agent-tool", "runId": "r", "agentType": "Child", "milestone": "parsed" });
    assert_eq!(notices[0].metadata(), metadata);
}

#[test]
fn the_backbone_slows_while_nothing_changes_and_starts_over_when_something_does() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    started(&db, &mut engine, "calm", Some(DetachedOptions::default()));
    engine.alarm(&db, 1_000);
    engine.alarm(&db, 2_000);
    assert_eq!(engine.quiet_ticks, 2, "two passes that changed nothing");
    let budget = DetachedOptions { max_budget: Some(std::time::Duration::from_millis(100)), ..Default::default() };
    started(&db, &mut engine, "spent", Some(budget));
    engine.quiet_ticks = 2;
    engine.alarm(&db, 3_000);
    assert_eq!(Registry::new(&db).get("spent").unwrap().unwrap().status, RunStatus::Interrupted);
    assert_eq!(engine.quiet_ticks, 0, "a pass that gave a run up changed something");
}

/// A recovery pass after a restart lines up the live runs nobody drives, and nothing else: not
/// a finished run, not one this instance already drives.
#[test]
fn a_recovery_pass_takes_only_the_live_undriven_runs() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    started(&db, &mut engine, "orphan", None);
    let registry = Registry::new(&db);
    registry.insert(&new_run("done", &json!(1)), 5).unwrap();
    registry.finish("done", &Outcome::Completed { summary: "s".into(), output: None }, 6).unwrap();
    let mut restarted = ParentEngine::new("Parent", AgentToolOptions::default(), 2);
    assert!(matches!(restarted.dispatch(&db, awaited(new_run("fresh", &json!(1))), 50).0, Admitted::Driving));
    let actions = restarted.wake(&db, 100);
    assert!(gen_of(&actions, "inspect", "orphan").is_some(), "{actions:?}");
    assert!(gen_of(&actions, "inspect", "done").is_none() && gen_of(&actions, "inspect", "fresh").is_none());
    let pass = restarted.pass.as_ref().expect("a pass under way");
    let mut lined_up: Vec<&str> = pass.queue.iter().map(String::as_str).collect();
    lined_up.extend(pass.current.as_ref().map(|(id, _)| id.as_str()));
    assert_eq!(lined_up, ["orphan"]);
}

/// A recovery pass gives an awaited run its re-attach window (a detached run has its own
/// budgets instead), and skips a row concluded while it waited in the queue.
#[test]
fn a_recovery_pass_windows_awaited_runs_and_skips_rows_concluded_meanwhile() {
    let window = std::time::Duration::from_millis(5_000);
    let options = AgentToolOptions { reattach_max_window: Some(window), ..AgentToolOptions::default() };
    let (db, mut engine) = engine(options.clone());
    started(&db, &mut engine, "awaited", None);
    started(&db, &mut engine, "queued", None);
    started(&db, &mut engine, "detached", Some(DetachedOptions::default()));
    let mut engine = ParentEngine::new("Parent", options, 2);
    let actions = engine.wake(&db, 100);
    assert_eq!(engine.drivers["awaited"].window_end, Some(100 + 5_000));
    assert_eq!(engine.drivers["detached"].window_end, None, "a detached run is bounded by its budgets");
    assert!(gen_of(&actions, "inspect", "awaited").is_some(), "{actions:?}");

    // `queued` is cancelled while it waits for its turn; when its turn comes it is not asked.
    engine.cancel(&db, "queued", None, 101);
    let mut inspected = Vec::new();
    let mut actions = actions;
    while !observed(&actions).contains(&EventType::RecoveryComplete) {
        let due = engine.poll_timeout().expect("an inspection under way");
        actions = engine.handle_timeout(&db, due);
        inspected.extend(actions.iter().filter_map(|a| match a {
            ParentAction::InspectChild { run_id, .. } => Some(run_id.clone()),
            _ => None,
        }));
    }
    assert!(!inspected.contains(&"queued".to_owned()), "a concluded row is not inspected: {inspected:?}");
    assert_eq!(Registry::new(&db).get("queued").unwrap().unwrap().status, RunStatus::Aborted);
}

/// A recovery pass counts a row whose child already had its outcome as finalized (its log is
/// then drained), and one whose child is still running as re-attached (and says so).
#[test]
fn a_recovery_pass_counts_finished_rows_finalized_and_running_ones_reattached() {
    use crate::protocol::child_api::InspectionReply;
    let (db, mut engine) = restarted_with_live_runs(["done", "live"]);
    let mut actions = engine.wake(&db, 100);
    let mut events = Vec::new();
    let mut now = 100;
    let complete = loop {
        events.extend(observed(&actions));
        if let Some(summary) = actions.iter().find_map(|a| match a {
            ParentAction::Observe(EventType::RecoveryComplete, summary) => Some(summary.clone()),
            _ => None,
        }) {
            break summary;
        }
        let (run_id, gen) = actions
            .iter()
            .find_map(|a| match a {
                ParentAction::InspectChild { run_id, gen, .. } => Some((run_id.clone(), *gen)),
                _ => None,
            })
            .unwrap_or_else(|| panic!("the next row is inspected: {actions:?}"));
        let reply = match run_id.as_str() {
            "done" => InspectionReply {
                outcome: Some(Outcome::completed("done")),
                ..InspectionReply::live(RunStatus::Completed)
            },
            _ => InspectionReply::live(RunStatus::Running),
        };
        now += 1;
        actions = engine.handle(&db, ParentEvent::Inspected { run_id, gen, result: Ok(Some(reply)) }, now);
    };
    assert_eq!(complete, json!({ "runs": 2, "finalized": 1, "reattached": 1 }));
    assert_eq!(events.iter().filter(|e| **e == EventType::RecoveryReattach).count(), 1, "{events:?}");
}

/// A row concluded while it waited for its turn is not sealed again when its turn comes after
/// the pass's deadline: no deadline event, not counted as finalized by the pass.
#[test]
fn a_row_concluded_in_the_queue_is_not_sealed_at_the_deadline() {
    let (db, mut engine) = restarted_with_live_runs(["a", "b"]);
    engine.wake(&db, 100);
    engine.cancel(&db, "b", None, 101);
    let actions = engine.handle_timeout(&db, 100 + RECOVERY_DEADLINE_MS + 1);
    let deadline_rows: Vec<&Value> = actions
        .iter()
        .filter_map(|a| match a {
            ParentAction::Observe(EventType::RecoveryDeadline, payload) => Some(&payload["runId"]),
            _ => None,
        })
        .collect();
    assert!(!deadline_rows.contains(&&json!("b")), "{actions:?}");
    let complete = actions.iter().find_map(|a| match a {
        ParentAction::Observe(EventType::RecoveryComplete, summary) => Some(summary.clone()),
        _ => None,
    });
    assert_eq!(complete, Some(json!({ "runs": 2, "finalized": 1, "reattached": 0 })));
    assert_eq!(Registry::new(&db).get("b").unwrap().unwrap().status, RunStatus::Aborted);
}

/// Exchange numbers are unique across instances: an answer to an exchange a crashed instance
/// began (a batch of its tail, its inspection) can never be taken by its successor for one of
/// its own.
#[test]
fn exchange_numbers_are_unique_across_instances() {
    let (db, mut first) = engine(AgentToolOptions::default());
    let mut handed_out = Vec::new();
    let (_, actions) = dispatch(&mut first, &db, "r", json!(1));
    handed_out.extend(gen_of(&actions, "start", "r"));
    let start = handed_out[0];
    let actions = first.handle(&db, ParentEvent::StartReplied { run_id: "r".into(), gen: start, result: Ok(()) }, 11);
    handed_out.extend(gen_of(&actions, "tail", "r"));
    // The instance dies; the next one follows the run again.
    let mut second = ParentEngine::new("Parent", AgentToolOptions::default(), 2);
    let actions = second.wake(&db, 100);
    let theirs: Vec<u64> = ["start", "tail", "inspect"].iter().filter_map(|k| gen_of(&actions, k, "r")).collect();
    assert!(!theirs.is_empty(), "the successor follows the run: {actions:?}");
    for gen in theirs {
        assert!(!handed_out.contains(&gen), "exchange {gen} was handed out by both instances");
    }
}

/// The durable alarm is pulled ([`ParentEngine::poll_alarm`]): a decision asks for a time, the
/// alarm takes it up when it fires and asks only for what comes next (a time already past would
/// fire the alarm again at once, forever).
#[test]
fn the_alarm_takes_up_what_it_was_armed_for_and_asks_for_the_next() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    let dispatch = Dispatch { new: new_run("a", &json!(1)), detached: None, abandoned: None };
    engine.dispatch(&db, dispatch, 1_000);
    assert_eq!(engine.poll_alarm(), Some(11_000), "a live run: the recovery alarm");
    engine.alarm(&db, 11_000);
    assert_eq!(engine.poll_alarm(), Some(21_000), "still live: the next recovery alarm, not the one that fired");
}
