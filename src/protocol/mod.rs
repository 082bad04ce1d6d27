//! The hall between the rooms: every frame that crosses a wire.
//!
//! - [`event`]: `agent-tool-event` frames from a parent to its clients (byte-compatible with
//!   `agents@0.32.0`).
//! - [`rpc`]: the Agents SDK RPC frames (`agent.call()`).
//! - [`outcome`]: a run's status and how it ended, as every wire and table spells them.
//! - [`tail`]: the NDJSON lines a child streams to its parent.
//! - [`chunk`]: AI SDK `UIMessageChunk` bodies this crate produces or inspects.

pub mod child_api;
pub mod chunk;
pub mod event;
pub mod outcome;
pub mod rpc;
pub mod tail;

pub use event::{AgentToolEvent, EventFrame, InterruptedReason, StoredEvent};
pub use outcome::Outcome;
