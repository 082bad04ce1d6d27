use super::retention::{RETENTION_BOUND, RETENTION_RANGE};
use super::*;
use crate::protocol::AgentToolEvent;
use crate::store::sqlite;
use crate::types::EventDelivery;
use serde_json::json;

fn registry_db() -> rusqlite::Connection {
    let db = sqlite::memory();
    Registry::new(&db).migrate().unwrap();
    db
}

fn new_run(id: &str) -> NewRun {
    NewRun {
        run_id: id.into(),
        parent_tool_call_id: Some("call_1".into()),
        agent_type: "Researcher".into(),
        binding: "Researcher".into(),
        input_preview: Some("HTTP/3".into()),
        display: Some(json!({"name": "Researcher"})),
        display_order: 0,
        event_delivery: EventDelivery::Full,
        input: json!({"query": "HTTP/3"}).into(),
    }
}

fn stored(body: &str) -> Forward<'_> {
    Forward { kind: ChunkKind::Stored, body, replay: None }
}

#[test]
fn insert_is_idempotent_by_run_id() {
    let db = registry_db();
    let reg = Registry::new(&db);
    let first = reg.insert(&new_run("r1"), 100).unwrap();
    let Inserted::New(rec) = first else { panic!("first insert must be new") };
    assert_eq!(rec.status, RunStatus::Starting);
    assert_eq!(rec.next_seq, 1);
    let mut again = new_run("r1");
    again.input_preview = Some("other".into());
    match reg.insert(&again, 200).unwrap() {
        Inserted::Existing(r) => {
            assert_eq!(r.started_at, 100, "the existing row is untouched");
            assert_eq!(r.input_preview.as_deref(), Some("HTTP/3"));
        }
        Inserted::New(_) => panic!("second insert must find the existing row"),
    }
    assert_eq!(reg.all().unwrap().len(), 1);
}

#[test]
fn a_run_id_of_another_agent_type_is_refused() {
    let db = registry_db();
    let reg = Registry::new(&db);
    reg.insert(&new_run("r1"), 1).unwrap();
    let mut other = new_run("r1");
    other.agent_type = "Summarizer".into();
    let err = reg.insert(&other, 2).unwrap_err();
    assert!(matches!(err, RegistryError::AgentTypeMismatch { .. }));
    assert!(err.to_string().contains("already belongs to a Researcher run"));
}

#[test]
fn running_only_from_starting() {
    let db = registry_db();
    let reg = Registry::new(&db);
    reg.insert(&new_run("r1"), 1).unwrap();
    assert!(reg.mark_running("r1").unwrap());
    assert!(!reg.mark_running("r1").unwrap());
    reg.finish("r1", &Outcome::Error { error: "x".into() }, 2).unwrap();
    assert!(!reg.mark_running("r1").unwrap());
    assert_eq!(reg.get("r1").unwrap().unwrap().status, RunStatus::Error);
}

#[test]
fn sequences_start_after_started_and_are_never_reused() {
    let db = registry_db();
    let reg = Registry::new(&db);
    reg.insert(&new_run("r1"), 1).unwrap();
    reg.mark_running("r1").unwrap();
    let a = reg.append("r1", &[stored("{\"a\":1}"), stored("{\"a\":2}")], Some(1), 5).unwrap();
    assert_eq!(a, Some(vec![1, 2]));
    let progress = Forward { kind: ChunkKind::Progress, body: "{\"type\":\"data-agent-progress\"}", replay: None };
    let b = reg.append("r1", &[progress, stored("{\"a\":3}")], Some(2), 6).unwrap();
    assert_eq!(b, Some(vec![3, 4]));
    let done = reg.finish("r1", &Outcome::Completed { summary: "ok".into(), output: None }, 7).unwrap().unwrap();
    assert_eq!(done.terminal_seq, Some(5));
    assert_eq!(done.next_seq, 6);
    assert_eq!(done.child_cursor, 2);
    assert_eq!(done.progress.as_ref().map(|p| p.0), Some(3));
    // A late chunk after the terminal gets no sequence and writes nothing.
    assert_eq!(reg.append("r1", &[stored("{\"late\":1}")], Some(3), 8).unwrap(), None);
    assert_eq!(reg.get("r1").unwrap().unwrap().next_seq, 6);
}

#[test]
fn hard_terminals_are_never_overwritten() {
    let db = registry_db();
    let reg = Registry::new(&db);
    for (id, first) in [
        ("c", Outcome::Completed { summary: "s".into(), output: Some(json!({"k": 1})) }),
        ("e", Outcome::Error { error: "boom".into() }),
        ("a", Outcome::Aborted { reason: Some("user".into()) }),
    ] {
        reg.insert(&new_run(id), 1).unwrap();
        let written = reg.finish(id, &first, 2).unwrap().unwrap();
        assert_eq!(written.status, first.status());
        for later in [
            Outcome::Completed { summary: "other".into(), output: None },
            Outcome::Error { error: "late".into() },
            Outcome::Aborted { reason: None },
            Outcome::Interrupted { error: "x".into(), reason: None, child_still_running: None },
        ] {
            assert_eq!(reg.finish(id, &later, 3).unwrap(), None, "{id}: {later:?} must not overwrite");
        }
        let row = reg.get(id).unwrap().unwrap();
        assert_eq!(row, written, "{id}: row unchanged");
    }
    assert_eq!(reg.get("c").unwrap().unwrap().outcome.and_then(|o| o.output().cloned()), Some(json!({"k": 1})));
}

