//! Clearing: which finished runs the retention policy removes, deleting runs (each run id keeps
//! its sequence high-water mark), and the clears a deleted run's child still owes.

use super::*;

/// The newest finished run past the newest `?` (its end and run id): where clearing by count
/// stops. A walk of the finished runs' index, newest first.
pub(super) const RETENTION_BOUND: &str = "SELECT completed_at, run_id FROM agent_tool_runs \
    WHERE status NOT IN ('starting', 'running') ORDER BY completed_at DESC, run_id DESC LIMIT 1 OFFSET ?";

/// The finished runs up to a bound on (completed_at, run_id), oldest first, at most `?3`: one
/// range of the finished runs' index.
pub(super) const RETENTION_RANGE: &str =
    "SELECT run_id FROM agent_tool_runs WHERE status NOT IN ('starting', 'running') \
    AND completed_at <= ?1 AND (completed_at < ?1 OR run_id <= ?2) ORDER BY completed_at, run_id LIMIT ?3";

impl<'a, S: Sql + ?Sized> Registry<'a, S> {
    /// Finished runs past the retention policy, oldest first, at most `limit`: those that
    /// ended before `ended_before`, and those beyond the newest `keep` finished runs.
    pub fn beyond_retention(
        &self,
        keep: Option<usize>,
        ended_before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        // Both limits are a bound on (completed_at, run_id), the order runs are cleared in: the
        // newest finished run past `keep` (it and every older one go), and the age cutoff, which
        // comes before every run that ended at it (a NULL run id sorts first). The larger bound
        // decides. The finished runs' index answers both: a walk of `keep` entries for the bound
        // and one range for the runs, with no sort of every finished run (a parent asks at every
        // dispatch).
        // The largest offset a JavaScript double holds exactly (a Durable Object binds integers
        // as doubles).
        const MAX_OFFSET: i64 = 1 << 52;
        let by_count = match keep {
            Some(keep) => self
                .sql
                .one(RETENTION_BOUND, &[V::Int(i64::try_from(keep).unwrap_or(MAX_OFFSET).min(MAX_OFFSET))])?
                .and_then(|r| Some((r.int(0)?, r.text(1)))),
            None => None,
        };
        let by_age = ended_before.map(|at| (at, None));
        let Some((at, run_id)) = by_count.max(by_age) else { return Ok(Vec::new()) };
        let rows = self.sql.exec(RETENTION_RANGE, &[V::Int(at), V::from(run_id), V::Int(limit as i64)])?;
        Ok(rows.iter().filter_map(|r| r.text(0)).collect())
    }

    /// When the oldest finished run ended, if any.
    pub fn oldest_finished_at(&self) -> Result<Option<i64>, StoreError> {
        let row = self
            .sql
            .one("SELECT MIN(completed_at) FROM agent_tool_runs WHERE status NOT IN ('starting', 'running')", &[])?;
        Ok(row.and_then(|r| r.int(0)))
    }

    /// Deletes runs and their frames, keeping each run id's sequence high-water mark (for the
    /// newest [`MAX_TOMBSTONES`] deleted ids).
    pub fn delete(&self, run_ids: &[String]) -> Result<(), StoreError> {
        for id in run_ids {
            self.sql.exec(
                "INSERT INTO agent_tool_tombstones (run_id, next_seq) \
                 SELECT run_id, next_seq FROM agent_tool_runs WHERE run_id = ? \
                 ON CONFLICT (run_id) DO UPDATE SET next_seq = MAX(next_seq, excluded.next_seq)",
                &[V::from(id)],
            )?;
            self.sql.exec("DELETE FROM agent_tool_frames WHERE run_id = ?", &[V::from(id)])?;
            self.sql.exec("DELETE FROM agent_tool_runs WHERE run_id = ?", &[V::from(id)])?;
        }
        if !run_ids.is_empty() {
            self.sql.exec(
                "DELETE FROM agent_tool_tombstones WHERE rowid IN \
                 (SELECT rowid FROM agent_tool_tombstones ORDER BY rowid DESC LIMIT -1 OFFSET ?)",
                &[V::Int(MAX_TOMBSTONES as i64)],
            )?;
        }
        Ok(())
    }

