//! Pruning: removing files nobody needs any more (old processed messages,
//! old session logs and prompts, temp files of crashed writes). The daemon's
//! health monitor calls it every `health.interval`; `check --repair` prunes
//! stale temps too.
//!
//! # What pruning may never delete
//!
//! Invariant 4 of ARCHITECTURE.md ("nothing a human might need is
//! deleted") holds. Pruning removes only:
//!
//! * `inbox/processed/*`: messages a session has already been given
//!   ([`prune_processed`]);
//! * `sessions/{id}.log` and `sessions/{id}.prompt.md` of old sessions,
//!   except the newest few and the running one ([`prune_sessions`]);
//! * temp files left by crashed writes ([`prune_stale_temps`]).
//!
//! It never touches: state files (`report.json`, `tasks.json`,
//! `session.json`, `metrics.json`, `memory.md`, `journal.jsonl`, `.lock`),
//! set-aside copies (`*.corrupt-*`, `journal.jsonl.torn-*`), anything in
//! `inbox/rejected/` other than a crashed write's temp file (rejected
//! input is kept for the operator), waiting messages in `inbox/`, claimed
//! messages in `inbox/.claimed/`, files it does not recognise, directories,
//! symlinks (nor what they point to), and anything outside the agent's
//! directory. Files that vanish while it works are not an error.

use std::ffi::OsString;
use std::io;
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::AgentDir;

/// What a prune removed (or could not).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneStats {
    /// Files removed.
    pub files: usize,
    /// Their total size (as `lstat` saw it just before removal).
    pub bytes: u64,
    /// Files that should have gone but could not be removed (each logged).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failed: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl PruneStats {
    pub fn is_empty(&self) -> bool {
        self.files == 0 && self.failed == 0
    }
}

impl std::ops::AddAssign for PruneStats {
    fn add_assign(&mut self, o: PruneStats) {
        self.files += o.files;
        self.bytes += o.bytes;
        self.failed += o.failed;
    }
}

impl std::ops::Add for PruneStats {
    type Output = PruneStats;
    fn add(mut self, o: PruneStats) -> PruneStats {
        self += o;
        self
    }
}

/// The youngest a temp file may be and still be pruned: a write never
/// takes this long. [`prune_stale_temps`] never uses a later cutoff.
pub const STALE_TEMP_AGE: Duration = Duration::from_secs(3600);

/// Remove `inbox/processed/*` files whose mtime is before `older_than`.
///
/// Processed messages have been given to a session already; they are kept
/// for a while for the operator, then pruned. The mtime is the message's
/// (moving it into `processed/` keeps it), so the age counts from delivery.
/// Only regular files directly in `processed/`; never `rejected/`, waiting
/// (`inbox/*.json`) or claimed (`inbox/.claimed/`) messages. If `processed/`
/// is missing or is not a real directory (a symlink), nothing is pruned.
pub fn prune_processed(agent_dir: &AgentDir, older_than: SystemTime) -> io::Result<PruneStats> {
    let dir = agent_dir.processed();
    let mut stats = PruneStats::default();
    for name in list(&dir)? {
        remove_if_older(&dir.join(&name), older_than, &mut stats);
    }
    Ok(stats)
}

/// Remove `sessions/{id}.log` and `sessions/{id}.prompt.md` whose mtime is
/// before `older_than`, keeping every file of the newest `keep_last`
/// sessions (newest by id, which is the start time; normally including the
/// running one) and of `protect` (the running session, if any). Files whose names are not
/// `YYYYMMDD-HHMMSS[-N].log` / `.prompt.md` / `.claude.json` / `.claude.stderr`
/// are never touched.
pub fn prune_sessions(
    agent_dir: &AgentDir,
    older_than: SystemTime,
    keep_last: usize,
    protect: Option<&str>,
) -> io::Result<PruneStats> {
    let dir = agent_dir.sessions_dir();
    let mut files: Vec<(SessionKey, String, OsString)> = Vec::new();
    for name in list(&dir)? {
        let Some(text) = name.to_str() else { continue };
        let Some(id) = session_file_id(text) else {
            continue;
        };
        let Some(key) = SessionKey::parse(id) else {
            continue;
        };
        files.push((key, id.to_string(), name));
    }
    let mut ids: Vec<SessionKey> = files.iter().map(|(k, _, _)| *k).collect();
    ids.sort_unstable_by(|a, b| b.cmp(a));
    ids.dedup();
    let kept = &ids[..keep_last.min(ids.len())];
    let mut stats = PruneStats::default();
    for (key, id, name) in &files {
        if kept.contains(key) || protect == Some(id.as_str()) {
            continue;
        }
        remove_if_older(&dir.join(name), older_than, &mut stats);
    }
    Ok(stats)
}

