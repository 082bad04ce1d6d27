//! The demo Worker: a parent `Assistant` whose model calls `Researcher` children as a tool, and
//! a second child class, `Summarizer`, for imperative runs.
//!
//! All are chat agents on the model the settings select (the offline model by default:
//! "Research HTTP/3 and gRPC" makes two `research` calls in one step). `OFFLINE_WORDS` and
//! `OFFLINE_DELAY_MS` set the length and pace of the offline model's answers; a run's input may
//! override them with `words` and `delayMs`. A researcher reports progress and one milestone
//! (`sources-gathered`) before it writes.

mod assistant;
mod children;

use worker::{
    durable_object, event, Context, DurableObject, Env, Request, Response, State, WebSocket, WebSocketIncomingMessage,
};

pub use assistant::{AssistantAgent, ResearchInput};
pub use children::{ResearcherAgent, SummarizerAgent};

use crate::platform::child::ChildHost;
use crate::platform::parent::{ParentAgent, ParentHost};
use crate::platform::route::route_agent_request;

/// The parent Durable Object.
#[durable_object]
pub struct Assistant {
    parent: ParentHost<AssistantAgent>,
}

impl DurableObject for Assistant {
    fn new(state: State, env: Env) -> Self {
        Self { parent: ParentHost::new(state, env, AssistantAgent) }
    }
    async fn fetch(&self, req: Request) -> worker::Result<Response> {
        self.parent.fetch(req).await
    }
    async fn websocket_message(&self, ws: WebSocket, message: WebSocketIncomingMessage) -> worker::Result<()> {
        self.parent.websocket_message(ws, message).await
    }
    async fn websocket_close(&self, ws: WebSocket, code: usize, reason: String, _clean: bool) -> worker::Result<()> {
        self.parent.websocket_close(ws, code, reason).await
    }
    async fn alarm(&self) -> worker::Result<Response> {
        self.parent.alarm().await
    }
}

/// Declares a child Durable Object that delegates to a [`ChildHost`].
macro_rules! child_object {
    ($(#[$doc:meta])* $name:ident, $agent:ident) => {
        $(#[$doc])*
        #[durable_object]
        pub struct $name {
            host: ChildHost<$agent>,
        }

        impl DurableObject for $name {
            fn new(state: State, env: Env) -> Self {
                Self { host: ChildHost::new(state, env, $agent) }
            }
            async fn fetch(&self, req: Request) -> worker::Result<Response> {
                self.host.fetch(req).await
            }
            async fn websocket_message(&self, ws: WebSocket, message: WebSocketIncomingMessage) -> worker::Result<()> {
                self.host.websocket_message(ws, message).await
            }
            async fn websocket_close(&self, ws: WebSocket, code: usize, reason: String, _clean: bool) -> worker::Result<()> {
                self.host.websocket_close(ws, code, reason).await
            }
        }
    };
}

child_object!(
    /// The `Researcher` child Durable Object.
    Researcher,
    ResearcherAgent
);
child_object!(
    /// The `Summarizer` child Durable Object.
    Summarizer,
    SummarizerAgent
);

#[event(fetch)]
async fn fetch(req: Request, env: Env, _ctx: Context) -> worker::Result<Response> {
    route_agent_request(req, &env, &[AssistantAgent::CLASS]).await
}
