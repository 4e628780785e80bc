//! The health monitor's building blocks: how full the state root's file
//! system is (and what the daemon may do about it), pruning of files nobody
//! needs any more, and spotting a session that outlived its deadlines.
//!
//! The pieces are small and mostly pure; the daemon loop calls them every
//! `health.interval`:
//!
//! ```text
//! probe(state_root) ──► disk_level(prev, free, thresholds) ──► HealthState (daemon.json, STATUS=)
//!                                   │
//!          Paused / Stopped ────────┴──► prune_processed / prune_sessions / prune_stale_temps
//! ```
//!
//! # Levels
//!
//! | level     | free space        | the daemon …                                      |
//! |-----------|-------------------|---------------------------------------------------|
//! | `ok`      | ≥ `disk_warn`     | works normally                                    |
//! | `low`     | < `disk_warn`     | warns                                             |
//! | `paused`  | < `disk_pause`    | starts no new session, prunes                     |
//! | `stopped` | < `disk_stop`     | ends running sessions cleanly, stops waking       |
//!
//! Going down is immediate; coming back from `paused` or `stopped` needs
//! free space *above* `disk_pause` before sessions start again (see
//! [`disk_level`]).
//!
//! What pruning may never delete is said in [`crate::state::prune`].

use std::fmt;
use std::io;
use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::config::HealthSettings;

// ---- levels ------------------------------------------------------------------

/// How full the state root's file system is, from the daemon's point of view.
/// Ordered by severity: `Ok < Low < Paused < Stopped`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum DiskLevel {
    /// At least `disk_warn` free.
    #[default]
    Ok,
    /// Below `disk_warn`: warn only.
    Low,
    /// Below `disk_pause`: no new sessions; prune.
    Paused,
    /// Below `disk_stop`: end running sessions cleanly and stop waking.
    Stopped,
}

impl DiskLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            DiskLevel::Ok => "ok",
            DiskLevel::Low => "low",
            DiskLevel::Paused => "paused",
            DiskLevel::Stopped => "stopped",
        }
    }

    /// Whether a new session may start at this level.
    pub fn allows_new_sessions(self) -> bool {
        self <= DiskLevel::Low
    }

    /// Whether the daemon should prune at this level.
    pub fn wants_pruning(self) -> bool {
        self >= DiskLevel::Paused
    }

    /// Whether running sessions must be ended.
    pub fn stops_sessions(self) -> bool {
        self == DiskLevel::Stopped
    }
}

impl fmt::Display for DiskLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Free-space thresholds in bytes. The config guarantees
/// `warn >= pause >= stop`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    pub warn: u64,
    pub pause: u64,
    pub stop: u64,
}

impl From<&HealthSettings> for Thresholds {
    fn from(h: &HealthSettings) -> Self {
        Thresholds {
            warn: h.disk_warn,
            pause: h.disk_pause,
            stop: h.disk_stop,
        }
    }
}

impl Thresholds {
    /// The level for `free` bytes without history: the level it goes *down*
    /// to. "Below" is strict: exactly `disk_pause` free is not paused.
    pub fn classify(&self, free: u64) -> DiskLevel {
        if free < self.stop {
            DiskLevel::Stopped
        } else if free < self.pause {
            DiskLevel::Paused
        } else if free < self.warn {
            DiskLevel::Low
        } else {
            DiskLevel::Ok
        }
    }
}

/// The level after seeing `free` bytes, coming from `prev`. Pure.
///
/// * Going down is immediate (`free < threshold`).
/// * From `Paused` or `Stopped`, sessions resume (`Low` or `Ok`) only when
///   `free > pause`. Until then a `Stopped` daemon goes to `Paused` once
///   `free > stop`: it may wake again for nothing but pruning, and starts
///   no session until there is room above `disk_pause`.
/// * `Low` ↔ `Ok` follows `disk_warn` directly (it only changes a warning).
///
/// So a daemon stopped below `disk_stop` does not flap at `disk_stop`: it
/// starts sessions again only above `disk_pause`.
pub fn disk_level(prev: DiskLevel, free: u64, t: &Thresholds) -> DiskLevel {
    let raw = t.classify(free);
    if raw >= prev {
        return raw;
    }
    match prev {
        DiskLevel::Stopped | DiskLevel::Paused if free > t.pause => raw,
        DiskLevel::Stopped if free > t.stop => DiskLevel::Paused,
        DiskLevel::Stopped => DiskLevel::Stopped,
        DiskLevel::Paused => DiskLevel::Paused,
        DiskLevel::Low | DiskLevel::Ok => raw,
    }
}

