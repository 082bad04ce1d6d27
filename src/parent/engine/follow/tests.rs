use super::*;
use crate::parent::engine::testing::*;
use crate::types::DetachedOptions;

fn reply(status: &str) -> InspectionReply {
    let status = status.parse().expect("a status");
    let outcome = Outcome::from_parts(status, Some("s".into()), None, None, None, None);
    InspectionReply { status, outcome, attempt: Some(1), ..InspectionReply::live(status) }
}

/// What a batch of actions amounts to, for the tables below.
fn effect(actions: &[ParentAction]) -> String {
    let mut parts = Vec::new();
    for action in actions {
        match action {
            ParentAction::Broadcast(frame) => {
                let frame: Value = serde_json::from_str(frame).unwrap();
                let event = &frame["event"];
                let mut kind = event["kind"].as_str().unwrap_or_default().to_owned();
                if let Some(reason) = event["reason"].as_str() {
                    kind = format!("{kind}:{reason}");
                }
                parts.push(kind);
            }
            ParentAction::StartChild { .. } => parts.push("start".into()),
            ParentAction::OpenTail { .. } => parts.push("tail".into()),
            ParentAction::InspectChild { .. } => parts.push("inspect".into()),
            ParentAction::CancelChild { .. } => parts.push("teardown".into()),
            _ => {}
        }
    }
    parts.join(" ")
}

/// A run driven by an engine (awaited or detached), its tail broken so it is being
/// inspected, or (`recovering`) found live by a fresh engine's recovery pass. Returns the
/// inspection's exchange.
fn inspected_run(db: &rusqlite::Connection, engine: &mut ParentEngine, detached: bool, recovering: bool) -> u64 {
    let new = new_run("r", &json!({"q": 1}));
    let dispatch = Dispatch { new, detached: detached.then(DetachedOptions::default), abandoned: None };
    let (_, actions) = engine.dispatch(db, dispatch, 10);
    let start = gen_of(&actions, "start", "r").unwrap();
    let actions = engine.handle(db, ParentEvent::StartReplied { run_id: "r".into(), gen: start, result: Ok(()) }, 11);
    let tail = gen_of(&actions, "tail", "r").unwrap();
    if recovering {
        // The instance restarts: a new engine finds the run live and inspects it.
        *engine = ParentEngine::new("Parent", AgentToolOptions::default(), 2);
        let actions = engine.wake(db, 12);
        return gen_of(&actions, "inspect", "r").unwrap();
    }
    let actions = engine.handle(db, ParentEvent::TailEnded { run_id: "r".into(), gen: tail }, 12);
    gen_of(&actions, "inspect", "r").unwrap()
}

/// The inspect contract: every answer (a failure, a timeout, "unknown", live, ended), for a
/// run being followed or recovered, awaited or detached.
#[test]
fn the_inspection_matrix() {
    // parity: 71, 72, 133
    let answers: [(&str, Result<Option<InspectionReply>, InterruptedReason>); 5] = [
        ("failed", Err(InterruptedReason::InspectFailed)),
        ("timed out", Err(InterruptedReason::InspectTimeout)),
        ("unknown", Ok(None)),
        ("live", Ok(Some(reply("running")))),
        ("ended", Ok(Some(reply("completed")))),
    ];
    for (answer, result) in answers {
        for recovering in [false, true] {
            for detached in [false, true] {
                let (db, mut engine) = engine(AgentToolOptions::default());
                let gen = inspected_run(&db, &mut engine, detached, recovering);
                let event = ParentEvent::Inspected { run_id: "r".into(), gen, result: result.clone() };
                let actions = engine.handle(&db, event, 20);
                let expected = match answer {
                    "failed" => "interrupted:inspect-failed",
                    "timed out" => "interrupted:inspect-timeout",
                    // Never a failure: the start was lost, so it is sent again.
                    "unknown" => "start",
                    // Waited on: tailed again after a pause (a deadline, no action yet).
                    "live" => "",
                    // Its chunks after the cursor are read, then its outcome recorded.
                    "ended" => "tail",
                    _ => unreachable!(),
                };
                let case = format!("{answer}, recovering {recovering}, detached {detached}");
                assert_eq!(effect(&actions), expected, "{case}: {actions:?}");
                let row = Registry::new(&db).get("r").unwrap().unwrap();
                let live = matches!(answer, "unknown" | "live" | "ended");
                assert_eq!(row.status.is_live(), live, "{case}: {:?}", row.status);
                if answer == "live" {
                    let due = engine.poll_timeout().expect("a deadline to tail again");
                    assert_eq!(due, 20 + RETAIL_PAUSE_MS, "{case}");
                    assert_eq!(effect(&engine.handle_timeout(&db, due)), "tail", "{case}");
                }
                if recovering {
                    let observed: Vec<EventType> = actions
                        .iter()
                        .filter_map(|a| match a {
                            ParentAction::Observe(kind, _) => Some(*kind),
                            _ => None,
                        })
                        .collect();
                    let counted = match answer {
                        "failed" | "timed out" => EventType::RecoveryFailed,
                        "unknown" | "live" => EventType::RecoveryReattach,
                        _ => EventType::RecoveryComplete,
                    };
                    assert!(observed.contains(&counted), "{case}: {observed:?}");
                }
            }
        }
    }
}

