//! The Worker entry's router: `/agents/<agent-kebab>/<name>` to the agent's Durable Object.

use worker::{Env, Request, Response};

use super::json_error;
use crate::routing::{kebab_case, parse_agent_path};

/// Routes a request to the agent it names. Only the classes in `agents` are routable (list your
/// parents here, never a child: children are reached only through their parent's drill-in
/// gate). Each class must be bound under its own name in `wrangler.toml`. Anything else is a
/// 404 with a JSON error body.
pub async fn route_agent_request(req: Request, env: &Env, agents: &[&str]) -> worker::Result<Response> {
    let url = req.url()?;
    let Some(path) = parse_agent_path(url.path()) else {
        return json_error(404, format!("no route for {}; agents live at /agents/<agent>/<name>", url.path()));
    };
    let Some(class) = agents.iter().find(|class| kebab_case(class) == path.agent) else {
        let known: Vec<String> = agents.iter().map(|c| kebab_case(c)).collect();
        return json_error(404, format!("unknown agent {:?}; this Worker serves {known:?}", path.agent));
    };
    if path.name.len() > 512 {
        return json_error(400, "agent name is longer than 512 bytes");
    }
    let stub = env.durable_object(class)?.id_from_name(&path.name)?.get_stub()?;
    stub.fetch_with_request(req).await
}