// ---- probing -----------------------------------------------------------------

/// What `statvfs(3)` says about the file system holding a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DiskProbe {
    /// Bytes available to unprivileged users (`f_bavail * f_frsize`): the
    /// agents' sessions do not run as root, so the root reserve is not
    /// theirs.
    pub free: u64,
    /// Size of the file system (`f_blocks * f_frsize`).
    pub total: u64,
    /// Mounted read-only (`ST_RDONLY`).
    pub read_only: bool,
}

/// `statvfs` the file system holding `path` (normally the state root).
pub fn probe(path: &Path) -> io::Result<DiskProbe> {
    use nix::sys::statvfs::{FsFlags, statvfs};
    let st = statvfs(path).map_err(|errno| {
        io::Error::new(
            io::Error::from(errno).kind(),
            format!("statvfs {}: {errno}", path.display()),
        )
    })?;
    // The field types differ between platforms (u32 / u64).
    #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
    let (avail, blocks, frsize) = (
        st.blocks_available() as u64,
        st.blocks() as u64,
        st.fragment_size() as u64,
    );
    Ok(DiskProbe {
        free: avail.saturating_mul(frsize),
        total: blocks.saturating_mul(frsize),
        read_only: st.flags().contains(FsFlags::ST_RDONLY),
    })
}

// ---- pruning -----------------------------------------------------------------

// What may be pruned is the store's to say (`check --repair` prunes stale
// temps too, without a daemon): see [`crate::state::prune`].
pub use crate::state::prune::{
    PruneStats, STALE_TEMP_AGE, is_atomic_temp_name, prune_atomic_temps, prune_processed,
    prune_sessions, prune_stale_temps,
};

// ---- stale sessions ----------------------------------------------------------

/// Slack on top of a session's timeout and kill grace before it counts as
/// overdue: the runner's own TERM/KILL has had every chance by then.
pub const OVERDUE_MARGIN: Duration = Duration::from_secs(60);

/// Whether a session that should have ended by `due` (its run's timeout
/// and kill grace, as its machine keeps them) is overdue at `now`: past
/// `due +` [`OVERDUE_MARGIN`]. Pure.
pub fn past_due(due: DateTime<Utc>, now: DateTime<Utc>) -> bool {
    match chrono::Duration::from_std(OVERDUE_MARGIN)
        .ok()
        .and_then(|d| due.checked_add_signed(d))
    {
        Some(deadline) => now > deadline,
        None => false,
    }
}

/// Whether a session started at `started_at` should have ended by `now`:
/// past `timeout + kill_grace +` [`OVERDUE_MARGIN`]. Pure.
pub fn overdue(
    started_at: DateTime<Utc>,
    timeout: Duration,
    kill_grace: Duration,
    now: DateTime<Utc>,
) -> bool {
    let allowed = timeout
        .saturating_add(kill_grace)
        .saturating_add(OVERDUE_MARGIN);
    match chrono::Duration::from_std(allowed)
        .ok()
        .and_then(|d| started_at.checked_add_signed(d))
    {
        Some(deadline) => now > deadline,
        None => false,
    }
}

// ---- state for daemon.json and STATUS= ---------------------------------------

/// The last prune: when, and what it removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneRecord {
    pub at: Timestamp,
    #[serde(flatten)]
    pub stats: PruneStats,
}

/// The disk as the daemon last saw it, for `daemon.json` and `STATUS=`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthState {
    pub level: DiskLevel,
    pub free: u64,
    pub total: u64,
    pub read_only: bool,
    pub checked_at: Timestamp,
    pub last_prune: Option<PruneRecord>,
}