/// Past the re-attach budgets, a live child ends the wait: not tailable, the window (the
/// child torn down), silence (the child left running). A detached run has its own budgets.
#[test]
fn a_live_child_is_waited_on_within_the_budgets() {
    // parity: 26, 134
    let options = AgentToolOptions {
        reattach_no_progress_timeout: std::time::Duration::from_millis(1_000),
        reattach_max_window: Some(std::time::Duration::from_millis(5_000)),
        ..AgentToolOptions::default()
    };
    let record = |detached: bool| {
        let (db, mut engine) = engine(options.clone());
        let mut new = new_run("r", &json!(1));
        new.input = json!(1).into();
        let dispatch = Dispatch { new, detached: detached.then(DetachedOptions::default), abandoned: None };
        engine.dispatch(&db, dispatch, 0);
        Registry::new(&db).get("r").unwrap().unwrap()
    };
    struct Case {
        name: &'static str,
        detached: bool,
        failed_tails: u32,
        last_progress: i64,
        window_end: Option<i64>,
        now: i64,
        expect: &'static str,
    }
    let cases = [
        Case {
            name: "fresh",
            detached: false,
            failed_tails: 0,
            last_progress: 900,
            window_end: Some(9_000),
            now: 1_000,
            expect: "retail",
        },
        Case {
            name: "silent",
            detached: false,
            failed_tails: 0,
            last_progress: 0,
            window_end: Some(9_000),
            now: 1_000,
            expect: "no-progress",
        },
        Case {
            name: "window",
            detached: false,
            failed_tails: 0,
            last_progress: 900,
            window_end: Some(1_000),
            now: 1_000,
            expect: "window-exceeded",
        },
        Case {
            name: "untailable",
            detached: false,
            failed_tails: NOT_TAILABLE_AFTER,
            last_progress: 900,
            window_end: None,
            now: 1_000,
            expect: "not-tailable",
        },
        Case {
            name: "detached, silent",
            detached: true,
            failed_tails: 0,
            last_progress: 0,
            window_end: None,
            now: 50_000,
            expect: "retail",
        },
        Case {
            name: "detached, untailable",
            detached: true,
            failed_tails: NOT_TAILABLE_AFTER,
            last_progress: 0,
            window_end: None,
            now: 1_000,
            expect: "not-tailable",
        },
    ];
    for case in cases {
        let record = record(case.detached);
        let mut driver = Driver::new(&record, Phase::Inspecting, true, case.last_progress);
        driver.failed_tails = case.failed_tails;
        driver.window_end = case.window_end;
        let got = match decide(&driver, &record, Ok(Some(reply("running"))), &options, case.now) {
            Decide::Retail => "retail".to_owned(),
            Decide::Conclude(Outcome::Interrupted { reason: Some(r), child_still_running, .. }) => {
                assert_eq!(child_still_running, Some(true), "{}", case.name);
                r.as_str().to_owned()
            }
            Decide::TearDown(Outcome::Interrupted { reason: Some(r), child_still_running, .. }) => {
                assert_eq!(child_still_running, Some(false), "{}: torn down", case.name);
                r.as_str().to_owned()
            }
            other => format!("{other:?}"),
        };
        assert_eq!(got, case.expect, "{}", case.name);
    }
}

