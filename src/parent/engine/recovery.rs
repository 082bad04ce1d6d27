//! Restart recovery, the alarm, the detached backbone (budgets, give-ups, deliveries, milestone
//! notices) and watching a given-up child for a late result.

use serde_json::json;

use super::conclude::milestone_data;
use super::*;
use crate::parent::detached::{budget_exceeded, cadence_ms};
use crate::protocol::child_api::InspectionReply;
use crate::protocol::{InterruptedReason, Outcome};
use crate::types::ms;

impl ParentEngine {
    /// The first event of a fresh instance: starts recovery once, without holding it up.
    pub fn wake(&mut self, sql: &(impl Sql + ?Sized), now: i64) -> Vec<ParentAction> {
        if self.recovery_started {
            return Vec::new();
        }
        self.recovery_started = true;
        let mut actions = self.unit(sql, None, "recovery", now, |engine| engine.begin_recovery(sql, now));
        actions.extend(self.sweep_owed_finish_hooks(sql, now));
        actions.extend(self.settle(sql, now));
        self.account(actions)
    }

    /// Once per instance, until it succeeds (a failed read is retried at the next alarm): the
    /// finish hooks an earlier instance claimed and never saw return.
    fn sweep_owed_finish_hooks(&mut self, sql: &(impl Sql + ?Sized), now: i64) -> Vec<ParentAction> {
        if self.owed_hooks_swept {
            return Vec::new();
        }
        match atomic(sql, || self.owed_finish_hooks(sql)) {
            Ok(actions) => {
                self.owed_hooks_swept = true;
                actions
            }
            Err(error) => self.trouble(None, "finish hooks", &error, now),
        }
    }

    /// The finish hooks an earlier instance claimed and never saw return: called again (the
    /// hook is at least once; exactly once unless the object dies while it runs).
    fn owed_finish_hooks(&mut self, sql: &(impl Sql + ?Sized)) -> Result<Vec<ParentAction>, StoreError> {
        let owed = Registry::new(sql).finish_hooks_owed()?;
        let owed: Vec<RunRecord> = owed.into_iter().filter(|run| !self.finishing.contains_key(&run.run_id)).collect();
        Ok(owed
            .into_iter()
            .map(|run| ParentAction::Hook(HookCall::Finish(run.info(), run.result(), self.gen())))
            .collect())
    }

    /// The alarm: recovery (if it never ran here), the backbone's tick, watching given-up
    /// children, retention, owed child clears, and the next alarm. Each run's step is its own
    /// unit: one that fails is reported and retried at the next alarm, the others go on.
    pub fn alarm(&mut self, sql: &(impl Sql + ?Sized), now: i64) -> Vec<ParentAction> {
        // The alarm fired: what it was armed for is taken up now (a later time asked for stays).
        self.alarm = self.alarm.filter(|at| *at > now);
        self.recovery_started = true;
        let mut actions = self.unit(sql, None, "recovery", now, |engine| engine.begin_recovery(sql, now));
        actions.extend(self.sweep_owed_finish_hooks(sql, now));
        actions.extend(self.settle(sql, now));
        let outstanding = match Ledger::new(sql).outstanding() {
            Ok(outstanding) => outstanding,
            Err(error) => {
                actions.extend(self.trouble(None, "backbone", &error, now));
                Vec::new()
            }
        };
        let mut changed = false;
        for run_id in &outstanding {
            let step = self.unit(sql, Some(run_id), "backbone", now, |engine| engine.backbone_run(sql, run_id, now));
            changed |= !step.is_empty();
            actions.extend(step);
        }
        self.quiet_ticks = if changed { 0 } else { self.quiet_ticks + 1 };
        actions.extend(self.unit(sql, None, "watch", now, |engine| engine.watch_tick(sql, now)));
        actions.extend(self.unit(sql, None, "retention", now, |engine| engine.retain(sql, now)));
        actions.extend(self.unit(sql, None, "child clears", now, |engine| engine.retry_child_clears(sql, now)));
        actions.extend(self.unit(sql, None, "alarm", now, |engine| engine.next_alarm(sql, now)));
        actions.extend(self.settle(sql, now));
        self.account(actions)
    }

