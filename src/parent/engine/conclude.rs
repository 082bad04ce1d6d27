//! Concluding a run: its terminal result recorded once, its frame, its callers, its finish
//! hook, and a detached run's deliveries through the ledger.

use super::*;

use serde_json::json;

use crate::observability::EventType;
use crate::parent::detached::{finish_due, give_up_due, Claim, FinishDue, Ledger, Slot, MAX_ATTEMPTS};
use crate::parent::registry::{Registry, RunRecord, Terminal};
use crate::store::Sql;
use crate::types::{RunResult, DEFAULT_NOTIFY_SOURCE};

impl ParentEngine {
    // ----- conclusion ---------------------------------------------------------------------

    /// Records the terminal result (unless the row is already final), broadcasts its frame,
    /// frees the slot, resolves the callers, and delivers it: `on_agent_tool_finish` once per
    /// run for an awaited run, the ledger for a detached one. The run is no longer driven.
    pub(super) fn conclude(
        &mut self,
        sql: &(impl Sql + ?Sized),
        record: &RunRecord,
        terminal: Terminal,
        now: i64,
    ) -> Vec<ParentAction> {
        self.conclude_run(sql, &record.run_id, &record.agent_type, terminal, now)
    }

    /// [`Self::conclude`] by the run's id and agent type (its row is read by the finish).
    pub(super) fn conclude_run(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        agent_type: &str,
        terminal: Terminal,
        now: i64,
    ) -> Vec<ParentAction> {
        self.drivers.remove(run_id);
        let registry = Registry::new(sql);
        let mut actions = vec![ParentAction::CloseTail { run_id: run_id.to_owned() }];
        match registry.finish(run_id, &terminal, now) {
            Ok(Some(done)) => {
                if let Some(frame) = done.terminal_frame() {
                    actions.push(ParentAction::Broadcast(frame.to_json()));
                }
                actions.push(ParentAction::SlotFreed);
                let result = done.result();
                if done.detached.is_some() {
                    actions.extend(self.deliveries(sql, &done, now));
                    self.quiet_ticks = 0;
                    actions.push(ParentAction::ArmAlarm { at: now + self.cadence() as i64 });
                } else if registry.claim_finish_hook(&done.run_id, now).unwrap_or(false) {
                    actions.push(ParentAction::Hook(HookCall::Finish(done.info(), result.clone())));
                }
                if done.child_still_running == Some(true) {
                    // Soft: the child goes on; the backbone watches it for a late result.
                    actions.push(ParentAction::ArmAlarm { at: now + self.cadence() as i64 });
                }
                actions.push(ParentAction::Resolve { run_id: done.run_id.clone(), result });
            }
            Ok(None) => actions.extend(self.forget(sql, run_id)),
            Err(e) => {
                let result =
                    RunResult { status: terminal.status(), ..RunResult::refused(run_id, agent_type, e.to_string()) };
                actions.push(ParentAction::Resolve { run_id: run_id.to_owned(), result });
            }
        }
        actions
    }

    /// Stops driving a run and hands its waiting callers what its row says.
    pub(super) fn forget(&mut self, sql: &(impl Sql + ?Sized), run_id: &str) -> Vec<ParentAction> {
        self.drivers.remove(run_id);
        vec![ParentAction::Resolve { run_id: run_id.to_owned(), result: current_result(sql, run_id, "") }]
    }

    /// What a detached run's ledger has due: its outcome (`finish`) or a give-up, each claimed
    /// under a lease; the global hook once per run.
    pub(super) fn deliveries(&mut self, sql: &(impl Sql + ?Sized), run: &RunRecord, now: i64) -> Vec<ParentAction> {
        let Some(detached) = &run.detached else { return Vec::new() };
        let ledger = Ledger::new(sql);
        let mut actions = Vec::new();
        let mut slots = Vec::new();
        match finish_due(run) {
            FinishDue::No => {}
            FinishDue::Suppress => {
                let _ = ledger.delivered(&run.run_id, Slot::Finish, now);
            }
            FinishDue::Deliver => slots.push(Slot::Finish),
        }
        if give_up_due(run) {
            slots.push(Slot::GiveUp);
        }
        for slot in slots {
            let Ok(Claim::Claimed(attempt)) = ledger.claim(&run.run_id, slot, now) else { continue };
            let info = run.info();
            let result = run.result();
            if Registry::new(sql).claim_finish_hook(&run.run_id, now).unwrap_or(false) {
                actions.push(ParentAction::Hook(HookCall::Finish(info.clone(), result.clone())));
            }
            let delivery = match (&detached.on_finish, detached.notify) {
                (Some(handler), _) => Delivery::Handler(handler.clone()),
                (None, true) => Delivery::Notify {
                    source: detached.notify_source.clone().unwrap_or_else(|| DEFAULT_NOTIFY_SOURCE.into()),
                },
                (None, false) => Delivery::Nothing,
            };
            actions.push(ParentAction::Deliver { run: info, result, slot, attempt, delivery });
        }
        actions
    }

    pub(super) fn on_delivery_done(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        slot: Slot,
        attempt: i64,
        result: Result<(), String>,
        now: i64,
    ) -> Vec<ParentAction> {
        let ledger = Ledger::new(sql);
        match result {
            Ok(()) => {
                let _ = ledger.delivered(run_id, slot, now);
                Vec::new()
            }
            Err(error) => {
                let _ = ledger.failed(run_id, slot);
                let dead = attempt >= MAX_ATTEMPTS;
                let slot = if slot == Slot::Finish { "finish" } else { "give_up" };
                vec![
                    ParentAction::Observe(
                        EventType::DetachedDeliveryFailed,
                        json!({ "runId": run_id, "slot": slot, "attempt": attempt, "deadLetter": dead, "error": error }),
                    ),
                    ParentAction::ArmAlarm { at: now + self.cadence() as i64 },
                ]
            }
        }
    }
}
