use super::*;
use crate::parent::engine::testing::FailOn;
use crate::protocol::chunk::Progress;
use crate::store::sqlite;
use serde_json::json;

fn db() -> rusqlite::Connection {
    let db = sqlite::memory();
    ChildRuns::new(&db).migrate().unwrap();
    db
}

/// Emits a stored chunk and flushes it, as the platform does once the turn yields.
fn emit_now(engine: &mut ChildEngine, db: &rusqlite::Connection, body: String) -> Vec<ChildAction> {
    let (_, mut actions) = engine.emit(db, "r", ChunkKind::Stored, body, None, false, 0).unwrap();
    actions.extend(engine.flush(db, "r", false).unwrap());
    actions
}

#[test]
fn emitted_chunks_are_stored_and_sent_together_once_the_turn_yields() {
    let db = db();
    let mut engine = ChildEngine::new(RecoveryPolicy::Rerun);
    engine.start(&db, &start("r"), 1).unwrap();
    let (tail, _) = engine.tail(&db, "r", -1, usize::MAX, false, 1).unwrap();
    let sub = tail.subscriber.unwrap();
    let (_, first) = engine.emit(&db, "r", ChunkKind::Stored, "{\"n\":0}".into(), None, false, 0).unwrap();
    assert!(matches!(&first[..], [ChildAction::FlushSoon { .. }]), "one flush asked, on the first");
    let (_, second) = engine.emit(&db, "r", ChunkKind::Stored, "{\"n\":1}".into(), None, false, 0).unwrap();
    assert!(second.is_empty());
    assert_eq!(StreamLog::new(&db).next_index("r").unwrap(), 0, "nothing stored before the flush");
    // A tail opened meanwhile flushes first: it reads both, and the open tail gets them too.
    let (late, actions) = engine.tail(&db, "r", -1, usize::MAX, false, 2).unwrap();
    assert_eq!(late.lines.len(), 2);
    let [ChildAction::Send { subscriber, line }] = &actions[..] else { panic!("{actions:?}") };
    assert_eq!((*subscriber, line.iter().filter(|b| **b == b'\n').count()), (sub, 2), "one write, two lines");
    assert!(engine.flush(&db, "r", false).unwrap().is_empty(), "nothing left");
    // A long burst flushes by itself.
    let mut flushed = 0;
    for n in 0..FLUSH_EVERY {
        let (_, actions) = engine.emit(&db, "r", ChunkKind::Stored, format!("{{\"m\":{n}}}"), None, false, 0).unwrap();
        flushed += actions.iter().filter(|a| matches!(a, ChildAction::Send { .. })).count();
    }
    assert_eq!(flushed, 2, "the burst went out to both tails at its bound");
}

fn start(run_id: &str) -> StartRequest {
    StartRequest {
        run_id: run_id.into(),
        input: json!({"query": "q"}).into(),
        parent_class: "P".into(),
        parent_name: "p".into(),
        child_name: format!("P/p/{run_id}"),
        terminal_only: false,
        tail_after: None,
    }
}

fn id() -> String {
    "id".into()
}

fn begins(actions: &[ChildAction]) -> Vec<i64> {
    actions
        .iter()
        .filter_map(|a| match a {
            ChildAction::BeginTurn { attempt, .. } => Some(*attempt),
            _ => None,
        })
        .collect()
}

#[test]
fn a_start_begins_one_turn_and_a_second_start_none() {
    let db = db();
    let mut engine = ChildEngine::new(RecoveryPolicy::Rerun);
    let (reply, actions) = engine.start(&db, &start("r"), 1).unwrap();
    assert!(reply.created);
    assert_eq!(begins(&actions), [1]);
    let (reply, actions) = engine.start(&db, &start("r"), 2).unwrap();
    assert!(!reply.created);
    assert_eq!(reply.status, "starting");
    assert!(begins(&actions).is_empty(), "a second start never begins a second turn");
}

#[test]
fn a_tail_gets_the_log_then_live_chunks_then_the_end() {
    let db = db();
    let mut engine = ChildEngine::new(RecoveryPolicy::Rerun);
    engine.start(&db, &start("r"), 1).unwrap();
    emit_now(&mut engine, &db, "{\"n\":0}".into());
    let (tail, _) = engine.tail(&db, "r", -1, usize::MAX, false, 2).unwrap();
    assert_eq!(tail.lines.len(), 1);
    let sub = tail.subscriber.unwrap();
    let actions = emit_now(&mut engine, &db, "{\"n\":1}".into());
    assert!(
        matches!(&actions[..], [ChildAction::FlushSoon { .. }, ChildAction::Send { subscriber, .. }] if *subscriber == sub)
    );
    let done = Outcome::completed("s");
    let actions = engine.turn_ended(&db, "r", &done, false, &id, 3).unwrap();
    assert!(matches!(&actions[..], [ChildAction::Send { .. }, ChildAction::Close { .. }]));
    let (tail, _) = engine.tail(&db, "r", 0, usize::MAX, false, 4).unwrap();
    assert_eq!(tail.lines.len(), 2, "the rest of the log and the end line");
    assert!(tail.subscriber.is_none());
}

