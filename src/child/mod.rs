//! The child room: run rows, the chunk log, progress and milestones.

pub mod engine;
pub mod progress;
pub mod runs;
