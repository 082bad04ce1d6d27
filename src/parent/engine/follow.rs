//! Following a child: its start's answer, its tail's batches and end, the inspection that
//! decides what a broken tail means, and the re-attach budgets.

use serde_json::{json, Value};

use super::*;
use crate::parent::registry::Forward;
use crate::protocol::child_api::{InspectionReply, RunInput};
use crate::protocol::tail::{ChunkKind, TailLine};
use crate::protocol::{EventFrame, InterruptedReason, Outcome};
use crate::types::{ms, Milestone, OnMilestones, ProgressSnapshot, DEFAULT_NOTIFY_SOURCE};

/// A chunk of a tail batch to forward: its kind, its body, and what replay keeps instead.
type Forwarded = (ChunkKind, String, Option<String>);

/// What to do after an inspection.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Decide {
    /// Record this outcome.
    Conclude(Outcome),
    /// Stop the child, then record this outcome.
    TearDown(Outcome),
    /// The child ended: read what it stored after the cursor, then record this.
    Drain(Outcome),
    /// The child does not know the run: start it again with this input.
    Restart(RunInput),
    /// The child still runs: tail it again after a pause.
    Retail,
}

impl ParentEngine {
    pub(super) fn on_start_replied(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        gen: u64,
        result: Result<(), StartError>,
        now: i64,
    ) -> Result<Vec<ParentAction>, StoreError> {
        if self.current(run_id, gen).is_none() {
            return Ok(Vec::new());
        }
        let registry = Registry::new(sql);
        let Some(record) = registry.get(run_id)? else { return self.forget(sql, run_id) };
        match result {
            Ok(()) => {}
            Err(StartError::Refused(message)) => {
                return self.conclude(sql, &record, Outcome::Error { error: message }, now)
            }
            Err(StartError::Failed(message)) => {
                let gen = self.gen();
                let Some(driver) = self.drivers.get_mut(run_id) else { return Ok(Vec::new()) };
                driver.failed_starts += 1;
                if driver.failed_starts >= START_ATTEMPTS {
                    return self.conclude(sql, &record, Outcome::Error { error: message }, now);
                }
                // After the pause the start is sent again (it is idempotent by run id).
                let due = now + (START_RETRY_MS << (driver.failed_starts - 1));
                driver.gen = gen;
                driver.phase = Phase::Waiting;
                driver.start_again = true;
                driver.due = Some(due);
                self.wake_at(due);
                return Ok(Vec::new());
            }
            Err(StartError::Unreachable(message)) => {
                let terminal = Outcome::Interrupted {
                    error: format!("the child could not be reached to start the run ({message}); dispatch it again"),
                    reason: Some(InterruptedReason::InspectFailed),
                    child_still_running: Some(false),
                };
                return self.conclude(sql, &record, terminal, now);
            }
        }
        if record.status.is_hard_terminal() {
            // A cancel landed while the child was being started: make sure the child stops.
            let to = self.address(sql, &record)?;
            let reason = record.outcome.as_ref().and_then(Outcome::error).map(str::to_owned);
            self.stop_driving(run_id);
            let mut actions = vec![ParentAction::CancelChild { run_id: run_id.to_owned(), to, reason }];
            actions.extend(self.resolve(run_id, record.result()));
            return Ok(actions);
        }
        running(&registry, &record)?;
        self.open_tail_at(sql, &record)
    }

    /// The pause after a failed start ended: the start is sent again.
    pub(super) fn start_again(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        now: i64,
    ) -> Result<Vec<ParentAction>, StoreError> {
        let Some(record) = Registry::new(sql).get(run_id)? else { return self.forget(sql, run_id) };
        let Some(input) = record.input.clone() else {
            let message = "the child failed the start and the run's input was not kept; dispatch it again";
            return self.conclude(sql, &record, Outcome::Error { error: message.into() }, now);
        };
        self.send_start(sql, &record, input)
    }

