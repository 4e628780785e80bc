//! `.daemon/errors.jsonl`: the log of [`ErrorRecord`]s (the catalogue in
//! [`crate::catalogue`] is only data; this is where its records are kept).
//! One fsynced line per record, as the journal writes.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use crate::catalogue::ErrorRecord;
use crate::clock::Timestamp;
use crate::error::Result;

use super::StateRoot;

/// `.daemon/errors.jsonl`.
pub fn log_path(root: &StateRoot) -> PathBuf {
    root.daemon_dir().join("errors.jsonl")
}

/// Append one record (one fsynced line, as the journal does).
pub fn append(path: &Path, record: &ErrorRecord) -> Result<()> {
    let mut line = serde_json::to_vec(record).unwrap_or_default();
    line.push(b'\n');
    let _rotation = super::rotation::daemon_logs();
    crate::state::journal::append_lines(path, &line)
}

/// The records since `since`, oldest first. Reads backwards from the end,
/// so a long log costs only the window asked for. Lines that do not parse
/// are skipped. A missing log is empty.
pub fn read_since(path: &Path, since: Timestamp) -> Result<Vec<ErrorRecord>> {
    let mut out = Vec::new();
    crate::state::journal::scan_lines_backwards(path, |line| {
        let Ok(record) = serde_json::from_slice::<ErrorRecord>(line) else {
            return ControlFlow::Continue(());
        };
        if record.ts < since {
            return ControlFlow::Break(());
        }
        out.push(record);
        ControlFlow::Continue(())
    })?;
    out.reverse();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue::Code;

    #[test]
    fn log_reads_back_a_window() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("errors.jsonl");
        for (i, ts) in [
            "2026-01-01T00:00:00Z",
            "2026-02-01T00:00:00Z",
            "2026-03-01T00:00:00Z",
        ]
        .iter()
        .enumerate()
        {
            let r = ErrorRecord::new(Code::SessionTimeout, format!("n{i}"))
                .at(Timestamp::parse(ts).unwrap());
            append(&path, &r).unwrap();
        }
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"{torn"))
            .unwrap();
        let got = read_since(&path, Timestamp::parse("2026-01-15T00:00:00Z").unwrap()).unwrap();
        let messages: Vec<&str> = got.iter().map(|r| r.message.as_str()).collect();
        assert_eq!(messages, ["n1", "n2"]);
        assert!(
            read_since(&dir.path().join("missing"), Timestamp::now())
                .unwrap()
                .is_empty()
        );
    }
}
