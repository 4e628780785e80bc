//! `tasks.json`: the agent's task queue, and the pure operations on it.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::clock::Timestamp;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct TaskFile {
    pub agent: String,
    pub updated_at: Option<Timestamp>,
    pub tasks: Vec<Task>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Task {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: TaskType,
    pub description: String,
    pub status: TaskStatus,
    pub priority: TaskPriority,
    pub created_at: Option<Timestamp>,
    pub context: Option<String>,
    pub follow_up_from: Option<String>,
    pub completed_at: Option<Timestamp>,
    pub outcome: Option<String>,
    /// Addition: the inbox message this task came from, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_message: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

// The words of a task, in a module of their own that the journal's events
// use too (the journal need not use tasks.rs, which uses the report).
pub use super::words::{TaskPriority, TaskStatus, TaskType};

impl TaskFile {
    pub fn new(agent: &str) -> TaskFile {
        TaskFile {
            agent: agent.to_string(),
            ..TaskFile::default()
        }
    }

    /// The next id in the agent's `task-001`, `task-002`, … sequence: one
    /// past the highest number present, so ids are never reused.
    pub fn next_id(&self) -> String {
        format!("task-{:03}", self.highest_number().saturating_add(1))
    }

    /// The highest number of a `task-N` id (0: none), counting those of
    /// tasks [`compact`](Self::compact) took out ([`LAST_TASK_NUMBER`]).
    pub fn highest_number(&self) -> u64 {
        let recorded = self
            .extra
            .get(LAST_TASK_NUMBER)
            .and_then(Value::as_u64)
            .unwrap_or(0);
        self.tasks
            .iter()
            .filter_map(|t| t.id.strip_prefix("task-")?.parse::<u64>().ok())
            .max()
            .unwrap_or(0)
            .max(recorded)
    }

    /// Take out the tasks finished (completed or dropped) more than `keep`
    /// before `now`: the file stays the size of the agent's current work
    /// over years. Their history stays in the journal (`task_added`,
    /// `task_updated`); the highest id is kept in [`LAST_TASK_NUMBER`], so
    /// no id is handed out again. Returns how many were taken out. Pure.
    pub fn compact(&mut self, now: Timestamp, keep: chrono::Duration) -> usize {
        let Some(cutoff) = now.0.checked_sub_signed(keep) else {
            return 0;
        };
        let highest = self.highest_number();
        let before = self.tasks.len();
        self.tasks.retain(|t| {
            !(matches!(t.status, TaskStatus::Completed | TaskStatus::Dropped)
                && t.completed_at.is_some_and(|at| at.0 < cutoff))
        });
        let removed = before - self.tasks.len();
        if removed > 0 {
            self.extra
                .insert(LAST_TASK_NUMBER.into(), Value::from(highest));
        }
        removed
    }

    pub fn find_mut(&mut self, id: &str) -> Option<&mut Task> {
        self.tasks.iter_mut().find(|t| t.id == id)
    }

    /// The task being worked on: an `active` one (the highest priority,
    /// then the oldest), for `report.json` `current_task`.
    pub fn current(&self) -> Option<&Task> {
        self.tasks
            .iter()
            .filter(|t| t.status == TaskStatus::Active)
            .min_by_key(|t| (t.priority, t.created_at))
    }

    pub fn open_tasks(&self) -> impl Iterator<Item = &Task> {
        self.tasks
            .iter()
            .filter(|t| matches!(t.status, TaskStatus::Pending | TaskStatus::Active))
    }
}

/// tasks.json's addition: the highest task number ever handed out, once
/// finished tasks have been taken out ([`TaskFile::compact`]).
pub const LAST_TASK_NUMBER: &str = "last_task_number";

/// How long a finished task stays in tasks.json.
pub const FINISHED_TASK_KEEP: chrono::Duration = chrono::Duration::days(90);

impl Task {
    /// Apply a status change; a task that is finished gets its completion time.
    pub fn set_status(&mut self, status: TaskStatus, outcome: Option<String>, now: Timestamp) {
        self.status = status;
        if outcome.is_some() {
            self.outcome = outcome;
        }
        match status {
            TaskStatus::Completed | TaskStatus::Dropped => self.completed_at = Some(now),
            TaskStatus::Pending | TaskStatus::Active => self.completed_at = None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_continue_past_the_highest() {
        let mut f = TaskFile::new("rio");
        assert_eq!(f.next_id(), "task-001");
        f.tasks.push(Task {
            id: "task-007".into(),
            ..Task::default()
        });
        f.tasks.push(Task {
            id: "custom".into(),
            ..Task::default()
        });
        assert_eq!(f.next_id(), "task-008");
    }

    #[test]
    fn finished_tasks_leave_after_their_keep_and_ids_are_never_reused() {
        let now = Timestamp::parse("2026-06-01T00:00:00Z").unwrap();
        let ago = |days: i64| {
            Some(Timestamp::from_datetime(
                now.0 - chrono::Duration::days(days),
            ))
        };
        let task = |id: &str, status, completed_at| Task {
            id: id.into(),
            status,
            completed_at,
            ..Task::default()
        };
        let mut f = TaskFile::new("rio");
        f.tasks = vec![
            task("task-001", TaskStatus::Pending, None),
            task("task-002", TaskStatus::Dropped, ago(10)),
            task("task-003", TaskStatus::Completed, ago(91)),
            task("task-004", TaskStatus::Active, None),
            task("task-005", TaskStatus::Completed, ago(400)),
        ];
        assert_eq!(f.compact(now, FINISHED_TASK_KEEP), 2);
        let ids: Vec<&str> = f.tasks.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(ids, ["task-001", "task-002", "task-004"]);
        // task-005 is gone, its number is not.
        assert_eq!(f.next_id(), "task-006");
        assert_eq!(f.compact(now, FINISHED_TASK_KEEP), 0);
        f.tasks.clear();
        assert_eq!(f.next_id(), "task-006");
        let back: TaskFile = serde_json::from_value(serde_json::to_value(&f).unwrap()).unwrap();
        assert_eq!(back.next_id(), "task-006");
        // A number written by hand at the top of u64 is no crash.
        f.extra
            .insert(LAST_TASK_NUMBER.into(), Value::from(u64::MAX));
        assert_eq!(f.next_id(), format!("task-{}", u64::MAX));
    }

    #[test]
    fn unknown_fields_survive() {
        let text = r#"{"agent":"rio","tasks":[{"id":"task-001","description":"x","weight":3}],"owner":"pipeline"}"#;
        let f: TaskFile = serde_json::from_str(text).unwrap();
        let back = serde_json::to_value(&f).unwrap();
        assert_eq!(back["owner"], "pipeline");
        assert_eq!(back["tasks"][0]["weight"], 3);
        assert_eq!(back["tasks"][0]["status"], "pending");
    }
}

use super::AgentDir;
use super::caps::{self, Field};
use super::journal::{Event, TaskAdded, TaskUpdated};
use super::lock::AgentLock;
use crate::error::{Error, Result};

/// A task to add.
#[derive(Debug, Clone, Default)]
pub struct NewTask {
    pub kind: TaskType,
    pub description: String,
    pub priority: TaskPriority,
    pub context: Option<String>,
    pub follow_up_from: Option<String>,
    pub source_message: Option<String>,
}

/// Add a pending task with the next id; journaled. Returns it.
pub fn add(
    dir: &AgentDir,
    lock: &AgentLock,
    new: NewTask,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Result<Task> {
    let mut added = add_all(dir, lock, vec![new], now, notes)?;
    Ok(added.pop().expect("one task in, one out"))
}

/// Add each of `news` as a pending task with the next id, journaled; in
/// one read and one write of tasks.json however many there are (a daemon
/// receiving thousands of task messages reads a large file once, not once
/// per message). Returns the tasks in `news`' order.
pub fn add_all(
    dir: &AgentDir,
    lock: &AgentLock,
    news: Vec<NewTask>,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Result<Vec<Task>> {
    if news.is_empty() {
        return Ok(Vec::new());
    }
    let mut file: TaskFile = dir.load(lock, now, notes)?;
    // A task from a message is added once, whoever adds it first (`send`,
    // or the daemon receiving the message, or a session claiming it): the
    // check is under the lock, so two adders never both add it.
    let mut by_source: std::collections::HashMap<String, usize> = file
        .tasks
        .iter()
        .enumerate()
        .filter_map(|(i, t)| Some((t.source_message.clone()?, i)))
        .collect();
    let mut next = file.highest_number();
    let mut out = Vec::with_capacity(news.len());
    let mut events = Vec::new();
    for new in news {
        if let Some(&i) = new.source_message.as_ref().and_then(|s| by_source.get(s)) {
            out.push(file.tasks[i].clone());
            continue;
        }
        // Saturating: tasks.json is input (a session may write any id).
        next = next.saturating_add(1);
        let task = Task {
            id: format!("task-{next:03}"),
            kind: new.kind,
            description: caps::cap(Field::TaskDescription, new.description),
            status: TaskStatus::Pending,
            priority: new.priority,
            created_at: Some(now),
            context: caps::cap_opt(Field::TaskContext, new.context),
            follow_up_from: new.follow_up_from,
            completed_at: None,
            outcome: None,
            source_message: new.source_message,
            extra: Map::new(),
        };
        if let Some(source) = &task.source_message {
            by_source.insert(source.clone(), file.tasks.len());
        }
        events.push(Event::TaskAdded(TaskAdded {
            task_id: task.id.clone(),
            kind: task.kind,
            description: task.description.clone(),
            priority: task.priority,
            context: task.context.clone(),
            follow_up_from: task.follow_up_from.clone(),
            source_message: task.source_message.clone(),
        }));
        file.tasks.push(task.clone());
        out.push(task);
    }
    if events.is_empty() {
        return Ok(out);
    }
    file.agent = dir.name.to_string();
    commit(dir, lock, &mut file, events, now, notes)?;
    Ok(out)
}

/// Writes `file` as tasks.json with its `events` journaled between its
/// staging and its rename (the journal first, for readers), then
/// report.json's current task.
fn commit(
    dir: &AgentDir,
    lock: &AgentLock,
    file: &mut TaskFile,
    events: Vec<Event>,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Result<()> {
    file.updated_at = Some(now);
    file.compact(now, FINISHED_TASK_KEEP);
    let staged = dir.stage(lock, file)?;
    for event in events {
        dir.journal_append(lock, now, event)?;
    }
    staged.commit()?;
    sync_current_task(dir, lock, file, now, notes)
}

/// `report.json` `current_task` (the active task's description) and
/// `current_task_id` (an addition: its id) as `file` has them now: null
/// only when no task is active. Call with the agent lock held.
pub fn sync_current_task(
    dir: &AgentDir,
    lock: &AgentLock,
    file: &TaskFile,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Result<()> {
    let current = file.current();
    let mut report: super::report::Report = dir.load(lock, now, notes)?;
    let id = current.map(|t| Value::String(t.id.clone()));
    let text = current.map(|t| t.description.clone());
    if report.current_task == text && report.extra.get(CURRENT_TASK_ID) == id.as_ref() {
        return Ok(());
    }
    report.current_task = text;
    match id {
        Some(id) => {
            report.extra.insert(CURRENT_TASK_ID.into(), id);
        }
        None => {
            report.extra.remove(CURRENT_TASK_ID);
        }
    }
    report.updated_at = Some(now);
    dir.save(lock, &report)
}

/// report.json's addition beside `current_task`: the active task's id.
pub const CURRENT_TASK_ID: &str = "current_task_id";

/// Change a task's status; journaled. Returns the task as it is now.
pub fn update(
    dir: &AgentDir,
    lock: &AgentLock,
    id: &str,
    status: TaskStatus,
    outcome: Option<String>,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Result<Task> {
    let mut updated = update_all(dir, lock, &[id], status, outcome, now, notes)?;
    Ok(updated.pop().expect("one id in, one task out"))
}

/// Change the status of each task of `ids`, journaled, in one read and
/// one write of tasks.json. An unknown id changes nothing and is an error
/// naming the known ones. Returns the tasks as they are now.
pub fn update_all(
    dir: &AgentDir,
    lock: &AgentLock,
    ids: &[&str],
    status: TaskStatus,
    outcome: Option<String>,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Result<Vec<Task>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let outcome = caps::cap_opt(Field::TaskOutcome, outcome);
    let mut file: TaskFile = dir.load(lock, now, notes)?;
    let known: Vec<String> = file.tasks.iter().map(|t| t.id.clone()).collect();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let Some(task) = file.find_mut(id) else {
            return Err(Error::NotFound(format!(
                "{}: no task `{id}` in {}; known tasks: {}",
                dir.name,
                dir.tasks().display(),
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )));
        };
        task.set_status(status, outcome.clone(), now);
        out.push(task.clone());
    }
    let events = ids
        .iter()
        .map(|id| {
            Event::TaskUpdated(TaskUpdated {
                task_id: id.to_string(),
                status,
                outcome: outcome.clone(),
            })
        })
        .collect();
    commit(dir, lock, &mut file, events, now, notes)?;
    Ok(out)
}