impl HealthState {
    /// The state after a probe. `prev` carries the hysteresis and the last
    /// prune (`None` at start: from `Ok`). A read-only file system is
    /// `Stopped` whatever its free space (nothing can be written); once
    /// writable again it leaves `Stopped` by the rules of [`disk_level`].
    pub fn observe(
        prev: Option<&HealthState>,
        probe: DiskProbe,
        t: &Thresholds,
        now: Timestamp,
    ) -> HealthState {
        let prev_level = prev.map(|p| p.level).unwrap_or_default();
        let level = if probe.read_only {
            DiskLevel::Stopped
        } else {
            disk_level(prev_level, probe.free, t)
        };
        HealthState {
            level,
            free: probe.free,
            total: probe.total,
            read_only: probe.read_only,
            checked_at: now,
            last_prune: prev.and_then(|p| p.last_prune),
        }
    }

    /// Whether to prune now: the level asks for it and the file system is
    /// writable (on a read-only one every removal would fail).
    pub fn should_prune(&self) -> bool {
        self.level.wants_pruning() && !self.read_only
    }

    pub fn record_prune(&mut self, stats: PruneStats, at: Timestamp) {
        self.last_prune = Some(PruneRecord { at, stats });
    }

    /// A few words for `STATUS=` and logs: `disk ok (12.3 GiB free)`,
    /// `disk low: 800 MiB free`, `paused: disk below disk_pause (400 MiB
    /// free)`, `stopped: disk below disk_stop (50 MiB free)`,
    /// `stopped: state root is read-only`.
    pub fn status_fragment(&self) -> String {
        let free = format_bytes(self.free);
        match self.level {
            _ if self.read_only => "stopped: state root is read-only".to_string(),
            DiskLevel::Ok => format!("disk ok ({free} free)"),
            DiskLevel::Low => format!("disk low: {free} free"),
            DiskLevel::Paused => format!("paused: disk below disk_pause ({free} free)"),
            DiskLevel::Stopped => format!("stopped: disk below disk_stop ({free} free)"),
        }
    }
}

