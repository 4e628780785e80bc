//! Creating an agent's directory and initial state. Idempotent: an existing
//! file is never overwritten; whatever is missing is created.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::sys::stat::{FileStat, Mode, SFlag};

use super::journal::{Bootstrap, Event};
use super::metrics::Metrics;
use super::report::Report;
use super::tasks::TaskFile;
use super::{AgentDir, STATE_FILE_MODE, StateRoot, atomic, memory};
use crate::clock::Timestamp;
use crate::error::Result;

/// Agent directories: readable by pipelines and anyone on the host.
pub const AGENT_DIR_MODE: u32 = 0o755;
/// `inbox/` and `inbox/.tmp/`: the inbox group may create entries (setgid:
/// they keep the group), and the sticky bit lets only an entry's owner (or
/// the directory's, the service user) rename, replace or remove it, so a
/// sender can neither take away another's mail nor put a link in the place
/// of `processed/`, `rejected/` or `.claimed/`.
pub const INBOX_DIR_MODE: u32 = 0o3770;
/// `processed/`, `rejected/`, `.claimed/` and its per-session directories:
/// written by the service user only; the group may list and read them.
pub const INBOX_PRIVATE_DIR_MODE: u32 = 0o2750;

/// The mode a directory of `dir` must have.
pub fn dir_mode(dir: &AgentDir, path: &Path) -> u32 {
    if path == dir.inbox() || path == dir.inbox_tmp() {
        INBOX_DIR_MODE
    } else if path.starts_with(dir.inbox()) {
        INBOX_PRIVATE_DIR_MODE
    } else {
        AGENT_DIR_MODE
    }
}

/// Create the root's own directories. Returns what was created.
pub fn root(root: &StateRoot) -> Result<Vec<String>> {
    let mut created = Vec::new();
    if atomic::create_dir(&root.path, AGENT_DIR_MODE)? {
        created.push(root.path.display().to_string());
    }
    if atomic::create_dir(&root.daemon_dir(), 0o750)? {
        created.push(".daemon/".into());
    }
    if atomic::create_dir(&root.shared_rules_dir(), AGENT_DIR_MODE)? {
        created.push(".shared/rules/".into());
    }
    Ok(created)
}

/// What an agent directory holds: an agent's has its state files (report,
/// tasks, metrics, memory); a human's mailbox only its inbox and journal.
/// (The config's `kind`; `config::AgentKind` is this type.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentKind {
    /// A research agent: has sessions, may be scheduled and woken.
    Agent,
    /// A human's mailbox: receives messages, is never woken.
    Human,
}

/// Create whatever `agent` is missing, and set the inbox directories' modes
/// (an install from before the sticky bit is mended here, each change
/// logged). Returns the paths created, relative to the agent's directory;
/// empty if it was complete.
pub fn agent(kind: impl Into<AgentKind>, dir: &AgentDir, now: Timestamp) -> Result<Vec<String>> {
    let done = agent_and_modes(kind, dir, now)?;
    for fix in &done.modes {
        tracing::info!(agent = %dir.name, "{fix}");
    }
    Ok(done.created)
}

/// What [`agent_and_modes`] did.
#[derive(Debug, Default)]
pub struct Done {
    /// Paths created, relative to the agent's directory.
    pub created: Vec<String>,
    /// Inbox directories whose mode was set.
    pub modes: Vec<ModeFix>,
}

/// [`agent`], saying which modes it set.
pub fn agent_and_modes(kind: impl Into<AgentKind>, dir: &AgentDir, now: Timestamp) -> Result<Done> {
    let kind = kind.into();
    if complete(kind, dir) {
        return Ok(Done::default());
    }
    let created = create(kind, dir, now)?;
    let modes = repair_modes(dir)?;
    Ok(Done { created, modes })
}

