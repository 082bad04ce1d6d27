//! An agent's own SQLite tables ([`crate::AgentHost::sql`]): the storage the engines keep their
//! tables in, for the app's own, the same in a Worker and in a test. Statements take `?`
//! placeholders bound to [`Value`]s.
//!
//! ```
//! # async fn notes(host: &agent_tools::AgentHost<impl agent_tools::Agent>) -> Result<(), agent_tools::sql::StoreError> {
//! use agent_tools::sql::Value;
//! let sql = host.sql();
//! sql.batch("CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY, body TEXT NOT NULL);")?;
//! sql.exec("INSERT INTO notes (id, body) VALUES (?, ?)", &[Value::from("n1"), Value::from("hello")])?;
//! let body = sql.one("SELECT body FROM notes WHERE id = ?", &[Value::from("n1")])?.and_then(|row| row.text(0));
//! assert_eq!(body.as_deref(), Some("hello"));
//! # Ok(()) }
//! ```

pub use crate::store::{Row, StoreError, Value};

/// The agent's SQLite storage.
///
/// ```
/// # async fn visits(host: &agent_tools::AgentHost<impl agent_tools::Agent>) -> Result<i64, agent_tools::Error> {
/// let sql = host.sql();
/// sql.batch("CREATE TABLE IF NOT EXISTS visits (n INTEGER NOT NULL); INSERT INTO visits (n) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM visits);")?;
/// let row = sql.one("UPDATE visits SET n = n + 1 RETURNING n", &[])?;
/// Ok(row.and_then(|r| r.int(0)).unwrap_or(0))
/// # }
/// ```
pub struct Storage<'a> {
    sql: &'a dyn crate::store::Sql,
}

impl std::fmt::Debug for Storage<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage").finish_non_exhaustive()
    }
}

impl<'a> Storage<'a> {
    pub(crate) fn new(sql: &'a dyn crate::store::Sql) -> Self {
        Self { sql }
    }

    /// Runs one statement, returning every row.
    pub fn exec(&self, query: &str, params: &[Value]) -> Result<Vec<Row>, StoreError> {
        self.sql.exec(query, params)
    }

    /// Runs a query expected to return at most one row.
    pub fn one(&self, query: &str, params: &[Value]) -> Result<Option<Row>, StoreError> {
        self.sql.one(query, params)
    }

    /// Runs several `;`-separated statements without parameters (a schema).
    pub fn batch(&self, statements: &str) -> Result<(), StoreError> {
        self.sql.batch(statements)
    }
}
