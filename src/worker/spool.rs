//! The worker's local copy of a session's output until the stream has it:
//! one file per session, `<work dir>/spool/<order>.spool`.
//!
//! Every chunk read from the session's pipes is appended here before it is
//! published ([`super::relay`]), so the session never waits for NATS: a
//! cut link, a lost quorum, a slow leader only make the file grow, and the
//! publisher goes on from it, in order, when NATS stores again. When the
//! publisher has stored everything written, the file is cut back to its
//! header (a long session's output is not kept twice). The session's end is
//! written here too once its processes are gone, and the file is removed
//! once the end is stored in the stream.
//!
//! The format: a header line (JSON, [`Header`], at most 4 KiB), then
//! records: a chunk `1, number (u64 LE), pipe (0 stdout, 1 stderr), length
//! (u32 LE), bytes`, or the end `2, length (u32 LE), SessionEnd JSON`.
//! Written without fsync (the end with one): a worker that dies keeps it
//! in the page cache; a host that crashes may lose its tail, with the
//! session.
//!
//! Nothing in the directory is trusted: it is made 0700 and must be a
//! directory, not a link; files are opened with `O_NOFOLLOW` and
//! `O_NONBLOCK` (no FIFO blocked on) and must be plain files with one name;
//! a record is at most [`MAX_RECORD`] bytes and a file that does not parse
//! is read up to its first bad record ([`decode`], pure).

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use agent_state_cluster::SessionEnd;
use serde::{Deserialize, Serialize};

/// The largest record read back (a chunk is at most 16 KiB; an end a few
/// hundred bytes): anything larger is a corrupt file.
pub const MAX_RECORD: u32 = 1 << 20;
/// The header line's limit.
const MAX_HEADER: usize = 4096;
const CHUNK: u8 = 1;
const END: u8 = 2;
/// Kind, number, pipe, length.
const CHUNK_HEAD: usize = 1 + 8 + 1 + 4;

/// Who the spooled output belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    /// The order's id (the output's subject token).
    pub session_id: String,
    pub agent: String,
    /// The worker that ran it.
    pub host: String,
    pub started_ms: u64,
}

/// One record of a spool file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Chunk {
        number: u64,
        pipe: &'static str,
        data: Vec<u8>,
    },
    End(Box<SessionEnd>),
}

impl Record {
    /// Its bytes in the file.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Record::Chunk { number, pipe, data } => {
                let mut out = Vec::with_capacity(CHUNK_HEAD + data.len());
                out.push(CHUNK);
                out.extend_from_slice(&number.to_le_bytes());
                out.push(u8::from(*pipe == "stderr"));
                out.extend_from_slice(&(data.len() as u32).to_le_bytes());
                out.extend_from_slice(data);
                out
            }
            Record::End(end) => {
                let json = serde_json::to_vec(end).expect("an end serialises");
                let mut out = Vec::with_capacity(5 + json.len());
                out.push(END);
                out.extend_from_slice(&(json.len() as u32).to_le_bytes());
                out.extend_from_slice(&json);
                out
            }
        }
    }
}

/// What the bytes at the start of `buf` are.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// A record and how many bytes it took.
    Record(Record, usize),
    /// The start of a record whose rest is not (yet) there: a write cut
    /// short, the file's end.
    Incomplete,
    /// Not a record: why.
    Bad(String),
}

/// Reads one record from the start of `buf`. Pure.
pub fn decode(buf: &[u8]) -> Decoded {
    let Some(&kind) = buf.first() else {
        return Decoded::Incomplete;
    };
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(buf.get(at..at + 4)?.try_into().ok()?))
    };
    match kind {
        CHUNK => {
            if buf.len() < CHUNK_HEAD {
                return Decoded::Incomplete;
            }
            let number = u64::from_le_bytes(buf[1..9].try_into().expect("8 bytes"));
            let pipe = match buf[9] {
                0 => "stdout",
                1 => "stderr",
                other => return Decoded::Bad(format!("pipe {other} is neither 0 nor 1")),
            };
            let len = u32_at(10).expect("checked");
            if len > MAX_RECORD {
                return Decoded::Bad(format!("a chunk of {len} bytes, more than {MAX_RECORD}"));
            }
            if number == 0 {
                return Decoded::Bad("chunk number 0".into());
            }
            let end = CHUNK_HEAD + len as usize;
            match buf.get(CHUNK_HEAD..end) {
                Some(data) => Decoded::Record(
                    Record::Chunk {
                        number,
                        pipe,
                        data: data.to_vec(),
                    },
                    end,
                ),
                None => Decoded::Incomplete,
            }
        }
        END => {
            let Some(len) = u32_at(1) else {
                return Decoded::Incomplete;
            };
            if len > MAX_RECORD {
                return Decoded::Bad(format!("an end of {len} bytes, more than {MAX_RECORD}"));
            }
            let end = 5 + len as usize;
            match buf.get(5..end) {
                Some(json) => match serde_json::from_slice::<SessionEnd>(json) {
                    Ok(e) => Decoded::Record(Record::End(Box::new(e)), end),
                    Err(e) => Decoded::Bad(format!("an end that does not parse: {e}")),
                },
                None => Decoded::Incomplete,
            }
        }
        other => Decoded::Bad(format!("record kind {other}")),
    }
}