fn create(kind: AgentKind, dir: &AgentDir, now: Timestamp) -> Result<Vec<String>> {
    let mut created = Vec::new();
    for d in dir.directories() {
        if atomic::create_dir(&d, dir_mode(dir, &d))? {
            created.push(relative(dir, &d) + "/");
        }
    }
    let name = dir.name.as_str();
    let json = |value: serde_json::Value| {
        let mut b = serde_json::to_vec_pretty(&value).unwrap_or_default();
        b.push(b'\n');
        b
    };
    let mut files: Vec<(std::path::PathBuf, Vec<u8>)> = vec![];
    if kind == AgentKind::Agent {
        let report = Report {
            updated_at: Some(now),
            ..Report::new(name)
        };
        let tasks = TaskFile {
            updated_at: Some(now),
            ..TaskFile::new(name)
        };
        let metrics = Metrics {
            updated_at: Some(now),
            ..Metrics::new(name)
        };
        files.push((
            dir.report(),
            json(serde_json::to_value(report).unwrap_or_default()),
        ));
        files.push((
            dir.tasks(),
            json(serde_json::to_value(tasks).unwrap_or_default()),
        ));
        files.push((
            dir.metrics(),
            json(serde_json::to_value(metrics).unwrap_or_default()),
        ));
        files.push((dir.memory(), memory::template(&dir.name).into_bytes()));
    }
    // Complete (every start after the first): nothing to lock or write, so
    // a `.lock` somebody else holds does not keep the agent from being
    // served by what needs no lock.
    let missing = |p: &std::path::Path| !crate::fsx::exists(p);
    if created.is_empty()
        && !files.iter().any(|(p, _)| missing(p))
        && !missing(&dir.journal())
        && !missing(&dir.lock_file())
    {
        return Ok(created);
    }
    let lock = dir.lock()?;
    for (path, bytes) in files {
        if atomic::create_new(&path, &bytes, STATE_FILE_MODE)? {
            created.push(relative(dir, &path));
        }
    }
    let journal_missing = !crate::fsx::exists(&dir.journal());
    if journal_missing {
        created.push("journal.jsonl".into());
    }
    if !created.is_empty() {
        dir.journal_append(
            &lock,
            now,
            Event::Bootstrap(Bootstrap {
                created: created.clone(),
            }),
        )?;
    }
    Ok(created)
}

/// Whether `dir` has everything [`create`] makes, and every inbox directory
/// the mode (and, for root, the owner) [`repair_modes`] would give it, with
/// no session directory in `.claimed/` to look at: two directory handles
/// and one `fstatat` per entry, no lock, no write. This is every agent at
/// every start and reload after the first (at 10,000 agents the full
/// look took about 60 ms per thousand agents). `false` whenever in doubt:
/// the full look then decides.
fn complete(kind: AgentKind, dir: &AgentDir) -> bool {
    let (Ok(Some(top)), Ok(Some(inbox))) = (
        crate::fsx::open_dir(&dir.path),
        crate::fsx::open_dir(&dir.inbox()),
    ) else {
        return false;
    };
    let stat = |fd: &std::os::fd::OwnedFd, path: &Path| -> Option<FileStat> {
        let name = path.file_name()?;
        crate::fsx::stat_at(fd.as_fd(), name, path).ok().flatten()
    };
    let Ok(top_st) = nix::sys::stat::fstat(top.as_fd()) else {
        return false;
    };
    let root = nix::unistd::geteuid().is_root();
    let inbox_dir_ok = |path: &Path, st: Option<FileStat>| {
        st.is_some_and(|st| {
            crate::fsx::file_type(&st) == SFlag::S_IFDIR
                && permission_bits(&st) == dir_mode(dir, path)
                && (!root || st.st_uid == top_st.st_uid)
        })
    };
    let inbox_st = nix::sys::stat::fstat(inbox.as_fd()).ok();
    if !inbox_dir_ok(&dir.inbox(), inbox_st) {
        return false;
    }
    for path in [dir.inbox_tmp(), dir.processed(), dir.rejected()] {
        if !inbox_dir_ok(&path, stat(&inbox, &path)) {
            return false;
        }
    }
    // A directory's link count is 2 plus its subdirectories on the file
    // systems that count them (ext4, xfs, tmpfs; btrfs says 1): 2 means
    // no session directory in `.claimed/`.
    let claimed = stat(&inbox, &dir.claimed_root());
    if !inbox_dir_ok(&dir.claimed_root(), claimed) || claimed.is_some_and(|st| st.st_nlink != 2) {
        return false;
    }
    if stat(&top, &dir.sessions_dir()).is_none_or(|st| crate::fsx::file_type(&st) != SFlag::S_IFDIR)
    {
        return false;
    }
    // `.lock` is the service user's alone (a wider mode lets the inbox
    // group hold the agent back).
    if stat(&top, &dir.lock_file())
        .is_none_or(|st| permission_bits(&st) != crate::state::lock::LOCK_FILE_MODE)
    {
        return false;
    }
    let mut files = vec![dir.journal()];
    if kind == AgentKind::Agent {
        files.extend([dir.report(), dir.tasks(), dir.metrics(), dir.memory()]);
    }
    files.iter().all(|f| stat(&top, f).is_some())
}

/// An inbox directory whose mode is not [`dir_mode`]'s, or a `.lock` whose
/// mode is not [`crate::state::lock::LOCK_FILE_MODE`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeFix {
    /// Relative to the agent's directory, a directory with a trailing `/`.
    pub dir: String,
    pub was: u32,
    pub wanted: u32,
}

impl std::fmt::Display for ModeFix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} set to mode {:o} (was {:o})",
            self.dir, self.wanted, self.was
        )
    }
}