/// Every answer to an exchange the engine moved past is ignored: the start answered twice,
/// the batch of a closed tail, a tail's end or an inspection that came too late, an earlier
/// instance's answers.
#[test]
fn stale_generations_produce_no_action() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    let (_, actions) = dispatch(&mut engine, &db, "r", json!(1));
    let start = gen_of(&actions, "start", "r").unwrap();
    let actions = engine.handle(&db, ParentEvent::StartReplied { run_id: "r".into(), gen: start, result: Ok(()) }, 11);
    let old_tail = gen_of(&actions, "tail", "r").unwrap();
    let chunk = |i: i64| TailLine::Chunk { i: Some(i), k: ChunkKind::Stored, b: format!("{{\"n\":{i}}}"), r: None };
    let batch = |gen, i| ParentEvent::TailBatch { run_id: "r".into(), gen, lines: vec![chunk(i)] };
    assert_eq!(effect(&engine.handle(&db, batch(old_tail, 0), 12)), "chunk");
    // The tail breaks; the child is inspected and still runs; it is tailed again.
    let actions = engine.handle(&db, ParentEvent::TailEnded { run_id: "r".into(), gen: old_tail }, 13);
    let inspection = gen_of(&actions, "inspect", "r").unwrap();
    let live = Ok(Some(reply("running")));
    engine.handle(&db, ParentEvent::Inspected { run_id: "r".into(), gen: inspection, result: live.clone() }, 14);
    let new_tail = gen_of(&engine.handle_timeout(&db, 14 + RETAIL_PAUSE_MS), "tail", "r").unwrap();
    let before = Registry::new(&db).get("r").unwrap().unwrap();
    let earlier_instance = ParentEngine::new("Parent", AgentToolOptions::default(), 7).next_gen + 1;
    let stale = [
        ("the start answered again", ParentEvent::StartReplied { run_id: "r".into(), gen: start, result: Ok(()) }),
        ("a batch of the closed tail", batch(old_tail, 1)),
        ("the closed tail's end", ParentEvent::TailEnded { run_id: "r".into(), gen: old_tail }),
        ("the closed tail refused", ParentEvent::TailRefused { run_id: "r".into(), gen: old_tail, error: "x".into() }),
        ("the inspection again", ParentEvent::Inspected { run_id: "r".into(), gen: inspection, result: live }),
        ("an end of another instance", ParentEvent::TailEnded { run_id: "r".into(), gen: earlier_instance }),
        (
            "a failed start of another instance",
            ParentEvent::StartReplied {
                run_id: "r".into(),
                gen: earlier_instance,
                result: Err(StartError::Refused("no".into())),
            },
        ),
    ];
    for (name, event) in stale {
        let actions = engine.handle(&db, event, 20);
        assert!(actions.is_empty(), "{name}: {actions:?}");
    }
    assert_eq!(Registry::new(&db).get("r").unwrap().unwrap(), before, "nothing was written");
    // The current tail still counts.
    assert_eq!(effect(&engine.handle(&db, batch(new_tail, 1), 21)), "chunk");
}