#[test]
fn a_long_backlog_goes_out_a_page_at_a_time_then_the_subscription() {
    let db = db();
    let mut engine = ChildEngine::new(RecoveryPolicy::Rerun);
    engine.start(&db, &start("r"), 1).unwrap();
    for n in 0..5 {
        emit_now(&mut engine, &db, format!("{{\"n\":{n}}}"));
    }
    let (first, _) = engine.tail(&db, "r", -1, 2, false, 2).unwrap();
    assert_eq!((first.lines.len(), first.more_after, first.subscriber), (2, Some(1), None));
    let (second, _) = engine.tail(&db, "r", 1, 2, false, 2).unwrap();
    assert_eq!((second.lines.len(), second.more_after), (2, Some(3)));
    // A chunk stored between pages is in a later one: nothing is skipped.
    emit_now(&mut engine, &db, "{\"n\":5}".into());
    let (third, _) = engine.tail(&db, "r", 3, 2, false, 2).unwrap();
    assert_eq!((third.lines.len(), third.more_after), (2, Some(5)));
    let (last, _) = engine.tail(&db, "r", 5, 2, false, 2).unwrap();
    assert!(last.lines.is_empty() && last.more_after.is_none());
    let sub = last.subscriber.expect("subscribed once the backlog is out");
    let actions = emit_now(&mut engine, &db, "{\"n\":6}".into());
    assert!(
        matches!(&actions[..], [ChildAction::FlushSoon { .. }, ChildAction::Send { subscriber, .. }] if *subscriber == sub)
    );
}

#[test]
fn a_lost_turn_reruns_once_per_activation_behind_a_marker() {
    let db = db();
    let mut before = ChildEngine::new(RecoveryPolicy::Rerun);
    before.start(&db, &start("r"), 1).unwrap();
    emit_now(&mut before, &db, "{\"partial\":1}".into());
    // The instance restarts: a new engine over the same storage.
    let mut after = ChildEngine::new(RecoveryPolicy::Rerun);
    let (inspection, actions) = after.inspect(&db, "r", false, 5).unwrap();
    assert_eq!(begins(&actions), [2]);
    let inspection = inspection.unwrap();
    assert_eq!((inspection.status, inspection.attempt), (RunStatus::Running, Some(2)));
    let (_, again) = after.inspect(&db, "r", false, 6).unwrap();
    assert!(begins(&again).is_empty(), "never re-run twice for one restart");
    let (tail, _) = after.tail(&db, "r", -1, usize::MAX, false, 7).unwrap();
    assert_eq!(tail.lines.len(), 2, "the partial chunk and the marker");
    assert!(String::from_utf8_lossy(&tail.lines[1]).contains("\"k\":\"superseded\""));
}

#[test]
fn sealing_keeps_the_partial_and_a_new_start_runs_afresh() {
    let db = db();
    let mut before = ChildEngine::new(RecoveryPolicy::Seal);
    before.start(&db, &start("r"), 1).unwrap();
    emit_now(&mut before, &db, "{\"partial\":1}".into());
    let mut after = ChildEngine::new(RecoveryPolicy::Seal);
    let (inspection, actions) = after.inspect(&db, "r", false, 5).unwrap();
    assert!(begins(&actions).is_empty());
    let reply = inspection.unwrap();
    assert_eq!(reply.status, RunStatus::Interrupted);
    assert_eq!(reply.outcome, Some(Outcome::sealed(LOST_TURN)), "sealed by the policy, retryable");
    let (reply, actions) = after.start(&db, &start("r"), 6).unwrap();
    assert_eq!((reply.created, reply.status.as_str()), (false, "running"));
    assert_eq!(begins(&actions), [2], "a new dispatch runs it afresh");
}

#[test]
fn reruns_are_bounded() {
    // parity: 147
    let db = db();
    let mut engine = ChildEngine::new(RecoveryPolicy::Rerun);
    engine.start(&db, &start("r"), 1).unwrap();
    emit_now(&mut engine, &db, "{\"partial\":1}".into());
    for attempt in 2..=MAX_ATTEMPTS {
        engine = ChildEngine::new(RecoveryPolicy::Rerun);
        assert_eq!(begins(&engine.inspect(&db, "r", false, 5).unwrap().1), [attempt]);
        emit_now(&mut engine, &db, "{\"partial\":1}".into());
    }
    engine = ChildEngine::new(RecoveryPolicy::Rerun);
    let (inspection, actions) = engine.inspect(&db, "r", false, 9).unwrap();
    assert!(begins(&actions).is_empty());
    let reply = inspection.unwrap();
    assert_eq!(reply.status, RunStatus::Interrupted);
    assert!(
        reply.outcome.unwrap().error().unwrap().contains(&format!("{MAX_ATTEMPTS} times")),
        "sealed for the bound, not the policy"
    );
}

#[test]
fn a_rerun_cut_short_before_it_streamed_begins_again_behind_one_marker() {
    let db = db();
    let mut engine = ChildEngine::new(RecoveryPolicy::Rerun);
    engine.start(&db, &start("r"), 1).unwrap();
    emit_now(&mut engine, &db, "{\"partial\":1}".into());
    // A restart: the rerun begins behind its marker; another restart before it streamed anything.
    for at in [5, 6] {
        engine = ChildEngine::new(RecoveryPolicy::Rerun);
        assert_eq!(begins(&engine.inspect(&db, "r", false, at).unwrap().1), [2], "attempt 2, not a third");
    }
    let (tail, _) = engine.tail(&db, "r", -1, usize::MAX, false, 7).unwrap();
    let markers = tail.lines.iter().filter(|l| String::from_utf8_lossy(l).contains("\"k\":\"superseded\"")).count();
    assert_eq!((tail.lines.len(), markers), (2, 1), "the partial chunk and one marker");
    // The attempt's own stream starts after its marker.
    let run = ChildRuns::new(&db).get("r").unwrap().unwrap();
    assert_eq!(run.attempt_start, 2);
}

