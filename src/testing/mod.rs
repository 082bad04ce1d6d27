//! Test your own agents with `cargo test`: a Worker's agent classes hosted in-process, natively,
//! on a virtual clock, with crashes on demand (the `testing` feature; see `docs/testing.md`).
//!
//! A [`World`] runs the same `impl Agent` code the Worker runs, with the same host, engines and
//! chat protocol; only the platform beneath differs. Each object has a real SQLite database
//! (kept across its crashes), an alarm that fires as virtual time passes, client sockets and
//! calls to its children that travel through the world (where faults can delay or drop them).
//! A [`Client`] behaves as the stock browser client does, and holds the stock reducer's state.
//! A [`ScriptedModel`] answers what the test scripted and records what it was shown. A
//! [`Simulation`] runs a scenario over many seeds, with faults, and checks the library's
//! invariants.
//!
//! ```
//! use agent_tools::prelude::*;
//! use agent_tools::testing::{ScriptedModel, Step, World};
//! use serde_json::json;
//!
//! #[derive(Default)]
//! pub struct Researcher;
//! impl Agent for Researcher {}
//! # impl agent_tools::AgentClass for Researcher { const CLASS: &'static str = "Researcher"; const BINDING: &'static str = "Researcher"; }
//!
//! #[derive(Default)]
//! pub struct Planner;
//! impl Agent for Planner {
//!     fn tools(&self) -> Tools<Self> {
//!         Tools::new().agent(AgentTool::of::<Researcher>("research", "Research a topic."))
//!     }
//! }
//! # impl agent_tools::AgentClass for Planner { const CLASS: &'static str = "Planner"; const BINDING: &'static str = "Planner"; }
//!
//! let planner = ScriptedModel::new()
//!     .step(Step::new().tool_call("research", json!({ "query": "HTTP/3" })))
//!     .step(Step::new().text("HTTP/3 runs over QUIC."));
//! let world = World::new()
//!     .route::<Planner>()
//!     .agent::<Researcher>()
//!     .model::<Planner>(planner.clone())
//!     .model::<Researcher>(ScriptedModel::new().step(Step::new().text("QUIC, over UDP.")));
//!
//! let client = world.connect("/agents/planner/alice");
//! let reply = client.chat("Research HTTP/3");
//! assert_eq!(reply.text, "HTTP/3 runs over QUIC.");
//! // The model was shown the child's summary as the tool's result.
//! assert_eq!(planner.last_tool_results(), [("research".to_owned(), json!("QUIC, over UDP."))]);
//! // The stock client's state of the run.
//! let runs = client.runs();
//! let run = runs["runsById"].as_object().unwrap().values().next().unwrap();
//! assert_eq!(run["status"], "completed");
//! ```

mod client;
mod exec;
pub(crate) mod hooks;
mod io;
mod model;
pub(crate) mod reducer;
pub(crate) mod sim;
pub(crate) mod world;

pub use client::{ChatReply, Client, RunState, DROPPED, RECONNECT};
pub use model::{ScriptedModel, Step};
pub use sim::{Simulation, SEED_VAR};
pub use world::{Faults, LogLine, ObjectRef, World, QUIET, WAIT_LIMIT};
