//! The child's run rows and chunk log.
//!
//! A child keeps, per run: a row with its status and result, every chunk of its stream with an
//! index from 0 (progress excepted: only the latest snapshot is kept on the row), and its
//! milestones with a per-run sequence from 0. The run's chunks are the chat stream whose id is
//! the run id ([`StreamLog`]), so a drill-in client resumes from the same log a parent tails.

use serde::Serialize;
use serde_json::Value;

pub use crate::chat::store::StoredChunk;
use crate::chat::store::StreamLog;
use crate::protocol::child_api::InspectionReply;
use crate::protocol::child_api::RunInput;
use crate::protocol::outcome::{Outcome, RunStatus};
use crate::store::{Row, Sql, StoreError, Value as V};

/// The child's tables. Safe to run on every activation.
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS agent_tool_child_runs (
  run_id TEXT PRIMARY KEY,
  status TEXT NOT NULL,
  input_json TEXT,
  summary TEXT,
  output_json TEXT,
  error_message TEXT,
  started_at INTEGER NOT NULL,
  completed_at INTEGER,
  progress_json TEXT,
  last_signal_at INTEGER,
  event_delivery TEXT NOT NULL DEFAULT 'full',
  attempt INTEGER NOT NULL DEFAULT 1,
  attempt_start INTEGER NOT NULL DEFAULT 0,
  work_from INTEGER
);
CREATE TABLE IF NOT EXISTS agent_tool_child_messages (
  run_id TEXT NOT NULL,
  name TEXT NOT NULL,
  value_json TEXT NOT NULL,
  received_at INTEGER NOT NULL,
  PRIMARY KEY (run_id, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS agent_tool_child_milestones (
  run_id TEXT NOT NULL,
  sequence INTEGER NOT NULL,
  name TEXT NOT NULL,
  data_json TEXT,
  at INTEGER NOT NULL,
  PRIMARY KEY (run_id, sequence)
) WITHOUT ROWID;
";

/// The child role's tables (its runs and milestones, and the chat's), as
/// [`ChildRuns::migrate`] creates them on a new store.
pub const SCHEMAS: [&str; 2] = [SCHEMA, crate::chat::store::SCHEMA];

/// Columns added since the first schema.
const ADDED_COLUMNS: &[(&str, &str)] = &[
    ("attempt", "INTEGER NOT NULL DEFAULT 1"),
    ("attempt_start", "INTEGER NOT NULL DEFAULT 0"),
    ("work_from", "INTEGER"),
];

/// A child run row.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChildRun {
    /// Run id.
    pub run_id: String,
    /// Status.
    pub status: RunStatus,
    /// The input the parent sent.
    #[serde(skip)]
    pub input: Value,
    /// Summary (completed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Structured output (completed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// Error or abort reason.
    #[serde(rename = "error", skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    /// Epoch ms.
    pub started_at: i64,
    /// Epoch ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<i64>,
    /// Latest progress snapshot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<Value>,
    /// Last progress or milestone, epoch ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_signal_at: Option<i64>,
    /// Whether ordinary chunks are broadcast (`full`) or only kept (`terminal`).
    #[serde(skip)]
    pub terminal_only: bool,
    /// The attempt under way or last made (from 1; a rerun after a restart adds one).
    pub attempt: i64,
    /// The log index where the current attempt's chunks begin.
    #[serde(skip)]
    pub attempt_start: i64,
    /// The log index where the work of the run's recovery begins: the first chunk after the
    /// marker of its first re-run since it was dispatched (`None` while no restart cut it
    /// short). What it streams from there is measured against
    /// [`crate::AgentToolOptions::max_recovery_work`].
    #[serde(skip)]
    pub work_from: Option<i64>,
}

crate::store::columns!(mod col {
    run_id, status, input_json, summary, output_json, error_message,
    started_at, completed_at, progress_json, last_signal_at, event_delivery, attempt,
    attempt_start, work_from,
});
use col::LIST as COLUMNS;

impl ChildRun {
    fn from_row(r: &Row) -> Self {
        let json = |i| r.text(i).and_then(|s| serde_json::from_str(&s).ok());
        Self {
            run_id: r.text(col::run_id).unwrap_or_default(),
            // A spelling no version wrote reads as a failed run, never as a live one.
            status: r.text(col::status).and_then(|s| RunStatus::parse(&s)).unwrap_or(RunStatus::Error),
            input: json(col::input_json).unwrap_or(Value::Null),
            summary: r.text(col::summary),
            output: json(col::output_json),
            error_message: r.text(col::error_message),
            started_at: r.int(col::started_at).unwrap_or(0),
            completed_at: r.int(col::completed_at),
            progress: json(col::progress_json),
            last_signal_at: r.int(col::last_signal_at),
            terminal_only: r.text(col::event_delivery).as_deref() == Some("terminal"),
            attempt: r.int(col::attempt).unwrap_or(1),
            attempt_start: r.int(col::attempt_start).unwrap_or(0),
            work_from: r.int(col::work_from),
        }
    }

    /// The outcome, for a run that ended. A child's `interrupted` is a turn it sealed: it is
    /// not running it.
    pub fn outcome(&self) -> Option<Outcome> {
        Outcome::from_parts(
            self.status,
            self.summary.clone(),
            self.output.clone(),
            self.error_message.clone(),
            None,
            Some(false),
        )
    }

    /// What the parent's inspection reads of the run.
    pub fn reply(&self, chunk_count: i64) -> InspectionReply {
        InspectionReply {
            status: self.status,
            outcome: self.outcome(),
            attempt: Some(self.attempt),
            progress: self.progress.clone(),
            chunk_count: Some(chunk_count),
        }
    }
}

/// One milestone, as the child keeps it (read by tests: the parent keeps its own).
#[cfg(all(test, not(target_arch = "wasm32")))]
#[derive(Debug, Clone, PartialEq)]
pub struct Milestone {
    /// Per-run sequence from 0.
    pub sequence: i64,
    /// Name.
    pub name: String,
    /// Payload.
    pub data: Option<Value>,
    /// Epoch ms.
    pub at: i64,
}

/// The child run store over any [`Sql`].
pub struct ChildRuns<'a, S: Sql + ?Sized> {
    sql: &'a S,
}