/// Who gets a chunk at a flush: the tails always; the child's own chat clients (a drill-in)
/// when its chat stream is open, and an ordinary chunk only without `terminal` delivery.
#[test]
fn a_flush_sends_each_kind_where_it_belongs() {
    // parity: 111, 113
    let kinds = [(ChunkKind::Stored, "stored"), (ChunkKind::Progress, "progress"), (ChunkKind::Milestone, "milestone")];
    for terminal_only in [false, true] {
        for chat_open in [false, true] {
            for (kind, name) in kinds {
                let db = db();
                let mut engine = ChildEngine::new(RecoveryPolicy::Rerun);
                let mut request = start("r");
                request.terminal_only = terminal_only;
                engine.start(&db, &request, 1).unwrap();
                let (tail, _) = engine.tail(&db, "r", -1, usize::MAX, false, 1).unwrap();
                assert!(tail.subscriber.is_some());
                engine.emit(&db, "r", kind, "{\"x\":1}".into(), None, chat_open, 0).unwrap();
                let actions = engine.flush(&db, "r", chat_open).unwrap();
                let to_chat = actions.iter().any(|a| matches!(a, ChildAction::ChatSend { .. }));
                let to_tail = actions.iter().any(|a| matches!(a, ChildAction::Send { .. }));
                let case = format!("{name}, terminal {terminal_only}, chat open {chat_open}");
                assert!(to_tail, "{case}: the tail always gets it");
                let expected = chat_open && (kind != ChunkKind::Stored || !terminal_only);
                assert_eq!(to_chat, expected, "{case}");
            }
        }
    }
}

#[test]
fn a_turn_cut_short_before_it_said_anything_begins_again_as_the_same_attempt() {
    let db = db();
    let mut before = ChildEngine::new(RecoveryPolicy::Seal);
    before.start(&db, &start("r"), 1).unwrap();
    ChildRuns::new(&db).mark_running("r").unwrap();
    // Even under `seal`: nothing was streamed, so nothing is lost or repeated.
    let mut after = ChildEngine::new(RecoveryPolicy::Seal);
    let (inspection, actions) = after.inspect(&db, "r", false, 5).unwrap();
    assert_eq!(begins(&actions), [1]);
    assert_eq!(inspection.unwrap().status, RunStatus::Running);
    let (tail, _) = after.tail(&db, "r", -1, usize::MAX, false, 6).unwrap();
    assert!(tail.lines.is_empty(), "no marker: there is no earlier attempt to set apart");
}

/// A `Rerun` engine with run `r` started at 1 and a tail subscribed to it.
fn tailed(db: &rusqlite::Connection) -> ChildEngine {
    let mut engine = ChildEngine::new(RecoveryPolicy::Rerun);
    engine.start(db, &start("r"), 1).unwrap();
    let (tail, _) = engine.tail(db, "r", -1, usize::MAX, false, 1).unwrap();
    assert!(tail.subscriber.is_some());
    engine
}

fn progress(fraction: f64) -> Report {
    Report { progress: Progress { fraction: Some(fraction), ..Progress::default() }, persist: false }
}

/// What the tails got, as chunk kinds and bodies' `type`s, in order.
fn sent(actions: &[ChildAction]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            ChildAction::Send { line, .. } => Some(line),
            _ => None,
        })
        .flat_map(|line| String::from_utf8_lossy(line).lines().map(str::to_owned).collect::<Vec<_>>())
        .filter_map(|line| match serde_json::from_str(&line).unwrap() {
            TailLine::Chunk { k, b, .. } => Some((k, b)),
            TailLine::End { .. } => None,
        })
        .map(|(kind, body)| {
            let body: serde_json::Value = serde_json::from_str(&body).unwrap();
            format!(
                "{}:{}",
                serde_json::to_value(kind).unwrap().as_str().unwrap(),
                body["data"]["fraction"]
                    .as_f64()
                    .map_or_else(|| body["data"]["name"].as_str().unwrap_or_default().to_owned(), |f| f.to_string())
            )
        })
        .collect()
}

#[test]
fn progress_is_coalesced_and_its_held_report_goes_out_at_the_engines_deadline() {
    // parity: 85, 86
    let db = db();
    let mut engine = tailed(&db);
    let mut out = Vec::new();
    let mut report = |engine: &mut ChildEngine, r: Report, now: i64| {
        engine.report_progress(&db, "r", r, false, &id, now).unwrap();
        out.extend(engine.flush(&db, "r", false).unwrap());
    };
    report(&mut engine, progress(0.1), 1_000);
    assert_eq!(engine.poll_timeout(), None, "nothing held");
    report(&mut engine, progress(0.2), 1_050);
    report(&mut engine, progress(0.3), 1_100);
    assert_eq!(engine.poll_timeout(), Some(1_200), "the window's end holds the latest");
    // A milestone is never held, and never coalesced.
    report(&mut engine, Report { progress: Progress::milestone("m"), persist: false }, 1_150);
    assert!(engine.handle_timeout(&db, &|_| false, &id, 1_199).unwrap().is_empty(), "not yet");
    out.extend(engine.handle_timeout(&db, &|_| false, &id, 1_200).unwrap());
    out.extend(engine.flush(&db, "r", false).unwrap());
    assert_eq!(sent(&out), ["progress:0.1", "milestone:m", "progress:0.3"]);
    assert_eq!(engine.poll_timeout(), None);
    let inspection = engine.inspect(&db, "r", false, 1_300).unwrap().0.unwrap();
    let milestones = ChildRuns::new(&db).milestones("r").unwrap();
    assert_eq!(milestones.iter().map(|m| (m.name.as_str(), m.sequence)).collect::<Vec<_>>(), [("m", 0)]);
    assert_eq!(inspection.progress.unwrap()["fraction"], 0.3, "the latest snapshot is kept");
}

