use super::*;
use crate::parent::engine::testing::*;
use crate::protocol::tail::TailLine;
use crate::types::DetachedOptions;

/// A run driven to the point where its child says it ended.
fn ended(db: &rusqlite::Connection, engine: &mut ParentEngine, detached: Option<DetachedOptions>) -> Vec<ParentAction> {
    let dispatch = Dispatch { new: new_run("r", &json!(1)), detached, abandoned: None };
    let (_, actions) = engine.dispatch(db, dispatch, 10);
    let start = gen_of(&actions, "start", "r").unwrap();
    let actions = engine.handle(db, ParentEvent::StartReplied { run_id: "r".into(), gen: start, result: Ok(()) }, 11);
    let tail = gen_of(&actions, "tail", "r").unwrap();
    let outcome = Outcome::completed("done");
    let lines = vec![TailLine::End { outcome }];
    take_alarm(engine); // what the end asks for, alone
    engine.handle(db, ParentEvent::TailBatch { run_id: "r".into(), gen: tail, lines }, 12)
}

fn finish_hooks(actions: &[ParentAction]) -> usize {
    actions.iter().filter(|a| matches!(a, ParentAction::Hook(HookCall::Finish(..)))).count()
}

#[test]
fn a_caller_gets_the_result_only_after_the_finish_hook_returned() {
    // parity: 40
    let (db, mut engine) = engine(AgentToolOptions::default());
    let actions = ended(&db, &mut engine, None);
    assert_eq!(finish_hooks(&actions), 1);
    let gen = gen_of(&actions, "finish", "r").unwrap();
    assert!(resolved(&actions).is_empty(), "held while the hook runs: {actions:?}");
    // Anything that would answer the callers meanwhile is held too.
    assert!(resolved(&engine.abandon(&db, "r", "late".into(), 13)).is_empty());
    // A call this instance does not wait for (another exchange) settles nothing.
    let other = ParentEvent::FinishHookDone { run_id: "r".into(), gen: gen + 1000 };
    assert!(engine.handle(&db, other, 14).is_empty(), "another call's return");
    let actions = engine.handle(&db, ParentEvent::FinishHookDone { run_id: "r".into(), gen }, 14);
    assert_eq!(resolved(&actions), [("r".to_owned(), RunStatus::Completed)]);
    assert!(engine.handle(&db, ParentEvent::FinishHookDone { run_id: "r".into(), gen }, 15).is_empty(), "once");
}

fn handler() -> Option<DetachedOptions> {
    Some(DetachedOptions { on_finish: Some(json!("h")), ..DetachedOptions::default() })
}

fn delivery(actions: &[ParentAction]) -> Option<Delivery> {
    actions.iter().find_map(|a| match a {
        ParentAction::Deliver { slot, gen, attempt, .. } => {
            Some(Delivery { slot: *slot, gen: *gen, attempt: *attempt })
        }
        ParentAction::Notice(Notice { delivery, .. }) => *delivery,
        _ => None,
    })
}

/// A detached outcome's delivery, answered: done, failed (retried on the backbone until the
/// dead letter), or an answer to a delivery no longer waited for.
#[test]
fn deliveries_done_failed_and_stale() {
    // parity: 50
    struct Case {
        name: &'static str,
        answers: &'static [Result<(), &'static str>],
        stale: bool,
        delivered: bool,
        attempts: i64,
    }
    let cases = [
        Case { name: "done", answers: &[Ok(())], stale: false, delivered: true, attempts: 1 },
        Case { name: "failed, then done", answers: &[Err("boom"), Ok(())], stale: false, delivered: true, attempts: 2 },
        Case {
            name: "failed until the dead letter",
            answers: &[Err("1"), Err("2"), Err("3"), Err("4"), Err("5")],
            stale: false,
            delivered: false,
            attempts: 5,
        },
        Case { name: "a stale answer settles nothing", answers: &[Ok(())], stale: true, delivered: false, attempts: 1 },
    ];
    for case in cases {
        let (db, mut engine) = engine(AgentToolOptions::default());
        let mut actions = ended(&db, &mut engine, handler());
        let mut failures = 0;
        for (n, answer) in case.answers.iter().enumerate() {
            let mut d = delivery(&actions).unwrap_or_else(|| panic!("{}: attempt {} handed over", case.name, n + 1));
            assert_eq!(d.attempt, n as i64 + 1, "{}", case.name);
            if case.stale {
                d.gen += 1000;
            }
            let result = answer.map_err(str::to_owned);
            take_alarm(&mut engine);
            let now = 20 + n as i64;
            let done = engine.handle(&db, d.done("r".into(), result), now);
            let failed: Vec<&Value> = done
                .iter()
                .filter_map(|a| match a {
                    ParentAction::Observe(EventType::DetachedDeliveryFailed, payload) => Some(payload),
                    _ => None,
                })
                .collect();
            if let [payload] = failed[..] {
                // The failure says which slot and attempt, and whether it was the last; the
                // backbone comes back for it one cadence later.
                let last = d.attempt >= MAX_ATTEMPTS;
                assert_eq!(
                    (&payload["slot"], &payload["attempt"], &payload["deadLetter"]),
                    (&json!("finish"), &json!(d.attempt), &json!(last)),
                    "{}",
                    case.name
                );
                assert_eq!(take_alarm(&mut engine), Some(now + engine.cadence() as i64), "{}", case.name);
            }
            failures += failed.len();
            // The backbone's next tick claims what is due again.
            actions = engine.alarm(&db, 100_000 * (n as i64 + 1));
        }
        let row = Registry::new(&db).get("r").unwrap().unwrap();
        let slot = row.detached.unwrap().finish;
        assert_eq!(slot.delivered_at.is_some(), case.delivered, "{}", case.name);
        assert_eq!(slot.attempts, case.attempts, "{}", case.name);
        assert_eq!(failures, case.answers.iter().filter(|a| a.is_err()).count(), "{}: one event a failure", case.name);
        assert!(delivery(&actions).is_none(), "{}: nothing handed over again", case.name);
    }
}

