//! Models that drive a turn. The built-in offline model needs no network and no keys.

pub mod offline;