    /// When the alarm must fire next: soon while runs are live (recovery after a restart), on
    /// the cadence while detached runs or watched children are outstanding, when the oldest
    /// finished run comes of age, and while a child owes a clear.
    fn next_alarm(&mut self, sql: &(impl Sql + ?Sized), now: i64) -> Result<Vec<ParentAction>, StoreError> {
        let registry = Registry::new(sql);
        let mut next: Option<i64> = None;
        let mut sooner = |at: i64| next = Some(next.map_or(at, |n: i64| n.min(at)));
        let live = registry.live_count()?;
        if live > 0 {
            sooner(now + ms(self.options.recovery_alarm));
        }
        if let (Some(max_age), Some(oldest)) = (self.options.retention.max_age.map(ms), registry.oldest_finished_at()?)
        {
            // The oldest finished run comes of age then (never sooner than a second from now).
            sooner(oldest.saturating_add(max_age).max(now + 1000));
        }
        if registry.child_clears_pending()? > 0 {
            sooner(now + CHILD_CLEAR_RETRY_MS);
        }
        let watched = registry.watched(now, WATCH_MS)?.len();
        let outstanding = Ledger::new(sql).outstanding()?.len();
        if watched > 0 || outstanding > 0 {
            sooner(now + self.cadence() as i64);
        }
        if let Some(at) = next {
            self.wake_at(at);
        }
        let mut actions = Vec::new();
        actions.push(ParentAction::Observe(
            EventType::Alarm,
            json!({ "live": live, "outstanding": outstanding, "watched": watched, "nextInMs": next.map(|at| at - now) }),
        ));
        Ok(actions)
    }

    pub(super) fn cadence(&self) -> u64 {
        cadence_ms(self.quiet_ticks, &self.options.backbone_cadence)
    }

    /// Finds the live runs nobody drives (a restart left them) and lines them up for
    /// inspection, one by one, within [`RECOVERY_DEADLINE_MS`] for the whole pass (see
    /// [`Self::next_recovery_row`]).
    fn begin_recovery(&mut self, sql: &(impl Sql + ?Sized), now: i64) -> Result<Vec<ParentAction>, StoreError> {
        if self.pass.is_some() {
            return Ok(Vec::new());
        }
        let all = Registry::new(sql).all()?;
        let undriven: Vec<RunRecord> =
            all.into_iter().filter(|r| r.status.is_live() && !self.drivers.contains_key(&r.run_id)).collect();
        if undriven.is_empty() {
            return Ok(Vec::new());
        }
        let window = self.options.reattach_max_window.map(ms);
        for record in &undriven {
            self.watching.remove(&record.run_id);
            let mut driver = Driver::new(record, Phase::Inspecting, true, now);
            driver.window_end = window.filter(|_| !driver.detached).map(|ms| now.saturating_add(ms));
            driver.recovering = true;
            self.drivers.insert(record.run_id.clone(), driver);
        }
        self.pass = Some(Pass {
            queue: undriven.iter().rev().map(|r| r.run_id.clone()).collect(),
            deadline: now + RECOVERY_DEADLINE_MS,
            current: None,
            runs: undriven.len(),
            finalized: 0,
            reattached: 0,
        });
        Ok(vec![ParentAction::Observe(EventType::RecoveryBegin, json!({ "runs": undriven.len() }))])
    }

    /// Moves a recovery pass on: the next row of its queue is inspected (or, past the pass's
    /// deadline, recorded `interrupted`), each as its own unit; the pass ends with its queue.
    pub(super) fn advance_recovery(&mut self, sql: &(impl Sql + ?Sized), now: i64) -> Vec<ParentAction> {
        let mut actions = Vec::new();
        while let Some(pass) = self.pass.as_mut().filter(|p| p.current.is_none()) {
            let Some(run_id) = pass.queue.pop() else {
                let pass = self.pass.take().expect("checked above");
                actions.push(ParentAction::Observe(
                    EventType::RecoveryComplete,
                    json!({ "runs": pass.runs, "finalized": pass.finalized, "reattached": pass.reattached }),
                ));
                break;
            };
            actions.extend(
                self.unit(sql, Some(&run_id), "recovery", now, |engine| engine.recovery_row(sql, &run_id, now)),
            );
        }
        actions
    }

