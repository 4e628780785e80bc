//! The daemon: wakes agents on their schedules and inbox messages and runs
//! their sessions. (Being built; see the submodules.)

pub mod clock;
pub mod core;
pub mod files;
pub mod logging;
pub mod runner;
pub mod service;
pub mod session;
pub mod systemd;
pub mod watcher;
