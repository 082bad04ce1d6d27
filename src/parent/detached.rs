//! Detached runs: dispatched without waiting, completed durably.
//!
//! Plain decisions over [`Sql`] with an explicit `now`: the run's configuration, the delivery
//! ledger (two slots, `finish` and `give_up`, each claimed under a lease and marked delivered
//! after the handler succeeded: exactly once on the happy path, at least once after a crash,
//! and never more than [`MAX_ATTEMPTS`] times: then the slot is dead-lettered), the budgets,
//! the at-most-once milestone notifications, and the backbone's cadence.

use serde_json::Value;

use super::registry::RunRecord;
use crate::protocol::InterruptedReason;
use crate::store::{Sql, StoreError, Value as V, MAX_SAFE_INTEGER};
use std::time::Duration;

use crate::types::{ms, DetachedOptions, RunStatus, CADENCE_MS, DEFAULT_MAX_BUDGET_MS, DEFAULT_NO_PROGRESS_BUDGET_MS};

/// How long a claimed delivery is held before another attempt may take it.
pub const LEASE_MS: i64 = 60_000;
/// Attempts per slot before it is dead-lettered.
pub const MAX_ATTEMPTS: i64 = 5;
/// Live detached runs past which a warning is emitted.
pub const LIVE_WARNING: i64 = 50;

/// The two delivery slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Slot {
    /// The run's real outcome (completed, error, aborted).
    Finish,
    /// A give-up (`interrupted`).
    GiveUp,
}

impl Slot {
    fn column(self) -> &'static str {
        match self {
            Self::Finish => "finish",
            Self::GiveUp => "give_up",
        }
    }
}

/// The result of a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Deliver now; this is attempt `n` (from 1).
    Claimed(i64),
    /// Already delivered.
    Delivered,
    /// Another attempt holds the lease.
    Leased,
    /// [`MAX_ATTEMPTS`] used up: dead-lettered.
    Exhausted,
    /// Not a detached run, or unknown.
    NotDetached,
}

/// What the backbone should do about a run's `finish` slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishDue {
    /// Deliver the outcome.
    Deliver,
    /// Settle without a delivery: the `aborted` that follows a give-up's teardown is not news.
    Suppress,
    /// Nothing to do.
    No,
}

/// Decides the `finish` slot of a run.
pub fn finish_due(run: &RunRecord) -> FinishDue {
    let Some(d) = &run.detached else { return FinishDue::No };
    if !run.status.is_hard_terminal() || d.finish.delivered_at.is_some() || d.finish.attempts >= MAX_ATTEMPTS {
        return FinishDue::No;
    }
    if run.status == RunStatus::Aborted && d.give_up.delivered_at.is_some() {
        return FinishDue::Suppress;
    }
    FinishDue::Deliver
}

/// Decides the `give_up` slot of a run: an `interrupted` detached run not yet delivered.
pub fn give_up_due(run: &RunRecord) -> bool {
    run.detached.as_ref().is_some_and(|d| {
        run.status == RunStatus::Interrupted && d.give_up.delivered_at.is_none() && d.give_up.attempts < MAX_ATTEMPTS
    })
}

/// Whether a live detached run has used up a budget, and which: the absolute ceiling always
/// applies; the resetting no-progress budget only once the child has signalled.
pub fn budget_exceeded(run: &RunRecord, now: i64) -> Option<InterruptedReason> {
    let d = run.detached.as_ref()?;
    if !run.status.is_live() {
        return None;
    }
    if d.max_budget_at.is_some_and(|at| now >= at) {
        return Some(InterruptedReason::BudgetExceeded);
    }
    match (d.no_progress_budget_ms, d.last_signal_at) {
        (Some(budget), Some(last)) if budget > 0 && now - last >= budget => Some(InterruptedReason::NoProgress),
        _ => None,
    }
}

/// The backbone's next delay after `quiet_ticks` ticks in which nothing changed.
pub fn cadence_ms(quiet_ticks: usize, cadence: &[Duration]) -> u64 {
    match cadence {
        [] => CADENCE_MS[quiet_ticks.min(CADENCE_MS.len() - 1)],
        _ => ms(cadence[quiet_ticks.min(cadence.len() - 1)]) as u64,
    }
}

