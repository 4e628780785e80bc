//! Daemon-wide files under `{state_root}/.daemon/`: the lock that keeps one
//! daemon per root, the last fire time of every schedule, and the
//! `daemon.json` heartbeat (the instance counters, which session scripts
//! take too, are the store's: [`crate::state::counters`]). JSON files are written through
//! `state::atomic` like every other state file.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::clock::Timestamp;
use std::os::unix::fs::OpenOptionsExt;

use crate::error::{Error, IoContext, Result};
use crate::state::lock::open_lock_file;
use crate::state::{StateRoot, atomic};

/// Held for the daemon's whole life: a second daemon on the same root finds
/// it taken and exits.
///
/// `.daemon/lock` alone does not survive the root being removed and made
/// again (`rm -rf` and `bootstrap`, as a demo or an operator may do): the
/// new root has a new lock file that nobody holds. So the daemon also holds
/// a lock keyed by the root's canonical path in the runtime directory (the
/// unit's `RuntimeDirectory=`, `$XDG_RUNTIME_DIR/agent-state/`, or
/// `/run/agent-state/` for root), which the new root does not reset, and it checks ([`DaemonLock::check`]) that
/// `.daemon/lock` is still the file it locked, to stop when it is not.
pub struct DaemonLock {
    lock: Flock<File>,
    path: PathBuf,
    _runtime: Option<RuntimeLock>,
}

impl DaemonLock {
    /// Err(why) once `.daemon/lock` is no longer the file this daemon
    /// locked: the root (or its `.daemon/`) was removed or replaced, and
    /// the daemon no longer owns what is at its path.
    pub fn check(&self) -> std::result::Result<(), String> {
        let held = nix::sys::stat::fstat(&*self.lock)
            .ok()
            .map(|s| (s.st_dev, s.st_ino));
        let now = nix::sys::stat::stat(&self.path)
            .ok()
            .map(|s| (s.st_dev, s.st_ino));
        if held.is_some() && held == now {
            return Ok(());
        }
        Err(format!(
            "{} is no longer the lock this daemon took (the state root was removed or replaced \
             under it): the daemon stops rather than run on a root it does not own; start it again",
            self.path.display()
        ))
    }
}

pub fn lock_root(root: &StateRoot) -> Result<DaemonLock> {
    let dir = root.daemon_dir();
    atomic::create_dir(&dir, 0o750)?;
    // The runtime lock first: it still stands when the root was made again
    // under a daemon that runs on it.
    let runtime = RuntimeLock::take(root)?;
    let path = dir.join("lock");
    let mut file = open_lock_file(&path, 0o640)?;
    // `agent-state wake` and `status` probe the lock with a shared lock held
    // for microseconds; a live daemon holds it for good. Try for half a
    // second before concluding that another daemon runs.
    let mut tries = 0;
    let result = loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Err((f, nix::errno::Errno::EWOULDBLOCK)) if tries < 50 => {
                tries += 1;
                file = f;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => break other,
        }
    };
    match result {
        Ok(lock) => Ok(DaemonLock {
            lock,
            path,
            _runtime: runtime,
        }),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(already_running(root)),
        Err((_, errno)) => Err(Error::io("locking", &path, errno.into())),
    }
}

fn already_running(root: &StateRoot) -> Error {
    let pid = read_heartbeat(root)
        .ok()
        .flatten()
        .map(|h| h.pid.to_string());
    Error::Usage(format!(
        "another agent-state daemon is already running on {} (pid {}); one daemon per state root",
        root.path.display(),
        pid.unwrap_or_else(|| "unknown".into())
    ))
}

/// The lock keyed by the root's canonical path in the runtime directory.
/// Its file is removed when the daemon ends (under the lock, and a taker
/// checks that the file it locked is still the one at the path).
struct RuntimeLock {
    _lock: Flock<File>,
    path: PathBuf,
}

