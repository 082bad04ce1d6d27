//! Dispatch and admission: one unit looks the run id up, checks the cap and inserts the row (or
//! queues the dispatch for a slot), then the child is started. A caller that gives up is
//! answered here too.

use serde_json::json;

use super::*;
use crate::parent::registry::{Inserted, NewRun, RegistryError};
use crate::protocol::child_api::{RunInput, StartRequest};
use crate::types::{ms, Admission};

/// Why a dispatch is too big to take, if it is.
fn oversized(new: &NewRun) -> Option<Refused> {
    let bytes = new.input.len();
    if bytes > MAX_INPUT_BYTES {
        return Some(Refused::TooLarge { what: "input", bytes, limit: MAX_INPUT_BYTES });
    }
    let bytes = new.display.as_ref().map_or(0, |d| d.to_string().len());
    if bytes > MAX_DISPLAY_BYTES {
        return Some(Refused::TooLarge { what: "display", bytes, limit: MAX_DISPLAY_BYTES });
    }
    None
}

/// The result a caller that gave up gets for a run it never started.
fn gave_up(new: &NewRun, reason: String) -> RunResult {
    RunResult { status: RunStatus::Aborted, ..RunResult::refused(&new.run_id, &new.agent_type, reason) }
}

impl ParentEngine {
    /// Admits a dispatch: looks the run id up, checks the cap, inserts the row (configured, for
    /// a detached run) and starts driving it, as one unit, so two dispatches can never both
    /// take the last slot nor both drive one run. Over the cap it is refused, writing nothing,
    /// or (an awaited run under [`Admission::Queue`]) queued until a slot frees.
    pub fn dispatch(
        &mut self,
        sql: &(impl Sql + ?Sized),
        dispatch: Dispatch,
        now: i64,
    ) -> (Admitted, Vec<ParentAction>) {
        let (admitted, mut actions) = self.admit_one(sql, dispatch, false, now);
        // A dispatch queued behind others while a slot is free (the queue could not be served
        // before): the queue is served now, first come first served.
        actions.extend(self.settle(sql, now));
        (admitted, self.account(actions))
    }

    fn admit_one(
        &mut self,
        sql: &(impl Sql + ?Sized),
        dispatch: Dispatch,
        from_queue: bool,
        now: i64,
    ) -> (Admitted, Vec<ParentAction>) {
        // One unit: a storage failure rolls it back whole, and the caller hears of it.
        let (admitted, mut actions) = match atomic(sql, || self.admit(sql, dispatch, from_queue, now)) {
            Ok(admitted) => admitted,
            Err(error) => {
                (Admitted::Refused(Error::Storage(error.clone())), self.trouble(None, "dispatch", &error, now))
            }
        };
        if matches!(admitted, Admitted::Driving) {
            actions.extend(self.unit(sql, None, "retention", now, |engine| engine.retain(sql, now)));
        }
        (admitted, actions)
    }

    fn admit(
        &mut self,
        sql: &(impl Sql + ?Sized),
        dispatch: Dispatch,
        from_queue: bool,
        now: i64,
    ) -> Result<(Admitted, Vec<ParentAction>), StoreError> {
        let Dispatch { mut new, detached, abandoned } = dispatch;
        if detached.is_some() && new.event_delivery == EventDelivery::Terminal {
            return Ok((Admitted::Refused(Refused::TerminalDeliveryDetached.into()), Vec::new()));
        }
        if let Some(refused) = oversized(&new) {
            return Ok((Admitted::Refused(refused.into()), Vec::new()));
        }
        let registry = Registry::new(sql);
        if let Some(existing) = registry.get(&new.run_id)? {
            if existing.agent_type != new.agent_type {
                let refused = Refused::OtherClass {
                    run_id: new.run_id.clone(),
                    existing: existing.agent_type,
                    requested: new.agent_type.clone(),
                };
                return Ok((Admitted::Refused(refused.into()), Vec::new()));
            }
            if existing.status.is_hard_terminal() {
                return Ok((Admitted::Finished(existing.result()), Vec::new()));
            }
            if self.drivers.contains_key(&new.run_id) {
                return Ok((Admitted::Joined, Vec::new()));
            }
            // Known but driven by nobody (a restart, or a soft `interrupted` dispatched again):
            // follow it again; the child's start is idempotent.
            self.watching.remove(&new.run_id);
            let input = existing.input.clone().unwrap_or(new.input);
            let actions = self.drive(sql, &existing, input, true, now)?;
            return Ok((Admitted::Driving, actions));
        }
        if let Some(reason) = abandoned {
            // The caller gave up before the run was admitted: nothing is written.
            return Ok((Admitted::Finished(gave_up(&new, reason)), Vec::new()));
        }
        if self.queue.iter().any(|q| q.dispatch.new.run_id == new.run_id) {
            return Ok((Admitted::Queued, Vec::new()));
        }
        // A deleted run whose child has not yet deleted its storage: starting it now would find
        // the old run there. Refused (nothing written) and the clear asked again.
        if let Some((binding, name)) = registry.child_clear_owed(&new.run_id)? {
            let refused = Refused::ClearPending { run_id: new.run_id.clone() };
            let gen = self.gen();
            let retry =
                ParentAction::ClearChild { run_id: new.run_id.clone(), to: ChildAddress { binding, name }, gen };
            return Ok((Admitted::Refused(refused.into()), vec![retry]));
        }
        if let Some(limit) = self.options.max_concurrent {
            let queues = self.options.admission == Admission::Queue && detached.is_none();
            // First come, first served: a dispatch does not pass the ones already waiting.
            let waiting = queues && !from_queue && !self.queue.is_empty();
            if waiting || registry.live_count()? >= limit as i64 {
                if !queues {
                    // A detached dispatch must return at once: over the cap it is refused.
                    return Ok((Admitted::Refused(Refused::CapReached { limit }.into()), Vec::new()));
                }
                let dispatch = Dispatch { new, detached, abandoned: None };
                self.queue.push_back(Queued { dispatch });
                return Ok((Admitted::Queued, Vec::new()));
            }
        }
        let mut record = match registry.insert(&new, now) {
            Ok(Inserted::New(record)) => record,
            Ok(Inserted::Existing(_)) => return Ok((Admitted::Joined, Vec::new())),
            Err(RegistryError::Store(error)) => return Err(error),
            Err(RegistryError::AgentTypeMismatch { run_id, existing, requested }) => {
                let refused = Refused::OtherClass { run_id, existing, requested };
                return Ok((Admitted::Refused(refused.into()), Vec::new()));
            }
        };
        // Kept with the row; the start takes it from here, carried once.
        let input = std::mem::take(&mut new.input);
        let mut actions = vec![ParentAction::Broadcast(record.started_frame().to_json())];
        if let Some(mut options) = detached {
            options.max_budget.get_or_insert(self.options.detached_max_budget);
            options.no_progress_budget.get_or_insert(self.options.detached_no_progress_budget);
            let ledger = Ledger::new(sql);
            ledger.configure(&record.run_id, &options, now)?;
            record = registry.get(&record.run_id)?.unwrap_or(record);
            self.quiet_ticks = 0;
            self.wake_at(now + self.cadence() as i64);
            let live = ledger.live_count()?;
            if live >= crate::parent::detached::LIVE_WARNING {
                actions.push(ParentAction::Observe(EventType::DetachedLiveCountWarning, json!({ "live": live })));
            }
        } else {
            self.wake_at(now + ms(self.options.recovery_alarm));
        }
        actions.push(ParentAction::Hook(HookCall::Start(record.info())));
        actions.extend(self.drive(sql, &record, input, false, now)?);
        Ok((Admitted::Driving, actions))
    }

