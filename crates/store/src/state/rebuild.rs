//! Rebuilding state files from the journal, and loading a state file in a
//! way that survives its corruption.
//!
//! A corrupt file is never overwritten in place: it is renamed aside
//! (`report.json.corrupt-20260331T220000Z`), rebuilt from the journal, and the
//! repair is journaled. The pure `*_from_journal` functions do the rebuilding.

use std::path::Path;

use serde::Serialize;

use super::journal::{self, Entry, Event, StateRepaired};
use super::metrics::{Lifetime, Metrics, Rolling};
use super::report::{AgentStatus, LastSession, Report};
use super::session::{Session, SessionStatus};
use super::tasks::{LAST_TASK_NUMBER, Task, TaskFile, TaskStatus};
use super::{AgentDir, atomic, set_aside_name};
use crate::clock::Timestamp;
use crate::error::Result;

/// report.json as the journal tells it.
pub fn report_from_journal(agent: &str, entries: &[Entry]) -> Report {
    let mut report = Report::new(agent);
    if let Some(session) = session_from_journal(agent, entries) {
        if session.is_running() {
            report.status = AgentStatus::for_session(session.kind);
            report.current_session = Some(session.session_id.clone());
        } else {
            report.status = match session.status {
                Some(SessionStatus::Error) => AgentStatus::Error,
                _ => AgentStatus::Idle,
            };
            report.last_session = Some(LastSession {
                id: session.session_id.clone(),
                started_at: session.started_at,
                ended_at: session.ended_at,
                outcome: session.status,
                sources_archived: session.sources_archived,
                branch: session.branch.clone(),
                pr_number: session.pr_number,
                reason: session.reason.clone(),
                ..LastSession::default()
            });
        }
    }
    for e in entries {
        if let Event::SessionEnd(end) = &e.event {
            if end.summary.is_some() {
                report.summary = end.summary.clone();
            }
            if end.next_priority.is_some() {
                report.next_priority = end.next_priority.clone();
            }
        }
    }
    report.updated_at = entries.last().map(|e| e.ts);
    report
}

/// session.json as the journal tells it: the last session started.
pub fn session_from_journal(agent: &str, entries: &[Entry]) -> Option<Session> {
    let mut session: Option<Session> = None;
    for e in entries {
        match &e.event {
            Event::SessionStart(s) => session = Some(session_of_start(agent, e.ts, s)),
            Event::SessionEnd(end) => {
                let s = session.get_or_insert_with(|| orphan(agent, &end.session_id));
                if s.session_id == end.session_id {
                    s.status = Some(SessionStatus::Completed);
                    s.ended_at = Some(e.ts);
                    s.sources_archived = end.sources_archived;
                    s.handoff_notes = end.handoff.clone();
                    s.branch = end.branch.clone().or(s.branch.take());
                    s.pr_number = end.pr_number;
                    s.tokens_used = end.tokens_used;
                    s.cost_usd = end.cost_usd;
                    s.owner_pid = None;
                }
            }
            Event::Error(f) | Event::Timeout(f) => {
                let s = session.get_or_insert_with(|| orphan(agent, &f.session_id));
                if s.session_id == f.session_id {
                    s.status = Some(match e.event {
                        Event::Timeout(_) => SessionStatus::Timeout,
                        _ => SessionStatus::Error,
                    });
                    s.ended_at = Some(e.ts);
                    s.reason = Some(f.reason.clone());
                    s.owner_pid = None;
                }
            }
            _ => {}
        }
    }
    session
}

/// session.json of a session as its journaled start says it began: running.
pub fn session_of_start(
    agent: &str,
    ts: crate::state::Timestamp,
    s: &crate::state::journal::SessionStart,
) -> Session {
    Session {
        agent: agent.to_string(),
        session_id: s.session_id.clone(),
        started_at: Some(ts),
        kind: s.kind,
        branch: s.branch.clone(),
        status: Some(SessionStatus::Running),
        model: s.model.clone(),
        timeout_seconds: s.timeout_seconds,
        research_question: s.research_question.clone(),
        disconfirmation_target: s.disconfirmation_target.clone(),
        owner_pid: s.owner_pid,
        instance: s.instance.clone(),
        messages: s.messages.clone(),
        ..Session::default()
    }
}

fn orphan(agent: &str, id: &str) -> Session {
    Session {
        agent: agent.to_string(),
        session_id: id.to_string(),
        ..Session::default()
    }
}