/// A progress line carries a replay body (`r`) only when replay keeps something else than
/// what goes out live: a report with data it does not persist. Reports without data, and
/// reports that persist their data, replay as sent.
#[test]
fn a_progress_line_carries_a_replay_body_only_when_its_data_is_live_only() {
    let db = db();
    let mut engine = tailed(&db);
    let data = || Some(json!({ "draft": "…" }));
    let reports = [
        (Progress { fraction: Some(0.1), ..Progress::default() }, false),
        (Progress { fraction: Some(0.2), data: data(), ..Progress::default() }, true),
        (Progress { fraction: Some(0.3), data: data(), ..Progress::default() }, false),
    ];
    let mut replays = Vec::new();
    for (n, (progress, persist)) in reports.into_iter().enumerate() {
        // A window apart, so none is coalesced into the next.
        let now = 1_000 + 1_000 * n as i64;
        engine.report_progress(&db, "r", Report { progress, persist }, false, &id, now).unwrap();
        for action in engine.flush(&db, "r", false).unwrap() {
            let ChildAction::Send { line, .. } = action else { continue };
            for line in String::from_utf8_lossy(&line).lines() {
                if let TailLine::Chunk { r, .. } = serde_json::from_str(line).unwrap() {
                    replays.push(r.map(|r| serde_json::from_str::<serde_json::Value>(&r).unwrap()));
                }
            }
        }
    }
    assert_eq!(replays.len(), 3, "{replays:?}");
    assert_eq!((&replays[0], &replays[1]), (&None, &None), "replayed as sent");
    let live_only = replays[2].as_ref().expect("a replay body without the live-only data");
    assert_eq!((live_only["data"]["fraction"].as_f64(), live_only["data"].get("data")), (Some(0.3), None));
}

#[test]
fn a_failed_log_write_keeps_the_chunks_for_the_next_flush() {
    let db = FailOn::new(db(), "INTO chat_stream_chunks");
    let mut engine = ChildEngine::new(RecoveryPolicy::Rerun);
    engine.start(&db, &start("r"), 1).unwrap();
    engine.emit(&db, "r", ChunkKind::Stored, "{\"n\":0}".into(), None, false, 0).unwrap();
    db.times.set(1);
    assert!(engine.flush(&db, "r", false).is_err(), "the failure is the caller's to report");
    engine.emit(&db, "r", ChunkKind::Stored, "{\"n\":1}".into(), None, false, 0).unwrap();
    engine.flush(&db, "r", false).unwrap();
    let (tail, _) = engine.tail(&db, "r", -1, usize::MAX, false, 2).unwrap();
    let bodies: Vec<String> = tail.lines.iter().map(|l| String::from_utf8_lossy(l).into_owned()).collect();
    assert_eq!(bodies.len(), 2, "both chunks, once each, in order: {bodies:?}");
    assert!(bodies[0].contains("\"i\":0") && bodies[1].contains("\"i\":1"), "{bodies:?}");
}

fn status(db: &rusqlite::Connection, run_id: &str) -> RunStatus {
    ChildRuns::new(db).get(run_id).unwrap().unwrap().status
}

fn end_line(actions: &[ChildAction], to: SubscriberId) -> Option<Value> {
    actions.iter().find_map(|a| match a {
        ChildAction::Send { subscriber, line } if *subscriber == to => {
            let text = String::from_utf8_lossy(line);
            text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).find(|l| l.get("outcome").is_some())
        }
        _ => None,
    })
}

