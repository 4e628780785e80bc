//! One session's lifecycle as a pure state machine: crates/decide's
//! `machine` (with its table tests), re-exported under its old path. What
//! it reads of an agent's config is `impl From<&AgentConfig> for Settings`
//! (`config::agent`).

pub use crate::machine::*;