/// tasks.json as the journal's task events tell it. `carried` is what the journal's
/// rotation marker carries: its `last_task_number` keeps the ids of tasks
/// whose history retention removed from being handed out again.
pub fn tasks_from_journal(
    agent: &str,
    entries: &[Entry],
    carried: &serde_json::Map<String, serde_json::Value>,
) -> TaskFile {
    let mut file = TaskFile::new(agent);
    if let Some(n) = carried
        .get(LAST_TASK_NUMBER)
        .and_then(serde_json::Value::as_u64)
    {
        file.extra.insert(LAST_TASK_NUMBER.into(), n.into());
    }
    for e in entries {
        match &e.event {
            Event::TaskAdded(t) if file.find_mut(&t.task_id).is_none() => file.tasks.push(Task {
                id: t.task_id.clone(),
                kind: t.kind,
                description: t.description.clone(),
                status: TaskStatus::Pending,
                priority: t.priority,
                created_at: Some(e.ts),
                context: t.context.clone(),
                follow_up_from: t.follow_up_from.clone(),
                source_message: t.source_message.clone(),
                ..Task::default()
            }),
            Event::TaskUpdated(u) => {
                if let Some(task) = file.find_mut(&u.task_id) {
                    task.set_status(u.status, u.outcome.clone(), e.ts);
                }
            }
            _ => {}
        }
        file.updated_at = Some(e.ts);
    }
    file
}

/// metrics.json recomputed from the whole journal.
pub fn metrics_from_journal(agent: &str, entries: &[Entry], now: Timestamp) -> Metrics {
    Metrics {
        agent: agent.to_string(),
        updated_at: Some(now),
        lifetime: Lifetime::from_journal(entries),
        rolling_30d: Rolling::from_journal(entries, now),
        counted_session: entries
            .iter()
            .rev()
            .find_map(|e| e.event.ended_session().map(str::to_string)),
        ..Metrics::default()
    }
}

/// Which state file, for repair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateFileKind {
    Report,
    Tasks,
    Session,
    Metrics,
}

impl StateFileKind {
    pub const ALL: [StateFileKind; 4] = [
        StateFileKind::Report,
        StateFileKind::Tasks,
        StateFileKind::Session,
        StateFileKind::Metrics,
    ];

    pub fn file_name(&self) -> &'static str {
        match self {
            StateFileKind::Report => "report.json",
            StateFileKind::Tasks => "tasks.json",
            StateFileKind::Session => "session.json",
            StateFileKind::Metrics => "metrics.json",
        }
    }
}

/// Set the corrupt `kind` file of `agent` aside and write a rebuilt one (if
/// the journal has enough to rebuild it). Returns a line saying what was done.
/// Call with the agent lock held.
pub fn repair(agent: &AgentDir, kind: StateFileKind, now: Timestamp) -> Result<String> {
    let path = agent.file(kind.file_name());
    let aside = set_aside_name(&path, "corrupt", &now.compact());
    atomic::rename(&path, &aside)?;
    let scan = journal::read(&agent.store, &agent.journal())?;
    let name = agent.name.as_str();
    let written = match kind {
        StateFileKind::Report => write(
            &agent.store,
            &path,
            &report_from_journal(name, &scan.entries),
        )?,
        StateFileKind::Tasks => write(
            &agent.store,
            &path,
            &tasks_from_journal(name, &scan.entries, &scan.carried),
        )?,
        StateFileKind::Metrics => write(
            &agent.store,
            &path,
            &metrics_from_journal(name, &scan.entries, now),
        )?,
        StateFileKind::Session => match session_from_journal(name, &scan.entries) {
            Some(s) => write(&agent.store, &path, &s)?,
            None => false,
        },
    };
    let aside_name = aside
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .to_string();
    journal::append(
        &agent.store,
        &agent.journal(),
        &Entry::new(
            now,
            Event::StateRepaired(StateRepaired {
                file: kind.file_name().to_string(),
                set_aside_as: Some(aside_name.clone()),
                rebuilt_from: "journal".to_string(),
            }),
        ),
    )?;
    Ok(if written {
        format!(
            "{name}: {} was corrupt; set aside as {aside_name} and rebuilt from the journal",
            kind.file_name()
        )
    } else {
        format!(
            "{name}: {} was corrupt; set aside as {aside_name} (the journal has no session to rebuild it from)",
            kind.file_name()
        )
    })
}

fn write<T: Serialize>(store: &super::Store, path: &Path, value: &T) -> Result<bool> {
    atomic::write_json(store, path, value)?;
    Ok(true)
}
