//! `agent-state backup DEST.tar.zst` and `agent-state restore ARCHIVE`
//! (issue 14): a consistent snapshot of the state root, and putting one back
//! into an empty root.
//!
//! A backup takes each agent's files under that agent's lock (so no session
//! begins or ends, and no message is claimed or acknowledged, halfway
//! through its agent's part), each flow's under the flow's lock, and the
//! daemon's and shared files as they are (each is replaced atomically). It
//! stores directories and regular files with their modes and owners; it
//! leaves out lock files, temp files, links and special files (never
//! followed: they are somebody's input), and the agents' git worktrees
//! (`workspaces/`: their repositories are backed up as repositories). The
//! archive is written as `DEST.partial` (`dest`: created exclusively, never
//! through a link, mode `0600`) and renamed into place when whole.
//!
//! A restore (`restore`) goes into a root that does not exist or is empty;
//! `unpack` gives every file the store's mode and owners, never the
//! archive's, and `limits` bounds what it may unpack.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::state::StateRoot;

mod dest;
pub mod limits;
pub mod restore;
mod unpack;

pub use restore::{Options as RestoreOptions, restore};
pub use unpack::Owner;

/// What a backup or a restore did.
#[derive(Debug, Default)]
pub struct Summary {
    pub files: u64,
    pub dirs: u64,
    pub bytes: u64,
    /// Left out, with why (links, special files, worktrees).
    pub skipped: Vec<String>,
}

/// The most one file of the state root may be to go into a backup (a state
/// file is far smaller; a huge planted file is somebody's input).
pub const MAX_FILE: u64 = 4 << 30;

fn is_skipped_name(name: &str) -> bool {
    name == ".lock"
        || name.ends_with(".lock")
        || crate::fsx::is_temp_name(name)
        || name.ends_with(".partial")
}

struct Writer {
    tar: tar::Builder<zstd::stream::write::Encoder<'static, BufWriter<File>>>,
    summary: Summary,
    root: PathBuf,
}

/// An archive entry's header with the mode, owner and time of `meta`.
fn header(kind: tar::EntryType, meta: &std::fs::Metadata, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(meta.permissions().mode() & 0o7777);
    h.set_uid(meta.uid() as u64);
    h.set_gid(meta.gid() as u64);
    h.set_mtime(meta.mtime().max(0) as u64);
    h.set_size(size);
    h
}

impl Writer {
    fn add_dir(&mut self, rel: &Path, meta: &std::fs::Metadata) -> Result<()> {
        let mut h = header(tar::EntryType::Directory, meta, 0);
        self.tar
            .append_data(&mut h, rel, std::io::empty())
            .map_err(|e| Error::io("writing the archive entry", self.root.join(rel), e))?;
        self.summary.dirs += 1;
        Ok(())
    }

    fn add_file(&mut self, rel: &Path) -> Result<()> {
        let path = self.root.join(rel);
        // Never through a link, never blocking on a FIFO.
        let Some(file) = crate::fsx::open_read(&path)? else {
            return Ok(());
        };
        let meta = file
            .metadata()
            .map_err(|e| Error::io("inspecting", &path, e))?;
        if meta.len() > MAX_FILE {
            self.summary.skipped.push(format!(
                "{}: {} bytes, larger than any state file",
                rel.display(),
                meta.len()
            ));
            return Ok(());
        }
        let mut h = header(tar::EntryType::Regular, &meta, meta.len());
        self.tar
            .append_data(&mut h, rel, file.take(meta.len()))
            .map_err(|e| Error::io("archiving", &path, e))?;
        self.summary.files += 1;
        self.summary.bytes += meta.len();
        Ok(())
    }

    /// `rel` and everything below it (directories and regular files).
    fn add_tree(&mut self, rel: &Path) -> Result<()> {
        let path = self.root.join(rel);
        let Some(st) = crate::fsx::metadata(&path)? else {
            return Ok(());
        };
        match crate::fsx::file_type(&st) {
            nix::sys::stat::SFlag::S_IFDIR => {
                let meta = std::fs::symlink_metadata(&path)
                    .map_err(|e| Error::io("inspecting", &path, e))?;
                self.add_dir(rel, &meta)?;
                let names = sorted_names(&path)?;
                for name in names {
                    // The daemon's own lock (`.daemon/lock`) is no state:
                    // a restored root gets a new one from its daemon.
                    if is_skipped_name(&name) || (name == "lock" && rel == Path::new(".daemon")) {
                        continue;
                    }
                    let child = rel.join(&name);
                    if name == "workspaces"
                        && rel.components().count() == 1
                        && !rel.starts_with(".")
                    {
                        self.summary.skipped.push(format!(
                            "{}: the agent's git worktrees (back up their repositories)",
                            child.display()
                        ));
                        continue;
                    }
                    self.add_tree(&child)?;
                }
                Ok(())
            }
            nix::sys::stat::SFlag::S_IFREG => self.add_file(rel),
            _ => {
                self.summary.skipped.push(format!(
                    "{}: {}, not a file or directory",
                    rel.display(),
                    crate::fsx::describe_stat(&st)
                ));
                Ok(())
            }
        }
    }
}