/// The header line at the start of `buf` and its length (with its newline).
pub fn decode_header(buf: &[u8]) -> io::Result<(Header, usize)> {
    let bad = |why: String| io::Error::other(why);
    let Some(nl) = buf.iter().take(MAX_HEADER).position(|b| *b == b'\n') else {
        return Err(bad(format!(
            "no header line within its first {MAX_HEADER} bytes"
        )));
    };
    let header: Header =
        serde_json::from_slice(&buf[..nl]).map_err(|e| bad(format!("its header: {e}")))?;
    agent_state_cluster::session::check_session(&header.session_id)
        .map_err(|e| bad(format!("its header: {e}")))?;
    Ok((header, nl + 1))
}

/// `<work dir>/spool`: made 0700 if missing; must be a directory of ours,
/// not a link.
pub fn dir(work_dir: &Path) -> io::Result<PathBuf> {
    let dir = work_dir.join("spool");
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a directory (a link or a file): move it away",
            dir.display()
        )));
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(io::Error::other(format!(
            "{} belongs to uid {}, not to this worker's user: move it away",
            dir.display(),
            meta.uid()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(dir)
}

/// The spool file of order `session` in `dir`.
pub fn path(dir: &Path, session: &str) -> PathBuf {
    dir.join(format!("{session}.spool"))
}

/// Opens an existing spool file: a plain file with one name, no link
/// followed, no FIFO blocked on.
fn open_existing(path: &Path) -> io::Result<File> {
    use nix::fcntl::OFlag;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits())
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() || meta.nlink() != 1 {
        return Err(io::Error::other(
            "not a plain file with one name, so not a spool file",
        ));
    }
    Ok(file)
}

/// A session's spool file, open.
#[derive(Debug)]
pub struct SpoolFile {
    path: PathBuf,
    file: File,
    header_len: u64,
    /// Where the next record is written.
    len: u64,
    /// Where the next record to publish starts.
    read_at: u64,
    /// The end is written: the file is no longer cut back.
    ended: bool,
}

impl SpoolFile {
    /// A new spool file for `header` in `dir` (none may exist: an order
    /// runs once per worker).
    pub fn create(dir: &Path, header: &Header) -> io::Result<SpoolFile> {
        let path = path(dir, &header.session_id);
        let open = || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
                .open(&path)
        };
        let mut file = match open() {
            // A killed run's file of the same order (redelivered to this
            // worker, whose lease it now holds): set aside under a name the
            // recovery does not read, kept for the operator, never reused.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                // Named by the new run's start (the caller's time).
                let aside = path.with_extension(format!("spool.{}.replaced", header.started_ms));
                std::fs::rename(&path, &aside)?;
                open()?
            }
            other => other?,
        };
        let mut line = serde_json::to_vec(header).expect("a header serialises");
        line.push(b'\n');
        file.write_all(&line)?;
        let len = line.len() as u64;
        Ok(SpoolFile {
            path,
            file,
            header_len: len,
            len,
            read_at: len,
            ended: false,
        })
    }

    /// A spool file left by an earlier run of the worker: its header and
    /// its records (up to the first bad one: said in the third part).
    pub fn open(path: &Path) -> io::Result<(SpoolFile, Header, Vec<Record>, Option<String>)> {
        let file = open_existing(path)?;
        let size = file.metadata()?.len();
        let mut head = vec![0u8; (size as usize).min(MAX_HEADER)];
        file.read_exact_at(&mut head, 0)?;
        let (header, header_len) = decode_header(&head)?;
        let mut spool = SpoolFile {
            path: path.to_path_buf(),
            file,
            header_len: header_len as u64,
            len: size,
            read_at: header_len as u64,
            ended: false,
        };
        let mut records = Vec::new();
        let mut bad = None;
        loop {
            match spool.read_next() {
                Ok(Some(r)) => records.push(r),
                Ok(None) => break,
                Err(e) => {
                    bad = Some(e.to_string());
                    break;
                }
            }
        }
        Ok((spool, header, records, bad))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends a chunk.
    pub fn append(&mut self, number: u64, pipe: &'static str, data: &[u8]) -> io::Result<()> {
        let bytes = Record::Chunk {
            number,
            pipe,
            data: data.to_vec(),
        }
        .encode();
        self.write_record(&bytes)
    }

    /// Appends the end, and syncs it: from now on the file is kept whole.
    pub fn append_end(&mut self, end: &SessionEnd) -> io::Result<()> {
        self.write_record(&Record::End(Box::new(end.clone())).encode())?;
        self.ended = true;
        self.file.sync_data()
    }

    fn write_record(&mut self, bytes: &[u8]) -> io::Result<()> {
        if let Err(e) = self.file.write_all_at(bytes, self.len) {
            // A record cut short is not left for the next one to follow.
            let _ = self.file.set_len(self.len);
            return Err(e);
        }
        self.len += bytes.len() as u64;
        Ok(())
    }

    /// The next record not yet read (`None`: none written yet, or the rest
    /// is a record cut short).
    pub fn read_next(&mut self) -> io::Result<Option<Record>> {
        let left = self.len.saturating_sub(self.read_at);
        if left == 0 {
            return Ok(None);
        }
        let mut head = vec![0u8; (left as usize).min(CHUNK_HEAD)];
        self.file.read_exact_at(&mut head, self.read_at)?;
        // The record's whole length, from its head.
        let whole = match head.first() {
            Some(&CHUNK) if head.len() == CHUNK_HEAD => {
                CHUNK_HEAD as u64 + u64::from(u32::from_le_bytes(head[10..14].try_into().unwrap()))
            }
            Some(&END) if head.len() >= 5 => {
                5 + u64::from(u32::from_le_bytes(head[1..5].try_into().unwrap()))
            }
            _ => left.min(CHUNK_HEAD as u64),
        };
        if whole > u64::from(MAX_RECORD) + CHUNK_HEAD as u64 {
            return Err(io::Error::other(format!(
                "a record of {whole} bytes at offset {}",
                self.read_at
            )));
        }
        let mut buf = vec![0u8; whole.min(left) as usize];
        self.file.read_exact_at(&mut buf, self.read_at)?;
        match decode(&buf) {
            Decoded::Record(r, used) => {
                self.read_at += used as u64;
                Ok(Some(r))
            }
            Decoded::Incomplete => Ok(None),
            Decoded::Bad(why) => Err(io::Error::other(format!(
                "{why}, at offset {}",
                self.read_at
            ))),
        }
    }

    /// Everything written has been read (and stored): the file is cut back
    /// to its header, unless the end is in it.
    pub fn cut_back_if_read(&mut self) -> io::Result<()> {
        if self.ended || self.read_at < self.len || self.len == self.header_len {
            return Ok(());
        }
        self.file.set_len(self.header_len)?;
        self.len = self.header_len;
        self.read_at = self.header_len;
        Ok(())
    }

    /// Bytes written and not yet read back.
    pub fn unread(&self) -> u64 {
        self.len - self.read_at
    }

    /// Removes the file (its end is stored).
    pub fn remove(&self) -> io::Result<()> {
        std::fs::remove_file(&self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_state_cluster::Outcome;

    fn end() -> SessionEnd {
        SessionEnd {
            session_id: "rio_s1".into(),
            agent: "rio".into(),
            host: "w1".into(),
            outcome: Outcome::TimedOut,
            started_ms: 1,
            ended_ms: 2,
            last_chunk: 2,
            lease_revision: 0,
            workspace: None,
        }
    }

    #[test]
    fn records_decode_or_say_why_not() {
        let chunk = Record::Chunk {
            number: 7,
            pipe: "stderr",
            data: b"hello".to_vec(),
        };
        let bytes = chunk.encode();
        let ended = Record::End(Box::new(end()));
        let end_bytes = ended.encode();
        let mut huge = bytes.clone();
        huge[10..14].copy_from_slice(&(MAX_RECORD + 1).to_le_bytes());
        let mut bad_pipe = bytes.clone();
        bad_pipe[9] = 2;
        let mut zero = bytes.clone();
        zero[1..9].copy_from_slice(&0u64.to_le_bytes());
        let mut bad_end = vec![END, 2, 0, 0, 0];
        bad_end.extend_from_slice(b"{}");
        let table: Vec<(Vec<u8>, Decoded)> = vec![
            (bytes.clone(), Decoded::Record(chunk.clone(), bytes.len())),
            // Followed by more: only the first is taken.
            (
                [bytes.clone(), bytes.clone()].concat(),
                Decoded::Record(chunk.clone(), bytes.len()),
            ),
            (end_bytes.clone(), Decoded::Record(ended, end_bytes.len())),
            (vec![], Decoded::Incomplete),
            (bytes[..5].to_vec(), Decoded::Incomplete),
            (bytes[..bytes.len() - 1].to_vec(), Decoded::Incomplete),
            (end_bytes[..3].to_vec(), Decoded::Incomplete),
            (
                huge,
                Decoded::Bad(format!(
                    "a chunk of {} bytes, more than {MAX_RECORD}",
                    MAX_RECORD + 1
                )),
            ),
            (bad_pipe, Decoded::Bad("pipe 2 is neither 0 nor 1".into())),
            (zero, Decoded::Bad("chunk number 0".into())),
            (vec![9, 0, 0], Decoded::Bad("record kind 9".into())),
        ];
        for (i, (buf, want)) in table.into_iter().enumerate() {
            assert_eq!(decode(&buf), want, "row {i}");
        }
        assert!(
            matches!(decode(&bad_end), Decoded::Bad(why) if why.starts_with("an end that does not parse"))
        );
    }

    #[test]
    fn a_killed_runs_file_of_the_same_order_is_set_aside_not_reused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = dir(tmp.path()).unwrap();
        let header = Header {
            session_id: "rio_s1".into(),
            agent: "rio".into(),
            host: "w1".into(),
            started_ms: 5,
        };
        let mut old = SpoolFile::create(&dir, &header).unwrap();
        old.append(1, "stdout", b"old").unwrap();
        let mut new = SpoolFile::create(&dir, &header).unwrap();
        assert_eq!(new.read_next().unwrap(), None, "the new file starts empty");
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names.iter().any(|n| n == "rio_s1.spool"), "{names:?}");
        assert!(
            names
                .iter()
                .any(|n| n.starts_with("rio_s1.spool.") && n.ends_with(".replaced")),
            "{names:?}"
        );
    }

    #[test]
    fn headers_are_checked() {
        let good = br#"{"session_id":"rio_s1","agent":"rio","host":"w1","started_ms":5}"#;
        let (h, n) = decode_header(&[&good[..], b"\nrest"].concat()).unwrap();
        assert_eq!((h.session_id.as_str(), n), ("rio_s1", good.len() + 1));
        for (buf, part) in [
            (b"no newline".to_vec(), "no header line"),
            (b"{}\n".to_vec(), "missing field"),
            (
                br#"{"session_id":"../x","agent":"rio","host":"w1","started_ms":5}
"#
                .to_vec(),
                "cannot be part of a subject",
            ),
            (vec![b'x'; 5000], "no header line"),
        ] {
            let e = decode_header(&buf).unwrap_err().to_string();
            assert!(e.contains(part), "{e}");
        }
    }

    #[test]
    fn a_spool_file_is_read_back_cut_back_and_kept_once_ended() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = dir(tmp.path()).unwrap();
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let header = Header {
            session_id: "rio_s1".into(),
            agent: "rio".into(),
            host: "w1".into(),
            started_ms: 5,
        };
        let mut f = SpoolFile::create(&dir, &header).unwrap();
        f.append(1, "stdout", b"one").unwrap();
        f.append(2, "stderr", b"two").unwrap();
        let first = f.read_next().unwrap().unwrap();
        assert!(matches!(first, Record::Chunk { number: 1, .. }));
        // Not all read: kept.
        f.cut_back_if_read().unwrap();
        assert!(f.unread() > 0);
        f.read_next().unwrap().unwrap();
        assert_eq!(f.read_next().unwrap(), None);
        let before = std::fs::metadata(f.path()).unwrap().len();
        f.cut_back_if_read().unwrap();
        let after = std::fs::metadata(f.path()).unwrap().len();
        assert!(after < before, "{after} < {before}");
        f.append(3, "stdout", b"three").unwrap();
        f.append_end(&end()).unwrap();
        // Half a record at the end (a worker killed mid-write) is ignored.
        std::fs::OpenOptions::new()
            .append(true)
            .open(f.path())
            .unwrap()
            .write_all(&[CHUNK, 4, 0])
            .unwrap();
        let (_, h, records, bad) = SpoolFile::open(f.path()).unwrap();
        assert_eq!(h, header);
        assert_eq!(bad, None);
        assert_eq!(records.len(), 2, "{records:?}");
        assert!(matches!(&records[0], Record::Chunk { number: 3, data, .. } if data == b"three"));
        assert_eq!(records[1], Record::End(Box::new(end())));
        // Links and FIFOs are not followed or blocked on.
        let link = dir.join("link.spool");
        std::os::unix::fs::symlink(f.path(), &link).unwrap();
        assert!(SpoolFile::open(&link).is_err());
        let fifo = dir.join("fifo.spool");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(SpoolFile::open(&fifo).is_err());
        // A spool directory that is a link is refused.
        let other = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(tmp.path(), other.path().join("spool")).unwrap();
        assert!(super::dir(other.path()).is_err());
    }
}
