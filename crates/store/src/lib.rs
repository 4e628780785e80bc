//! agent-state's lower layers, a crate of their own so that `Cargo.toml`
//! says what they may use: std and a few crates, never the domain, the
//! daemon or the CLI.
//!
//! - base: [`clock`], [`catalogue`], [`error`], [`agent_name`], [`fsx`],
//!   [`access`], [`session_id`], [`session_status`], [`string_enum`], [`zone`] — timestamps,
//!   the error catalogue and the error type, names and session ids as path components, every
//!   file access below the root, session.json's status word, time zones;
//! - store: [`state`] — every state file's shape and the one way each is
//!   written;
//! - delivery: [`inbox`], [`owner`], [`hooks`] — messages validated,
//!   delivered and claimed; who owns a running session; the session hooks
//!   (`session begin|end|fail`, recovery) that scripts and the daemon share.
//!   The hooks read an agent's settings as a value ([`hooks::AgentSettings`]),
//!   never the config file.
//!
//! The `agent-state` crate re-exports every module here under its old path
//! (`agent_state::state`, `crate::fsx`, …).

pub mod access;
pub mod agent_name;
pub mod catalogue;
pub mod clock;
pub mod error;
pub mod fsx;
pub mod hooks;
pub mod inbox;
pub mod owner;
pub mod session_id;
pub mod session_status;
pub mod state;
pub mod string_enum;
pub mod zone;
