//! Agent tools for Rust Workers.
//!
//! One chat agent (the *parent*) dispatches other chat agents (the *children*) as tools. Each
//! child run is a real sub-agent in its own Durable Object; the parent keeps a durable run
//! registry, streams the child's events to its clients as `agent-tool-event` frames, and
//! replays them after a refresh.
//!
//! The crate is split the way the problem is:
//! - [`protocol`]: every frame that crosses a wire;
//! - [`parent`] and [`child`]: the logic of each role, plain Rust over the [`store::Sql`] trait,
//!   unit-tested natively against real SQLite;
//! - `platform` (wasm32 only): the thin layer that binds them to Durable Objects, WebSockets,
//!   streams and stubs.

pub mod cancel;
pub mod chat;
pub mod child;
pub mod model;
pub mod observability;
pub mod parent;
pub mod protocol;
pub mod routing;
pub mod schema;
pub mod store;

#[cfg(all(test, not(target_arch = "wasm32")))]
mod fuzz_tests;

#[cfg(target_arch = "wasm32")]
pub mod platform;

#[cfg(all(feature = "demo", target_arch = "wasm32"))]
pub mod demo;

#[cfg(target_arch = "wasm32")]
pub use platform::{
    child::{ChildAgent, ChildHost, Turn, TurnOutput},
    parent::{ChildClass, ParentAgent, ParentHost},
    route::route_agent_request,
};
