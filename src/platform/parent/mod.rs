//! The parent role: an agent dispatching child agents as tools. Dispatch and following a child
//! (`dispatch`, `follow`), restart recovery (`recovery`), and detached runs (`detached`), all
//! as methods of [`crate::AgentHost`].

pub(crate) mod detached;
pub(crate) mod dispatch;
pub(crate) mod follow;
pub(crate) mod recovery;