/// The inbox directories every agent has: `inbox/`, `.tmp/`, `.claimed/`,
/// `processed/`, `rejected/`.
fn inbox_dirs(dir: &AgentDir) -> Vec<PathBuf> {
    vec![
        dir.inbox(),
        dir.inbox_tmp(),
        dir.claimed_root(),
        dir.processed(),
        dir.rejected(),
    ]
}

/// [`inbox_dirs`] and the per-session directories in `.claimed/` (made by
/// the daemon, gone when their session ends).
fn inbox_dirs_and_sessions(dir: &AgentDir) -> Vec<PathBuf> {
    let mut out = inbox_dirs(dir);
    if let Ok(names) = crate::fsx::list(&dir.claimed_root()) {
        let mut sessions: Vec<PathBuf> = names
            .into_iter()
            .map(|n| dir.claimed_root().join(n))
            .filter(|p| crate::fsx::is_dir(p))
            .collect();
        sessions.sort();
        out.extend(sessions);
    }
    out
}

fn permission_bits(st: &FileStat) -> u32 {
    st.st_mode & 0o7777
}

/// The inbox directories whose mode is wrong (looked at, never changed;
/// links and other non-directories are `check`'s "unsafe:" findings, not
/// these). A session's directory in `.claimed/` is not looked at: it goes
/// with its session, and [`repair_modes`] sets it meanwhile.
pub fn wrong_modes(dir: &AgentDir) -> Vec<ModeFix> {
    let mut out: Vec<ModeFix> = inbox_dirs(dir)
        .into_iter()
        .filter_map(|path| {
            let st = crate::fsx::metadata(&path).ok().flatten()?;
            let wanted = dir_mode(dir, &path);
            (crate::fsx::file_type(&st) == SFlag::S_IFDIR && permission_bits(&st) != wanted).then(
                || ModeFix {
                    dir: relative(dir, &path) + "/",
                    was: permission_bits(&st),
                    wanted,
                },
            )
        })
        .collect();
    let wanted = crate::state::lock::LOCK_FILE_MODE;
    if let Ok(Some(st)) = crate::fsx::metadata(&dir.lock_file())
        && crate::fsx::file_type(&st) == SFlag::S_IFREG
        && permission_bits(&st) != wanted
    {
        out.push(ModeFix {
            dir: relative(dir, &dir.lock_file()),
            was: permission_bits(&st),
            wanted,
        });
    }
    out
}

/// Narrow `.lock` to [`crate::state::lock::LOCK_FILE_MODE`] if it exists
/// with another mode and this user may (its owner, or root).
fn repair_lock_mode(dir: &AgentDir) -> Result<Option<ModeFix>> {
    let path = dir.lock_file();
    let Some(st) = crate::fsx::metadata(&path)? else {
        return Ok(None);
    };
    let wanted = crate::state::lock::LOCK_FILE_MODE;
    if crate::fsx::file_type(&st) != SFlag::S_IFREG || permission_bits(&st) == wanted {
        return Ok(None);
    }
    let file = crate::state::lock::open_lock_file(&path, wanted)?;
    Ok(
        crate::state::lock::narrow_mode(&file, &path)?.then(|| ModeFix {
            dir: relative(dir, &path),
            was: permission_bits(&st),
            wanted,
        }),
    )
}

/// Set every inbox directory that this user owns (root: every one) to its
/// mode (and `.lock` to the service user's alone), through a handle opened without following links (`fchmod`, never
/// `chmod` on a path). Run as root, an inbox directory not owned by the
/// agent directory's owner is given to it too: a `check --repair` by root
/// must not leave the daemon a directory it cannot write. Returns what was
/// changed; a directory this user may not change is left as it is.
pub fn repair_modes(dir: &AgentDir) -> Result<Vec<ModeFix>> {
    let euid = nix::unistd::geteuid();
    let owner = crate::fsx::metadata(&dir.path)?.map(|st| st.st_uid);
    let mut fixed = Vec::new();
    for path in inbox_dirs_and_sessions(dir) {
        // A link or a file in its place is refused by open_dir: check's
        // "unsafe:" findings deal with it.
        let Ok(Some(fd)) = crate::fsx::open_dir(&path) else {
            continue;
        };
        let st = nix::sys::stat::fstat(fd.as_fd())
            .map_err(|e| crate::error::Error::io("inspecting", &path, e.into()))?;
        if euid.is_root()
            && let Some(uid) = owner
            && st.st_uid != uid
        {
            nix::unistd::fchown(fd.as_fd(), Some(uid.into()), None)
                .map_err(|e| crate::error::Error::io("setting the owner of", &path, e.into()))?;
        }
        let wanted = dir_mode(dir, &path);
        if permission_bits(&st) == wanted || !(euid.is_root() || st.st_uid == euid.as_raw()) {
            continue;
        }
        nix::sys::stat::fchmod(fd.as_fd(), Mode::from_bits_truncate(wanted))
            .map_err(|e| crate::error::Error::io("setting the mode of", &path, e.into()))?;
        fixed.push(ModeFix {
            dir: relative(dir, &path) + "/",
            was: permission_bits(&st),
            wanted,
        });
    }
    fixed.extend(repair_lock_mode(dir)?);
    Ok(fixed)
}

