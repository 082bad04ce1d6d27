use super::*;
use crate::parent::engine::testing::*;
use crate::types::DetachedOptions;

#[test]
fn oversized_input_or_display_is_refused_before_anything_is_written() {
    // The documented limits (docs/security.md): 256 KiB of input, 4 KiB of display; and a child
    // still running after a give-up is watched for its late result for 24 hours.
    assert_eq!((MAX_INPUT_BYTES, MAX_DISPLAY_BYTES), (262_144, 4_096));
    assert_eq!(WATCH_MS, 86_400_000);
    let (db, mut engine) = engine(AgentToolOptions::default());
    let big = Value::String("x".repeat(MAX_INPUT_BYTES));
    let Admitted::Refused(why) = dispatch(&mut engine, &db, "big", big).0 else { panic!("refused") };
    let why = why.to_string();
    assert!(why.contains("at most 262144"), "{why}");
    let display = Some(json!({ "name": "y".repeat(MAX_DISPLAY_BYTES) }));
    let mut new = new_run("wide", &json!("ok"));
    new.display = display;
    let (admitted, actions) = engine.dispatch(&db, awaited(new), 10);
    assert!(matches!(admitted, Admitted::Refused(Error::Refused(Refused::TooLarge { what: "display", .. }))));
    assert!(actions.is_empty());
    assert!(Registry::new(&db).all().unwrap().is_empty(), "no row");
    assert!(matches!(dispatch(&mut engine, &db, "fine", json!("ok")).0, Admitted::Driving));
}

/// What each admission rule does with a dispatch, and that a refusal writes nothing.
#[test]
fn admission_rules() {
    // parity: 43, 114
    let capped = |admission| AgentToolOptions { max_concurrent: Some(1), admission, ..AgentToolOptions::default() };
    struct Case {
        name: &'static str,
        options: AgentToolOptions,
        first: Option<&'static str>,
        detached: bool,
        terminal: bool,
        abandoned: bool,
        expect: &'static str,
        rows: usize,
    }
    let cases = [
        Case {
            name: "fresh",
            options: AgentToolOptions::default(),
            first: None,
            detached: false,
            terminal: false,
            abandoned: false,
            expect: "driving",
            rows: 1,
        },
        Case {
            name: "over the cap, reject",
            options: capped(Admission::Reject),
            first: Some("a"),
            detached: false,
            terminal: false,
            abandoned: false,
            expect: "refused",
            rows: 1,
        },
        Case {
            name: "over the cap, queue",
            options: capped(Admission::Queue),
            first: Some("a"),
            detached: false,
            terminal: false,
            abandoned: false,
            expect: "queued",
            rows: 1,
        },
        Case {
            name: "detached over the cap never queues",
            options: capped(Admission::Queue),
            first: Some("a"),
            detached: true,
            terminal: false,
            abandoned: false,
            expect: "refused",
            rows: 1,
        },
        Case {
            name: "detached with terminal delivery",
            options: AgentToolOptions::default(),
            first: None,
            detached: true,
            terminal: true,
            abandoned: false,
            expect: "refused",
            rows: 0,
        },
        Case {
            name: "awaited with terminal delivery",
            options: AgentToolOptions::default(),
            first: None,
            detached: false,
            terminal: true,
            abandoned: false,
            expect: "driving",
            rows: 1,
        },
        Case {
            name: "abandoned before admission",
            options: AgentToolOptions::default(),
            first: None,
            detached: false,
            terminal: false,
            abandoned: true,
            expect: "finished",
            rows: 0,
        },
        Case {
            name: "the same id again joins",
            options: AgentToolOptions::default(),
            first: Some("r"),
            detached: false,
            terminal: false,
            abandoned: false,
            expect: "joined",
            rows: 1,
        },
    ];
    for case in cases {
        let (db, mut engine) = engine(case.options);
        if let Some(first) = case.first {
            assert!(matches!(dispatch(&mut engine, &db, first, json!(1)).0, Admitted::Driving), "{}", case.name);
        }
        let mut new = new_run("r", &json!(2));
        if case.terminal {
            new.event_delivery = EventDelivery::Terminal;
        }
        let dispatch = Dispatch {
            new,
            detached: case.detached.then(DetachedOptions::default),
            abandoned: case.abandoned.then(|| "gave up".to_owned()),
        };
        let (admitted, _) = engine.dispatch(&db, dispatch, 10);
        assert_eq!(admitted_name(&admitted), case.expect, "{}", case.name);
        assert_eq!(Registry::new(&db).all().unwrap().len(), case.rows, "{}: rows", case.name);
    }
}

