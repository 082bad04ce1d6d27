//! Following a child: its start's answer, its tail's batches and end, the inspection that
//! decides what a broken tail means, and the re-attach budgets.

use super::*;

use serde_json::{json, Value};

use crate::observability::EventType;
use crate::parent::detached::Ledger;
use crate::parent::registry::{Forward, Registry, RunRecord, Terminal};
use crate::protocol::child_api::InspectionReply;
use crate::protocol::tail::{ChunkKind, RunOutcome, TailLine};
use crate::protocol::{EventFrame, InterruptedReason};
use crate::store::Sql;
use crate::types::{AgentToolOptions, OnMilestones, ProgressSnapshot, RunStatus, DEFAULT_NOTIFY_SOURCE};

impl ParentEngine {
    pub(super) fn on_start_replied(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        gen: u64,
        result: Result<(), StartError>,
        now: i64,
    ) -> Vec<ParentAction> {
        if self.current(run_id, gen).is_none() {
            return Vec::new();
        }
        let registry = Registry::new(sql);
        let Ok(Some(record)) = registry.get(run_id) else { return self.forget(sql, run_id) };
        match result {
            Ok(()) => {}
            Err(StartError::Refused(message)) => return self.conclude(sql, &record, Terminal::Error { message }, now),
            Err(StartError::Unreachable(message)) => {
                let terminal = Terminal::Interrupted {
                    error: format!("the child could not be reached to start the run ({message}); dispatch it again"),
                    reason: Some(InterruptedReason::InspectFailed),
                    child_still_running: Some(false),
                };
                return self.conclude(sql, &record, terminal, now);
            }
        }
        if record.status.is_hard_terminal() {
            // A cancel landed while the child was being started: make sure the child stops.
            let mut actions = vec![ParentAction::CancelChild {
                run_id: run_id.to_owned(),
                to: self.address(sql, &record),
                reason: record.error_message.clone(),
            }];
            actions.push(ParentAction::Resolve { run_id: run_id.to_owned(), result: record.result() });
            self.drivers.remove(run_id);
            return actions;
        }
        // `starting` becomes `running`; an `interrupted` run dispatched again is live again.
        // Neither changes where the tail starts.
        let marked = match record.status {
            RunStatus::Starting => registry.mark_running(run_id).map(drop),
            RunStatus::Interrupted => registry.reattach(run_id).map(drop),
            _ => Ok(()),
        };
        if marked.is_err() {
            return self.forget(sql, run_id);
        }
        self.open_tail_at(sql, &record, now)
    }

    pub(super) fn open_tail(&mut self, sql: &(impl Sql + ?Sized), run_id: &str, now: i64) -> Vec<ParentAction> {
        let Ok(Some(record)) = Registry::new(sql).get(run_id) else { return self.forget(sql, run_id) };
        self.open_tail_at(sql, &record, now)
    }

    /// Opens the run's tail after its child cursor (`record` is its row as it is now).
    pub(super) fn open_tail_at(
        &mut self,
        sql: &(impl Sql + ?Sized),
        record: &RunRecord,
        now: i64,
    ) -> Vec<ParentAction> {
        let run_id = record.run_id.as_str();
        let gen = self.gen();
        let no_progress = self.options.reattach_no_progress_timeout_ms as i64;
        let to = self.address(sql, record);
        let Some(driver) = self.drivers.get_mut(run_id) else { return Vec::new() };
        driver.gen = gen;
        driver.phase = Phase::Tailing;
        let mut actions =
            vec![ParentAction::OpenTail { run_id: run_id.to_owned(), gen, to, after: record.child_cursor }];
        if driver.reattaching && !driver.detached {
            let at = driver.last_progress.max(now - no_progress) + no_progress;
            actions.push(ParentAction::SetTimer { run_id: run_id.to_owned(), gen, timer: Timer::Silence, at });
            if let Some(end) = driver.window_end {
                actions.push(ParentAction::SetTimer { run_id: run_id.to_owned(), gen, timer: Timer::Window, at: end });
            }
        }
        actions
    }

