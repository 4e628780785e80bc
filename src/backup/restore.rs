//! `agent-state restore ARCHIVE [--into ROOT]`: a backup put back into a
//! root that does not exist or is empty, and nothing else.
//!
//! The root is looked at first, before a byte is unpacked: a link (whoever
//! planted it: never followed), a file, or a directory with anything in it
//! is refused. Staging is a new directory made by `mkdtemp` (mode `0700`, a
//! name nobody can guess or plant in advance): beside the root when there
//! is none (renamed into place at the end, `RENAME_NOREPLACE`), inside it
//! when it exists and is empty (its entries moved up at the end: the
//! service user may restore without writing in the root's parent). A
//! failure removes the staging directory and leaves the root as it was (a
//! crash while the entries are moved up, a handful of renames, leaves a
//! part: `restore` then refuses that root until it is emptied).
//! As root, everything restored, the root included, is given to the
//! service user and the inbox group.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::sys::stat::Mode;

use super::Summary;
use super::limits::{Bounded, Limit, free_bytes, limit};
use super::unpack::{Owner, Unpacker};
use crate::error::{Error, Result};
use crate::state::bootstrap::AGENT_DIR_MODE;

/// What bounds a restore, and whose its files become.
pub struct Options {
    /// `[health] restore_limit`.
    pub cap: u64,
    /// `[health] disk_pause`: free space left to the daemon.
    pub margin: u64,
    /// The service user restored files go to (as root; see [`owner`]).
    pub user: Option<String>,
    /// The inbox group (the config's `group`).
    pub group: Option<String>,
}

/// The start of the name of a staging directory made inside the root.
const STAGING_INSIDE: &str = ".restoring-";

/// Where the root stands before anything is unpacked.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    Missing,
    Empty,
}

/// `root` with the links above it resolved (the operator's: `/opt` may
/// be a link), but not its last component (looked at, never followed), and
/// no trailing slash (which would make `lstat` follow a link).
fn resolved_parent(root: &Path) -> Result<PathBuf> {
    let name = match root.components().next_back() {
        Some(std::path::Component::Normal(n)) => n,
        _ => {
            return Err(Error::Usage(format!(
                "{} names no directory to restore into",
                root.display()
            )));
        }
    };
    let parent = root.components().collect::<PathBuf>();
    let parent = parent.parent().filter(|p| !p.as_os_str().is_empty());
    Ok(crate::fsx::trusted(parent.unwrap_or(Path::new("."))).join(name))
}

fn look_at(root: &Path) -> Result<Target> {
    let meta = match std::fs::symlink_metadata(root) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Target::Missing),
        Err(e) => return Err(Error::io("inspecting", root, e)),
    };
    if meta.file_type().is_symlink() {
        let to = std::fs::read_link(root)
            .map(|t| t.display().to_string())
            .unwrap_or_else(|_| "?".into());
        return Err(Error::Usage(format!(
            "{} is a symbolic link (to {to}): a restore never follows one; if that directory is the state root, set state_root to it (or give it with --into), else remove the link",
            root.display()
        )));
    }
    if !meta.is_dir() {
        return Err(Error::Usage(format!(
            "{} is not a directory: a backup is restored into an empty state root or where none is (move it aside first)",
            root.display()
        )));
    }
    let names = crate::fsx::list(root)?;
    if !names.is_empty() {
        let staged = names
            .iter()
            .all(|n| n.as_encoded_bytes().starts_with(STAGING_INSIDE.as_bytes()));
        let why = if staged {
            "holds only what an interrupted restore staged: remove it (rm -r) and restore again"
        } else {
            "is not empty: a backup is restored into an empty state root (move this one aside first)"
        };
        return Err(Error::Usage(format!("{} {why}", root.display())));
    }
    Ok(Target::Empty)
}