#[test]
fn a_queued_dispatch_is_admitted_when_a_slot_frees_and_an_abandoned_one_writes_nothing() {
    let options = AgentToolOptions { max_concurrent: Some(1), admission: Admission::Queue, ..Default::default() };
    let (db, mut engine) = engine(options);
    dispatch(&mut engine, &db, "a", json!(1));
    assert_eq!(admitted_name(&dispatch(&mut engine, &db, "b", json!(2)).0), "queued");
    assert_eq!(admitted_name(&dispatch(&mut engine, &db, "c", json!(3)).0), "queued");
    // The caller of `c` gives up: it is dropped, written nowhere, and answered.
    let actions = engine.abandon(&db, "c", "no longer needed".into(), 11);
    let resolved = resolved(&actions);
    assert_eq!(resolved, [("c".to_owned(), RunStatus::Aborted)]);
    // `a` ends: `b` takes its slot, and only then.
    let actions = engine.cancel(&db, "a", None, 12).actions;
    assert!(actions.iter().any(|a| matches!(a, ParentAction::StartChild { run_id, .. } if run_id == "b")));
    let ids: Vec<String> = Registry::new(&db).all().unwrap().into_iter().map(|r| r.run_id).collect();
    assert_eq!(ids, ["a", "b"], "c was never written");
}

#[test]
fn a_new_dispatch_never_passes_the_queue_even_when_a_slot_is_free() {
    let options = AgentToolOptions { max_concurrent: Some(1), admission: Admission::Queue, ..Default::default() };
    let (db, mut engine) = engine(options);
    let db = FailOn::new(db, "SELECT COUNT(*) FROM agent_tool_runs WHERE status IN");
    engine.dispatch(&db, awaited(new_run("a", &json!(1))), 10);
    assert_eq!(admitted_name(&engine.dispatch(&db, awaited(new_run("b", &json!(2))), 11).0), "queued");
    // `a` ends, but the queue cannot be served this time (a failed read): a slot is free.
    db.times.set(1);
    engine.cancel(&db, "a", None, 12);
    assert_eq!(Registry::new(&db).live_count().unwrap(), 0);
    // A newcomer waits behind `b`, and `b` gets the slot first.
    let (admitted, actions) = engine.dispatch(&db, awaited(new_run("c", &json!(3))), 13);
    assert_eq!(admitted_name(&admitted), "queued");
    assert!(gen_of(&actions, "start", "b").is_some(), "the queue is served first: {actions:?}");
}

#[test]
fn a_run_id_of_another_class_is_refused_whatever_its_state() {
    for finished in [false, true] {
        let (db, mut engine) = engine(AgentToolOptions::default());
        dispatch(&mut engine, &db, "r", json!(1));
        if finished {
            engine.cancel(&db, "r", None, 11);
        }
        let before = Registry::new(&db).get("r").unwrap();
        let mut other = new_run("r", &json!(1));
        other.agent_type = "Other".into();
        let (admitted, actions) = engine.dispatch(&db, awaited(other), 12);
        let Admitted::Refused(why) = admitted else { panic!("finished {finished}: {admitted:?}") };
        let why = why.to_string();
        assert!(why.contains("already belongs to a Child run"), "{why}");
        assert!(actions.is_empty());
        assert_eq!(Registry::new(&db).get("r").unwrap(), before, "nothing written");
    }
}

/// The alarm a dispatch arms: the backbone's first beat for a detached run (the cadence starts
/// over), the recovery alarm for an awaited one; no warning while few detached runs are live.
#[test]
fn a_dispatch_arms_the_alarm_its_kind_needs() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    engine.dispatch(&db, awaited(new_run("a", &json!(1))), 1_000);
    assert_eq!(take_alarm(&mut engine), Some(1_000 + 10_000), "the recovery alarm");

    engine.quiet_ticks = 3; // a quiet backbone: its next beat is two minutes away
    let detached = Dispatch { new: new_run("d", &json!(1)), detached: Some(Default::default()), abandoned: None };
    let (_, detached_actions) = engine.dispatch(&db, detached, 2_000);
    assert_eq!(take_alarm(&mut engine), Some(2_000 + 5_000), "a new detached run: the cadence starts over");
    let warned =
        detached_actions.iter().any(|a| matches!(a, ParentAction::Observe(EventType::DetachedLiveCountWarning, _)));
    assert!(!warned, "one live detached run is no crowd");
}

/// The child is asked for terminal-only delivery exactly when the run was dispatched so.
#[test]
fn the_start_asks_for_terminal_delivery_only_when_dispatched_so() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    let terminal_only = |actions: &[ParentAction]| {
        actions.iter().find_map(|a| match a {
            ParentAction::StartChild { request, .. } => Some(request.terminal_only),
            _ => None,
        })
    };
    let (_, full) = engine.dispatch(&db, awaited(new_run("f", &json!(1))), 10);
    assert_eq!(terminal_only(&full), Some(false));
    let mut new = new_run("t", &json!(1));
    new.event_delivery = EventDelivery::Terminal;
    let (_, terminal) = engine.dispatch(&db, awaited(new), 10);
    assert_eq!(terminal_only(&terminal), Some(true));
}