impl<'a, S: Sql + ?Sized> ChildRuns<'a, S> {
    /// A store over `sql`; call [`ChildRuns::migrate`] once per activation.
    pub fn new(sql: &'a S) -> Self {
        Self { sql }
    }

    /// Creates the tables (and the chat stream log's) if missing, and adds the columns later
    /// versions introduced.
    pub fn migrate(&self) -> Result<(), StoreError> {
        self.sql.batch(SCHEMA)?;
        crate::store::ensure_columns(self.sql, "agent_tool_child_runs", ADDED_COLUMNS)?;
        // Columns added since: on a table made by an earlier version first.
        if crate::store::has_table(self.sql, "chat_turns")? {
            crate::store::ensure_columns(self.sql, "chat_turns", crate::chat::store::ADDED_COLUMNS)?;
        }
        self.sql.batch(crate::chat::store::SCHEMA)
    }

    /// Starts the run's next attempt, whose chunks begin at log index `start`: the row is
    /// `running` again with no outcome, and its recovery's work is measured from `work_from`.
    /// Returns the attempt's number.
    pub fn begin_attempt(&self, run_id: &str, start: i64, work_from: Option<i64>) -> Result<i64, StoreError> {
        let row = self.sql.one(
            "UPDATE agent_tool_child_runs SET status = 'running', attempt = attempt + 1, attempt_start = ?, \
             work_from = ?, summary = NULL, output_json = NULL, error_message = NULL, completed_at = NULL \
             WHERE run_id = ? RETURNING attempt",
            &[V::Int(start), work_from.map_or(V::Null, V::Int), V::from(run_id)],
        )?;
        row.and_then(|r| r.int(0)).ok_or_else(|| StoreError { message: format!("child run {run_id} vanished") })
    }