    /// Sends the run's start (again): the driver waits for its answer.
    fn send_start(
        &mut self,
        sql: &(impl Sql + ?Sized),
        record: &RunRecord,
        input: RunInput,
    ) -> Result<Vec<ParentAction>, StoreError> {
        let gen = self.gen();
        let start = self.start_action(sql, record, input, gen)?;
        if let Some(driver) = self.drivers.get_mut(&record.run_id) {
            driver.gen = gen;
            driver.phase = Phase::Starting;
            driver.start_again = false;
            driver.due = None;
        }
        Ok(vec![start])
    }

    pub(super) fn open_tail(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        now: i64,
    ) -> Result<Vec<ParentAction>, StoreError> {
        let _ = now;
        let registry = Registry::new(sql);
        let Some(record) = registry.get(run_id)? else { return self.forget(sql, run_id) };
        if self.drivers.contains_key(run_id) {
            // Its start's answer may have met a storage failure, which rolled back the write
            // that made it `running`.
            running(&registry, &record)?;
        }
        self.open_tail_at(sql, &record)
    }

    /// Opens the run's tail after its child cursor (`record` is its row as it is now). A
    /// re-attached awaited run is watched for silence and for its window from now on (see
    /// [`Driver::deadline`]).
    fn open_tail_at(&mut self, sql: &(impl Sql + ?Sized), record: &RunRecord) -> Result<Vec<ParentAction>, StoreError> {
        let to = self.address(sql, record)?;
        let gen = self.gen();
        let run_id = record.run_id.as_str();
        let Some(driver) = self.drivers.get_mut(run_id) else { return Ok(Vec::new()) };
        driver.gen = gen;
        driver.phase = Phase::Tailing;
        driver.due = None;
        Ok(vec![ParentAction::OpenTail { run_id: run_id.to_owned(), gen, to, after: record.child_cursor }])
    }