impl RuntimeLock {
    /// None when there is no runtime directory we may use (a system service
    /// without `RuntimeDirectory=`): `.daemon/lock` and the check remain.
    fn take(root: &StateRoot) -> Result<Option<RuntimeLock>> {
        let Some(dir) = runtime_dir(
            std::env::var_os("RUNTIME_DIRECTORY").map(PathBuf::from),
            std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
            nix::unistd::geteuid().is_root(),
        ) else {
            return Ok(None);
        };
        let canonical = std::fs::canonicalize(&root.path).at("resolving", &root.path)?;
        if let Err(e) = std::fs::create_dir(&dir)
            && e.kind() != std::io::ErrorKind::AlreadyExists
        {
            tracing::debug!("no runtime lock in {}: {e}", dir.display());
            return Ok(None);
        }
        let path = dir.join(runtime_lock_name(&canonical));
        // Held only for a moment by something else (a child forked by a
        // daemon SIGKILLed an instant ago keeps the descriptor until its
        // exec closes it): tried for a second before concluding.
        let mut busy = 0;
        for _ in 0..150 {
            let file = match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(&path)
            {
                Ok(f) => f,
                Err(e) => {
                    tracing::debug!("no runtime lock at {}: {e}", path.display());
                    return Ok(None);
                }
            };
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => {
                    // The previous holder may have removed the file between
                    // our open and our lock: then lock the new one.
                    let held = nix::sys::stat::fstat(&*lock).map(|s| (s.st_dev, s.st_ino));
                    let now = nix::sys::stat::stat(&path).map(|s| (s.st_dev, s.st_ino));
                    if held.is_ok() && held == now {
                        use std::io::Write;
                        let _ = lock.set_len(0);
                        let _ = writeln!(&*lock, "{}", canonical.display());
                        return Ok(Some(RuntimeLock { _lock: lock, path }));
                    }
                }
                Err((_, nix::errno::Errno::EWOULDBLOCK)) if busy < 100 => busy += 1,
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                    return Err(Error::Usage(format!(
                        "another agent-state daemon is already running on {} (it holds {}, \
                         taken when it started on that root, which has been removed or made \
                         again since); stop it first: one daemon per state root",
                        canonical.display(),
                        path.display()
                    )));
                }
                Err((_, errno)) => return Err(Error::io("locking", &path, errno.into())),
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Err(Error::Unavailable(format!(
            "{} keeps being replaced while this daemon tries to lock it; try again",
            path.display()
        )))
    }
}

