//! The Workers platform beneath the host: every touch of `worker`, `js_sys` and `wasm_bindgen`
//! lives here. Durable Object SQL behind [`crate::store::Sql`], the Durable Object as the host's
//! [`crate::host::Io`] (`worker_io.rs`: its clock, sockets, alarm, `wait_until` and children's
//! stubs), the calls between parent and child as HTTP (`child_http.rs`), the Durable Object's
//! events turned into the host's (`entry.rs`), the router, and the model providers' HTTP.

mod child_http;
mod entry;
pub(crate) mod model;
pub(crate) mod route;
mod worker_io;

use serde_json::json;
use worker::{Response, SqlStorage, SqlStorageValue};

use crate::store::{Row, Sql, StoreError, Value};

/// Durable Object SQLite behind [`Sql`].
#[derive(Clone, Debug)]
pub(crate) struct DoSql {
    /// `ctx.storage.sql`.
    pub(crate) sql: SqlStorage,
    /// `ctx.storage`, for `transactionSync`.
    storage: wasm_bindgen::JsValue,
}

impl DoSql {
    /// The object's SQL storage.
    pub(crate) fn of(state: &worker::State) -> Self {
        let storage = state.as_raw().storage().map(wasm_bindgen::JsValue::from).unwrap_or_default();
        Self { sql: state.storage().sql(), storage }
    }
}

// `transactionSync` rolls back when its callback throws; the callback here is Rust's, which
// reports failure by returning `false` (a stack closure, valid only during the call), and the
// snippet turns that into the throw and back.
#[wasm_bindgen::prelude::wasm_bindgen(inline_js = "export function atomically(storage, work) { \
    const rollback = new Error('rollback'); \
    try { storage.transactionSync(() => { if (!work()) throw rollback; }); return true; } \
    catch (e) { if (e === rollback) return false; throw e; } }")]
extern "C" {
    #[wasm_bindgen(catch)]
    fn atomically(
        storage: &wasm_bindgen::JsValue,
        work: &mut dyn FnMut() -> bool,
    ) -> Result<bool, wasm_bindgen::JsValue>;
}

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
        crate::store::check_bindings(sql, params)?;
        let bindings: Vec<SqlStorageValue> = params.iter().map(to_sql_value).collect();
        let cursor = self.sql.exec(sql, Some(bindings)).map_err(|e| store_error(sql, e))?;
        let mut rows = Vec::new();
        for row in cursor.raw() {
            let row = row.map_err(|e| store_error(sql, e))?;
            rows.push(Row(row.into_iter().map(from_sql_value).collect()));
        }
        Ok(rows)
    }

    fn batch(&self, sql: &str) -> Result<(), StoreError> {
        // Durable Object SQL runs every `;`-separated statement of one `exec`.
        let cursor = self.sql.exec(sql, None).map_err(|e| store_error(sql, e))?;
        for row in cursor.raw() {
            row.map_err(|e| store_error(sql, e))?;
        }
        Ok(())
    }

    fn atomically(&self, work: &mut dyn FnMut() -> Result<(), StoreError>) -> Result<(), StoreError> {
        let mut failure = None;
        let committed = atomically(&self.storage, &mut || match work() {
            Ok(()) => true,
            Err(e) => {
                failure = Some(e);
                false
            }
        });
        match (committed, failure) {
            (Ok(true), _) => Ok(()),
            (_, Some(e)) => Err(e),
            (Ok(false), None) => Err(StoreError { message: "a unit of work was rolled back".into() }),
            (Err(e), None) => Err(StoreError { message: format!("transactionSync failed: {e:?}") }),
        }
    }
}

/// A JSON body, parsed by `serde_json` from its text. `worker`'s own `json()` parses with JS's
/// `JSON.parse` and converts the result field by field through `serde_wasm_bindgen`, whose
/// deserializer code this leaves out of the Worker (with the sockets' attachments, ≈ 5 KB).
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(text: worker::Result<String>) -> Result<T, String> {
    let text = text.map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| e.to_string())
}

/// A JSON error body `{"error": message}` with `status`.
pub(crate) fn json_error(status: u16, message: impl Into<String>) -> worker::Result<Response> {
    Ok(Response::from_json(&json!({ "error": message.into() }))?.with_status(status))
}

/// A request made from its parts on the runtime's own `Request`. (`worker`'s
/// `Request::new_with_init` also converts a `RequestInit`'s `cf` properties, which no request
/// here has: 12 KB of code.)
pub(crate) fn new_request(
    url: &str,
    method: worker::Method,
    headers: Option<&worker::Headers>,
    body: Option<&wasm_bindgen::JsValue>,
) -> worker::Result<worker::Request> {
    let init = worker::worker_sys::web_sys::RequestInit::new();
    init.set_method(method.as_ref());
    if let Some(headers) = headers {
        init.set_headers(headers.as_ref());
    }
    if let Some(body) = body {
        init.set_body(body);
    }
    worker::worker_sys::web_sys::Request::new_with_str_and_init(url, &init).map(worker::Request::from).map_err(|e| {
        worker::Error::JsError(e.as_string().unwrap_or_else(|| "invalid URL or options for Request".to_owned()))
    })
}