/// A turn that begins makes the run `running`; how it finishes decides the run's outcome: what
/// it returned, or `aborted` when it was cancelled (a dropped turn's stream gets its `abort`
/// chunk); every tail gets the `end` line and is closed.
#[test]
fn a_turns_end_is_the_runs_outcome_unless_it_was_cancelled() {
    type Returned = Option<Result<(String, Option<Value>), String>>;
    /// (run id, what the turn returned, the cancel it saw, the run's status, an abort chunk)
    type Case = (&'static str, Returned, Option<Option<String>>, RunStatus, bool);
    let cases: [Case; 4] = [
        ("done", Some(Ok(("sum".into(), None))), None, RunStatus::Completed, false),
        ("failed", Some(Err("boom".into())), None, RunStatus::Error, false),
        ("dropped", None, Some(Some("stop".into())), RunStatus::Aborted, true),
        ("late", Some(Ok(("sum".into(), None))), Some(None), RunStatus::Aborted, false),
    ];
    for (run_id, returned, cancelled, expected, abort_chunk) in cases {
        let db = db();
        let mut engine = ChildEngine::new(RecoveryPolicy::Rerun);
        engine.start(&db, &start(run_id), 1).unwrap();
        assert_eq!(status(&db, run_id), RunStatus::Starting);
        engine.turn_begins(&db, run_id).unwrap();
        assert_eq!(status(&db, run_id), RunStatus::Running, "{run_id}");
        let (tail, _) = engine.tail(&db, run_id, -1, usize::MAX, false, 1).unwrap();
        let sub = tail.subscriber.unwrap();
        let actions = engine.turn_finished(&db, run_id, returned, cancelled, false, &id, 2).unwrap();
        assert_eq!(status(&db, run_id), expected, "{run_id}");
        let end = end_line(&actions, sub).unwrap_or_else(|| panic!("{run_id}: no end line in {actions:?}"));
        assert_eq!(end["outcome"]["status"], expected.as_str(), "{run_id}");
        assert!(actions.iter().any(|a| matches!(a, ChildAction::Close { subscriber } if *subscriber == sub)));
        let stored = ChildRuns::new(&db).chunks_after(run_id, -1, 10).unwrap();
        assert_eq!(stored.iter().any(|c| c.body.contains("\"abort\"")), abort_chunk, "{run_id}: {stored:?}");
        assert!(!engine.is_live(run_id));
    }
}

/// A cancel stops a live turn (the platform drops it); a run with no turn here is recorded
/// `aborted` at once with the reason; an ended run is left as it is.
#[test]
fn a_cancel_stops_the_turn_or_records_the_run_aborted() {
    let db = db();
    let mut engine = ChildEngine::new(RecoveryPolicy::Rerun);
    engine.start(&db, &start("live"), 1).unwrap();
    let actions = engine.cancel(&db, "live", Some("stop".into()), 2).unwrap();
    assert!(
        matches!(&actions[..], [ChildAction::CancelTurn { run_id, reason }] if run_id == "live" && reason.as_deref() == Some("stop"))
    );
    assert_eq!(status(&db, "live"), RunStatus::Starting, "the turn's end records it");
    // Another instance: the run has no turn here.
    let mut other = ChildEngine::new(RecoveryPolicy::Rerun);
    assert!(other.cancel(&db, "live", Some("stop".into()), 3).unwrap().is_empty());
    let run = ChildRuns::new(&db).get("live").unwrap().unwrap();
    assert_eq!(
        (run.status, run.outcome().and_then(|o| o.error().map(str::to_owned))),
        (RunStatus::Aborted, Some("stop".into()))
    );
    // Ended: nothing changes.
    let mut third = ChildEngine::new(RecoveryPolicy::Rerun);
    assert!(third.cancel(&db, "live", Some("again".into()), 4).unwrap().is_empty());
    let run = ChildRuns::new(&db).get("live").unwrap().unwrap();
    assert_eq!(run.outcome().and_then(|o| o.error().map(str::to_owned)), Some("stop".into()), "the first reason stays");
    assert!(third.cancel(&db, "unknown", None, 5).unwrap().is_empty());
}

/// A tail that went away gets nothing more; the others do. A reset (the storage wiped)
/// forgets every live run.
#[test]
fn an_unsubscribed_tail_gets_nothing_more_and_a_reset_forgets_live_runs() {
    let db = db();
    let mut engine = ChildEngine::new(RecoveryPolicy::Rerun);
    engine.start(&db, &start("r"), 1).unwrap();
    let (a, _) = engine.tail(&db, "r", -1, usize::MAX, false, 1).unwrap();
    let (b, _) = engine.tail(&db, "r", -1, usize::MAX, false, 1).unwrap();
    let (a, b) = (a.subscriber.unwrap(), b.subscriber.unwrap());
    engine.unsubscribe(a);
    let actions = emit_now(&mut engine, &db, "{\"n\":0}".into());
    let to: Vec<SubscriberId> = actions
        .iter()
        .filter_map(|x| match x {
            ChildAction::Send { subscriber, .. } => Some(*subscriber),
            _ => None,
        })
        .collect();
    assert_eq!(to, [b]);
    assert!(engine.is_live("r"));
    engine.reset();
    assert!(!engine.is_live("r"));
}

/// Stored chunks are read strictly after the cursor; the statuses read back as written.
#[test]
fn the_log_reads_after_its_cursor_and_statuses_round_trip() {
    let db = db();
    let mut engine = ChildEngine::new(RecoveryPolicy::Rerun);
    engine.start(&db, &start("r"), 1).unwrap();
    for n in 0..3 {
        emit_now(&mut engine, &db, format!("{{\"n\":{n}}}"));
    }
    let indexes = |after| -> Vec<i64> {
        ChildRuns::new(&db).chunks_after("r", after, 10).unwrap().iter().map(|c| c.index).collect()
    };
    assert_eq!(indexes(-1), [0, 1, 2]);
    assert_eq!(indexes(0), [1, 2]);
    assert_eq!(indexes(2), Vec::<i64>::new());
    let runs = ChildRuns::new(&db);
    assert!(runs.mark_running("r").unwrap(), "starting → running");
    assert!(!runs.mark_running("r").unwrap(), "once");
    for outcome in [Outcome::completed(""), Outcome::failed("x"), Outcome::aborted(None)] {
        let status = outcome.status();
        let id = format!("s-{}", status.as_str());
        engine.start(&db, &start(&id), 1).unwrap();
        runs.finish(&id, &outcome, 2).unwrap();
        assert_eq!(runs.get(&id).unwrap().unwrap().status, status);
    }
}

/// A milestone is reached once per run and name: a re-run after a restart does not report again
/// what an earlier attempt reached (`agent_tool:progress:ignored` says why), while a milestone
/// new to the run, or reached again within one attempt, is reported. Plain progress carries the
/// child's time.
#[test]
fn a_rerun_does_not_repeat_a_milestone_an_earlier_attempt_reached() {
    // parity: 83, 84, 87
    let db = db();
    let mut engine = ChildEngine::new(RecoveryPolicy::Rerun);
    engine.start(&db, &start("r"), 1).unwrap();
    let milestone = |name: &str| Report { progress: Progress::milestone(name), persist: false };
    engine.report_progress(&db, "r", milestone("sources-gathered"), false, &id, 2).unwrap();
    emit_now(&mut engine, &db, "{\"partial\":1}".into());
    // A restart: attempt 2 runs the same work again.
    let mut engine = ChildEngine::new(RecoveryPolicy::Rerun);
    assert_eq!(begins(&engine.inspect(&db, "r", false, 5).unwrap().1), [2]);
    let (tail, _) = engine.tail(&db, "r", -1, usize::MAX, false, 5).unwrap();
    assert!(tail.subscriber.is_some());
    let mut out = Vec::new();
    for (name, at) in [("sources-gathered", 6), ("draft-written", 7), ("draft-written", 8)] {
        let actions = engine.report_progress(&db, "r", milestone(name), false, &id, at).unwrap();
        if name == "sources-gathered" {
            let ignored = actions.iter().any(|a| {
                matches!(a, ChildAction::Observe(EventType::ProgressIgnored, p) if p["why"].as_str().unwrap().contains("earlier attempt"))
            });
            assert!(ignored, "{actions:?}");
        }
        out.extend(actions);
        out.extend(engine.flush(&db, "r", false).unwrap());
    }
    engine.report_progress(&db, "r", progress(0.5), false, &id, 1_000).unwrap();
    out.extend(engine.flush(&db, "r", false).unwrap());
    assert_eq!(sent(&out), ["milestone:draft-written", "milestone:draft-written", "progress:0.5"]);
    let names: Vec<String> = ChildRuns::new(&db).milestones("r").unwrap().into_iter().map(|m| m.name).collect();
    assert_eq!(names, ["sources-gathered", "draft-written", "draft-written"]);
    let last = out.iter().rev().find_map(|a| match a {
        ChildAction::Send { line, .. } => Some(String::from_utf8_lossy(line).into_owned()),
        _ => None,
    });
    let line: Value = serde_json::from_str(last.unwrap().trim()).unwrap();
    let progress = &line["b"];
    assert_eq!(
        (progress["type"].as_str(), progress["data"]["at"].as_i64()),
        (Some("data-agent-progress"), Some(1_000))
    );
    // The latest snapshot is kept on the row, with its time, and the parent's inspection
    // reply carries it (a parent that was away rebuilds its snapshot from it).
    let reply = engine.inspect(&db, "r", false, 1_001).unwrap().0.unwrap();
    let reply: crate::protocol::child_api::InspectionReply =
        serde_json::from_value(serde_json::to_value(&reply).unwrap()).unwrap();
    assert_eq!(reply.progress, Some(json!({ "fraction": 0.5, "at": 1_000 })));
}

/// `max_recovery_attempts` bounds the re-runs, and the agent's `should_keep_recovering` is asked
/// before each one (with the attempt cut short and the work streamed so far); its `false` seals
/// the run, saying why.
#[test]
fn a_rerun_is_bounded_by_the_options_and_asked_of_the_agent() {
    // parity: 147
    use std::cell::RefCell;
    let restart = |engine: ChildEngine, db: &rusqlite::Connection, at: i64| {
        let mut engine = engine;
        let actions = engine.inspect(db, "r", false, at).unwrap().1;
        (engine, begins(&actions))
    };
    // Five attempts allowed, the agent always willing.
    let db = db();
    let fresh = || ChildEngine::new(RecoveryPolicy::Rerun).with_recovery(5, None, KeepRecovering::default());
    let mut engine = fresh();
    engine.start(&db, &start("r"), 1).unwrap();
    emit_now(&mut engine, &db, "{\"partial\":1}".into());
    for attempt in 2..=5 {
        let (mut next, begun) = restart(fresh(), &db, attempt);
        assert_eq!(begun, [attempt], "attempt {attempt} of 5");
        emit_now(&mut next, &db, "{\"partial\":1}".into());
    }
    let (_, begun) = restart(fresh(), &db, 9);
    assert!(begun.is_empty());
    let run = ChildRuns::new(&db).get("r").unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Interrupted);
    assert!(run.error_message.unwrap().contains("5 times"));

    // The agent stops after its second attempt.
    let db = self::db();
    let asked = Rc::new(RefCell::new(Vec::new()));
    let keep = {
        let asked = asked.clone();
        KeepRecovering(Rc::new(move |run: &RecoveryAttempt| {
            asked.borrow_mut().push(run.clone());
            run.attempt < 2
        }))
    };
    let fresh = || ChildEngine::new(RecoveryPolicy::Rerun).with_recovery(10, None, keep.clone());
    let mut engine = fresh();
    engine.start(&db, &start("r"), 1).unwrap();
    emit_now(&mut engine, &db, "{\"partial\":1}".into());
    let (mut engine, begun) = restart(fresh(), &db, 2);
    assert_eq!(begun, [2]);
    emit_now(&mut engine, &db, "{\"partial\":2}".into());
    emit_now(&mut engine, &db, "{\"partial\":3}".into());
    let (_, begun) = restart(fresh(), &db, 3);
    assert!(begun.is_empty(), "declined");
    let run = ChildRuns::new(&db).get("r").unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Interrupted);
    assert!(run.error_message.unwrap().contains("should_keep_recovering declined"));
    let asked: Vec<(String, u32, u64, u64)> =
        asked.borrow().iter().map(|a| (a.run_id.clone(), a.attempt, a.chunks, a.work)).collect();
    // Attempt 1 streamed one chunk (no work yet: nothing was cut short before); attempt 2 two
    // more, behind its marker, and those are the recovery's work.
    assert_eq!(asked, [("r".to_owned(), 1, 1, 0), ("r".to_owned(), 2, 4, 2)]);
}

