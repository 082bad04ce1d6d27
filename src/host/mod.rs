//! The host: binds an agent, its engines and its chat to one object, over the [`Io`] of
//! whatever runs it — a Durable Object ([`crate::platform`]) or a test (`agent_tools::testing`).
//! It carries out what the engines decide (`parent/driver.rs`, `child/`), serves the agent's
//! clients and its parent's calls, and runs its turns; the decisions are the engines'.

pub(crate) mod chat;
pub(crate) mod child;
pub(crate) mod core;
pub(crate) mod hooks;
pub(crate) mod io;
pub(crate) mod parent;
pub(crate) mod tools;

pub use child::{Turn, TurnOutput};
pub use core::AgentHost;
#[cfg(all(any(test, feature = "testing"), not(target_arch = "wasm32")))]
pub(crate) use io::set_native_sleep;
pub use io::{json_error, json_response, sleep, Env, HttpRequest, HttpResponse};
pub(crate) use io::{pause, BoundedHook, ByteStream, ChildCall, ChildReply, Io, LocalFuture, Reply, Socket};
pub use parent::sub_agent::{ChatChunk, ChatStream, SubAgentStub};