/// A byte count in binary units, one decimal at most: `512 B`, `800 MiB`,
/// `12.3 GiB`.
pub fn format_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64;
    let mut unit = 0;
    // Divide until the value, as printed, is below 1024.
    while unit + 1 < UNITS.len() && (value * 10.0).round() / 10.0 >= 1024.0 {
        value /= 1024.0;
        unit += 1;
    }
    let text = format!("{value:.1}");
    let text = text.strip_suffix(".0").unwrap_or(&text);
    format!("{text} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn t() -> Thresholds {
        Thresholds {
            warn: 1000 * MIB,
            pause: 500 * MIB,
            stop: 100 * MIB,
        }
    }

    #[test]
    fn disk_level_table() {
        use DiskLevel::*;
        let (warn, pause, stop) = (1000 * MIB, 500 * MIB, 100 * MIB);
        #[rustfmt::skip]
        let table: &[(DiskLevel, u64, DiskLevel)] = &[
            // Going down is immediate; "below" is strict.
            (Ok, warn, Ok),
            (Ok, warn - 1, Low),
            (Ok, pause, Low),
            (Ok, pause - 1, Paused),
            (Ok, stop, Paused),
            (Ok, stop - 1, Stopped),
            (Ok, 0, Stopped),
            (Low, pause - 1, Paused),
            (Low, stop - 1, Stopped),
            (Paused, stop - 1, Stopped),
            // Low <-> Ok follows disk_warn.
            (Low, warn - 1, Low),
            (Low, warn, Ok),
            // Paused resumes only above disk_pause.
            (Paused, pause - 1, Paused),
            (Paused, pause, Paused),
            (Paused, pause + 1, Low),
            (Paused, warn, Ok),
            // Stopped: to Paused above disk_stop, resumes only above disk_pause.
            (Stopped, stop - 1, Stopped),
            (Stopped, stop, Stopped),
            (Stopped, stop + 1, Paused),
            (Stopped, pause, Paused),
            (Stopped, pause + 1, Low),
            (Stopped, warn + 1, Ok),
            // Staying put.
            (Ok, u64::MAX, Ok),
            (Low, pause, Low),
            (Paused, stop, Paused),
        ];
        for &(prev, free, want) in table {
            assert_eq!(
                disk_level(prev, free, &t()),
                want,
                "from {prev:?} with {free} bytes free"
            );
        }
    }

    #[test]
    fn disk_level_with_equal_thresholds() {
        let t = Thresholds {
            warn: 10,
            pause: 10,
            stop: 10,
        };
        assert_eq!(disk_level(DiskLevel::Ok, 9, &t), DiskLevel::Stopped);
        assert_eq!(disk_level(DiskLevel::Stopped, 10, &t), DiskLevel::Stopped);
        assert_eq!(disk_level(DiskLevel::Stopped, 11, &t), DiskLevel::Ok);
        let zero = Thresholds {
            warn: 0,
            pause: 0,
            stop: 0,
        };
        assert_eq!(disk_level(DiskLevel::Ok, 0, &zero), DiskLevel::Ok);
    }

    #[test]
    fn what_each_level_allows() {
        use DiskLevel::*;
        assert!(Ok.allows_new_sessions() && Low.allows_new_sessions());
        assert!(!Paused.allows_new_sessions() && !Stopped.allows_new_sessions());
        assert!(!Low.wants_pruning() && Paused.wants_pruning() && Stopped.wants_pruning());
        assert!(Stopped.stops_sessions() && !Paused.stops_sessions());
    }

    #[test]
    fn probe_sees_the_file_system_of_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        let p = probe(dir.path()).unwrap();
        assert!(p.total > 0, "{p:?}");
        assert!(p.free <= p.total, "{p:?}");
        assert!(!p.read_only, "{p:?}");
        let err = probe(&dir.path().join("missing")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains("missing"), "{err}");
    }

    // ---- overdue ----

    #[test]
    fn overdue_after_timeout_grace_and_a_minute() {
        let start = Timestamp::parse("2026-03-31T22:00:00Z").unwrap().0;
        let (timeout, grace) = (Duration::from_secs(90 * 60), Duration::from_secs(30));
        let at = |s: i64| start + chrono::Duration::seconds(s);
        let deadline = 90 * 60 + 30 + 60;
        assert!(!overdue(start, timeout, grace, at(0)));
        assert!(!overdue(start, timeout, grace, at(90 * 60 + 30)));
        assert!(!overdue(start, timeout, grace, at(deadline)));
        assert!(overdue(start, timeout, grace, at(deadline + 1)));
        // A clock that went backwards is never overdue.
        assert!(!overdue(start, timeout, grace, at(-3600)));
        // Absurd durations do not overflow.
        assert!(!overdue(start, Duration::MAX, grace, at(deadline + 1)));
    }

    #[test]
    fn past_due_a_minute_after_the_machines_due_time() {
        let due = Timestamp::parse("2026-03-31T23:30:30Z").unwrap().0;
        let at = |s: i64| due + chrono::Duration::seconds(s);
        assert!(!past_due(due, at(-3600)));
        assert!(!past_due(due, at(0)));
        assert!(!past_due(due, at(60)));
        assert!(past_due(due, at(61)));
        // The end of the calendar does not overflow.
        assert!(!past_due(crate::clock::latest(), crate::clock::latest()));
    }

    // ---- state ----

    fn state(level: DiskLevel, free: u64) -> HealthState {
        HealthState {
            level,
            free,
            total: 100 << 30,
            read_only: false,
            checked_at: Timestamp::parse("2026-03-31T22:00:00Z").unwrap(),
            last_prune: None,
        }
    }

    #[test]
    fn status_fragments() {
        let gib = |x: f64| (x * (1u64 << 30) as f64) as u64;
        assert_eq!(
            state(DiskLevel::Ok, gib(12.3)).status_fragment(),
            "disk ok (12.3 GiB free)"
        );
        assert_eq!(
            state(DiskLevel::Low, 800 * MIB).status_fragment(),
            "disk low: 800 MiB free"
        );
        assert_eq!(
            state(DiskLevel::Paused, 400 * MIB).status_fragment(),
            "paused: disk below disk_pause (400 MiB free)"
        );
        assert_eq!(
            state(DiskLevel::Stopped, 50 * MIB).status_fragment(),
            "stopped: disk below disk_stop (50 MiB free)"
        );
        let mut ro = state(DiskLevel::Stopped, gib(5.0));
        ro.read_only = true;
        assert_eq!(ro.status_fragment(), "stopped: state root is read-only");
    }

    #[test]
    fn byte_formats() {
        for (n, want) in [
            (0, "0 B"),
            (1023, "1023 B"),
            (1024, "1 KiB"),
            (1536, "1.5 KiB"),
            (500 * MIB, "500 MiB"),
            (MIB - 1, "1 MiB"),
            (1 << 30, "1 GiB"),
            ((12.34 * (1u64 << 30) as f64) as u64, "12.3 GiB"),
            (3 << 40, "3 TiB"),
            (u64::MAX, "16384 PiB"),
        ] {
            assert_eq!(format_bytes(n), want, "{n}");
        }
    }

    #[test]
    fn health_state_serializes_with_snake_case_levels() {
        let mut s = state(DiskLevel::Paused, 400 * MIB);
        s.record_prune(
            PruneStats {
                files: 3,
                bytes: 1234,
                failed: 0,
            },
            Timestamp::parse("2026-03-31T22:01:00Z").unwrap(),
        );
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "level": "paused",
                "free": 400 * MIB,
                "total": 100u64 << 30,
                "read_only": false,
                "checked_at": "2026-03-31T22:00:00Z",
                "last_prune": {"at": "2026-03-31T22:01:00Z", "files": 3, "bytes": 1234},
            })
        );
        let back: HealthState = serde_json::from_value(v).unwrap();
        assert_eq!(back, s);
        for (level, text) in [
            (DiskLevel::Ok, "\"ok\""),
            (DiskLevel::Low, "\"low\""),
            (DiskLevel::Stopped, "\"stopped\""),
        ] {
            assert_eq!(serde_json::to_string(&level).unwrap(), text);
            assert_eq!(format!("\"{level}\""), text);
        }
    }

    #[test]
    fn observe_carries_hysteresis_prune_and_read_only() {
        let now = Timestamp::parse("2026-03-31T22:00:00Z").unwrap();
        let p = |free, read_only| DiskProbe {
            free,
            total: 10 << 30,
            read_only,
        };
        let first = HealthState::observe(None, p(2000 * MIB, false), &t(), now);
        assert_eq!(first.level, DiskLevel::Ok);
        let mut stopped = HealthState::observe(Some(&first), p(50 * MIB, false), &t(), now);
        assert_eq!(stopped.level, DiskLevel::Stopped);
        stopped.record_prune(PruneStats::default(), now);
        let after = HealthState::observe(Some(&stopped), p(300 * MIB, false), &t(), now);
        assert_eq!(after.level, DiskLevel::Paused);
        assert!(after.last_prune.is_some());
        let ro = HealthState::observe(Some(&first), p(2000 * MIB, true), &t(), now);
        assert_eq!(ro.level, DiskLevel::Stopped);
        assert!(ro.read_only);
        assert!(!ro.should_prune());
        assert!(stopped.should_prune());
        assert!(!first.should_prune());
        let rw = HealthState::observe(Some(&ro), p(300 * MIB, false), &t(), now);
        assert_eq!(rw.level, DiskLevel::Paused);
        let rw = HealthState::observe(Some(&ro), p(2000 * MIB, false), &t(), now);
        assert_eq!(rw.level, DiskLevel::Ok);
    }

    #[test]
    fn thresholds_come_from_the_config() {
        let text = "[health]\ndisk_warn = \"3MiB\"\ndisk_pause = \"2MiB\"\ndisk_stop = \"1MiB\"\n";
        let c = crate::config::Config::parse(text, Path::new("/x/c.toml")).unwrap();
        assert_eq!(
            Thresholds::from(&c.health),
            Thresholds {
                warn: 3 * MIB,
                pause: 2 * MIB,
                stop: MIB
            }
        );
    }
}
