//! agent-state's pure decisions, a crate of their own so that `Cargo.toml`
//! says what they may use: the base values of `agent-state-store` (time
//! zones, timestamps, the catalogue's codes, session.json's status word),
//! std and a few crates — no file, process or socket IO,
//! no tokio, no nix, never the daemon or the CLI. Every function takes the
//! time as a value and is tested as a table beside it.
//!
//! - [`schedule`]: crontab(5) schedules, their fire times across DST,
//!   missed runs and jitter;
//! - [`protocol`]: what agents say, parsed (seed 000's signals, seed 004's
//!   Context Summary and signal block, Claude Code's usage limits and when
//!   they reset); each returns what to log, the caller logs it;
//! - [`economy`]: the credential groups' holds (usage limits, an admin's
//!   cap, a failed login check), the probe after an unknown reset, and when
//!   a day's budgets start again;
//! - [`machine`]: one session's lifecycle as a state machine (events and
//!   the time in, actions out), with its table tests;
//! - [`failure`]: the error matrix the machine consults (an ending and what
//!   the output said → a code, a retry or a backoff, an escalation), and its
//!   `RetrySettings`;
//! - [`ending`]: the facts they judge, as the daemon gathers them (how a
//!   run ended, Claude Code's failure, the OOM killer's evidence) and how
//!   an ending reads in session.json.
//!
//! The `agent-state` crate re-exports every module here under its old path
//! (`crate::schedule`, ...).

// The base values, under the paths the modules used inside `agent-state`
// (`crate::zone::Zone`, `crate::catalogue::Code`), so a moved file reads
// the same.
use agent_state_store::{agent_name, catalogue, clock, session_status, zone};

pub mod economy;
pub mod ending;
pub mod failure;
pub mod machine;
pub mod protocol;
pub mod schedule;