#[test]
fn interrupted_is_soft_and_repaired_by_a_real_result() {
    let db = registry_db();
    let reg = Registry::new(&db);
    reg.insert(&new_run("r"), 1).unwrap();
    let i = reg
        .finish(
            "r",
            &Outcome::Interrupted {
                error: "silent".into(),
                reason: Some(InterruptedReason::NoProgress),
                child_still_running: Some(true),
            },
            2,
        )
        .unwrap()
        .unwrap();
    assert_eq!(i.outcome.as_ref().and_then(Outcome::interrupted_reason), Some(InterruptedReason::NoProgress));
    assert_eq!(i.outcome.as_ref().and_then(Outcome::child_still_running), Some(true));
    let done = reg.finish("r", &Outcome::Completed { summary: "late".into(), output: None }, 3).unwrap().unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(done.outcome.as_ref().and_then(Outcome::interrupted_reason), None, "repair clears the reason fields");
    assert_eq!(done.outcome.as_ref().and_then(Outcome::child_still_running), None);
    assert_eq!(done.outcome.as_ref().and_then(Outcome::error), None);
    assert!(done.terminal_seq > i.terminal_seq, "the repaired terminal is a new frame");
}

#[test]
fn live_count_counts_starting_and_running() {
    // parity: 58
    let db = registry_db();
    let reg = Registry::new(&db);
    for id in ["a", "b", "c", "d"] {
        reg.insert(&new_run(id), 1).unwrap();
    }
    reg.mark_running("b").unwrap();
    reg.finish("c", &Outcome::Error { error: "x".into() }, 2).unwrap();
    reg.finish("d", &Outcome::Interrupted { error: "x".into(), reason: None, child_still_running: Some(false) }, 2)
        .unwrap();
    assert_eq!(reg.live_count().unwrap(), 2);
}

#[test]
fn replay_repeats_the_live_sequences() {
    let db = registry_db();
    let reg = Registry::new(&db);
    reg.insert(&new_run("r1"), 1).unwrap();
    let mut second = new_run("r2");
    second.display_order = 1;
    reg.insert(&second, 1).unwrap();
    let progress_a = "{\"type\":\"data-agent-progress\",\"id\":\"p1\"}";
    let progress_b = "{\"type\":\"data-agent-progress\",\"id\":\"p2\"}";
    let milestone = "{\"type\":\"data-agent-milestone\",\"data\":{\"name\":\"m\",\"sequence\":0}}";
    let live = reg
        .append(
            "r1",
            &[
                stored("{\"n\":0}"),
                Forward { kind: ChunkKind::Progress, body: progress_a, replay: None },
                Forward { kind: ChunkKind::Milestone, body: milestone, replay: None },
                Forward { kind: ChunkKind::Progress, body: "{\"live\":1}", replay: Some(progress_b) },
                stored("{\"n\":1}"),
            ],
            Some(2),
            3,
        )
        .unwrap()
        .unwrap();
    assert_eq!(live, vec![1, 2, 3, 4, 5]);
    reg.finish("r1", &Outcome::Completed { summary: "done".into(), output: None }, 4).unwrap();

    let frames = reg.replay().unwrap();
    let got: Vec<(String, i64, String)> = frames
        .iter()
        .map(|f| {
            let body = match &f.event {
                AgentToolEvent::Chunk { body, .. } => body.clone(),
                other => serde_json::to_value(other).unwrap()["kind"].as_str().unwrap().to_owned(),
            };
            (f.event.run_id(), f.sequence, body)
        })
        .collect();
    let expect = vec![
        ("r1", 0, "started"),
        ("r1", 1, "{\"n\":0}"),
        ("r1", 3, milestone),
        ("r1", 4, progress_b),
        ("r1", 5, "{\"n\":1}"),
        ("r1", 6, "finished"),
        ("r2", 0, "started"),
    ];
    let expect: Vec<(String, i64, String)> =
        expect.into_iter().map(|(a, b, c)| (a.to_owned(), b, c.to_owned())).collect();
    assert_eq!(got, expect, "only the latest progress, everything else with its live sequence");
    assert!(frames.iter().all(|f| f.replay == Some(true)));
    assert!(frames.iter().all(|f| f.parent_tool_call_id.as_deref() == Some("call_1")));
}

#[test]
fn delete_removes_rows_and_frames() {
    let db = registry_db();
    let reg = Registry::new(&db);
    reg.insert(&new_run("r1"), 1).unwrap();
    reg.append("r1", &[stored("{}")], Some(0), 2).unwrap();
    reg.delete(&["r1".to_owned()]).unwrap();
    assert!(reg.get("r1").unwrap().is_none());
    assert!(reg.replay().unwrap().is_empty());
}

