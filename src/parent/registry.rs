//! The parent's run registry: one SQL row per child run, its frames, and the state machine.
//!
//! ```text
//! starting ──► running ──► completed | error | aborted      (hard: never overwritten)
//!     │            │
//!     └────────────┴─────► interrupted                        (soft: a real result repairs it)
//! ```
//!
//! Every frame a run ever sends has a sequence drawn from the row's `next_seq`, and every frame
//! a client may need again (started, stored chunks, milestones, the latest progress, the
//! terminal frame) is kept here, so replay is two queries and never calls a child.

mod record;
mod replay;
mod retention;

use serde_json::Value;

use crate::types::{Milestone, ProgressSnapshot, RunInspection, RunStatus};
pub use record::{NewRun, RunRecord};
pub use replay::ReplayCursor;

use crate::protocol::tail::ChunkKind;
use crate::protocol::{AgentToolEvent, EventFrame, InterruptedReason, Outcome, StoredEvent};
use crate::store::{Sql, StoreError, Value as V};
use record::COLUMNS;

/// The registry's tables. Safe to run on every activation.
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS agent_tool_runs (
  run_id TEXT PRIMARY KEY,
  parent_tool_call_id TEXT,
  agent_type TEXT NOT NULL,
  input_preview TEXT,
  status TEXT NOT NULL,
  summary TEXT,
  output_json TEXT,
  error_message TEXT,
  interrupted_reason TEXT,
  child_still_running INTEGER,
  display_json TEXT,
  display_order INTEGER NOT NULL DEFAULT 0,
  started_at INTEGER NOT NULL,
  completed_at INTEGER,
  detached INTEGER NOT NULL DEFAULT 0,
  on_finish TEXT,
  notify_source TEXT,
  on_milestones_json TEXT,
  max_budget_at INTEGER,
  no_progress_budget_ms INTEGER,
  last_signal_at INTEGER,
  finish_claimed_at INTEGER,
  finish_delivered_at INTEGER,
  finish_attempts INTEGER NOT NULL DEFAULT 0,
  give_up_claimed_at INTEGER,
  give_up_delivered_at INTEGER,
  give_up_attempts INTEGER NOT NULL DEFAULT 0,
  event_delivery TEXT NOT NULL DEFAULT 'full',
  next_seq INTEGER NOT NULL DEFAULT 1,
  child_cursor INTEGER NOT NULL DEFAULT -1,
  terminal_seq INTEGER,
  progress_json TEXT,
  progress_seq INTEGER,
  child_binding TEXT NOT NULL DEFAULT '',
  finish_hook_at INTEGER,
  finish_hook_done_at INTEGER,
  notify INTEGER NOT NULL DEFAULT 0,
  input_json TEXT,
  reruns INTEGER NOT NULL DEFAULT 0,
  started_seq INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS agent_tool_messages (
  run_id TEXT NOT NULL,
  name TEXT NOT NULL,
  value_json TEXT NOT NULL,
  sent_at INTEGER NOT NULL,
  delivered_at INTEGER,
  PRIMARY KEY (run_id, name)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS agent_tool_runs_by_call
  ON agent_tool_runs (parent_tool_call_id, display_order);
CREATE INDEX IF NOT EXISTS agent_tool_runs_by_status ON agent_tool_runs (status);
CREATE INDEX IF NOT EXISTS agent_tool_runs_finished
  ON agent_tool_runs (completed_at, run_id) WHERE status NOT IN ('starting', 'running');
CREATE TABLE IF NOT EXISTS agent_tool_tombstones (
  run_id TEXT PRIMARY KEY,
  next_seq INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS agent_tool_child_clears (
  run_id TEXT PRIMARY KEY,
  binding TEXT NOT NULL,
  name TEXT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0,
  next_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS agent_tool_frames (
  run_id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  body TEXT NOT NULL,
  event INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
";

/// Columns added since the first schema, with their definitions.
const ADDED_COLUMNS: &[(&str, &str)] = &[
    ("child_binding", "TEXT NOT NULL DEFAULT ''"),
    ("finish_hook_at", "INTEGER"),
    ("notify", "INTEGER NOT NULL DEFAULT 0"),
    ("input_json", "TEXT"),
    ("reruns", "INTEGER NOT NULL DEFAULT 0"),
    ("started_seq", "INTEGER NOT NULL DEFAULT 0"),
    ("finish_hook_done_at", "INTEGER"),
];

/// How many deleted run ids keep their sequence high-water mark (a cleared id dispatched
/// again continues its numbering); older ones start again at 0, which only a client that kept
/// that old run in memory all along could notice.
pub const MAX_TOMBSTONES: usize = 10_000;

/// Runs read per page of a replay.
pub const REPLAY_PAGE_RUNS: usize = 64;
/// Frames read per page of one run's replay.
pub const REPLAY_PAGE_FRAMES: usize = 512;

/// Registry failures.
#[derive(Debug, Clone, PartialEq)]
pub enum RegistryError {
    /// The database failed.
    Store(StoreError),
    /// The run id exists for another child class.
    AgentTypeMismatch {
        /// The run id.
        run_id: String,
        /// The class it belongs to.
        existing: String,
        /// The class that was asked for.
        requested: String,
    },
}

impl std::fmt::Display for RegistryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Store(e) => e.fmt(f),
            // The words of the refusal a dispatch gets for it, written once.
            Self::AgentTypeMismatch { run_id, existing, requested } => crate::error::Refused::OtherClass {
                run_id: run_id.clone(),
                existing: existing.clone(),
                requested: requested.clone(),
            }
            .fmt(f),
        }
    }
}

impl std::error::Error for RegistryError {}

impl From<StoreError> for RegistryError {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

/// The result of [`Registry::insert`].
#[derive(Debug, Clone, PartialEq)]
pub enum Inserted {
    /// A new row, status `starting`.
    New(RunRecord),
    /// The run id was already known; nothing was written.
    Existing(RunRecord),
}

/// One chunk to forward: its kind, its index in the child's log, its body.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Forward<'b> {
    /// How the chunk is kept.
    pub kind: ChunkKind,
    /// The UIMessageChunk JSON.
    pub body: &'b str,
    /// What to keep for replay instead of `body` (progress whose `data` is live-only).
    pub replay: Option<&'b str>,
}

/// The default input preview: a string's first 500 characters; any other input as JSON, cut
/// to 497 characters plus `...` when longer than 500; nothing for `null`.
pub fn input_preview(input: &Value) -> Option<String> {
    const MAX: usize = 500;
    match input {
        Value::Null => None,
        Value::String(s) => Some(s.chars().take(MAX).collect()),
        other => {
            let json = other.to_string();
            if json.chars().count() > MAX {
                let mut cut: String = json.chars().take(MAX - 3).collect();
                cut.push_str("...");
                Some(cut)
            } else {
                Some(json)
            }
        }
    }
}

/// The run registry over any [`Sql`].
pub struct Registry<'a, S: Sql + ?Sized> {
    sql: &'a S,
}

const LIVE_STATUSES: &str = "('starting','running')";
const HARD_TERMINALS: &str = "('completed','error','aborted')";
/// Frames written by one `INSERT`: the run id, then two parameters per frame, under the Durable
/// Object SQL limit of 100 bound parameters per statement.
const FRAMES_PER_INSERT: usize = 49;

/// Whether a batch's milestone replaces the progress kept (`?9`: it comes after the batch's own
/// progress; `?10`: its time, when it has one, not before the kept progress's).
const SUPERSEDES: &str = "(?9 AND (progress_json IS NULL OR ?10 IS NULL \
     OR ?10 >= COALESCE(json_extract(progress_json, '$.data.at'), 0)))";

impl<'a, S: Sql + ?Sized> Registry<'a, S> {
    /// A registry over `sql`; call [`Registry::migrate`] once per activation.
    pub fn new(sql: &'a S) -> Self {
        Self { sql }
    }

    /// Creates the tables if missing, and adds the columns later versions introduced to a
    /// table an earlier version created (a deploy keeps the rows).
    pub fn migrate(&self) -> Result<(), StoreError> {
        self.sql.batch(SCHEMA)?;
        crate::store::ensure_columns(self.sql, "agent_tool_runs", ADDED_COLUMNS)?;
        crate::store::ensure_columns(self.sql, "agent_tool_frames", &[("event", "INTEGER NOT NULL DEFAULT 0")])
    }

    /// Inserts a `starting` row, or returns the existing row for this run id. A run id that
    /// belongs to another child class is refused.
    pub fn insert(&self, run: &NewRun, now: i64) -> Result<Inserted, RegistryError> {
        // A cleared run id that is dispatched again continues its old numbering, its `started`
        // frame included: a client that saw the old frames must not take the new ones for them.
        let written = self.sql.one(
            &format!(
                "INSERT INTO agent_tool_runs (run_id, parent_tool_call_id, agent_type, input_preview, \
                 status, display_json, display_order, started_at, event_delivery, child_binding, input_json, \
                 started_seq, next_seq) \
                 VALUES (?, ?, ?, ?, 'starting', ?, ?, ?, ?, ?, ?, \
                   COALESCE((SELECT next_seq FROM agent_tool_tombstones WHERE run_id = ?1), 0), \
                   COALESCE((SELECT next_seq FROM agent_tool_tombstones WHERE run_id = ?1), 0) + 1) \
                 ON CONFLICT (run_id) DO NOTHING RETURNING {COLUMNS}"
            ),
            &[
                V::from(&run.run_id),
                V::from(run.parent_tool_call_id.clone()),
                V::from(&run.agent_type),
                V::from(run.input_preview.clone()),
                V::from(run.display.as_ref().map(Value::to_string)),
                V::Int(run.display_order),
                V::Int(now),
                V::from(run.event_delivery.as_str()),
                V::from(&run.binding),
                V::from(run.input.as_str()),
            ],
        )?;
        if let Some(row) = written {
            return Ok(Inserted::New(RunRecord::from_row(&row)));
        }
        let record = self
            .get(&run.run_id)?
            .ok_or_else(|| StoreError { message: format!("run {} vanished right after insert", run.run_id) })?;
        if record.agent_type != run.agent_type {
            return Err(RegistryError::AgentTypeMismatch {
                run_id: run.run_id.clone(),
                existing: record.agent_type,
                requested: run.agent_type.clone(),
            });
        }
        Ok(Inserted::Existing(record))
    }

    /// One run, if known.
    pub fn get(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        let row =
            self.sql.one(&format!("SELECT {COLUMNS} FROM agent_tool_runs WHERE run_id = ?"), &[V::from(run_id)])?;
        Ok(row.as_ref().map(RunRecord::from_row))
    }

    /// Every run, in display order: oldest first, then sibling order, then id.
    pub fn all(&self) -> Result<Vec<RunRecord>, StoreError> {
        let rows = self
            .sql
            .exec(&format!("SELECT {COLUMNS} FROM agent_tool_runs ORDER BY started_at, display_order, run_id"), &[])?;
        Ok(rows.iter().map(RunRecord::from_row).collect())
    }

    /// Whether `run_id` is a known run of `agent_type` (the default drill-in gate).
    pub fn has_run(&self, agent_type: &str, run_id: &str) -> Result<bool, StoreError> {
        Ok(self
            .sql
            .one(
                "SELECT 1 FROM agent_tool_runs WHERE run_id = ? AND agent_type = ?",
                &[V::from(run_id), V::from(agent_type)],
            )?
            .is_some())
    }

    /// Runs given up on while their child still ran (`interrupted`, `child_still_running`),
    /// within `window_ms` of the give-up: the backbone keeps inspecting them for a late result.
    pub fn watched(&self, now: i64, window_ms: i64) -> Result<Vec<RunRecord>, StoreError> {
        let rows = self.sql.exec(
            &format!(
                "SELECT {COLUMNS} FROM agent_tool_runs WHERE status = 'interrupted' AND child_still_running = 1 \
                 AND completed_at > ? ORDER BY completed_at"
            ),
            &[V::Int(now.saturating_sub(window_ms))],
        )?;
        Ok(rows.iter().map(RunRecord::from_row).collect())
    }

    /// Runs that hold a concurrency slot (`starting` or `running`).
    pub fn live_count(&self) -> Result<i64, StoreError> {
        let row =
            self.sql.one(&format!("SELECT COUNT(*) FROM agent_tool_runs WHERE status IN {LIVE_STATUSES}"), &[])?;
        Ok(row.and_then(|r| r.int(0)).unwrap_or(0))
    }

    /// `interrupted` → `running`: a re-attach repairs a soft terminal (its reason fields are
    /// cleared). Its `interrupted` frame is kept for replay at the sequence it was sent with, so
    /// a client that connects later goes through the same states as one that saw it live (the
    /// stock reducer keeps an interruption's `reason` after a later `finished`). Returns whether
    /// it changed.
    pub fn reattach(&self, run_id: &str) -> Result<bool, StoreError> {
        let Some(record) = self.get(run_id)? else { return Ok(false) };
        if record.status != RunStatus::Interrupted {
            return Ok(false);
        }
        self.keep_terminal_frame(&record)?;
        let rows = self.sql.exec(
            "UPDATE agent_tool_runs SET status = 'running', interrupted_reason = NULL, child_still_running = NULL, \
             error_message = NULL, terminal_seq = NULL, completed_at = NULL \
             WHERE run_id = ? AND status = 'interrupted' RETURNING 1",
            &[V::from(run_id)],
        )?;
        Ok(!rows.is_empty())
    }

    /// Keeps a soft terminal's frame (`interrupted`, which a later terminal or a re-attach
    /// replaces in the row) among the frames, replayed at the sequence it was sent with.
    fn keep_terminal_frame(&self, record: &RunRecord) -> Result<(), StoreError> {
        if let Some(frame) = record.terminal_frame() {
            let event = serde_json::to_string(&frame.event).unwrap_or_default();
            self.sql.exec(
                "INSERT OR IGNORE INTO agent_tool_frames (run_id, seq, body, event) VALUES (?, ?, ?, 1)",
                &[V::from(record.run_id.as_str()), V::Int(frame.sequence), V::from(event)],
            )?;
        }
        Ok(())
    }

    /// The finish hook of `run_id` returned: a restart does not call it again.
    pub fn finish_hook_returned(&self, run_id: &str, now: i64) -> Result<(), StoreError> {
        self.sql.exec(
            "UPDATE agent_tool_runs SET finish_hook_done_at = ? WHERE run_id = ? AND finish_hook_done_at IS NULL",
            &[V::Int(now), V::from(run_id)],
        )?;
        Ok(())
    }

    /// Ended runs whose finish hook was claimed but never returned (the object died first):
    /// a fresh instance calls them again.
    pub fn finish_hooks_owed(&self) -> Result<Vec<RunRecord>, StoreError> {
        let rows = self.sql.exec(
            &format!(
                "SELECT {COLUMNS} FROM agent_tool_runs WHERE finish_hook_at IS NOT NULL \
                 AND finish_hook_done_at IS NULL AND status NOT IN ('starting', 'running') ORDER BY finish_hook_at, run_id"
            ),
            &[],
        )?;
        Ok(rows.iter().map(RunRecord::from_row).collect())
    }

    /// Claims the `on_agent_tool_finish` call of a run, awaited or detached: `true` for the
    /// first caller only (a repaired `interrupted` run, a retried delivery, do not fire it again;
    /// a restart before it returned calls it again, see [`Registry::finish_hooks_owed`]).
    pub fn claim_finish_hook(&self, run_id: &str, now: i64) -> Result<bool, StoreError> {
        let rows = self.sql.exec(
            "UPDATE agent_tool_runs SET finish_hook_at = ? WHERE run_id = ? AND finish_hook_at IS NULL RETURNING 1",
            &[V::Int(now), V::from(run_id)],
        )?;
        Ok(!rows.is_empty())
    }

    /// `starting` → `running` once the child accepted the run. Returns whether it changed.
    pub fn mark_running(&self, run_id: &str) -> Result<bool, StoreError> {
        let rows = self.sql.exec(
            "UPDATE agent_tool_runs SET status = 'running' WHERE run_id = ? AND status = 'starting' RETURNING 1",
            &[V::from(run_id)],
        )?;
        Ok(!rows.is_empty())
    }

    /// Records forwarded chunks of a live run and hands out their sequences, in order.
    ///
    /// Stored chunks and milestones are kept for replay; progress replaces the run's latest
    /// snapshot. `cursor`, when given, is the child log index of the last chunk read (also for
    /// chunks not forwarded under [`EventDelivery::Terminal`]). Returns `None`, writing nothing,
    /// when the run is not live (a late chunk after a cancel, say).
    pub fn append(
        &self,
        run_id: &str,
        chunks: &[Forward<'_>],
        cursor: Option<i64>,
        now: i64,
    ) -> Result<Option<Vec<i64>>, StoreError> {
        let n = chunks.len() as i64;
        let signalled = chunks.iter().any(|c| matches!(c.kind, ChunkKind::Progress | ChunkKind::Milestone));
        let reruns = chunks.iter().filter(|c| c.kind == ChunkKind::Superseded).count() as i64;
        // Only the latest progress of a batch is kept, at its offset in the batch; a milestone
        // after it replaces it as the latest signal (the stock reducer stamps a replayed
        // progress with the client's clock, so a progress replayed before a milestone would
        // win over it on a reloaded page while live clients show the milestone).
        let last_progress = chunks.iter().rposition(|c| c.kind == ChunkKind::Progress);
        let last_milestone = chunks.iter().rposition(|c| c.kind == ChunkKind::Milestone);
        let superseded = last_milestone.is_some_and(|m| last_progress.is_none_or(|p| m > p));
        // ... unless the milestone is older than the progress kept (reported earlier by the
        // child, delivered later: a re-tail after an inspection adopted the newer progress),
        // which live clients keep too.
        let milestone_at = last_milestone.and_then(|m| {
            let body: serde_json::Value = serde_json::from_str(chunks[m].body).ok()?;
            body["data"]["at"].as_i64()
        });
        let progress = last_progress
            .filter(|_| !superseded)
            .map(|offset| (offset as i64, chunks[offset].replay.unwrap_or(chunks[offset].body)));
        // One statement: the sequences, the cursor, the signal time and the progress snapshot
        // (`next_seq` on the right is the value before the update, the batch's first sequence).
        let row = self.sql.one(
            &format!(
                "UPDATE agent_tool_runs SET next_seq = next_seq + ?1, \
                 child_cursor = MAX(child_cursor, ?2), \
                 last_signal_at = CASE WHEN ?3 THEN ?4 ELSE last_signal_at END, \
                 progress_json = CASE WHEN {SUPERSEDES} THEN NULL ELSE COALESCE(?6, progress_json) END, \
                 progress_seq = CASE WHEN {SUPERSEDES} THEN NULL WHEN ?6 IS NULL THEN progress_seq \
                                ELSE next_seq + ?7 END, \
                 reruns = reruns + ?8 \
                 WHERE run_id = ?5 AND status IN {LIVE_STATUSES} RETURNING next_seq - ?1"
            ),
            &[
                V::Int(n),
                V::Int(cursor.unwrap_or(-1)),
                V::from(signalled),
                V::Int(now),
                V::from(run_id),
                V::from(progress.map(|(_, body)| body)),
                V::Int(progress.map_or(0, |(offset, _)| offset)),
                V::Int(reruns),
                V::from(superseded),
                V::from(milestone_at),
            ],
        )?;
        let Some(first) = row.and_then(|r| r.int(0)) else { return Ok(None) };
        let seqs: Vec<i64> = (first..first + n).collect();
        let kept: Vec<(i64, &str)> = seqs
            .iter()
            .zip(chunks)
            .filter(|(_, c)| c.kind != ChunkKind::Progress)
            .map(|(&seq, c)| (seq, c.body))
            .collect();
        // Several rows per statement, the run id bound once, within SQLite's parameter limit.
        for rows in kept.chunks(FRAMES_PER_INSERT) {
            let values: Vec<String> =
                (0..rows.len()).map(|i| format!("(?1, ?{}, ?{})", 2 + 2 * i, 3 + 2 * i)).collect();
            let sql =
                format!("INSERT OR IGNORE INTO agent_tool_frames (run_id, seq, body) VALUES {}", values.join(", "));
            let mut params = vec![V::from(run_id)];
            params.extend(rows.iter().flat_map(|&(seq, body)| [V::Int(seq), V::from(body)]));
            self.sql.exec(&sql, &params)?;
        }
        Ok(Some(seqs))
    }

    /// Records a terminal result unless the run already has a hard terminal (an `interrupted`
    /// one it replaces stays among the frames, see [`Registry::reattach`]). Returns the
    /// updated row when it was written (its `terminal_seq` names the terminal frame), `None`
    /// when the row was already final or is unknown.
    pub fn finish(&self, run_id: &str, terminal: &Outcome, now: i64) -> Result<Option<RunRecord>, StoreError> {
        let interrupted = self.sql.one(
            &format!("SELECT {COLUMNS} FROM agent_tool_runs WHERE run_id = ? AND status = 'interrupted'"),
            &[V::from(run_id)],
        )?;
        if let Some(record) = interrupted.as_ref().map(RunRecord::from_row) {
            // Its clients saw the interruption: a late client must too, before what replaces it.
            self.keep_terminal_frame(&record)?;
        }
        let (summary, output, error, reason, still_running) = match terminal {
            Outcome::Completed { summary, output } => {
                (Some(summary.clone()), output.as_ref().map(Value::to_string), None, None, None)
            }
            Outcome::Error { error: message } => (None, None, Some(message.clone()), None, None),
            Outcome::Aborted { reason } => (None, None, reason.clone(), None, None),
            Outcome::Interrupted { error, reason, child_still_running } => {
                (None, None, Some(error.clone()), reason.map(InterruptedReason::as_str), *child_still_running)
            }
        };
        let row = self.sql.one(
            &format!(
                "UPDATE agent_tool_runs SET status = ?, summary = ?, output_json = ?, error_message = ?, \
                 interrupted_reason = ?, child_still_running = ?, completed_at = ?, \
                 terminal_seq = next_seq, next_seq = next_seq + 1 \
                 WHERE run_id = ? AND status NOT IN {HARD_TERMINALS} RETURNING {COLUMNS}"
            ),
            &[
                V::from(terminal.status().as_str()),
                V::from(summary),
                V::from(output),
                V::from(error),
                V::from(reason),
                V::from(still_running),
                V::Int(now),
                V::from(run_id),
            ],
        )?;
        Ok(row.as_ref().map(RunRecord::from_row))
    }

    /// Runs whose status is one of `statuses` (any, when `None`) and that started before
    /// `older_than` (epoch ms; any time, when `None`): what `clear_agent_tool_runs` removes.
    pub fn matching(
        &self,
        statuses: Option<&[RunStatus]>,
        older_than: Option<i64>,
    ) -> Result<Vec<RunRecord>, StoreError> {
        Ok(self
            .all()?
            .into_iter()
            .filter(|r| statuses.is_none_or(|s| s.contains(&r.status)))
            .filter(|r| older_than.is_none_or(|t| r.started_at < t))
            .collect())
    }

    /// The stored frames of a run (chunks and milestones) after sequence `after`, in order.
    pub fn frames(&self, run_id: &str, after: i64) -> Result<Vec<(i64, String)>, StoreError> {
        let rows = self.sql.exec(
            "SELECT seq, body FROM agent_tool_frames WHERE run_id = ? AND seq > ? AND event = 0 ORDER BY seq",
            &[V::from(run_id), V::Int(after)],
        )?;
        Ok(rows.iter().filter_map(|r| Some((r.int(0)?, r.text(1)?))).collect())
    }

    /// The milestone frames of a run, in order.
    pub fn milestones(&self, run_id: &str) -> Result<Vec<(i64, String)>, StoreError> {
        // A milestone body is a JSON object whose `type` is the milestone part; inside a string
        // value the same characters would be escaped, so this never matches text.
        let rows = self.sql.exec(
            "SELECT seq, body FROM agent_tool_frames WHERE run_id = ? AND event = 0 AND body LIKE ? ORDER BY seq",
            &[V::from(run_id), V::from(format!("%\"type\":\"{}\"%", crate::protocol::chunk::MILESTONE_PART))],
        )?;
        Ok(rows.iter().filter_map(|r| Some((r.int(0)?, r.text(1)?))).collect())
    }

    /// One run with its result, latest progress and milestones (what
    /// `AgentHost::inspect_agent_tool_run` answers); `None` when the run is unknown. The latest
    /// signal is the kept progress, or, when a milestone came after it, the last milestone, as
    /// the stock client's snapshot has it.
    pub fn inspection(&self, run_id: &str) -> Result<Option<RunInspection>, StoreError> {
        let Some(record) = self.get(run_id)? else { return Ok(None) };
        let result = (!record.status.is_live()).then(|| record.result());
        let milestone_data: Vec<Value> = self
            .milestones(run_id)?
            .into_iter()
            .filter_map(|(_, body)| serde_json::from_str::<Value>(&body).ok()?.get("data").cloned())
            .collect();
        let progress = match record.progress.as_ref() {
            Some((_, body)) => serde_json::from_str::<Value>(body).ok().and_then(|v| v.get("data").cloned()),
            None => milestone_data.last().cloned().map(|mut data| {
                data["milestone"] = data.get("name").cloned().unwrap_or(Value::Null);
                data
            }),
        }
        .and_then(|mut data| {
            if let Value::Object(o) = &mut data {
                o.entry("at").or_insert(Value::from(record.last_signal_at.unwrap_or(0)));
            }
            serde_json::from_value::<ProgressSnapshot>(data).ok()
        });
        let milestones =
            milestone_data.into_iter().filter_map(|data| serde_json::from_value::<Milestone>(data).ok()).collect();
        Ok(Some(RunInspection { info: record.info(), result, progress, milestones }))
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests;
