//! agent-state: durable, file-backed state for headless LLM agents, the
//! session hooks that keep it, and the daemon that wakes them.
//!
//! ```text
//! {state_root}/                     default /opt/teleo-eval/agent-state
//! ├── .daemon/                      lock (0600), alive.lock (the group's probe), counters.json,
//! │                                 schedule.json, daemon.json, errors.jsonl, signals.jsonl,
//! │                                 escalated.json (never an agent)
//! ├── .shared/rules/*.md            rules prepended to every prompt
//! └── {agent}/                      ^[a-z][a-z0-9_-]{0,62}$
//!     ├── report.json  tasks.json  session.json  metrics.json   (atomic replace)
//!     ├── journal.jsonl                                          (append-only)
//!     ├── memory.md                                              (append under a section)
//!     ├── inbox/{uuid}.json  inbox/.tmp/  inbox/.claimed/{session}/
//!     │   inbox/processed/  inbox/rejected/ (+ .reason.json)
//!     ├── sessions/{id}.log  sessions/{id}.prompt.md  sessions/{id}.owner (owner lock)
//!     └── .lock                                                  (flock for read-modify-write)
//! ```
//!
//! Module map: [`config`] reads the TOML file; [`state`] owns every file
//! shape and the one way each is written; [`inbox`] validates, delivers and
//! claims messages; [`hooks`] are `session begin|end|fail`; [`owner`] knows who owns a running session; [`prompt`]
//! assembles the rehydration prompt; [`check`] finds and repairs damage; [`fsx`] is every file access below the root (no links followed, no special file opened);
//! [`errors`] is the error catalogue; [`protocol`] parses what agents say; [`events`] streams every journal; [`daemon`] runs the
//! service; [`cli`] is one module per subcommand.

// The base, store and delivery layers: the crate agent-state-store
// (crates/store), under their old paths (`crate::state`, `crate::hooks`,
// `agent_state::inbox`, ...). The hooks take `&AgentConfig` through
// `impl From<&AgentConfig> for hooks::AgentSettings` (config::agent).
pub use agent_state_store::{
    access, agent_name, catalogue, clock, error, fsx, hooks, inbox, owner, session_id,
    session_status, state, string_enum, zone,
};
// The pure decisions: the crate agent-state-decide (crates/decide), under
// their old paths (`crate::schedule`, `agent_state::protocol`).
pub use agent_state_decide::{economy, ending, failure, machine, protocol, schedule};

pub mod backup;
pub mod check;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod events;
pub mod flow;
pub mod git;
pub mod prompt;
pub mod usage;
pub mod worker;
pub mod workspace;