#[test]
fn input_preview_rules() {
    assert_eq!(input_preview(&json!(null)), None);
    assert_eq!(input_preview(&json!("short")), Some("short".into()));
    let long = "é".repeat(600);
    assert_eq!(input_preview(&json!(long)).unwrap().chars().count(), 500);
    assert_eq!(input_preview(&json!({"query": "x"})), Some("{\"query\":\"x\"}".into()));
    let big = json!({ "text": "a".repeat(600) });
    let p = input_preview(&big).unwrap();
    assert_eq!(p.chars().count(), 500);
    assert!(p.ends_with("..."));
    assert!(p.starts_with("{\"text\":\"aaa"));
    // `["` + 496 + `"]` is exactly 500 characters: kept whole. One more is cut.
    let at_limit = json!(["b".repeat(496)]);
    assert_eq!(input_preview(&at_limit).unwrap(), at_limit.to_string());
    let over = input_preview(&json!(["b".repeat(497)])).unwrap();
    assert_eq!((over.len(), over.ends_with("...")), (500, true));
}

#[test]
fn matching_selects_by_status_and_age() {
    // parity: 128
    let db = registry_db();
    let reg = Registry::new(&db);
    for (id, at) in [("old", 10), ("new", 100), ("live", 50)] {
        reg.insert(&new_run(id), at).unwrap();
    }
    reg.finish("old", &Outcome::Error { error: "x".into() }, 11).unwrap();
    reg.finish("new", &Outcome::Completed { summary: "s".into(), output: None }, 101).unwrap();
    let ids = |v: Vec<RunRecord>| v.into_iter().map(|r| r.run_id).collect::<Vec<_>>();
    assert_eq!(ids(reg.matching(None, None).unwrap()), vec!["old", "live", "new"]);
    assert_eq!(ids(reg.matching(Some(&[RunStatus::Completed, RunStatus::Error]), None).unwrap()), vec!["old", "new"]);
    assert_eq!(ids(reg.matching(None, Some(60)).unwrap()), vec!["old", "live"]);
    assert_eq!(ids(reg.matching(Some(&[RunStatus::Starting]), Some(60)).unwrap()), vec!["live"]);
}

#[test]
fn a_cleared_run_id_dispatched_again_keeps_counting() {
    let db = registry_db();
    let reg = Registry::new(&db);
    reg.insert(&new_run("r"), 1).unwrap();
    reg.append("r", &[stored("{}"), stored("{}")], Some(1), 2).unwrap();
    reg.finish("r", &Outcome::Completed { summary: "s".into(), output: None }, 3).unwrap();
    reg.delete(&["r".to_owned()]).unwrap();
    let Inserted::New(again) = reg.insert(&new_run("r"), 4).unwrap() else { panic!("a cleared id is new again") };
    assert_eq!(again.started_frame().sequence, 4, "sequences 0..=3 were used by the cleared run");
    assert_eq!(again.next_seq, 5);
    assert_eq!(reg.append("r", &[stored("{}")], Some(0), 5).unwrap(), Some(vec![5]));
    reg.delete(&["r".to_owned()]).unwrap();
    let Inserted::New(third) = reg.insert(&new_run("r"), 6).unwrap() else { panic!() };
    assert_eq!((third.started_frame().sequence, third.next_seq), (6, 7));
    let replayed: Vec<i64> = reg.replay().unwrap().iter().map(|f| f.sequence).collect();
    assert_eq!(replayed, [6], "the replay starts where the numbering is");
    let Inserted::New(other) = reg.insert(&new_run("other"), 7).unwrap() else { panic!() };
    assert_eq!((other.started_frame().sequence, other.next_seq), (0, 1));
}

#[test]
fn an_interrupted_run_is_reattached_without_reusing_its_frame() {
    // parity: 140
    let db = registry_db();
    let reg = Registry::new(&db);
    reg.insert(&new_run("r"), 1).unwrap();
    reg.mark_running("r").unwrap();
    let interrupted = reg
        .finish(
            "r",
            &Outcome::Interrupted {
                error: "x".into(),
                reason: Some(InterruptedReason::NoProgress),
                child_still_running: Some(true),
            },
            2,
        )
        .unwrap()
        .unwrap();
    assert!(!reg.reattach("missing").unwrap());
    assert!(reg.reattach("r").unwrap());
    assert!(!reg.reattach("r").unwrap(), "only from interrupted");
    let row = reg.get("r").unwrap().unwrap();
    assert_eq!(
        (row.status, row.outcome.as_ref().and_then(Outcome::interrupted_reason), row.terminal_seq),
        (RunStatus::Running, None, None)
    );
    assert_eq!(reg.append("r", &[stored("{}")], Some(0), 3).unwrap(), Some(vec![interrupted.next_seq]));
    reg.finish("r", &Outcome::Error { error: "x".into() }, 4).unwrap();
    assert!(!reg.reattach("r").unwrap(), "never from a hard terminal");
    // The replaced `interrupted` frame is replayed at its sequence, byte for byte as it was sent.
    let sent = interrupted.terminal_frame().expect("interrupted has a frame");
    let replayed = reg.replay().unwrap();
    let kinds: Vec<(i64, String)> = replayed
        .iter()
        .map(|f| (f.sequence, serde_json::to_value(&f.event).unwrap()["kind"].as_str().unwrap_or_default().to_owned()))
        .collect();
    let at_sent = replayed.iter().find(|f| f.sequence == sent.sequence).expect("replayed");
    assert_eq!(
        serde_json::to_string(&at_sent.event).unwrap(),
        serde_json::to_string(&sent.event).unwrap(),
        "{kinds:?}"
    );
    assert_eq!(kinds.last().map(|(_, k)| k.as_str()), Some("error"), "{kinds:?}");
}

