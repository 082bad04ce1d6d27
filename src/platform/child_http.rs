//! The calls between a parent and its children as HTTP between their Durable Objects: a
//! [`ChildCall`] becomes a request to the child's stub on the internal host (which the Worker
//! entry never routes to), and the child turns the request back into the call and its
//! [`ChildReply`] into the response (a tail streams NDJSON).

use std::collections::HashMap;

use wasm_bindgen::JsValue;
use worker::{Method, Request, Response};

use super::{json_error, new_request, parse_json};
use crate::host::{ChildCall, ChildReply};
use crate::protocol::child_api::{self, CancelRequest, MessageRequest, StartRequest};
use crate::routing::RequestUrl;

/// The request a call travels as.
pub(crate) fn request(call: &ChildCall) -> Result<Request, String> {
    let base = child_api::BASE;
    let (method, url, body) = match call {
        ChildCall::Start(start) => (Method::Post, format!("{base}/start"), Some(serde_json::to_string(start))),
        ChildCall::Tail { run_id, after } => (Method::Get, child_api::tail_url(run_id, *after), None),
        ChildCall::Inspect { run_id } => (Method::Get, child_api::inspect_url(run_id), None),
        ChildCall::Cancel(cancel) => (Method::Post, format!("{base}/cancel"), Some(serde_json::to_string(cancel))),
        ChildCall::Clear => (Method::Post, format!("{base}/clear"), Some(Ok("{}".to_owned()))),
        ChildCall::Message(message) => (Method::Post, format!("{base}/message"), Some(serde_json::to_string(message))),
    };
    let body = body.transpose().map_err(|e| e.to_string())?.map(|b| JsValue::from_str(&b));
    new_request(&url, method, None, body.as_ref()).map_err(|e| e.to_string())
}

/// Whether a request is a parent's call (it came to the internal host).
pub(crate) fn is_call(url: &RequestUrl) -> bool {
    url.host() == child_api::HOST
}

/// The call a request carries, or the response that refuses it.
pub(crate) async fn call(mut req: Request, class: &str) -> Result<ChildCall, worker::Result<Response>> {
    let url = RequestUrl::new(req.inner().url());
    let query: HashMap<String, String> = url.query_pairs().collect();
    let run_id = query.get("runId").cloned().unwrap_or_default();
    match (req.method(), url.path()) {
        (Method::Post, "/_agent_tools/start") => match parse_json::<StartRequest>(req.text().await) {
            Ok(start) => Ok(ChildCall::Start(start)),
            Err(e) => Err(json_error(400, format!("malformed start request: {e}"))),
        },
        (Method::Get, "/_agent_tools/tail") => {
            let after = query.get("after").and_then(|a| a.parse::<i64>().ok()).unwrap_or(-1);
            Ok(ChildCall::Tail { run_id, after })
        }
        (Method::Get, "/_agent_tools/inspect") => Ok(ChildCall::Inspect { run_id }),
        (Method::Post, "/_agent_tools/cancel") => match parse_json::<CancelRequest>(req.text().await) {
            Ok(cancel) => Ok(ChildCall::Cancel(cancel)),
            Err(e) => Err(json_error(400, format!("malformed cancel request: {e}"))),
        },
        (Method::Post, "/_agent_tools/clear") => Ok(ChildCall::Clear),
        (Method::Post, "/_agent_tools/message") => match parse_json::<MessageRequest>(req.text().await) {
            Ok(message) => Ok(ChildCall::Message(message)),
            Err(e) => Err(json_error(400, format!("malformed message request: {e}"))),
        },
        (_, path) => Err(json_error(404, format!("{class} has no route {path}"))),
    }
}

/// The response an answer travels as.
pub(crate) fn response(reply: ChildReply) -> worker::Result<Response> {
    match reply {
        ChildReply::Tail(stream) => {
            let mut resp = Response::from_stream(stream)?;
            resp.headers_mut().set("content-type", "application/x-ndjson")?;
            Ok(resp)
        }
        ChildReply::Inspection(inspection) => Response::from_json(&inspection),
        ChildReply::Done(value) => Response::from_json(&value),
        ChildReply::Refused { status, body } => {
            // The body is the refusal's JSON already, or the words for one.
            match serde_json::from_str::<serde_json::Value>(&body) {
                Ok(value) => Ok(Response::from_json(&value)?.with_status(status)),
                Err(_) => json_error(status, body),
            }
        }
    }
}
