//! Scheduled tasks (`AgentHost::schedule`): kept in SQL beside the agent's other tables, run by
//! its alarm. The decisions are here, over [`Sql`] with an explicit `now`: which tasks are due,
//! the claim that keeps two alarms from running one task at once (a lease, so a task whose run
//! crashed is run again), and when the alarm must fire next.

use serde_json::Value;

use crate::store::{Sql, StoreError, Value as V};
use crate::types::ScheduledTask;

/// The table every agent has.
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS agent_tool_schedule (
  id TEXT PRIMARY KEY,
  at INTEGER NOT NULL,
  payload_json TEXT NOT NULL,
  claimed_at INTEGER
);
CREATE INDEX IF NOT EXISTS agent_tool_schedule_by_at ON agent_tool_schedule (at);
";

/// How long a claimed task is held before another alarm may run it again (its run crashed).
pub const TASK_LEASE_MS: i64 = 60_000;

/// The scheduled tasks over any [`Sql`].
pub struct Schedule<'a, S: Sql + ?Sized> {
    sql: &'a S,
}

fn task(row: &crate::store::Row) -> ScheduledTask {
    ScheduledTask {
        id: row.text(0).unwrap_or_default(),
        at: crate::types::time_of(row.int(1).unwrap_or(0)),
        payload: row.text(2).and_then(|p| serde_json::from_str(&p).ok()).unwrap_or(Value::Null),
    }
}

impl<'a, S: Sql + ?Sized> Schedule<'a, S> {
    /// The tasks of `sql`.
    pub fn new(sql: &'a S) -> Self {
        Self { sql }
    }

    /// Adds a task due at `at` (epoch ms) with its payload's JSON.
    pub fn add(&self, id: &str, at: i64, payload_json: &str) -> Result<(), StoreError> {
        self.sql.exec(
            "INSERT INTO agent_tool_schedule (id, at, payload_json) VALUES (?, ?, ?)",
            &[V::from(id), V::Int(at), V::from(payload_json)],
        )?;
        Ok(())
    }

    /// Cancels a task: whether it was still pending.
    pub fn cancel(&self, id: &str) -> Result<bool, StoreError> {
        Ok(!self.sql.exec("DELETE FROM agent_tool_schedule WHERE id = ? RETURNING 1", &[V::from(id)])?.is_empty())
    }

    /// The tasks not yet done, soonest first.
    pub fn pending(&self) -> Result<Vec<ScheduledTask>, StoreError> {
        let rows = self.sql.exec("SELECT id, at, payload_json FROM agent_tool_schedule ORDER BY at, id", &[])?;
        Ok(rows.iter().map(task).collect())
    }

    /// When the next task is due, if any (a claimed one counts: it may need running again).
    pub fn next_at(&self) -> Result<Option<i64>, StoreError> {
        Ok(self.sql.one("SELECT MIN(at) FROM agent_tool_schedule", &[])?.and_then(|r| r.int(0)))
    }

    /// Claims the tasks due at `now`, soonest first, in one statement: a task another alarm
    /// holds is not taken until its lease ran out.
    pub fn claim_due(&self, now: i64) -> Result<Vec<ScheduledTask>, StoreError> {
        let rows = self.sql.exec(
            "UPDATE agent_tool_schedule SET claimed_at = ?1 WHERE at <= ?1 AND (claimed_at IS NULL OR claimed_at <= ?2) \
             RETURNING id, at, payload_json",
            &[V::Int(now), V::Int(now - TASK_LEASE_MS)],
        )?;
        let mut tasks: Vec<ScheduledTask> = rows.iter().map(task).collect();
        tasks.sort_by(|a, b| a.at.cmp(&b.at).then_with(|| a.id.cmp(&b.id)));
        Ok(tasks)
    }

    /// A task's hook returned: it is done.
    pub fn done(&self, id: &str) -> Result<(), StoreError> {
        self.sql.exec("DELETE FROM agent_tool_schedule WHERE id = ?", &[V::from(id)])?;
        Ok(())
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::store::sqlite;

    fn db() -> rusqlite::Connection {
        let db = sqlite::memory();
        db.batch(SCHEMA).unwrap();
        db
    }

    fn ids(tasks: &[ScheduledTask]) -> Vec<&str> {
        tasks.iter().map(|t| t.id.as_str()).collect()
    }

    #[test]
    fn due_tasks_are_claimed_once_under_a_lease_soonest_first() {
        let db = db();
        let schedule = Schedule::new(&db);
        schedule.add("late", 300, "3").unwrap();
        schedule.add("b", 200, "{\"n\":2}").unwrap();
        schedule.add("a", 100, "1").unwrap();
        assert_eq!(schedule.next_at().unwrap(), Some(100));
        let due = schedule.claim_due(250).unwrap();
        assert_eq!(ids(&due), ["a", "b"]);
        assert_eq!(due[1].payload, serde_json::json!({"n": 2}));
        // Another alarm meanwhile takes nothing: both are held.
        assert!(schedule.claim_due(260).unwrap().is_empty());
        schedule.done("a").unwrap();
        // `b`'s run crashed before it was done: once the lease ran out it is run again.
        assert_eq!(ids(&schedule.claim_due(250 + TASK_LEASE_MS - 1).unwrap()), ["late"]);
        assert_eq!(ids(&schedule.claim_due(250 + TASK_LEASE_MS).unwrap()), ["b"]);
        assert!(schedule.cancel("late").unwrap());
        assert!(!schedule.cancel("late").unwrap(), "a task is cancelled once");
        assert_eq!(ids(&schedule.pending().unwrap()), ["b"]);
    }
}