    pub(super) fn on_tail_batch(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        gen: u64,
        lines: Vec<TailLine>,
        now: i64,
    ) -> Vec<ParentAction> {
        let no_progress = self.options.reattach_no_progress_timeout_ms as i64;
        let Some(driver) = self.current(run_id, gen) else { return Vec::new() };
        driver.last_progress = now;
        driver.failed_tails = 0;
        let rearm = driver.reattaching && !driver.detached;
        let frames = driver.frames.clone();
        let mut actions = Vec::new();
        let mut forwards: Vec<(ChunkKind, String, Option<String>)> = Vec::new();
        let mut cursor = None;
        let mut end = None;
        for line in lines {
            match line {
                TailLine::Chunk { i, k, b, r } => {
                    cursor = i.or(cursor);
                    // A re-run's marker is lifecycle: it goes out (and is counted) either way.
                    if !(frames.terminal_only && k == ChunkKind::Stored) {
                        forwards.push((k, b, r));
                    }
                }
                TailLine::End { outcome } => end = Some(outcome),
            }
        }
        if !forwards.is_empty() || cursor.is_some() {
            let batch: Vec<Forward<'_>> = forwards
                .iter()
                .map(|(kind, body, kept)| Forward { kind: *kind, body, replay: kept.as_deref() })
                .collect();
            // The append checks the run is still live here (it updates only a live row).
            match Registry::new(sql).append(run_id, &batch, cursor, now) {
                Ok(Some(seqs)) => {
                    for (seq, (_, body, _)) in seqs.into_iter().zip(&forwards) {
                        let frame = EventFrame::chunk(frames.parent_tool_call_id.clone(), seq, run_id, body.clone());
                        actions.push(ParentAction::Broadcast(frame.to_json()));
                    }
                    let signalled =
                        forwards.iter().any(|(k, _, _)| matches!(k, ChunkKind::Progress | ChunkKind::Milestone));
                    if signalled {
                        if let Ok(Some(record)) = Registry::new(sql).get(run_id) {
                            actions.extend(self.signals(sql, &record, &forwards, now));
                        }
                    }
                }
                // The run is no longer live (concluded elsewhere, or cleared): its row has the
                // result.
                Ok(None) => {
                    actions.push(ParentAction::CloseTail { run_id: run_id.to_owned() });
                    actions.extend(self.forget(sql, run_id));
                    return actions;
                }
                Err(e) => actions.extend(store_err(e)),
            }
        }
        if let Some(outcome) = end {
            actions.push(ParentAction::CloseTail { run_id: run_id.to_owned() });
            // The finish writes only a live row; a gone one is forgotten.
            actions.extend(self.conclude_run(sql, run_id, &frames.agent_type, terminal_from(outcome), now));
        } else if rearm {
            actions.push(ParentAction::SetTimer {
                run_id: run_id.to_owned(),
                gen,
                timer: Timer::Silence,
                at: now + no_progress,
            });
        }
        actions
    }

    /// Progress and milestones of a forwarded batch: `on_progress`, and a detached run's
    /// milestone notices.
    pub(super) fn signals(
        &mut self,
        sql: &(impl Sql + ?Sized),
        record: &RunRecord,
        forwards: &[(ChunkKind, String, Option<String>)],
        now: i64,
    ) -> Vec<ParentAction> {
        let mut actions = Vec::new();
        let info = record.info();
        for (kind, body, _) in
            forwards.iter().filter(|(k, _, _)| matches!(k, ChunkKind::Progress | ChunkKind::Milestone))
        {
            let Ok(mut chunk) = serde_json::from_str::<Value>(body) else { continue };
            let mut data = chunk.get_mut("data").map_or(Value::Null, Value::take);
            if *kind == ChunkKind::Milestone {
                actions.extend(self.milestone_notice(sql, record, &data, now));
                if let Some(name) = data.get("name").cloned() {
                    data["milestone"] = name;
                }
            }
            if let Value::Object(o) = &mut data {
                o.entry("at").or_insert(Value::from(now));
            }
            if let Ok(snapshot) = serde_json::from_value::<ProgressSnapshot>(data) {
                actions.push(ParentAction::Hook(HookCall::Progress(info.clone(), snapshot)));
            }
        }
        actions
    }

    /// A milestone of a detached run that asked for it: one notice per `(run, name)`.
    pub(super) fn milestone_notice(
        &mut self,
        sql: &(impl Sql + ?Sized),
        record: &RunRecord,
        milestone: &Value,
        now: i64,
    ) -> Vec<ParentAction> {
        let Some(detached) = &record.detached else { return Vec::new() };
        let Some(name) = milestone.get("name").and_then(Value::as_str) else { return Vec::new() };
        let Some(wanted) = detached.on_milestones.clone().and_then(|w| serde_json::from_value::<OnMilestones>(w).ok())
        else {
            return Vec::new();
        };
        if !wanted.names.iter().any(|n| n == name)
            || !Ledger::new(sql).claim_milestone(&record.run_id, name, now).unwrap_or(false)
        {
            return Vec::new();
        }
        let source = detached.notify_source.clone().unwrap_or_else(|| DEFAULT_NOTIFY_SOURCE.into());
        vec![ParentAction::MilestoneNotice {
            run: record.info(),
            milestone: milestone.clone(),
            mode: wanted.mode,
            source,
        }]
    }