/// The runs of [`ChildEngine`]s bounded to `max_work` chunks of recovery, one per restart.
fn bounded(max_work: Option<u64>) -> impl Fn() -> ChildEngine {
    move || ChildEngine::new(RecoveryPolicy::Rerun).with_recovery(5, max_work, KeepRecovering::default())
}

/// A runaway is bounded the same way live and in recovery (`max_recovery_work`, the SDK's
/// `maxRecoveryWork`): a run no restart cut short is not measured; from the first restart on,
/// every stored chunk counts, and the one that passes the bound seals the run at once, while
/// its turn is live — its tails get the `end` line, the turn is stopped, what it streamed is
/// kept — without waiting for another restart.
#[test]
fn a_runaway_is_sealed_live_once_its_recovery_streams_past_the_work_bound() {
    // parity: 147
    let db = db();
    let fresh = bounded(Some(5));
    let mut engine = fresh();
    engine.start(&db, &start("r"), 1).unwrap();
    for n in 0..20 {
        emit_now(&mut engine, &db, format!("{{\"first\":{n}}}"));
    }
    assert!(engine.is_live("r"), "never cut short: twenty chunks, unmeasured");
    // A restart: the second attempt begins behind its marker, and its work is measured.
    let mut engine = fresh();
    assert_eq!(begins(&engine.inspect(&db, "r", false, 2).unwrap().1), [2]);
    let (tail, _) = engine.tail(&db, "r", 20, usize::MAX, false, 2).unwrap();
    let subscriber = tail.subscriber.unwrap();
    for n in 0..5 {
        let (live, _) = engine.emit(&db, "r", ChunkKind::Stored, format!("{{\"again\":{n}}}"), None, false, 3).unwrap();
        assert!(live, "chunk {n}: within the bound");
    }
    let (live, actions) = engine.emit(&db, "r", ChunkKind::Stored, "{\"again\":5}".into(), None, false, 4).unwrap();
    assert!(!live, "the sixth chunk passes the bound");
    assert!(!engine.is_live("r"));
    assert!(
        actions.contains(&ChildAction::CancelTurn { run_id: "r".into(), reason: Some("work_budget_exceeded".into()) }),
        "the turn is stopped: {actions:?}"
    );
    assert!(actions.iter().any(|a| matches!(a, ChildAction::Observe(EventType::ChildSealed, p)
        if p["reason"] == "work_budget_exceeded" && p["attempt"] == 2)));
    let sent: Vec<String> = actions
        .iter()
        .filter_map(|a| match a {
            ChildAction::Send { subscriber: s, line } if *s == subscriber => {
                Some(String::from_utf8_lossy(line).into_owned())
            }
            _ => None,
        })
        .collect();
    let sent = sent.concat();
    assert!(sent.contains("again"), "the held chunks go out first: {sent}");
    assert!(sent.trim_end().lines().last().unwrap().contains("\"interrupted\""), "then the end line: {sent}");
    assert!(actions.contains(&ChildAction::Close { subscriber }));
    let run = ChildRuns::new(&db).get("r").unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Interrupted);
    let error = run.error_message.unwrap();
    assert!(error.contains("6 chunks") && error.contains("max_recovery_work (5)"), "{error}");
    assert_eq!(StreamLog::new(&db).next_index("r").unwrap(), 27, "20, the marker, and all six kept");
    // The stopped turn's end changes nothing: the run stays sealed as it was.
    let actions = engine.turn_finished(&db, "r", None, Some(Some("work_budget_exceeded".into())), false, &id, 5);
    assert!(actions.unwrap().is_empty());
    assert_eq!(ChildRuns::new(&db).get("r").unwrap().unwrap().error_message.as_deref(), Some(error.as_str()));
}