#[test]
fn a_slow_delivery_is_not_handed_over_again_while_it_runs() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    let actions = ended(&db, &mut engine, handler());
    let first = delivery(&actions).unwrap();
    // Past the lease and several backbone ticks: this instance still waits for it.
    for tick in 1..5 {
        assert!(delivery(&engine.alarm(&db, tick * 70_000)).is_none(), "tick {tick}");
    }
    engine.handle(&db, first.done("r".into(), Ok(())), 400_000);
    let row = Registry::new(&db).get("r").unwrap().unwrap();
    assert!(row.detached.unwrap().finish.delivered_at.is_some());
}

/// A storage failure in a run's backbone step while its delivery is in flight does not hand
/// the delivery back: past the lease and several ticks it is not handed over again (the handler
/// still runs), and the handler's answer settles it.
#[test]
fn a_storage_failure_beside_a_delivery_in_flight_does_not_hand_it_over_again() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    let db = FailOn::new(db, "FROM agent_tool_runs WHERE run_id = ?");
    let dispatch = Dispatch { new: new_run("r", &json!(1)), detached: handler(), abandoned: None };
    let (_, actions) = engine.dispatch(&db, dispatch, 10);
    let start = gen_of(&actions, "start", "r").unwrap();
    let actions = engine.handle(&db, ParentEvent::StartReplied { run_id: "r".into(), gen: start, result: Ok(()) }, 11);
    let tail = gen_of(&actions, "tail", "r").unwrap();
    let lines = vec![TailLine::End { outcome: Outcome::completed("done") }];
    let actions = engine.handle(&db, ParentEvent::TailBatch { run_id: "r".into(), gen: tail, lines }, 12);
    let first = delivery(&actions).expect("handed over");
    db.times.set(1);
    let actions = engine.alarm(&db, 70_000);
    assert!(
        actions.iter().any(|a| matches!(a, ParentAction::Observe(EventType::StorageFailed, p)
            if p["runId"] == "r" && p["step"] == "backbone")),
        "the run's backbone step failed: {actions:?}"
    );
    for tick in 2..6 {
        assert!(delivery(&engine.alarm(&db, tick * 70_000)).is_none(), "tick {tick}: still in flight");
    }
    engine.handle(&db, first.done("r".into(), Ok(())), 400_000);
    let row = Registry::new(&db).get("r").unwrap().unwrap();
    assert!(row.detached.unwrap().finish.delivered_at.is_some(), "the late answer settled it");
}