/// Unpack `archive` into `root`, which must not exist or be empty.
pub fn restore(archive: &Path, root: &Path, opts: &Options) -> Result<Summary> {
    let root = &resolved_parent(root)?;
    let target = look_at(root)?;
    let owner = owner(root, opts.user.as_deref(), opts.group.as_deref())?;
    let file = File::open(archive).map_err(|e| Error::io("opening", archive, e))?;
    let (stage_in, prefix) = match target {
        Target::Missing => {
            let name = root.file_name().expect("resolved_parent");
            let parent = root.parent().expect("resolved_parent");
            (
                parent.to_path_buf(),
                format!(".{}.restoring-", name.to_string_lossy()),
            )
        }
        Target::Empty => (root.to_path_buf(), STAGING_INSIDE.to_string()),
    };
    let free = free_bytes(&stage_in)?;
    let limit = limit(opts.cap, free, opts.margin);
    let staging = nix::unistd::mkdtemp(&stage_in.join(format!("{prefix}XXXXXX")))
        .map_err(|e| staging_error(&stage_in, root, e))?;
    let result = unpack(archive, file, &staging, owner, &limit)
        .and_then(|s| move_into_place(&staging, root, &target, owner).map(|()| s));
    if result.is_err() {
        // Ours alone (0700, made above, no link ever made in it).
        let _ = std::fs::remove_dir_all(&staging);
    }
    result
}

fn staging_error(dir: &Path, root: &Path, e: nix::errno::Errno) -> Error {
    let e = io::Error::from(e);
    if e.kind() == io::ErrorKind::PermissionDenied {
        return Error::io(
            "creating a staging directory in",
            dir,
            io::Error::new(
                e.kind(),
                format!(
                    "{e}; create {} empty for this user first (as the package's tmpfiles.d does), or restore as root",
                    root.display()
                ),
            ),
        );
    }
    Error::io("creating a staging directory in", dir, e)
}

fn unpack(
    archive: &Path,
    file: File,
    staging: &Path,
    owner: Option<Owner>,
    limit: &Limit,
) -> Result<Summary> {
    let decoder =
        zstd::stream::read::Decoder::new(file).map_err(|e| Error::io("reading", archive, e))?;
    // The whole stream, headers and all, is bounded too (see Bounded).
    let bounded = Bounded {
        inner: decoder,
        left: limit.bytes.saturating_add(1 << 20),
    };
    let mut tar = tar::Archive::new(bounded);
    let summary = Unpacker {
        archive,
        into: staging,
        owner,
        limit,
    }
    .unpack(&mut tar)?;
    // Everything on disk before it is moved into place.
    let fd = crate::fsx::dir(staging)?;
    nix::unistd::syncfs(fd.as_fd()).map_err(|e| Error::io("syncing", staging, e.into()))?;
    Ok(summary)
}

/// The staged tree becomes the root: renamed onto a missing root, or its
/// entries moved into the empty one. The root gets the store's mode and,
/// as root, the service user and inbox group.
fn move_into_place(
    staging: &Path,
    root: &Path,
    target: &Target,
    owner: Option<Owner>,
) -> Result<()> {
    match target {
        Target::Missing => {
            let fd = crate::fsx::dir(staging)?;
            give_root(&fd, staging, owner)?;
            crate::fsx::rename(staging, root, false)?;
        }
        Target::Empty => {
            let from = crate::fsx::dir(staging)?;
            let to = crate::fsx::dir(root)?;
            let names: Vec<OsString> = crate::fsx::list(staging)?;
            for (i, name) in names.iter().enumerate() {
                if let Err(e) = crate::fsx::rename_at(from.as_fd(), name, to.as_fd(), name, false) {
                    // Back into staging, which the caller removes: the root
                    // is left empty, as it was.
                    for moved in &names[..i] {
                        let _ =
                            crate::fsx::rename_at(to.as_fd(), moved, from.as_fd(), moved, false);
                    }
                    return Err(Error::io("moving into place", staging.join(name), e));
                }
            }
            crate::fsx::remove_dir(staging)?;
            give_root(&to, root, owner)?;
            crate::fsx::sync_fd(&to, root)?;
        }
    }
    crate::fsx::sync_dir(root.parent().expect("resolved_parent"))
}

fn give_root(fd: &OwnedFd, path: &Path, owner: Option<Owner>) -> Result<()> {
    let st =
        nix::sys::stat::fstat(fd.as_fd()).map_err(|e| Error::io("inspecting", path, e.into()))?;
    let me = nix::unistd::geteuid();
    // Not this user's and not root: left as it is (whoever could write in
    // it may not change it).
    if !me.is_root() && st.st_uid != me.as_raw() {
        return Ok(());
    }
    if let Some(o) = owner {
        nix::unistd::fchown(fd.as_fd(), Some(o.uid.into()), Some(o.gid.into()))
            .map_err(|e| Error::io("setting the owner of", path, e.into()))?;
    }
    nix::sys::stat::fchmod(fd.as_fd(), Mode::from_bits_truncate(AGENT_DIR_MODE))
        .map_err(|e| Error::io("setting the mode of", path, e.into()))
}