    /// Admits the queued dispatches while slots are free, first come first served; each one's
    /// callers get its result when it ends (or at once when it is refused or already over).
    pub(super) fn admit_queued(&mut self, sql: &(impl Sql + ?Sized), now: i64) -> Vec<ParentAction> {
        let mut actions = Vec::new();
        while let (Some(limit), false) = (self.options.max_concurrent, self.queue.is_empty()) {
            match Registry::new(sql).live_count() {
                Ok(live) if live >= limit as i64 => break,
                Ok(_) => {}
                Err(error) => {
                    actions.extend(self.trouble(None, "admission", &error, now));
                    break;
                }
            }
            let Some(Queued { dispatch }) = self.queue.pop_front() else { break };
            let (run_id, agent_type) = (dispatch.new.run_id.clone(), dispatch.new.agent_type.clone());
            let (admitted, more) = self.admit_one(sql, dispatch, true, now);
            actions.extend(more);
            let result = match admitted {
                Admitted::Refused(error) => RunResult::refused(&run_id, &agent_type, error.to_string()),
                Admitted::Finished(result) => result,
                Admitted::Driving | Admitted::Joined | Admitted::Queued => continue,
            };
            actions.extend(self.resolve(&run_id, result));
        }
        actions
    }

    /// A caller waiting on a run gave up (its signal was cancelled): a dispatch still queued is
    /// dropped, writing nothing; an admitted run is cancelled, as
    /// [`ParentEngine::cancel`] does. Either way its callers get the result.
    pub fn abandon(&mut self, sql: &(impl Sql + ?Sized), run_id: &str, reason: String, now: i64) -> Vec<ParentAction> {
        if let Some(at) = self.queue.iter().position(|q| q.dispatch.new.run_id == run_id) {
            let queued = self.queue.remove(at).map(|q| q.dispatch.new);
            self.queue.retain(|q| q.dispatch.new.run_id != run_id);
            let result = match queued {
                Some(new) => gave_up(&new, reason),
                None => RunResult::refused(run_id, "", reason),
            };
            let actions = self.resolve(run_id, result);
            return self.account(actions);
        }
        let mut actions =
            self.unit(sql, Some(run_id), "cancel", now, |engine| engine.cancel_run(sql, run_id, Some(reason), now));
        actions.extend(self.settle(sql, now));
        self.account(actions)
    }

    /// Starts driving a run: the child's start (idempotent), then its tail.
    pub(super) fn drive(
        &mut self,
        sql: &(impl Sql + ?Sized),
        record: &RunRecord,
        input: RunInput,
        reattaching: bool,
        now: i64,
    ) -> Result<Vec<ParentAction>, StoreError> {
        let gen = self.gen();
        let start = self.start_action(sql, record, input, gen)?;
        let mut driver = Driver::new(record, Phase::Starting, reattaching, now);
        driver.gen = gen;
        self.drivers.insert(record.run_id.clone(), driver);
        Ok(vec![start])
    }

    pub(super) fn start_action(
        &self,
        sql: &(impl Sql + ?Sized),
        record: &RunRecord,
        input: RunInput,
        gen: u64,
    ) -> Result<ParentAction, StoreError> {
        let to = self.address(sql, record)?;
        let request = StartRequest {
            run_id: record.run_id.clone(),
            input,
            parent_class: self.class.clone(),
            parent_name: self.name(sql)?,
            child_name: to.name.clone(),
            terminal_only: record.event_delivery == EventDelivery::Terminal,
            // The tail this start is followed by, from where it will start (the platform may
            // open it in the same round trip; see `ParentAction::OpenTail`).
            tail_after: Some(record.child_cursor),
        };
        Ok(ParentAction::StartChild { run_id: record.run_id.clone(), gen, to, request })
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests;
