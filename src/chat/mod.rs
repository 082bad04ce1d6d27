//! The chat agent core, shared by parents and children: messages as AI SDK `UIMessage` JSON,
//! the message builder that applies `UIMessageChunk`s, the conversion to model messages, the
//! SQL store, the turn loop (steps, concurrent tool calls, a step limit), and the chat protocol
//! as a state machine.

pub mod convert;
pub mod interaction;
pub mod journal;
pub mod message;
pub mod protocol;
pub mod store;
pub mod turn;
