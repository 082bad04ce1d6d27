//! The Worker entry's router: `/agents/<agent-kebab>/<name>` to the agent's Durable Object.

use futures::StreamExt;
use worker::{Env, Method, Request, RequestInit, Response};

use super::json_error;
use crate::routing::{kebab_case, parse_agent_path};

/// Routes a request to the agent it names. Only the classes in `agents` are routable (list your
/// parents here, never a child: children are reached only through their parent's drill-in
/// gate). Each class must be bound under its own name in `wrangler.toml`. Anything else is a
/// JSON error: 404 for an unknown path or agent, 405 for a method other than GET/HEAD (agents
/// talk over WebSockets and answer GETs), 400 for an oversized name.
pub async fn route_agent_request(req: Request, env: &Env, agents: &[&str]) -> worker::Result<Response> {
    let url = req.url()?;
    // A body no handler reads must still be consumed, or the runtime's proxy fails later
    // requests ("Can't read from request stream after response has been sent").
    let req = without_body(req).await?;
    let Some(path) = parse_agent_path(url.path()) else {
        return json_error(404, format!("no route for {}; agents live at /agents/<agent>/<name>", url.path()));
    };
    let Some(class) = agents.iter().find(|class| kebab_case(class) == path.agent) else {
        let known: Vec<String> = agents.iter().map(|c| kebab_case(c)).collect();
        return json_error(404, format!("unknown agent {:?}; this Worker serves {known:?}", path.agent));
    };
    if !matches!(req.method(), Method::Get | Method::Head) {
        return json_error(
            405,
            format!("{} is not served here: agents answer GET and WebSocket upgrades", req.method()),
        );
    }
    if path.name.len() > 512 {
        return json_error(400, "agent name is longer than 512 bytes");
    }
    let stub = env.durable_object(class)?.id_from_name(&path.name)?.get_stub()?;
    stub.fetch_with_request(req).await
}

/// The request without its body (read and dropped, so the sender is not left writing into the
/// void).
async fn without_body(req: Request) -> worker::Result<Request> {
    if req.inner().body().is_none() {
        return Ok(req);
    }
    // Read to the end chunk by chunk, keeping nothing: memory stays flat for any size. (Cancelling
    // the stream instead makes wrangler dev's proxy fail later requests with 503/500 or hang.)
    let mut req = req;
    if let Ok(mut body) = req.stream() {
        while let Some(Ok(_)) = body.next().await {}
    }
    let headers = req.headers().clone();
    for framing in ["content-length", "transfer-encoding", "content-type"] {
        headers.delete(framing)?;
    }
    let mut init = RequestInit::new();
    init.with_method(req.method()).with_headers(headers);
    Request::new_with_init(req.url()?.as_ref(), &init)
}
