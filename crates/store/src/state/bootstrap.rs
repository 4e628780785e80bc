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
    let mut created = create_dirs(dir)?;
    let files = initial_files(kind, dir, now, false);
    // Complete (every start after the first): nothing to lock or write, so
    // a `.lock` somebody else holds does not keep the agent from being
    // served by what needs no lock.
    if created.is_empty() && !anything_missing(dir, &files) {
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

/// Create the agent's directories that are missing; their paths, relative.
fn create_dirs(dir: &AgentDir) -> Result<Vec<String>> {
    let mut created = Vec::new();
    for d in dir.directories() {
        if atomic::create_dir(&d, dir_mode(dir, &d))? {
            created.push(relative(dir, &d) + "/");
        }
    }
    Ok(created)
}

/// Whether a state file, the journal or `.lock` is missing.
fn anything_missing(dir: &AgentDir, files: &[(PathBuf, Vec<u8>)]) -> bool {
    let missing = |p: &Path| !crate::fsx::exists(p);
    files.iter().any(|(p, _)| missing(p)) || missing(&dir.journal()) || missing(&dir.lock_file())
}

/// The state files a new agent of `kind` starts with, and their bytes; with
/// `lifecycle`, report.json has the one a fresh agent has at rest
/// (`hatching`, or `sleeping` if an identity is there already), as the
/// daemon's start sets it next: the seed's shape otherwise.
fn initial_files(
    kind: AgentKind,
    dir: &AgentDir,
    now: Timestamp,
    lifecycle: bool,
) -> Vec<(PathBuf, Vec<u8>)> {
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
            lifecycle: lifecycle.then(|| super::report::Lifecycle::at_rest_given(dir, None)),
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
    files
}

/// [`agent_and_modes`] for many agents, in their order, with the new files
/// of many agents made durable together: the `bootstrap` command's (and a
/// first start's) way, ten syncs per agent fewer (see [`create_missing`]).
pub fn agents_and_modes<K: Into<AgentKind>>(
    list: impl IntoIterator<Item = (K, AgentDir)>,
    now: Timestamp,
) -> Vec<(AgentDir, Result<Done>)> {
    let list: Vec<(AgentKind, AgentDir)> = list.into_iter().map(|(k, d)| (k.into(), d)).collect();
    let batched = batch(&list, now, false);
    list.into_iter()
        .zip(batched)
        .map(|((kind, dir), outcome)| {
            let done = match outcome {
                Batched::Complete => Ok(Done::default()),
                Batched::Created(created) => {
                    repair_modes(&dir).map(|modes| Done { created, modes })
                }
                Batched::Failed(e) => Err(e),
                Batched::Left => agent_and_modes(kind, &dir, now),
            };
            (dir, done)
        })
        .collect()
}

/// Create what each agent of `list` is missing, many agents at once: every
/// new file written under its temp name, one `syncfs(2)`, every file
/// renamed into place (never over an existing one) and the journal's
/// `bootstrap` line appended, one more `syncfs`, and only then each agent's
/// lock released. A crash at any instant leaves each file absent (or a
/// stray temp file, which prune removes) or whole and durable, as
/// [`atomic::create_new`] does one file at a time with two syncs; at
/// 10,000 agents the one-at-a-time way was 100,000 syncs.
///
/// The daemon's first start: report.json is written with the lifecycle the
/// start would set next (`hatching`, or `sleeping` if an identity is there
/// already), so the start does not rewrite every new report.json (two
/// syncs each); the `bootstrap` command writes the seed's shape.
///
/// Whatever it cannot do in the batch (an agent whose lock somebody holds,
/// an error) it leaves for [`agent`], which the caller runs for each agent
/// after it (a complete agent costs [`agent`] a few `fstatat`s), and which
/// waits for the lock, reports the error and sets the inbox modes.
pub fn create_missing<K: Into<AgentKind>>(
    list: impl IntoIterator<Item = (K, AgentDir)>,
    now: Timestamp,
) {
    let list: Vec<(AgentKind, AgentDir)> = list.into_iter().map(|(k, d)| (k.into(), d)).collect();
    let _ = batch(&list, now, true);
}

/// At most this many agents in one batch: each holds its lock (one file
/// descriptor) from the writing of its temp files to the last sync.
const BATCH_MAX: usize = 2048;

/// How many agents one batch may hold locked: a quarter of the soft limit
/// on open files (systemd's default is 1024), at most [`BATCH_MAX`].
fn batch_size() -> usize {
    let mut limit = nix::libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given, nothing else.
    let soft = match unsafe { nix::libc::getrlimit(nix::libc::RLIMIT_NOFILE, &mut limit) } {
        0 => usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX),
        _ => 1024,
    };
    (soft / 4).clamp(16, BATCH_MAX)
}