/// The detached ledger over any [`Sql`].
pub struct Ledger<'a, S: Sql + ?Sized> {
    sql: &'a S,
}

/// Detached runs with something left to do: live, or an outcome not yet delivered (within the
/// attempt limit).
const OUTSTANDING_SQL: &str = "SELECT run_id FROM agent_tool_runs WHERE detached = 1 AND (\
    status IN ('starting','running') \
    OR (status IN ('completed','error','aborted') AND finish_delivered_at IS NULL AND finish_attempts < ?) \
    OR (status = 'interrupted' AND give_up_delivered_at IS NULL AND give_up_attempts < ?))";

/// The ledger's own table (the rest of what it reads is the registry's).
pub const LEDGER_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS agent_tool_milestone_deliveries (\
    run_id TEXT NOT NULL, name TEXT NOT NULL, delivered_at INTEGER NOT NULL, \
    PRIMARY KEY (run_id, name)) WITHOUT ROWID;";

impl<'a, S: Sql + ?Sized> Ledger<'a, S> {
    /// The ledger over `sql` (the registry's tables, plus the milestone deliveries).
    pub fn new(sql: &'a S) -> Self {
        Self { sql }
    }

    /// Its own table. Safe to run on every activation.
    pub fn migrate(&self) -> Result<(), StoreError> {
        self.sql.batch(LEDGER_SCHEMA)
    }

    /// Marks a freshly inserted run detached, with its budgets and handlers.
    pub fn configure(&self, run_id: &str, options: &DetachedOptions, now: i64) -> Result<(), StoreError> {
        let max = options.max_budget.map_or(DEFAULT_MAX_BUDGET_MS as i64, ms);
        let no_progress = options.no_progress_budget.map_or(DEFAULT_NO_PROGRESS_BUDGET_MS as i64, ms);
        self.sql.exec(
            "UPDATE agent_tool_runs SET detached = 1, on_finish = ?, notify_source = ?, on_milestones_json = ?, \
             max_budget_at = ?, no_progress_budget_ms = ?, notify = ? WHERE run_id = ?",
            &[
                V::from(options.on_finish.as_ref().map(Value::to_string)),
                V::from(options.notify_source.clone()),
                V::from(options.on_milestones.as_ref().and_then(|m| serde_json::to_string(m).ok())),
                // A budget past what storage holds exactly is no budget (NULL: never).
                V::from(Some(now.saturating_add(max)).filter(|&at| at <= MAX_SAFE_INTEGER)),
                V::from(Some(no_progress).filter(|&budget| budget <= MAX_SAFE_INTEGER)),
                V::from(options.notify),
                V::from(run_id),
            ],
        )?;
        Ok(())
    }

    /// Claims a slot for one delivery attempt: free when never claimed or its lease expired,
    /// not delivered, attempts left. One synchronous statement: only one claimant wins.
    pub fn claim(&self, run_id: &str, slot: Slot, now: i64) -> Result<Claim, StoreError> {
        let c = slot.column();
        let won = self.sql.one(
            &format!(
                "UPDATE agent_tool_runs SET {c}_claimed_at = ?, {c}_attempts = {c}_attempts + 1 \
                 WHERE run_id = ? AND detached = 1 AND {c}_delivered_at IS NULL AND {c}_attempts < ? \
                 AND ({c}_claimed_at IS NULL OR {c}_claimed_at <= ?) RETURNING {c}_attempts"
            ),
            &[V::Int(now), V::from(run_id), V::Int(MAX_ATTEMPTS), V::Int(now - LEASE_MS)],
        )?;
        if let Some(attempt) = won.and_then(|r| r.int(0)) {
            return Ok(Claim::Claimed(attempt));
        }
        let state = self.sql.one(
            &format!("SELECT detached, {c}_delivered_at, {c}_attempts FROM agent_tool_runs WHERE run_id = ?"),
            &[V::from(run_id)],
        )?;
        Ok(match state {
            Some(r) if r.int(0) == Some(1) => {
                if r.int(1).is_some() {
                    Claim::Delivered
                } else if r.int(2).unwrap_or(0) >= MAX_ATTEMPTS {
                    Claim::Exhausted
                } else {
                    Claim::Leased
                }
            }
            _ => Claim::NotDetached,
        })
    }

