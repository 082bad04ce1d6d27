//! The storage seam: the few SQL operations the run registry and the child run log need.
//!
//! Durable Object SQLite and a native SQLite connection (`rusqlite`, used by the unit tests)
//! both implement [`Sql`], so every query in this crate runs unchanged in both places.
//!
//! Durable Object storage applies all writes made in one synchronous stretch of code (no
//! `.await` in between) atomically, and refuses `BEGIN`/`COMMIT`. The logic modules therefore
//! keep every multi-statement change inside one synchronous function.

use std::fmt;

/// One SQL value, as SQLite stores it.
///
/// ```
/// use agent_tools::sql::Value;
///
/// let params = [Value::from("n1"), Value::from(3_i64), Value::from(0.5), Value::from(true), Value::from(None::<String>)];
/// assert_eq!(params[3], Value::Int(1));
/// assert_eq!(params[4], Value::Null);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL `NULL`.
    Null,
    /// A 64-bit integer (Durable Object storage returns integers within the JavaScript safe range).
    Int(i64),
    /// A double.
    Real(f64),
    /// UTF-8 text.
    Text(String),
    /// Raw bytes.
    Blob(Vec<u8>),
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Real(v)
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Int(v as i64)
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Text(v.to_owned())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Text(v)
    }
}
impl From<&String> for Value {
    fn from(v: &String) -> Self {
        Value::Text(v.clone())
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}

/// Declares the columns a table is read with, once: `LIST` (their SQL list, for `SELECT` and
/// `RETURNING`) and one constant per column, its index in a row read with `LIST`, so a row is
/// decoded by column name (`r.text(col::status)`) and a misspelled name does not compile.
///
/// ```ignore
/// columns!(mod col { run_id, status });
/// assert_eq!(col::LIST, "run_id, status");
/// assert_eq!(col::status, 1);
/// ```
macro_rules! columns {
    ($vis:vis mod $m:ident { $first:ident $(, $rest:ident)* $(,)? }) => {
        #[allow(non_upper_case_globals, dead_code)]
        $vis mod $m {
            /// The columns, as SQL lists them.
            pub const LIST: &str = concat!(stringify!($first) $(, ", ", stringify!($rest))*);
            $crate::store::columns!(@index 0usize; $first $(, $rest)*);
        }
    };
    (@index $i:expr; $name:ident $(, $rest:ident)*) => {
        /// The column's index in a row read with `LIST`.
        pub const $name: usize = $i;
        $crate::store::columns!(@index $i + 1usize; $($rest),*);
    };
    (@index $i:expr;) => {};
}
pub(crate) use columns;

/// One result row, its values in the order of the query's columns.
///
/// ```
/// # async fn notes(host: &agent_tools::AgentHost<impl agent_tools::Agent>) -> Result<(), agent_tools::Error> {
/// use agent_tools::sql::Value;
/// for row in host.sql().exec("SELECT id, words FROM notes WHERE words > ?", &[Value::from(100_i64)])? {
///     let (id, words) = (row.text(0).unwrap_or_default(), row.int(1).unwrap_or(0));
///     host.log(&format!("{id}: {words} words"));
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Row(pub Vec<Value>);

impl Row {
    /// The value at column `i` (`Null` past the end).
    pub fn get(&self, i: usize) -> &Value {
        self.0.get(i).unwrap_or(&Value::Null)
    }
    /// Column `i` as text; `None` for `NULL` or a non-text value.
    pub fn text(&self, i: usize) -> Option<String> {
        match self.get(i) {
            Value::Text(s) => Some(s.clone()),
            _ => None,
        }
    }
    /// Column `i` as an integer; `None` for `NULL`. Reals are truncated (Durable Object storage
    /// hands back numbers outside the safe integer range as doubles).
    pub fn int(&self, i: usize) -> Option<i64> {
        match self.get(i) {
            Value::Int(v) => Some(*v),
            Value::Real(v) => Some(*v as i64),
            _ => None,
        }
    }
}

/// The largest integer a JavaScript number holds exactly (`Number.MAX_SAFE_INTEGER`): Durable
/// Object storage carries bound integers as JavaScript numbers, so a larger one would be rounded.
pub(crate) const MAX_SAFE_INTEGER: i64 = (1 << 53) - 1;

/// Refuses a statement that binds an integer Durable Object storage would round (it would store
/// another number, with only a warning in the Worker's log); the native store refuses it alike,
/// so a test finds what workerd would mangle.
pub(crate) fn check_bindings(sql: &str, params: &[Value]) -> Result<(), StoreError> {
    match params.iter().find(|p| matches!(p, Value::Int(i) if i.unsigned_abs() > MAX_SAFE_INTEGER as u64)) {
        Some(Value::Int(i)) => Err(StoreError {
            message: format!("the integer {i} is outside JavaScript's safe range and would be rounded (in `{sql}`)"),
        }),
        _ => Ok(()),
    }
}

/// A storage failure, with the statement that caused it.
///
/// It converts into [`crate::Error`] with `?` (as `Error::Storage`):
///
/// ```
/// # async fn count(host: &agent_tools::AgentHost<impl agent_tools::Agent>) -> Result<i64, agent_tools::Error> {
/// let row = host.sql().one("SELECT COUNT(*) FROM notes", &[])?;
/// Ok(row.and_then(|r| r.int(0)).unwrap_or(0))
/// # }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct StoreError {
    /// What the database said.
    pub message: String,
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "storage error: {}", self.message)
    }
}

