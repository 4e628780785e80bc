//! What agents say, parsed: pure functions over text, no IO. They return
//! what is worth logging (an invalid signal's `signals::SignalRecord`, a
//! block's `summary::BlockProblem`); the caller writes it
//! (`daemon::effects::append_signal`). Claude Code's JSON result is parsed
//! with the rest of a session's output in `daemon::output`.
//!
//! - [`signals`]: seed 000's `<axiom>TYPE:payload</axiom>` signals, found as
//!   the output streams.
//! - [`summary`]: seed 004's Context Summary Block and signal block line.
//! - [`limits`]: Claude Code's usage and rate limits (every form it prints,
//!   text and stream-json) and when they reset.

pub mod limits;
pub mod signals;
pub mod summary;