    /// Creates the run, or returns the existing one. The flag says whether it was created: only
    /// then may the caller begin a turn, so a repeated start never runs the model twice.
    pub fn start(
        &self,
        run_id: &str,
        input: &RunInput,
        terminal_only: bool,
        now: i64,
    ) -> Result<(ChildRun, bool), StoreError> {
        let created = self.sql.one(
            &format!(
                "INSERT INTO agent_tool_child_runs (run_id, status, input_json, started_at, event_delivery) \
                 VALUES (?, 'starting', ?, ?, ?) ON CONFLICT (run_id) DO NOTHING RETURNING {COLUMNS}"
            ),
            &[
                V::from(run_id),
                V::from(input.as_str()),
                V::Int(now),
                V::from(if terminal_only { "terminal" } else { "full" }),
            ],
        )?;
        if let Some(row) = created {
            return Ok((ChildRun::from_row(&row), true));
        }
        let run = self.get(run_id)?.ok_or_else(|| StoreError { message: format!("child run {run_id} vanished") })?;
        Ok((run, false))
    }

    /// Keeps the message `name` its parent sent run `run_id` (the first one of a name stays):
    /// `true` when it was new.
    pub fn put_message(&self, run_id: &str, name: &str, value: &Value, now: i64) -> Result<bool, StoreError> {
        let rows = self.sql.exec(
            "INSERT INTO agent_tool_child_messages (run_id, name, value_json, received_at) VALUES (?, ?, ?, ?) \
             ON CONFLICT (run_id, name) DO NOTHING RETURNING 1",
            &[V::from(run_id), V::from(name), V::from(value.to_string()), V::Int(now)],
        )?;
        Ok(!rows.is_empty())
    }

    /// The message `name` of run `run_id`, once its parent sent it.
    pub fn message(&self, run_id: &str, name: &str) -> Result<Option<Value>, StoreError> {
        let row = self.sql.one(
            "SELECT value_json FROM agent_tool_child_messages WHERE run_id = ? AND name = ?",
            &[V::from(run_id), V::from(name)],
        )?;
        Ok(row.and_then(|r| serde_json::from_str(&r.text(0)?).ok()))
    }

    /// Whether this object ran any agent-tool run (it serves as a sub-agent).
    pub fn any(&self) -> Result<bool, StoreError> {
        Ok(self.sql.one("SELECT 1 FROM agent_tool_child_runs LIMIT 1", &[])?.is_some())
    }

    /// The run `run_id`, if it exists.
    pub fn get(&self, run_id: &str) -> Result<Option<ChildRun>, StoreError> {
        let row = self
            .sql
            .one(&format!("SELECT {COLUMNS} FROM agent_tool_child_runs WHERE run_id = ?"), &[V::from(run_id)])?;
        Ok(row.as_ref().map(ChildRun::from_row))
    }

    /// `starting` → `running`.
    pub fn mark_running(&self, run_id: &str) -> Result<bool, StoreError> {
        let rows = self.sql.exec(
            "UPDATE agent_tool_child_runs SET status = 'running' WHERE run_id = ? AND status = 'starting' RETURNING 1",
            &[V::from(run_id)],
        )?;
        Ok(!rows.is_empty())
    }

    /// The index the next stored chunk takes.
    pub fn next_index(&self, run_id: &str) -> Result<i64, StoreError> {
        StreamLog::new(self.sql).next_index(run_id)
    }

    /// Stored chunks with an index greater than `after`, in order, at most `limit`.
    pub fn chunks_after(&self, run_id: &str, after: i64, limit: usize) -> Result<Vec<StoredChunk>, StoreError> {
        // A limit past `i64` (`usize::MAX`, natively) means "all" (see `page_after`); in a
        // Worker a `usize` is 32 bits, so any limit is a number JavaScript holds exactly.
        let limit = i64::try_from(limit).unwrap_or(-1);
        StreamLog::new(self.sql).page_after(run_id, after, limit)
    }