    /// One row of a recovery pass: inspected, or, past the pass's deadline, recorded
    /// `interrupted` (`recovery-deadline`).
    fn recovery_row(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        now: i64,
    ) -> Result<Vec<ParentAction>, StoreError> {
        let record = match Registry::new(sql).get(run_id)? {
            Some(record) if record.status.is_live() => record,
            // Concluded (a cancel) or cleared before its turn: nothing to recover.
            _ => {
                if self.drivers.get(run_id).is_none_or(|d| d.recovering) {
                    self.stop_driving(run_id);
                }
                return Ok(Vec::new());
            }
        };
        let deadline = self.pass.as_ref().map_or(now, |p| p.deadline);
        let mut actions = Vec::new();
        if now >= deadline {
            actions.push(ParentAction::Observe(EventType::RecoveryDeadline, json!({ "runId": run_id })));
            // The child was never asked: it is left running, and watched for a late result.
            let terminal = Outcome::Interrupted {
                error: "recovery ran out of time before this run could be inspected".into(),
                reason: Some(InterruptedReason::RecoveryDeadline),
                child_still_running: Some(true),
            };
            actions.extend(self.conclude(sql, &record, terminal, now)?);
            if let Some(pass) = self.pass.as_mut() {
                pass.finalized += 1;
            }
            actions.push(self.row_recovered(sql, run_id, None, now)?);
            return Ok(actions);
        }
        let to = self.address(sql, &record)?;
        let gen = self.gen();
        let Some(driver) = self.drivers.get_mut(run_id) else { return Ok(actions) };
        driver.gen = gen;
        driver.recovering = true;
        driver.phase = Phase::Inspecting;
        driver.due = Some(now + INSPECT_TIMEOUT_MS);
        if let Some(pass) = self.pass.as_mut() {
            pass.current = Some((run_id.to_owned(), gen));
        }
        actions.push(ParentAction::InspectChild { run_id: run_id.to_owned(), gen, to });
        Ok(actions)
    }

    /// `agent_tool:recovery:row` for a row the pass is done with: the status it ends the pass
    /// in (a run being drained, the outcome it is being recorded with), its interruption's
    /// reason, and the time since the pass began.
    pub(super) fn row_recovered(
        &self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        draining: Option<RunStatus>,
        now: i64,
    ) -> Result<ParentAction, StoreError> {
        let record = Registry::new(sql).get(run_id)?;
        let began = self.pass.as_ref().map_or(now, |p| p.deadline - RECOVERY_DEADLINE_MS);
        let status = match (&record, draining) {
            (_, Some(outcome)) => outcome.as_str().to_owned(),
            (Some(record), None) => record.status.as_str().to_owned(),
            (None, None) => "cleared".to_owned(),
        };
        let reason = record.as_ref().and_then(|r| r.outcome.as_ref()?.interrupted_reason()).map(|r| r.as_str());
        let agent_type = record.as_ref().map(|r| r.agent_type.clone());
        Ok(ParentAction::Observe(
            EventType::RecoveryRow,
            json!({ "runId": run_id, "agentType": agent_type, "status": status, "reason": reason,
                    "elapsedMs": now - began }),
        ))
    }

    /// Counts and reports one inspected run of a recovery pass, then lets the pass move on.
    pub(super) fn recovery_row_inspected(
        &mut self,
        run_id: &str,
        result: &Result<Option<InspectionReply>, InterruptedReason>,
    ) -> Vec<ParentAction> {
        let mut actions = Vec::new();
        let Some(pass) = self.pass.as_mut() else { return actions };
        if pass.current.as_ref().is_none_or(|(id, _)| id != run_id) {
            return actions;
        }
        pass.current = None;
        match result {
            Err(reason) => {
                pass.finalized += 1;
                actions.push(ParentAction::Observe(
                    EventType::RecoveryFailed,
                    json!({ "runId": run_id, "error": reason.as_str() }),
                ));
            }
            Ok(Some(inspection)) if inspection.outcome.is_some() => pass.finalized += 1,
            Ok(_) => {
                pass.reattached += 1;
                actions.push(ParentAction::Observe(EventType::RecoveryReattach, json!({ "runId": run_id })));
            }
        }
        actions
    }

    /// The detached backbone for one outstanding run: give up on an exhausted budget, deliver
    /// what is due, and offer the milestone notices not yet posted (a milestone forwarded while
    /// this instance was down, or whose notice a crash cut short).
    fn backbone_run(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        now: i64,
    ) -> Result<Vec<ParentAction>, StoreError> {
        let Some(run) = Registry::new(sql).get(run_id)? else { return Ok(Vec::new()) };
        if let Some(reason) = budget_exceeded(&run, now) {
            return self.give_up(sql, &run, reason, now);
        }
        let mut actions = self.deliveries(sql, &run, now)?;
        if run.detached.as_ref().is_some_and(|d| d.on_milestones.is_some()) {
            let ledger = Ledger::new(sql);
            for (_, body) in Registry::new(sql).milestones(run_id)? {
                let Some(data) = milestone_data(&body) else { continue };
                let name = data.get("name").and_then(serde_json::Value::as_str).unwrap_or_default();
                if !ledger.milestone_claimed(run_id, name)? {
                    actions.extend(self.milestone_notice(&run, &data));
                }
            }
        }
        Ok(actions)
    }