impl std::error::Error for StoreError {}

/// SQL access: Durable Object SQLite in the Worker, `rusqlite` in native tests.
pub trait Sql {
    /// Runs one statement with `?` placeholders bound to `params`, returning every row.
    fn exec(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, StoreError>;

    /// Runs several `;`-separated statements without parameters (schema set-up).
    fn batch(&self, sql: &str) -> Result<(), StoreError>;

    /// Runs a query expected to return at most one row.
    fn one(&self, sql: &str, params: &[Value]) -> Result<Option<Row>, StoreError> {
        Ok(self.exec(sql, params)?.into_iter().next())
    }

    /// Runs `work` as one unit: when it fails, everything it wrote is rolled back (a Durable
    /// Object's `transactionSync`, a savepoint natively). The engines run every decision in one,
    /// so a failed statement never leaves half a decision behind.
    fn atomically(&self, work: &mut dyn FnMut() -> Result<(), StoreError>) -> Result<(), StoreError>;
}

/// [`Sql::atomically`] for work that returns a value, or an error of its own (which rolls the
/// unit back as a failed statement does).
pub fn atomic<T, E: From<StoreError>>(sql: &(impl Sql + ?Sized), work: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
    let mut work = Some(work);
    let mut out = None;
    let committed = sql.atomically(&mut || {
        let work = work.take().ok_or_else(|| StoreError { message: "a unit of work ran twice".into() })?;
        let done = work();
        let failed = done.is_err();
        out = Some(done);
        if failed {
            return Err(StoreError { message: "the unit of work failed".into() });
        }
        Ok(())
    });
    match (committed, out) {
        (_, Some(Err(e))) => Err(e),
        (Err(e), _) => Err(e.into()),
        (Ok(()), Some(Ok(value))) => Ok(value),
        (Ok(()), None) => Err(StoreError { message: "a unit of work did not run".into() }.into()),
    }
}

#[cfg(all(any(test, feature = "testing"), not(target_arch = "wasm32")))]
pub(crate) mod sqlite {
    //! `rusqlite` behind [`Sql`], for the native unit tests and the test kit.
    use super::{Row, Sql, StoreError, Value};
    use rusqlite::types::{ToSqlOutput, ValueRef};

    /// A fresh in-memory database.
    #[cfg(test)]
    pub fn memory() -> rusqlite::Connection {
        rusqlite::Connection::open_in_memory().expect("open in-memory sqlite")
    }