    /// The names of the milestones in the run's log (those its tails and replays carry), in
    /// order.
    pub fn logged_milestones(&self, run_id: &str) -> Result<Vec<String>, StoreError> {
        let rows = self.sql.exec(
            "SELECT json_extract(body, '$.data.name') FROM chat_stream_chunks \
             WHERE stream_id = ? AND kind = 'milestone' ORDER BY idx",
            &[V::from(run_id)],
        )?;
        Ok(rows.iter().filter_map(|r| r.text(0)).collect())
    }

    /// Records the outcome unless the run already ended. Returns whether it was written.
    pub fn finish(&self, run_id: &str, outcome: &Outcome, now: i64) -> Result<bool, StoreError> {
        let rows = self.sql.exec(
            "UPDATE agent_tool_child_runs SET status = ?, summary = ?, output_json = ?, error_message = ?, \
             completed_at = ? WHERE run_id = ? AND status IN ('starting','running') RETURNING 1",
            &[
                V::from(outcome.status().as_str()),
                V::from(outcome.summary()),
                V::from(outcome.output().map(Value::to_string)),
                V::from(outcome.error()),
                V::Int(now),
                V::from(run_id),
            ],
        )?;
        Ok(!rows.is_empty())
    }

    /// Stores the latest progress snapshot.
    pub fn record_progress(&self, run_id: &str, snapshot: &Value, now: i64) -> Result<(), StoreError> {
        self.sql.exec(
            "UPDATE agent_tool_child_runs SET progress_json = ?, last_signal_at = ? WHERE run_id = ?",
            &[V::from(snapshot.to_string()), V::Int(now), V::from(run_id)],
        )?;
        Ok(())
    }

    /// Adds a milestone with the next per-run sequence and returns it.
    pub fn add_milestone(&self, run_id: &str, name: &str, data: Option<&Value>, at: i64) -> Result<i64, StoreError> {
        let row = self.sql.one(
            "INSERT INTO agent_tool_child_milestones (run_id, sequence, name, data_json, at) \
             SELECT ?, COALESCE(MAX(sequence) + 1, 0), ?, ?, ? FROM agent_tool_child_milestones WHERE run_id = ? \
             RETURNING sequence",
            &[V::from(run_id), V::from(name), V::from(data.map(Value::to_string)), V::Int(at), V::from(run_id)],
        )?;
        self.sql.exec(
            "UPDATE agent_tool_child_runs SET last_signal_at = ? WHERE run_id = ?",
            &[V::Int(at), V::from(run_id)],
        )?;
        row.and_then(|r| r.int(0)).ok_or_else(|| StoreError { message: "milestone insert returned nothing".into() })
    }