#[test]
fn the_finish_hook_is_claimed_once() {
    let db = registry_db();
    let reg = Registry::new(&db);
    reg.insert(&new_run("r"), 1).unwrap();
    assert!(reg.claim_finish_hook("r", 2).unwrap());
    assert!(!reg.claim_finish_hook("r", 3).unwrap());
    assert!(!reg.claim_finish_hook("missing", 3).unwrap());
}

#[test]
fn a_batch_larger_than_one_insert_keeps_every_frame_in_order() {
    let db = registry_db();
    let reg = Registry::new(&db);
    reg.insert(&new_run("big"), 1).unwrap();
    let bodies: Vec<String> = (0..FRAMES_PER_INSERT * 2 + 5).map(|i| format!("{{\"n\":{i}}}")).collect();
    let forwards: Vec<Forward<'_>> = bodies.iter().map(|b| stored(b)).collect();
    let seqs = reg.append("big", &forwards, Some(bodies.len() as i64 - 1), 2).unwrap().unwrap();
    assert_eq!(seqs, (1..=bodies.len() as i64).collect::<Vec<_>>());
    let replayed: Vec<String> = reg
        .replay()
        .unwrap()
        .into_iter()
        .filter_map(|f| match f.event {
            AgentToolEvent::Chunk { body, .. } => Some(body),
            _ => None,
        })
        .collect();
    assert_eq!(replayed, bodies);
}

#[test]
fn retention_picks_the_oldest_finished_runs_and_never_a_live_one() {
    let db = registry_db();
    let reg = Registry::new(&db);
    for i in 0..10 {
        let id = format!("r{i}");
        reg.insert(&new_run(&id), i).unwrap();
        reg.finish(&id, &Outcome::Completed { summary: "s".into(), output: None }, 100 + i).unwrap();
    }
    reg.insert(&new_run("live"), 0).unwrap();
    let ids = |v: Vec<String>| v.join(",");
    assert_eq!(ids(reg.beyond_retention(Some(3), None, 100).unwrap()), "r0,r1,r2,r3,r4,r5,r6");
    assert_eq!(ids(reg.beyond_retention(Some(3), None, 2).unwrap()), "r0,r1", "a batch at a time");
    assert_eq!(ids(reg.beyond_retention(None, Some(103), 100).unwrap()), "r0,r1,r2", "ended before 103");
    assert_eq!(ids(reg.beyond_retention(Some(8), Some(101), 100).unwrap()), "r0,r1", "either limit");
    assert!(reg.beyond_retention(None, None, 100).unwrap().is_empty(), "no policy, nothing");
    assert_eq!(reg.oldest_finished_at().unwrap(), Some(100));
    reg.delete(&["r0".to_owned()]).unwrap();
    assert_eq!(reg.oldest_finished_at().unwrap(), Some(101));
}

#[test]
fn retention_matches_its_definition_with_ties_and_live_runs() {
    // Runs ending at the same instant are cleared in run id order; the definition, computed
    // here from all rows: the finished runs beyond the newest `keep` or ended before the cutoff,
    // oldest first.
    let db = registry_db();
    let reg = Registry::new(&db);
    let mut finished: Vec<(i64, String)> = Vec::new();
    for i in 0..40 {
        let id = format!("r{:02}", (i * 7) % 40);
        reg.insert(&new_run(&id), 0).unwrap();
        if i % 5 == 4 {
            continue; // live: never a candidate
        }
        let at = 100 + (i / 3) as i64;
        reg.finish(&id, &Outcome::Completed { summary: "s".into(), output: None }, at).unwrap();
        finished.push((at, id));
    }
    finished.sort();
    for keep in [None, Some(0), Some(1), Some(5), Some(31), Some(32), Some(100)] {
        for cutoff in [None, Some(0), Some(101), Some(104), Some(110), Some(1000)] {
            for limit in [1, 3, 100] {
                let expected: Vec<String> = finished
                    .iter()
                    .enumerate()
                    .filter(|(i, (at, _))| {
                        keep.is_some_and(|k| finished.len() - i > k) || cutoff.is_some_and(|c| *at < c)
                    })
                    .map(|(_, (_, id))| id.clone())
                    .take(limit)
                    .collect();
                assert_eq!(
                    reg.beyond_retention(keep, cutoff, limit).unwrap(),
                    expected,
                    "keep {keep:?}, cutoff {cutoff:?}, limit {limit}"
                );
            }
        }
    }
}

