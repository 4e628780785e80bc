//! Memory, as pure decisions (seed 002's "OOM killed" row): whether a
//! session was killed by the kernel's OOM killer, and how many sessions
//! may run at once while memory is short. No IO; the clock is passed in.
//!
//! **The rule for `SESSION_OOM`** (no guess from SIGKILL alone, which an
//! operator's `kill -9` also sends):
//!
//! - where the session ran in a cgroup of its own with the memory
//!   controller (systemd `Delegate=yes`, see `cgroup.rs`): the
//!   cgroup's `memory.events` counts `oom_kill` > 0 — whichever of its
//!   processes the kernel killed, and whatever the main process's exit
//!   status then was;
//! - anywhere else: the main process was killed by SIGKILL, the daemon did
//!   not send it (no timeout, stall or stop), **and** the kernel's own
//!   count of OOM kills (`oom_kill` in `/proc/vmstat`, readable without
//!   privilege, unlike the kernel log) rose while the session ran. Another
//!   process's OOM kill at the same moment as someone's `kill -9` would be
//!   taken for one: rare, and said in the record's message.
//!
//! A session that exited 0 is a success whatever the counts say (the
//! agent survived the kill of a child of its own).

use std::time::Duration;

use chrono::{DateTime, Utc};

/// How the daemon knows the kernel's OOM killer ended a session: a value
/// of the pure decisions (crates/decide's `ending`), which judge it.
pub use crate::ending::OomEvidence;

/// What the runner read about a session's memory when it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryReadings {
    /// The session had a cgroup with the memory controller, and its
    /// `memory.events` said this (`None`: no such cgroup, or unreadable).
    pub cgroup_oom_kills: Option<u64>,
    /// `/proc/vmstat`'s `oom_kill` before the spawn and after the exit.
    pub kernel_before: Option<u64>,
    pub kernel_after: Option<u64>,
}

/// The rule of the module doc. `killed_by_sigkill`: the main process died
/// of SIGKILL; `ended_by_daemon`: the runner terminated it (timeout,
/// stall, stop), whose own code then wins.
pub fn oom_evidence(
    readings: &MemoryReadings,
    killed_by_sigkill: bool,
    ended_by_daemon: bool,
) -> Option<OomEvidence> {
    if ended_by_daemon {
        return None;
    }
    if let Some(oom_kills) = readings.cgroup_oom_kills {
        // The cgroup is the authority where there is one.
        return (oom_kills > 0).then_some(OomEvidence::Cgroup { oom_kills });
    }
    match (readings.kernel_before, readings.kernel_after) {
        (Some(before), Some(after)) if killed_by_sigkill && after > before => {
            Some(OomEvidence::Kernel { before, after })
        }
        _ => None,
    }
}

/// `oom_kill N` of `/proc/vmstat` (or of a cgroup's `memory.events`): the
/// count, `None` if the line is missing or not a number.
pub fn oom_kill_count(text: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut words = l.split_whitespace();
        (words.next() == Some("oom_kill"))
            .then(|| words.next()?.parse().ok())
            .flatten()
    })
}

/// When the concurrent-session limit, lowered by an OOM kill at `now`,
/// comes back (`None`: `lowered_for` is 0, the limit is never lowered).
/// A later OOM kill moves the end later; it does not lower it further.
pub fn lowered_until(now: DateTime<Utc>, lowered_for: Duration) -> Option<DateTime<Utc>> {
    (!lowered_for.is_zero()).then(|| crate::clock::later(now, lowered_for))
}

/// At the daemon's start, what a lowering saved before a restart (or a
/// crash) still means at `now`: its end if it has not passed, never later
/// than `lowered_for` from `now` (a saved time from a clock set back, or
/// written by hand, cannot lower the limit for longer than the config
/// allows), and nothing when `lowered_for` is 0.
pub fn lowered_at_start(
    saved: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    lowered_for: Duration,
) -> Option<DateTime<Utc>> {
    let until = saved.filter(|t| *t > now)?;
    Some(until.min(lowered_until(now, lowered_for)?))
}

