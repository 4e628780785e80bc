//! The daemon: wakes agents on their schedules and inbox messages and runs
//! their sessions. (Being built; see the submodules.)

pub mod runner;