/// Write a snapshot of the state root to `dest` (`.tar.zst`).
pub fn backup(root: &StateRoot, dest: &Path) -> Result<Summary> {
    if !crate::fsx::is_dir(&root.path) {
        return Err(Error::NotFound(format!(
            "the state root {} does not exist: nothing to back up",
            root.path.display()
        )));
    }
    // (Through any link on the way: the root's path is resolved too.)
    if crate::fsx::trusted(dest).starts_with(&root.path) {
        return Err(Error::Usage(format!(
            "{} is inside the state root: write the backup elsewhere",
            dest.display()
        )));
    }
    let partial = dest::create(dest)?;
    match write(root, &partial) {
        Ok(summary) => {
            partial.finish(dest)?;
            Ok(summary)
        }
        Err(e) => {
            // Never left half written.
            partial.discard();
            Err(e)
        }
    }
}

/// The archive, whole and synced, in `partial`.
fn write(root: &StateRoot, partial: &dest::Partial) -> Result<Summary> {
    let file = partial
        .file
        .try_clone()
        .map_err(|e| Error::io("writing", &partial.path, e))?;
    let encoder = zstd::stream::write::Encoder::new(BufWriter::new(file), 3)
        .map_err(|e| Error::io("compressing to", &partial.path, e))?;
    let mut w = Writer {
        tar: tar::Builder::new(encoder),
        summary: Summary::default(),
        root: root.path.clone(),
    };
    w.tar.mode(tar::HeaderMode::Complete);
    let top = std::fs::symlink_metadata(&root.path)
        .map_err(|e| Error::io("inspecting", &root.path, e))?;
    w.add_dir(Path::new("."), &top)?;
    let names = sorted_names(&root.path)?;
    for name in names {
        if is_skipped_name(&name) {
            continue;
        }
        let rel = PathBuf::from(&name);
        let path = root.path.join(&name);
        if name == ".flows" && crate::fsx::is_dir(&path) {
            let meta =
                std::fs::symlink_metadata(&path).map_err(|e| Error::io("inspecting", &path, e))?;
            w.add_dir(&rel, &meta)?;
            let flows = sorted_names(&path)?;
            for flow in flows {
                let lock_path = path.join(&flow).join(".lock");
                let guard = match crate::state::lock::open_lock_file(
                    &lock_path,
                    crate::state::lock::LOCK_FILE_MODE,
                ) {
                    Ok(f) => Some(crate::state::lock::flock_within(
                        f,
                        &lock_path,
                        root.lock_wait,
                    )?),
                    Err(_) => None,
                };
                w.add_tree(&rel.join(&flow))?;
                drop(guard);
            }
            continue;
        }
        let agent = crate::agent_name::AgentName::parse(&name).ok();
        match agent {
            Some(a) if !name.starts_with('.') && crate::fsx::is_dir(&path) => {
                let dir = root.agent(&a);
                let lock = dir.lock()?;
                w.add_tree(&rel)?;
                drop(lock);
            }
            _ => w.add_tree(&rel)?,
        }
    }
    let encoder = w
        .tar
        .into_inner()
        .map_err(|e| Error::io("finishing", &partial.path, e))?;
    let mut out = encoder
        .finish()
        .map_err(|e| Error::io("finishing", &partial.path, e))?;
    out.flush()
        .map_err(|e| Error::io("writing", &partial.path, e))?;
    out.get_ref()
        .sync_all()
        .map_err(|e| Error::io("syncing", &partial.path, e))?;
    Ok(w.summary)
}

/// The names in a directory that are UTF-8, sorted (an archive in a stable
/// order; a name that is not UTF-8 is no state file's).
fn sorted_names(dir: &Path) -> Result<Vec<String>> {
    let mut names: Vec<String> = crate::fsx::list(dir)?
        .into_iter()
        .filter_map(|n| n.into_string().ok())
        .collect();
    names.sort();
    Ok(names)
}