    impl rusqlite::ToSql for Value {
        fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
            Ok(match self {
                Value::Null => ToSqlOutput::Borrowed(ValueRef::Null),
                Value::Int(v) => ToSqlOutput::Borrowed(ValueRef::Integer(*v)),
                Value::Real(v) => ToSqlOutput::Borrowed(ValueRef::Real(*v)),
                Value::Text(s) => ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes())),
                Value::Blob(b) => ToSqlOutput::Borrowed(ValueRef::Blob(b)),
            })
        }
    }

    fn err(e: rusqlite::Error) -> StoreError {
        StoreError { message: e.to_string() }
    }

    impl Sql for rusqlite::Connection {
        fn exec(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, StoreError> {
            super::check_bindings(sql, params)?;
            let mut stmt = self.prepare_cached(sql).map_err(err)?;
            let columns = stmt.column_count();
            let mut rows = stmt.query(rusqlite::params_from_iter(params.iter())).map_err(err)?;
            let mut out = Vec::new();
            while let Some(row) = rows.next().map_err(err)? {
                let mut values = Vec::with_capacity(columns);
                for i in 0..columns {
                    values.push(match row.get_ref(i).map_err(err)? {
                        ValueRef::Null => Value::Null,
                        ValueRef::Integer(v) => Value::Int(v),
                        ValueRef::Real(v) => Value::Real(v),
                        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
                        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
                    });
                }
                out.push(Row(values));
            }
            Ok(out)
        }

        fn batch(&self, sql: &str) -> Result<(), StoreError> {
            self.execute_batch(sql).map_err(err)
        }

        fn atomically(&self, work: &mut dyn FnMut() -> Result<(), StoreError>) -> Result<(), StoreError> {
            self.execute_batch("SAVEPOINT atomically").map_err(err)?;
            match work() {
                Ok(()) => self.execute_batch("RELEASE atomically").map_err(err),
                Err(e) => {
                    self.execute_batch("ROLLBACK TO atomically; RELEASE atomically").map_err(err)?;
                    Err(e)
                }
            }
        }
    }

    #[test]
    fn a_failed_unit_leaves_nothing_behind() {
        let db = memory();
        db.batch("CREATE TABLE t (v INTEGER);").unwrap();
        let failed = super::atomic(&db, || {
            db.exec("INSERT INTO t VALUES (1)", &[])?;
            db.exec("INSERT INTO nowhere VALUES (2)", &[])
        });
        assert!(failed.is_err());
        assert_eq!(super::atomic(&db, || db.exec("INSERT INTO t VALUES (3)", &[]).map(|_| 7)), Ok(7));
        let rows = db.exec("SELECT v FROM t", &[]).unwrap();
        assert_eq!(rows, vec![Row(vec![Value::Int(3)])], "the failed unit's insert was rolled back");
    }
}

/// Creates a store's tables. A store with no tables at all (a Durable Object's first
/// activation, or one whose storage was just deleted) gets every statement of `schemas` in one
/// batch: their `CREATE`s already have every column, so there is nothing to check. Any other
/// store gets `upgrade`, which creates what is missing and adds the columns later versions
/// introduced to tables an earlier one created. Each schema ends its last statement with `;`.
pub fn migrate(
    sql: &(impl Sql + ?Sized),
    schemas: &[&str],
    upgrade: impl FnOnce() -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    // A store that cannot say (an error) takes the path that is right for every store.
    if has_no_tables(sql).unwrap_or(false) {
        sql.batch(&schemas.concat())
    } else {
        upgrade()
    }
}

/// Whether the store has no tables of its own: SQLite's (`sqlite_…`) and the Durable Object
/// runtime's (`_cf_…`) do not count.
pub fn has_no_tables(sql: &(impl Sql + ?Sized)) -> Result<bool, StoreError> {
    let row = sql.one(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' \
         AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' AND name NOT LIKE '\\_cf\\_%' ESCAPE '\\'",
        &[],
    )?;
    Ok(row.and_then(|r| r.int(0)) == Some(0))
}

/// Whether the store has a table named `name`.
pub fn has_table(sql: &(impl Sql + ?Sized), name: &str) -> Result<bool, StoreError> {
    let row = sql.one("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?", &[name.into()])?;
    Ok(row.and_then(|r| r.int(0)).is_some_and(|n| n > 0))
}

