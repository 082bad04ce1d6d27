//! End-to-end tests: the real Worker under `wrangler dev` (workerd), driven over HTTP and
//! WebSocket. Run with `./scripts/test.sh` (or `cargo test --test e2e` after a build).

mod browser;
mod chat;
mod detached;
mod dev_proxy;
mod example;
mod foundation;
mod harness;
mod hostile;
mod kit_parity;
mod library;
mod lifecycle;
mod limits;
mod mock_model;
mod recovery;
mod reducer_check;
mod scale;
