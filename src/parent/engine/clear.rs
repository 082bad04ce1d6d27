//! Cancel, clear and retention: runs removed with their frames and their children's storage.

use super::*;

use serde_json::json;

use crate::observability::EventType;
use crate::parent::detached::Ledger;
use crate::parent::registry::{Registry, RunRecord, Terminal};
use crate::store::{Sql, StoreError};
use crate::types::ClearFilter;

impl ParentEngine {
    // ----- cancel and clear ---------------------------------------------------------------

    /// Cancels a run: the child is told to stop, the run ends `aborted`, and a caller waiting
    /// on it gets the result at once. Idempotent: an unknown or finished run is left as it is.
    pub fn cancel(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        reason: Option<String>,
        now: i64,
    ) -> Vec<ParentAction> {
        let Ok(Some(record)) = Registry::new(sql).get(run_id) else { return Vec::new() };
        if record.status.is_hard_terminal() {
            return Vec::new();
        }
        self.watching.remove(run_id);
        let mut actions = vec![ParentAction::CancelChild {
            run_id: run_id.to_owned(),
            to: self.address(sql, &record),
            reason: reason.clone(),
        }];
        actions.extend(self.conclude(sql, &record, Terminal::Aborted { reason }, now));
        actions
    }

    /// Clears finished runs past the retention policy (at most [`RETENTION_BATCH`] at a time;
    /// the alarm comes back soon for the rest). Runs with a delivery still owed stay.
    pub fn retain(&mut self, sql: &(impl Sql + ?Sized), now: i64) -> Vec<ParentAction> {
        let policy = self.options.retention;
        if policy.max_runs.is_none() && policy.max_age_ms.is_none() {
            return Vec::new();
        }
        let registry = Registry::new(sql);
        let ended_before = policy.max_age_ms.map(|ms| now.saturating_sub(ms as i64));
        let Ok(candidates) = registry.beyond_retention(policy.max_runs, ended_before, RETENTION_BATCH) else {
            return Vec::new();
        };
        if candidates.is_empty() {
            return Vec::new();
        }
        let owed = Ledger::new(sql).outstanding().unwrap_or_default();
        let doomed: Vec<String> = candidates.into_iter().filter(|id| !owed.contains(id)).collect();
        let mut actions = Vec::new();
        for run_id in &doomed {
            let Ok(Some(record)) = registry.get(run_id) else { continue };
            actions.push(self.clear_child(sql, &record, now));
            self.watching.remove(run_id);
        }
        if registry.delete(&doomed).is_err() {
            return Vec::new();
        }
        if doomed.len() == RETENTION_BATCH {
            actions.push(ParentAction::ArmAlarm { at: now + RETAIL_PAUSE_MS });
        }
        if !doomed.is_empty() {
            actions.push(ParentAction::Observe(
                EventType::Retention,
                json!({ "cleared": doomed.len(), "maxRuns": policy.max_runs, "maxAgeMs": policy.max_age_ms }),
            ));
        }
        actions
    }

    /// Removes the runs `filter` matches: the live ones are cancelled, each child's storage is
    /// deleted and the rows and frames too (each run id keeps its sequence high-water mark).
    /// Returns the cleared run ids.
    pub fn clear(
        &mut self,
        sql: &(impl Sql + ?Sized),
        filter: &ClearFilter,
        now: i64,
    ) -> Result<(Vec<String>, Vec<ParentAction>), StoreError> {
        let registry = Registry::new(sql);
        let runs = registry.matching(filter.status.as_deref(), filter.older_than)?;
        let mut actions = Vec::new();
        let mut cleared = Vec::new();
        for run in runs {
            if !run.status.is_hard_terminal() {
                actions.extend(self.cancel(sql, &run.run_id, Some("cleared".into()), now));
            }
            actions.push(self.clear_child(sql, &run, now));
            registry.delete(std::slice::from_ref(&run.run_id))?;
            self.watching.remove(&run.run_id);
            cleared.push(run.run_id);
        }
        Ok((cleared, actions))
    }

    /// Asks the child of a run being deleted to delete its storage, and keeps that owed until
    /// the child says it did (the alarm retries a failed call).
    pub(super) fn clear_child(&self, sql: &(impl Sql + ?Sized), run: &RunRecord, now: i64) -> ParentAction {
        let to = self.address(sql, run);
        if let Err(e) =
            Registry::new(sql).owe_child_clear(&run.run_id, &to.binding, &to.name, now + CHILD_CLEAR_RETRY_MS)
        {
            return ParentAction::Observe(
                EventType::ChildClearFailed,
                json!({ "runId": run.run_id, "error": e.to_string() }),
            );
        }
        ParentAction::ClearChild { run_id: run.run_id.clone(), to }
    }

    /// The owed clears that are due again, asked again; one tried
    /// [`MAX_CHILD_CLEAR_ATTEMPTS`] times is given up with an event.
    pub(super) fn retry_child_clears(&self, sql: &(impl Sql + ?Sized), now: i64) -> Vec<ParentAction> {
        let registry = Registry::new(sql);
        let Ok(due) = registry.child_clears_due(now, now + CHILD_CLEAR_RETRY_MS, CHILD_CLEAR_BATCH) else {
            return Vec::new();
        };
        let mut actions = Vec::new();
        for (run_id, binding, name, attempts) in due {
            if attempts > MAX_CHILD_CLEAR_ATTEMPTS {
                let _ = registry.child_cleared(&run_id);
                actions.push(ParentAction::Observe(
                    EventType::ChildClearFailed,
                    json!({ "runId": run_id, "child": name, "attempts": attempts - 1 }),
                ));
                continue;
            }
            actions.push(ParentAction::ClearChild { run_id, to: ChildAddress { binding, name } });
        }
        actions
    }
}