/// What the batch did for one agent.
enum Batched {
    /// It was complete: nothing to do.
    Complete,
    /// It created these (directories and files; perhaps nothing but the
    /// inbox modes were left).
    Created(Vec<String>),
    /// Something was renamed into place, then a step failed.
    Failed(crate::error::Error),
    /// Left for [`agent`] (with perhaps some directories made).
    Left,
}

/// One agent of a batch after its first step.
enum Stage<'a> {
    Complete,
    /// Nothing to write: the directories made, if any.
    Nothing(Vec<String>),
    /// Its new files written under temp names, its lock held.
    Pending(Pending<'a>),
    Left,
}

/// An agent whose new files are under temp names, not yet renamed into
/// place; its lock held. Dropped, its temp files are removed.
struct Pending<'a> {
    dir: &'a AgentDir,
    /// Directories made (relative, with a trailing `/`).
    created: Vec<String>,
    /// Its new files, under temp names.
    temps: Vec<atomic::NewFile>,
    /// The device of the agent's directory: the file system to sync.
    dev: u64,
    _lock: super::lock::AgentLock,
}

/// The batch itself (see [`create_missing`]); one outcome per agent, in
/// the order of `list`.
fn batch(list: &[(AgentKind, AgentDir)], now: Timestamp, lifecycle: bool) -> Vec<Batched> {
    let mut out = Vec::with_capacity(list.len());
    for chunk in list.chunks(batch_size()) {
        let staged = par_map(chunk.iter().collect(), |(kind, dir)| {
            stage(*kind, dir, now, lifecycle)
        });
        // The temp files' contents (and the new directories) on disk
        // before any of them gets its real name.
        let first = sync_file_systems(&staged);
        let committed: Vec<(Stage, Option<Result<Vec<String>>>)> = par_map(staged, |mut st| {
            let done = match (&mut st, &first) {
                (Stage::Pending(p), Ok(())) => Some(commit(p, now)),
                _ => None,
            };
            (st, done)
        });
        // The renames and journal lines on disk before anyone is told
        // (the locks go with `committed`, after this).
        let second = sync_file_systems_of(committed.iter().map(|(st, _)| st));
        for (st, done) in committed {
            out.push(match (st, done) {
                (Stage::Complete, _) => Batched::Complete,
                (Stage::Nothing(created), _) => Batched::Created(created),
                (Stage::Left, _) | (Stage::Pending(_), None) => Batched::Left,
                (Stage::Pending(_), Some(Ok(created))) => match &second {
                    Ok(()) => Batched::Created(created),
                    Err((path, errno)) => Batched::Failed(crate::error::Error::io(
                        "syncing the file system of",
                        path,
                        std::io::Error::from(*errno),
                    )),
                },
                (Stage::Pending(_), Some(Err(e))) => Batched::Failed(e),
            });
        }
    }
    out
}