#[test]
fn retention_reads_one_range_of_an_index_whatever_the_runs_kept() {
    // A parent asks at every dispatch; sorting every finished run each time grew faster than
    // the runs kept (0.26 ms at 300, 1.6 ms at 1 000, 14 ms at 5 000 in SQLite alone).
    let db = registry_db();
    let plans = |sql: &str| -> String {
        let mut stmt = db.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let params = vec![rusqlite::types::Value::Null; stmt.parameter_count()];
        let rows = stmt.query_map(rusqlite::params_from_iter(params), |r| r.get::<_, String>(3)).unwrap();
        rows.map(Result::unwrap).collect::<Vec<_>>().join("; ")
    };
    for sql in [RETENTION_BOUND, RETENTION_RANGE] {
        let plan = plans(sql);
        assert!(plan.contains("USING INDEX agent_tool_runs_finished"), "{plan}");
        assert!(!plan.contains("TEMP B-TREE"), "{plan}");
    }
}

#[test]
fn deleted_ids_keep_their_numbering_up_to_a_bound() {
    let db = registry_db();
    let reg = Registry::new(&db);
    for i in 0..(MAX_TOMBSTONES + 5) {
        let id = format!("t{i}");
        db.exec(
            "INSERT INTO agent_tool_tombstones (run_id, next_seq) VALUES (?, 7)",
            &[crate::store::Value::from(id.as_str())],
        )
        .unwrap();
    }
    reg.insert(&new_run("x"), 1).unwrap();
    reg.delete(&["x".to_owned()]).unwrap();
    let n = db.one("SELECT COUNT(*) FROM agent_tool_tombstones", &[]).unwrap().and_then(|r| r.int(0)).unwrap();
    assert_eq!(n as usize, MAX_TOMBSTONES);
    let Inserted::New(again) = reg.insert(&new_run("x"), 2).unwrap() else { panic!() };
    assert_eq!(again.started_frame().sequence, 1, "the newest deleted id kept its mark");
}

#[test]
fn replay_reads_in_pages_and_keeps_every_frame_in_order() {
    let db = registry_db();
    let reg = Registry::new(&db);
    let runs = REPLAY_PAGE_RUNS * 2 + 3;
    for i in 0..runs {
        let id = format!("r{i:03}");
        reg.insert(&new_run(&id), 10).unwrap(); // the same start time: ordered by id
        reg.append(&id, &[stored("{\"n\":1}")], Some(0), 11).unwrap();
        reg.finish(&id, &Outcome::Completed { summary: "s".into(), output: None }, 12).unwrap();
    }
    // One long run, with its latest progress in the middle of its frames.
    let long = "zz-long";
    reg.insert(&new_run(long), 20).unwrap();
    let bodies: Vec<String> = (0..REPLAY_PAGE_FRAMES * 2 + 7).map(|n| format!("{{\"n\":{n}}}")).collect();
    let (first, second) = bodies.split_at(REPLAY_PAGE_FRAMES + 3);
    fn batch(b: &[String]) -> Vec<Forward<'_>> {
        b.iter().map(|b| stored(b)).collect()
    }
    reg.append(long, &batch(first), Some(0), 21).unwrap();
    let progress = Forward { kind: ChunkKind::Progress, body: "{\"type\":\"data-agent-progress\"}", replay: None };
    reg.append(long, &[progress], Some(1), 22).unwrap();
    reg.append(long, &batch(second), Some(2), 23).unwrap();

    let mut frames = Vec::new();
    reg.replay_each(|f| {
        frames.push(f);
        true
    })
    .unwrap();
    assert_eq!(frames.len(), runs * 3 + 1 + bodies.len() + 1, "every run whole, every frame once");
    assert!(frames.iter().all(|f| f.to_json().contains("\"replay\":true")));
    let long_frames: Vec<&EventFrame> =
        frames.iter().filter(|f| f.to_json().contains(&format!("\"runId\":\"{long}\""))).collect();
    let seqs: Vec<i64> = long_frames.iter().map(|f| f.sequence).collect();
    assert_eq!(seqs, (0..=(bodies.len() as i64 + 1)).collect::<Vec<_>>(), "the progress at its own sequence");
    assert!(long_frames[first.len() + 1].to_json().contains("data-agent-progress"));
    let order: Vec<String> = frames
        .iter()
        .filter(|f| f.to_json().contains("\"kind\":\"started\""))
        .map(|f| {
            serde_json::from_str::<serde_json::Value>(&f.to_json()).unwrap()["event"]["runId"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted, "display order across pages");
    // A sender that stops is not sent more.
    let mut n = 0;
    reg.replay_each(|_| {
        n += 1;
        n < 5
    })
    .unwrap();
    assert_eq!(n, 5);
}

#[test]
fn a_replay_in_pages_with_writes_in_between_sends_every_frame_once() {
    let db = registry_db();
    let reg = Registry::new(&db);
    for id in ["a", "b", "c"] {
        reg.insert(&new_run(id), 1).unwrap();
        reg.append(id, &[stored("{\"n\":1}"), stored("{\"n\":2}")], Some(1), 2).unwrap();
    }
    reg.finish("a", &Outcome::Completed { summary: "s".into(), output: None }, 3).unwrap();
    let mut cursor = ReplayCursor::default();
    let mut got: Vec<(String, i64)> = Vec::new();
    let mut send = |f: EventFrame| {
        let v: serde_json::Value = serde_json::from_str(&f.to_json()).unwrap();
        got.push((v["event"]["runId"].as_str().unwrap().to_owned(), f.sequence));
        true
    };
    let mut step = 0;
    while reg.replay_page(&mut cursor, 2, &mut send).unwrap() {
        // Between pages the runs go on: `b` (already passed, or not yet) streams and ends, `c`
        // streams, a new run starts.
        step += 1;
        match step {
            2 => {
                reg.append("b", &[stored("{\"n\":3}")], Some(2), 4).unwrap();
            }
            3 => {
                reg.finish("b", &Outcome::Completed { summary: "s".into(), output: None }, 5).unwrap();
                reg.append("c", &[stored("{\"n\":3}")], Some(2), 5).unwrap();
            }
            4 => {
                reg.insert(&new_run("d"), 6).unwrap();
            }
            _ => {}
        }
    }
    // More while the socket is about to go live.
    reg.append("c", &[stored("{\"n\":4}")], Some(3), 7).unwrap();
    reg.replay_rest(&mut cursor, &mut send).unwrap();
    let late: Vec<(String, i64)> = reg
        .replay()
        .unwrap()
        .iter()
        .map(|f| {
            let v: serde_json::Value = serde_json::from_str(&f.to_json()).unwrap();
            (v["event"]["runId"].as_str().unwrap().to_owned(), f.sequence)
        })
        .collect();
    let mut sorted = got.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), got.len(), "nothing twice: {got:?}");
    let mut expected = late.clone();
    expected.sort();
    assert_eq!(sorted, expected, "everything a late client gets, no more");
    for run in ["a", "b", "c", "d"] {
        let seqs: Vec<i64> = got.iter().filter(|(r, _)| r == run).map(|(_, s)| *s).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{run}: {seqs:?} in order");
    }
}