    /// The tail ended without an outcome: ask the child where the run stands (a run whose
    /// outcome was already known records it).
    pub(super) fn on_tail_ended(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        gen: u64,
        now: i64,
    ) -> Vec<ParentAction> {
        let max_window = self.options.reattach_max_window_ms;
        let next = self.gen();
        let Some(driver) = self.current(run_id, gen) else { return Vec::new() };
        if driver.draining.is_some() && driver.failed_tails < NOT_TAILABLE_AFTER {
            // The drain broke off: read again after a pause (a batch that brought chunks
            // resets the count, so a stream that keeps breaking but moves on is read to the end).
            driver.gen = next;
            driver.phase = Phase::Waiting;
            return vec![
                ParentAction::CloseTail { run_id: run_id.to_owned() },
                ParentAction::SetTimer {
                    run_id: run_id.to_owned(),
                    gen: next,
                    timer: Timer::Retail,
                    at: now + RETAIL_PAUSE_MS,
                },
            ];
        }
        if let Some(outcome) = driver.draining.take() {
            let Ok(Some(record)) = Registry::new(sql).get(run_id) else { return self.forget(sql, run_id) };
            let mut actions = vec![ParentAction::Observe(
                EventType::DrainIncomplete,
                json!({ "runId": run_id, "status": outcome.status.as_str() }),
            )];
            actions.extend(self.conclude(sql, &record, terminal_from(outcome), now));
            return actions;
        }
        if !driver.reattaching {
            driver.reattaching = true;
        }
        if driver.window_end.is_none() && !driver.detached {
            driver.window_end = max_window.map(|ms| now.saturating_add(ms as i64));
        }
        driver.gen = next;
        driver.phase = Phase::Inspecting;
        let Ok(Some(record)) = Registry::new(sql).get(run_id) else { return self.forget(sql, run_id) };
        let to = self.address(sql, &record);
        vec![
            ParentAction::CloseTail { run_id: run_id.to_owned() },
            ParentAction::InspectChild { run_id: run_id.to_owned(), gen: next, to },
        ]
    }

    pub(super) fn on_timer(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        gen: u64,
        timer: Timer,
        now: i64,
    ) -> Vec<ParentAction> {
        let no_progress = self.options.reattach_no_progress_timeout_ms as i64;
        let Some(driver) = self.current(run_id, gen) else { return Vec::new() };
        let draining = driver.draining.is_some();
        match (timer, driver.phase) {
            (Timer::Retail, Phase::Waiting) => self.open_tail(sql, run_id, now),
            // The child has finished: its stored chunks are being read, no budget applies.
            (Timer::Silence | Timer::Window, _) if draining => Vec::new(),
            // Silent past the budget, or past the window, while tailing: stop reading and ask
            // the child (the decision follows its answer).
            (Timer::Silence, Phase::Tailing) if now - driver.last_progress >= no_progress => {
                self.on_tail_ended(sql, run_id, gen, now)
            }
            (Timer::Window, Phase::Tailing) if driver.window_end.is_some_and(|end| now >= end) => {
                self.on_tail_ended(sql, run_id, gen, now)
            }
            _ => Vec::new(),
        }
    }

