//! Restart recovery, the alarm, the detached backbone (budgets and give-ups) and watching a
//! given-up child for a late result.

use super::*;

use serde_json::json;

use crate::observability::EventType;
use crate::parent::detached::{budget_exceeded, cadence_ms, Ledger};
use crate::parent::registry::{Registry, RunRecord, Terminal};
use crate::protocol::child_api::InspectionReply;
use crate::protocol::tail::OutcomeStatus;
use crate::protocol::InterruptedReason;
use crate::store::Sql;
use crate::types::RunStatus;

impl ParentEngine {
    // ----- recovery, backbone, watching ---------------------------------------------------

    /// The first event of a fresh instance: starts recovery once, without holding it up.
    pub fn wake(&mut self, sql: &(impl Sql + ?Sized), now: i64) -> Vec<ParentAction> {
        if self.recovery_started {
            return Vec::new();
        }
        self.recovery_started = true;
        self.begin_recovery(sql, now)
    }

    /// The alarm: recovery (if it never ran here), the backbone's tick, and the next alarm.
    pub fn alarm(&mut self, sql: &(impl Sql + ?Sized), now: i64) -> Vec<ParentAction> {
        self.recovery_started = true;
        let mut actions = self.begin_recovery(sql, now);
        let changed = self.backbone_tick(sql, now, &mut actions);
        self.quiet_ticks = if changed { 0 } else { self.quiet_ticks + 1 };
        actions.extend(self.watch_tick(sql, now));
        actions.extend(self.retain(sql, now));
        actions.extend(self.retry_child_clears(sql, now));
        let registry = Registry::new(sql);
        let mut next: Option<i64> = None;
        let mut sooner = |at: i64| next = Some(next.map_or(at, |n: i64| n.min(at)));
        let live = registry.live_count().unwrap_or(0);
        if live > 0 {
            sooner(now + self.options.recovery_alarm_ms as i64);
        }
        if let (Some(max_age), Ok(Some(oldest))) = (self.options.retention.max_age_ms, registry.oldest_finished_at()) {
            // The oldest finished run comes of age then (never sooner than a second from now).
            sooner((oldest + max_age as i64).max(now + 1000));
        }
        if registry.child_clears_pending().unwrap_or(0) > 0 {
            sooner(now + CHILD_CLEAR_RETRY_MS);
        }
        let watched = registry.watched(now, WATCH_MS).map(|w| w.len()).unwrap_or(0);
        let outstanding = Ledger::new(sql).outstanding().map(|o| o.len()).unwrap_or(0);
        if watched > 0 || outstanding > 0 {
            sooner(now + self.cadence() as i64);
        }
        if let Some(at) = next {
            actions.push(ParentAction::ArmAlarm { at });
        }
        actions.push(ParentAction::Observe(
            EventType::Alarm,
            json!({ "live": live, "outstanding": outstanding, "watched": watched, "nextInMs": next.map(|at| at - now) }),
        ));
        actions
    }

    pub(super) fn cadence(&self) -> u64 {
        cadence_ms(self.quiet_ticks, &self.options.backbone_cadence_ms)
    }

