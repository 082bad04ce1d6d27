//! The plain data of the engines' contract: a run's options, status, result and views, a
//! detached run's configuration, and an agent class's settings. Below the engines and the
//! platform alike (it imports only `protocol` and `cancel`), so both take their types from here
//! and the public API re-exports them.

mod detached;
mod options;
mod run;
pub(crate) use run::epoch_ms as epoch_ms_serde;

pub use detached::*;
pub use options::*;
pub use run::*;
