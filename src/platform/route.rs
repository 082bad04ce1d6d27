//! The Worker entry's router: `/agents/<agent-kebab>/<name>` to the agent's Durable Object.

use futures::StreamExt;
use worker::{Env, Method, Request, Response};

use super::{json_error, new_request};
use crate::routing::{route_target, RequestUrl, RouteTarget};
use crate::types::AgentClass;

/// The largest request body the entry forwards to an agent (1 MiB); a larger one is answered
/// 413 without reaching it.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// Routes a request to the agent class `A` (the common case of one agent clients reach):
/// `/agents/<a-kebab>/<name>` goes to the instance named `<name>`. Anything else is a JSON
/// error (404 for another path or agent, 413 for a body over [`MAX_BODY_BYTES`], 400 for a name
/// over 512 bytes). List only the agents clients may reach by name. The objects of child runs
/// are never routable, even when their class is listed: listing `Researcher` makes top-level
/// researchers (`/agents/researcher/<name>`) reachable, each its own object, while the
/// researcher a parent dispatched is reached only through the parent's drill-in gate
/// (`/agents/<parent>/<name>/sub/researcher/<run>`).
///
/// ```no_run
/// # use agent_tools::prelude::*;
/// # #[derive(Default)] pub struct Assistant;
/// # impl Agent for Assistant {}
/// # agent_tools::durable_object!(Assistant);
/// #[worker::event(fetch)]
/// async fn fetch(req: worker::Request, env: worker::Env, _ctx: worker::Context) -> worker::Result<worker::Response> {
///     agent_tools::route::<Assistant>(req, &env).await
/// }
/// # fn main() {}
/// ```
pub async fn route<A: AgentClass>(req: Request, env: &Env) -> worker::Result<Response> {
    Routes::new().agent::<A>().serve(req, env).await
}

/// The agents a Worker entry routes to, when there are several top-level agents (children
/// need no route: see [`route`]).
///
/// ```no_run
/// # use agent_tools::prelude::*;
/// # #[derive(Default)] pub struct Assistant;
/// # impl Agent for Assistant {}
/// # agent_tools::durable_object!(Assistant);
/// # #[derive(Default)] pub struct Support;
/// # impl Agent for Support {}
/// # agent_tools::durable_object!(Support, unchecked); // (not in this crate's wrangler.toml)
/// # async fn entry(req: worker::Request, env: worker::Env) -> worker::Result<worker::Response> {
/// agent_tools::Routes::new().agent::<Assistant>().agent::<Support>().serve(req, &env).await
/// # }
/// # fn main() {}
/// ```
#[derive(Debug, Clone, Default)]
pub struct Routes {
    agents: Vec<(&'static str, &'static str)>,
}

impl Routes {
    /// No agents yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes agent class `A` reachable at `/agents/<a-kebab>/<name>`.
    pub fn agent<A: AgentClass>(mut self) -> Self {
        self.agents.push((A::CLASS, A::BINDING));
        self
    }

    /// Serves one request.
    pub async fn serve(&self, req: Request, env: &Env) -> worker::Result<Response> {
        let url = RequestUrl::new(req.inner().url());
        // The body is read here, whatever happens next: a body nobody reads makes the runtime's
        // proxy fail later requests ("Can't read from request stream after response has been
        // sent"), and reading it bounds its size before an agent sees it.
        let (req, body) = match read_body(req).await? {
            Ok(read) => read,
            Err(refusal) => return Ok(refusal),
        };
        let RouteTarget { class, binding, name } = match route_target(url.path(), &self.agents) {
            Ok(target) => target,
            Err((status, message)) => return json_error(status, message),
        };
        let namespace = match env.durable_object(binding) {
            Ok(namespace) => namespace,
            Err(_) => {
                return json_error(
                    500,
                    format!(
                        "no Durable Object binding {binding:?} for {class}: add [[durable_objects.bindings]] \
                         name = \"{binding}\" class_name = \"{class}\" to wrangler.toml"
                    ),
                )
            }
        };
        let stub = namespace.id_from_name(&name)?.get_stub()?;
        let body = body.map(|body| js_sys::Uint8Array::from(body.as_slice()).into());
        stub.fetch_with_request(new_request(url.as_str(), req.method(), Some(req.headers()), body.as_ref())?).await
    }
}

/// Reads the request's body to its end, chunk by chunk: at most [`MAX_BODY_BYTES`] are kept
/// (past that, the rest is read and dropped and the answer is a 413). A body-less request
/// (GET, a WebSocket upgrade) passes through untouched.
async fn read_body(req: Request) -> worker::Result<Result<(Request, Option<Vec<u8>>), Response>> {
    if req.inner().body().is_none() {
        return Ok(Ok((req, None)));
    }
    let too_big = || json_error(413, format!("request bodies are limited to {MAX_BODY_BYTES} bytes"));
    // A body is read to its end even when its Content-Length already says it is too big
    // (nothing past the limit is kept): answering before the body is read, with its stream
    // cancelled or not, leaves `wrangler dev`'s proxy with a connection it then fails the next
    // request on ("503 Your worker restarted mid-request"), measured with a 2 MB body.
    let mut req = req;
    let mut kept = Vec::new();
    let mut over = false;
    if let Ok(mut body) = req.stream() {
        while let Some(Ok(chunk)) = body.next().await {
            if kept.len() + chunk.len() > MAX_BODY_BYTES {
                over = true;
                kept = Vec::new();
            } else if !over {
                kept.extend_from_slice(&chunk);
            }
        }
    }
    if over {
        return Ok(Err(too_big()?));
    }
    let headers = req.headers().clone();
    for framing in ["content-length", "transfer-encoding"] {
        headers.delete(framing)?;
    }
    let body = (!matches!(req.method(), Method::Get | Method::Head)).then_some(kept);
    Ok(Ok((new_request(&req.inner().url(), req.method(), Some(&headers), None)?, body)))
}
