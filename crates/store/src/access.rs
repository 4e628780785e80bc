//! What a refused file access means in the permission model (README,
//! "Permission model"): which directory refused, whose it is, and what the
//! user can do about it. Only for messages: nothing here opens anything.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::unistd::{AccessFlags, Gid, Group, Uid, User};

use crate::error::Error;

/// Whether `e` is a refusal by permissions (EACCES, EPERM).
pub fn is_denied(e: &Error) -> bool {
    matches!(e, Error::Io { source, .. } if source.kind() == io::ErrorKind::PermissionDenied)
}

/// The path of an I/O error.
fn path_of(e: &Error) -> Option<&Path> {
    match e {
        Error::Io { path, .. } => Some(path),
        _ => None,
    }
}

/// A directory's mode, owner and group, for a message, and the access
/// (`rwx` bits, 4 read, 2 write, 1 enter) this user lacked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub path: PathBuf,
    pub mode: u32,
    pub user: String,
    pub group: String,
    pub needed: u32,
}

impl Owner {
    fn of(path: &Path, needed: u32) -> Option<Owner> {
        let meta = std::fs::symlink_metadata(path).ok()?;
        let user = User::from_uid(Uid::from_raw(meta.uid()))
            .ok()
            .flatten()
            .map(|u| u.name)
            .unwrap_or_else(|| meta.uid().to_string());
        let group = Group::from_gid(Gid::from_raw(meta.gid()))
            .ok()
            .flatten()
            .map(|g| g.name)
            .unwrap_or_else(|| meta.gid().to_string());
        Some(Owner {
            path: path.to_path_buf(),
            mode: meta.mode() & 0o7777,
            user,
            group,
            needed,
        })
    }
}

/// The directory that refused `path`: the first one on its way that this
/// user may not enter, else the path's own directory (for a file) or the
/// path itself (for a directory).
fn refusing(path: &Path) -> Option<Owner> {
    let mut ancestors: Vec<&Path> = path.ancestors().skip(1).collect();
    ancestors.reverse();
    for dir in ancestors {
        if dir.as_os_str().is_empty() {
            continue;
        }
        if nix::unistd::access(dir, AccessFlags::X_OK).is_err() {
            return Owner::of(dir, 1);
        }
    }
    let dir = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => path,
        _ => path.parent()?,
    };
    let needed = if nix::unistd::access(dir, AccessFlags::R_OK).is_err() {
        4
    } else {
        2
    };
    Owner::of(dir, needed)
}

/// What to do about a refusal by `owner`: who may, and how to become one.
pub fn advice(owner: &Owner) -> String {
    let me = User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| "USER".into());
    let group_may = (owner.mode >> 3) & owner.needed == owner.needed;
    let what = match owner.needed {
        1 => "enter",
        4 => "read",
        _ => "write in",
    };
    let mut text = format!(
        "{} is mode {:o}, owner {}, group {}",
        owner.path.display(),
        owner.mode,
        owner.user,
        owner.group
    );
    if group_may {
        text.push_str(&format!(
            ": members of the group {g} may {what} it; ask an administrator to add you \
             (`usermod -aG {g} {me}`), then log in again",
            g = owner.group
        ));
    } else {
        text.push_str(&format!(": only {} and root may {what} it", owner.user));
    }
    text
}

/// The hint for a refused access, if `e` is one: which directory refused
/// and what to do.
pub fn hint(e: &Error) -> Option<String> {
    if !is_denied(e) {
        return None;
    }
    refusing(path_of(e)?).map(|o| advice(&o))
}

/// Refuse, before anything is touched, a caller who may not write `path`
/// (a directory of the service user's: a member of the inbox group may
/// send and read mail, not change state): the refusal names `path`, why,
/// and what `advice` says to do given the path's owner (the service user's
/// name, "agent-state" if it cannot be looked up). A read-only file system
/// is refused the same way.
pub fn writer_only(path: &Path, advice: impl FnOnce(&str) -> String) -> Result<(), Error> {
    use nix::errno::Errno;
    let Err(e @ (Errno::EACCES | Errno::EPERM | Errno::EROFS)) =
        nix::unistd::access(path, AccessFlags::W_OK)
    else {
        return Ok(());
    };
    let owner = std::fs::metadata(path)
        .ok()
        .and_then(|m| User::from_uid(Uid::from_raw(m.uid())).ok().flatten())
        .map(|u| u.name)
        .unwrap_or_else(|| "agent-state".into());
    Err(Error::NotPermitted(format!(
        "cannot write {} ({e}): {}",
        path.display(),
        advice(&owner)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advice_names_the_group_to_join_or_the_owner() {
        let inbox = Owner {
            path: "/srv/state/rio/inbox".into(),
            mode: 0o3770,
            user: "agent-state".into(),
            group: "teleo".into(),
            needed: 2,
        };
        let text = advice(&inbox);
        assert!(
            text.starts_with(
                "/srv/state/rio/inbox is mode 3770, owner agent-state, group teleo: members of the group teleo may write in it"
            ),
            "{text}"
        );
        assert!(text.contains("usermod -aG teleo "), "{text}");
        let agent_dir = Owner {
            mode: 0o755,
            ..inbox.clone()
        };
        assert!(
            advice(&agent_dir).ends_with("only agent-state and root may write in it"),
            "{}",
            advice(&agent_dir)
        );
        let daemon_dir = Owner {
            mode: 0o750,
            needed: 4,
            ..inbox
        };
        assert!(
            advice(&daemon_dir).contains("members of the group teleo may read it"),
            "{}",
            advice(&daemon_dir)
        );
    }

    #[test]
    fn only_refusals_get_a_hint() {
        let e = Error::io("reading", "/nonexistent/x", io::ErrorKind::NotFound.into());
        assert_eq!(hint(&e), None);
    }
}
