//! `.daemon/errors.jsonl`: the log of [`ErrorRecord`]s (the catalogue in
//! [`crate::catalogue`] is only data; this is where its records are kept).
//! One fsynced line per record, as the journal writes.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::store::Store;
use crate::catalogue::{ErrorContext, ErrorRecord, Severity};
use crate::clock::Timestamp;
use crate::error::Result;
use crate::string_enum::string_enum;

use super::StateRoot;

/// `.daemon/errors.jsonl`.
pub fn log_path(root: &StateRoot) -> PathBuf {
    root.daemon_dir().join("errors.jsonl")
}

/// The shape of an error record, in errors.jsonl and for the on-error hook
/// (`[hooks] format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ErrorFormat {
    /// agent-state's own: one flat object (`ts`, `code`, ..., `context`
    /// with `agent`, `session`, `attempt`); the hook gets
    /// `AGENT_STATE_ERROR_*`.
    #[default]
    AgentState,
    /// Seed 002's error response format: `{"error": {code, message,
    /// details, severity, recoverable, suggestions, context}}` with
    /// `agentId`/`taskId` (the session) in `context`, and `ts` (and
    /// `escalated`) beside `error`; the hook gets `AXIOM_ERROR_*` as well.
    Seed,
}
string_enum!(
    ErrorFormat,
    "record format",
    AgentState = "agent-state",
    Seed = "seed"
);

/// Seed 002's `context`: who and what an error is about.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SeedContext {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    agent_id: Option<String>,
    /// The session: agent-state's unit of work (the seed's task).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    task_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    attempt: Option<u32>,
}

/// Seed 002's `error` object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SeedError {
    code: String,
    message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    details: Option<String>,
    severity: Severity,
    recoverable: bool,
    #[serde(default)]
    suggestions: Vec<String>,
    #[serde(default)]
    context: SeedContext,
}

/// A line of errors.jsonl in the seed's format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SeedLine {
    ts: Timestamp,
    error: SeedError,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    escalated: bool,
}

impl SeedLine {
    fn of(r: &ErrorRecord) -> SeedLine {
        SeedLine {
            ts: r.ts,
            error: SeedError {
                code: r.code.clone(),
                message: r.message.clone(),
                details: r.details.clone(),
                severity: r.severity,
                recoverable: r.recoverable,
                suggestions: r.suggestions.clone(),
                context: SeedContext {
                    agent_id: r.context.agent.clone(),
                    task_id: r.context.session.clone(),
                    attempt: r.context.attempt,
                },
            },
            escalated: r.escalated,
        }
    }

    fn into_record(self) -> ErrorRecord {
        let e = self.error;
        ErrorRecord {
            ts: self.ts,
            code: e.code,
            message: e.message,
            details: e.details,
            severity: e.severity,
            recoverable: e.recoverable,
            suggestions: e.suggestions,
            context: ErrorContext {
                agent: e.context.agent_id,
                session: e.context.task_id,
                attempt: e.context.attempt,
            },
            escalated: self.escalated,
        }
    }
}

/// `record` as one JSON object in `format` (no newline).
pub fn render(record: &ErrorRecord, format: ErrorFormat) -> Vec<u8> {
    match format {
        ErrorFormat::AgentState => serde_json::to_vec(record),
        ErrorFormat::Seed => serde_json::to_vec(&SeedLine::of(record)),
    }
    .unwrap_or_default()
}

/// A line in either format (a log may hold both: the format was changed).
pub fn parse(line: &[u8]) -> Option<ErrorRecord> {
    serde_json::from_slice::<ErrorRecord>(line)
        .ok()
        .or_else(|| {
            serde_json::from_slice::<SeedLine>(line)
                .ok()
                .map(SeedLine::into_record)
        })
}

/// Append one record in agent-state's format (one fsynced line).
pub fn append(store: &Store, path: &Path, record: &ErrorRecord) -> Result<()> {
    append_as(store, path, record, ErrorFormat::AgentState)
}