/// `on_progress` gets the child's snapshot with the child's time (`at`), not the time the
/// parent forwarded it; a body without one (an older child) gets the parent's.
#[test]
fn a_progress_snapshot_keeps_the_childs_time() {
    // parity: 83
    use crate::protocol::tail::{ChunkKind, TailLine};
    let (db, mut engine) = engine(AgentToolOptions::default());
    let tail = started(&db, &mut engine, "r", None);
    let progress = |body: &str| TailLine::Chunk { i: None, k: ChunkKind::Progress, b: body.into(), r: None };
    let lines = vec![
        progress(r#"{"type":"data-agent-progress","id":"p1","data":{"at":42,"fraction":0.25}}"#),
        progress(r#"{"type":"data-agent-progress","id":"p2","data":{"fraction":0.5}}"#),
    ];
    let actions = engine.handle(&db, ParentEvent::TailBatch { run_id: "r".into(), gen: tail, lines }, 900);
    let snapshots: Vec<(Option<f64>, i64)> = actions
        .iter()
        .filter_map(|a| match a {
            ParentAction::Hook(HookCall::Progress(_, s)) => Some((s.fraction, crate::types::epoch_ms(s.at))),
            _ => None,
        })
        .collect();
    assert_eq!(snapshots, [(Some(0.25), 42), (Some(0.5), 900)]);
}

/// Progress a child reported while its parent was away is not in the child's log (progress is
/// live-only), but its inspection carries the latest snapshot: a parent that restarts adopts
/// it as the run's snapshot (once, with the child's time) and sends it to clients, without
/// calling `on_progress` again.
#[test]
fn a_restarted_parent_rebuilds_the_snapshot_from_the_childs_inspection() {
    // parity: 84
    let (db, mut engine) = engine(AgentToolOptions::default());
    started(&db, &mut engine, "r", None);
    let mut engine = ParentEngine::new("Parent", AgentToolOptions::default(), 2);
    let inspect = |engine: &mut ParentEngine, actions: Vec<ParentAction>, at: i64, now: i64| {
        let gen = gen_of(&actions, "inspect", "r").expect("an inspection");
        let reply = InspectionReply {
            attempt: Some(1),
            progress: Some(json!({ "fraction": 0.7, "phase": "writing", "at": at })),
            ..InspectionReply::live(RunStatus::Running)
        };
        engine.handle(&db, ParentEvent::Inspected { run_id: "r".into(), gen, result: Ok(Some(reply)) }, now)
    };
    let actions = engine.wake(&db, 600);
    let actions = inspect(&mut engine, actions, 500, 601);
    assert!(!actions.iter().any(|a| matches!(a, ParentAction::Hook(HookCall::Progress(..)))), "no hook again");
    let sent = actions
        .iter()
        .filter(|a| matches!(a, ParentAction::Broadcast(frame) if frame.contains("data-agent-progress")))
        .count();
    assert_eq!(sent, 1, "clients get the snapshot: {actions:?}");
    let progress = Registry::new(&db).inspection("r").unwrap().unwrap().progress.expect("a snapshot");
    assert_eq!(
        (progress.fraction, progress.phase.as_deref(), crate::types::epoch_ms(progress.at)),
        (Some(0.7), Some("writing"), 500)
    );
    // The same snapshot seen again (another restart) is not adopted twice.
    let mut engine = ParentEngine::new("Parent", AgentToolOptions::default(), 3);
    let actions = engine.wake(&db, 700);
    let actions = inspect(&mut engine, actions, 500, 701);
    assert!(!actions
        .iter()
        .any(|a| matches!(a, ParentAction::Broadcast(frame) if frame.contains("data-agent-progress"))));
}

fn chunk(i: i64, kind: crate::protocol::tail::ChunkKind, body: &str) -> crate::protocol::tail::TailLine {
    crate::protocol::tail::TailLine::Chunk { i: Some(i), k: kind, b: body.into(), r: None }
}

/// A tail the child refused (a line past the limit) ends the run `error` with the reason, and
/// the child is told to stop.
#[test]
fn a_refused_tail_ends_the_run_and_stops_the_child() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    let tail = started(&db, &mut engine, "r", None);
    let error = "the child sent a tail line longer than 1048576 bytes".to_owned();
    let actions =
        engine.handle(&db, ParentEvent::TailRefused { run_id: "r".into(), gen: tail, error: error.clone() }, 20);
    assert!(
        actions.iter().any(|a| matches!(a, ParentAction::CancelChild { reason: Some(r), .. } if *r == error)),
        "{actions:?}"
    );
    let row = Registry::new(&db).get("r").unwrap().unwrap();
    assert_eq!((row.status, row.outcome.as_ref().and_then(Outcome::error)), (RunStatus::Error, Some(error.as_str())));
}

/// A run's start, answered, makes it `running`; a soft-interrupted run dispatched again is live
/// again once its child answers.
#[test]
fn a_started_run_is_running_and_an_interrupted_one_is_live_again() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    started(&db, &mut engine, "r", None);
    assert_eq!(Registry::new(&db).get("r").unwrap().unwrap().status, RunStatus::Running);
    let soft = Outcome::Interrupted { error: "silent".into(), reason: None, child_still_running: Some(true) };
    engine.conclude_run(&db, "r", soft, 30).unwrap();
    assert_eq!(Registry::new(&db).get("r").unwrap().unwrap().status, RunStatus::Interrupted);
    started(&db, &mut engine, "r", None);
    assert_eq!(Registry::new(&db).get("r").unwrap().unwrap().status, RunStatus::Running);
}

/// A new run whose start's answer met a storage failure (the write that makes it `running`
/// rolled back) is `running` once it is followed again after the pause.
#[test]
fn a_run_whose_start_answer_met_a_storage_failure_is_running_when_followed_again() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    let db = FailOn::new(db, "SET status = 'running' WHERE run_id = ? AND status = 'starting'");
    let (_, due) = start_answered_under_a_storage_failure(&db, &mut engine, 10, RunStatus::Starting);
    assert_eq!(Registry::new(&db).get("r").unwrap().unwrap().status, RunStatus::Running, "running at {due}");
}

