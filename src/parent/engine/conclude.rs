//! Concluding a run: its terminal result recorded once, its frame, its callers (after its
//! finish hook), and a detached run's deliveries through the ledger and the chat.

use serde_json::{json, Value};

use super::*;
use crate::parent::detached::{finish_due, give_up_due, Claim, FinishDue, MAX_ATTEMPTS};
use crate::types::DEFAULT_NOTIFY_SOURCE;

impl ParentEngine {
    /// Records the terminal result (unless the row is already final), broadcasts its frame,
    /// resolves the callers (once the finish hook returned), and delivers it:
    /// `on_agent_tool_finish` once per run for an awaited run, the ledger for a detached one.
    /// The run is no longer driven.
    pub(super) fn conclude(
        &mut self,
        sql: &(impl Sql + ?Sized),
        record: &RunRecord,
        terminal: Outcome,
        now: i64,
    ) -> Result<Vec<ParentAction>, StoreError> {
        self.conclude_run(sql, &record.run_id, terminal, now)
    }

    /// [`Self::conclude`] by the run's id (its row is read by the finish).
    pub(super) fn conclude_run(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        terminal: Outcome,
        now: i64,
    ) -> Result<Vec<ParentAction>, StoreError> {
        let registry = Registry::new(sql);
        let mut actions = vec![ParentAction::CloseTail { run_id: run_id.to_owned() }];
        // Hard terminals are final: the finish writes only a row that is not.
        let Some(done) = registry.finish(run_id, &terminal, now)? else {
            actions.extend(self.forget(sql, run_id)?);
            return Ok(actions);
        };
        if let Some(frame) = done.terminal_frame() {
            actions.push(ParentAction::Broadcast(frame.to_json()));
        }
        let result = done.result();
        if done.detached.is_some() {
            actions.extend(self.deliveries(sql, &done, now)?);
            self.quiet_ticks = 0;
            self.wake_at(now + self.cadence() as i64);
        } else if registry.claim_finish_hook(run_id, now)? {
            actions.push(ParentAction::Hook(HookCall::Finish(done.info(), result.clone(), self.gen())));
        }
        if done.outcome.as_ref().and_then(Outcome::child_still_running) == Some(true) {
            // Soft: the child goes on; the backbone watches it for a late result.
            self.wake_at(now + self.cadence() as i64);
        }
        self.stop_driving(run_id);
        actions.extend(self.resolve(run_id, result));
        Ok(actions)
    }

    /// Stops driving a run and hands its waiting callers what its row says (`aborted` when it
    /// was cleared).
    pub(super) fn forget(&mut self, sql: &(impl Sql + ?Sized), run_id: &str) -> Result<Vec<ParentAction>, StoreError> {
        let result = current_result(sql, run_id, "")?;
        self.stop_driving(run_id);
        Ok(self.resolve(run_id, result))
    }

    /// Hands a run's result to its callers ([`Self::account`] holds it while the run's finish
    /// hook runs).
    pub(super) fn resolve(&self, run_id: &str, result: RunResult) -> Vec<ParentAction> {
        vec![ParentAction::Resolve { run_id: run_id.to_owned(), result }]
    }

    /// Keeps the engine's books on what a call hands the platform, in order: a finish hook
    /// starts running (its run's callers wait for it), a result for a run whose finish hook runs
    /// is held until it returned, a delivery is in flight until it is answered. Every public call
    /// returns its actions through here.
    pub(super) fn account(&mut self, actions: Vec<ParentAction>) -> Vec<ParentAction> {
        let mut out = Vec::with_capacity(actions.len());
        for action in actions {
            match &action {
                ParentAction::Hook(HookCall::Finish(run, _, gen)) => {
                    self.finishing.insert(run.run_id.clone(), (*gen, None));
                }
                ParentAction::Resolve { run_id, result } => {
                    if let Some((_, held)) = self.finishing.get_mut(run_id) {
                        *held = Some(result.clone());
                        continue;
                    }
                }
                ParentAction::ClearChild { run_id, gen, .. } => {
                    self.clearing.insert(run_id.clone(), *gen);
                }
                ParentAction::Deliver { run, slot, gen, .. } => {
                    self.in_flight.insert((run.run_id.clone(), *slot), *gen);
                }
                ParentAction::Notice(Notice { run, delivery: Some(delivery), .. }) => {
                    self.in_flight.insert((run.run_id.clone(), delivery.slot), delivery.gen);
                }
                _ => {}
            }
            out.push(action);
        }
        out
    }

    /// A run's finish hook returned: its callers get the result now.
    /// `None` when the call is not the one this instance waits for (its run was cleared and
    /// dispatched again, or the hook called again): it settles nothing.
    pub(super) fn finish_hook_done(&mut self, run_id: &str, gen: u64) -> Option<Vec<ParentAction>> {
        if self.finishing.get(run_id).is_none_or(|(current, _)| *current != gen) {
            return None;
        }
        Some(match self.finishing.remove(run_id).and_then(|(_, held)| held) {
            Some(result) => self.resolve(run_id, result),
            None => Vec::new(),
        })
    }

