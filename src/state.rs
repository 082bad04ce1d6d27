//! An agent's state (the TypeScript SDK's `this.state` / `setState`): one JSON value per object,
//! kept in the object's SQLite, sent to clients as `cf_agent_state` when they connect and when it
//! changes. A client's change is validated by the agent first; a refused one stores nothing and
//! gets `cf_agent_state_error` with the reason. Plain functions over SQL: the host carries out
//! what they decide.

use serde_json::{json, Value};

use crate::store::{Sql, StoreError, Value as V};

/// The state's table. Safe to run on every activation.
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS agent_state (
  id INTEGER PRIMARY KEY CHECK (id = 0),
  state_json TEXT NOT NULL,
  updated_at INTEGER NOT NULL
);
";

/// The largest state kept, as JSON (Durable Object SQL rows hold up to 2 MB).
pub const MAX_STATE_BYTES: usize = 1_000_000;

/// Who changed the state.
///
/// ```
/// # use agent_tools::prelude::*;
/// # #[derive(Default)] pub struct Board;
/// # agent_tools::durable_object!(Board, unchecked);
/// # fn main() {}
/// impl Agent for Board {
///     async fn on_state_changed(&self, host: &AgentHost<Self>, state: &serde_json::Value, source: &StateSource) {
///         if let StateSource::Client(connection) = source {
///             host.log(&format!("connection {connection} set the board to {state}"));
///         }
///     }
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StateSource {
    /// The agent itself (`AgentHost::set_agent_state`).
    Server,
    /// A client's `setState`, on this connection.
    Client(String),
}

/// The stored state, if it was ever set.
pub fn get(sql: &(impl Sql + ?Sized)) -> Result<Option<Value>, StoreError> {
    let row = sql.one("SELECT state_json FROM agent_state WHERE id = 0", &[])?;
    Ok(row.and_then(|r| r.text(0)).and_then(|t| serde_json::from_str(&t).ok()))
}

/// Stores `state`.
pub fn set(sql: &(impl Sql + ?Sized), state: &Value, now: i64) -> Result<(), StoreError> {
    sql.exec(
        "INSERT INTO agent_state (id, state_json, updated_at) VALUES (0, ?, ?) \
         ON CONFLICT (id) DO UPDATE SET state_json = excluded.state_json, updated_at = excluded.updated_at",
        &[V::from(state.to_string()), V::Int(now)],
    )?;
    Ok(())
}

/// Checks a state before anything is stored: at most [`MAX_STATE_BYTES`] of JSON.
pub fn check_size(state: &Value) -> Result<(), String> {
    let size = state.to_string().len();
    if size > MAX_STATE_BYTES {
        return Err(format!("the state is {size} bytes of JSON; at most {MAX_STATE_BYTES} are kept"));
    }
    Ok(())
}

/// What a client's `cf_agent_state` frame comes to.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientChange {
    /// Stored: every other client gets it, then the agent's `on_state_changed` runs.
    Accepted(Value),
    /// Nothing stored; the sender gets `cf_agent_state_error` with this.
    Refused(String),
}

/// Decides a client's change to `next`: its size, then the agent's `validate`, then stored.
pub fn client_change(
    sql: &(impl Sql + ?Sized),
    next: Value,
    validate: impl FnOnce(&Value) -> Result<(), String>,
    now: i64,
) -> Result<ClientChange, StoreError> {
    if let Err(problem) = check_size(&next).and_then(|()| validate(&next)) {
        return Ok(ClientChange::Refused(problem));
    }
    set(sql, &next, now)?;
    Ok(ClientChange::Accepted(next))
}

/// `{"type":"cf_agent_state","state":…}`.
pub fn state_frame(state: &Value) -> String {
    json!({ "type": "cf_agent_state", "state": state }).to_string()
}

/// `{"type":"cf_agent_state_error","error":…}`.
pub fn error_frame(error: &str) -> String {
    json!({ "type": "cf_agent_state_error", "error": error }).to_string()
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

    #[test]
    fn the_state_is_kept_and_replaced() {
        let db = db();
        assert_eq!(get(&db).unwrap(), None, "never set");
        set(&db, &json!({"budget": 3}), 1).unwrap();
        set(&db, &json!({"budget": 5}), 2).unwrap();
        assert_eq!(get(&db).unwrap(), Some(json!({"budget": 5})));
    }

    #[test]
    fn a_refused_change_stores_nothing_and_says_why() {
        let db = db();
        set(&db, &json!({"budget": 3}), 1).unwrap();
        let validate = |next: &Value| match next["budget"].as_i64() {
            Some(0..=10) => Ok(()),
            _ => Err("the budget is 0 to 10".to_owned()),
        };
        let refused = client_change(&db, json!({"budget": 99}), validate, 2).unwrap();
        assert_eq!(refused, ClientChange::Refused("the budget is 0 to 10".into()));
        assert_eq!(get(&db).unwrap(), Some(json!({"budget": 3})));
        let accepted = client_change(&db, json!({"budget": 7}), validate, 3).unwrap();
        assert_eq!(accepted, ClientChange::Accepted(json!({"budget": 7})));
        assert_eq!(get(&db).unwrap(), Some(json!({"budget": 7})));
    }

    #[test]
    fn an_oversized_state_is_refused_before_the_agent_is_asked() {
        let db = db();
        let huge = json!({ "blob": "x".repeat(MAX_STATE_BYTES) });
        let refused = client_change(&db, huge, |_| panic!("not asked"), 1).unwrap();
        assert!(matches!(refused, ClientChange::Refused(ref e) if e.contains("at most")), "{refused:?}");
        assert_eq!(get(&db).unwrap(), None);
    }

    #[test]
    fn frames_have_the_stock_shapes() {
        assert_eq!(state_frame(&json!({"a": 1})), r#"{"state":{"a":1},"type":"cf_agent_state"}"#);
        assert_eq!(error_frame("no"), r#"{"error":"no","type":"cf_agent_state_error"}"#);
    }
}
