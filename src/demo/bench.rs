//! The bare platform costs `benches/compare.rs` sets the engine's numbers against, served by the
//! demo's parent as the RPC method `bench` when `BENCH_ROUTES=1` (never otherwise):
//!
//! - `{op: "ping"}`: one fetch to a child object and its answer (parent → child → parent);
//! - `{op: "ping-new"}`: the same to a child object that did not exist yet (as every run's is);
//! - `{op: "rpc"}`: one JS RPC call on a child's stub, or the runtime's reason for refusing it;
//! - `{op: "blast", n}`: `n` small frames sent to every client, back to back (the sockets
//!   looked up once);
//! - `{op: "seed", n, bytes}` then `{op: "read"}`: `n` rows of `bytes` in a table of the
//!   benchmark's own, then all of them read from SQLite and sent, as a replay would, with no
//!   engine in between;
//! - `{op: "memory"}`: the size of the isolate's WebAssembly memory (one instance serves every
//!   object of the Worker), in bytes.

use agent_tools::sql::Value as SqlValue;
use serde_json::{json, Value};

use super::assistant::Assistant;
use super::children::Researcher;
use agent_tools::prelude::*;
use agent_tools::AgentClass;

const TABLE: &str = "CREATE TABLE IF NOT EXISTS bench_rows (n INTEGER PRIMARY KEY, body TEXT NOT NULL)";

/// Serves one `bench` call.
pub(crate) async fn bench(host: &AgentHost<Assistant>, arg: Value) -> Result<Value, Error> {
    let (Some(env), Some(state)) = (host.env().worker(), host.state()) else {
        return Err("bench measures the Workers runtime: it runs in a Worker only".into());
    };
    let stub_named = |name: &str| {
        env.durable_object(<Researcher as AgentClass>::BINDING)
            .and_then(|ns| ns.id_from_name(name)?.get_stub())
            .map_err(|e| Error::Failed(e.to_string()))
    };
    let stub = || stub_named("bench-ping");
    match arg.get("op").and_then(Value::as_str) {
        Some("ping") => {
            let mut resp =
                stub()?.fetch_with_str("https://bench/ping").await.map_err(|e| Error::Failed(e.to_string()))?;
            Ok(json!({ "status": resp.status_code(), "bytes": resp.text().await.unwrap_or_default().len() }))
        }
        Some("ping-new") => {
            // A child object that did not exist: its creation (and its tables) included.
            let name = format!("bench-ping-{}", js_sys::Math::random());
            let mut resp = stub_named(&name)?
                .fetch_with_str("https://bench/ping")
                .await
                .map_err(|e| Error::Failed(e.to_string()))?;
            Ok(json!({ "status": resp.status_code(), "bytes": resp.text().await.unwrap_or_default().len() }))
        }
        Some("rpc") => {
            let stub: worker::wasm_bindgen::JsValue = stub()?.into_rpc();
            let method =
                js_sys::Reflect::get(&stub, &"agentToolsPing".into()).map_err(|e| Error::invalid(format!("{e:?}")))?;
            let call = js_sys::Function::from(method).call0(&stub).map_err(|e| Error::invalid(format!("{e:?}")))?;
            let outcome = worker::wasm_bindgen_futures::JsFuture::from(js_sys::Promise::from(call)).await;
            Ok(match outcome {
                Ok(v) => json!({ "ok": v.as_string() }),
                Err(e) => json!({ "error": js_sys::Error::from(e).message().as_string() }),
            })
        }
        Some("blast") => {
            let n = arg.get("n").and_then(Value::as_u64).unwrap_or(1000).min(1_000_000);
            let sockets = state.get_websockets();
            for i in 0..n {
                let frame = format!(
                    r#"{{"type":"bench-blast","i":{i},"body":"{{\"type\":\"text-delta\",\"id\":\"t\",\"delta\":\" word\"}}"}}"#
                );
                for ws in &sockets {
                    let _ = ws.send_with_str(&frame);
                }
            }
            Ok(json!({ "sent": n }))
        }
        Some("seed") => {
            let n = arg.get("n").and_then(Value::as_u64).unwrap_or(10_000).min(1_000_000) as i64;
            let bytes = arg.get("bytes").and_then(Value::as_u64).unwrap_or(80).min(100_000) as usize;
            let sql = host.sql();
            sql.exec(TABLE, &[]).map_err(|e| Error::Failed(e.to_string()))?;
            sql.exec("DELETE FROM bench_rows", &[]).map_err(|e| Error::Failed(e.to_string()))?;
            let body: SqlValue = "x".repeat(bytes).into();
            sql.exec(
                "WITH RECURSIVE k(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM k WHERE n < ?) \
                 INSERT INTO bench_rows (n, body) SELECT n, ? FROM k",
                &[n.into(), body],
            )
            .map_err(|e| Error::Failed(e.to_string()))?;
            Ok(json!({ "seeded": n }))
        }
        Some("read") => {
            let rows = host
                .sql()
                .exec("SELECT n, body FROM bench_rows ORDER BY n", &[])
                .map_err(|e| Error::Failed(e.to_string()))?;
            let sockets = state.get_websockets();
            for row in &rows {
                let frame = json!({ "type": "bench-read", "sequence": row.int(0),
                                    "event": { "kind": "chunk", "runId": "bench", "body": row.text(1) } });
                let frame = frame.to_string();
                for ws in &sockets {
                    let _ = ws.send_with_str(&frame);
                }
            }
            Ok(json!({ "sent": rows.len() }))
        }
        Some("memory") => {
            use worker::wasm_bindgen::JsCast;
            let memory: js_sys::WebAssembly::Memory = worker::wasm_bindgen::memory().unchecked_into();
            Ok(json!({ "bytes": js_sys::ArrayBuffer::from(memory.buffer()).byte_length() }))
        }
        _ => {
            Err("bench expects {op: \"ping\" | \"ping-new\" | \"rpc\" | \"blast\" | \"seed\" | \"read\" | \"memory\"}"
                .into())
        }
    }
}
