//! The daemon: wakes agents on their schedules and inbox messages and runs
//! their sessions. (Being built; see the submodules.)

pub mod alerts;
pub mod cgroup;
pub mod clock;
pub mod core;
pub mod credential;
pub mod economy;
pub mod effects;
pub mod exporter;
pub mod exposition;
pub mod failure;
pub mod fanout;
pub mod files;
pub mod health;
pub mod logging;
pub mod machine;
pub mod meter;
pub mod output;
pub mod release;
pub mod rotation;
pub mod runnable;
pub mod runner;
pub mod service;
pub mod session;
pub mod stop;
pub mod systemd;
pub mod verify;
pub mod watcher;
pub mod workspaces;
