//! Cancel, clear and retention: runs stopped, and runs removed with their frames and their
//! children's storage.

use serde_json::json;

use super::*;
use crate::types::{epoch_ms, ms, ClearFilter};

/// What a call on the engine that answers its caller gives back: the answer, and the actions to
/// carry out either way (a failure is reported and retried through them).
#[derive(Debug)]
pub struct Called<T> {
    /// The answer: `Err` when a storage statement failed and the call was rolled back.
    pub result: Result<T, StoreError>,
    /// What the platform must do.
    pub actions: Vec<ParentAction>,
}

/// What [`ParentEngine::clear`] did: the runs it cleared, and the failure that stopped the
/// others (each run is cleared as one unit: one that failed stays as it was).
#[derive(Debug, Default)]
pub struct Cleared {
    /// The cleared run ids.
    pub runs: Vec<String>,
    /// The first storage failure, if any run could not be cleared.
    pub failed: Option<StoreError>,
}

impl ParentEngine {
    /// Cancels a run: the child is told to stop, the run ends `aborted`, and a caller waiting
    /// on it gets the result. Idempotent: an unknown or finished run is left as it is.
    pub fn cancel(&mut self, sql: &(impl Sql + ?Sized), run_id: &str, reason: Option<String>, now: i64) -> Called<()> {
        let (result, mut actions) = match atomic(sql, || self.cancel_run(sql, run_id, reason, now)) {
            Ok(actions) => (Ok(()), actions),
            Err(error) => {
                let actions = self.trouble(Some(run_id), "cancel", &error, now);
                (Err(error), actions)
            }
        };
        actions.extend(self.settle(sql, now));
        Called { result, actions: self.account(actions) }
    }

    pub(super) fn cancel_run(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        reason: Option<String>,
        now: i64,
    ) -> Result<Vec<ParentAction>, StoreError> {
        let Some(record) = Registry::new(sql).get(run_id)? else { return Ok(Vec::new()) };
        if record.status.is_hard_terminal() {
            return Ok(Vec::new());
        }
        let to = self.address(sql, &record)?;
        self.watching.remove(run_id);
        let mut actions = vec![ParentAction::CancelChild { run_id: run_id.to_owned(), to, reason: reason.clone() }];
        actions.extend(self.conclude(sql, &record, Outcome::Aborted { reason }, now)?);
        Ok(actions)
    }

    /// Clears finished runs past the retention policy (at most [`RETENTION_BATCH`] at a time;
    /// the alarm comes back soon for the rest). Runs with a delivery still owed stay.
    pub(super) fn retain(&mut self, sql: &(impl Sql + ?Sized), now: i64) -> Result<Vec<ParentAction>, StoreError> {
        let policy = self.options.retention;
        if policy.max_runs.is_none() && policy.max_age.is_none() {
            return Ok(Vec::new());
        }
        let registry = Registry::new(sql);
        let ended_before = policy.max_age.map(|age| now.saturating_sub(ms(age)));
        let candidates = registry.beyond_retention(policy.max_runs, ended_before, RETENTION_BATCH)?;
        if candidates.is_empty() {
            return Ok(Vec::new());
        }
        let owed = Ledger::new(sql).outstanding()?;
        let doomed: Vec<String> = candidates.into_iter().filter(|id| !owed.contains(id)).collect();
        let mut actions = Vec::new();
        for run_id in &doomed {
            let Some(record) = registry.get(run_id)? else { continue };
            actions.push(self.clear_child(sql, &record, now)?);
        }
        registry.delete(&doomed)?;
        Ledger::new(sql).forget(&doomed)?;
        for run_id in &doomed {
            self.watching.remove(run_id);
        }
        if doomed.len() == RETENTION_BATCH {
            self.wake_at(now + RETAIL_PAUSE_MS);
        }
        if !doomed.is_empty() {
            actions.push(ParentAction::Observe(
                EventType::Retention,
                json!({ "cleared": doomed.len(), "maxRuns": policy.max_runs, "maxAgeMs": policy.max_age.map(ms) }),
            ));
        }
        Ok(actions)
    }