/// Remove temp files of crashed writes older than `older_than` (never
/// younger than [`STALE_TEMP_AGE`] before `now`, whatever the cutoff given):
///
/// * temp files of [`crate::state::atomic`] (`.{name}.XXXXXX.tmp`) in the
///   agent directory, `inbox/`, `inbox/rejected/` (the `.reason.json` being
///   written, never rejected input) and `sessions/`;
/// * any regular file in `inbox/.tmp/`, where senders write a message
///   before renaming it into the inbox.
pub fn prune_stale_temps(
    agent_dir: &AgentDir,
    older_than: SystemTime,
    now: SystemTime,
) -> io::Result<PruneStats> {
    let cutoff = stale_cutoff(older_than, now);
    let mut stats = PruneStats::default();
    for dir in [
        agent_dir.path.clone(),
        agent_dir.inbox(),
        agent_dir.rejected(),
        agent_dir.sessions_dir(),
    ] {
        stats += prune_atomic_temps(&dir, cutoff, now)?;
    }
    let tmp = agent_dir.inbox_tmp();
    for name in list(&tmp)? {
        remove_if_older(&tmp.join(name), cutoff, &mut stats);
    }
    Ok(stats)
}

/// Remove [`crate::state::atomic`] temp files older than `older_than` (never
/// younger than [`STALE_TEMP_AGE`] before `now`) directly in `dir`: for directories
/// outside an agent, such as `.daemon/`.
pub fn prune_atomic_temps(
    dir: &Path,
    older_than: SystemTime,
    now: SystemTime,
) -> io::Result<PruneStats> {
    let cutoff = stale_cutoff(older_than, now);
    let mut stats = PruneStats::default();
    for name in list(dir)? {
        if name.to_str().is_some_and(is_atomic_temp_name) {
            remove_if_older(&dir.join(name), cutoff, &mut stats);
        }
    }
    Ok(stats)
}

/// Whether `name` is a temp file of [`crate::state::atomic`]:
/// `.as-XXXXXXXXXXXX.tmp`, or, from earlier versions, `.` + the target's
/// name + `.` + a random part + `.tmp`, e.g. `.report.json.a1B2c3.tmp`.
pub fn is_atomic_temp_name(name: &str) -> bool {
    // Today's short fixed-length names (`.as-XXXXXXXXXXXX.tmp`).
    if crate::fsx::is_temp_name(name) {
        return true;
    }
    // Those of earlier versions.
    let Some(inner) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")) else {
        return false;
    };
    match inner.rsplit_once('.') {
        Some((target, random)) => {
            !target.is_empty()
                && !random.is_empty()
                && random.chars().all(|c| c.is_ascii_alphanumeric())
        }
        None => false,
    }
}

fn stale_cutoff(older_than: SystemTime, now: SystemTime) -> SystemTime {
    match now.checked_sub(STALE_TEMP_AGE) {
        Some(latest) => older_than.min(latest),
        None => older_than,
    }
}

/// The session id of a `sessions/` file name, if it is a log or a prompt
/// (or the copy of Claude's output the example session script keeps there).
fn session_file_id(name: &str) -> Option<&str> {
    name.strip_suffix(".prompt.md")
        .or_else(|| name.strip_suffix(".log"))
        .or_else(|| name.strip_suffix(".claude.json"))
        .or_else(|| name.strip_suffix(".claude.stderr"))
        // Owner locks left by a `begin` that failed half-way.
        .or_else(|| name.strip_suffix(".owner"))
}

/// `YYYYMMDD-HHMMSS[-N]` in start order (`-10` after `-9`; no suffix is 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct SessionKey(u32, u32, u32);

impl SessionKey {
    fn parse(id: &str) -> Option<SessionKey> {
        let digits = |s: &str, len: usize| {
            (s.len() == len && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse::<u32>().ok())
                .flatten()
        };
        let mut parts = id.splitn(3, '-');
        let date = digits(parts.next()?, 8)?;
        let time = digits(parts.next()?, 6)?;
        let n = match parts.next() {
            None => 1,
            Some(n) if !n.is_empty() && n.len() <= 9 && n.bytes().all(|b| b.is_ascii_digit()) => {
                n.parse().ok()?
            }
            Some(_) => return None,
        };
        Some(SessionKey(date, time, n))
    }
}

