//! Integration tests: the real `agent-state` binary on temporary state roots.
//!
//! One test binary with a module per area (see rust-analyzer's "one
//! integration test binary" advice); `support` builds the environments.

mod support;

mod agentlock;
mod backup;
mod backup_safety;
mod bootstrap;
mod bounds;
mod caps;
mod check;
mod concurrency;
mod config_edits;
mod crash;
mod daemon;
mod diskfaults;
mod doctor;
mod economy;
mod events;
mod faults;
mod filesafety;
mod flood;
mod flood_wakes;
mod flow_authority;
mod flows;
mod health;
mod holds;
mod hooks;
mod hostile;
mod identity;
mod iterations;
mod json_escapes;
mod mailbox;
mod messages;
mod metrics_flood;
mod migrate;
mod migrate_refusals;
mod monitoring;
mod notify;
mod outcomes;
mod ownership;
mod package;
mod permissions;
mod polish;
mod promises;
mod prompt;
mod reattach;
mod rejected_names;
mod repo_commands;
mod resume;
mod rotation;
mod scripts;
mod sdbox;
mod signals;
mod stop;
mod systemd;
mod trial;
mod typed;
mod unreadable;
mod unrunnable;
mod verdicts;
mod verify_script;
mod workspace;
mod workspaces_daemon;
mod zones;
