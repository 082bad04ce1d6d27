//! A Durable Object as the host's [`Io`]: its SQLite storage, the runtime's clock and
//! `crypto.getRandomValues`, `wait_until`, timers, its alarm, its hibernatable WebSockets, and
//! its children's stubs.

use std::cell::OnceCell;
use std::rc::Rc;
use std::time::Duration;

use futures::StreamExt;
use wasm_bindgen::JsValue;
use worker::worker_sys::ext::WebSocketExt;
use worker::{Delay, Method, State, WebSocket, WebSocketPair};

use super::child_http;
use super::DoSql;
use crate::host::{ChildCall, ChildReply, HttpRequest, Io, LocalFuture, Reply, Socket};
use crate::parent::engine::ChildAddress;
use crate::store::Sql;

/// Tag of every client socket.
pub(crate) const CLIENT_TAG: &str = "agent-client";

/// A Durable Object.
pub(crate) struct WorkerIo {
    state: State,
    worker_env: worker::Env,
    env: crate::Env,
    sql: DoSql,
}

impl WorkerIo {
    pub(crate) fn new(state: State, env: worker::Env) -> Self {
        let sql = DoSql::of(&state);
        Self { state, worker_env: env.clone(), env: crate::Env::of_worker(env), sql }
    }

    fn stub(&self, to: &ChildAddress) -> worker::Result<worker::Stub> {
        self.worker_env.durable_object(&to.binding)?.id_from_name(&to.name)?.get_stub()
    }
}

/// A client's WebSocket, known by the connection id kept in its attachment (it survives
/// hibernation).
pub(crate) struct WorkerSocket {
    ws: WebSocket,
    id: OnceCell<String>,
}

impl WorkerSocket {
    pub(crate) fn new(ws: WebSocket) -> Self {
        Self { ws, id: OnceCell::new() }
    }

    /// Accepts `ws` as a client socket with a fresh connection id: its attachment is `{ id }`,
    /// built and read as a JS object (through `worker`'s `serialize_attachment`, every socket's
    /// id would go through `serde_wasm_bindgen`).
    fn accept(state: &State, ws: WebSocket) -> Self {
        let id = uuid::Uuid::new_v4().to_string();
        state.accept_websocket_with_tags(&ws, &[CLIENT_TAG]);
        let attachment = js_sys::Object::new();
        let _ = js_sys::Reflect::set(&attachment, &JsValue::from_str("id"), &JsValue::from_str(&id));
        let _ = ws.as_ref().serialize_attachment(attachment.into());
        let socket = Self::new(ws);
        let _ = socket.id.set(id);
        socket
    }
}

impl Socket for WorkerSocket {
    fn id(&self) -> String {
        self.id
            .get_or_init(|| {
                self.ws
                    .as_ref()
                    .deserialize_attachment()
                    .ok()
                    .filter(|a| a.is_object())
                    .and_then(|a| js_sys::Reflect::get(&a, &JsValue::from_str("id")).ok())
                    .and_then(|id| id.as_string())
                    .unwrap_or_default()
            })
            .clone()
    }

    fn send(&self, text: &str) -> bool {
        self.ws.send_with_str(text).is_ok()
    }

    fn close(&self, code: u16, reason: &str) {
        let _ = self.ws.close(Some(code), Some(reason));
    }
}

impl Io for WorkerIo {
    fn now(&self) -> i64 {
        js_sys::Date::now() as i64
    }

    fn random_id(&self) -> String {
        uuid::Uuid::new_v4().to_string()
    }

    fn sql(&self) -> &dyn Sql {
        &self.sql
    }

    fn env(&self) -> &crate::Env {
        &self.env
    }

    fn spawn(&self, work: LocalFuture<'static, ()>) {
        self.state.wait_until(work);
    }