/// As root: the service user (`user`, else the owner of an existing root
/// that is not root's, else `agent-state`) and the inbox group (`group`,
/// else the user's own).
fn owner(root: &Path, user: Option<&str>, group: Option<&str>) -> Result<Option<Owner>> {
    let me = nix::unistd::geteuid();
    if !me.is_root() {
        return match user.map(lookup_user).transpose()? {
            Some(u) if u.uid != me => Err(Error::Usage(format!(
                "only root can give the restored state to {:?}: run as root, or as that user",
                u.name
            ))),
            _ => Ok(own_group(group).map(|gid| Owner {
                uid: me.as_raw(),
                gid,
            })),
        };
    }
    let existing = std::fs::symlink_metadata(root)
        .ok()
        .filter(|m| m.is_dir() && m.uid() != 0);
    let user = match (user, existing) {
        (Some(name), _) => lookup_user(name)?,
        (None, Some(m)) => nix::unistd::User::from_uid(m.uid().into())
            .ok()
            .flatten()
            .ok_or_else(|| {
                Error::Usage(format!(
                    "{} belongs to uid {}, which is no user: name the service user with --owner",
                    root.display(),
                    m.uid()
                ))
            })?,
        (None, None) => lookup_user("agent-state")?,
    };
    let gid = match group {
        Some(g) => nix::unistd::Group::from_name(g)
            .ok()
            .flatten()
            .ok_or_else(|| {
                Error::Usage(format!(
                    "the config's group {g:?} does not exist: create it (the package does) or fix `group`"
                ))
            })?
            .gid,
        None => user.gid,
    };
    Ok(Some(Owner {
        uid: user.uid.as_raw(),
        gid: gid.as_raw(),
    }))
}

/// Not as root: the inbox group, if this user is in it (a user may give
/// its files to any group of its own), so the state is the group's whatever
/// this user's primary group.
fn own_group(group: Option<&str>) -> Option<u32> {
    let gid = nix::unistd::Group::from_name(group?).ok().flatten()?.gid;
    let mine =
        nix::unistd::getegid() == gid || nix::unistd::getgroups().is_ok_and(|gs| gs.contains(&gid));
    mine.then_some(gid.as_raw())
}

fn lookup_user(name: &str) -> Result<nix::unistd::User> {
    nix::unistd::User::from_name(name)
        .ok()
        .flatten()
        .ok_or_else(|| {
            Error::Usage(format!(
                "there is no user {name:?} to own the restored state: name the service user with --owner USER"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_is_looked_at_before_anything_is_unpacked() {
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n);
        assert_eq!(look_at(&p("none")).unwrap(), Target::Missing);
        std::fs::create_dir(p("empty")).unwrap();
        assert_eq!(look_at(&p("empty")).unwrap(), Target::Empty);
        std::fs::create_dir(p("full")).unwrap();
        std::fs::write(p("full/x"), "").unwrap();
        std::fs::write(p("file"), "").unwrap();
        std::fs::create_dir_all(p("staged/.restoring-abc123/rio")).unwrap();
        std::os::unix::fs::symlink(p("empty"), p("link")).unwrap();
        for (name, says) in [
            ("link/", "is a symbolic link"),
            ("full", "is not empty"),
            ("staged", "an interrupted restore"),
            ("file", "is not a directory"),
            ("link", "is a symbolic link"),
        ] {
            let root: PathBuf = p(name).components().collect();
            let e = look_at(&root).unwrap_err().to_string();
            assert!(e.contains(says), "{name}: {e}");
        }
    }

    #[test]
    fn a_move_into_place_that_fails_halfway_puts_back_what_it_moved() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let staging = root.join(".restoring-abc");
        for name in ["a", "b", "c", "d"] {
            std::fs::create_dir_all(staging.join(name)).unwrap();
        }
        // Somebody's, made in the root meanwhile.
        std::fs::write(root.join("c"), "theirs").unwrap();
        let e = move_into_place(&staging, &root, &Target::Empty, None).unwrap_err();
        assert!(e.to_string().contains("moving into place"), "{e}");
        let mut left = crate::fsx::list(&root).unwrap();
        left.sort();
        assert_eq!(left, [".restoring-abc", "c"]);
        assert_eq!(crate::fsx::list(&staging).unwrap().len(), 4);
    }
}
