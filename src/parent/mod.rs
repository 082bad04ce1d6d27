//! The parent room: the run registry, the detached ledger, and `AgentTool`, as plain Rust over
//! the [`crate::store::Sql`] trait with an explicit clock.

pub(crate) mod agent_tool;
pub(crate) mod detached;
pub(crate) mod engine;
pub(crate) mod outbox;
pub(crate) mod registry;
