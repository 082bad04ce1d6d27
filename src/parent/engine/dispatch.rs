//! Dispatch and admission: one synchronous step looks the run id up, checks the cap and inserts
//! the row, then the child is started.

use super::*;

use serde_json::{json, Value};

use crate::observability::EventType;
use crate::parent::detached::{Ledger, LIVE_WARNING};
use crate::parent::registry::{Inserted, NewRun, Registry, RegistryError, RunRecord};
use crate::protocol::child_api::StartRequest;
use crate::store::Sql;
use crate::types::EventDelivery;

/// Why a dispatch is too big to take, if it is.
fn oversized(new: &NewRun, input: &Value) -> Option<String> {
    let input_bytes = input.to_string().len();
    if input_bytes > MAX_INPUT_BYTES {
        return Some(format!("the run's input is {input_bytes} bytes of JSON; at most {MAX_INPUT_BYTES} are accepted"));
    }
    let display_bytes = new.display.as_ref().map_or(0, |d| d.to_string().len());
    if display_bytes > MAX_DISPLAY_BYTES {
        return Some(format!(
            "the run's display is {display_bytes} bytes of JSON; at most {MAX_DISPLAY_BYTES} are accepted"
        ));
    }
    None
}

impl ParentEngine {
    // ----- dispatch -----------------------------------------------------------------------

    /// Admits a dispatch: looks the run id up, checks the cap, inserts the row (configured, for
    /// a detached run) and starts driving it, all in one synchronous step, so two dispatches
    /// can never both take the last slot nor both drive one run.
    pub fn dispatch(
        &mut self,
        sql: &(impl Sql + ?Sized),
        dispatch: Dispatch,
        input: Value,
        now: i64,
    ) -> (Admitted, Vec<ParentAction>) {
        let registry = Registry::new(sql);
        let new = dispatch.new;
        if let Some(problem) = oversized(&new, &input) {
            return (Admitted::Refused(problem), Vec::new());
        }
        let existing = match registry.get(&new.run_id) {
            Ok(existing) => existing,
            Err(e) => return (Admitted::Refused(e.to_string()), Vec::new()),
        };
        if let Some(existing) = existing {
            if existing.agent_type != new.agent_type {
                let error = RegistryError::AgentTypeMismatch {
                    run_id: new.run_id.clone(),
                    existing: existing.agent_type,
                    requested: new.agent_type.clone(),
                };
                return (Admitted::Refused(error.to_string()), Vec::new());
            }
            if existing.status.is_hard_terminal() {
                return (Admitted::Finished(existing.result()), Vec::new());
            }
            if self.drivers.contains_key(&new.run_id) {
                return (Admitted::Joined(existing), Vec::new());
            }
            // Known but driven by nobody (a restart, or a soft `interrupted` dispatched again):
            // follow it again; the child's start is idempotent.
            self.watching.remove(&new.run_id);
            let input = existing.input.clone().unwrap_or(input);
            let detached = existing.detached.is_some();
            let actions = self.drive(sql, &existing, input, detached, true, now);
            return (Admitted::Driving(existing), actions);
        }
        // A deleted run whose child has not yet deleted its storage: starting it now would find
        // the old run there. Refused (nothing written) and the clear asked again.
        if let Ok(Some((binding, name))) = registry.child_clear_owed(&new.run_id) {
            let problem = format!(
                "run id {:?} was cleared and its child has not yet deleted its storage; dispatch it again shortly",
                new.run_id
            );
            let retry = ParentAction::ClearChild { run_id: new.run_id.clone(), to: ChildAddress { binding, name } };
            return (Admitted::Refused(problem), vec![retry]);
        }
        if let Some(limit) = self.options.max_concurrent {
            match registry.live_count() {
                Ok(live) if live >= limit as i64 => return (Admitted::Full(limit), Vec::new()),
                Ok(_) => {}
                Err(e) => return (Admitted::Refused(e.to_string()), Vec::new()),
            }
        }
        let record = match registry.insert(&new, now) {
            Ok(Inserted::New(record)) => record,
            Ok(Inserted::Existing(record)) => return (Admitted::Joined(record), Vec::new()),
            Err(e) => return (Admitted::Refused(e.to_string()), Vec::new()),
        };
        let mut actions = Vec::new();
        let detached = dispatch.detached.is_some();
        let mut record = record;
        if let Some(mut options) = dispatch.detached {
            options.max_budget_ms.get_or_insert(self.options.detached_max_budget_ms);
            options.no_progress_budget_ms.get_or_insert(self.options.detached_no_progress_budget_ms);
            if let Err(e) = Ledger::new(sql).configure(&record.run_id, &options, now) {
                return (Admitted::Refused(e.to_string()), Vec::new());
            }
            // The row as configured.
            record = registry.get(&record.run_id).ok().flatten().unwrap_or(record);
            self.quiet_ticks = 0;
            actions.push(ParentAction::ArmAlarm { at: now + self.cadence() as i64 });
            let live = Ledger::new(sql).live_count().unwrap_or(0);
            if live >= LIVE_WARNING {
                actions.push(ParentAction::Observe(EventType::DetachedLiveCountWarning, json!({ "live": live })));
            }
        } else {
            actions.push(ParentAction::ArmAlarm { at: now + self.options.recovery_alarm_ms as i64 });
        }
        actions.extend(self.retain(sql, now));
        actions.insert(0, ParentAction::Broadcast(record.started_frame().to_json()));
        actions.push(ParentAction::Hook(HookCall::Start(record.info())));
        actions.extend(self.drive(sql, &record, input, detached, false, now));
        (Admitted::Driving(record), actions)
    }

    /// Starts driving a run: the child's start (idempotent), then its tail.
    pub(super) fn drive(
        &mut self,
        sql: &(impl Sql + ?Sized),
        record: &RunRecord,
        input: Value,
        detached: bool,
        reattaching: bool,
        now: i64,
    ) -> Vec<ParentAction> {
        let gen = self.gen();
        let driver = Driver {
            detached,
            phase: Phase::Starting,
            gen,
            reattaching,
            last_progress: now,
            window_end: None,
            failed_tails: 0,
            draining: None,
            recovering: false,
            frames: Frames::of(record),
        };
        self.drivers.insert(record.run_id.clone(), driver);
        vec![self.start_action(sql, record, input, gen)]
    }

    pub(super) fn start_action(
        &self,
        sql: &(impl Sql + ?Sized),
        record: &RunRecord,
        input: Value,
        gen: u64,
    ) -> ParentAction {
        let to = self.address(sql, record);
        let request = StartRequest {
            run_id: record.run_id.clone(),
            input,
            parent_class: self.class.clone(),
            parent_name: self.name(sql),
            child_name: to.name.clone(),
            terminal_only: record.event_delivery == EventDelivery::Terminal,
            // The tail this start is followed by, from where it will start (the platform may
            // open it in the same round trip; see `ParentAction::OpenTail`).
            tail_after: Some(record.child_cursor),
        };
        ParentAction::StartChild { run_id: record.run_id.clone(), gen, to, request }
    }
}
