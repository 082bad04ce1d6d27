//! The seam between the host and what runs it: [`Io`] is everything the host asks of its
//! object's platform (storage, time, background work, timers, the alarm, client sockets, its
//! children), so the same host, engines and agent code run in a Durable Object (`platform/`) and
//! natively in a test (`testing/`). Only what is beneath this trait differs.

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

use futures::Stream;
use serde_json::Value;

use crate::parent::engine::ChildAddress;
use crate::protocol::child_api::{CancelRequest, InspectionReply, MessageRequest, StartRequest};
use crate::store::Sql;

/// A future that stays on the thread it was made on (Workers are single-threaded).
pub(crate) type LocalFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// Bytes as they arrive (a child's tail).
pub(crate) type ByteStream = Pin<Box<dyn Stream<Item = Result<Vec<u8>, String>>>>;

/// An HTTP request that reached an agent, its body read into memory (at most
/// [`crate::limits::MAX_BODY_BYTES`]). A WebSocket upgrade is a request with `Upgrade: websocket`.
pub type HttpRequest = http::Request<Vec<u8>>;

/// An HTTP response an agent gives.
pub type HttpResponse = http::Response<Vec<u8>>;

/// What answers a request.
pub(crate) enum Reply {
    /// An HTTP response.
    Http(HttpResponse),
    /// The platform's own response: an accepted WebSocket's, or a child's answer to a forwarded
    /// request, as it came.
    Native(Box<dyn Any>),
}

/// One client connection this object accepted.
pub(crate) trait Socket {
    /// Its connection id (it survives the object's hibernation).
    fn id(&self) -> String;
    /// Sends a text frame; `false` when the connection is gone.
    fn send(&self, text: &str) -> bool;
    /// Closes it.
    fn close(&self, code: u16, reason: &str);
}

/// A call from a parent to one of its children (the child's internal API).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ChildCall {
    /// Start a run (idempotent); answered with its tail from `tail_after`.
    Start(StartRequest),
    /// Tail a run after a log index.
    Tail {
        /// The run.
        run_id: String,
        /// The cursor.
        after: i64,
    },
    /// Where a run stands.
    Inspect {
        /// The run.
        run_id: String,
    },
    /// Stop a run.
    Cancel(CancelRequest),
    /// A message for a run that waits for it.
    Message(MessageRequest),
    /// Delete everything the child stored.
    Clear,
}

/// A child's answer.
pub(crate) enum ChildReply {
    /// A run's tail: NDJSON lines as they come.
    Tail(ByteStream),
    /// An inspection (`None`: the child does not know the run).
    Inspection(Option<Box<InspectionReply>>),
    /// A cancel or a clear was done (its JSON answer).
    Done(Value),
    /// The child refused the call (a malformed request, an unknown run, its storage failed).
    Refused {
        /// The HTTP status it answered with.
        status: u16,
        /// What it said.
        body: String,
    },
}

/// Everything the host asks of the platform beneath it, for one object.
pub(crate) trait Io {
    /// Milliseconds since the epoch (the platform's clock, or a test's).
    fn now(&self) -> i64;
    /// A fresh random id (a v4 UUID in a Worker).
    fn random_id(&self) -> String;
    /// The object's SQLite storage.
    fn sql(&self) -> &dyn Sql;
    /// The Worker's environment.
    fn env(&self) -> &crate::Env;
    /// Runs `work` in the background; the object stays up until it ends.
    fn spawn(&self, work: LocalFuture<'static, ()>);
    /// Resolves after `ms` milliseconds.
    fn sleep(&self, ms: u64) -> LocalFuture<'static, ()>;
    /// When the object's alarm is set to fire, if it is.
    fn alarm(&self) -> LocalFuture<'static, Result<Option<i64>, String>>;
    /// Sets the object's alarm (epoch ms).
    fn set_alarm(&self, at: i64) -> LocalFuture<'static, Result<(), String>>;
    /// Deletes everything the object stored.
    fn delete_all(&self) -> LocalFuture<'static, Result<(), String>>;
    /// The client connections open now.
    fn sockets(&self) -> Vec<Rc<dyn Socket>>;
    /// Accepts a client connection (a WebSocket upgrade): the socket, and the reply that
    /// completes the upgrade.
    fn accept(&self) -> Result<(Rc<dyn Socket>, Reply), String>;
    /// Completes an upgrade with a socket closed at once (`code`: 4000 + an HTTP status, which
    /// the stock client takes as final).
    fn refuse_socket(&self, code: u16, reason: &str) -> Result<Reply, String>;
    /// Whether the Worker has the Durable Object binding `binding`.
    fn has_binding(&self, binding: &str) -> bool;
    /// Calls a child.
    fn call_child(&self, to: &ChildAddress, call: ChildCall) -> LocalFuture<'static, Result<ChildReply, String>>;
    /// Hands a client's request to a child (drill-in), and its answer back as it came.
    fn forward(&self, to: &ChildAddress, request: HttpRequest) -> LocalFuture<'static, Result<Reply, String>>;
    /// Writes a log line (an error when `error`).
    fn log(&self, line: &str, error: bool);
    /// The Durable Object's state, in a Worker.
    fn state(&self) -> Option<&worker::State> {
        None
    }
    /// The model that stands in for the agent's own ([`crate::Agent::model`]), if any: the test
    /// kit's script. `None` in a Worker.
    fn model(&self) -> Option<Rc<dyn crate::chat::turn::DynModel>> {
        None
    }
    /// The agent's `hook` for `run` begins; what this returns is dropped when the hook returns
    /// (or its object's crash drops it). The test kit counts the calls the contract bounds
    /// (the finish hook once per run, the detached handler once per attempt); a Worker does
    /// nothing.
    fn hook_begins(&self, _hook: BoundedHook, _run: &crate::types::RunInfo) -> Option<Box<dyn Any>> {
        None
    }
}

/// A hook whose calls the contract bounds ([`Io::hook_begins`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BoundedHook {
    /// `on_agent_tool_finish`: once per run.
    Finish,
    /// `on_detached_finish`: once per delivery attempt.
    Delivery,
}