#[test]
fn a_notice_is_posted_once_and_settles_its_delivery() {
    // parity: 49, 65
    let (db, mut engine) = engine(AgentToolOptions::default());
    db.batch(crate::chat::store::SCHEMA).unwrap();
    let notify = Some(DetachedOptions { notify: true, ..DetachedOptions::default() });
    let actions = ended(&db, &mut engine, notify);
    let Some(ParentAction::Notice(notice)) = actions.iter().find(|a| matches!(a, ParentAction::Notice(_))).cloned()
    else {
        panic!("a notice: {actions:?}")
    };
    assert_eq!(notice.id, "detached-finish:r:completed");
    let posted = engine.post_notice(&db, notice.clone(), "it finished".into(), 20);
    assert!(posted.contains(&ParentAction::Transcript));
    let Some(ParentAction::RunChatTurn { request_id, delivery: Some((run, d)) }) =
        posted.iter().find(|a| matches!(a, ParentAction::RunChatTurn { .. })).cloned()
    else {
        panic!("a model turn: {posted:?}")
    };
    assert_eq!(request_id, notice.id);
    // Offered again (a crash before the turn ended): not posted twice, settled.
    assert!(engine.post_notice(&db, notice, "it finished".into(), 21).is_empty());
    engine.handle(&db, d.done(run, Ok(())), 22);
    let messages = crate::chat::store::Messages::new(&db).list().unwrap();
    assert_eq!(messages.len(), 1, "{messages:?}");
    assert_eq!(messages[0]["role"], "user");
    let metadata =
        json!({ "source": "detached-agent-tool", "runId": "r", "agentType": "Child", "status": "completed" });
    assert_eq!(messages[0]["metadata"], metadata, "says whose run it was and how it ended");
    assert!(Registry::new(&db).get("r").unwrap().unwrap().detached.unwrap().finish.delivered_at.is_some());
}

#[test]
fn a_cleared_run_dispatched_again_posts_its_own_notices() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    db.batch(crate::chat::store::SCHEMA).unwrap();
    let notify = || Some(DetachedOptions { notify: true, ..DetachedOptions::default() });
    let notice_of = |actions: &[ParentAction]| {
        actions.iter().find_map(|a| match a {
            ParentAction::Notice(n) => Some(n.clone()),
            _ => None,
        })
    };
    let first = notice_of(&ended(&db, &mut engine, notify())).unwrap();
    engine.post_notice(&db, first.clone(), "first".into(), 20);
    let called = engine.clear(&db, &crate::types::ClearFilter::default(), 30);
    assert_eq!(called.result.unwrap().runs, ["r"]);
    let gen = gen_of(&called.actions, "clear", "r").unwrap();
    engine.handle(&db, ParentEvent::ChildCleared { run_id: "r".into(), gen, result: Ok(()) }, 31);
    let second = notice_of(&ended(&db, &mut engine, notify())).unwrap();
    assert_ne!(second.id, first.id, "a new run under the old id: {}", second.id);
    let posted = engine.post_notice(&db, second, "second".into(), 40);
    assert!(posted.contains(&ParentAction::Transcript), "posted, not taken for the old one's");
}

/// The alarms a conclusion arms: a detached run's outcome and a soft interruption (the child
/// left running) each bring the backbone back one cadence later; an awaited run's plain end
/// arms nothing. Concluding a run that already ended for good writes nothing and hands its
/// callers the result it has.
#[test]
fn a_conclusion_arms_the_backbone_only_for_what_it_must_watch() {
    let cadence = AgentToolOptions::default().backbone_cadence[0].as_millis() as i64;
    // An awaited run's plain end.
    let (db, mut parent) = engine(AgentToolOptions::default());
    ended(&db, &mut parent, None);
    assert_eq!(take_alarm(&mut parent), None);
    // A detached run's end.
    let (db, mut parent) = engine(AgentToolOptions::default());
    ended(&db, &mut parent, handler());
    assert_eq!(take_alarm(&mut parent), Some(12 + cadence));
    // A soft interruption of an awaited run, then a second conclusion of it.
    let (db, mut parent) = engine(AgentToolOptions::default());
    started(&db, &mut parent, "r", None);
    take_alarm(&mut parent);
    let soft = Outcome::Interrupted {
        error: "silent".into(),
        reason: Some(crate::InterruptedReason::NoProgress),
        child_still_running: Some(true),
    };
    parent.conclude_run(&db, "r", soft, 100).unwrap();
    assert_eq!(take_alarm(&mut parent), Some(100 + cadence));
    // Its late completion replaces the soft interruption (and arms nothing more); after that
    // hard end, another conclusion writes nothing and answers with the completion.
    let late = parent.conclude_run(&db, "r", Outcome::Completed { summary: "x".into(), output: None }, 200).unwrap();
    assert_eq!(take_alarm(&mut parent), None, "{late:?}");
    let again = parent.conclude_run(&db, "r", Outcome::Error { error: "no".into() }, 300).unwrap();
    assert_eq!(resolved(&again), [("r".to_owned(), RunStatus::Completed)], "the result it has: {again:?}");
    assert!(!again.iter().any(|a| matches!(a, ParentAction::Broadcast(_))), "nothing written: {again:?}");
}