    /// Gives up on a detached run: `interrupted` first (delivered through the `give_up` slot,
    /// and handed to any caller joined to it), then the child is inspected: one that had
    /// completed anyway gets its real result recorded. Past its absolute budget the child is
    /// torn down (`childStillRunning: false`); a silent one (`no-progress`) is a soft give-up,
    /// as the seed has it: the child is left running and watched, and a late result is recorded
    /// and delivered once.
    fn give_up(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run: &RunRecord,
        reason: InterruptedReason,
        now: i64,
    ) -> Result<Vec<ParentAction>, StoreError> {
        let tear_down = reason == InterruptedReason::BudgetExceeded;
        let error = match reason {
            InterruptedReason::BudgetExceeded => "the detached run used up its budget",
            _ => "the detached run made no progress within its budget",
        };
        let terminal =
            Outcome::Interrupted { error: error.into(), reason: Some(reason), child_still_running: Some(!tear_down) };
        let to = self.address(sql, run)?;
        let mut actions = self.conclude(sql, run, terminal, now)?;
        if tear_down {
            actions.push(ParentAction::CancelChild {
                run_id: run.run_id.clone(),
                to: to.clone(),
                reason: Some(format!("given up: {}", reason.as_str())),
            });
        }
        let gen = self.gen();
        let watch = if tear_down { Watch::GaveUp } else { Watch::LateResult };
        self.watching.insert(run.run_id.clone(), Watching { gen, watch, due: now + INSPECT_TIMEOUT_MS });
        actions.push(ParentAction::InspectChild { run_id: run.run_id.clone(), gen, to });
        Ok(actions)
    }

    /// Inspects the given-up runs whose child was still running, for a late real result.
    fn watch_tick(&mut self, sql: &(impl Sql + ?Sized), now: i64) -> Result<Vec<ParentAction>, StoreError> {
        let mut actions = Vec::new();
        for run in Registry::new(sql).watched(now, WATCH_MS)? {
            if self.drivers.contains_key(&run.run_id) || self.watching.contains_key(&run.run_id) {
                continue;
            }
            let to = self.address(sql, &run)?;
            let gen = self.gen();
            let watching = Watching { gen, watch: Watch::LateResult, due: now + INSPECT_TIMEOUT_MS };
            self.watching.insert(run.run_id.clone(), watching);
            actions.push(ParentAction::InspectChild { run_id: run.run_id.clone(), gen, to });
        }
        Ok(actions)
    }

    pub(super) fn on_watch_inspected(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        watch: Watch,
        result: Result<Option<InspectionReply>, InterruptedReason>,
        now: i64,
    ) -> Result<Vec<ParentAction>, StoreError> {
        let Ok(Some(outcome)) = result.map(|i| i.and_then(|i| i.outcome)) else { return Ok(Vec::new()) };
        let Some(record) = Registry::new(sql).get(run_id)? else { return Ok(Vec::new()) };
        if record.status != RunStatus::Interrupted || self.drivers.contains_key(run_id) {
            return Ok(Vec::new());
        }
        let wanted = match watch {
            Watch::GaveUp => outcome.status() == RunStatus::Completed,
            Watch::LateResult => matches!(outcome.status(), RunStatus::Completed | RunStatus::Error),
        };
        if !wanted {
            return Ok(Vec::new());
        }
        // A late real result: follow the child again to take the chunks it stored after the
        // cursor, then record the result (which repairs the soft `interrupted`, once).
        Registry::new(sql).reattach(run_id)?;
        let mut actions = vec![ParentAction::Observe(
            EventType::LateResult,
            json!({ "runId": run_id, "status": outcome.status().as_str() }),
        )];
        let mut driver = Driver::new(&record, Phase::Tailing, true, now);
        driver.draining = Some(outcome);
        self.drivers.insert(run_id.to_owned(), driver);
        actions.extend(self.open_tail(sql, run_id, now)?);
        Ok(actions)
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests;