#[test]
fn an_inspection_has_the_result_the_latest_signal_and_the_milestones() {
    let db = registry_db();
    let reg = Registry::new(&db);
    assert_eq!(reg.inspection("nobody").unwrap(), None, "unknown is None, never a failure");
    reg.insert(&new_run("r"), 1).unwrap();
    let progress = r#"{"type":"data-agent-progress","transient":true,"data":{"fraction":0.5,"phase":"reading"}}"#;
    let milestone = r#"{"type":"data-agent-milestone","data":{"name":"m","sequence":0,"at":7}}"#;
    let forward = |kind, body| Forward { kind, body, replay: None };
    reg.append("r", &[forward(ChunkKind::Progress, progress)], Some(0), 5).unwrap();
    let seen = reg.inspection("r").unwrap().unwrap();
    assert_eq!(
        (seen.progress.as_ref().and_then(|p| p.fraction), seen.progress.map(|p| crate::types::epoch_ms(p.at))),
        (Some(0.5), Some(5))
    );
    assert!(seen.result.is_none(), "live: no result yet");
    // A milestone after it is the latest signal, as the stock client's snapshot has it.
    reg.append("r", &[forward(ChunkKind::Milestone, milestone)], Some(1), 8).unwrap();
    reg.finish("r", &Outcome::Completed { summary: "done".into(), output: None }, 9).unwrap();
    let seen = reg.inspection("r").unwrap().unwrap();
    assert_eq!(seen.progress.and_then(|p| p.milestone).as_deref(), Some("m"));
    assert_eq!(seen.milestones.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(), ["m"]);
    assert_eq!(seen.result.map(|r| r.summary), Some(Some("done".into())));
}

#[test]
fn the_drill_in_gate_knows_a_run_only_under_its_own_type() {
    let db = registry_db();
    let reg = Registry::new(&db);
    reg.insert(&new_run("r"), 1).unwrap();
    assert!(reg.has_run("Researcher", "r").unwrap());
    assert!(!reg.has_run("Summarizer", "r").unwrap(), "a guessed type is refused");
    assert!(!reg.has_run("Researcher", "guessed").unwrap(), "a guessed id is refused");
}

#[test]
fn a_run_started_at_the_cut_off_is_not_older_than_it() {
    let db = registry_db();
    let reg = Registry::new(&db);
    reg.insert(&new_run("at"), 60).unwrap();
    reg.insert(&new_run("before"), 59).unwrap();
    let ids: Vec<String> = reg.matching(None, Some(60)).unwrap().into_iter().map(|r| r.run_id).collect();
    assert_eq!(ids, ["before"]);
}

#[test]
fn reruns_count_the_superseded_chunks_only() {
    let db = registry_db();
    let reg = Registry::new(&db);
    reg.insert(&new_run("r"), 1).unwrap();
    let superseded =
        Forward { kind: ChunkKind::Superseded, body: "{\"type\":\"data-agent-superseded\"}", replay: None };
    reg.append("r", &[stored("{}"), stored("{}")], Some(1), 2).unwrap();
    assert_eq!(reg.get("r").unwrap().unwrap().reruns, 0);
    reg.append("r", &[stored("{}"), superseded, stored("{}")], Some(4), 3).unwrap();
    assert_eq!(reg.get("r").unwrap().unwrap().reruns, 1);
}

