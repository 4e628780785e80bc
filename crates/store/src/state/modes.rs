//! The modes the store writes, by place: what `restore` gives each file and
//! directory it unpacks (whatever the archive says), and what `check` calls
//! a mode the store never writes. Pure: a path relative to the state root,
//! whether it is a directory, and the mode found.
//!
//! Directories are `0755` (`0750` where the store keeps them private, e.g.
//! `.daemon/`), an agent's `inbox/` and `inbox/.tmp/` `3770`, the rest of
//! the inbox `2750`; files `0644`, or `0640` where private and in every
//! inbox. Nothing the store writes is setuid, executable or world-writable.

use std::path::{Component, Path};

use super::AgentDir;
use super::bootstrap::{AGENT_DIR_MODE, INBOX_DIR_MODE, INBOX_PRIVATE_DIR_MODE};

/// A directory the store keeps private (`.daemon/`, a flow's answers).
pub const PRIVATE_DIR_MODE: u32 = 0o750;
/// A private file (a message, the daemon's files).
pub const PRIVATE_FILE_MODE: u32 = 0o640;

/// Where in the store `rel` is.
#[derive(Debug, PartialEq, Eq)]
enum Place {
    /// An agent's `inbox/` or `inbox/.tmp/`.
    Inbox,
    /// Below an agent's `inbox/`, but not those two.
    InInbox,
    Elsewhere,
}

fn place(rel: &Path) -> Place {
    let parts: Vec<&std::ffi::OsStr> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    let agent = parts
        .first()
        .is_some_and(|a| !a.as_encoded_bytes().starts_with(b"."));
    if !agent || parts.get(1).is_none_or(|p| *p != "inbox") {
        return Place::Elsewhere;
    }
    match &parts[2..] {
        [] => Place::Inbox,
        [tmp] if *tmp == ".tmp" => Place::Inbox,
        _ => Place::InInbox,
    }
}

/// The mode the store gives `rel` (relative to the state root), from the
/// mode `found` (only whether others may read it counts).
pub fn store_mode(rel: &Path, is_dir: bool, found: u32) -> u32 {
    let public = found & 0o004 != 0;
    match (place(rel), is_dir) {
        (Place::Inbox, true) => INBOX_DIR_MODE,
        (Place::InInbox, true) => INBOX_PRIVATE_DIR_MODE,
        (_, true) if rel.components().all(|c| c == Component::CurDir) => AGENT_DIR_MODE,
        (Place::Elsewhere, true) if public => AGENT_DIR_MODE,
        (Place::Elsewhere, true) => PRIVATE_DIR_MODE,
        (Place::Elsewhere, false) if public => super::STATE_FILE_MODE,
        (_, false) => PRIVATE_FILE_MODE,
    }
}

/// Whether `mode` is one the store never writes at `rel`: setuid, setgid or
/// sticky where the store sets none, executable or world-writable files,
/// world-writable directories. (A group-writable file is not: a sender's
/// message made with `cat >` under umask 002 is; `.lock` files are `0660`.)
pub fn foreign(rel: &Path, is_dir: bool, mode: u32) -> bool {
    let mode = mode & 0o7777;
    if is_dir {
        let special = if place(rel) == Place::Elsewhere {
            0o7000
        } else {
            0o4000
        };
        mode & (special | 0o002) != 0
    } else {
        mode & !0o664 != 0
    }
}

// ---- an agent's directory -------------------------------------------------

/// A file or directory of an agent's whose mode the store never writes.
#[derive(Debug, PartialEq, Eq)]
pub struct Foreign {
    /// Relative to the agent's directory (a directory ends in `/`).
    pub rel: String,
    pub mode: u32,
    /// What `--repair` sets.
    pub wanted: u32,
}

/// How deep below `inbox/` and `sessions/` the walk goes (the deepest the
/// store writes is `inbox/.claimed/SESSION/MESSAGE`).
const MAX_DEPTH: usize = 3;

/// The store's files and directories in `dir` whose mode is [`foreign`]:
/// the directory, its state files, and everything in `inbox/` and
/// `sessions/` (what sessions leave elsewhere in it is theirs). Never
/// through a link; links and special files are skipped (`check` calls them
/// unsafe). The inbox directories `bootstrap::wrong_modes` looks at are
/// left to it.
pub fn foreign_in(dir: &AgentDir) -> Vec<Foreign> {
    let mut out = Vec::new();
    walk(dir, &dir.path, MAX_DEPTH, &mut out);
    for f in dir.state_files() {
        walk(dir, &f, 0, &mut out);
    }
    walk(dir, &dir.inbox(), MAX_DEPTH, &mut out);
    walk(dir, &dir.sessions_dir(), 1, &mut out);
    out
}

fn walk(dir: &AgentDir, path: &Path, depth: usize, out: &mut Vec<Foreign>) {
    let Ok(Some(st)) = crate::fsx::metadata(path) else {
        return;
    };
    let is_dir = match crate::fsx::file_type(&st) {
        nix::sys::stat::SFlag::S_IFDIR => true,
        nix::sys::stat::SFlag::S_IFREG => false,
        _ => return,
    };
    let inside = path.strip_prefix(&dir.path).unwrap_or(path);
    let rel = Path::new(dir.name.as_str()).join(inside);
    let mode = st.st_mode & 0o7777;
    let left_to_bootstrap = [
        dir.inbox(),
        dir.inbox_tmp(),
        dir.claimed_root(),
        dir.processed(),
        dir.rejected(),
    ]
    .iter()
    .any(|p| p == path);
    if !left_to_bootstrap && foreign(&rel, is_dir, mode) {
        let mut shown = inside.display().to_string();
        if shown.is_empty() {
            shown = ".".into();
        } else if is_dir {
            shown.push('/');
        }
        out.push(Foreign {
            rel: shown,
            mode,
            wanted: store_mode(&rel, is_dir, mode),
        });
    }
    // The agent's directory itself is looked at, not walked (see above).
    if !is_dir || depth == 0 || path == dir.path {
        return;
    }
    let Ok(mut names) = crate::fsx::list(path) else {
        return;
    };
    names.sort();
    for name in names {
        walk(dir, &path.join(name), depth - 1, out);
    }
}