    pub(super) fn on_tail_batch(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        gen: u64,
        lines: Vec<TailLine>,
        now: i64,
    ) -> Result<Vec<ParentAction>, StoreError> {
        // A batch of a tail this instance has moved past (closed, replaced, or an earlier
        // instance's) is dropped: its chunks come again, in order, from the tail that replaced it.
        let Some(driver) = self.current(run_id, gen) else { return Ok(Vec::new()) };
        let frames = driver.frames.clone();
        let mut actions = Vec::new();
        let mut forwards: Vec<Forwarded> = Vec::new();
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
            // The append writes only a live row: a run concluded meanwhile (a cancel) or cleared
            // gets nothing after its terminal frame.
            let Some(seqs) = Registry::new(sql).append(run_id, &batch, cursor, now)? else {
                actions.push(ParentAction::CloseTail { run_id: run_id.to_owned() });
                actions.extend(self.forget(sql, run_id)?);
                return Ok(actions);
            };
            for (seq, (_, body, _)) in seqs.into_iter().zip(&forwards) {
                let frame = EventFrame::chunk(frames.parent_tool_call_id.clone(), seq, run_id, body.clone());
                actions.push(ParentAction::Broadcast(frame.to_json()));
            }
            if forwards.iter().any(|(k, _, _)| matches!(k, ChunkKind::Progress | ChunkKind::Milestone)) {
                if let Some(record) = Registry::new(sql).get(run_id)? {
                    actions.extend(self.signals(&record, &forwards, now));
                }
            }
        }
        if let Some(driver) = self.drivers.get_mut(run_id) {
            driver.last_progress = now;
            driver.failed_tails = 0;
        }
        if let Some(outcome) = end {
            // The finish writes only a live row; a gone one is forgotten.
            actions.extend(self.conclude_run(sql, run_id, outcome, now)?);
        }
        Ok(actions)
    }

    /// The child's latest progress, from its inspection, when it is newer than what this parent
    /// forwarded (reported while the parent was away: progress is live-only, so a re-tail does
    /// not bring it back): kept as the run's snapshot and sent to clients like a forwarded
    /// report, without calling `on_progress` again.
    fn adopt_progress(
        &self,
        sql: &(impl Sql + ?Sized),
        record: &RunRecord,
        reply: &InspectionReply,
        now: i64,
    ) -> Result<Vec<ParentAction>, StoreError> {
        let Some(snapshot) = reply.progress.as_ref().filter(|p| p.is_object()) else { return Ok(Vec::new()) };
        let at = snapshot.get("at").and_then(Value::as_i64);
        let known = record.last_signal_at.unwrap_or(i64::MIN);
        if !record.status.is_live() || at.is_none_or(|at| at <= known) {
            return Ok(Vec::new());
        }
        let body = json!({ "type": crate::protocol::chunk::PROGRESS_PART, "id": format!("adopted:{}", at.unwrap_or(0)),
                           "transient": true, "data": snapshot })
        .to_string();
        let forward = Forward { kind: ChunkKind::Progress, body: &body, replay: None };
        let Some(seqs) = Registry::new(sql).append(&record.run_id, &[forward], None, now)? else {
            return Ok(Vec::new());
        };
        let frames = self.drivers.get(&record.run_id).map(|d| d.frames.parent_tool_call_id.clone()).unwrap_or_default();
        Ok(seqs
            .into_iter()
            .map(|seq| {
                ParentAction::Broadcast(EventFrame::chunk(frames.clone(), seq, &record.run_id, body.clone()).to_json())
            })
            .collect())
    }

    /// Progress and milestones of a forwarded batch: `on_progress`, and a detached run's
    /// milestone notices (posted once per `(run, name)`, see [`ParentEngine::post_notice`]).
    fn signals(&self, record: &RunRecord, forwards: &[Forwarded], now: i64) -> Vec<ParentAction> {
        let mut actions = Vec::new();
        let info = record.info();
        for (kind, body, _) in
            forwards.iter().filter(|(k, _, _)| matches!(k, ChunkKind::Progress | ChunkKind::Milestone))
        {
            let Ok(mut chunk) = serde_json::from_str::<Value>(body) else { continue };
            let mut data = chunk.get_mut("data").map_or(Value::Null, Value::take);
            if *kind == ChunkKind::Milestone {
                actions.extend(self.milestone_notice(record, &data));
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

    /// A notice for a milestone of a detached run that asked for it by name (posted once).
    pub(super) fn milestone_notice(&self, record: &RunRecord, milestone: &Value) -> Option<ParentAction> {
        let detached = record.detached.as_ref()?;
        let wanted = serde_json::from_value::<OnMilestones>(detached.on_milestones.clone()?).ok()?;
        let milestone = serde_json::from_value::<Milestone>(milestone.clone()).ok()?;
        if !wanted.names.contains(&milestone.name) {
            return None;
        }
        let source = detached.notify_source.clone().unwrap_or_else(|| DEFAULT_NOTIFY_SOURCE.into());
        let key = super::io::notice_key(record);
        Some(ParentAction::Notice(Notice::milestone(record.info(), &key, milestone, wanted.mode, source)))
    }

    pub(super) fn on_tail_refused(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        gen: u64,
        error: String,
        now: i64,
    ) -> Result<Vec<ParentAction>, StoreError> {
        if self.current(run_id, gen).is_none() {
            return Ok(Vec::new());
        }
        let Some(record) = Registry::new(sql).get(run_id)? else { return self.forget(sql, run_id) };
        let to = self.address(sql, &record)?;
        let mut actions =
            vec![ParentAction::CancelChild { run_id: run_id.to_owned(), to, reason: Some(error.clone()) }];
        actions.extend(self.conclude(sql, &record, Outcome::Error { error }, now)?);
        Ok(actions)
    }

    /// The run's tail ended without an outcome, or its re-attach budgets ran out: ask the child
    /// where the run stands (a run whose outcome was already known records it). The caller has
    /// checked the exchange is current.
    pub(super) fn on_tail_ended(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        now: i64,
    ) -> Result<Vec<ParentAction>, StoreError> {
        let Some(record) = Registry::new(sql).get(run_id)? else { return self.forget(sql, run_id) };
        let to = self.address(sql, &record)?;
        let max_window = self.options.reattach_max_window.map(ms);
        let next = self.gen();
        let Some(driver) = self.drivers.get_mut(run_id) else { return Ok(Vec::new()) };
        let close = ParentAction::CloseTail { run_id: run_id.to_owned() };
        if driver.draining.is_some() && driver.failed_tails < NOT_TAILABLE_AFTER {
            // The drain broke off: read again after a pause (a batch that brought chunks
            // resets the count, so a stream that keeps breaking but moves on is read to the end).
            driver.gen = next;
            driver.phase = Phase::Waiting;
            driver.due = Some(now + RETAIL_PAUSE_MS);
            return Ok(vec![close]);
        }
        if let Some(outcome) = driver.draining.take() {
            let payload = json!({ "runId": run_id, "status": outcome.status().as_str() });
            let mut actions = vec![close, ParentAction::Observe(EventType::DrainIncomplete, payload)];
            actions.extend(self.conclude(sql, &record, outcome, now)?);
            return Ok(actions);
        }
        driver.reattaching = true;
        if driver.window_end.is_none() && !driver.detached {
            driver.window_end = max_window.map(|ms| now.saturating_add(ms));
        }
        driver.gen = next;
        driver.phase = Phase::Inspecting;
        driver.due = Some(now + INSPECT_TIMEOUT_MS);
        Ok(vec![close, ParentAction::InspectChild { run_id: run_id.to_owned(), gen: next, to }])
    }

    pub(super) fn on_inspected(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        gen: u64,
        result: Result<Option<InspectionReply>, InterruptedReason>,
        now: i64,
    ) -> Result<Vec<ParentAction>, StoreError> {
        if self.watching.get(run_id).is_some_and(|w| w.gen == gen) {
            let watch = self.watching.remove(run_id).map(|w| w.watch);
            return match watch {
                Some(watch) => self.on_watch_inspected(sql, run_id, watch, result, now),
                None => Ok(Vec::new()),
            };
        }
        // An exchange the engine moved past. (A run the recovery pass waits on that was
        // concluded meanwhile has already released the pass: `stop_driving`.)
        let Some(driver) = self.current(run_id, gen) else { return Ok(Vec::new()) };
        let recovering = std::mem::take(&mut driver.recovering);
        let mut actions = Vec::new();
        if recovering {
            actions.extend(self.recovery_row_inspected(run_id, &result));
        }
        let record = match Registry::new(sql).get(run_id)? {
            Some(record) if record.status.is_live() => record,
            // Concluded meanwhile (a cancel) or cleared: nothing to decide.
            _ => {
                actions.extend(self.forget(sql, run_id)?);
                return Ok(actions);
            }
        };
        if let Ok(Some(reply)) = &result {
            actions.extend(self.adopt_progress(sql, &record, reply, now)?);
        }
        let Some(driver) = self.drivers.get(run_id) else { return Ok(actions) };
        let decision = decide(driver, &record, result, &self.options, now);
        actions.extend(self.carry_decision(sql, &record, decision, now)?);
        if recovering {
            let draining = self.drivers.get(run_id).and_then(|d| d.draining.as_ref()).map(|o| o.status());
            actions.push(self.row_recovered(sql, run_id, draining, now)?);
        }
        Ok(actions)
    }

    fn carry_decision(
        &mut self,
        sql: &(impl Sql + ?Sized),
        record: &RunRecord,
        decision: Decide,
        now: i64,
    ) -> Result<Vec<ParentAction>, StoreError> {
        let run_id = &record.run_id;
        match decision {
            Decide::Conclude(terminal) => self.conclude(sql, record, terminal, now),
            Decide::TearDown(terminal) => {
                let to = self.address(sql, record)?;
                let reason = Some("window-exceeded".to_owned());
                let mut actions = vec![ParentAction::CancelChild { run_id: run_id.clone(), to, reason }];
                actions.extend(self.conclude(sql, record, terminal, now)?);
                Ok(actions)
            }
            Decide::Drain(outcome) => {
                if let Some(driver) = self.drivers.get_mut(run_id) {
                    driver.draining = Some(outcome);
                }
                self.open_tail_at(sql, record)
            }
            Decide::Restart(input) => self.send_start(sql, record, input),
            Decide::Retail => {
                let gen = self.gen();
                if let Some(driver) = self.drivers.get_mut(run_id) {
                    driver.gen = gen;
                    driver.phase = Phase::Waiting;
                    driver.due = Some(now + RETAIL_PAUSE_MS);
                }
                Ok(Vec::new())
            }
        }
    }
}

/// What an inspection's answer means for a driven run (the inspect contract): a failed or
/// timed-out inspection is an interruption, retryable; `None` means the child never got the
/// start (it is sent again), never a failure; an ended run is drained, then recorded; a live
/// one is waited on within the re-attach budgets.
pub(super) fn decide(
    driver: &Driver,
    record: &RunRecord,
    result: Result<Option<InspectionReply>, InterruptedReason>,
    options: &AgentToolOptions,
    now: i64,
) -> Decide {
    match result {
        Err(reason) => Decide::Conclude(Outcome::inspect_failed(reason)),
        Ok(Some(inspection)) => match inspection.outcome {
            // The run ended: read the chunks stored after the cursor first, then record it.
            Some(outcome) => Decide::Drain(outcome),
            None => keep_waiting(driver, options, now),
        },
        // The child does not know the run: its start was lost. Send it again.
        Ok(None) => match record.input.clone() {
            Some(input) => Decide::Restart(input),
            None => Decide::Conclude(Outcome::Error {
                error: "the child never accepted the run and its input was not kept; dispatch it again".into(),
            }),
        },
    }
}

/// The child says the run is live: wait more, within the re-attach budgets (a detached run is
/// bounded by its own budgets instead, on the backbone).
fn keep_waiting(driver: &Driver, options: &AgentToolOptions, now: i64) -> Decide {
    if driver.failed_tails >= NOT_TAILABLE_AFTER {
        return Decide::Conclude(Outcome::Interrupted {
            error: format!(
                "the child's stream could not be tailed ({NOT_TAILABLE_AFTER} attempts); it may still be running"
            ),
            reason: Some(InterruptedReason::NotTailable),
            child_still_running: Some(true),
        });
    }
    if driver.detached {
        return Decide::Retail;
    }
    if driver.window_end.is_some_and(|end| now >= end) {
        return Decide::TearDown(Outcome::Interrupted {
            error: "the re-attach window ran out; the child was torn down".into(),
            reason: Some(InterruptedReason::WindowExceeded),
            child_still_running: Some(false),
        });
    }
    let no_progress = ms(options.reattach_no_progress_timeout);
    if now - driver.last_progress >= no_progress {
        return Decide::Conclude(Outcome::Interrupted {
            error: format!("the child made no progress for {no_progress} ms; it may still be running"),
            reason: Some(InterruptedReason::NoProgress),
            child_still_running: Some(true),
        });
    }
    Decide::Retail
}

/// A run whose child accepted its start is `running`: `starting` becomes `running`, and an
/// `interrupted` run dispatched again is live again. Neither changes where the tail starts.
fn running(registry: &Registry<'_, impl Sql + ?Sized>, record: &RunRecord) -> Result<(), StoreError> {
    match record.status {
        RunStatus::Starting => drop(registry.mark_running(&record.run_id)?),
        RunStatus::Interrupted => drop(registry.reattach(&record.run_id)?),
        _ => {}
    }
    Ok(())
}
#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests;