#[test]
fn a_milestone_after_a_progress_in_one_batch_replaces_it_and_before_it_does_not() {
    let db = registry_db();
    let reg = Registry::new(&db);
    let progress = Forward { kind: ChunkKind::Progress, body: "{\"type\":\"data-agent-progress\"}", replay: None };
    let milestone = Forward { kind: ChunkKind::Milestone, body: "{\"type\":\"data-agent-milestone\"}", replay: None };
    reg.insert(&new_run("after"), 1).unwrap();
    reg.append("after", &[progress, milestone], Some(1), 2).unwrap();
    assert_eq!(reg.get("after").unwrap().unwrap().progress, None, "the milestone is the latest signal");
    reg.insert(&new_run("before"), 1).unwrap();
    reg.append("before", &[milestone, progress], Some(1), 2).unwrap();
    let kept = reg.get("before").unwrap().unwrap().progress;
    assert_eq!(kept, Some((2, progress.body.to_owned())), "the later progress is kept, at its own sequence");
}

#[test]
fn a_batch_without_a_cursor_leaves_the_tail_position_alone() {
    let db = registry_db();
    let reg = Registry::new(&db);
    reg.insert(&new_run("r"), 1).unwrap();
    reg.append("r", &[stored("{}")], None, 2).unwrap();
    assert_eq!(reg.get("r").unwrap().unwrap().child_cursor, -1, "a re-attach still tails from the start");
    reg.append("r", &[stored("{}")], Some(3), 3).unwrap();
    reg.append("r", &[stored("{}")], None, 4).unwrap();
    assert_eq!(reg.get("r").unwrap().unwrap().child_cursor, 3);
}

#[test]
fn a_replay_page_sends_no_more_than_its_budget() {
    let db = registry_db();
    let reg = Registry::new(&db);
    reg.insert(&new_run("r"), 1).unwrap();
    reg.append("r", &[stored("{\"n\":1}"), stored("{\"n\":2}"), stored("{\"n\":3}")], Some(2), 2).unwrap();
    reg.finish("r", &Outcome::Completed { summary: "s".into(), output: None }, 3).unwrap();
    let mut cursor = ReplayCursor::default();
    let mut pages: Vec<Vec<i64>> = Vec::new();
    loop {
        let mut page = Vec::new();
        let more = reg
            .replay_page(&mut cursor, 1, &mut |f: EventFrame| {
                page.push(f.sequence);
                true
            })
            .unwrap();
        pages.push(page);
        if !more {
            break;
        }
    }
    assert!(pages.iter().all(|p| p.len() <= 1), "{pages:?}");
    assert_eq!(pages.concat(), [0, 1, 2, 3, 4], "{pages:?}");
}

/// Counts the statements that read a run's frames.
struct CountFrameReads {
    db: rusqlite::Connection,
    reads: std::cell::Cell<usize>,
}

impl Sql for CountFrameReads {
    fn exec(&self, sql: &str, params: &[crate::store::Value]) -> Result<Vec<crate::store::Row>, StoreError> {
        if sql.starts_with("SELECT") && sql.contains("FROM agent_tool_frames") {
            self.reads.set(self.reads.get() + 1);
        }
        self.db.exec(sql, params)
    }

    fn batch(&self, sql: &str) -> Result<(), StoreError> {
        self.db.batch(sql)
    }

    fn atomically(&self, work: &mut dyn FnMut() -> Result<(), StoreError>) -> Result<(), StoreError> {
        self.db.atomically(work)
    }
}

/// Replays every run to `got` a page at a time until the pages are done (`replay_rest` not
/// yet called).
fn replay_pages<S: Sql + ?Sized>(reg: &Registry<'_, S>, cursor: &mut ReplayCursor, got: &mut Vec<(i64, String)>) {
    let mut send = |f: EventFrame| {
        got.push((f.sequence, serde_json::to_value(&f.event).unwrap()["kind"].as_str().unwrap_or("chunk").to_owned()));
        true
    };
    while reg.replay_page(cursor, 1, &mut send).unwrap() {}
}

fn replay_the_rest<S: Sql + ?Sized>(reg: &Registry<'_, S>, cursor: &mut ReplayCursor) -> Vec<(i64, String)> {
    let mut got = Vec::new();
    reg.replay_rest(cursor, &mut |f: EventFrame| {
        got.push((f.sequence, serde_json::to_value(&f.event).unwrap()["kind"].as_str().unwrap_or("chunk").to_owned()));
        true
    })
    .unwrap();
    got
}

#[test]
fn the_catch_up_reads_no_frames_of_a_run_that_did_not_grow() {
    let db = CountFrameReads { db: registry_db(), reads: 0.into() };
    let reg = Registry::new(&db);
    reg.insert(&new_run("r"), 1).unwrap();
    reg.append("r", &[stored("{}"), stored("{}")], Some(1), 2).unwrap();
    let mut cursor = ReplayCursor::default();
    replay_pages(&reg, &mut cursor, &mut Vec::new());
    db.reads.set(0);
    assert_eq!(replay_the_rest(&reg, &mut cursor), []);
    assert_eq!(db.reads.get(), 0, "the run's next sequence says it has nothing new");
    reg.append("r", &[stored("{}")], Some(2), 3).unwrap();
    let mut cursor = ReplayCursor::default();
    replay_pages(&reg, &mut cursor, &mut Vec::new());
    reg.append("r", &[stored("{}")], Some(3), 4).unwrap();
    db.reads.set(0);
    assert_eq!(replay_the_rest(&reg, &mut cursor).len(), 1);
    assert!(db.reads.get() > 0);
}