    /// The run's milestones, by sequence.
    #[cfg(all(test, not(target_arch = "wasm32")))]
    pub fn milestones(&self, run_id: &str) -> Result<Vec<Milestone>, StoreError> {
        let rows = self.sql.exec(
            "SELECT sequence, name, data_json, at FROM agent_tool_child_milestones WHERE run_id = ? ORDER BY sequence",
            &[V::from(run_id)],
        )?;
        Ok(rows
            .iter()
            .map(|r| Milestone {
                sequence: r.int(0).unwrap_or(0),
                name: r.text(1).unwrap_or_default(),
                data: r.text(2).and_then(|s| serde_json::from_str(&s).ok()),
                at: r.int(3).unwrap_or(0),
            })
            .collect())
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::protocol::tail::ChunkKind;
    use crate::store::sqlite;
    use serde_json::json;

    fn db() -> rusqlite::Connection {
        let db = sqlite::memory();
        ChildRuns::new(&db).migrate().unwrap();
        db
    }

    #[test]
    fn start_is_idempotent() {
        let db = db();
        let runs = ChildRuns::new(&db);
        let (run, created) = runs.start("r", &json!({"query": "x"}).into(), false, 10).unwrap();
        assert!(created);
        assert_eq!(run.status, RunStatus::Starting);
        assert_eq!(run.input, json!({"query": "x"}));
        let (again, created) = runs.start("r", &json!({"query": "other"}).into(), false, 20).unwrap();
        assert!(!created, "a second start must not begin a second turn");
        assert_eq!(again.input, json!({"query": "x"}));
        assert_eq!(again.started_at, 10);
    }

    #[test]
    fn inspect_is_none_for_an_unknown_run() {
        let db = db();
        assert_eq!(ChildRuns::new(&db).get("nope").unwrap(), None);
    }

    #[test]
    fn log_reads_after_a_cursor() {
        let db = db();
        let runs = ChildRuns::new(&db);
        runs.start("r", &json!("q").into(), false, 1).unwrap();
        for i in 0..5 {
            let kind = if i == 3 { ChunkKind::Milestone } else { ChunkKind::Stored };
            StreamLog::new(&db).append("r", i, kind, &format!("{{\"n\":{i}}}")).unwrap();
        }
        assert_eq!(runs.next_index("r").unwrap(), 5);
        let after = runs.chunks_after("r", 2, usize::MAX).unwrap();
        assert_eq!(after.iter().map(|c| c.index).collect::<Vec<_>>(), vec![3, 4]);
        assert_eq!(after[0].kind, ChunkKind::Milestone);
        assert_eq!(runs.chunks_after("r", -1, usize::MAX).unwrap().len(), 5);
        // Re-appending an index is ignored, never a duplicate.
        StreamLog::new(&db).append("r", 4, ChunkKind::Stored, "{\"dup\":1}").unwrap();
        assert_eq!(runs.chunks_after("r", 3, usize::MAX).unwrap()[0].body, "{\"n\":4}");
    }

    #[test]
    fn finish_once() {
        let db = db();
        let runs = ChildRuns::new(&db);
        runs.start("r", &json!("q").into(), false, 1).unwrap();
        runs.mark_running("r").unwrap();
        let done = Outcome::completed_with("s", json!({"k": 1}));
        assert!(runs.finish("r", &done, 5).unwrap());
        let abort = Outcome::aborted(Some("x".into()));
        assert!(!runs.finish("r", &abort, 6).unwrap());
        let run = runs.get("r").unwrap().unwrap();
        assert_eq!(run.outcome(), Some(done));
        assert_eq!(run.completed_at, Some(5));
    }

    #[test]
    fn milestones_are_sequenced_from_zero() {
        // parity: 87
        let db = db();
        let runs = ChildRuns::new(&db);
        runs.start("r", &json!("q").into(), false, 1).unwrap();
        assert_eq!(runs.add_milestone("r", "a", None, 2).unwrap(), 0);
        assert_eq!(runs.add_milestone("r", "b", Some(&json!({"n": 2})), 3).unwrap(), 1);
        runs.record_progress("r", &json!({"fraction": 0.5}), 4).unwrap();
        let milestones = runs.milestones("r").unwrap();
        assert_eq!(milestones.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(), vec!["a", "b"]);
        assert_eq!(milestones[1].data, Some(json!({"n": 2})));
        let run = runs.get("r").unwrap().unwrap();
        assert_eq!(run.progress, Some(json!({"fraction": 0.5})));
        assert_eq!(run.last_signal_at, Some(4));
    }

    /// A message a parent sends a run is kept once by name: the first is stored (and said to
    /// be new, the child's `stored` answer), a second of the same name is not and changes nothing.
    #[test]
    fn a_message_is_kept_once_by_name() {
        let db = db();
        let runs = ChildRuns::new(&db);
        assert!(runs.put_message("r", "approval", &json!({"ok": true}), 1).unwrap());
        assert!(!runs.put_message("r", "approval", &json!({"ok": false}), 2).unwrap());
        assert!(runs.put_message("r", "other", &json!(1), 3).unwrap());
        assert_eq!(runs.message("r", "approval").unwrap(), Some(json!({"ok": true})));
        assert_eq!(runs.message("r", "missing").unwrap(), None);
    }
}