/// The first step for one agent: its directories made, its lock taken (if
/// nobody holds it), its missing files written under temp names.
fn stage(kind: AgentKind, dir: &AgentDir, now: Timestamp, lifecycle: bool) -> Stage<'_> {
    if complete(kind, dir) {
        return Stage::Complete;
    }
    let Ok(created) = create_dirs(dir) else {
        return Stage::Left;
    };
    let files = initial_files(kind, dir, now, lifecycle);
    if created.is_empty() && !anything_missing(dir, &files) {
        return Stage::Nothing(created);
    }
    let Ok(lock) = super::lock::try_lock(dir) else {
        return Stage::Left;
    };
    let Ok(Some(st)) = crate::fsx::metadata(&dir.path) else {
        return Stage::Left;
    };
    let mut pending = Pending {
        dir,
        created,
        temps: Vec::new(),
        dev: st.st_dev,
        _lock: lock,
    };
    for (path, bytes) in files {
        if !matches!(crate::fsx::metadata(&path), Ok(None)) {
            continue;
        }
        match atomic::unsynced_new(&path, &bytes, STATE_FILE_MODE) {
            Ok(file) => pending.temps.push(file),
            Err(_) => return Stage::Left,
        }
    }
    Stage::Pending(pending)
}

/// The second step for one agent, its temp files durable: rename each into
/// place (never over a file that is there) and append the journal's
/// `bootstrap` line, unsynced (the batch syncs next). Returns what it
/// created.
fn commit(p: &mut Pending<'_>, now: Timestamp) -> Result<Vec<String>> {
    let dir = p.dir;
    let mut created = std::mem::take(&mut p.created);
    // An error leaves the rest to be removed with the drain.
    for file in p.temps.drain(..) {
        let path = file.target().to_path_buf();
        if file.rename_new()? {
            created.push(relative(dir, &path));
        }
    }
    if !crate::fsx::exists(&dir.journal()) {
        created.push("journal.jsonl".into());
    }
    if !created.is_empty() {
        let entry = super::journal::Entry::new(
            now,
            Event::Bootstrap(Bootstrap {
                created: created.clone(),
            }),
        );
        super::journal::append_unsynced(&dir.journal(), &entry)?;
    }
    Ok(created)
}

/// `syncfs` each file system that holds a pending agent of `staged`.
fn sync_file_systems(
    staged: &[Stage<'_>],
) -> std::result::Result<(), (PathBuf, nix::errno::Errno)> {
    sync_file_systems_of(staged.iter())
}

fn sync_file_systems_of<'a, 'b: 'a>(
    staged: impl Iterator<Item = &'a Stage<'b>>,
) -> std::result::Result<(), (PathBuf, nix::errno::Errno)> {
    let mut seen: Vec<u64> = Vec::new();
    for st in staged {
        let Stage::Pending(p) = st else { continue };
        if seen.contains(&p.dev) {
            continue;
        }
        seen.push(p.dev);
        let path = p.dir.path.clone();
        atomic::sync_file_system(&path).map_err(|e| (path, errno_of(&e)))?;
    }
    Ok(())
}

fn errno_of(e: &crate::error::Error) -> nix::errno::Errno {
    e.errno()
        .map(nix::errno::Errno::from_raw)
        .unwrap_or(nix::errno::Errno::EIO)
}