    fn sleep(&self, ms: u64) -> LocalFuture<'static, ()> {
        Box::pin(Delay::from(Duration::from_millis(ms)))
    }

    fn alarm(&self) -> LocalFuture<'static, Result<Option<i64>, String>> {
        let storage = self.state.storage();
        Box::pin(async move { storage.get_alarm().await.map_err(|e| e.to_string()) })
    }

    fn set_alarm(&self, at: i64) -> LocalFuture<'static, Result<(), String>> {
        let storage = self.state.storage();
        Box::pin(async move {
            // `set_alarm(i64)` takes an offset from now, not a time: pass a Date.
            let when = worker::ScheduledTime::new(js_sys::Date::new(&JsValue::from_f64(at as f64)));
            storage.set_alarm(when).await.map_err(|e| e.to_string())
        })
    }

    fn delete_all(&self) -> LocalFuture<'static, Result<(), String>> {
        let storage = self.state.storage();
        Box::pin(async move { storage.delete_all().await.map_err(|e| e.to_string()) })
    }

    fn sockets(&self) -> Vec<Rc<dyn Socket>> {
        let sockets = self.state.get_websockets_with_tag(CLIENT_TAG);
        sockets.into_iter().map(|ws| Rc::new(WorkerSocket::new(ws)) as Rc<dyn Socket>).collect()
    }

    fn accept(&self) -> Result<(Rc<dyn Socket>, Reply), String> {
        let pair = WebSocketPair::new().map_err(|e| e.to_string())?;
        let socket = WorkerSocket::accept(&self.state, pair.server);
        let response = worker::Response::from_websocket(pair.client).map_err(|e| e.to_string())?;
        Ok((Rc::new(socket), Reply::Native(Box::new(response))))
    }

    fn refuse_socket(&self, code: u16, reason: &str) -> Result<Reply, String> {
        let pair = WebSocketPair::new().map_err(|e| e.to_string())?;
        pair.server.accept().map_err(|e| e.to_string())?;
        pair.server.close(Some(code), Some(reason)).map_err(|e| e.to_string())?;
        let response = worker::Response::from_websocket(pair.client).map_err(|e| e.to_string())?;
        Ok(Reply::Native(Box::new(response)))
    }

    fn has_binding(&self, binding: &str) -> bool {
        self.worker_env.durable_object(binding).is_ok()
    }

    fn call_child(&self, to: &ChildAddress, call: ChildCall) -> LocalFuture<'static, Result<ChildReply, String>> {
        let stub = self.stub(to);
        Box::pin(async move {
            let stub = stub.map_err(|e| e.to_string())?;
            let request = child_http::request(&call)?;
            let mut response = stub.fetch_with_request(request).await.map_err(|e| e.to_string())?;
            let status = response.status_code();
            if status != 200 {
                let body = response.text().await.unwrap_or_default();
                return Ok(ChildReply::Refused { status, body });
            }
            Ok(match call {
                ChildCall::Start(_) | ChildCall::Tail { .. } => {
                    let stream = response.stream().map_err(|e| e.to_string())?;
                    ChildReply::Tail(Box::pin(stream.map(|chunk| chunk.map_err(|e| e.to_string()))))
                }
                ChildCall::Inspect { .. } => {
                    ChildReply::Inspection(super::parse_json(response.text().await).map_err(|e| e.to_string())?)
                }
                ChildCall::Cancel(_) | ChildCall::Clear | ChildCall::Message(_) => {
                    ChildReply::Done(super::parse_json(response.text().await).unwrap_or_default())
                }
            })
        })
    }

    fn forward(&self, to: &ChildAddress, request: HttpRequest) -> LocalFuture<'static, Result<Reply, String>> {
        let stub = self.stub(to);
        Box::pin(async move {
            let stub = stub.map_err(|e| e.to_string())?;
            let request = super::entry::worker_request(request)?;
            let response = stub.fetch_with_request(request).await.map_err(|e| e.to_string())?;
            Ok(Reply::Native(Box::new(response)))
        })
    }

    fn log(&self, line: &str, error: bool) {
        if error {
            worker::console_error!("{line}");
        } else {
            worker::console_log!("{line}");
        }
    }

    fn state(&self) -> Option<&State> {
        Some(&self.state)
    }
}

/// The method of an HTTP request, as `worker` names it.
pub(crate) fn method(method: &http::Method) -> Method {
    Method::from(method.as_str().to_owned())
}
