//! Integration tests: the real `agent-state` binary on temporary state roots.
//!
//! One test binary with a module per area (see rust-analyzer's "one
//! integration test binary" advice); `support` builds the environments.

mod support;

mod agentlock;
mod backup;
mod bootstrap;
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
mod flows;
mod health;
mod hooks;
mod hostile;
mod identity;
mod iterations;
mod mailbox;
mod messages;
mod migrate;
mod monitoring;
mod notify;
mod ownership;
mod package;
mod permissions;
mod polish;
mod promises;
mod prompt;
mod reattach;
mod resume;
mod rotation;
mod scripts;
mod sdbox;
mod signals;
mod systemd;
mod trial;
mod typed;
mod workspace;
mod workspaces_daemon;