fn relative(dir: &AgentDir, path: &std::path::Path) -> String {
    let rel = path.strip_prefix(&dir.path).unwrap_or(path);
    if rel.as_os_str().is_empty() {
        ".".to_string()
    } else {
        rel.display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};

    fn mode_of(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    }

    #[test]
    fn only_a_complete_agent_skips_the_full_look() {
        let tmp = tempfile::tempdir().unwrap();
        let root = StateRoot::new(tmp.path());
        let dir = root.agent(&crate::agent_name::AgentName::parse("rio").unwrap());
        assert!(!complete(AgentKind::Agent, &dir));
        agent(AgentKind::Agent, &dir, Timestamp::now()).unwrap();
        assert!(complete(AgentKind::Agent, &dir));
        // A session's directory in .claimed/: its mode is the full look's.
        std::fs::create_dir(dir.claimed_root().join("s1")).unwrap();
        assert!(!complete(AgentKind::Agent, &dir));
        std::fs::remove_dir(dir.claimed_root().join("s1")).unwrap();
        // A wrong mode, a missing file: the full look mends them.
        std::fs::set_permissions(dir.rejected(), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(!complete(AgentKind::Agent, &dir));
        std::fs::remove_file(dir.tasks()).unwrap();
        let created = agent(AgentKind::Agent, &dir, Timestamp::now()).unwrap();
        assert_eq!(created, vec!["tasks.json".to_string()]);
        assert_eq!(mode_of(&dir.rejected()), INBOX_PRIVATE_DIR_MODE);
        assert!(complete(AgentKind::Agent, &dir));
    }

    #[test]
    fn an_old_install_gets_the_sticky_inbox_and_private_daemon_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let root = StateRoot::new(tmp.path());
        let dir = root.agent(&crate::agent_name::AgentName::parse("rio").unwrap());
        for d in dir.directories() {
            std::fs::create_dir(&d).unwrap();
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o2770)).unwrap();
        }
        std::fs::create_dir(dir.claimed("s1")).unwrap();
        std::fs::set_permissions(dir.claimed("s1"), std::fs::Permissions::from_mode(0o2770))
            .unwrap();
        std::fs::set_permissions(&dir.path, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(dir.sessions_dir(), std::fs::Permissions::from_mode(0o755))
            .unwrap();

        let wrong: Vec<String> = wrong_modes(&dir).iter().map(|f| f.to_string()).collect();
        assert_eq!(
            wrong,
            [
                "inbox/ set to mode 3770 (was 2770)",
                "inbox/.tmp/ set to mode 3770 (was 2770)",
                "inbox/.claimed/ set to mode 2750 (was 2770)",
                "inbox/processed/ set to mode 2750 (was 2770)",
                "inbox/rejected/ set to mode 2750 (was 2770)",
            ]
        );
        let fixed = repair_modes(&dir).unwrap();
        assert_eq!(fixed.len(), 6, "{fixed:?}");
        assert_eq!(mode_of(&dir.inbox()), 0o3770);
        assert_eq!(mode_of(&dir.inbox_tmp()), 0o3770);
        for d in [
            dir.processed(),
            dir.rejected(),
            dir.claimed_root(),
            dir.claimed("s1"),
        ] {
            assert_eq!(mode_of(&d), 0o2750, "{}", d.display());
        }
        assert_eq!(mode_of(&dir.sessions_dir()), 0o755);
        assert!(wrong_modes(&dir).is_empty());
        assert!(repair_modes(&dir).unwrap().is_empty());
    }

    #[test]
    fn a_link_in_place_of_an_inbox_directory_is_never_chmodded_through() {
        let tmp = tempfile::tempdir().unwrap();
        let root = StateRoot::new(tmp.path().join("state"));
        let dir = root.agent(&crate::agent_name::AgentName::parse("rio").unwrap());
        std::fs::create_dir_all(dir.inbox()).unwrap();
        std::fs::set_permissions(dir.inbox(), std::fs::Permissions::from_mode(0o3770)).unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o700)).unwrap();
        symlink(&outside, dir.processed()).unwrap();
        assert!(wrong_modes(&dir).is_empty());
        assert!(repair_modes(&dir).unwrap().is_empty());
        assert_eq!(mode_of(&outside), 0o700);
    }
}