/// Adds the `columns` (name, SQL definition) that `table` lacks: the schema of a table an
/// earlier version created grows in place, keeping its rows.
pub fn ensure_columns(sql: &(impl Sql + ?Sized), table: &str, columns: &[(&str, &str)]) -> Result<(), StoreError> {
    let existing: Vec<String> =
        sql.exec(&format!("PRAGMA table_info({table})"), &[])?.iter().filter_map(|r| r.text(1)).collect();
    for (name, definition) in columns {
        if !existing.iter().any(|c| c == name) {
            sql.exec(&format!("ALTER TABLE {table} ADD COLUMN {name} {definition}"), &[])?;
        }
    }
    Ok(())
}

/// A small key-value table for an agent's own identity (its class and name), which an alarm
/// wake-up cannot recover from the Durable Object id.
pub mod meta {
    use super::{Sql, StoreError, Value};

    /// The table.
    pub const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS agent_tool_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);";

    /// Reads a key.
    pub fn get(sql: &(impl Sql + ?Sized), key: &str) -> Result<Option<String>, StoreError> {
        Ok(sql.one("SELECT value FROM agent_tool_meta WHERE key = ?", &[Value::from(key)])?.and_then(|r| r.text(0)))
    }

    /// Writes several keys in one statement.
    pub fn set_all(sql: &(impl Sql + ?Sized), entries: &[(&str, &str)]) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        let rows = vec!["(?, ?)"; entries.len()].join(", ");
        let params: Vec<Value> = entries.iter().flat_map(|(k, v)| [Value::from(*k), Value::from(*v)]).collect();
        sql.exec(
            &format!(
                "INSERT INTO agent_tool_meta (key, value) VALUES {rows} \
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value"
            ),
            &params,
        )?;
        Ok(())
    }

    /// Writes a key.
    pub fn set(sql: &(impl Sql + ?Sized), key: &str, value: &str) -> Result<(), StoreError> {
        set_all(sql, &[(key, value)])
    }

    #[cfg(all(test, not(target_arch = "wasm32")))]
    #[test]
    fn set_then_get() {
        let db = super::sqlite::memory();
        db.batch(SCHEMA).unwrap();
        assert_eq!(get(&db, "name").unwrap(), None);
        set(&db, "name", "a").unwrap();
        set(&db, "name", "b").unwrap();
        assert_eq!(get(&db, "name").unwrap().as_deref(), Some("b"));
    }

    #[cfg(all(test, not(target_arch = "wasm32")))]
    #[test]
    fn set_all_writes_every_key_in_one_statement_and_replaces_old_values() {
        let db = super::sqlite::memory();
        db.batch(SCHEMA).unwrap();
        set(&db, "name", "old").unwrap();
        set_all(&db, &[("name", "n"), ("run_id", "r")]).unwrap();
        set_all(&db, &[]).unwrap();
        assert_eq!(get(&db, "name").unwrap().as_deref(), Some("n"));
        assert_eq!(get(&db, "run_id").unwrap().as_deref(), Some("r"));
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod migrate_tests {
    use super::sqlite::memory;
    use super::{has_no_tables, has_table, migrate, Sql};
    use crate::child::runs::{ChildRuns, SCHEMAS as CHILD};
    use crate::parent::engine::{
        create_tables as create_parent_tables, has_tables as parent_has_tables, migrate as migrate_parent,
        SCHEMAS as PARENT,
    };

    fn schemas() -> Vec<&'static str> {
        PARENT.iter().chain(CHILD.iter()).copied().collect()
    }

    fn upgrade(db: &rusqlite::Connection) -> Result<(), super::StoreError> {
        migrate_parent(db)?;
        ChildRuns::new(db).migrate()
    }

    /// Every table and index, with the SQL that made it.
    fn objects(db: &rusqlite::Connection) -> Vec<(String, String)> {
        db.exec("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY name", &[])
            .unwrap()
            .iter()
            .map(|r| (r.text(0).unwrap(), r.text(1).unwrap()))
            .collect()
    }

    #[test]
    fn a_new_store_gets_in_one_batch_exactly_the_tables_the_upgrade_path_makes() {
        let fresh = memory();
        assert!(has_no_tables(&fresh).unwrap());
        migrate(&fresh, &schemas(), || panic!("a new store takes the one-batch path")).unwrap();
        assert!(!has_no_tables(&fresh).unwrap());

        let upgraded = memory();
        upgrade(&upgraded).unwrap();
        assert_eq!(objects(&fresh), objects(&upgraded));
        assert!(objects(&fresh).len() >= 10, "{:?}", objects(&fresh));
    }

    #[test]
    fn a_store_with_an_earlier_versions_tables_is_upgraded_in_place() {
        let db = memory();
        db.batch(
            "CREATE TABLE agent_tool_child_runs (run_id TEXT PRIMARY KEY, status TEXT NOT NULL, \
             input_json TEXT, summary TEXT, output_json TEXT, error_message TEXT, started_at INTEGER NOT NULL, \
             completed_at INTEGER, progress_json TEXT, last_signal_at INTEGER, \
             event_delivery TEXT NOT NULL DEFAULT 'full'); \
             INSERT INTO agent_tool_child_runs (run_id, status, started_at) VALUES ('r1', 'completed', 1);",
        )
        .unwrap();
        assert!(!has_no_tables(&db).unwrap());
        migrate(&db, &schemas(), || upgrade(&db)).unwrap();
        let row = db.one("SELECT run_id, attempt, attempt_start FROM agent_tool_child_runs", &[]).unwrap().unwrap();
        assert_eq!((row.text(0).as_deref(), row.int(1), row.int(2)), (Some("r1"), Some(1), Some(0)));
    }

    #[test]
    fn a_store_made_role_by_role_has_the_tables_of_one_made_at_once() {
        // What a child object makes at once, then the parent role's tables at its first
        // dispatch: the same tables and indexes as a new store made with all of them.
        let [_registry, _ledger, meta] = PARENT;
        let by_role = memory();
        migrate(&by_role, &[&[meta][..], &CHILD[..]].concat(), || panic!("new")).unwrap();
        assert!(!parent_has_tables(&by_role).unwrap());
        assert!(has_table(&by_role, "agent_tool_child_runs").unwrap());
        create_parent_tables(&by_role).unwrap();
        assert!(parent_has_tables(&by_role).unwrap());

        let at_once = memory();
        migrate(&at_once, &schemas(), || panic!("new")).unwrap();
        assert_eq!(objects(&by_role), objects(&at_once));
    }

    #[test]
    fn a_users_own_table_makes_the_store_not_new() {
        let db = memory();
        db.batch("CREATE TABLE notes (id INTEGER PRIMARY KEY);").unwrap();
        let mut upgraded = false;
        migrate(&db, &schemas(), || {
            upgraded = true;
            upgrade(&db)
        })
        .unwrap();
        assert!(upgraded);
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    #[test]
    fn columns_are_listed_once_and_read_by_name() {
        columns!(mod col { run_id, status, started_at });
        assert_eq!(col::LIST, "run_id, status, started_at");
        assert_eq!((col::run_id, col::status, col::started_at), (0, 1, 2));
        let row = super::Row(vec![super::Value::from("r"), super::Value::from("running"), super::Value::Int(7)]);
        assert_eq!((row.text(col::status).as_deref(), row.int(col::started_at)), (Some("running"), Some(7)));
    }

    /// Durable Object storage carries bound integers as JavaScript numbers: one it would round
    /// is refused with the statement named, in the native store as in a Worker.
    #[test]
    fn an_integer_storage_would_round_is_refused() {
        use super::{Sql, Value, MAX_SAFE_INTEGER};
        let db = super::sqlite::memory();
        db.batch("CREATE TABLE t (n INTEGER)").unwrap();
        for n in [MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER, 0] {
            db.exec("INSERT INTO t (n) VALUES (?)", &[Value::Int(n)]).unwrap();
        }
        for n in [MAX_SAFE_INTEGER + 1, i64::MAX, i64::MIN] {
            let error = db.exec("INSERT INTO t (n) VALUES (?)", &[Value::Int(n)]).unwrap_err();
            assert!(error.message.contains(&n.to_string()) && error.message.contains("INSERT INTO t"), "{error}");
        }
        assert_eq!(db.one("SELECT COUNT(*) FROM t", &[]).unwrap().and_then(|r| r.int(0)), Some(3));
    }
}
