//! Rotation of the append-only logs (`journal.jsonl`, `.daemon/errors.jsonl`,
//! `.daemon/signals.jsonl`) by size, and reading their whole history back.
//!
//! A log is one stream of bytes that never shrinks. Its oldest parts are
//! kept compressed beside it as *segments*, `NAME.OFFSET.zst`, where OFFSET
//! (12 digits, so names sort in order) is where the segment starts in the
//! stream. The live file begins with a marker line naming where it starts:
//!
//! ```text
//! {"ts":"2026-11-25T00:00:00Z","event":"log_rotated","offset":16777216,"previous":"journal.jsonl.000000000000.zst"}
//! ```
//!
//! (a live file without one starts at 0; a journal's also carries
//! `"last_task_number"`, see [`Marker::carried`]). A position in the stream (the
//! events cursor's offset) therefore means the same byte before and after a
//! rotation, and `zstdcat NAME.*.zst; cat NAME` prints the whole history.
//!
//! Rotating, with every writer excluded (the agent lock; the daemon's own
//! logs have one writer, the daemon, and [`daemon_logs`] orders it):
//!
//! 1. the live file (base B, N bytes) is compressed to a temp file, synced
//!    and renamed to `NAME.B.zst` (a crash here leaves a segment whose start
//!    is the live file's own base: readers ignore it, the next rotation
//!    writes it again);
//! 2. a new live file holding only the marker (offset B+N) replaces it
//!    (temp + rename + directory sync).
//!
//! Nothing is lost at any point: before 2 the old live file is the truth;
//! after it the segment is. Segments are removed only by [`prune`], by age.
//!
//! A *bad* segment (damaged: it fails its checksum or does not decompress;
//! or a link or special file where a segment should be) never stops a
//! reader: the history it held is skipped. The daemon sets it aside as
//! `NAME.OFFSET.zst.corrupt-STAMP` and raises `STATE_CORRUPT`; `check`
//! names it and `check --repair` sets it aside. A set-aside segment is kept
//! until someone removes it (`prune` does not know its name).

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::store::Store;
use crate::clock::Timestamp;
use crate::error::{Error, IoContext, Result};
use crate::fsx;

/// The event name of a live file's first line after a rotation.
pub const MARKER_EVENT: &str = "log_rotated";

/// Digits of a segment's offset in its name.
const OFFSET_DIGITS: usize = 12;

/// The most a segment may hold decompressed: far over any rotation size
/// the config allows; a bigger one (a hostile or foreign file) is refused,
/// not read into memory.
pub const MAX_SEGMENT: u64 = 1 << 30;

/// The live file's first line after a rotation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    pub ts: Timestamp,
    pub event: String,
    /// Where this live file starts in the stream.
    pub offset: u64,
    /// The segment that holds what came before.
    pub previous: String,
    /// What the log's owner carries past its segments, which retention may
    /// remove (a journal: `last_task_number`, the highest task id handed
    /// out before this file, so a rebuild never hands one out again); the
    /// owner decides what of the previous marker's goes forward. Small:
    /// the marker is read from a live file's first 4 KiB.
    #[serde(flatten, default)]
    pub carried: serde_json::Map<String, serde_json::Value>,
}

/// A compressed part of a log's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Where it starts in the stream.
    pub start: u64,
    pub path: PathBuf,
}

/// `journal.jsonl.000016777216.zst`
pub fn segment_name(live_name: &str, start: u64) -> String {
    format!("{live_name}.{start:0width$}.zst", width = OFFSET_DIGITS)
}