/// The names in `dir`. Empty if `dir` is missing or is not a real directory;
/// no link is followed on the way to it or in it ([`crate::fsx`]).
fn list(dir: &Path) -> io::Result<Vec<OsString>> {
    match crate::fsx::list(dir) {
        Ok(names) => Ok(names),
        Err(crate::error::Error::Unsafe { path, reason }) => {
            tracing::warn!(path = %path.display(), error_code = "PATH_UNSAFE", "not pruning {}: {} {reason}", dir.display(), path.display());
            Ok(Vec::new())
        }
        Err(e) => Err(io::Error::other(e.to_string())),
    }
}

/// Remove `path` if it is a regular file (not a symlink, not a directory)
/// last modified before `older_than`. A file that vanished is not an error;
/// one that cannot be removed is logged and counted in `failed`.
fn remove_if_older(path: &Path, older_than: SystemTime, stats: &mut PruneStats) {
    let st = match crate::fsx::metadata(path) {
        Ok(Some(st)) => st,
        Ok(None) => return,
        Err(e) => return failed(path, "inspecting", io::Error::other(e.to_string()), stats),
    };
    if crate::fsx::file_type(&st) != nix::sys::stat::SFlag::S_IFREG {
        return;
    }
    let mtime = crate::fsx::modified(&st);
    if mtime >= older_than {
        return;
    }
    match crate::fsx::remove_file(path) {
        Ok(true) => {
            stats.files += 1;
            stats.bytes += st.st_size.max(0) as u64;
        }
        Ok(false) => {}
        Err(e) => failed(path, "removing", io::Error::other(e.to_string()), stats),
    }
}