/// Append one record in `format` (one fsynced line, as the journal does).
pub fn append_as(
    store: &Store,
    path: &Path,
    record: &ErrorRecord,
    format: ErrorFormat,
) -> Result<()> {
    let mut line = render(record, format);
    line.push(b'\n');
    let _rotation = super::rotation::daemon_logs();
    crate::state::journal::append_lines(store, path, &line)
}

/// The records since `since`, oldest first. Reads backwards from the end,
/// so a long log costs only the window asked for. Lines that do not parse
/// are skipped; either format is read. A missing log is empty.
pub fn read_since(store: &Store, path: &Path, since: Timestamp) -> Result<Vec<ErrorRecord>> {
    let mut out = Vec::new();
    crate::state::journal::scan_lines_backwards(store, path, |line| {
        let Some(record) = parse(line) else {
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
            append(&crate::state::Store::default(), &path, &r).unwrap();
        }
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"{torn"))
            .unwrap();
        let got = read_since(
            &crate::state::Store::default(),
            &path,
            Timestamp::parse("2026-01-15T00:00:00Z").unwrap(),
        )
        .unwrap();
        let messages: Vec<&str> = got.iter().map(|r| r.message.as_str()).collect();
        assert_eq!(messages, ["n1", "n2"]);
        assert!(
            read_since(
                &crate::state::Store::default(),
                &dir.path().join("missing"),
                Timestamp::now()
            )
            .unwrap()
            .is_empty()
        );
    }

    #[test]
    fn each_format_renders_its_shape_and_both_read_back() {
        let r = ErrorRecord::new(Code::AgentSpawnFailed, "Failed to spawn agent echo-003")
            .at(Timestamp::parse("2026-01-25T10:00:00Z").unwrap())
            .agent("echo-003")
            .session("20260125-100000-0001")
            .attempt(2)
            .details("Process exited with code 1");
        let seed: serde_json::Value =
            serde_json::from_slice(&render(&r, ErrorFormat::Seed)).unwrap();
        let own: serde_json::Value =
            serde_json::from_slice(&render(&r, ErrorFormat::AgentState)).unwrap();
        // (format, pointer, value)
        let table: &[(&serde_json::Value, &str, serde_json::Value)] = &[
            (&seed, "/ts", "2026-01-25T10:00:00Z".into()),
            (&seed, "/error/code", "AGENT_SPAWN_FAILED".into()),
            (&seed, "/error/message", r.message.as_str().into()),
            (&seed, "/error/details", "Process exited with code 1".into()),
            (&seed, "/error/severity", r.severity.as_str().into()),
            (&seed, "/error/recoverable", r.recoverable.into()),
            (&seed, "/error/context/agentId", "echo-003".into()),
            (
                &seed,
                "/error/context/taskId",
                "20260125-100000-0001".into(),
            ),
            (&seed, "/error/context/attempt", 2.into()),
            (&own, "/code", "AGENT_SPAWN_FAILED".into()),
            (&own, "/context/agent", "echo-003".into()),
            (&own, "/context/session", "20260125-100000-0001".into()),
        ];
        for (v, pointer, want) in table {
            assert_eq!(v.pointer(pointer), Some(want), "{pointer} in {v}");
        }
        assert!(
            seed["error"]["suggestions"]
                .as_array()
                .is_some_and(|s| !s.is_empty())
        );
        assert_eq!(seed.as_object().unwrap().len(), 2, "ts and error: {seed}");
        for format in [ErrorFormat::Seed, ErrorFormat::AgentState] {
            assert_eq!(parse(&render(&r, format)).as_ref(), Some(&r), "{format}");
        }
        assert_eq!(parse(b"{\"error\": {}}"), None);
        assert_eq!("seed".parse(), Ok(ErrorFormat::Seed));
        assert_eq!("agent-state".parse(), Ok(ErrorFormat::AgentState));
        assert!("axiom".parse::<ErrorFormat>().is_err());
    }
}