    /// Finds the live runs nobody drives (a restart left them) and inspects them one by one,
    /// within [`RECOVERY_DEADLINE_MS`] for the whole pass.
    pub(super) fn begin_recovery(&mut self, sql: &(impl Sql + ?Sized), now: i64) -> Vec<ParentAction> {
        if self.pass.is_some() {
            return Vec::new();
        }
        let Ok(all) = Registry::new(sql).all() else { return Vec::new() };
        let undriven: Vec<RunRecord> =
            all.into_iter().filter(|r| r.status.is_live() && !self.drivers.contains_key(&r.run_id)).collect();
        if undriven.is_empty() {
            return Vec::new();
        }
        let mut actions = vec![ParentAction::Observe(EventType::RecoveryBegin, json!({ "runs": undriven.len() }))];
        let window = self.options.reattach_max_window_ms;
        for record in &undriven {
            self.watching.remove(&record.run_id);
            let detached = record.detached.is_some();
            let driver = Driver {
                detached,
                phase: Phase::Inspecting,
                gen: 0,
                reattaching: true,
                last_progress: now,
                window_end: window.filter(|_| !detached).map(|ms| now.saturating_add(ms as i64)),
                failed_tails: 0,
                draining: None,
                recovering: true,
                frames: Frames::of(record),
            };
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
        actions.extend(self.next_recovery_row(sql, now));
        actions
    }

    /// Inspects the next run of the pass, or ends the pass.
    pub(super) fn next_recovery_row(&mut self, sql: &(impl Sql + ?Sized), now: i64) -> Vec<ParentAction> {
        let mut actions = Vec::new();
        loop {
            let Some(pass) = self.pass.as_mut() else { return actions };
            let Some(run_id) = pass.queue.pop() else {
                let pass = self.pass.take().expect("checked above");
                actions.push(ParentAction::Observe(
                    EventType::RecoveryComplete,
                    json!({ "runs": pass.runs, "finalized": pass.finalized, "reattached": pass.reattached }),
                ));
                return actions;
            };
            let deadline = pass.deadline;
            let record = match Registry::new(sql).get(&run_id) {
                Ok(Some(record)) if record.status.is_live() => record,
                // Concluded (a cancel) or cleared before its turn: nothing to recover.
                _ => {
                    if self.drivers.get(&run_id).is_none_or(|d| d.recovering) {
                        self.drivers.remove(&run_id);
                    }
                    continue;
                }
            };
            actions.push(ParentAction::Observe(
                EventType::RecoveryRow,
                json!({ "runId": run_id, "agentType": record.agent_type, "status": record.status }),
            ));
            if now >= deadline {
                actions.push(ParentAction::Observe(EventType::RecoveryDeadline, json!({ "runId": run_id })));
                let terminal = Terminal::Interrupted {
                    error: "recovery ran out of time before this run could be inspected".into(),
                    reason: Some(InterruptedReason::RecoveryDeadline),
                    child_still_running: None,
                };
                actions.extend(self.conclude(sql, &record, terminal, now));
                if let Some(pass) = self.pass.as_mut() {
                    pass.finalized += 1;
                }
                continue;
            }
            let gen = self.gen();
            let to = self.address(sql, &record);
            if let Some(driver) = self.drivers.get_mut(&run_id) {
                driver.gen = gen;
                driver.recovering = true;
            }
            if let Some(pass) = self.pass.as_mut() {
                pass.current = Some((run_id.clone(), gen));
            }
            actions.push(ParentAction::InspectChild { run_id, gen, to });
            return actions;
        }
    }

    /// Counts and reports one inspected run of a recovery pass, then moves the pass on.
    pub(super) fn recovery_row_inspected(
        &mut self,
        run_id: &str,
        result: &Result<Option<InspectionReply>, InterruptedReason>,
    ) -> Vec<ParentAction> {
        let mut actions = Vec::new();
        if let Some(pass) = self.pass.as_mut() {
            if pass.current.as_ref().is_some_and(|(id, _)| id == run_id) {
                pass.current = None;
                match result {
                    Err(reason) => {
                        pass.finalized += 1;
                        actions.push(ParentAction::Observe(
                            EventType::RecoveryFailed,
                            json!({ "runId": run_id, "error": reason.as_str() }),
                        ));
                    }
                    Ok(Some(inspection)) if inspection.outcome().is_some() => pass.finalized += 1,
                    Ok(_) => {
                        pass.reattached += 1;
                        actions.push(ParentAction::Observe(EventType::RecoveryReattach, json!({ "runId": run_id })));
                    }
                }
            }
        }
        actions
    }

    /// The detached backbone: give up on exhausted budgets, deliver what is due. Returns
    /// whether anything changed (the cadence starts over when it did).
    pub(super) fn backbone_tick(
        &mut self,
        sql: &(impl Sql + ?Sized),
        now: i64,
        actions: &mut Vec<ParentAction>,
    ) -> bool {
        let mut changed = false;
        for run_id in Ledger::new(sql).outstanding().unwrap_or_default() {
            let Ok(Some(run)) = Registry::new(sql).get(&run_id) else { continue };
            if let Some(reason) = budget_exceeded(&run, now) {
                actions.extend(self.give_up(sql, &run, reason, now));
                changed = true;
                continue;
            }
            let delivered = self.deliveries(sql, &run, now);
            changed |= !delivered.is_empty();
            actions.extend(delivered);
        }
        changed
    }

    /// Gives up on a detached run: `interrupted` first (delivered through the `give_up` slot,
    /// and handed to any caller joined to it), then the child is torn down, then inspected:
    /// a child that had completed anyway still gets its real result recorded.
    pub(super) fn give_up(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run: &RunRecord,
        reason: InterruptedReason,
        now: i64,
    ) -> Vec<ParentAction> {
        let error = match reason {
            InterruptedReason::BudgetExceeded => "the detached run used up its budget",
            _ => "the detached run made no progress within its budget",
        };
        let terminal =
            Terminal::Interrupted { error: error.into(), reason: Some(reason), child_still_running: Some(false) };
        let to = self.address(sql, run);
        let mut actions = self.conclude(sql, run, terminal, now);
        actions.push(ParentAction::CancelChild {
            run_id: run.run_id.clone(),
            to: to.clone(),
            reason: Some(format!("given up: {}", reason.as_str())),
        });
        let gen = self.gen();
        self.watching.insert(run.run_id.clone(), (gen, Watch::GaveUp));
        actions.push(ParentAction::InspectChild { run_id: run.run_id.clone(), gen, to });
        actions
    }

    /// Inspects the given-up runs whose child was still running, for a late real result.
    pub(super) fn watch_tick(&mut self, sql: &(impl Sql + ?Sized), now: i64) -> Vec<ParentAction> {
        let Ok(watched) = Registry::new(sql).watched(now, WATCH_MS) else { return Vec::new() };
        let mut actions = Vec::new();
        for run in watched {
            if self.drivers.contains_key(&run.run_id) || self.watching.contains_key(&run.run_id) {
                continue;
            }
            let gen = self.gen();
            self.watching.insert(run.run_id.clone(), (gen, Watch::LateResult));
            actions.push(ParentAction::InspectChild { run_id: run.run_id.clone(), gen, to: self.address(sql, &run) });
        }
        actions
    }

    pub(super) fn on_watch_inspected(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        watch: Watch,
        result: Result<Option<InspectionReply>, InterruptedReason>,
        now: i64,
    ) -> Vec<ParentAction> {
        let Ok(Some(outcome)) = result.map(|i| i.and_then(|i| i.outcome())) else { return Vec::new() };
        let Ok(Some(record)) = Registry::new(sql).get(run_id) else { return Vec::new() };
        if record.status != RunStatus::Interrupted || self.drivers.contains_key(run_id) {
            return Vec::new();
        }
        let wanted = match watch {
            Watch::GaveUp => outcome.status == OutcomeStatus::Completed,
            Watch::LateResult => matches!(outcome.status, OutcomeStatus::Completed | OutcomeStatus::Error),
        };
        if !wanted {
            return Vec::new();
        }
        // A late real result: follow the child again to take the chunks it stored after the
        // cursor, then record the result (which repairs the soft `interrupted`, once).
        if Registry::new(sql).reattach(run_id).is_err() {
            return Vec::new();
        }
        let mut actions = vec![ParentAction::Observe(
            EventType::LateResult,
            json!({ "runId": run_id, "status": outcome.status.as_str() }),
        )];
        let driver = Driver {
            detached: record.detached.is_some(),
            phase: Phase::Tailing,
            gen: 0,
            reattaching: true,
            last_progress: now,
            window_end: None,
            failed_tails: 0,
            draining: Some(outcome),
            recovering: false,
            frames: Frames::of(&record),
        };
        self.drivers.insert(run_id.to_owned(), driver);
        actions.extend(self.open_tail(sql, run_id, now));
        actions
    }
}