fn failed(path: &Path, doing: &str, e: io::Error, stats: &mut PruneStats) {
    stats.failed += 1;
    tracing::warn!(path = %path.display(), error_code = "PRUNE_FAILED", "pruning: {doing} {}: {e}", path.display());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent_name::AgentName;
    use crate::state::StateRoot;
    use std::fs;

    const HOUR: Duration = Duration::from_secs(3600);
    const DAY: Duration = Duration::from_secs(86400);

    fn agent(dir: &tempfile::TempDir) -> AgentDir {
        let a = StateRoot::new(dir.path()).agent(&AgentName::parse("rio").unwrap());
        for d in a.directories() {
            fs::create_dir_all(d).unwrap();
        }
        a
    }

    /// A file with `bytes` bytes last modified `age` ago.
    fn file(path: &Path, bytes: usize, age: Duration) {
        fs::write(path, vec![b'x'; bytes]).unwrap();
        fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(SystemTime::now() - age)
            .unwrap();
    }

    fn exists(path: &Path) -> bool {
        fs::symlink_metadata(path).is_ok()
    }

    #[test]
    fn prune_processed_removes_only_old_processed_files() {
        let tmp = tempfile::tempdir().unwrap();
        let a = agent(&tmp);
        let p = a.processed();
        file(&p.join("old.json"), 10, 8 * DAY);
        file(&p.join("old-2.json"), 5, 8 * DAY);
        file(&p.join("new.json"), 7, DAY);
        // Never: rejected input, waiting and claimed messages, directories,
        // symlinks and what they point to.
        file(&a.rejected().join("bad.json"), 1, 30 * DAY);
        file(&a.rejected().join("bad.json.reason.json"), 1, 30 * DAY);
        file(&a.inbox().join("waiting.json"), 1, 30 * DAY);
        fs::create_dir_all(a.claimed("20260101-000000")).unwrap();
        file(&a.claimed("20260101-000000").join("m.json"), 1, 30 * DAY);
        fs::create_dir(p.join("subdir")).unwrap();
        file(&p.join("subdir").join("inner.json"), 1, 30 * DAY);
        let outside = tmp.path().join("outside.json");
        file(&outside, 1, 30 * DAY);
        std::os::unix::fs::symlink(&outside, p.join("link.json")).unwrap();

        let stats = prune_processed(&a, SystemTime::now() - 7 * DAY).unwrap();
        assert_eq!(
            stats,
            PruneStats {
                files: 2,
                bytes: 15,
                failed: 0
            }
        );
        assert!(!exists(&p.join("old.json")) && !exists(&p.join("old-2.json")));
        for kept in [
            p.join("new.json"),
            a.rejected().join("bad.json"),
            a.rejected().join("bad.json.reason.json"),
            a.inbox().join("waiting.json"),
            a.claimed("20260101-000000").join("m.json"),
            p.join("subdir").join("inner.json"),
            p.join("link.json"),
            outside,
        ] {
            assert!(exists(&kept), "{} was pruned", kept.display());
        }
        // A second run finds nothing.
        assert!(
            prune_processed(&a, SystemTime::now() - 7 * DAY)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn prune_never_follows_a_symlinked_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let a = agent(&tmp);
        let elsewhere = tmp.path().join("elsewhere");
        fs::create_dir(&elsewhere).unwrap();
        file(&elsewhere.join("precious.json"), 1, 30 * DAY);
        file(&elsewhere.join("20200101-000000.log"), 1, 30 * DAY);
        file(&elsewhere.join(".x.json.abc123.tmp"), 1, 30 * DAY);
        for d in [a.processed(), a.sessions_dir(), a.inbox_tmp()] {
            fs::remove_dir(&d).unwrap();
            std::os::unix::fs::symlink(&elsewhere, &d).unwrap();
        }
        let old = SystemTime::now() - DAY;
        assert!(prune_processed(&a, old).unwrap().is_empty());
        assert!(prune_sessions(&a, old, 0, None).unwrap().is_empty());
        assert!(
            prune_stale_temps(&a, old, SystemTime::now())
                .unwrap()
                .is_empty()
        );
        assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 3);
    }

    #[test]
    fn prune_of_missing_directories_is_empty() {
        let tmp = tempfile::tempdir().unwrap();
        let a = StateRoot::new(tmp.path()).agent(&AgentName::parse("rio").unwrap());
        let now = SystemTime::now();
        assert!(prune_processed(&a, now).unwrap().is_empty());
        assert!(prune_sessions(&a, now, 0, None).unwrap().is_empty());
        assert!(prune_stale_temps(&a, now, now).unwrap().is_empty());
    }

    #[test]
    fn a_file_that_vanished_is_not_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let mut stats = PruneStats::default();
        remove_if_older(&tmp.path().join("gone"), SystemTime::now(), &mut stats);
        assert_eq!(stats, PruneStats::default());
    }

    #[test]
    fn prune_sessions_keeps_the_newest_and_the_running_one() {
        let tmp = tempfile::tempdir().unwrap();
        let a = agent(&tmp);
        let s = a.sessions_dir();
        let ids = [
            "20260101-220000",
            "20260102-220000",
            "20260102-220000-2",
            "20260102-220000-9",
            "20260102-220000-10", // newer than -9
            "20260103-010000",    // the running one
        ];
        for id in ids {
            file(&s.join(format!("{id}.log")), 100, 30 * DAY);
            file(&s.join(format!("{id}.prompt.md")), 10, 30 * DAY);
        }
        // Young enough to stay whatever its rank.
        file(&s.join("20251231-000000.log"), 100, HOUR);
        // Not session files: never touched.
        let others = [
            "notes.txt",
            "20260101-220000.log.old",
            "20260101-2200.log",
            "2026010a-220000.log",
            "20260101-220000-x.log",
            "20260101-220000-.log",
            "x20260101-220000.log",
            ".20260101-220000.prompt.md.abc123.tmp",
        ];
        for name in others {
            file(&s.join(name), 1, 30 * DAY);
        }
        fs::create_dir(s.join("20250101-000000.log")).unwrap();

        let stats =
            prune_sessions(&a, SystemTime::now() - 7 * DAY, 2, Some("20260103-010000")).unwrap();
        // Kept: the running one, and the newest two: 20260103-010000 and
        // 20260102-220000-10. Gone: 20260101-220000, 20260102-220000, -2, -9.
        assert_eq!(
            stats,
            PruneStats {
                files: 8,
                bytes: 440,
                failed: 0
            }
        );
        for id in [
            "20260101-220000",
            "20260102-220000",
            "20260102-220000-2",
            "20260102-220000-9",
        ] {
            assert!(!exists(&s.join(format!("{id}.log"))), "{id}");
            assert!(!exists(&s.join(format!("{id}.prompt.md"))), "{id}");
        }
        for id in ["20260102-220000-10", "20260103-010000"] {
            assert!(exists(&s.join(format!("{id}.log"))), "{id}");
            assert!(exists(&s.join(format!("{id}.prompt.md"))), "{id}");
        }
        assert!(exists(&s.join("20251231-000000.log")));
        for name in others {
            assert!(exists(&s.join(name)), "{name}");
        }
        assert!(s.join("20250101-000000.log").is_dir());

        // The running session is protected even when it is not the newest.
        let stats =
            prune_sessions(&a, SystemTime::now() - 7 * DAY, 0, Some("20260103-010000")).unwrap();
        assert_eq!(stats.files, 2);
        assert!(exists(&s.join("20260103-010000.log")));
        assert!(!exists(&s.join("20260102-220000-10.log")));
    }

    #[test]
    fn session_keys_order_by_start_then_suffix() {
        let k = |id| SessionKey::parse(id).unwrap();
        assert!(k("20260102-220000") < k("20260102-220000-2"));
        assert!(k("20260102-220000-9") < k("20260102-220000-10"));
        assert!(k("20260102-220000-10") < k("20260102-220001"));
        assert!(k("20260102-235959-99") < k("20260103-000000"));
        for bad in [
            "",
            "20260102",
            "20260102-22000",
            "20260102-220000-",
            "a-b-c",
        ] {
            assert_eq!(SessionKey::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn atomic_temp_names() {
        // The name atomic.rs's temp files get (same builder settings).
        let dir = tempfile::tempdir().unwrap();
        let (_, real) = tempfile::Builder::new()
            .prefix(".report.json.")
            .suffix(".tmp")
            .tempfile_in(dir.path())
            .unwrap()
            .keep()
            .unwrap();
        let real = real.file_name().unwrap().to_str().unwrap().to_string();
        assert!(is_atomic_temp_name(&real), "{real}");
        for yes in [
            ".report.json.a1B2c3.tmp",
            ".msg-1.json.reason.json.XyZ987.tmp",
            ".20260101-220000.prompt.md.abcdef.tmp",
        ] {
            assert!(is_atomic_temp_name(yes), "{yes}");
        }
        for no in [
            ".lock",
            "report.json",
            "report.json.abc.tmp",
            ".tmp",
            "..tmp",
            ".report.json..tmp",
            ".abc.tmp",
            ".report.json.ab-c.tmp",
            "journal.jsonl.torn-20260101T000000Z",
            "report.json.corrupt-20260101T000000Z",
        ] {
            assert!(!is_atomic_temp_name(no), "{no}");
        }
    }

    #[test]
    fn prune_stale_temps_removes_only_old_temps() {
        let tmp = tempfile::tempdir().unwrap();
        let a = agent(&tmp);
        let old = 2 * HOUR;
        file(&a.file(".report.json.abc123.tmp"), 3, old);
        file(&a.inbox().join(".m1.json.abc123.tmp"), 3, old);
        file(
            &a.rejected().join(".bad.json.reason.json.abc123.tmp"),
            3,
            old,
        );
        file(&a.sessions_dir().join(".x.prompt.md.abc123.tmp"), 3, old);
        file(&a.inbox_tmp().join("m2.json"), 3, old);
        file(&a.inbox_tmp().join(".wake-1234"), 3, old);
        // Kept: young temps, state files, anything not a temp, temps in
        // places no atomic write goes.
        let kept = [
            a.file(".tasks.json.young1.tmp"),
            a.inbox_tmp().join("young.json"),
            a.file("report.json"),
            a.file(".lock"),
            a.file("journal.jsonl.torn-20260101T000000Z"),
            a.inbox().join("waiting.json"),
            a.rejected().join("bad.json"),
            a.processed().join(".p.json.abc123.tmp"),
            a.claimed("s").join(".c.json.abc123.tmp"),
        ];
        fs::create_dir_all(a.claimed("s")).unwrap();
        for (i, path) in kept.iter().enumerate() {
            file(path, 1, if i < 2 { HOUR / 2 } else { 30 * DAY });
        }
        fs::create_dir(a.inbox_tmp().join("adir")).unwrap();

        // A cutoff of "now" is capped at an hour ago.
        let now = SystemTime::now();
        let stats = prune_stale_temps(&a, now, now).unwrap();
        assert_eq!(
            stats,
            PruneStats {
                files: 6,
                bytes: 18,
                failed: 0
            }
        );
        for path in &kept {
            assert!(exists(path), "{} was pruned", path.display());
        }
        assert!(a.inbox_tmp().join("adir").is_dir());
    }

    #[test]
    fn prune_atomic_temps_in_any_directory() {
        let tmp = tempfile::tempdir().unwrap();
        file(&tmp.path().join(".daemon.json.abc123.tmp"), 4, 2 * HOUR);
        file(&tmp.path().join("daemon.json"), 4, 2 * HOUR);
        let now = SystemTime::now();
        let stats = prune_atomic_temps(tmp.path(), now, now).unwrap();
        assert_eq!(stats.files, 1);
        assert!(exists(&tmp.path().join("daemon.json")));
    }

    #[test]
    fn prune_stats_add_up() {
        let a = PruneStats {
            files: 1,
            bytes: 10,
            failed: 0,
        };
        let b = PruneStats {
            files: 2,
            bytes: 5,
            failed: 1,
        };
        assert_eq!(
            a + b,
            PruneStats {
                files: 3,
                bytes: 15,
                failed: 1
            }
        );
    }
}