impl Drop for RuntimeLock {
    fn drop(&mut self) {
        // Removed while still held, so a daemon that locks it next checks
        // that the file is gone and makes a new one.
        // (`_lock` is released after this, when the fields are dropped.)
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Where the runtime lock goes: the unit's `RuntimeDirectory=` (systemd
/// names it in `$RUNTIME_DIRECTORY`), else `$XDG_RUNTIME_DIR/agent-state`,
/// else `/run/agent-state` for root, else nowhere.
fn runtime_dir(unit: Option<PathBuf>, xdg: Option<PathBuf>, is_root: bool) -> Option<PathBuf> {
    // systemd may list several, separated by ':'; the first is ours.
    if let Some(first) = unit.as_ref().and_then(|u| {
        u.to_str()
            .and_then(|s| s.split(':').next())
            .map(PathBuf::from)
    }) && first.is_absolute()
    {
        return Some(first);
    }
    match xdg {
        Some(dir) if dir.is_absolute() => Some(dir.join("agent-state")),
        _ if is_root => Some(PathBuf::from("/run/agent-state")),
        _ => None,
    }
}

/// `root-<FNV-1a 64 of the canonical path>.lock`: short, fixed length, and
/// the same in every version of the program.
fn runtime_lock_name(canonical: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in canonical.as_os_str().as_bytes() {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("root-{hash:016x}.lock")
}

/// Is the daemon's lock on this root held? `None` if this user cannot open
/// the lock file (a monitoring user outside the group).
pub fn daemon_lock_state(root: &StateRoot) -> Option<bool> {
    let path = root.daemon_dir().join("lock");
    let file = open_lock_file(&path, 0o640).ok()?;
    match Flock::lock(file, FlockArg::LockSharedNonblock) {
        Ok(_) => Some(false),
        Err((_, errno)) => (errno == nix::errno::Errno::EWOULDBLOCK).then_some(true),
    }
}

/// Is a daemon running on this root (is its lock held)?
pub fn daemon_running(root: &StateRoot) -> bool {
    let path = root.daemon_dir().join("lock");
    let Ok(file) = open_lock_file(&path, 0o640) else {
        return false;
    };
    match Flock::lock(file, FlockArg::LockSharedNonblock) {
        Ok(_) => false,
        Err((_, errno)) => errno == nix::errno::Errno::EWOULDBLOCK,
    }
}

// ---- schedule state ------------------------------------------------------------

/// `.daemon/schedule.json`: the last time each agent's schedule fired.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ScheduleState {
    #[serde(default)]
    pub last_fire: BTreeMap<String, Timestamp>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

pub fn schedule_path(root: &StateRoot) -> PathBuf {
    root.daemon_dir().join("schedule.json")
}

pub fn read_schedule_state(root: &StateRoot) -> ScheduleState {
    match atomic::read_json::<ScheduleState>(&schedule_path(root)) {
        Ok(s) => s.unwrap_or_default(),
        Err(e) => {
            // Losing it costs at most one missed catch-up; say so and go on.
            tracing::warn!(
                error_code = "STATE_CORRUPT",
                "{e}; starting without last fire times"
            );
            ScheduleState::default()
        }
    }
}

pub fn write_schedule_state(root: &StateRoot, state: &ScheduleState) -> Result<()> {
    atomic::write_json(&schedule_path(root), state)
}

// ---- heartbeat ----------------------------------------------------------------

/// `.daemon/daemon.json`: what the daemon is doing, for other programs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Heartbeat {
    pub pid: u32,
    pub version: String,
    pub started_at: Timestamp,
    pub updated_at: Timestamp,
    pub state_root: String,
    pub config: String,
    pub agents: Vec<String>,
    pub running: Vec<RunningEntry>,
    pub waiting: Vec<String>,
    pub next_wakes: BTreeMap<String, Timestamp>,
    pub paused: Option<String>,
    pub stopping: bool,
    /// The health monitor's last look at the disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<super::health::HealthState>,
    /// Agents whose sessions fail: retrying, backing off or disabled.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failing: BTreeMap<String, String>,
    /// Credentials whose agents are held (a usage limit, an admin's cap, a
    /// failed login check), by credential name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub held: BTreeMap<String, HeldEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HeldEntry {
    /// `usage_limit`, `disabled` or `credential`.
    pub cause: String,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Timestamp>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunningEntry {
    pub agent: String,
    pub session_id: String,
    pub instance: String,
    pub pid: Option<u32>,
    pub started_at: Timestamp,
}

/// [`Heartbeat`] as the daemon writes it: the two lists that can hold every
/// agent (`agents`, `next_wakes`) are JSON made once and kept while they do
/// not change. At 10,000 agents, building and serializing them at every
/// session start and end was most of the daemon's CPU per wake. They are
/// written on one line each; the file reads back as a [`Heartbeat`].
#[derive(Debug, Serialize)]
pub struct HeartbeatOut<'a> {
    pub pid: u32,
    pub version: &'a str,
    pub started_at: Timestamp,
    pub updated_at: Timestamp,
    pub state_root: &'a str,
    pub config: &'a str,
    pub agents: &'a serde_json::value::RawValue,
    pub running: Vec<RunningEntry>,
    pub waiting: Vec<String>,
    pub next_wakes: &'a serde_json::value::RawValue,
    pub paused: Option<String>,
    pub stopping: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health: Option<&'a super::health::HealthState>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub failing: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub held: BTreeMap<String, HeldEntry>,
}

/// JSON text kept with the key it was made for: made again only when the
/// key changes.
#[derive(Debug, Default)]
pub struct CachedJson {
    key: Option<u64>,
    json: Option<Box<serde_json::value::RawValue>>,
}

impl CachedJson {
    pub fn get(&mut self, key: u64, make: impl FnOnce() -> String) -> &serde_json::value::RawValue {
        if self.key != Some(key) || self.json.is_none() {
            let text = make();
            self.json = Some(
                serde_json::value::RawValue::from_string(text).unwrap_or_else(|_| {
                    serde_json::value::RawValue::from_string("null".into()).expect("valid JSON")
                }),
            );
            self.key = Some(key);
        }
        self.json.as_deref().expect("set above")
    }
}

pub fn heartbeat_path(root: &StateRoot) -> PathBuf {
    root.daemon_dir().join("daemon.json")
}

/// The heartbeat is a status snapshot, rewritten at every change: replaced
/// atomically but not fsynced (after a crash an old one is harmless).
pub fn write_heartbeat(root: &StateRoot, hb: &HeartbeatOut) -> Result<()> {
    atomic::write_json_unsynced(&heartbeat_path(root), hb)
}

pub fn read_heartbeat(root: &StateRoot) -> Result<Option<Heartbeat>> {
    atomic::read_json(&heartbeat_path(root))
}

/// Where wake requests are dropped: `{agent}/inbox/.wake-{uuid}`. A dotfile,
/// so message scans ignore it; in the inbox, so the inbox watch sees it.
pub fn is_wake_request(name: &str) -> bool {
    name.starts_with(".wake-")
}

pub fn wake_request_path(inbox: &Path) -> PathBuf {
    inbox.join(format!(".wake-{}", uuid::Uuid::new_v4()))
}

/// `.daemon/economy.json`: the credentials' holds and the day's budget
/// notices, kept across restarts (`service/economy.rs` writes it).
pub fn economy_path(root: &StateRoot) -> PathBuf {
    root.daemon_dir().join("economy.json")
}

// ---- the verdict on the last config (re)load ---------------------------------

/// `.daemon/reload.json`: what the daemon made of the config file when it
/// started and at its last reload, for `agent-state reload` (systemd's
/// `ExecReload=`) to wait for and report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReloadVerdict {
    /// One more at every start and reload, across restarts.
    pub generation: u64,
    pub pid: u32,
    pub at: Timestamp,
    /// The file read.
    pub config: String,
    pub accepted: bool,
    /// Why it was refused (each problem), empty if accepted.
    #[serde(default)]
    pub reasons: Vec<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

pub fn reload_verdict_path(root: &StateRoot) -> PathBuf {
    root.daemon_dir().join("reload.json")
}

pub fn read_reload_verdict(root: &StateRoot) -> Option<ReloadVerdict> {
    atomic::read_json(&reload_verdict_path(root)).ok().flatten()
}

/// Record the verdict on the config just read (generation one past the last
/// recorded), and on acceptance the text accepted
/// ([`crate::config::accepted_copy`]), which the CLI falls back to while
/// the file on disk is invalid.
pub fn record_reload_verdict(
    root: &StateRoot,
    config: &Path,
    accepted_text: Option<&str>,
    reasons: Vec<String>,
) -> Result<ReloadVerdict> {
    if let Some(text) = accepted_text {
        atomic::write_file(
            &crate::config::accepted_copy(&root.path),
            text.as_bytes(),
            0o640,
        )?;
    }
    let generation = read_reload_verdict(root).map_or(0, |v| v.generation) + 1;
    let verdict = ReloadVerdict {
        generation,
        pid: std::process::id(),
        at: Timestamp::now(),
        config: config.display().to_string(),
        accepted: accepted_text.is_some(),
        reasons,
        extra: Map::new(),
    };
    atomic::write_json(&reload_verdict_path(root), &verdict)?;
    Ok(verdict)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heartbeat_as_written_reads_back_and_its_lists_are_made_once() {
        let mut agents = CachedJson::default();
        let mut made = 0;
        for _ in 0..3 {
            agents.get(7, || {
                made += 1;
                r#"["clay","rio"]"#.to_string()
            });
        }
        assert_eq!(made, 1, "made again although its key did not change");
        let wakes = r#"{"rio":"2026-11-24T12:00:00Z"}"#.to_string();
        let mut wakes_json = CachedJson::default();
        let t = Timestamp::parse("2026-11-24T10:00:00Z").unwrap();
        let out = HeartbeatOut {
            pid: 42,
            version: "0.1.0",
            started_at: t,
            updated_at: t,
            state_root: "/var/lib/x",
            config: "/etc/x.toml",
            agents: agents.get(7, String::new),
            running: vec![RunningEntry {
                agent: "rio".into(),
                session_id: "20261124-100000".into(),
                instance: "rio-001".into(),
                pid: Some(9),
                started_at: t,
            }],
            waiting: vec!["clay".into()],
            next_wakes: wakes_json.get(1, || wakes),
            paused: None,
            stopping: false,
            health: None,
            failing: BTreeMap::from([("clay".to_string(), "disabled: x".to_string())]),
            held: BTreeMap::new(),
        };
        let text = serde_json::to_string_pretty(&out).unwrap();
        let back: Heartbeat = serde_json::from_str(&text).unwrap();
        assert_eq!(back.agents, ["clay", "rio"]);
        assert_eq!(back.next_wakes["rio"].to_string(), "2026-11-24T12:00:00Z");
        assert_eq!(back.running[0].instance, "rio-001");
        assert_eq!(back.waiting, ["clay"]);
        assert_eq!(back.failing["clay"], "disabled: x");
        // Changed key: made again.
        assert_eq!(agents.get(8, || "[]".into()).get(), "[]");
    }

    #[test]
    fn the_runtime_lock_goes_to_the_runtime_dir_or_to_run_for_root() {
        let xdg = Some(PathBuf::from("/run/user/1000"));
        assert_eq!(
            runtime_dir(None, xdg.clone(), false),
            xdg.map(|x| x.join("agent-state"))
        );
        assert_eq!(
            runtime_dir(None, None, true),
            Some(PathBuf::from("/run/agent-state"))
        );
        assert_eq!(runtime_dir(None, Some("relative".into()), false), None);
        assert_eq!(runtime_dir(None, None, false), None);
        let unit = Some(PathBuf::from("/run/agent-state:/run/other"));
        assert_eq!(
            runtime_dir(unit, None, false),
            Some(PathBuf::from("/run/agent-state"))
        );
    }

    #[test]
    fn the_runtime_lock_name_is_fixed_per_root() {
        let a = runtime_lock_name(Path::new("/var/lib/agent-state"));
        assert_eq!(a, runtime_lock_name(Path::new("/var/lib/agent-state")));
        assert_ne!(a, runtime_lock_name(Path::new("/var/lib/agent-state2")));
        assert_eq!(a.len(), "root-.lock".len() + 16);
        // FNV-1a's published value for the empty input.
        assert_eq!(
            runtime_lock_name(Path::new("")),
            "root-cbf29ce484222325.lock"
        );
    }
}