/// The start offset a segment name of `live_name` carries, if it is one.
pub fn parse_segment_name(live_name: &str, name: &str) -> Option<u64> {
    let digits = name
        .strip_prefix(live_name)?
        .strip_prefix('.')?
        .strip_suffix(".zst")?;
    if digits.len() < OFFSET_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Is this line a rotation marker? (Readers of records skip it.)
pub fn is_marker(line: &[u8]) -> bool {
    parse_marker(line).is_some()
}

fn parse_marker(line: &[u8]) -> Option<Marker> {
    // Cheap test first: records are read by the thousand.
    if !line.starts_with(b"{\"ts\":") || !contains(line, MARKER_EVENT.as_bytes()) {
        return None;
    }
    serde_json::from_slice::<Marker>(line)
        .ok()
        .filter(|m| m.event == MARKER_EVENT)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Where the open live file starts in its stream: its marker's offset, or
/// 0 without one. Reads only its first line (at most 4 KiB).
pub fn base_of(file: &File) -> io::Result<u64> {
    Ok(head_marker(file)?.map_or(0, |m| m.offset))
}

/// The open live file's marker, if it starts with one. Reads only its
/// first line (at most 4 KiB).
pub fn head_marker(file: &File) -> io::Result<Option<Marker>> {
    use std::os::unix::fs::FileExt;
    let mut head = [0u8; 4096];
    let mut n = 0;
    loop {
        match file.read_at(&mut head[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => {
                n += k;
                if n == head.len() || head[..n].contains(&b'\n') {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let Some(end) = head[..n].iter().position(|b| *b == b'\n') else {
        return Ok(None);
    };
    Ok(parse_marker(&head[..end]))
}

/// The segments of the log at `path` that come before `live_base`, oldest
/// first. A name that only looks like one, or anything but a regular file,
/// is not a segment.
pub fn segments(path: &Path, live_base: u64) -> Result<Vec<Segment>> {
    let (dir, name) = split(path)?;
    let mut out = Vec::new();
    if !fsx::exists(dir) {
        return Ok(out);
    }
    for entry in fsx::list(dir)? {
        let Some(entry) = entry.to_str() else {
            continue;
        };
        let Some(start) = parse_segment_name(name, entry) else {
            continue;
        };
        if start >= live_base {
            // A crash between writing it and replacing the live file.
            continue;
        }
        out.push(Segment {
            start,
            path: dir.join(entry),
        });
    }
    out.sort_by_key(|s| s.start);
    Ok(out)
}

fn split(path: &Path) -> Result<(&Path, &str)> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::Data(format!("{} is not a log file name", path.display())))?;
    Ok((dir, name))
}

/// The decompressed bytes of a segment (never through a link; at most
/// [`MAX_SEGMENT`]). A segment that is not a regular file is
/// [`Error::Unsafe`]; one that does not decompress, or decompresses to more
/// than [`MAX_SEGMENT`], is [`Error::Corrupt`]: a *bad segment*.
pub fn read_segment(segment: &Segment) -> Result<Vec<u8>> {
    let path = &segment.path;
    let Some(file) = fsx::open_read(path)? else {
        return Ok(Vec::new());
    };
    // The decoder's own errors carry no OS error number; an error of the
    // disk below it does, and stays an I/O error (the file may be fine).
    let corrupt = |e: io::Error| match e.raw_os_error() {
        Some(_) => Error::io("decompressing", path, e),
        None => Error::Corrupt {
            path: path.clone(),
            reason: format!("does not decompress ({e})"),
        },
    };
    let decoder = zstd::stream::read::Decoder::new(file).map_err(corrupt)?;
    let mut out = Vec::new();
    decoder
        .take(MAX_SEGMENT + 1)
        .read_to_end(&mut out)
        .map_err(corrupt)?;
    if out.len() as u64 > MAX_SEGMENT {
        return Err(Error::Corrupt {
            path: path.clone(),
            reason: format!(
                "holds more than {} MiB decompressed: not a segment this program wrote",
                MAX_SEGMENT >> 20
            ),
        });
    }
    Ok(out)
}

/// [`read_segment`] for the readers of a log's history: a bad segment is
/// skipped (`None`), so one damaged file never stops the agent's recording
/// or the fleet's `status`; only an I/O error is returned. In a process that
/// repairs what it finds (a `store` that records repairs, the daemon's:
/// [`Store::recording_repairs`]) the bad segment is also set aside,
/// `NAME.OFFSET.zst.corrupt-STAMP` under the store's repair time, and the
/// repair noted (`STATE_CORRUPT` in errors.jsonl); elsewhere `check`
/// reports it and `check --repair` sets it aside.
pub fn read_segment_or_skip(store: &Store, segment: &Segment) -> Result<Option<Vec<u8>>> {
    let why = match read_segment(segment) {
        Ok(bytes) => return Ok(Some(bytes)),
        Err(e) => bad_segment_reason(&e).ok_or(e)?,
    };
    if let Some(now) = store.repair_time() {
        let path = segment.path.display();
        let note = match set_aside(segment, now) {
            Ok(aside) => format!(
                "{path}: a rotated log segment that cannot be read ({why}); set aside as {} (the history it held is left out of usage, metrics and events; `zstd -d` may recover part of it)",
                aside.display()
            ),
            Err(e) => format!(
                "{path}: a rotated log segment that cannot be read ({why}) is skipped; it could not be set aside: {e}"
            ),
        };
        store.note_repair(&agent_of(&segment.path), &note);
    }
    Ok(None)
}

/// Why [`read_segment`]'s error makes a bad segment; `None` for an I/O
/// error (the file may be fine).
pub fn bad_segment_reason(e: &Error) -> Option<String> {
    match e {
        Error::Corrupt { reason, .. } | Error::Unsafe { reason, .. } => Some(reason.clone()),
        _ => None,
    }
}

/// The bad segments of the log at `path` and why each is bad (for
/// `check`, which reads every one).
pub fn bad_segments(path: &Path) -> Result<Vec<(Segment, String)>> {
    let base = match fsx::open_read(path)? {
        Some(f) => base_of(&f).at("reading", path)?,
        None => u64::MAX,
    };
    let mut bad = Vec::new();
    for segment in segments(path, base)? {
        if let Err(e) = read_segment(&segment) {
            let why = bad_segment_reason(&e).ok_or(e)?;
            bad.push((segment, why));
        }
    }
    Ok(bad)
}

/// Rename a bad segment out of the log's history, to
/// `NAME.OFFSET.zst.corrupt-STAMP` beside it (a link is moved, never
/// followed). Returns the new path.
pub fn set_aside(segment: &Segment, now: Timestamp) -> Result<PathBuf> {
    let aside = super::set_aside_name(&segment.path, "corrupt", &now.compact());
    fsx::rename(&segment.path, &aside, false)?;
    Ok(aside)
}

/// The agent whose log `path` is (its directory's name); empty for the
/// daemon's own logs in `.daemon/`.
fn agent_of(path: &Path) -> String {
    path.parent()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
        .filter(|n| !n.starts_with('.'))
        .unwrap_or_default()
        .to_string()
}

/// Whether `name` is a segment of `live_name` set aside as bad.
pub fn is_set_aside_segment(live_name: &str, name: &str) -> bool {
    name.split_once(".zst.corrupt-")
        .is_some_and(|(segment, _)| {
            parse_segment_name(live_name, &format!("{segment}.zst")).is_some()
        })
}

/// What one rotation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rotated {
    pub segment: PathBuf,
    /// Bytes of the live file moved into the segment.
    pub bytes: u64,
    /// Where the new live file starts.
    pub offset: u64,
}

/// Rotate the log at `path` if it holds more than `max_size` bytes (the
/// caller excludes every writer). Returns what was done, or `None`.
pub fn rotate_if_over(
    store: &Store,
    path: &Path,
    max_size: u64,
    now: Timestamp,
) -> Result<Option<Rotated>> {
    rotate_carrying(store, path, max_size, now, |_| Ok(serde_json::Map::new()))
}

/// [`rotate_if_over`], the new marker carrying what `carry` makes of the
/// current one (`None`: the live file has none); called only when the log
/// is over the size, with every writer still excluded.
pub fn rotate_carrying(
    store: &Store,
    path: &Path,
    max_size: u64,
    now: Timestamp,
    carry: impl FnOnce(Option<&Marker>) -> Result<serde_json::Map<String, serde_json::Value>>,
) -> Result<Option<Rotated>> {
    let Some(file) = fsx::open_read(path)? else {
        return Ok(None);
    };
    let len = file.metadata().at("inspecting", path)?.len();
    if len <= max_size {
        return Ok(None);
    }
    let head = head_marker(&file).at("reading", path)?;
    let carried = carry(head.as_ref())?;
    rotate_open(store, path, file, len, now, head, carried).map(Some)
}

fn rotate_open(
    store: &Store,
    path: &Path,
    file: File,
    len: u64,
    now: Timestamp,
    head: Option<Marker>,
    carried: serde_json::Map<String, serde_json::Value>,
) -> Result<Rotated> {
    let (dir_path, name) = split(path)?;
    let base = head.map_or(0, |m| m.offset);
    let mode = file.metadata().at("inspecting", path)?.permissions();
    let mode = std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777;
    let segment_file = segment_name(name, base);
    let segment_path = dir_path.join(&segment_file);

    // 1. The segment: compressed, synced, renamed into place.
    let dir = fsx::dir(dir_path)?;
    let (temp, temp_name) = fsx::create_temp(dir.as_fd(), dir_path, mode)?;
    let written = (|| -> io::Result<u64> {
        let mut encoder = zstd::stream::write::Encoder::new(temp, 3)?;
        // A checksum of the content, so that a damaged segment is found
        // (and set aside) rather than read back as garbage lines.
        encoder.include_checksum(true)?;
        let mut reader = BufReader::with_capacity(256 * 1024, (&file).take(len));
        let mut copied = 0u64;
        let mut last = b'\n';
        loop {
            let buf = reader.fill_buf()?;
            if buf.is_empty() {
                break;
            }
            encoder.write_all(buf)?;
            last = *buf.last().expect("not empty");
            let n = buf.len();
            copied += n as u64;
            reader.consume(n);
        }
        // A torn last line (a crash mid-write) is closed here, so the
        // segment ends on a line boundary like every part of the stream.
        if copied > 0 && last != b'\n' {
            encoder.write_all(b"\n")?;
            copied += 1;
        }
        let temp = encoder.finish()?;
        temp.sync_all()?;
        Ok(copied)
    })();
    let copied = match written {
        Ok(n) => n,
        Err(e) => {
            fsx::discard_at(dir.as_fd(), &temp_name);
            return Err(Error::io("writing the rotated segment", &segment_path, e));
        }
    };
    if let Err(e) = fsx::rename_at(
        dir.as_fd(),
        &temp_name,
        dir.as_fd(),
        std::ffi::OsStr::new(&segment_file),
        true,
    ) {
        fsx::discard_at(dir.as_fd(), &temp_name);
        return Err(Error::io("renaming into place", &segment_path, e));
    }
    fsx::sync_fd(&dir, dir_path)?;

    // 2. The new live file: the marker alone.
    let offset = base + copied;
    let marker = Marker {
        ts: now,
        event: MARKER_EVENT.to_string(),
        offset,
        previous: segment_file,
        carried,
    };
    let mut line = serde_json::to_vec(&marker).expect("a marker serializes");
    line.push(b'\n');
    super::atomic::write_file(store, path, &line, mode)?;
    Ok(Rotated {
        segment: segment_path,
        bytes: copied,
        offset,
    })
}

/// Remove segments of the log at `path` last written before `older_than`.
/// Returns how many files and bytes went.
pub fn prune(path: &Path, older_than: SystemTime) -> Result<(usize, u64)> {
    let mut removed = (0, 0);
    for segment in segments(path, u64::MAX)? {
        let Some(st) = fsx::metadata(&segment.path)? else {
            continue;
        };
        if fsx::modified(&st) >= older_than {
            continue;
        }
        if fsx::remove_file(&segment.path)? {
            removed.0 += 1;
            removed.1 += st.st_size as u64;
        }
    }
    Ok(removed)
}

/// The daemon's own logs (errors.jsonl, signals.jsonl) have one writer,
/// the daemon; its appends and their rotation (off the loop) take this
/// lock so that no line is appended between a rotation's copy and its
/// replacement of the live file.
pub fn daemon_logs() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts() -> Timestamp {
        Timestamp::parse("2026-11-25T00:00:00Z").unwrap()
    }

    /// Whole lines appended to the live file, as the journal appends them
    /// (written here: the journal reads through this module, not back).
    fn append(path: &Path, lines: &[u8]) {
        use std::io::Write;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(lines))
            .unwrap();
    }

    /// Every part of the log at `path` in stream order: each segment
    /// before the live file's base, then the live file (its marker included).
    fn history(path: &Path) -> Vec<(u64, Vec<u8>)> {
        let live = fsx::open_read(path).unwrap().map(|mut f| {
            let base = base_of(&f).unwrap();
            let mut bytes = Vec::new();
            f.read_to_end(&mut bytes).unwrap();
            (base, bytes)
        });
        let base = live.as_ref().map_or(u64::MAX, |(b, _)| *b);
        let mut parts: Vec<(u64, Vec<u8>)> = segments(path, base)
            .unwrap()
            .iter()
            .map(|s| (s.start, read_segment(s).unwrap()))
            .collect();
        parts.extend(live);
        parts
    }

    fn whole(path: &Path) -> Vec<u8> {
        let mut out = Vec::new();
        let mut expected = None;
        for (start, bytes) in history(path) {
            if let Some(e) = expected {
                assert_eq!(start, e, "parts are contiguous");
            }
            expected = Some(start + bytes.len() as u64);
            out.extend(bytes);
        }
        out
    }

    #[test]
    fn names_sort_and_parse() {
        assert_eq!(
            segment_name("journal.jsonl", 16),
            "journal.jsonl.000000000016.zst"
        );
        assert_eq!(
            parse_segment_name("journal.jsonl", "journal.jsonl.000000000016.zst"),
            Some(16)
        );
        for not in [
            "journal.jsonl.16.zst",
            "journal.jsonl.00000000001x.zst",
            "journal.jsonl.000000000016",
            "errors.jsonl.000000000016.zst",
            "journal.jsonl.torn-20260101T000000Z",
        ] {
            assert_eq!(parse_segment_name("journal.jsonl", not), None, "{not}");
        }
    }

    #[test]
    fn rotation_keeps_every_byte_and_every_offset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.jsonl");
        let mut expected = Vec::new();
        for round in 0..3 {
            let lines: Vec<u8> = (0..50)
                .flat_map(|i| format!("{{\"n\":{round}{i:03}}}\n").into_bytes())
                .collect();
            append(&path, &lines);
            let before = whole(&path);
            let r = rotate_if_over(&crate::state::Store::default(), &path, 100, ts())
                .unwrap()
                .unwrap();
            assert_eq!(r.offset, before.len() as u64, "the next byte's offset");
            let after = whole(&path);
            assert!(after.starts_with(&before), "nothing lost or moved");
            let marker = &after[before.len()..];
            assert!(is_marker(marker.strip_suffix(b"\n").unwrap()));
            expected = after;
        }
        let segs = segments(&path, u64::MAX).unwrap();
        assert_eq!(segs.len(), 3);
        assert_eq!(segs[0].start, 0);
        // The live file names where it starts.
        let f = fsx::open_read(&path).unwrap().unwrap();
        assert_eq!(
            base_of(&f).unwrap(),
            expected.len() as u64 - {
                let live = std::fs::read(&path).unwrap();
                live.len() as u64
            }
        );
        // Under the limit: nothing to do.
        assert_eq!(
            rotate_if_over(&crate::state::Store::default(), &path, 1 << 20, ts()).unwrap(),
            None
        );
    }

    #[test]
    fn a_torn_last_line_is_closed_and_a_crash_leftover_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("errors.jsonl");
        std::fs::write(&path, b"{\"a\":1}\n{\"torn").unwrap();
        let r = rotate_if_over(&crate::state::Store::default(), &path, 1, ts())
            .unwrap()
            .unwrap();
        assert_eq!(r.bytes, 15, "the torn line closed by a newline");
        let seg = read_segment(&segments(&path, u64::MAX).unwrap()[0]).unwrap();
        assert_eq!(seg, b"{\"a\":1}\n{\"torn\n");
        // A segment starting where the live file starts: a crash between
        // the two steps. Not part of the history.
        std::fs::write(dir.path().join(segment_name("errors.jsonl", 15)), b"junk").unwrap();
        assert_eq!(segments(&path, 15).unwrap().len(), 1);
        assert_eq!(history(&path).len(), 2);
    }

    #[test]
    fn old_segments_are_pruned_by_age() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("signals.jsonl");
        std::fs::write(&path, b"{\"a\":1}\n").unwrap();
        rotate_if_over(&crate::state::Store::default(), &path, 0, ts())
            .unwrap()
            .unwrap();
        let future = SystemTime::now() + std::time::Duration::from_secs(60);
        assert_eq!(prune(&path, SystemTime::UNIX_EPOCH).unwrap(), (0, 0));
        assert_eq!(prune(&path, future).unwrap().0, 1);
        assert!(segments(&path, u64::MAX).unwrap().is_empty());
    }

    #[test]
    fn a_damaged_segment_is_found_by_its_checksum_and_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.jsonl");
        for round in 0..2 {
            let lines: Vec<u8> = (0..50)
                .flat_map(|i| format!("{{\"n\":{round}{i:03}}}\n").into_bytes())
                .collect();
            append(&path, &lines);
            rotate_if_over(&crate::state::Store::default(), &path, 100, ts())
                .unwrap()
                .unwrap();
        }
        let segs = segments(&path, u64::MAX).unwrap();
        let mut bytes = std::fs::read(&segs[0].path).unwrap();
        let mid = bytes.len() / 2;
        for b in &mut bytes[mid..mid + 4] {
            *b ^= 0xff;
        }
        std::fs::write(&segs[0].path, bytes).unwrap();

        assert!(matches!(read_segment(&segs[0]), Err(Error::Corrupt { .. })));
        assert_eq!(
            read_segment_or_skip(&crate::state::Store::default(), &segs[0]).unwrap(),
            None
        );
        assert!(
            read_segment_or_skip(&crate::state::Store::default(), &segs[1])
                .unwrap()
                .is_some()
        );
        let bad = bad_segments(&path).unwrap();
        assert_eq!(bad.len(), 1);
        assert!(bad[0].1.starts_with("does not decompress"), "{}", bad[0].1);
        // Not repairing here (no daemon): left in place for `check`.
        assert!(segs[0].path.exists());
        let aside = set_aside(&segs[0], ts()).unwrap();
        let name = aside.file_name().unwrap().to_str().unwrap();
        assert_eq!(
            name,
            "journal.jsonl.000000000000.zst.corrupt-20261125T000000Z"
        );
        assert!(is_set_aside_segment("journal.jsonl", name));
        assert!(!is_set_aside_segment(
            "journal.jsonl",
            "report.json.corrupt-20261125T000000Z"
        ));
        assert_eq!(segments(&path, u64::MAX).unwrap().len(), 1);
        // A link where a segment should be is a bad segment too.
        std::os::unix::fs::symlink("/etc/passwd", &segs[0].path).unwrap();
        assert_eq!(bad_segments(&path).unwrap().len(), 1);
    }
}
