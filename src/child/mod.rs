//! The child room: run rows, the chunk log, progress and milestones.

pub mod progress;
pub mod runs;