    /// What a detached run's ledger has due: its outcome (`finish`) or a give-up, each claimed
    /// under a lease; the global hook once per run. A delivery this instance has in flight is
    /// not claimed again, however slow its handler.
    pub(super) fn deliveries(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run: &RunRecord,
        now: i64,
    ) -> Result<Vec<ParentAction>, StoreError> {
        let Some(detached) = &run.detached else { return Ok(Vec::new()) };
        let ledger = Ledger::new(sql);
        let mut actions = Vec::new();
        let mut slots = Vec::new();
        match finish_due(run) {
            FinishDue::No => {}
            FinishDue::Suppress => ledger.delivered(&run.run_id, Slot::Finish, now)?,
            FinishDue::Deliver => slots.push(Slot::Finish),
        }
        if give_up_due(run) {
            slots.push(Slot::GiveUp);
        }
        for slot in slots {
            if self.in_flight.contains_key(&(run.run_id.clone(), slot)) {
                continue;
            }
            let Claim::Claimed(attempt) = ledger.claim(&run.run_id, slot, now)? else { continue };
            let gen = self.gen();
            let (info, result) = (run.info(), run.result());
            if Registry::new(sql).claim_finish_hook(&run.run_id, now)? {
                actions.push(ParentAction::Hook(HookCall::Finish(info.clone(), result.clone(), self.gen())));
            }
            match (&detached.on_finish, detached.notify) {
                (Some(handler), _) => actions.push(ParentAction::Deliver {
                    run: info,
                    result,
                    slot,
                    gen,
                    attempt,
                    handler: handler.clone(),
                }),
                (None, true) => actions.push(ParentAction::Notice(Notice {
                    id: format!("detached-finish:{}:{}", super::io::notice_key(run), result.status.as_str()),
                    source: detached.notify_source.clone().unwrap_or_else(|| DEFAULT_NOTIFY_SOURCE.into()),
                    run: info,
                    of: NoticeOf::Outcome(result),
                    turn: true,
                    delivery: Some(Delivery { slot, gen, attempt }),
                })),
                // Nothing beyond the global hook: settled at once.
                (None, false) => ledger.delivered(&run.run_id, slot, now)?,
            }
        }
        Ok(actions)
    }

    pub(super) fn on_delivery_done(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        delivery: Delivery,
        result: Result<(), String>,
        now: i64,
    ) -> Result<Vec<ParentAction>, StoreError> {
        let Delivery { slot, gen, attempt } = delivery;
        // An answer to a delivery this instance no longer waits for (its run was cleared and
        // dispatched again, or a storage failure handed it back to the backbone) settles nothing.
        if self.in_flight.get(&(run_id.to_owned(), slot)) != Some(&gen) {
            return Ok(Vec::new());
        }
        self.in_flight.remove(&(run_id.to_owned(), slot));
        let ledger = Ledger::new(sql);
        match result {
            Ok(()) => {
                ledger.delivered(run_id, slot, now)?;
                Ok(Vec::new())
            }
            Err(error) => {
                ledger.failed(run_id, slot)?;
                let dead = attempt >= MAX_ATTEMPTS;
                let slot = if slot == Slot::Finish { "finish" } else { "give_up" };
                let payload =
                    json!({ "runId": run_id, "slot": slot, "attempt": attempt, "deadLetter": dead, "error": error });
                self.wake_at(now + self.cadence() as i64);
                Ok(vec![ParentAction::Observe(EventType::DetachedDeliveryFailed, payload)])
            }
        }
    }

    /// Posts a notice the platform worded with the agent's hook (`text`; empty: nothing is
    /// posted): the message goes into the chat once by its id (a milestone once per
    /// `(run, name)`, however often it was offered, live or reconciled), then the transcript goes
    /// out and, for a turn, a model turn runs. An outcome's delivery is settled when the message
    /// is posted (or was already there), or when its turn ended.
    pub fn post_notice(
        &mut self,
        sql: &(impl Sql + ?Sized),
        notice: Notice,
        text: String,
        now: i64,
    ) -> Vec<ParentAction> {
        let run_id = notice.run.run_id.clone();
        let delivery = notice.delivery;
        let mut actions = self.unit(sql, None, "notice", now, |engine| engine.post(sql, notice, text, now));
        if actions.iter().any(|a| matches!(a, ParentAction::Observe(EventType::StorageFailed, _))) {
            // Rolled back: the delivery is the backbone's to retry once its lease ends.
            if let Some(delivery) = delivery {
                self.in_flight.remove(&(run_id, delivery.slot));
            }
        }
        actions.extend(self.settle(sql, now));
        self.account(actions)
    }

    fn post(
        &mut self,
        sql: &(impl Sql + ?Sized),
        notice: Notice,
        text: String,
        now: i64,
    ) -> Result<Vec<ParentAction>, StoreError> {
        let run_id = notice.run.run_id.clone();
        let settle = |engine: &mut Self| match notice.delivery {
            Some(delivery) => engine.on_delivery_done(sql, &run_id, delivery, Ok(()), now),
            None => Ok(Vec::new()),
        };
        if let NoticeOf::Milestone(milestone) = &notice.of {
            // Claimed even when the hook suppresses it: a milestone is handled once.
            if !Ledger::new(sql).claim_milestone(&run_id, &milestone.name, now)? {
                return Ok(Vec::new());
            }
        }
        if text.is_empty() {
            return settle(self);
        }
        let message = json!({
            "id": notice.id, "role": notice.role(), "parts": [{ "type": "text", "text": text }],
            "metadata": notice.metadata(),
        });
        if !crate::chat::journal::inject(sql, &message, now)? {
            return settle(self);
        }
        let mut actions = vec![ParentAction::Transcript];
        if notice.turn {
            let delivery = notice.delivery.map(|delivery| (run_id.clone(), delivery));
            actions.push(ParentAction::RunChatTurn { request_id: notice.id.clone(), delivery });
        } else {
            actions.extend(settle(self)?);
        }
        Ok(actions)
    }
}

/// A milestone body's `data`, as a value (for a notice reconciled from a stored frame).
pub(super) fn milestone_data(body: &str) -> Option<Value> {
    serde_json::from_str::<Value>(body).ok()?.get("data").cloned()
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests;