/// The Worker's environment as an agent reads it: its vars and secrets (and, in a Worker, the
/// bindings, through [`Env::worker`]). A test builds one from a map ([`Env::from_vars`]).
///
/// ```
/// use agent_tools::Env;
///
/// let env = Env::from_vars([("MODEL", "gpt-4o-mini"), ("EMPTY", "")]);
/// assert_eq!(env.var("MODEL").as_deref(), Some("gpt-4o-mini"));
/// assert_eq!(env.var("EMPTY"), None, "an empty var is unset");
/// assert!(env.worker().is_none(), "no bindings outside a Worker");
/// ```
#[derive(Clone, Default)]
pub struct Env {
    worker: Option<worker::Env>,
    vars: HashMap<String, String>,
}

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Secrets never reach a log.
        f.debug_struct("Env").field("worker", &self.worker.is_some()).finish_non_exhaustive()
    }
}

impl Env {
    /// The Worker's environment.
    pub(crate) fn of_worker(env: worker::Env) -> Self {
        Self { worker: Some(env), vars: HashMap::new() }
    }

    /// An environment of these vars (and nothing else): what a test gives its agents.
    pub fn from_vars<K: Into<String>, V: Into<String>>(vars: impl IntoIterator<Item = (K, V)>) -> Self {
        Self { worker: None, vars: vars.into_iter().map(|(k, v)| (k.into(), v.into())).collect() }
    }

    /// A var or a secret, if set and not empty.
    pub fn var(&self, name: &str) -> Option<String> {
        let value = match &self.worker {
            Some(env) => env.var(name).map(|v| v.to_string()).or_else(|_| env.secret(name).map(|s| s.to_string())).ok(),
            None => self.vars.get(name).cloned(),
        }?;
        (!value.is_empty()).then_some(value)
    }

    /// The Worker's own environment (its bindings: a Workers AI binding, a KV namespace…);
    /// `None` outside a Worker.
    pub fn worker(&self) -> Option<&worker::Env> {
        self.worker.as_ref()
    }
}

/// How native code waits: a future that resolves after so many milliseconds.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) type Sleeper = Rc<dyn Fn(u64) -> LocalFuture<'static, ()>>;

#[cfg(not(target_arch = "wasm32"))]
thread_local! {
    /// How native code waits (a test's virtual clock); unset, it does not wait.
    static NATIVE_SLEEP: std::cell::RefCell<Option<Sleeper>> = const { std::cell::RefCell::new(None) };
}

/// Waits `ms` milliseconds on the clock of whatever runs this code: the runtime's timers in a
/// Worker, a test's clock natively. For code with no object at hand (a model's pace, a
/// provider's stall timeout).
pub(crate) fn pause(ms: u64) -> LocalFuture<'static, ()> {
    #[cfg(target_arch = "wasm32")]
    {
        Box::pin(worker::Delay::from(std::time::Duration::from_millis(ms)))
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        NATIVE_SLEEP.with(|sleep| sleep.borrow().as_ref().map(|sleep| sleep(ms))).unwrap_or_else(|| Box::pin(async {}))
    }
}

/// Waits `duration` on the clock of whatever runs this code: the runtime's timers in a Worker,
/// the test kit's virtual clock in a test. For code with no [`crate::AgentHost`] at hand, as a
/// model's own pacing ([`crate::AgentHost::sleep`] is the same on an object's clock).
pub fn sleep(duration: std::time::Duration) -> impl Future<Output = ()> + 'static {
    pause(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(all(test, not(target_arch = "wasm32")))]
thread_local! {
    /// Whether the parent engine's events and decisions are logged (the simulation's replay).
    pub(crate) static TRACE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Sets how native code waits (the test kit's clock), for this thread.
#[cfg(all(any(test, feature = "testing"), not(target_arch = "wasm32")))]
pub(crate) fn set_native_sleep(sleep: Option<Sleeper>) {
    NATIVE_SLEEP.with(|current| *current.borrow_mut() = sleep);
}

/// A JSON error body `{"error": message}` with `status`.
pub fn json_error(status: u16, message: impl Into<String>) -> HttpResponse {
    json_response(status, &serde_json::json!({ "error": message.into() }))
}

/// A JSON body with `status`.
pub fn json_response(status: u16, body: &impl serde::Serialize) -> HttpResponse {
    let body = serde_json::to_vec(body).unwrap_or_default();
    let mut response = http::Response::new(body);
    *response.status_mut() = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    response
}

/// Whether a request asks for a WebSocket.
pub(crate) fn is_upgrade(request: &HttpRequest) -> bool {
    request
        .headers()
        .get(http::header::UPGRADE)
        .and_then(|u| u.to_str().ok())
        .is_some_and(|u| u.eq_ignore_ascii_case("websocket"))
}
