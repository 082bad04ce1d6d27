//! The demo Worker: a parent `Assistant` whose model calls `Researcher` children as a tool, and
//! a second child class, `Summarizer`, for imperative runs. Built on the library's public API
//! only (`agent_tools::…`), as any Worker would be.
//!
//! All are chat agents on the model the settings select (the offline model by default:
//! "Research HTTP/3 and gRPC" makes two `research` calls in one step). `OFFLINE_WORDS` and
//! `OFFLINE_DELAY_MS` set the length and pace of the offline model's answers; a run's input may
//! override them with `words` and `delayMs`. A researcher reports progress and one milestone
//! (`sources-gathered`) before it writes.

mod assistant;
mod bench;
mod children;

pub use assistant::{Assistant, DemoHandler, ResearchInput};
pub use children::{Researcher, Summarizer};

agent_tools::durable_object!(Assistant);
agent_tools::durable_object!(Researcher);
agent_tools::durable_object!(Summarizer);

#[worker::event(fetch)]
async fn fetch(req: worker::Request, env: worker::Env, _ctx: worker::Context) -> worker::Result<worker::Response> {
    agent_tools::route::<Assistant>(req, &env).await
}

/// A var or secret of the Worker, if set and not empty.
fn setting(env: &agent_tools::Env, name: &str) -> Option<String> {
    env.var(name)
}