/// The size limits take input and display of exactly their size, and refuse one byte more.
#[test]
fn the_size_limits_are_inclusive() {
    let (db, mut engine) = engine(AgentToolOptions::default());
    let string_of = |json_bytes: usize| json!("x".repeat(json_bytes - 2)); // the quotes count
    let input = string_of(MAX_INPUT_BYTES);
    let (admitted, _) = engine.dispatch(&db, awaited(new_run("in", &input)), 10);
    assert_eq!(admitted_name(&admitted), "driving");
    let input = string_of(MAX_INPUT_BYTES + 1);
    let (admitted, _) = engine.dispatch(&db, awaited(new_run("in+1", &input)), 10);
    assert_eq!(admitted_name(&admitted), "refused");

    let mut new = new_run("disp", &json!(1));
    new.display = Some(string_of(MAX_DISPLAY_BYTES));
    assert_eq!(admitted_name(&engine.dispatch(&db, awaited(new), 10).0), "driving");
    let mut new = new_run("disp+1", &json!(1));
    new.display = Some(string_of(MAX_DISPLAY_BYTES + 1));
    assert_eq!(admitted_name(&engine.dispatch(&db, awaited(new), 10).0), "refused");
}

/// A detached run that sets no budgets takes the agent's static ones
/// (`AgentToolOptions::detached_max_budget`, `detached_no_progress_budget`), which are 24 h and
/// 1 h unless the agent sets them; a run that sets its own keeps them.
#[test]
fn a_detached_runs_budgets_default_to_the_agents_static_options() {
    // parity: 56, 102
    use std::time::Duration;
    let budgets = |db: &rusqlite::Connection, id: &str| {
        let detached = Registry::new(db).get(id).unwrap().unwrap().detached.unwrap();
        (detached.max_budget_at, detached.no_progress_budget_ms)
    };
    let run = |id: &str, options: DetachedOptions| Dispatch {
        new: new_run(id, &json!(1)),
        detached: Some(options),
        abandoned: None,
    };
    let (db, mut engine) = engine(AgentToolOptions::default());
    engine.dispatch(&db, run("defaults", DetachedOptions::default()), 1_000);
    assert_eq!(budgets(&db, "defaults"), (Some(1_000 + 24 * 60 * 60 * 1_000), Some(60 * 60 * 1_000)));

    let options = AgentToolOptions::default()
        .detached_max_budget(Duration::from_secs(5))
        .detached_no_progress_budget(Duration::from_secs(2));
    let (db, mut engine) = self::engine(options);
    engine.dispatch(&db, run("static", DetachedOptions::default()), 1_000);
    assert_eq!(budgets(&db, "static"), (Some(6_000), Some(2_000)));
    let own = DetachedOptions { max_budget: Some(Duration::from_secs(60)), ..Default::default() };
    engine.dispatch(&db, run("own", own), 1_000);
    assert_eq!(budgets(&db, "own"), (Some(61_000), Some(2_000)), "its own ceiling, the static silence budget");
}

/// A detached dispatch's handle: `running` for a new run, for a run already driven here and
/// for a soft-interrupted run dispatched again (it is followed again, though its row says
/// `interrupted` until its child answers); the status a run ended with once it is over.
#[test]
fn a_detached_handle_says_running_for_every_run_driven_again() {
    // parity: 43
    let (db, mut engine) = engine(AgentToolOptions::default());
    let detached =
        || Dispatch { new: new_run("r", &json!(1)), detached: Some(DetachedOptions::default()), abandoned: None };
    let status = |engine: &mut ParentEngine, now| engine.dispatch(&db, detached(), now).0.handle("r", "Child").status;
    assert_eq!(status(&mut engine, 10), RunStatus::Running, "new");
    assert_eq!(status(&mut engine, 11), RunStatus::Running, "joined while its start is out");
    let soft = Outcome::Interrupted { error: "silent".into(), reason: None, child_still_running: Some(true) };
    engine.conclude_run(&db, "r", soft, 20).unwrap();
    assert_eq!(status(&mut engine, 30), RunStatus::Running, "interrupted, dispatched again");
    assert_eq!(Registry::new(&db).get("r").unwrap().unwrap().status, RunStatus::Interrupted, "until its child answers");
    assert_eq!(status(&mut engine, 31), RunStatus::Running, "joined again while that start is out");
    engine.conclude_run(&db, "r", Outcome::completed("done"), 40).unwrap();
    assert_eq!(status(&mut engine, 50), RunStatus::Completed, "over");
}
