//! The edge: every touch of the Workers platform lives here (wasm32 only).
//!
//! Durable Object SQL behind [`crate::store::Sql`], the clock, ids, JSON responses, and the two
//! hosts that bind the parent and child logic to Durable Objects, WebSockets and stubs.

pub mod chat;
pub mod child;
pub mod model;
pub mod parent;
pub mod route;

use serde_json::json;
use wasm_bindgen::JsValue;
use worker::{Response, SqlStorage, SqlStorageValue};

use crate::store::{Row, Sql, StoreError, Value};

/// Durable Object SQLite behind [`Sql`].
#[derive(Clone, Debug)]
pub struct DoSql(pub SqlStorage);

fn to_sql_value(v: &Value) -> SqlStorageValue {
    match v {
        Value::Null => SqlStorageValue::Null,
        Value::Int(i) => SqlStorageValue::Integer(*i),
        Value::Real(f) => SqlStorageValue::Float(*f),
        Value::Text(s) => SqlStorageValue::String(s.clone()),
        Value::Blob(b) => SqlStorageValue::Blob(b.clone()),
    }
}

fn from_sql_value(v: SqlStorageValue) -> Value {
    match v {
        SqlStorageValue::Null => Value::Null,
        SqlStorageValue::Boolean(b) => Value::Int(b as i64),
        SqlStorageValue::Integer(i) => Value::Int(i),
        SqlStorageValue::Float(f) => Value::Real(f),
        SqlStorageValue::String(s) => Value::Text(s),
        SqlStorageValue::Blob(b) => Value::Blob(b),
    }
}

fn store_error(sql: &str, e: impl std::fmt::Display) -> StoreError {
    let head: String = sql.split_whitespace().take(6).collect::<Vec<_>>().join(" ");
    StoreError { message: format!("{e} (in `{head} …`)") }
}

impl Sql for DoSql {
    fn exec(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, StoreError> {
        let bindings: Vec<SqlStorageValue> = params.iter().map(to_sql_value).collect();
        let cursor = self.0.exec(sql, Some(bindings)).map_err(|e| store_error(sql, e))?;
        let mut rows = Vec::new();
        for row in cursor.raw() {
            let row = row.map_err(|e| store_error(sql, e))?;
            rows.push(Row(row.into_iter().map(from_sql_value).collect()));
        }
        Ok(rows)
    }

    fn batch(&self, sql: &str) -> Result<(), StoreError> {
        // Durable Object SQL runs every `;`-separated statement of one `exec`.
        let cursor = self.0.exec(sql, None).map_err(|e| store_error(sql, e))?;
        for row in cursor.raw() {
            row.map_err(|e| store_error(sql, e))?;
        }
        Ok(())
    }
}

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    js_sys::Date::now() as i64
}

/// A random id (`crypto.randomUUID()`).
pub fn random_id() -> String {
    let uuid = js_sys::Reflect::get(&js_sys::global(), &JsValue::from_str("crypto"))
        .and_then(|crypto| {
            let f = js_sys::Reflect::get(&crypto, &JsValue::from_str("randomUUID"))?;
            js_sys::Function::from(f).call0(&crypto)
        })
        .ok()
        .and_then(|v| v.as_string());
    uuid.unwrap_or_else(|| format!("{:x}{:x}", now_ms(), (js_sys::Math::random() * 1e15) as u64))
}

/// A JSON error body `{"error": message}` with `status`.
pub fn json_error(status: u16, message: impl Into<String>) -> worker::Result<Response> {
    Ok(Response::from_json(&json!({ "error": message.into() }))?.with_status(status))
}