#[test]
fn the_catch_up_sends_a_new_progress_and_never_the_one_sent() {
    let db = registry_db();
    let reg = Registry::new(&db);
    let progress = Forward { kind: ChunkKind::Progress, body: "{\"type\":\"data-agent-progress\"}", replay: None };
    reg.insert(&new_run("r"), 1).unwrap();
    reg.append("r", &[stored("{}"), progress], Some(1), 2).unwrap(); // chunk 1, progress 2
    let mut cursor = ReplayCursor::default();
    let mut passed = Vec::new();
    replay_pages(&reg, &mut cursor, &mut passed);
    assert_eq!(passed.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [0, 1, 2], "the progress was the last sent");
    reg.append("r", &[stored("{}")], Some(2), 3).unwrap(); // chunk 3; the snapshot is still progress 2
    assert_eq!(replay_the_rest(&reg, &mut cursor).iter().map(|(s, _)| *s).collect::<Vec<_>>(), [3]);

    let mut cursor = ReplayCursor::default();
    replay_pages(&reg, &mut cursor, &mut Vec::new());
    reg.append("r", &[progress], Some(3), 4).unwrap(); // progress 4
    assert_eq!(replay_the_rest(&reg, &mut cursor).iter().map(|(s, _)| *s).collect::<Vec<_>>(), [4]);
}

#[test]
fn the_catch_up_sends_a_terminal_that_was_replaced_meanwhile_and_then_its_repair() {
    let db = registry_db();
    let reg = Registry::new(&db);
    reg.insert(&new_run("r"), 1).unwrap();
    reg.mark_running("r").unwrap();
    reg.append("r", &[stored("{}")], Some(0), 2).unwrap();
    let mut cursor = ReplayCursor::default();
    replay_pages(&reg, &mut cursor, &mut Vec::new());
    // While the socket drained: the run was given up on, then its late result came.
    let lost = Outcome::Interrupted {
        error: "silent".into(),
        reason: Some(InterruptedReason::NoProgress),
        child_still_running: Some(true),
    };
    reg.finish("r", &lost, 3).unwrap();
    reg.finish("r", &Outcome::Completed { summary: "late".into(), output: None }, 4).unwrap();
    let rest = replay_the_rest(&reg, &mut cursor);
    assert_eq!(rest, [(2, "interrupted".to_owned()), (3, "finished".to_owned())], "as live clients saw them");
}

#[test]
fn a_child_clear_is_owed_until_the_child_says_it_cleared() {
    let db = registry_db();
    let reg = Registry::new(&db);
    assert_eq!(reg.child_clear_owed("r").unwrap(), None);
    reg.owe_child_clear("r", "RESEARCHER", "run-r", 1).unwrap();
    assert_eq!(reg.child_clear_owed("r").unwrap(), Some(("RESEARCHER".into(), "run-r".into())));
    assert_eq!(reg.child_clear_owed("other").unwrap(), None);
    reg.child_cleared("r").unwrap();
    assert_eq!(reg.child_clear_owed("r").unwrap(), None);
}

#[test]
fn a_milestone_delivered_after_newer_progress_does_not_replace_it() {
    // The child reported the milestone at 7 and progress at 9; the parent adopted the progress
    // from an inspection first and read the milestone from the log afterwards. Live clients keep
    // the progress (the milestone is older), so the replay keeps it too.
    let db = registry_db();
    let reg = Registry::new(&db);
    reg.insert(&new_run("r"), 1).unwrap();
    let progress = r#"{"type":"data-agent-progress","transient":true,"data":{"fraction":1.0,"at":9}}"#;
    let milestone = r#"{"type":"data-agent-milestone","data":{"name":"m","sequence":0,"at":7}}"#;
    let forward = |kind, body| Forward { kind, body, replay: None };
    reg.append("r", &[forward(ChunkKind::Progress, progress)], None, 10).unwrap();
    reg.append("r", &[forward(ChunkKind::Milestone, milestone)], Some(3), 11).unwrap();
    let seen = reg.inspection("r").unwrap().unwrap();
    assert_eq!(seen.progress.and_then(|p| p.fraction), Some(1.0), "the newer progress stays the latest signal");
    // A milestone newer than the progress replaces it.
    let newer = r#"{"type":"data-agent-milestone","data":{"name":"n","sequence":1,"at":12}}"#;
    reg.append("r", &[forward(ChunkKind::Milestone, newer)], Some(4), 12).unwrap();
    let seen = reg.inspection("r").unwrap().unwrap();
    assert_eq!(seen.progress.and_then(|p| p.milestone).as_deref(), Some("n"));
}