    /// Removes the runs `filter` matches, each as one unit: the live ones are cancelled, each
    /// child's storage is deleted and the rows and frames too (each run id keeps its sequence
    /// high-water mark). Answers the cleared run ids and the first failure, if any; `Err` when
    /// the runs could not even be listed.
    pub fn clear(&mut self, sql: &(impl Sql + ?Sized), filter: &ClearFilter, now: i64) -> Called<Cleared> {
        let runs = match Registry::new(sql).matching(filter.status.as_deref(), filter.older_than.map(epoch_ms)) {
            Ok(runs) => runs,
            Err(error) => {
                let actions = self.trouble(None, "clear", &error, now);
                return Called { result: Err(error), actions };
            }
        };
        let mut actions = Vec::new();
        let mut cleared = Vec::new();
        let mut failure = None;
        for run in runs {
            let result = atomic(sql, || {
                let mut actions = Vec::new();
                if !run.status.is_hard_terminal() {
                    actions.extend(self.cancel_run(sql, &run.run_id, Some("cleared".into()), now)?);
                }
                actions.push(self.clear_child(sql, &run, now)?);
                let ids = std::slice::from_ref(&run.run_id);
                Registry::new(sql).delete(ids)?;
                Ledger::new(sql).forget(ids)?;
                Ok(actions)
            });
            match result {
                Ok(done) => {
                    self.watching.remove(&run.run_id);
                    // A delivery still running for it settles nothing now (see its exchange).
                    self.in_flight.retain(|(id, _), _| *id != run.run_id);
                    actions.extend(done);
                    cleared.push(run.run_id);
                }
                Err(error) => {
                    actions.extend(self.trouble(Some(&run.run_id), "clear", &error, now));
                    failure.get_or_insert(error);
                }
            }
        }
        actions.extend(self.settle(sql, now));
        Called { result: Ok(Cleared { runs: cleared, failed: failure }), actions: self.account(actions) }
    }

    /// Asks the child of a run being deleted to delete its storage, and keeps that owed until
    /// the child says it did: the alarm asks again when no answer came (a failed call, or an
    /// answer this instance did not live to hear).
    pub(super) fn clear_child(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run: &RunRecord,
        now: i64,
    ) -> Result<ParentAction, StoreError> {
        let to = self.address(sql, run)?;
        let retry_at = now + CHILD_CLEAR_RETRY_MS;
        Registry::new(sql).owe_child_clear(&run.run_id, &to.binding, &to.name, retry_at)?;
        let gen = self.gen();
        self.wake_at(retry_at);
        Ok(ParentAction::ClearChild { run_id: run.run_id.clone(), to, gen })
    }

    /// The owed clears that are due again, asked again; one tried
    /// [`MAX_CHILD_CLEAR_ATTEMPTS`] times is given up with an event.
    pub(super) fn retry_child_clears(
        &mut self,
        sql: &(impl Sql + ?Sized),
        now: i64,
    ) -> Result<Vec<ParentAction>, StoreError> {
        let registry = Registry::new(sql);
        let due = registry.child_clears_due(now, now + CHILD_CLEAR_RETRY_MS, CHILD_CLEAR_BATCH)?;
        let mut actions = Vec::new();
        for (run_id, binding, name, attempts) in due {
            if attempts > MAX_CHILD_CLEAR_ATTEMPTS {
                registry.child_cleared(&run_id)?;
                actions.push(ParentAction::Observe(
                    EventType::ChildClearFailed,
                    json!({ "runId": run_id, "child": name, "attempts": attempts - 1 }),
                ));
                continue;
            }
            let gen = self.gen();
            actions.push(ParentAction::ClearChild { run_id, to: ChildAddress { binding, name }, gen });
        }
        Ok(actions)
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests;