/// `f` of each item on a few threads (the file system work of a batch is
/// system calls, most of them on different directories); results in order.
fn par_map<T: Send, R: Send>(items: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 4);
    if threads == 1 || items.len() < 2 * threads {
        return items.into_iter().map(f).collect();
    }
    let per = items.len().div_ceil(threads);
    let mut parts: Vec<Vec<T>> = Vec::new();
    let mut items = items.into_iter();
    loop {
        let part: Vec<T> = items.by_ref().take(per).collect();
        if part.is_empty() {
            break;
        }
        parts.push(part);
    }
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = parts
            .into_iter()
            .map(|part| s.spawn(move || part.into_iter().map(f).collect::<Vec<R>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
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

    fn names(list: &[&str]) -> Vec<crate::agent_name::AgentName> {
        list.iter()
            .map(|n| crate::agent_name::AgentName::parse(n).unwrap())
            .collect()
    }

    #[test]
    fn a_batch_creates_what_one_at_a_time_creates_and_never_overwrites() {
        let tmp = tempfile::tempdir().unwrap();
        let root = StateRoot::new(tmp.path());
        let now = Timestamp::now();
        let one = root.agent(&names(&["one"])[0]);
        agent(AgentKind::Agent, &one, now).unwrap();
        let agents = names(&["rio", "leo", "one", "marcus"]);
        // leo's report.json is there already (with something of its own).
        let leo = root.agent(&agents[1]);
        create_dirs(&leo).unwrap();
        std::fs::write(
            leo.report(),
            "{\"agent\": \"leo\", \"summary\": \"kept\"}\n",
        )
        .unwrap();
        let kinds = [
            AgentKind::Agent,
            AgentKind::Agent,
            AgentKind::Agent,
            AgentKind::Human,
        ];
        let list = kinds.iter().zip(&agents).map(|(k, n)| (*k, root.agent(n)));
        let done: Vec<(String, Vec<String>)> = agents_and_modes(list, now)
            .into_iter()
            .map(|(dir, done)| (dir.name.to_string(), done.unwrap().created))
            .collect();
        let every = [
            "./",
            "inbox/",
            "inbox/.tmp/",
            "inbox/.claimed/",
            "inbox/processed/",
            "inbox/rejected/",
            "sessions/",
            "report.json",
            "tasks.json",
            "metrics.json",
            "memory.md",
            "journal.jsonl",
        ];
        assert_eq!(
            done[0],
            ("rio".to_string(), every.map(String::from).to_vec())
        );
        assert_eq!(
            done[1].1,
            ["tasks.json", "metrics.json", "memory.md", "journal.jsonl"]
        );
        assert_eq!(done[2], ("one".to_string(), vec![]));
        assert_eq!(done[3].1.last().map(String::as_str), Some("journal.jsonl"));
        assert!(!root.agent(&agents[3]).report().exists());
        let kept = std::fs::read_to_string(leo.report()).unwrap();
        assert!(kept.contains("kept"), "{kept}");
        // Every file whole, no temp file left, the journal says what was made.
        let rio = root.agent(&agents[0]);
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(rio.report()).unwrap()).unwrap();
        assert_eq!(report["agent"], "rio");
        assert!(
            report.get("lifecycle").is_none(),
            "the seed's shape: {report}"
        );
        let left: Vec<_> = crate::fsx::list(&rio.path)
            .unwrap()
            .into_iter()
            .filter(|n| crate::fsx::is_temp_name(&n.to_string_lossy()))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        let journal = std::fs::read_to_string(rio.journal()).unwrap();
        assert_eq!(journal.lines().count(), 1);
        assert!(journal.contains("\"event\":\"bootstrap\""), "{journal}");
        assert!(complete(AgentKind::Agent, &rio));
    }

    #[test]
    fn the_daemons_batch_leaves_a_locked_agent_to_the_one_at_a_time_way() {
        let tmp = tempfile::tempdir().unwrap();
        let root = StateRoot::new(tmp.path());
        let now = Timestamp::now();
        let agents = names(&["rio", "leo"]);
        let leo = root.agent(&agents[1]);
        create_dirs(&leo).unwrap();
        let held = leo.lock().unwrap();
        create_missing(
            agents.iter().map(|n| (AgentKind::Agent, root.agent(n))),
            now,
        );
        let rio = root.agent(&agents[0]);
        assert!(complete(AgentKind::Agent, &rio));
        // The daemon's start sets the lifecycle next: written with it.
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(rio.report()).unwrap()).unwrap();
        assert_eq!(report["lifecycle"], "hatching");
        assert!(!leo.report().exists(), "leo's lock is held: left alone");
        drop(held);
        assert_eq!(agent(AgentKind::Agent, &leo, now).unwrap().len(), 5);
        assert!(complete(AgentKind::Agent, &leo));
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