    /// Records that the child of a deleted run still has to delete its storage (kept until it
    /// says it did, so a failed call is retried, never forgotten).
    pub fn owe_child_clear(&self, run_id: &str, binding: &str, name: &str, now: i64) -> Result<(), StoreError> {
        self.sql.exec(
            "INSERT INTO agent_tool_child_clears (run_id, binding, name, next_at) VALUES (?, ?, ?, ?) \
             ON CONFLICT (run_id) DO UPDATE SET binding = excluded.binding, name = excluded.name",
            &[V::from(run_id), V::from(binding), V::from(name), V::Int(now)],
        )?;
        Ok(())
    }

    /// Every clear still owed, as it is kept: an object that wipes its own storage (its parent
    /// cleared it) puts them back after ([`Registry::restore_owed_child_clears`]), so its
    /// children are still asked.
    pub fn owed_child_clears(&self) -> Result<Vec<OwedClear>, StoreError> {
        let rows = self.sql.exec(
            "SELECT run_id, binding, name, attempts, next_at FROM agent_tool_child_clears ORDER BY next_at, run_id",
            &[],
        )?;
        Ok(rows
            .iter()
            .map(|r| OwedClear {
                run_id: r.text(0).unwrap_or_default(),
                binding: r.text(1).unwrap_or_default(),
                name: r.text(2).unwrap_or_default(),
                attempts: r.int(3).unwrap_or(0),
                next_at: r.int(4).unwrap_or(0),
            })
            .collect())
    }

    /// Puts owed clears back (after a wipe).
    pub fn restore_owed_child_clears(&self, owed: &[OwedClear]) -> Result<(), StoreError> {
        for o in owed {
            self.sql.exec(
                "INSERT OR REPLACE INTO agent_tool_child_clears (run_id, binding, name, attempts, next_at) \
                 VALUES (?, ?, ?, ?, ?)",
                &[
                    V::from(o.run_id.as_str()),
                    V::from(o.binding.as_str()),
                    V::from(o.name.as_str()),
                    V::Int(o.attempts),
                    V::Int(o.next_at),
                ],
            )?;
        }
        Ok(())
    }

    /// The child of `run_id` deleted its storage.
    pub fn child_cleared(&self, run_id: &str) -> Result<(), StoreError> {
        self.sql.exec("DELETE FROM agent_tool_child_clears WHERE run_id = ?", &[V::from(run_id)])?;
        Ok(())
    }

    /// The child (`binding`, `name`) of `run_id`, while it still owes a clear.
    pub fn child_clear_owed(&self, run_id: &str) -> Result<Option<(String, String)>, StoreError> {
        let row =
            self.sql.one("SELECT binding, name FROM agent_tool_child_clears WHERE run_id = ?", &[V::from(run_id)])?;
        Ok(row.map(|r| (r.text(0).unwrap_or_default(), r.text(1).unwrap_or_default())))
    }

    /// How many children still owe a clear.
    pub fn child_clears_pending(&self) -> Result<i64, StoreError> {
        let row = self.sql.one("SELECT COUNT(*) FROM agent_tool_child_clears", &[])?;
        Ok(row.and_then(|r| r.int(0)).unwrap_or(0))
    }

    /// Up to `limit` owed clears that are due, as `(run_id, binding, name, attempts)`, each
    /// counted as one more attempt and not due again before `retry_at`.
    pub fn child_clears_due(
        &self,
        now: i64,
        retry_at: i64,
        limit: usize,
    ) -> Result<Vec<(String, String, String, i64)>, StoreError> {
        let rows = self.sql.exec(
            "UPDATE agent_tool_child_clears SET attempts = attempts + 1, next_at = ?1 WHERE run_id IN \
             (SELECT run_id FROM agent_tool_child_clears WHERE next_at <= ?2 ORDER BY next_at LIMIT ?3) \
             RETURNING run_id, binding, name, attempts",
            &[V::Int(retry_at), V::Int(now), V::Int(limit as i64)],
        )?;
        Ok(rows
            .iter()
            .map(|r| {
                (
                    r.text(0).unwrap_or_default(),
                    r.text(1).unwrap_or_default(),
                    r.text(2).unwrap_or_default(),
                    r.int(3).unwrap_or(0),
                )
            })
            .collect())
    }
}

/// A clear a child still owes (see [`Registry::owed_child_clears`]).
#[derive(Debug, Clone, PartialEq)]
pub struct OwedClear {
    /// The run whose child it is.
    pub run_id: String,
    /// The child's binding.
    pub binding: String,
    /// The child's object name.
    pub name: String,
    /// Times asked so far.
    pub attempts: i64,
    /// When it is asked next (epoch ms).
    pub next_at: i64,
}