/// How many sessions may run at once: `configured`, one fewer (never
/// fewer than one) until `lowered_until`.
pub fn concurrent_limit(
    configured: usize,
    lowered_until: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> usize {
    let configured = configured.max(1);
    match lowered_until {
        Some(until) if now < until => configured.saturating_sub(1).max(1),
        _ => configured,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::UNIX_EPOCH + chrono::Duration::seconds(secs)
    }

    #[test]
    fn the_oom_kill_count_is_read_from_vmstat_and_memory_events() {
        let events = "low 0\nhigh 12\nmax 40\noom 2\noom_kill 1\noom_group_kill 0\n";
        let vmstat = "pgfault 1234\noom_kill 7\nnr_free_pages 5\n";
        let table: &[(&str, Option<u64>)] = &[
            (events, Some(1)),
            (vmstat, Some(7)),
            ("oom 3\n", None),
            ("oom_kill\n", None),
            ("oom_kill many\n", None),
            ("oom_kill_other 3\noom_kill 0\n", Some(0)),
            ("", None),
        ];
        for (text, want) in table {
            assert_eq!(oom_kill_count(text), *want, "{text:?}");
        }
    }

    #[test]
    fn an_oom_kill_needs_the_kernel_s_word_not_sigkill_alone() {
        let cg = |n| MemoryReadings {
            cgroup_oom_kills: Some(n),
            kernel_before: Some(5),
            kernel_after: Some(9),
        };
        let kernel = |before, after| MemoryReadings {
            cgroup_oom_kills: None,
            kernel_before: Some(before),
            kernel_after: Some(after),
        };
        // (what, readings, SIGKILL, ended by the daemon, evidence)
        let table: &[(&str, MemoryReadings, bool, bool, Option<OomEvidence>)] = &[
            (
                "cgroup counted a kill (a child, the shell exited 137)",
                cg(1),
                false,
                false,
                Some(OomEvidence::Cgroup { oom_kills: 1 }),
            ),
            (
                "cgroup counted none: the kernel's count is not asked",
                cg(0),
                true,
                false,
                None,
            ),
            ("the daemon's timeout wins", cg(2), true, true, None),
            (
                "no cgroup: SIGKILL while the kernel counted a kill",
                kernel(3, 4),
                true,
                false,
                Some(OomEvidence::Kernel {
                    before: 3,
                    after: 4,
                }),
            ),
            (
                "no cgroup: SIGKILL, no kill counted (kill -9 by someone)",
                kernel(3, 3),
                true,
                false,
                None,
            ),
            (
                "no cgroup: a kill counted, but the session exited",
                kernel(3, 4),
                false,
                false,
                None,
            ),
            (
                "no cgroup: SIGKILL, the count unreadable",
                MemoryReadings::default(),
                true,
                false,
                None,
            ),
            (
                "no cgroup: SIGKILL by the daemon's kill_grace",
                kernel(3, 4),
                true,
                true,
                None,
            ),
        ];
        for (what, readings, sigkill, by_daemon, want) in table {
            assert_eq!(
                oom_evidence(readings, *sigkill, *by_daemon),
                *want,
                "{what}"
            );
        }
    }

    #[test]
    fn a_saved_lowering_holds_after_a_restart_until_its_time() {
        let hour = Duration::from_secs(3600);
        /// (what, saved until, now, lowered_for, lowered until at start)
        type Row = (&'static str, Option<i64>, i64, Duration, Option<i64>);
        let table: &[Row] = &[
            ("nothing saved", None, 100, hour, None),
            ("still ahead: kept", Some(3700), 200, hour, Some(3700)),
            ("one second left", Some(3700), 3699, hour, Some(3700)),
            ("its time: back", Some(3700), 3700, hour, None),
            ("long past: ignored", Some(3700), 90_000, hour, None),
            (
                "further than lowered_for: cut to now + lowered_for",
                Some(1_000_000),
                200,
                hour,
                Some(3800),
            ),
            (
                "lowered_for shortened since: the shorter end",
                Some(3700),
                200,
                Duration::from_secs(60),
                Some(260),
            ),
            (
                "lowered_for 0 since: never lowered",
                Some(3700),
                200,
                Duration::ZERO,
                None,
            ),
        ];
        for &(what, saved, now, lowered_for, want) in table {
            assert_eq!(
                lowered_at_start(saved.map(at), at(now), lowered_for),
                want.map(at),
                "{what}"
            );
        }
    }

    #[test]
    fn an_oom_kill_lowers_the_limit_by_one_for_the_configured_time() {
        let hour = Duration::from_secs(3600);
        let oom_at_100 = lowered_until(at(100), hour);
        assert_eq!(oom_at_100, Some(at(3700)));
        assert_eq!(lowered_until(at(100), Duration::ZERO), None);
        // (configured, lowered until, now, limit)
        let table: &[(usize, Option<DateTime<Utc>>, i64, usize)] = &[
            (4, None, 0, 4),
            (4, oom_at_100, 100, 3),
            (4, oom_at_100, 3699, 3),
            (4, oom_at_100, 3700, 4),
            (1, oom_at_100, 200, 1), // never below one
            (2, oom_at_100, 200, 1),
            (0, None, 0, 1),
        ];
        for &(configured, until, now, want) in table {
            assert_eq!(
                concurrent_limit(configured, until, at(now)),
                want,
                "{configured} until {until:?} at {now}"
            );
        }
    }
}
