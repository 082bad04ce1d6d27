//! The demo Worker (`wrangler.toml` at the repository's root): the `demo` feature of
//! `agent-tools` (its agents, its Durable Object classes and its fetch entry, all exported by the
//! library's own `durable_object!` and `#[event(fetch)]`) linked as the cdylib `worker-build`
//! turns into `build/`. Nothing else lives here.

pub use agent_tools::demo::*;