/// The bound is checked before a re-run too: work streamed under a looser bound (here none)
/// seals the run at its next restart under a tighter one, without running it again. A new
/// dispatch of the sealed run starts unmeasured; `None` never bounds it; a run under `Seal` is
/// never re-run, so never measured.
#[test]
fn the_work_bound_is_checked_before_a_rerun_and_a_new_dispatch_starts_unmeasured() {
    // parity: 147
    let db = db();
    let mut engine = bounded(None)();
    engine.start(&db, &start("r"), 1).unwrap();
    emit_now(&mut engine, &db, "{\"n\":0}".into());
    let mut engine = bounded(None)();
    assert_eq!(begins(&engine.inspect(&db, "r", false, 2).unwrap().1), [2]);
    for n in 0..10 {
        emit_now(&mut engine, &db, format!("{{\"n\":{n}}}"));
    }
    assert!(engine.is_live("r"), "no bound: ten chunks of recovery go on");
    // A deploy with a bound of 5, and a restart.
    let mut engine = bounded(Some(5))();
    let actions = engine.inspect(&db, "r", false, 3).unwrap().1;
    assert!(begins(&actions).is_empty(), "not run again: {actions:?}");
    assert!(actions.iter().any(|a| matches!(a, ChildAction::Observe(EventType::ChildSealed, p)
        if p["reason"] == "work_budget_exceeded")));
    let run = ChildRuns::new(&db).get("r").unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Interrupted);
    assert!(run.error_message.unwrap().contains("10 chunks"));
    // Dispatched again: a fresh start, unmeasured until a restart cuts it short again.
    assert_eq!(begins(&engine.start(&db, &start("r"), 4).unwrap().1), [3]);
    for n in 0..10 {
        emit_now(&mut engine, &db, format!("{{\"n\":{n}}}"));
    }
    assert!(engine.is_live("r"));
    assert_eq!(ChildRuns::new(&db).get("r").unwrap().unwrap().work_from, None);
    // Under `Seal`, no re-run, no measure: the run is sealed by the policy.
    let db = self::db();
    let mut engine = ChildEngine::new(RecoveryPolicy::Seal).with_recovery(5, Some(0), KeepRecovering::default());
    engine.start(&db, &start("r"), 1).unwrap();
    emit_now(&mut engine, &db, "{\"n\":0}".into());
    let mut engine = ChildEngine::new(RecoveryPolicy::Seal).with_recovery(5, Some(0), KeepRecovering::default());
    let actions = engine.inspect(&db, "r", false, 2).unwrap().1;
    assert!(actions.iter().any(|a| matches!(a, ChildAction::Observe(EventType::ChildSealed, p)
        if p["reason"] == "sealed_by_policy")));
    assert_eq!(begins(&engine.start(&db, &start("r"), 3).unwrap().1), [2], "dispatched again");
    for n in 0..3 {
        emit_now(&mut engine, &db, format!("{{\"n\":{n}}}"));
    }
    assert!(engine.is_live("r"), "a bound of 0 does not apply under Seal");
}

/// A report for a run whose turn is not live here (never started, or ended) is refused with
/// `agent_tool:progress:ignored`, and nothing is stored or sent.
#[test]
fn a_report_for_a_run_that_is_not_live_is_ignored() {
    // parity: 74
    let db = db();
    let mut engine = ChildEngine::new(RecoveryPolicy::Rerun);
    engine.start(&db, &start("r"), 1).unwrap();
    engine.turn_finished(&db, "r", Some(Ok(("done".into(), None))), None, false, &id, 2).unwrap();
    for run_id in ["r", "never"] {
        let milestone = Report { progress: Progress::milestone("late"), persist: false };
        let actions = engine.report_progress(&db, run_id, milestone, false, &id, 3).unwrap();
        assert!(
            matches!(actions.as_slice(), [ChildAction::Observe(EventType::ProgressIgnored, p)] if p["runId"] == run_id),
            "{run_id}: {actions:?}"
        );
    }
    assert!(ChildRuns::new(&db).milestones("r").unwrap().is_empty(), "nothing stored");
    assert!(ChildRuns::new(&db).chunks_after("r", -1, 100).unwrap().iter().all(|c| !c.body.contains("late")));
}