/// Dispatches run `r` again at `now`, its child accepts the start while the statement `db`
/// fails on fails once: the step is rolled back (the row stays `before`) and, after the pause,
/// the run is followed again. Its tail's exchange, and when it was opened.
fn start_answered_under_a_storage_failure(
    db: &FailOn,
    engine: &mut ParentEngine,
    now: i64,
    before: RunStatus,
) -> (u64, i64) {
    let (_, actions) = engine.dispatch(db, awaited(new_run("r", &json!(1))), now);
    let start = gen_of(&actions, "start", "r").unwrap();
    db.times.set(1);
    let answer = ParentEvent::StartReplied { run_id: "r".into(), gen: start, result: Ok(()) };
    let actions = engine.handle(db, answer, now + 1);
    assert!(actions.iter().any(|a| matches!(a, ParentAction::Observe(EventType::StorageFailed, _))), "{actions:?}");
    assert_eq!(Registry::new(db).get("r").unwrap().unwrap().status, before, "rolled back");
    let due = engine.poll_timeout().unwrap();
    (gen_of(&engine.handle_timeout(db, due), "tail", "r").expect("followed again"), due)
}

/// A soft-interrupted run dispatched again whose start's answer met a storage failure (the
/// write that makes it live rolled back) is made live when it is followed again after the
/// pause, and its inspection is decided, not dropped.
#[test]
fn an_interrupted_run_driven_again_is_live_again_after_a_failed_reattach() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    let db = FailOn::new(db, "SET status = 'running', interrupted_reason = NULL");
    started(&db, &mut engine, "r", None);
    let soft = Outcome::Interrupted { error: "silent".into(), reason: None, child_still_running: Some(true) };
    engine.conclude_run(&db, "r", soft, 30).unwrap();
    let (tail, due) = start_answered_under_a_storage_failure(&db, &mut engine, 40, RunStatus::Interrupted);
    assert_eq!(Registry::new(&db).get("r").unwrap().unwrap().status, RunStatus::Running, "live again");
    // The tail breaks; the child, asked, is still running: the run is followed on.
    let actions = engine.handle(&db, ParentEvent::TailEnded { run_id: "r".into(), gen: tail }, due + 1);
    let inspect = gen_of(&actions, "inspect", "r").unwrap();
    let reply = InspectionReply::live(RunStatus::Running);
    let actions = engine.handle(
        &db,
        ParentEvent::Inspected { run_id: "r".into(), gen: inspect, result: Ok(Some(reply)) },
        due + 2,
    );
    assert!(resolved(&actions).is_empty(), "not dropped: {actions:?}");
    assert!(engine.drivers.contains_key("r"), "still driven");
}