/// Set `f`'s path to the mode the store writes, through a handle opened
/// without following links (a link or FIFO put there since is refused).
/// Only this user's files, or any as root.
pub fn repair(dir: &AgentDir, f: &Foreign) -> crate::error::Result<()> {
    let path = match f.rel.trim_end_matches('/') {
        "." => dir.path.clone(),
        rel => dir.path.join(rel),
    };
    let fd: std::os::fd::OwnedFd = if f.rel.ends_with('/') || f.rel == "." {
        crate::fsx::dir(&path)?
    } else {
        match crate::fsx::open_read(&path)? {
            Some(file) => file.into(),
            None => return Ok(()),
        }
    };
    nix::sys::stat::fchmod(&fd, nix::sys::stat::Mode::from_bits_truncate(f.wanted))
        .map_err(|e| crate::error::Error::io("setting the mode of", &path, e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::stat::Mode;

    #[test]
    fn each_place_gets_the_mode_the_store_writes() {
        let table: &[(&str, bool, u32, u32)] = &[
            (".", true, 0o777, 0o755),
            ("", true, 0o700, 0o755),
            ("rio", true, 0o777, 0o755),
            ("rio", true, 0o6777, 0o755),
            ("rio/sessions", true, 0o750, 0o750),
            (".daemon", true, 0o750, 0o750),
            (".daemon", true, 0o777, 0o755),
            ("rio/inbox", true, 0o777, 0o3770),
            ("rio/inbox", true, 0o700, 0o3770),
            ("rio/inbox/.tmp", true, 0o755, 0o3770),
            ("rio/inbox/processed", true, 0o3777, 0o2750),
            ("rio/inbox/.claimed/s1", true, 0o777, 0o2750),
            (".flows/inbox", true, 0o777, 0o755),
            ("rio/report.json", false, 0o6755, 0o644),
            ("rio/report.json", false, 0o666, 0o644),
            ("rio/report.json", false, 0o600, 0o640),
            (".daemon/daemon.json", false, 0o640, 0o640),
            ("rio/inbox/m.json", false, 0o666, 0o640),
            ("rio/inbox/processed/m.json", false, 0o4777, 0o640),
        ];
        for &(rel, dir, found, want) in table {
            assert_eq!(
                store_mode(Path::new(rel), dir, found),
                want,
                "{rel} {dir} {found:o}"
            );
        }
    }

    #[test]
    fn foreign_modes_are_the_ones_the_store_never_writes() {
        let table: &[(&str, bool, u32, bool)] = &[
            ("rio/report.json", false, 0o644, false),
            ("rio/inbox/m.json", false, 0o640, false),
            ("rio/inbox/m.json", false, 0o664, false),
            ("rio/.lock", false, 0o660, false),
            ("rio/report.json", false, 0o666, true),
            ("rio/report.json", false, 0o755, true),
            ("rio/report.json", false, 0o2644, true),
            ("rio/report.json", false, 0o4644, true),
            ("rio", true, 0o755, false),
            ("rio/sessions", true, 0o750, false),
            ("rio/inbox", true, 0o3770, false),
            ("rio/inbox/processed", true, 0o2750, false),
            ("rio", true, 0o777, true),
            ("rio", true, 0o2755, true),
            ("rio/inbox", true, 0o3777, true),
            ("rio/inbox", true, 0o6770, true),
        ];
        for &(rel, dir, mode, want) in table {
            assert_eq!(
                foreign(Path::new(rel), dir, mode),
                want,
                "{rel} {dir} {mode:o}"
            );
        }
    }

    #[test]
    fn the_walk_follows_no_link_and_repairs_through_no_link() {
        use std::os::unix::fs::{PermissionsExt, symlink};
        let tmp = tempfile::tempdir().unwrap();
        let root = super::super::StateRoot::new(tmp.path());
        let dir = root.agent(&crate::agent_name::AgentName::parse("rio").unwrap());
        super::super::bootstrap::agent(
            super::super::bootstrap::AgentKind::Agent,
            &dir,
            crate::clock::Timestamp::now(),
        )
        .unwrap();
        let chmod = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        // A world-writable file outside, linked from the inbox and in
        // place of a state file; a FIFO; what a session left beside.
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, "x").unwrap();
        chmod(&outside, 0o777);
        symlink(&outside, dir.inbox().join("m.json")).unwrap();
        std::fs::remove_file(dir.report()).unwrap();
        symlink(&outside, dir.report()).unwrap();
        nix::unistd::mkfifo(&dir.inbox().join("p"), Mode::from_bits_truncate(0o777)).unwrap();
        std::fs::write(dir.path.join("tool.sh"), "").unwrap();
        chmod(&dir.path.join("tool.sh"), 0o755);
        chmod(&dir.journal(), 0o4755);
        let found = foreign_in(&dir);
        assert_eq!(
            found,
            vec![Foreign {
                rel: "journal.jsonl".into(),
                mode: 0o4755,
                wanted: 0o644
            }]
        );
        repair(&dir, &found[0]).unwrap();
        assert!(foreign_in(&dir).is_empty());
        let mode = std::fs::metadata(&outside).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o777, "the link's target untouched");
    }
}
