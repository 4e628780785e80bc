//! A flow's files held under its `.lock` ([`Locked`], [`open`]): what
//! every change to a flow starts from (a cycle applied, closed, or a
//! human's command), and the small writes they share: a journal line, a
//! section of the cycle file, the outbox delivered once.

use std::io::Write;
use std::path::Path;

use serde_json::json;

use super::cycle;
use super::route::Context;
use super::{FlowDir, FlowState, Pending, load};
use crate::agent_name::AgentName;
use crate::clock::Timestamp;
use crate::config::FlowSettings;
use crate::error::{Error, Result};
use crate::inbox::{MessageType, Outgoing, Priority};
use crate::state::{StateRoot, atomic, lock};

/// Directories of a flow: readable by everyone who may read the state root.
pub(super) const DIR_MODE: u32 = 0o755;
/// The answers (raw session output): the service user and its group only.
pub(super) const ANSWERS_MODE: u32 = 0o750;

/// What was done, in lines for the log or the terminal.
#[derive(Debug, Default)]
pub struct Applied {
    pub lines: Vec<String>,
    /// A reply refused (its lines say why): logged as a warning.
    pub refused: bool,
    /// Errors to raise (a publish that failed), and whether to escalate.
    pub errors: Vec<(crate::catalogue::ErrorRecord, bool)>,
}

pub(super) struct Locked {
    pub(super) root: StateRoot,
    pub(super) dir: FlowDir,
    pub(super) state: FlowState,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

pub(super) fn open(root: &StateRoot, flow: &FlowSettings) -> Result<Locked> {
    let dir = FlowDir::new(root, &flow.name);
    atomic::create_dir(&dir.path, DIR_MODE)?;
    let path = dir.lock_path();
    let file = lock::open_private_lock(&path)?;
    let guard = lock::flock_within(file, &path, root.lock_wait)?;
    let state = load(&dir)?.unwrap_or_else(|| FlowState {
        flow: flow.name.to_string(),
        ..FlowState::default()
    });
    Ok(Locked {
        root: root.clone(),
        dir,
        state,
        _lock: guard,
    })
}

impl Locked {
    pub(super) fn save(&self) -> Result<()> {
        atomic::write_json(&self.root.store, &self.dir.state(), &self.state)
    }

    pub(super) fn journal(
        &self,
        now: Timestamp,
        event: &str,
        cycle: &str,
        detail: serde_json::Value,
    ) {
        let mut line = json!({"ts": now, "event": event, "flow": self.state.flow, "cycle": cycle});
        if let (Some(obj), Some(extra)) = (line.as_object_mut(), detail.as_object()) {
            obj.extend(extra.clone());
        }
        let _ = append(&self.dir.journal(), &format!("{line}\n"));
    }

    /// Deliver what the outbox holds (each once), then empty it.
    pub(super) fn deliver(
        &mut self,
        root: &StateRoot,
        now: Timestamp,
        out: &mut Applied,
    ) -> Result<()> {
        if self.state.outbox.is_empty() {
            return Ok(());
        }
        for p in &self.state.outbox {
            match send(root, p, now) {
                Ok(true) => out
                    .lines
                    .push(format!("sent {} to {}: {}", p.kind, p.to, p.subject)),
                Ok(false) => {}
                Err(e) => {
                    // Kept in the outbox: delivered at the next pass.
                    return Err(e);
                }
            }
        }
        self.state.outbox.clear();
        self.save()
    }

    pub(super) fn cycle_file_text(&self) -> String {
        crate::fsx::read_limited(&self.dir.cycle_file(), 64 << 20)
            .ok()
            .flatten()
            .map(|(b, _)| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Append `section` (marked `key`) to the cycle file, unless it is there.
    pub(super) fn add_section(&self, key: &str, section: &str) -> Result<()> {
        if cycle::has(&self.cycle_file_text(), key) {
            return Ok(());
        }
        append(&self.dir.cycle_file(), section)
    }
}

pub(super) fn append(path: &Path, text: &str) -> Result<()> {
    let mut f = crate::fsx::open_append(path, 0o644)?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_data())
        .map_err(|e| Error::io("appending to", path, e))
}

pub(super) fn send(root: &StateRoot, p: &Pending, now: Timestamp) -> Result<bool> {
    let to = root.agent(&AgentName::parse(&p.to)?);
    let out = Outgoing {
        from: AgentName::parse(&p.from)?,
        kind: match p.kind.as_str() {
            "flag" => MessageType::Flag,
            "question" => MessageType::Question,
            _ => MessageType::Task,
        },
        priority: if p.high {
            Priority::High
        } else {
            Priority::Normal
        },
        subject: p.subject.clone(),
        body: p.body.clone(),
        source_ref: Some(p.source_ref.clone()),
        expires_at: None,
    };
    crate::inbox::deliver_once(&to, &out, &p.id, now).map(|m| m.is_some())
}

pub(super) fn context<'a>(
    flow: &'a FlowSettings,
    file: &'a str,
    summary: Option<String>,
    now: Timestamp,
) -> Context<'a> {
    Context {
        flow,
        cycle_file: file,
        summary,
        earlier_blockers: Vec::new(),
        now,
    }
}

/// The first 12 characters of a commit.
pub(super) fn short(commit: &str) -> &str {
    &commit[..commit.len().min(12)]
}
