//! The error matrix for sessions: a pure decision, crates/decide's
//! `failure`, re-exported under its old path.

pub use crate::failure::*;