/// What a batch forwards: a `terminal` run's ordinary chunks stay with the child while its
/// progress and milestones go out; `on_progress` sees the milestone as a milestone and the
/// progress as progress; a detached run's wanted milestone (and only it) gets its notice.
#[test]
fn a_batch_forwards_by_delivery_and_signals_by_kind() {
    use crate::protocol::tail::ChunkKind;
    let progress = r#"{"type":"data-agent-progress","id":"p","data":{"fraction":0.5,"at":5}}"#;
    let milestone =
        |name: &str| format!(r#"{{"type":"data-agent-milestone","data":{{"name":"{name}","sequence":0,"at":6}}}}"#);
    let text = r#"{"type":"text-delta","id":"t","delta":"hi"}"#;
    // An awaited run with terminal delivery.
    let (db, mut engine) = engine(AgentToolOptions::default());
    let mut new = new_run("t", &json!(1));
    new.event_delivery = EventDelivery::Terminal;
    let (_, actions) = engine.dispatch(&db, Dispatch { new, detached: None, abandoned: None }, 10);
    let start = gen_of(&actions, "start", "t").unwrap();
    let actions = engine.handle(&db, ParentEvent::StartReplied { run_id: "t".into(), gen: start, result: Ok(()) }, 11);
    let tail = gen_of(&actions, "tail", "t").unwrap();
    let lines = vec![
        chunk(0, ChunkKind::Stored, text),
        chunk(1, ChunkKind::Progress, progress),
        chunk(2, ChunkKind::Milestone, &milestone("m")),
    ];
    let actions = engine.handle(&db, ParentEvent::TailBatch { run_id: "t".into(), gen: tail, lines }, 12);
    let sent: Vec<&String> = actions
        .iter()
        .filter_map(|a| match a {
            ParentAction::Broadcast(f) => Some(f),
            _ => None,
        })
        .collect();
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert!(!sent.iter().any(|f| f.contains("text-delta")), "the text stays with the child");
    let signals: Vec<(Option<f64>, Option<String>)> = actions
        .iter()
        .filter_map(|a| match a {
            ParentAction::Hook(HookCall::Progress(_, s)) => Some((s.fraction, s.milestone.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(signals, [(Some(0.5), None), (None, Some("m".into()))]);
    // A detached run that wants milestone `m`.
    let (db, mut engine) = testing::engine(AgentToolOptions::default());
    let wants = crate::types::DetachedOptions {
        on_milestones: Some(crate::types::OnMilestones { names: vec!["m".into()], ..Default::default() }),
        ..Default::default()
    };
    let tail = started(&db, &mut engine, "d", Some(wants));
    let notices = |actions: &[ParentAction]| actions.iter().filter(|a| matches!(a, ParentAction::Notice(_))).count();
    let lines = vec![chunk(0, ChunkKind::Milestone, &milestone("other"))];
    let actions = engine.handle(&db, ParentEvent::TailBatch { run_id: "d".into(), gen: tail, lines }, 12);
    assert_eq!(notices(&actions), 0, "not a wanted one");
    let lines = vec![chunk(1, ChunkKind::Milestone, &milestone("m"))];
    let actions = engine.handle(&db, ParentEvent::TailBatch { run_id: "d".into(), gen: tail, lines }, 13);
    assert_eq!(notices(&actions), 1, "{actions:?}");
}

/// A child that says its run completed is drained: its tail is read to the outcome's line. A
/// drain that breaks off is read again after a short pause, up to three broken reads; then the
/// outcome is recorded anyway, with `agent_tool:recovery:drain_incomplete`.
#[test]
fn a_drain_that_breaks_off_is_read_again_then_given_up() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    let tail = started(&db, &mut engine, "r", None);
    let actions = engine.handle(&db, ParentEvent::TailEnded { run_id: "r".into(), gen: tail }, 20);
    let gen = gen_of(&actions, "inspect", "r").expect("an inspection");
    let done = InspectionReply { attempt: Some(1), ..InspectionReply::ended(Outcome::completed("s")) };
    let mut actions =
        engine.handle(&db, ParentEvent::Inspected { run_id: "r".into(), gen, result: Ok(Some(done)) }, 21);
    let mut now = 21;
    for broken in 1..=3 {
        let drain = gen_of(&actions, "tail", "r").unwrap_or_else(|| panic!("read {broken}: {actions:?}"));
        now += 1;
        actions = engine.handle(&db, ParentEvent::TailEnded { run_id: "r".into(), gen: drain }, now);
        if broken < 3 {
            assert_eq!(engine.poll_timeout(), Some(now + RETAIL_PAUSE_MS), "read again after the pause");
            assert_eq!(Registry::new(&db).get("r").unwrap().unwrap().status, RunStatus::Running);
            now += RETAIL_PAUSE_MS;
            actions = engine.handle_timeout(&db, now);
        }
    }
    let incomplete = actions.iter().any(|a| matches!(a, ParentAction::Observe(EventType::DrainIncomplete, _)));
    assert!(incomplete, "{actions:?}");
    assert_eq!(Registry::new(&db).get("r").unwrap().unwrap().status, RunStatus::Completed);
}

/// The re-attach window starts when an awaited run's tail first breaks, and a run still
/// streaming past it is torn down (`window-exceeded`); a detached run has no window (its budgets
/// bound it). Each inspection is due within `INSPECT_TIMEOUT_MS`.
#[test]
fn the_reattach_window_starts_when_an_awaited_runs_tail_breaks() {
    let options = AgentToolOptions {
        reattach_max_window: Some(std::time::Duration::from_millis(1_000)),
        ..AgentToolOptions::default()
    };
    for detached in [false, true] {
        let (db, mut engine) = testing::engine(options.clone());
        let tail = started(&db, &mut engine, "r", detached.then(crate::types::DetachedOptions::default));
        let running = || Ok(Some(reply("running")));
        // The tail breaks at 100: the child is asked where the run stands.
        let actions = engine.handle(&db, ParentEvent::TailEnded { run_id: "r".into(), gen: tail }, 100);
        let gen = gen_of(&actions, "inspect", "r").expect("an inspection");
        assert_eq!(engine.poll_timeout(), Some(100 + INSPECT_TIMEOUT_MS));
        engine.handle(&db, ParentEvent::Inspected { run_id: "r".into(), gen, result: running() }, 101);
        let due = engine.poll_timeout().expect("a tail again after a pause");
        let tail = gen_of(&engine.handle_timeout(&db, due), "tail", "r").expect("a tail again");
        // It breaks again past the window; the child still runs.
        let actions = engine.handle(&db, ParentEvent::TailEnded { run_id: "r".into(), gen: tail }, 2_000);
        let gen = gen_of(&actions, "inspect", "r").expect("an inspection");
        let actions = engine.handle(&db, ParentEvent::Inspected { run_id: "r".into(), gen, result: running() }, 2_001);
        let row = Registry::new(&db).get("r").unwrap().unwrap();
        if detached {
            assert!(row.status.is_live(), "no window for a detached run: {row:?}");
        } else {
            assert_eq!(
                row.outcome.as_ref().and_then(Outcome::interrupted_reason),
                Some(InterruptedReason::WindowExceeded),
                "{actions:?}"
            );
            assert!(actions.iter().any(|a| matches!(a, ParentAction::CancelChild { .. })), "torn down");
        }
    }
}

/// A child that fails a start (a 5xx: its storage, an instance not ready) gets it again after a
/// pause that doubles; after `START_ATTEMPTS` failures the run ends `error` with the child's
/// answer (a child that can never serve says why: say, it has no SQLite storage). A refusal
/// (4xx) ends it at once.
#[test]
fn a_failed_start_is_sent_again_then_the_run_ends_error() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    let (_, actions) = dispatch(&mut engine, &db, "r", json!(1));
    let mut start = gen_of(&actions, "start", "r").unwrap();
    let mut now = 10;
    let failed = || Err(StartError::Failed("Worker failed to start the run (500): storage".into()));
    for attempt in 1..START_ATTEMPTS {
        let actions =
            engine.handle(&db, ParentEvent::StartReplied { run_id: "r".into(), gen: start, result: failed() }, now);
        assert!(resolved(&actions).is_empty(), "attempt {attempt}: the run goes on");
        let pause = START_RETRY_MS << (attempt - 1);
        assert!(engine.handle_timeout(&db, now + pause - 1).is_empty(), "attempt {attempt}: not before the pause");
        now += pause;
        start = gen_of(&engine.handle_timeout(&db, now), "start", "r").expect("the start is sent again");
    }
    engine.handle(&db, ParentEvent::StartReplied { run_id: "r".into(), gen: start, result: failed() }, now);
    let record = Registry::new(&db).get("r").unwrap().unwrap();
    assert_eq!(record.status, RunStatus::Error);
    assert_eq!(record.outcome.as_ref().and_then(Outcome::error), Some("Worker failed to start the run (500): storage"));

    let (_, actions) = dispatch(&mut engine, &db, "refused", json!(1));
    let start = gen_of(&actions, "start", "refused").unwrap();
    let refused = Err(StartError::Refused("Worker refused to start the run (400): bad input".into()));
    engine.handle(&db, ParentEvent::StartReplied { run_id: "refused".into(), gen: start, result: refused }, now);
    assert_eq!(Registry::new(&db).get("refused").unwrap().unwrap().status, RunStatus::Error, "at once");
}

/// A run whose row is gone while it is followed (its storage was cleared under it) is
/// forgotten, and its callers get `aborted`, saying it was cleared: never a result it did not
/// have, and never an `error`.
#[test]
fn a_run_cleared_while_followed_hands_its_callers_aborted() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    let tail = started(&db, &mut engine, "r", None);
    db.exec("DELETE FROM agent_tool_runs WHERE run_id = 'r'", &[]).unwrap();
    let actions = engine.handle(&db, ParentEvent::TailEnded { run_id: "r".into(), gen: tail }, 20);
    let result = actions
        .iter()
        .find_map(|a| match a {
            ParentAction::Resolve { run_id, result } if run_id == "r" => Some(result.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("the callers are answered: {actions:?}"));
    assert_eq!((result.status, result.error.as_deref()), (RunStatus::Aborted, Some("the run was cleared")));
    assert!(!engine.is_driving("r"));
}
