//! The Durable Object's events, turned into the host's: what the class
//! [`crate::durable_object!`] generates calls. Requests become [`HttpRequest`]s (or a parent's
//! [`crate::host::ChildCall`]s), WebSockets [`Socket`]s, and the host's replies `worker`
//! responses.

use std::rc::Rc;

use worker::{Request, Response, State, WebSocket, WebSocketIncomingMessage};

use super::child_http;
use super::worker_io::{method, WorkerIo, WorkerSocket};
use crate::agent::Agent;
use crate::host::{AgentHost, HttpRequest, LocalFuture, Reply};
use crate::routing::RequestUrl;

impl<A: Agent> AgentHost<A> {
    #[doc(hidden)] // called by the class `durable_object!` generates
    /// Creates the host and its tables. Called by the Durable Object's constructor.
    pub fn new(state: State, env: worker::Env) -> Self {
        Self::with_io(Rc::new(WorkerIo::new(state, env)))
    }

    #[doc(hidden)] // called by the class `durable_object!` generates
    /// Serves a request: a parent's call, drill-in (`/sub/…`), WebSocket upgrades,
    /// `GET /get-messages`, and anything else through [`Agent::on_request`].
    pub async fn fetch(&self, req: Request) -> worker::Result<Response> {
        let served: LocalFuture<'_, _> = Box::pin(serve(self.host.clone(), req));
        served.await
    }

    #[doc(hidden)] // called by the class `durable_object!` generates
    /// Handles one client frame: RPC calls and chat frames. Anything malformed gets an error
    /// frame and the socket stays open.
    pub async fn websocket_message(&self, ws: WebSocket, message: WebSocketIncomingMessage) -> worker::Result<()> {
        let message = match message {
            WebSocketIncomingMessage::String(text) => Ok(text),
            WebSocketIncomingMessage::Binary(_) => Err(()),
        };
        let handled: LocalFuture<'_, _> =
            Box::pin(self.host.websocket_message(Rc::new(WorkerSocket::new(ws)), message));
        handled.await;
        Ok(())
    }

    #[doc(hidden)] // called by the class `durable_object!` generates
    /// Handles a client going away.
    pub async fn websocket_close(&self, ws: WebSocket, code: usize, reason: String) -> worker::Result<()> {
        let code = u16::try_from(code).unwrap_or(1000);
        self.host.websocket_closed(&WorkerSocket::new(ws), code, &reason);
        Ok(())
    }

    #[doc(hidden)] // called by the class `durable_object!` generates
    /// Handles a socket error: the client is gone.
    pub async fn websocket_error(&self, ws: WebSocket) -> worker::Result<()> {
        self.host.websocket_closed(&WorkerSocket::new(ws), 1011, "socket error");
        Ok(())
    }

    #[doc(hidden)] // called by the class `durable_object!` generates
    /// Handles the alarm: recovers undriven runs, runs the detached backbone, runs due
    /// scheduled tasks, and keeps the alarm armed for whatever comes next.
    pub async fn alarm(&self) -> worker::Result<Response> {
        let handled: LocalFuture<'_, _> = Box::pin(self.host.alarm());
        handled.await;
        Response::ok("")
    }
}

/// One request to an agent's object: a parent's call to this child, or a client's request.
async fn serve(host: crate::host::core::Host, req: Request) -> worker::Result<Response> {
    let url = RequestUrl::new(req.inner().url());
    if child_http::is_call(&url) {
        return match child_http::call(req, host.0.class).await {
            Ok(call) => child_http::response(host.serve_child(call).await),
            Err(refusal) => refusal,
        };
    }
    let request = match http_request(req).await {
        Ok(request) => request,
        Err(e) => return super::json_error(400, e),
    };
    response(host.fetch(request).await)
}

/// A `worker` request as the host reads it, its body read into memory (the Worker entry has
/// bounded it).
async fn http_request(mut req: Request) -> Result<HttpRequest, String> {
    let mut builder = http::Request::builder().method(req.method().as_ref()).uri(req.inner().url());
    for (name, value) in req.headers().entries() {
        builder = builder.header(name, value);
    }
    let body = match req.method() {
        worker::Method::Get | worker::Method::Head => Vec::new(),
        _ => req.bytes().await.unwrap_or_default(),
    };
    builder.body(body).map_err(|e| format!("the request could not be read: {e}"))
}

/// The host's reply as a `worker` response.
fn response(reply: Reply) -> worker::Result<Response> {
    match reply {
        Reply::Http(response) => {
            let (parts, body) = response.into_parts();
            let mut out = Response::from_bytes(body)?.with_status(parts.status.as_u16());
            for (name, value) in &parts.headers {
                if let Ok(value) = value.to_str() {
                    out.headers_mut().set(name.as_str(), value)?;
                }
            }
            Ok(out)
        }
        Reply::Native(native) => match native.downcast::<Response>() {
            Ok(response) => Ok(*response),
            Err(_) => super::json_error(500, "a reply of another platform"),
        },
    }
}

/// An [`HttpRequest`] as a `worker` request (drill-in forwards one to a child).
pub(crate) fn worker_request(request: HttpRequest) -> Result<Request, String> {
    let (parts, body) = request.into_parts();
    let headers = worker::Headers::new();
    for (name, value) in &parts.headers {
        if let Ok(value) = value.to_str() {
            headers.set(name.as_str(), value).map_err(|e| e.to_string())?;
        }
    }
    let body = (!body.is_empty()).then(|| js_sys::Uint8Array::from(body.as_slice()).into());
    super::new_request(&parts.uri.to_string(), method(&parts.method), Some(&headers), body.as_ref())
        .map_err(|e| e.to_string())
}
