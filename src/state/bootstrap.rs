//! Creating an agent's directory and initial state. Idempotent: an existing
//! file is never overwritten; whatever is missing is created.

use super::journal::{Bootstrap, Event};
use super::metrics::Metrics;
use super::report::Report;
use super::tasks::TaskFile;
use super::{AgentDir, STATE_FILE_MODE, StateRoot, atomic, memory};
use crate::clock::Timestamp;
use crate::config::{AgentConfig, AgentKind};
use crate::error::Result;

/// Modes: agent directories are readable by pipelines; inbox directories are
/// group-writable with setgid, so every sender in the group can deliver and
/// new files keep the group.
pub const AGENT_DIR_MODE: u32 = 0o755;
pub const INBOX_DIR_MODE: u32 = 0o2770;

/// Create the root's own directories. Returns what was created.
pub fn root(root: &StateRoot) -> Result<Vec<String>> {
    let mut created = Vec::new();
    if atomic::create_dir(&root.path, AGENT_DIR_MODE)? {
        created.push(root.path.display().to_string());
    }
    if atomic::create_dir(&root.daemon_dir(), 0o750)? {
        created.push(".daemon/".into());
    }
    if atomic::create_dir(&root.shared_rules_dir(), AGENT_DIR_MODE)? {
        created.push(".shared/rules/".into());
    }
    Ok(created)
}

/// Create whatever `agent` is missing. Returns the paths created, relative to
/// the agent's directory; empty if it was complete.
pub fn agent(config: &AgentConfig, dir: &AgentDir, now: Timestamp) -> Result<Vec<String>> {
    let mut created = Vec::new();
    for d in dir.directories() {
        let mode = if d.starts_with(dir.inbox()) {
            INBOX_DIR_MODE
        } else {
            AGENT_DIR_MODE
        };
        if atomic::create_dir(&d, mode)? {
            created.push(relative(dir, &d) + "/");
        }
    }
    let name = dir.name.as_str();
    let json = |value: serde_json::Value| {
        let mut b = serde_json::to_vec_pretty(&value).unwrap_or_default();
        b.push(b'\n');
        b
    };
    let mut files: Vec<(std::path::PathBuf, Vec<u8>)> = vec![];
    if config.kind == AgentKind::Agent {
        let report = Report {
            updated_at: Some(now),
            ..Report::new(name)
        };
        let tasks = TaskFile {
            updated_at: Some(now),
            ..TaskFile::new(name)
        };
        let metrics = Metrics {
            updated_at: Some(now),
            ..Metrics::new(name)
        };
        files.push((
            dir.report(),
            json(serde_json::to_value(report).unwrap_or_default()),
        ));
        files.push((
            dir.tasks(),
            json(serde_json::to_value(tasks).unwrap_or_default()),
        ));
        files.push((
            dir.metrics(),
            json(serde_json::to_value(metrics).unwrap_or_default()),
        ));
        files.push((dir.memory(), memory::template(&dir.name).into_bytes()));
    }
    // Complete (every start after the first): nothing to lock or write, so
    // a `.lock` somebody else holds does not keep the agent from being
    // served by what needs no lock.
    let missing = |p: &std::path::Path| !crate::fsx::exists(p);
    if created.is_empty()
        && !files.iter().any(|(p, _)| missing(p))
        && !missing(&dir.journal())
        && !missing(&dir.lock_file())
    {
        return Ok(created);
    }
    let lock = dir.lock()?;
    for (path, bytes) in files {
        if atomic::create_new(&path, &bytes, STATE_FILE_MODE)? {
            created.push(relative(dir, &path));
        }
    }
    let journal_missing = !crate::fsx::exists(&dir.journal());
    if journal_missing {
        created.push("journal.jsonl".into());
    }
    if !created.is_empty() {
        dir.journal_append(
            &lock,
            now,
            Event::Bootstrap(Bootstrap {
                created: created.clone(),
            }),
        )?;
    }
    Ok(created)
}

fn relative(dir: &AgentDir, path: &std::path::Path) -> String {
    let rel = path.strip_prefix(&dir.path).unwrap_or(path);
    if rel.as_os_str().is_empty() {
        ".".to_string()
    } else {
        rel.display().to_string()
    }
}
