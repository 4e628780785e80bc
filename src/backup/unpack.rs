//! Unpacking an archive's entries into a fresh staging directory (mode
//! `0700`, made by `mkdtemp`: nobody else can put anything in it, and no
//! link is ever created in it). Each entry must be a plain relative path to
//! a directory or a regular file; it is given the mode the store writes
//! there (`crate::state::modes`), never the archive's, and as root the
//! service user and inbox group as owners. What it may unpack in all is
//! bounded (`super::limits`), checked before each entry is written.

use std::ffi::OsStr;
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use nix::sys::stat::Mode;

use super::Summary;
use super::limits::{Limit, charge};
use crate::error::{Error, Result};
use crate::state::modes::store_mode;

/// The longest path an entry may have (a GNU long-name member is read into
/// memory: bounded).
const MAX_PATH: u64 = 4096;

/// Who the restored files belong to: as root, the service user and the
/// inbox group; not as root, this user and the inbox group if it is in it.
#[derive(Debug, Clone, Copy)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

pub struct Unpacker<'a> {
    pub archive: &'a Path,
    pub into: &'a Path,
    pub owner: Option<Owner>,
    pub limit: &'a Limit,
}

impl Unpacker<'_> {
    fn refuse(&self, entry: &Path, why: impl std::fmt::Display) -> Error {
        Error::Data(format!(
            "{}: the entry {} {why}: nothing restored",
            self.archive.display(),
            entry.display()
        ))
    }

    fn reading(&self, e: io::Error) -> Error {
        Error::io("reading", self.archive, e)
    }

    pub fn unpack<R: Read>(&self, tar: &mut tar::Archive<R>) -> Result<Summary> {
        let mut summary = Summary::default();
        let mut used = 0u64;
        let mut long_name: Option<Vec<u8>> = None;
        // Raw: a long name is this code's to read (bounded), not the tar
        // crate's (it would buffer any size).
        let entries = tar.entries().map_err(|e| self.reading(e))?.raw(true);
        for entry in entries {
            let mut entry = entry.map_err(|e| self.reading(e))?;
            let kind = entry.header().entry_type();
            let size = entry.header().size().map_err(|e| self.reading(e))?;
            used = used.saturating_add(charge(size));
            let bytes = long_name
                .take()
                .unwrap_or_else(|| entry.path_bytes().into_owned());
            let path = PathBuf::from(OsStr::from_bytes(&bytes));
            if used > self.limit.bytes {
                return Err(self.refuse(
                    &path,
                    format_args!(
                        "brings what it unpacks to {used} bytes on disk, more than {}, the limit set by {}",
                        self.limit.bytes, self.limit.why
                    ),
                ));
            }
            if kind.is_gnu_longname() {
                if size > MAX_PATH {
                    return Err(self.refuse(&path, format_args!("has a {size}-byte name")));
                }
                let mut name = Vec::new();
                entry.read_to_end(&mut name).map_err(|e| self.reading(e))?;
                while name.last() == Some(&0) {
                    name.pop();
                }
                long_name = Some(name);
                continue;
            }
            let plain = path
                .components()
                .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
            if !plain || bytes.is_empty() {
                return Err(self.refuse(
                    &path,
                    "is not a plain relative path: not a state-root backup",
                ));
            }
            // The archive's mode says only whether others may read it.
            let found = entry.header().mode().unwrap_or(0o640);
            if kind.is_dir() {
                self.dir(&path, found)?;
                summary.dirs += 1;
            } else if kind.is_file() {
                self.file(&path, &mut entry, size, found)?;
                summary.files += 1;
                summary.bytes += size;
            } else {
                return Err(self.refuse(
                    &path,
                    format_args!("is a {kind:?}, not a file or directory"),
                ));
            }
        }
        Ok(summary)
    }

    /// The staging directory's path of `rel`, its parents made first.
    fn place(&self, rel: &Path) -> Result<PathBuf> {
        if let Some(parent) = rel.parent()
            && parent
                .components()
                .any(|c| matches!(c, Component::Normal(_)))
        {
            self.dir(parent, 0o755)?;
        }
        Ok(self.into.join(rel))
    }

    fn dir(&self, rel: &Path, found: u32) -> Result<()> {
        if rel.components().all(|c| c == Component::CurDir) {
            return Ok(());
        }
        let path = self.place(rel)?;
        match std::fs::DirBuilder::new().mode(0o700).create(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                // A directory made for an earlier entry is fine; a file is not.
                return match crate::fsx::open_dir(&path) {
                    Ok(Some(_)) => Ok(()),
                    _ => Err(self.refuse(rel, "is a directory and also a file")),
                };
            }
            Err(e) => return Err(Error::io("restoring", &path, e)),
        }
        let fd = crate::fsx::dir(&path)?;
        self.own(fd.as_fd(), &path, store_mode(rel, true, found))
    }

    fn file(&self, rel: &Path, data: &mut impl Read, size: u64, found: u32) -> Result<()> {
        let path = self.place(rel)?;
        let mut file = match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(self.refuse(rel, "appears twice"));
            }
            Err(e) => return Err(Error::io("restoring", &path, e)),
        };
        let copied = io::copy(&mut data.take(size), &mut file).map_err(|e| self.reading(e))?;
        if copied != size {
            return Err(self.reading(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{} ends inside {}", self.archive.display(), rel.display()),
            )));
        }
        self.own(file.as_fd(), &path, store_mode(rel, false, found))
    }

    /// Give the service user and inbox group (as root), then the mode:
    /// through the handle, after the owner (a change of owner clears
    /// setgid).
    fn own(&self, fd: std::os::fd::BorrowedFd<'_>, path: &Path, mode: u32) -> Result<()> {
        if let Some(o) = self.owner {
            nix::unistd::fchown(fd, Some(o.uid.into()), Some(o.gid.into()))
                .map_err(|e| Error::io("setting the owner of", path, e.into()))?;
        }
        nix::sys::stat::fchmod(fd, Mode::from_bits_truncate(mode))
            .map_err(|e| Error::io("setting the mode of", path, e.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry: its type, name and data.
    type Member<'a> = (tar::EntryType, &'a str, Vec<u8>);

    fn archive(entries: &[Member<'_>]) -> Vec<u8> {
        let mut tar = tar::Builder::new(Vec::new());
        for (kind, name, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_uid(0);
            h.set_gid(0);
            h.set_path(name).unwrap();
            h.set_cksum();
            tar.append(&h, &data[..]).unwrap();
        }
        tar.into_inner().unwrap()
    }

    fn unpack(bytes: &[u8], limit: u64) -> (Result<Summary>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let limit = Limit {
            bytes: limit,
            why: "the test".into(),
        };
        let u = Unpacker {
            archive: Path::new("a.tar.zst"),
            into: dir.path(),
            owner: None,
            limit: &limit,
        };
        (u.unpack(&mut tar::Archive::new(bytes)), dir)
    }

    #[test]
    fn what_is_not_a_plain_file_or_directory_or_too_big_is_refused() {
        use tar::EntryType as T;
        let long = |n: usize| (T::GNULongName, "././@LongLink", vec![b'a'; n]);
        let cases: Vec<(Vec<Member<'_>>, u64, &str)> = vec![
            (
                vec![long(5000), (T::Regular, "x", vec![])],
                1 << 20,
                "5000-byte name",
            ),
            (
                vec![(T::Symlink, "x", vec![])],
                1 << 20,
                "not a file or directory",
            ),
            (
                vec![(T::Link, "x", vec![])],
                1 << 20,
                "not a file or directory",
            ),
            (
                vec![(T::XHeader, "x", vec![])],
                1 << 20,
                "not a file or directory",
            ),
            (
                vec![(T::Regular, "x", vec![]), (T::Regular, "x", vec![])],
                1 << 20,
                "appears twice",
            ),
            (
                vec![(T::Regular, "x", vec![]), (T::Directory, "x", vec![])],
                1 << 20,
                "a directory and also a file",
            ),
            (
                vec![(T::Regular, "x", vec![0; 10_000])],
                12_000,
                "the limit set by the test",
            ),
            // Many empty files fill a disk too: 4 KiB each.
            (
                vec![(T::Regular, "a", vec![]), (T::Regular, "b", vec![])],
                6000,
                "the limit set by the test",
            ),
        ];
        for (entries, limit, says) in cases {
            let (result, _dir) = unpack(&archive(&entries), limit);
            let e = result.unwrap_err().to_string();
            assert!(e.contains(says), "{says}: {e}");
        }
        let ok = vec![long(200), (T::Regular, "ignored", b"hi".to_vec())];
        let (result, dir) = unpack(&archive(&ok), 1 << 20);
        assert_eq!(result.unwrap().files, 1);
        assert_eq!(
            std::fs::read(dir.path().join("a".repeat(200))).unwrap(),
            b"hi"
        );
    }
}
