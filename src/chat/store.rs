//! The chat's SQL: the transcript (`UIMessage` JSON in order) and the stream log (every chunk
//! of a stream with an index from 0, for resuming clients and for tailing parents).

use serde_json::Value;

use crate::protocol::tail::ChunkKind;
use crate::store::{Sql, StoreError, Value as V};

/// The chat's tables (with a turn's journal and the messages held while a turn is open: see
/// [`crate::chat::journal`]; the calls waiting for a person: see [`crate::chat::interaction`]). Safe to run on every activation.
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS chat_messages (
  id TEXT PRIMARY KEY,
  ord INTEGER NOT NULL,
  message_json TEXT NOT NULL,
  created_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS chat_messages_by_ord ON chat_messages (ord);
CREATE TABLE IF NOT EXISTS chat_open_streams (
  stream_id TEXT PRIMARY KEY,
  request_id TEXT NOT NULL,
  message_id TEXT NOT NULL,
  started_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS chat_stream_chunks (
  stream_id TEXT NOT NULL,
  idx INTEGER NOT NULL,
  kind TEXT NOT NULL,
  body TEXT NOT NULL,
  PRIMARY KEY (stream_id, idx)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS chat_turns (
  request_id TEXT PRIMARY KEY,
  message_id TEXT NOT NULL,
  ord INTEGER NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 1,
  started_at INTEGER NOT NULL,
  log_keep INTEGER NOT NULL DEFAULT -1,
  continues INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS chat_turn_steps (
  request_id TEXT NOT NULL,
  step INTEGER NOT NULL,
  text TEXT NOT NULL,
  calls_json TEXT NOT NULL,
  PRIMARY KEY (request_id, step)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS chat_turn_results (
  request_id TEXT NOT NULL,
  call_id TEXT NOT NULL,
  output_json TEXT NOT NULL,
  error TEXT,
  PRIMARY KEY (request_id, call_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS chat_turn_approved (
  request_id TEXT NOT NULL,
  call_id TEXT NOT NULL,
  PRIMARY KEY (request_id, call_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS chat_interactions (
  call_id TEXT PRIMARY KEY,
  message_id TEXT NOT NULL,
  kind TEXT NOT NULL,
  approval_id TEXT NOT NULL,
  tool_name TEXT NOT NULL,
  requested_at INTEGER NOT NULL,
  expires_at INTEGER,
  answer_json TEXT,
  auto_continue INTEGER NOT NULL DEFAULT 0,
  answered_at INTEGER
);
CREATE TABLE IF NOT EXISTS chat_client_tools (
  name TEXT PRIMARY KEY,
  description TEXT NOT NULL,
  schema_json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS chat_held_messages (
  id TEXT PRIMARY KEY,
  seq INTEGER NOT NULL,
  message_json TEXT NOT NULL,
  created_at INTEGER NOT NULL
);
";

/// Columns of the chat's tables added since their first version: (table column, definition),
/// all of `chat_turns`.
pub(crate) const ADDED_COLUMNS: &[(&str, &str)] = &[("continues", "INTEGER NOT NULL DEFAULT 0")];

/// The next place at the end of the transcript: after every message and every place an open
/// turn took for its answer (see [`crate::chat::journal`]).
pub(crate) const NEXT_ORD: &str =
    "(SELECT COALESCE(MAX(o) + 1, 0) FROM (SELECT ord AS o FROM chat_messages UNION ALL SELECT ord FROM chat_turns))";

/// The largest message kept (Durable Object SQL rows hold up to 2 MB).
pub const MAX_MESSAGE_BYTES: usize = 1_000_000;

/// Checks a client-sent `UIMessage`: an object with a string `id`, a `role` of
/// `user`/`assistant`/`system`, a `parts` array, at most [`MAX_MESSAGE_BYTES`].
pub fn validate_message(m: &Value) -> Result<(), String> {
    let Some(o) = m.as_object() else { return Err("a message must be an object".into()) };
    match o.get("id").and_then(Value::as_str) {
        Some(id) if !id.is_empty() && id.len() <= 256 => {}
        _ => return Err("a message needs a string \"id\" of 1 to 256 bytes".into()),
    }
    if !matches!(o.get("role").and_then(Value::as_str), Some("user" | "assistant" | "system")) {
        return Err("a message \"role\" must be \"user\", \"assistant\" or \"system\"".into());
    }
    if !o.get("parts").is_some_and(Value::is_array) {
        return Err("a message needs a \"parts\" array".into());
    }
    if m.to_string().len() > MAX_MESSAGE_BYTES {
        return Err(format!("a message must be at most {MAX_MESSAGE_BYTES} bytes of JSON"));
    }
    Ok(())
}

/// The transcript.
pub struct Messages<'a, S: Sql + ?Sized> {
    sql: &'a S,
}

impl<'a, S: Sql + ?Sized> Messages<'a, S> {
    /// The transcript over `sql`.
    pub fn new(sql: &'a S) -> Self {
        Self { sql }
    }

    /// Every message, in order.
    pub fn list(&self) -> Result<Vec<Value>, StoreError> {
        let rows = self.sql.exec("SELECT message_json FROM chat_messages ORDER BY ord", &[])?;
        Ok(rows.iter().filter_map(|r| serde_json::from_str(&r.text(0)?).ok()).collect())
    }

    /// Inserts a message at the end, or replaces the message with its id in place.
    pub fn upsert(&self, message: &Value, now: i64) -> Result<(), StoreError> {
        let id = message.get("id").and_then(Value::as_str).unwrap_or_default();
        self.sql.exec(
            &format!(
                "INSERT INTO chat_messages (id, ord, message_json, created_at) VALUES (?, {NEXT_ORD}, ?, ?) \
                 ON CONFLICT (id) DO UPDATE SET message_json = excluded.message_json"
            ),
            &[V::from(id), V::from(message.to_string()), V::Int(now)],
        )?;
        Ok(())
    }

    /// Inserts a message at `ord` (a turn's place, kept from its start), or replaces the
    /// message with its id in place.
    pub fn upsert_at(&self, message: &Value, ord: i64, now: i64) -> Result<(), StoreError> {
        let id = message.get("id").and_then(Value::as_str).unwrap_or_default();
        self.sql.exec(
            "INSERT INTO chat_messages (id, ord, message_json, created_at) VALUES (?, ?, ?, ?) \
             ON CONFLICT (id) DO UPDATE SET message_json = excluded.message_json",
            &[V::from(id), V::Int(ord), V::from(message.to_string()), V::Int(now)],
        )?;
        Ok(())
    }

    /// Adds a message unless one with its id is there: `true` when it was added.
    pub fn insert_new(&self, message: &Value, now: i64) -> Result<bool, StoreError> {
        let id = message.get("id").and_then(Value::as_str).unwrap_or_default();
        let rows = self.sql.exec(
            &format!(
                "INSERT INTO chat_messages (id, ord, message_json, created_at) VALUES (?, {NEXT_ORD}, ?, ?) \
                 ON CONFLICT (id) DO NOTHING RETURNING 1"
            ),
            &[V::from(id), V::from(message.to_string()), V::Int(now)],
        )?;
        Ok(!rows.is_empty())
    }

    /// Keeps a transcript a client sent: upserts every message; when every one of them is
    /// already known (a regenerate), drops the stored messages the client no longer has.
    pub fn persist_client(&self, messages: &[Value], now: i64) -> Result<(), StoreError> {
        let stored: Vec<String> =
            self.sql.exec("SELECT id FROM chat_messages", &[])?.iter().filter_map(|r| r.text(0)).collect();
        let ids: Vec<&str> = messages.iter().filter_map(|m| m.get("id").and_then(Value::as_str)).collect();
        let all_known = !ids.is_empty() && ids.iter().all(|id| stored.iter().any(|s| s == id));
        for m in messages {
            self.upsert(m, now)?;
        }
        if all_known {
            for id in stored.iter().filter(|s| !ids.contains(&s.as_str())) {
                self.sql.exec("DELETE FROM chat_messages WHERE id = ?", &[V::from(id)])?;
            }
        }
        Ok(())
    }

    /// Deletes every message.
    pub fn clear(&self) -> Result<(), StoreError> {
        self.sql.exec("DELETE FROM chat_messages", &[])?;
        self.sql.exec("DELETE FROM chat_interactions", &[])?;
        Ok(())
    }

    /// The message `id`, with its place in the transcript.
    pub fn get(&self, id: &str) -> Result<Option<(Value, i64)>, StoreError> {
        let row = self.sql.one("SELECT message_json, ord FROM chat_messages WHERE id = ?", &[V::from(id)])?;
        Ok(row.and_then(|r| Some((serde_json::from_str(&r.text(0)?).ok()?, r.int(1)?))))
    }
}

/// The client-side tools a client declared with its last chat request (the stock client's
/// `clientTools`): offered to the model in the turns after it, until a request declares others.
pub struct ClientTools<'a, S: Sql + ?Sized> {
    sql: &'a S,
}

impl<'a, S: Sql + ?Sized> ClientTools<'a, S> {
    /// The client tools over `sql`.
    pub fn new(sql: &'a S) -> Self {
        Self { sql }
    }

    /// These are the client's tools now.
    pub fn set(&self, tools: &[crate::llm::ToolSpec]) -> Result<(), StoreError> {
        self.sql.exec("DELETE FROM chat_client_tools", &[])?;
        for tool in tools {
            self.sql.exec(
                "INSERT OR REPLACE INTO chat_client_tools (name, description, schema_json) VALUES (?, ?, ?)",
                &[
                    V::from(tool.name.as_str()),
                    V::from(tool.description.as_str()),
                    V::from(tool.input_schema.to_string()),
                ],
            )?;
        }
        Ok(())
    }

    /// The client's tools, by name.
    pub fn list(&self) -> Result<Vec<crate::llm::ToolSpec>, StoreError> {
        let rows = self.sql.exec("SELECT name, description, schema_json FROM chat_client_tools ORDER BY name", &[])?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let schema = serde_json::from_str(&r.text(2)?).ok()?;
                Some(crate::llm::ToolSpec::new(r.text(0)?, r.text(1).unwrap_or_default(), schema))
            })
            .collect())
    }
}

/// A stored chunk.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredChunk {
    /// Index in its stream.
    pub index: i64,
    /// Stored or milestone.
    pub kind: ChunkKind,
    /// The `UIMessageChunk` JSON.
    pub body: String,
}

/// How a chunk's kind is stored.
fn kind_name(kind: ChunkKind) -> &'static str {
    match kind {
        ChunkKind::Milestone => "milestone",
        ChunkKind::Superseded => "superseded",
        ChunkKind::Stored | ChunkKind::Progress => "stored",
    }
}

/// Every chunk of every stream, by stream id and index.
pub struct StreamLog<'a, S: Sql + ?Sized> {
    sql: &'a S,
}

impl<'a, S: Sql + ?Sized> StreamLog<'a, S> {
    /// The log over `sql`.
    pub fn new(sql: &'a S) -> Self {
        Self { sql }
    }

    /// The index the next chunk of `stream` takes.
    pub fn next_index(&self, stream: &str) -> Result<i64, StoreError> {
        let row = self
            .sql
            .one("SELECT COALESCE(MAX(idx) + 1, 0) FROM chat_stream_chunks WHERE stream_id = ?", &[V::from(stream)])?;
        Ok(row.and_then(|r| r.int(0)).unwrap_or(0))
    }

    /// Appends a chunk at `index` (the caller owns the counter). Re-appending an index is a no-op.
    pub fn append(&self, stream: &str, index: i64, kind: ChunkKind, body: &str) -> Result<(), StoreError> {
        self.sql.exec(
            "INSERT OR IGNORE INTO chat_stream_chunks (stream_id, idx, kind, body) VALUES (?, ?, ?, ?)",
            &[V::from(stream), V::Int(index), V::from(kind_name(kind)), V::from(body)],
        )?;
        Ok(())
    }

    /// Stores several chunks of `stream` (`(index, kind, body)`, in order), a few statements
    /// for the lot: the fast path of a streaming turn.
    pub fn append_many(&self, stream: &str, chunks: &[(i64, ChunkKind, &str)]) -> Result<(), StoreError> {
        // Three parameters a row and the stream id once, within SQLite's 100-parameter limit.
        const ROWS: usize = 33;
        for rows in chunks.chunks(ROWS) {
            let values: Vec<String> =
                (0..rows.len()).map(|i| format!("(?1, ?{}, ?{}, ?{})", 2 + 3 * i, 3 + 3 * i, 4 + 3 * i)).collect();
            let sql = format!(
                "INSERT OR IGNORE INTO chat_stream_chunks (stream_id, idx, kind, body) VALUES {}",
                values.join(", ")
            );
            let mut params = vec![V::from(stream)];
            for &(index, kind, body) in rows {
                params.extend([V::Int(index), V::from(kind_name(kind)), V::from(body)]);
            }
            self.sql.exec(&sql, &params)?;
        }
        Ok(())
    }

    /// The chunks of `stream` with an index greater than `after`, in order.
    pub fn after(&self, stream: &str, after: i64) -> Result<Vec<StoredChunk>, StoreError> {
        self.page_after(stream, after, -1)
    }

    /// At most `limit` chunks of `stream` with an index greater than `after`, in order (a
    /// negative `limit`: all of them; SQLite's `LIMIT -1`, since a Durable Object binds integers
    /// as JavaScript numbers, which cannot carry `i64::MAX`).
    pub fn page_after(&self, stream: &str, after: i64, limit: i64) -> Result<Vec<StoredChunk>, StoreError> {
        let rows = self.sql.exec(
            "SELECT idx, kind, body FROM chat_stream_chunks WHERE stream_id = ? AND idx > ? ORDER BY idx LIMIT ?",
            &[V::from(stream), V::Int(after), V::Int(limit)],
        )?;
        Ok(rows
            .iter()
            .map(|r| StoredChunk {
                index: r.int(0).unwrap_or(0),
                kind: match r.text(1).as_deref() {
                    Some("milestone") => ChunkKind::Milestone,
                    Some("superseded") => ChunkKind::Superseded,
                    _ => ChunkKind::Stored,
                },
                body: r.text(2).unwrap_or_default(),
            })
            .collect())
    }

    /// Marks the saved messages of stream `stream_id` that a restart cut short
    /// (`metadata.interrupted`) as superseded: a new attempt answers instead. They stay in the
    /// transcript, and are no longer sent to models.
    pub fn mark_superseded(&self, stream_id: &str) -> Result<(), StoreError> {
        let messages = Messages::new(self.sql).list()?;
        for mut message in messages {
            let meta = &message["metadata"];
            if meta["interrupted"] == Value::Bool(true) && meta["streamId"].as_str() == Some(stream_id) {
                message["metadata"]["superseded"] = Value::Bool(true);
                Messages::new(self.sql).upsert(&message, 0)?;
            }
        }
        Ok(())
    }

    /// Drops the chunks of `stream` after index `keep` (a continuation replaces them).
    pub fn truncate_after(&self, stream: &str, keep: i64) -> Result<(), StoreError> {
        self.sql
            .exec("DELETE FROM chat_stream_chunks WHERE stream_id = ? AND idx > ?", &[V::from(stream), V::Int(keep)])?;
        Ok(())
    }

    /// Deletes a stream.
    pub fn delete(&self, stream: &str) -> Result<(), StoreError> {
        self.sql.exec("DELETE FROM chat_stream_chunks WHERE stream_id = ?", &[V::from(stream)])?;
        Ok(())
    }

    /// Deletes the chunks of every finished stream but `keep` and those `kept` claims (a
    /// child's run stream, which its parent reads and a drill-in resumes): a finished chat
    /// turn's message is in the transcript, and no resume asks for its chunks once a later
    /// turn has finished. Streams still open stay. Returns how many streams went.
    pub fn prune(&self, keep: &str, kept: impl Fn(&str) -> bool) -> Result<usize, StoreError> {
        let rows = self.sql.exec(
            "SELECT DISTINCT stream_id FROM chat_stream_chunks \
             WHERE stream_id <> ? AND stream_id NOT IN (SELECT stream_id FROM chat_open_streams)",
            &[V::from(keep)],
        )?;
        let mut pruned = 0;
        for id in rows.iter().filter_map(|r| r.text(0)) {
            if !kept(&id) {
                self.delete(&id)?;
                pruned += 1;
            }
        }
        Ok(pruned)
    }
}

/// Turns being written, kept in SQL so a restart can tell which streams it cut short.
pub struct OpenStreams<'a, S: Sql + ?Sized> {
    sql: &'a S,
}

impl<'a, S: Sql + ?Sized> OpenStreams<'a, S> {
    /// Open streams over `sql`.
    pub fn new(sql: &'a S) -> Self {
        Self { sql }
    }

    /// A turn starts writing `stream_id` as assistant message `message_id`.
    pub fn open(&self, stream_id: &str, request_id: &str, message_id: &str, now: i64) -> Result<(), StoreError> {
        self.sql.exec(
            "INSERT INTO chat_open_streams (stream_id, request_id, message_id, started_at) VALUES (?, ?, ?, ?) \
             ON CONFLICT (stream_id) DO UPDATE SET request_id = excluded.request_id, \
             message_id = excluded.message_id, started_at = excluded.started_at",
            &[V::from(stream_id), V::from(request_id), V::from(message_id), V::Int(now)],
        )?;
        Ok(())
    }

    /// The turn ended (its message is saved).
    pub fn close(&self, stream_id: &str) -> Result<(), StoreError> {
        self.sql.exec("DELETE FROM chat_open_streams WHERE stream_id = ?", &[V::from(stream_id)])?;
        Ok(())
    }

    /// After a restart: every stream still open was cut short with its turn. Each one's
    /// assistant message is rebuilt from the chunks it stored and saved, marked
    /// `metadata.interrupted` (what was said stays said). A child run's stream holds every
    /// attempt of its turn, each after a `superseded` marker: the message is the last
    /// attempt's. Returns the recovered messages.
    pub fn recover(&self, now: i64) -> Result<Vec<Value>, StoreError> {
        // A client's turn has a journal, and is continued from it instead.
        let open = self.sql.exec(
            "SELECT stream_id, message_id FROM chat_open_streams \
             WHERE stream_id NOT IN (SELECT request_id FROM chat_turns) ORDER BY started_at",
            &[],
        )?;
        let mut recovered = Vec::new();
        for row in &open {
            let (Some(stream_id), Some(message_id)) = (row.text(0), row.text(1)) else { continue };
            let mut builder = crate::chat::message::MessageBuilder::new(message_id.clone());
            for chunk in StreamLog::new(self.sql).after(&stream_id, -1)? {
                if chunk.kind == ChunkKind::Superseded {
                    // A child run's stream holds every attempt, each after its marker: the
                    // message cut short is the last attempt's alone.
                    builder = crate::chat::message::MessageBuilder::new(message_id.clone());
                } else if let Ok(chunk) = serde_json::from_str::<Value>(&chunk.body) {
                    builder.apply(&chunk);
                }
            }
            if !builder.is_empty() {
                let mut message = builder.message();
                message["metadata"]["interrupted"] = Value::Bool(true);
                message["metadata"]["streamId"] = Value::String(stream_id.clone());
                Messages::new(self.sql).upsert(&message, now)?;
                recovered.push(message);
            }
            self.close(&stream_id)?;
        }
        Ok(recovered)
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::store::sqlite;
    use serde_json::json;

    fn db() -> rusqlite::Connection {
        let db = sqlite::memory();
        db.batch(SCHEMA).unwrap();
        db
    }

    fn msg(id: &str, text: &str) -> Value {
        json!({"id": id, "role": "user", "parts": [{"type": "text", "text": text}]})
    }

    #[test]
    fn upsert_keeps_order_and_replaces_in_place() {
        let db = db();
        let m = Messages::new(&db);
        m.upsert(&msg("a", "1"), 1).unwrap();
        m.upsert(&msg("b", "2"), 2).unwrap();
        m.upsert(&msg("a", "1 edited"), 3).unwrap();
        let list = m.list().unwrap();
        assert_eq!(list, vec![msg("a", "1 edited"), msg("b", "2")]);
    }

    #[test]
    fn a_regenerate_drops_what_the_client_dropped() {
        let db = db();
        let m = Messages::new(&db);
        m.persist_client(&[msg("a", "1"), msg("b", "2")], 1).unwrap();
        // A new message: nothing is deleted even though the client omitted "b".
        m.persist_client(&[msg("a", "1"), msg("c", "3")], 2).unwrap();
        assert_eq!(m.list().unwrap().len(), 3);
        // Every id known: a regenerate; what the client no longer has goes.
        m.persist_client(&[msg("a", "1")], 3).unwrap();
        assert_eq!(m.list().unwrap(), vec![msg("a", "1")]);
        m.clear().unwrap();
        assert!(m.list().unwrap().is_empty());
    }

    #[test]
    fn messages_are_validated() {
        assert!(validate_message(&msg("a", "x")).is_ok());
        assert!(validate_message(&json!("x")).is_err());
        assert!(validate_message(&json!({"id": "", "role": "user", "parts": []})).is_err());
        assert!(validate_message(&json!({"id": "a", "role": "robot", "parts": []})).is_err());
        assert!(validate_message(&json!({"id": "a", "role": "user"})).is_err());
        let huge =
            json!({"id": "a", "role": "user", "parts": [{"type": "text", "text": "x".repeat(MAX_MESSAGE_BYTES)}]});
        assert!(validate_message(&huge).unwrap_err().contains("at most"));
    }

    #[test]
    fn stream_log_reads_after_a_cursor() {
        let db = db();
        let log = StreamLog::new(&db);
        for i in 0..4 {
            log.append("s", i, if i == 2 { ChunkKind::Milestone } else { ChunkKind::Stored }, &format!("{i}")).unwrap();
        }
        log.append("other", 0, ChunkKind::Stored, "x").unwrap();
        assert_eq!(log.next_index("s").unwrap(), 4);
        let after = log.after("s", 1).unwrap();
        assert_eq!(after.iter().map(|c| c.index).collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(after[0].kind, ChunkKind::Milestone);
        log.append("s", 3, ChunkKind::Stored, "dup").unwrap();
        assert_eq!(log.after("s", 2).unwrap()[0].body, "3");
        log.delete("s").unwrap();
        assert_eq!(log.next_index("s").unwrap(), 0);
        assert_eq!(log.next_index("other").unwrap(), 1);
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod recovery_tests {
    use super::*;
    use crate::store::sqlite;

    #[test]
    fn a_stream_cut_short_becomes_a_saved_partial_message() {
        let db = sqlite::memory();
        db.batch(SCHEMA).unwrap();
        let open = OpenStreams::new(&db);
        open.open("s1", "r1", "msg-1", 1).unwrap();
        let log = StreamLog::new(&db);
        for (i, chunk) in [
            r#"{"type":"start","messageId":"msg-1"}"#,
            r#"{"type":"text-start","id":"t"}"#,
            r#"{"type":"text-delta","id":"t","delta":"half an "}"#,
            r#"{"type":"text-delta","id":"t","delta":"answer"}"#,
        ]
        .iter()
        .enumerate()
        {
            log.append("s1", i as i64, ChunkKind::Stored, chunk).unwrap();
        }
        open.open("s2", "r2", "msg-2", 2).unwrap();
        open.open("done", "r3", "msg-3", 3).unwrap();
        open.close("done").unwrap();
        let recovered = open.recover(10).unwrap();
        assert_eq!(recovered.len(), 1, "a stream with nothing stored leaves no message");
        let saved = Messages::new(&db).list().unwrap();
        assert_eq!(saved.len(), 1);
        assert_eq!(saved[0]["id"], "msg-1");
        assert_eq!(crate::chat::message::text_of(&saved[0]), "half an answer");
        assert_eq!(saved[0]["metadata"]["interrupted"], true);
        assert!(open.recover(11).unwrap().is_empty(), "recovered once");
    }

    #[test]
    fn a_child_stream_cut_short_again_recovers_its_last_attempt_alone() {
        let db = sqlite::memory();
        db.batch(SCHEMA).unwrap();
        let open = OpenStreams::new(&db);
        open.open("run", "run", "attempt-2", 1).unwrap();
        let log = StreamLog::new(&db);
        let chunks = [
            (ChunkKind::Stored, r#"{"type":"text-start","id":"t"}"#),
            (ChunkKind::Stored, r#"{"type":"text-delta","id":"t","delta":"first try"}"#),
            (ChunkKind::Superseded, r#"{"type":"data-agent-superseded","data":{"attempt":2}}"#),
            (ChunkKind::Stored, r#"{"type":"text-start","id":"t"}"#),
            (ChunkKind::Stored, r#"{"type":"text-delta","id":"t","delta":"second"}"#),
        ];
        for (i, (kind, chunk)) in chunks.into_iter().enumerate() {
            log.append("run", i as i64, kind, chunk).unwrap();
        }
        open.recover(10).unwrap();
        let saved = Messages::new(&db).list().unwrap();
        assert_eq!(saved.len(), 1);
        assert_eq!(crate::chat::message::text_of(&saved[0]), "second", "never both attempts in one message");
    }

    #[test]
    fn finished_chat_streams_are_pruned_and_run_streams_kept() {
        let db = sqlite::memory();
        db.batch(SCHEMA).unwrap();
        let log = StreamLog::new(&db);
        for stream in ["old-turn", "older-turn", "run-1", "open-turn", "current"] {
            log.append(stream, 0, ChunkKind::Stored, "{}").unwrap();
        }
        OpenStreams::new(&db).open("open-turn", "open-turn", "m", 1).unwrap();
        assert_eq!(log.prune("current", |id| id == "run-1").unwrap(), 2);
        for (stream, kept) in
            [("old-turn", false), ("older-turn", false), ("run-1", true), ("open-turn", true), ("current", true)]
        {
            assert_eq!(!log.after(stream, -1).unwrap().is_empty(), kept, "{stream}");
        }
    }
}