    /// The claimed delivery succeeded (or the slot was settled without one).
    pub fn delivered(&self, run_id: &str, slot: Slot, now: i64) -> Result<(), StoreError> {
        let c = slot.column();
        self.sql.exec(
            &format!("UPDATE agent_tool_runs SET {c}_delivered_at = ? WHERE run_id = ? AND {c}_delivered_at IS NULL"),
            &[V::Int(now), V::from(run_id)],
        )?;
        Ok(())
    }

    /// The claimed delivery failed: its lease is released at once, so the next pass may retry.
    pub fn failed(&self, run_id: &str, slot: Slot) -> Result<(), StoreError> {
        let c = slot.column();
        self.sql
            .exec(&format!("UPDATE agent_tool_runs SET {c}_claimed_at = NULL WHERE run_id = ?"), &[V::from(run_id)])?;
        Ok(())
    }

    /// Detached runs the backbone still has work for: live, or with a delivery due.
    pub fn outstanding(&self) -> Result<Vec<String>, StoreError> {
        let rows = self.sql.exec(OUTSTANDING_SQL, &[V::Int(MAX_ATTEMPTS), V::Int(MAX_ATTEMPTS)])?;
        Ok(rows.iter().filter_map(|r| r.text(0)).collect())
    }

    /// Live detached runs.
    pub fn live_count(&self) -> Result<i64, StoreError> {
        let row = self
            .sql
            .one("SELECT COUNT(*) FROM agent_tool_runs WHERE detached = 1 AND status IN ('starting','running')", &[])?;
        Ok(row.and_then(|r| r.int(0)).unwrap_or(0))
    }

    /// Claims the one notification of milestone `name` of a run: `true` for the first caller,
    /// whether the milestone was seen live or reconciled later.
    pub fn claim_milestone(&self, run_id: &str, name: &str, now: i64) -> Result<bool, StoreError> {
        let rows = self.sql.exec(
            "INSERT INTO agent_tool_milestone_deliveries (run_id, name, delivered_at) VALUES (?, ?, ?) \
             ON CONFLICT (run_id, name) DO NOTHING RETURNING 1",
            &[V::from(run_id), V::from(name), V::Int(now)],
        )?;
        Ok(!rows.is_empty())
    }

    /// Forgets the milestone notices of deleted runs: a run dispatched again under one of their
    /// ids is a new run.
    pub fn forget(&self, run_ids: &[String]) -> Result<(), StoreError> {
        for id in run_ids {
            self.sql.exec("DELETE FROM agent_tool_milestone_deliveries WHERE run_id = ?", &[V::from(id)])?;
        }
        Ok(())
    }