/// The end of a turn is one unit: when a statement fails half way (here the read after the
/// outcome is written), nothing of it stays — not the chunks it flushed, not the outcome — and
/// the run is still live with its held chunks and its tails, so the same end taken again sends
/// the tail every chunk, then the end line.
#[test]
fn a_failed_end_of_turn_leaves_the_run_as_it_was_and_is_taken_again() {
    let db = FailOn::new(db(), "FROM agent_tool_child_runs WHERE run_id");
    let mut engine = ChildEngine::new(RecoveryPolicy::Rerun);
    engine.start(&db, &start("r"), 1).unwrap();
    let (tail, _) = engine.tail(&db, "r", -1, usize::MAX, false, 1).unwrap();
    let sub = tail.subscriber.unwrap();
    engine.emit(&db, "r", ChunkKind::Stored, "{\"n\":0}".into(), None, false, 0).unwrap();
    db.times.set(1);
    let returned = Some(Ok(("s".to_owned(), None)));
    let failed = engine.turn_finished(&db, "r", returned.clone(), None, false, &id, 2);
    assert!(failed.is_err());
    assert_eq!(StreamLog::new(&db).next_index("r").unwrap(), 0, "the chunk it flushed was rolled back");
    assert!(ChildRuns::new(&db.db).get("r").unwrap().unwrap().status.is_live(), "not ended");
    assert!(engine.is_live("r"), "still live here, its tail still open");
    let actions = engine.turn_finished(&db, "r", returned, None, false, &id, 3).unwrap();
    let sent: Vec<String> = actions
        .iter()
        .filter_map(|a| match a {
            ChildAction::Send { subscriber, line } if *subscriber == sub => {
                Some(String::from_utf8_lossy(line).into_owned())
            }
            _ => None,
        })
        .collect();
    assert!(sent.iter().any(|l| l.contains(r#""b":{"n":0}"#)), "the held chunk reaches the tail: {sent:?}");
    assert!(actions.iter().any(|a| matches!(a, ChildAction::Close { subscriber } if *subscriber == sub)));
    assert_eq!(StreamLog::new(&db).next_index("r").unwrap(), 1);
}

/// A tail (and an inspection) is one unit: a tail that heals a run whose turn a restart took
/// (the turn begins again) and then fails to read the log leaves neither the run live here nor
/// its row changed, so the next request heals it and begins the turn. (It used to leave the run
/// live in memory with no turn begun: nothing would ever run it.)
#[test]
fn a_failed_tail_that_healed_a_run_leaves_it_to_be_healed_again() {
    let db = FailOn::new(db(), "idx > ? ORDER BY idx LIMIT");
    ChildEngine::new(RecoveryPolicy::Rerun).start(&db, &start("r"), 1).unwrap();
    // The instance restarted: a new engine over the same storage.
    let mut engine = ChildEngine::new(RecoveryPolicy::Rerun);
    db.times.set(1);
    assert!(engine.tail(&db, "r", -1, usize::MAX, false, 2).is_err());
    assert!(!engine.is_live("r"), "no turn began, so the run is not live here");
    let (_, actions) = engine.tail(&db, "r", -1, usize::MAX, false, 3).unwrap();
    assert_eq!(begins(&actions), [1], "the next tail heals it: the turn begins");
}

/// The same for an inspection that heals a run and then fails to count its chunks.
#[test]
fn a_failed_inspection_that_healed_a_run_leaves_it_to_be_healed_again() {
    let db = FailOn::new(db(), "SELECT COALESCE(MAX(idx) + 1, 0)");
    ChildEngine::new(RecoveryPolicy::Rerun).start(&db, &start("r"), 1).unwrap();
    let mut engine = ChildEngine::new(RecoveryPolicy::Rerun);
    // The first count is the healing's own; the second, the reply's, fails.
    db.skip.set(1);
    db.times.set(1);
    assert!(engine.inspect(&db, "r", false, 2).is_err());
    assert!(!engine.is_live("r"), "no turn began, so the run is not live here");
    let (reply, actions) = engine.inspect(&db, "r", false, 3).unwrap();
    assert_eq!(begins(&actions), [1], "the next inspection heals it: the turn begins");
    assert_eq!(reply.unwrap().status, RunStatus::Running);
}

/// The end of a turn that could not be stored is given up: the run is no longer live here, its
/// tails are closed without an `end` line (so each parent asks where the run stands), the loss
/// is observed, and the next request heals the run by the recovery policy.
#[test]
fn a_lost_end_of_turn_closes_the_tails_and_leaves_the_run_to_be_healed() {
    let db = db();
    let mut engine = ChildEngine::new(RecoveryPolicy::Rerun);
    engine.start(&db, &start("r"), 1).unwrap();
    let (tail, _) = engine.tail(&db, "r", -1, usize::MAX, false, 1).unwrap();
    let sub = tail.subscriber.unwrap();
    emit_now(&mut engine, &db, "{\"n\":0}".into());
    let actions = engine.turn_lost("r");
    assert!(!engine.is_live("r"));
    assert!(actions.iter().any(|a| matches!(a, ChildAction::Close { subscriber } if *subscriber == sub)));
    assert!(!actions.iter().any(|a| matches!(a, ChildAction::Send { .. })), "no end line");
    assert!(actions.iter().any(|a| matches!(a, ChildAction::Observe(EventType::StorageFailed, _))));
    assert!(engine.turn_lost("r").is_empty(), "given up once");
    let (_, actions) = engine.tail(&db, "r", -1, usize::MAX, false, 2).unwrap();
    assert_eq!(begins(&actions), [2], "healed: the turn runs again behind a marker");
}