    pub(super) fn on_inspected(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        gen: u64,
        result: Result<Option<InspectionReply>, InterruptedReason>,
        now: i64,
    ) -> Vec<ParentAction> {
        if let Some((watch_gen, watch)) = self.watching.get(run_id).copied() {
            if watch_gen == gen {
                self.watching.remove(run_id);
                return self.on_watch_inspected(sql, run_id, watch, result, now);
            }
        }
        if self.current(run_id, gen).is_none() {
            // The row the recovery pass waits on was concluded meanwhile (a cancel): move on.
            let waited_on =
                self.pass.as_ref().and_then(|p| p.current.as_ref()).is_some_and(|(id, g)| id == run_id && *g == gen);
            if waited_on {
                if let Some(pass) = self.pass.as_mut() {
                    pass.current = None;
                }
                return self.next_recovery_row(sql, now);
            }
            return Vec::new();
        }
        let driver = self.drivers.get_mut(run_id).expect("checked above");
        let recovering = driver.recovering;
        driver.recovering = false;
        let mut actions = Vec::new();
        if recovering {
            actions.extend(self.recovery_row_inspected(run_id, &result));
        }
        let record = match Registry::new(sql).get(run_id) {
            Ok(Some(record)) if record.status.is_live() || record.status == RunStatus::Interrupted => record,
            // Concluded meanwhile (a cancel) or cleared: nothing to decide.
            _ => {
                actions.extend(self.forget(sql, run_id));
                if recovering {
                    actions.extend(self.next_recovery_row(sql, now));
                }
                return actions;
            }
        };
        let driver = self.drivers.get_mut(run_id).expect("checked above");
        let decision = match result {
            Err(reason) => Decide::Conclude(Terminal::inspect_failed(reason)),
            Ok(Some(inspection)) => match inspection.outcome() {
                // The run ended: read the chunks stored after the cursor first, then record it.
                Some(outcome) => Decide::Drain(outcome),
                None => driver.keep_waiting(&self.options, now),
            },
            // The child does not know the run: its start was lost. Send it again.
            Ok(None) => match record.input.clone() {
                Some(input) => Decide::Restart(input),
                None => Decide::Conclude(Terminal::Error {
                    message: "the child never accepted the run and its input was not kept; dispatch it again".into(),
                }),
            },
        };
        actions.extend(self.decide(sql, &record, decision, now));
        if recovering {
            actions.extend(self.next_recovery_row(sql, now));
        }
        actions
    }

    pub(super) fn decide(
        &mut self,
        sql: &(impl Sql + ?Sized),
        record: &RunRecord,
        decision: Decide,
        now: i64,
    ) -> Vec<ParentAction> {
        let run_id = &record.run_id;
        match decision {
            Decide::Conclude(terminal) => self.conclude(sql, record, terminal, now),
            Decide::TearDown(terminal) => {
                let mut actions = vec![ParentAction::CancelChild {
                    run_id: run_id.clone(),
                    to: self.address(sql, record),
                    reason: Some("window-exceeded".into()),
                }];
                actions.extend(self.conclude(sql, record, terminal, now));
                actions
            }
            Decide::Drain(outcome) => {
                if let Some(driver) = self.drivers.get_mut(run_id) {
                    driver.draining = Some(outcome);
                }
                self.open_tail(sql, run_id, now)
            }
            Decide::Restart(input) => {
                let gen = self.gen();
                if let Some(driver) = self.drivers.get_mut(run_id) {
                    driver.gen = gen;
                    driver.phase = Phase::Starting;
                }
                vec![self.start_action(sql, record, input, gen)]
            }
            Decide::Retail => {
                let gen = self.gen();
                let Some(driver) = self.drivers.get_mut(run_id) else { return Vec::new() };
                driver.gen = gen;
                driver.phase = Phase::Waiting;
                vec![ParentAction::SetTimer {
                    run_id: run_id.clone(),
                    gen,
                    timer: Timer::Retail,
                    at: now + RETAIL_PAUSE_MS,
                }]
            }
        }
    }
}

/// What to do after an inspection.
pub(super) enum Decide {
    Conclude(Terminal),
    TearDown(Terminal),
    Drain(RunOutcome),
    Restart(Value),
    Retail,
}

impl Driver {
    /// The child says the run is live: wait more, within the re-attach budgets (a detached run
    /// is bounded by its own budgets instead, on the backbone).
    pub(super) fn keep_waiting(&self, options: &AgentToolOptions, now: i64) -> Decide {
        if self.failed_tails >= NOT_TAILABLE_AFTER {
            return Decide::Conclude(Terminal::Interrupted {
                error: format!(
                    "the child's stream could not be tailed ({NOT_TAILABLE_AFTER} attempts); it may still be running"
                ),
                reason: Some(InterruptedReason::NotTailable),
                child_still_running: Some(true),
            });
        }
        if self.detached {
            return Decide::Retail;
        }
        if self.window_end.is_some_and(|end| now >= end) {
            return Decide::TearDown(Terminal::Interrupted {
                error: "the re-attach window ran out; the child was torn down".into(),
                reason: Some(InterruptedReason::WindowExceeded),
                child_still_running: Some(false),
            });
        }
        let no_progress = options.reattach_no_progress_timeout_ms as i64;
        if now - self.last_progress >= no_progress {
            return Decide::Conclude(Terminal::Interrupted {
                error: format!("the child made no progress for {no_progress} ms; it may still be running"),
                reason: Some(InterruptedReason::NoProgress),
                child_still_running: Some(true),
            });
        }
        Decide::Retail
    }
}