    /// Whether the notification of milestone `name` of a run was claimed.
    pub fn milestone_claimed(&self, run_id: &str, name: &str) -> Result<bool, StoreError> {
        let row = self.sql.one(
            "SELECT 1 FROM agent_tool_milestone_deliveries WHERE run_id = ? AND name = ?",
            &[V::from(run_id), V::from(name)],
        )?;
        Ok(row.is_some())
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::parent::registry::{NewRun, Registry};
    use crate::protocol::Outcome;
    use crate::store::sqlite;
    use crate::types::{MilestoneMode, OnMilestones};
    use serde_json::json;

    fn db() -> rusqlite::Connection {
        let db = sqlite::memory();
        Registry::new(&db).migrate().unwrap();
        Ledger::new(&db).migrate().unwrap();
        db
    }

    fn detached(db: &rusqlite::Connection, id: &str, options: &DetachedOptions, now: i64) {
        let reg = Registry::new(db);
        reg.insert(&NewRun { run_id: id.into(), agent_type: "Researcher".into(), ..Default::default() }, now).unwrap();
        Ledger::new(db).configure(id, options, now).unwrap();
    }

    #[test]
    fn configuration_is_kept_in_the_row() {
        let db = db();
        let options = DetachedOptions {
            on_finish: Some(json!({"handler": "importDone"})),
            notify: true,
            notify_source: Some("research-background".into()),
            max_budget: Some(std::time::Duration::from_millis(1000)),
            no_progress_budget: Some(std::time::Duration::ZERO),
            on_milestones: Some(OnMilestones { names: vec!["m".into()], mode: MilestoneMode::React }),
            invalid_tag: None,
        };
        detached(&db, "r", &options, 100);
        let run = Registry::new(&db).get("r").unwrap().unwrap();
        let d = run.detached.unwrap();
        assert_eq!(d.on_finish, Some(json!({"handler": "importDone"})));
        assert_eq!(d.notify_source.as_deref(), Some("research-background"));
        assert_eq!(d.on_milestones, Some(json!({"names": ["m"], "mode": "react"})));
        assert_eq!((d.max_budget_at, d.no_progress_budget_ms), (Some(1100), Some(0)));
        let defaults = {
            detached(&db, "d", &DetachedOptions::default(), 0);
            Registry::new(&db).get("d").unwrap().unwrap().detached.unwrap()
        };
        assert_eq!(defaults.max_budget_at, Some(DEFAULT_MAX_BUDGET_MS as i64));
        assert_eq!(defaults.no_progress_budget_ms, Some(DEFAULT_NO_PROGRESS_BUDGET_MS as i64));
        let huge = DetachedOptions {
            max_budget: Some(Duration::MAX),
            no_progress_budget: Some(Duration::MAX),
            ..Default::default()
        };
        detached(&db, "h", &huge, 5);
        let h = Registry::new(&db).get("h").unwrap().unwrap().detached.unwrap();
        assert_eq!((h.max_budget_at, h.no_progress_budget_ms), (None, None), "never, not negative nor rounded");
    }

    #[test]
    fn a_slot_is_claimed_once_under_a_lease_and_dead_letters_after_max_attempts() {
        // parity: 52
        let db = db();
        detached(&db, "r", &DetachedOptions::default(), 0);
        let ledger = Ledger::new(&db);
        assert_eq!(ledger.claim("r", Slot::Finish, 1000).unwrap(), Claim::Claimed(1));
        assert_eq!(ledger.claim("r", Slot::Finish, 1001).unwrap(), Claim::Leased, "the lease holds");
        assert_eq!(ledger.claim("r", Slot::GiveUp, 1001).unwrap(), Claim::Claimed(1), "slots are independent");
        // The first attempt crashed: after the lease, another may claim.
        assert_eq!(ledger.claim("r", Slot::Finish, 1000 + LEASE_MS).unwrap(), Claim::Claimed(2));
        ledger.failed("r", Slot::Finish).unwrap();
        for n in 3..=MAX_ATTEMPTS {
            assert_eq!(ledger.claim("r", Slot::Finish, 200_000 + n).unwrap(), Claim::Claimed(n));
            ledger.failed("r", Slot::Finish).unwrap();
        }
        assert_eq!(ledger.claim("r", Slot::Finish, 900_000).unwrap(), Claim::Exhausted, "never retried forever");
        ledger.delivered("r", Slot::GiveUp, 5).unwrap();
        assert_eq!(ledger.claim("r", Slot::GiveUp, 900_000).unwrap(), Claim::Delivered);
        Registry::new(&db)
            .insert(&NewRun { run_id: "awaited".into(), agent_type: "R".into(), ..Default::default() }, 0)
            .unwrap();
        assert_eq!(ledger.claim("awaited", Slot::Finish, 0).unwrap(), Claim::NotDetached);
    }

    #[test]
    fn budgets() {
        // parity: 101, 103, 104, 105
        let db = db();
        let options = DetachedOptions {
            max_budget: Some(std::time::Duration::from_millis(1000)),
            no_progress_budget: Some(std::time::Duration::from_millis(300)),
            ..Default::default()
        };
        detached(&db, "r", &options, 0);
        let reg = Registry::new(&db);
        reg.mark_running("r").unwrap();
        let run = reg.get("r").unwrap().unwrap();
        assert_eq!(budget_exceeded(&run, 999), None, "never signalled: only the ceiling applies");
        assert_eq!(budget_exceeded(&run, 1000), Some(InterruptedReason::BudgetExceeded));
        let progress = crate::parent::registry::Forward {
            kind: crate::protocol::tail::ChunkKind::Progress,
            body: "{}",
            replay: None,
        };
        reg.append("r", &[progress], None, 100).unwrap();
        let run = reg.get("r").unwrap().unwrap();
        assert_eq!(budget_exceeded(&run, 399), None);
        assert_eq!(budget_exceeded(&run, 400), Some(InterruptedReason::NoProgress));
        reg.append("r", &[progress], None, 350).unwrap();
        assert_eq!(budget_exceeded(&reg.get("r").unwrap().unwrap(), 600), None, "progress resets it");
        detached(
            &db,
            "off",
            &DetachedOptions { no_progress_budget: Some(std::time::Duration::ZERO), ..Default::default() },
            0,
        );
        reg.append("off", &[progress], None, 1).unwrap();
        assert_eq!(budget_exceeded(&reg.get("off").unwrap().unwrap(), 10_000_000), None, "0 disables it");
    }

    #[test]
    fn the_aborted_after_a_give_up_is_not_delivered() {
        // parity: 54
        let db = db();
        detached(&db, "r", &DetachedOptions::default(), 0);
        let reg = Registry::new(&db);
        let ledger = Ledger::new(&db);
        reg.finish(
            "r",
            &Outcome::Interrupted {
                error: "x".into(),
                reason: Some(InterruptedReason::BudgetExceeded),
                child_still_running: Some(false),
            },
            1,
        )
        .unwrap();
        let run = reg.get("r").unwrap().unwrap();
        assert!(give_up_due(&run));
        assert_eq!(finish_due(&run), FinishDue::No);
        ledger.claim("r", Slot::GiveUp, 2).unwrap();
        ledger.delivered("r", Slot::GiveUp, 3).unwrap();
        reg.finish("r", &Outcome::Aborted { reason: Some("torn down".into()) }, 4).unwrap();
        assert_eq!(finish_due(&reg.get("r").unwrap().unwrap()), FinishDue::Suppress);
        // A real completion after a give-up is news.
        detached(&db, "late", &DetachedOptions::default(), 0);
        reg.finish("late", &Outcome::Interrupted { error: "x".into(), reason: None, child_still_running: None }, 1)
            .unwrap();
        ledger.claim("late", Slot::GiveUp, 2).unwrap();
        ledger.delivered("late", Slot::GiveUp, 3).unwrap();
        reg.finish("late", &Outcome::Completed { summary: "s".into(), output: None }, 4).unwrap();
        assert_eq!(finish_due(&reg.get("late").unwrap().unwrap()), FinishDue::Deliver);
    }

    /// Each slot is due for its own outcomes only, until it is delivered or has used up its
    /// attempts; a run that is not detached has no slots.
    #[test]
    fn a_slot_is_due_for_its_outcome_until_delivered_or_exhausted() {
        let db = db();
        let reg = Registry::new(&db);
        let ledger = Ledger::new(&db);
        let interrupted = Outcome::Interrupted { error: "x".into(), reason: None, child_still_running: None };
        let completed = Outcome::Completed { summary: "s".into(), output: None };
        let due = |id: &str| {
            let run = reg.get(id).unwrap().unwrap();
            (finish_due(&run), give_up_due(&run))
        };
        detached(&db, "live", &DetachedOptions::default(), 0);
        assert_eq!(due("live"), (FinishDue::No, false), "nothing is due while it runs");
        detached(&db, "done", &DetachedOptions::default(), 0);
        reg.finish("done", &completed, 1).unwrap();
        assert_eq!(due("done"), (FinishDue::Deliver, false));
        ledger.delivered("done", Slot::Finish, 2).unwrap();
        assert_eq!(due("done"), (FinishDue::No, false), "delivered");
        detached(&db, "gave-up", &DetachedOptions::default(), 0);
        reg.finish("gave-up", &interrupted, 1).unwrap();
        assert_eq!(due("gave-up"), (FinishDue::No, true));
        ledger.delivered("gave-up", Slot::GiveUp, 2).unwrap();
        assert_eq!(due("gave-up"), (FinishDue::No, false), "delivered");
        for (id, terminal) in [("failing", &completed), ("failing-give-up", &interrupted)] {
            detached(&db, id, &DetachedOptions::default(), 0);
            reg.finish(id, terminal, 1).unwrap();
            let slot = if id == "failing" { Slot::Finish } else { Slot::GiveUp };
            for n in 1..MAX_ATTEMPTS {
                ledger.claim(id, slot, n * LEASE_MS).unwrap();
                ledger.failed(id, slot).unwrap();
                assert_ne!(due(id), (FinishDue::No, false), "{id}: attempt {n} failed, it is due again");
            }
            ledger.claim(id, slot, 100 * LEASE_MS).unwrap();
            ledger.failed(id, slot).unwrap();
            assert_eq!(due(id), (FinishDue::No, false), "{id}: dead-lettered after {MAX_ATTEMPTS} attempts");
        }
        reg.insert(&NewRun { run_id: "awaited".into(), agent_type: "R".into(), ..Default::default() }, 0).unwrap();
        reg.finish("awaited", &interrupted, 1).unwrap();
        assert_eq!(due("awaited"), (FinishDue::No, false), "not detached");
    }

    #[test]
    fn outstanding_and_milestones() {
        // parity: 95
        let db = db();
        let reg = Registry::new(&db);
        let ledger = Ledger::new(&db);
        detached(&db, "live", &DetachedOptions::default(), 0);
        detached(&db, "done", &DetachedOptions::default(), 0);
        reg.finish("done", &Outcome::Completed { summary: "s".into(), output: None }, 1).unwrap();
        detached(&db, "delivered", &DetachedOptions::default(), 0);
        reg.finish("delivered", &Outcome::Error { error: "x".into() }, 1).unwrap();
        ledger.delivered("delivered", Slot::Finish, 2).unwrap();
        reg.insert(&NewRun { run_id: "awaited".into(), agent_type: "R".into(), ..Default::default() }, 0).unwrap();
        let mut out = ledger.outstanding().unwrap();
        out.sort();
        assert_eq!(out, vec!["done", "live"]);
        assert_eq!(ledger.live_count().unwrap(), 1);
        detached(&db, "live-2", &DetachedOptions::default(), 0);
        assert_eq!(ledger.live_count().unwrap(), 2, "each live detached run counts");
        assert!(!ledger.milestone_claimed("live", "m").unwrap());
        assert!(ledger.claim_milestone("live", "m", 1).unwrap());
        assert!(ledger.milestone_claimed("live", "m").unwrap());
        assert!(!ledger.claim_milestone("live", "m", 2).unwrap(), "at most once per (run, name)");
        assert!(ledger.claim_milestone("live", "n", 2).unwrap());
        // A deleted run's notices are forgotten: the same id dispatched again is a new run.
        ledger.forget(&["live".to_owned()]).unwrap();
        assert!(!ledger.milestone_claimed("live", "m").unwrap());
        assert!(ledger.claim_milestone("live", "m", 3).unwrap());
    }

    #[test]
    fn the_cadence_escalates_and_caps() {
        let cadence: Vec<Duration> = CADENCE_MS.iter().copied().map(Duration::from_millis).collect();
        let got: Vec<u64> = (0..6).map(|n| cadence_ms(n, &cadence)).collect();
        assert_eq!(got, vec![5_000, 15_000, 30_000, 120_000, 120_000, 120_000]);
        assert_eq!(cadence_ms(3, &[Duration::from_millis(100)]), 100);
        // An empty cadence is the default one, capped at its last step too.
        let default: Vec<u64> = (0..6).map(|n| cadence_ms(n, &[])).collect();
        assert_eq!(default, vec![5_000, 15_000, 30_000, 120_000, 120_000, 120_000]);
    }
}
