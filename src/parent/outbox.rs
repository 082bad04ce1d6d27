//! Messages a parent sends its running children (`AgentHost::send_to_agent_tool_run`): kept in
//! the parent's SQL (`agent_tool_messages`, made with the registry) until the child has them, so a deploy or a restart of either side between
//! the send and the delivery loses nothing. The child keeps the first message of a name; so does
//! the parent: a second send of a name with another value is refused.

use serde_json::Value;

use crate::store::{Sql, StoreError, Value as V};

/// What a send found.
#[derive(Debug, Clone, PartialEq)]
pub enum Sent {
    /// Kept, to be delivered.
    New,
    /// The same message was sent before (delivered or not).
    Again,
    /// A different message of this name was sent first: it stays.
    Taken(Value),
}

/// A message waiting for its child.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    /// The run.
    pub run_id: String,
    /// The name the run waits for.
    pub name: String,
    /// The message.
    pub value: Value,
}

/// The outbox over `sql`.
pub struct Outbox<'a, S: Sql + ?Sized> {
    sql: &'a S,
}

impl<'a, S: Sql + ?Sized> Outbox<'a, S> {
    /// The outbox over `sql`.
    pub fn new(sql: &'a S) -> Self {
        Self { sql }
    }

    /// Keeps message `name` for run `run_id`.
    pub fn send(&self, run_id: &str, name: &str, value: &Value, now: i64) -> Result<Sent, StoreError> {
        let added = self.sql.exec(
            "INSERT INTO agent_tool_messages (run_id, name, value_json, sent_at) VALUES (?, ?, ?, ?) \
             ON CONFLICT (run_id, name) DO NOTHING RETURNING 1",
            &[V::from(run_id), V::from(name), V::from(value.to_string()), V::Int(now)],
        )?;
        if !added.is_empty() {
            return Ok(Sent::New);
        }
        let first = self.sql.one(
            "SELECT value_json FROM agent_tool_messages WHERE run_id = ? AND name = ?",
            &[V::from(run_id), V::from(name)],
        )?;
        let first: Value = first.and_then(|r| serde_json::from_str(&r.text(0)?).ok()).unwrap_or(Value::Null);
        Ok(if &first == value { Sent::Again } else { Sent::Taken(first) })
    }

    /// The messages not delivered yet to runs that still run (of `run_id` only, when given),
    /// oldest first.
    pub fn pending(&self, run_id: Option<&str>) -> Result<Vec<Pending>, StoreError> {
        let rows = self.sql.exec(
            "SELECT m.run_id, m.name, m.value_json FROM agent_tool_messages m \
             JOIN agent_tool_runs r ON r.run_id = m.run_id \
             WHERE m.delivered_at IS NULL AND r.status IN ('starting', 'running') AND (?1 IS NULL OR m.run_id = ?1) \
             ORDER BY m.sent_at, m.run_id, m.name",
            &[run_id.map_or(V::Null, V::from)],
        )?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                Some(Pending { run_id: r.text(0)?, name: r.text(1)?, value: serde_json::from_str(&r.text(2)?).ok()? })
            })
            .collect())
    }

    /// The child has message `name` of `run_id` (or can never take it: its run ended).
    pub fn delivered(&self, run_id: &str, name: &str, now: i64) -> Result<(), StoreError> {
        self.sql.exec(
            "UPDATE agent_tool_messages SET delivered_at = ? WHERE run_id = ? AND name = ? AND delivered_at IS NULL",
            &[V::Int(now), V::from(run_id), V::from(name)],
        )?;
        Ok(())
    }

    /// Forgets the messages of runs no longer in the registry (cleared ones).
    pub fn prune(&self) -> Result<usize, StoreError> {
        let rows = self.sql.exec(
            "DELETE FROM agent_tool_messages WHERE run_id NOT IN (SELECT run_id FROM agent_tool_runs) RETURNING 1",
            &[],
        )?;
        Ok(rows.len())
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::store::sqlite;
    use serde_json::json;

    fn db() -> rusqlite::Connection {
        let db = sqlite::memory();
        db.batch(crate::parent::registry::SCHEMA).unwrap();
        for (run, status) in [("r1", "running"), ("r2", "completed")] {
            db.exec(
                "INSERT INTO agent_tool_runs (run_id, agent_type, status, started_at) VALUES (?, 'Writer', ?, 0)",
                &[V::from(run), V::from(status)],
            )
            .unwrap();
        }
        db
    }

    #[test]
    fn the_first_message_of_a_name_stays_until_its_child_has_it() {
        let db = db();
        let outbox = Outbox::new(&db);
        assert_eq!(outbox.send("r1", "approval", &json!({"approved": true}), 1).unwrap(), Sent::New);
        assert_eq!(outbox.send("r1", "approval", &json!({"approved": true}), 2).unwrap(), Sent::Again);
        assert_eq!(
            outbox.send("r1", "approval", &json!({"approved": false}), 3).unwrap(),
            Sent::Taken(json!({"approved": true}))
        );
        outbox.send("r2", "approval", &json!(1), 4).unwrap();
        let pending = outbox.pending(None).unwrap();
        assert_eq!(
            pending,
            [Pending { run_id: "r1".into(), name: "approval".into(), value: json!({"approved": true}) }],
            "not to a run that ended"
        );
        assert!(outbox.pending(Some("r2")).unwrap().is_empty());
        outbox.delivered("r1", "approval", 5).unwrap();
        assert!(outbox.pending(None).unwrap().is_empty());
        db.exec("DELETE FROM agent_tool_runs WHERE run_id = 'r2'", &[]).unwrap();
        assert_eq!(outbox.prune().unwrap(), 1);
        assert_eq!(outbox.prune().unwrap(), 0, "the cleared run's message is gone");
        let left = db.exec("SELECT run_id FROM agent_tool_messages", &[]).unwrap();
        assert_eq!(left.iter().filter_map(|r| r.text(0)).collect::<Vec<_>>(), ["r1"], "the live run's stays");
    }
}
