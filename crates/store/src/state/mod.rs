//! The on-disk state of every agent: the layout (paths), the typed file
//! shapes, and the only ways they are written.
//!
//! Layout (see DESIGN.md, "On-disk layout"):
//!
//! ```text
//! {state_root}/.daemon/            daemon-wide files
//! {state_root}/.shared/rules/*.md  rules prepended to every prompt
//! {state_root}/{agent}/            report.json tasks.json session.json memory.md
//!                                  journal.jsonl metrics.json inbox/ sessions/ .lock
//! ```
//!
//! Every JSON file is written through [`atomic`], every journal line through
//! [`journal`], and every read-modify-write happens under [`lock`].

pub mod atomic;
pub mod bootstrap;
pub mod caps;
pub mod counters;
pub mod error_log;
pub mod journal;
pub mod lock;
pub mod memory;
pub mod metrics;
pub mod modes;
pub mod prune;
pub mod rebuild;
pub mod replaced;
pub mod report;
pub mod rotation;
pub mod session;
pub mod store;
pub mod tasks;
pub mod words;

pub use store::Store;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::agent_name::AgentName;
use crate::error::{Error, Result};

/// Mode of state files: readable by pipelines and humans, written by us.
pub const STATE_FILE_MODE: u32 = 0o644;

/// The root of all agents' state.
#[derive(Debug, Clone)]
pub struct StateRoot {
    pub path: PathBuf,
    /// How long a lock below this root is waited for (its agents' and
    /// `.daemon/counters.lock`): [`lock::CLI_WAIT`], or what the daemon
    /// sets with [`StateRoot::with_lock_wait`].
    pub lock_wait: Duration,
    /// What its writes do on a full disk and whether its repairs are
    /// recorded ([`Store`]; the default, as the CLI wants, does neither).
    pub store: Store,
    /// What a long-lived process keeps of `.daemon/counters.json` between
    /// sessions ([`counters::Kept`]; off unless [`StateRoot::keeping_counters`]).
    pub counters: counters::Kept,
}

impl StateRoot {
    /// The root at `path`, resolved once ([`crate::fsx::trusted`]): the
    /// operator's path may pass through links; nothing below it may.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        StateRoot {
            path: crate::fsx::trusted(&path.into()),
            lock_wait: lock::CLI_WAIT,
            store: Store::default(),
            counters: counters::Kept::default(),
        }
    }

    /// This root, keeping what it last wrote to `.daemon/counters.json` so
    /// that the next instance id neither reads nor serializes the whole file
    /// again while nobody else wrote it: for the daemon, which takes one for
    /// every session. Its clones share what is kept.
    pub fn keeping_counters(mut self) -> Self {
        self.counters = counters::Kept::on();
        self
    }

    /// This root, its writes and reads going through `store`.
    pub fn with_store(mut self, store: Store) -> Self {
        self.store = store;
        self
    }

    /// This root, its locks waited for at most `wait`.
    pub fn with_lock_wait(mut self, wait: Duration) -> Self {
        self.lock_wait = wait;
        self
    }

    pub fn agent(&self, name: &AgentName) -> AgentDir {
        AgentDir {
            name: name.clone(),
            path: self.path.join(name.as_str()),
            lock_wait: self.lock_wait,
            store: self.store.clone(),
        }
    }

    pub fn daemon_dir(&self) -> PathBuf {
        self.path.join(".daemon")
    }

    pub fn shared_rules_dir(&self) -> PathBuf {
        self.path.join(".shared").join("rules")
    }
}

/// One agent's directory and the paths inside it.
#[derive(Debug, Clone)]
pub struct AgentDir {
    pub name: AgentName,
    pub path: PathBuf,
    /// How long [`AgentDir::lock`] waits: its root's.
    pub lock_wait: Duration,
    /// Its root's [`Store`].
    pub store: Store,
}

impl AgentDir {
    /// This agent's directory, its lock waited for at most `wait`.
    pub fn with_lock_wait(mut self, wait: Duration) -> Self {
        self.lock_wait = wait;
        self
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
    pub fn report(&self) -> PathBuf {
        self.file("report.json")
    }
    pub fn tasks(&self) -> PathBuf {
        self.file("tasks.json")
    }
    pub fn session(&self) -> PathBuf {
        self.file("session.json")
    }
    pub fn memory(&self) -> PathBuf {
        self.file("memory.md")
    }
    pub fn journal(&self) -> PathBuf {
        self.file("journal.jsonl")
    }
    pub fn metrics(&self) -> PathBuf {
        self.file("metrics.json")
    }
    pub fn lock_file(&self) -> PathBuf {
        self.file(".lock")
    }
    pub fn inbox(&self) -> PathBuf {
        self.file("inbox")
    }
    pub fn inbox_tmp(&self) -> PathBuf {
        self.inbox().join(".tmp")
    }
    pub fn claimed_root(&self) -> PathBuf {
        self.inbox().join(".claimed")
    }
    pub fn claimed(&self, session_id: &str) -> PathBuf {
        self.claimed_root().join(session_id)
    }
    pub fn processed(&self) -> PathBuf {
        self.inbox().join("processed")
    }
    pub fn rejected(&self) -> PathBuf {
        self.inbox().join("rejected")
    }
    pub fn sessions_dir(&self) -> PathBuf {
        self.file("sessions")
    }

    /// Fail with a message that says how to fix it when the agent was never
    /// bootstrapped (rather than an ENOENT on some inner file).
    /// A link or a file in the directory's place is refused, not followed.
    pub fn require(&self) -> Result<()> {
        match crate::fsx::open_dir(&self.path)? {
            Some(_) => Ok(()),
            None => Err(Error::NotBootstrapped {
                agent: self.name.to_string(),
                path: self.path.clone(),
            }),
        }
    }

    /// The agent's state files (report, tasks, session, metrics, memory,
    /// journal).
    pub fn state_files(&self) -> [PathBuf; 6] {
        [
            self.report(),
            self.tasks(),
            self.session(),
            self.metrics(),
            self.memory(),
            self.journal(),
        ]
    }

    /// Every directory a working agent needs, in creation order.
    pub fn directories(&self) -> Vec<PathBuf> {
        vec![
            self.path.clone(),
            self.inbox(),
            self.inbox_tmp(),
            self.claimed_root(),
            self.processed(),
            self.rejected(),
            self.sessions_dir(),
        ]
    }
}

/// The name of a set-aside copy: `report.json.corrupt-20260331T220000Z`.
pub fn set_aside_name(path: &Path, label: &str, stamp: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{label}-{stamp}"));
    let candidate = path.with_file_name(&name);
    if !crate::fsx::exists(&candidate) {
        return candidate;
    }
    (2..)
        .map(|n| {
            let mut n_name = name.clone();
            n_name.push(format!("-{n}"));
            path.with_file_name(n_name)
        })
        .find(|p| !crate::fsx::exists(p))
        .expect("an unused name")
}

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::clock::Timestamp;
use lock::AgentLock;
use rebuild::StateFileKind;

/// Where a loaded state document came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    File,
    /// The file did not exist: lazy defaults.
    Default,
    /// The file was corrupt, set aside, and rebuilt from the journal.
    RebuiltFromJournal,
}

/// A JSON state file of an agent.
pub trait StateDoc: Serialize + DeserializeOwned {
    const KIND: StateFileKind;
    /// The document for an agent that has none yet (lazy defaults).
    fn fresh(agent: &str) -> Self;
}

impl StateDoc for report::Report {
    const KIND: StateFileKind = StateFileKind::Report;
    fn fresh(agent: &str) -> Self {
        report::Report::new(agent)
    }
}

impl StateDoc for tasks::TaskFile {
    const KIND: StateFileKind = StateFileKind::Tasks;
    fn fresh(agent: &str) -> Self {
        tasks::TaskFile::new(agent)
    }
}

impl StateDoc for session::Session {
    const KIND: StateFileKind = StateFileKind::Session;
    fn fresh(agent: &str) -> Self {
        session::Session {
            agent: agent.to_string(),
            ..session::Session::default()
        }
    }
}

impl StateDoc for metrics::Metrics {
    const KIND: StateFileKind = StateFileKind::Metrics;
    fn fresh(agent: &str) -> Self {
        metrics::Metrics::new(agent)
    }
}

impl AgentDir {
    /// Read a state document without the lock (a consistent snapshot, thanks
    /// to atomic replacement). `None` if the file does not exist.
    pub fn read<T: StateDoc>(&self) -> Result<Option<T>> {
        atomic::read_json(&self.file(T::KIND.file_name()))
    }

    /// Read a state document for display or a prompt: like [`read`](Self::read),
    /// but a corrupt file is set aside and rebuilt (under the lock) rather
    /// than failing the reader; a missing one reads as its lazy default.
    /// A user who may not write the agent's directory (a reader of the
    /// state, not its owner) gets the document rebuilt in memory, said on
    /// stderr, and nothing is written, locked or created.
    pub fn read_or_repair<T: StateDoc>(&self, now: Timestamp) -> Result<T> {
        match self.read::<T>() {
            Ok(Some(doc)) => Ok(doc),
            Ok(None) => Ok(T::fresh(self.name.as_str())),
            Err(e @ Error::Corrupt { .. }) if !self.writable() => {
                eprintln!(
                    "agent-state: warning: {e}; shown as rebuilt from the journal, not repaired (this user may not write {})",
                    self.path.display()
                );
                self.rebuilt_in_memory(now)
            }
            Err(Error::Corrupt { .. }) => {
                let lock = self.lock()?;
                let mut notes = Vec::new();
                self.load(&lock, now, &mut notes)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether this user may create and replace files in the directory.
    fn writable(&self) -> bool {
        nix::unistd::access(&self.path, nix::unistd::AccessFlags::W_OK).is_ok()
    }

    /// A state document rebuilt from the journal, written nowhere.
    fn rebuilt_in_memory<T: StateDoc>(&self, now: Timestamp) -> Result<T> {
        let scan = journal::read(&self.store, &self.journal())?;
        let entries = scan.entries;
        let name = self.name.as_str();
        let value = match T::KIND {
            StateFileKind::Report => {
                serde_json::to_value(rebuild::report_from_journal(name, &entries))
            }
            StateFileKind::Tasks => {
                serde_json::to_value(rebuild::tasks_from_journal(name, &entries, &scan.carried))
            }
            StateFileKind::Metrics => {
                serde_json::to_value(rebuild::metrics_from_journal(name, &entries, now))
            }
            StateFileKind::Session => match rebuild::session_from_journal(name, &entries) {
                Some(s) => serde_json::to_value(s),
                None => return Ok(T::fresh(name)),
            },
        };
        value
            .and_then(serde_json::from_value)
            .map_err(|e| Error::Data(format!("{name}: rebuilding from the journal: {e}")))
    }

    /// Read a state document for a read-modify-write. A missing file reads as
    /// its lazy default; a corrupt one is set aside and rebuilt from the
    /// journal (said in `notes`), so one bad file never stops a hook.
    pub fn load<T: StateDoc>(
        &self,
        lock: &AgentLock,
        now: Timestamp,
        notes: &mut Vec<String>,
    ) -> Result<T> {
        self.load_with_origin(lock, now, notes).map(|(doc, _)| doc)
    }

    /// [`AgentDir::load`], also saying where the document came from: a
    /// caller that has already journaled an event must not count it again
    /// into a document rebuilt from that journal.
    pub fn load_with_origin<T: StateDoc>(
        &self,
        _lock: &AgentLock,
        now: Timestamp,
        notes: &mut Vec<String>,
    ) -> Result<(T, Origin)> {
        let path = self.file(T::KIND.file_name());
        let (doc, origin) = match atomic::read_json::<T>(&path) {
            Err(Error::Corrupt { .. }) => {
                let note = rebuild::repair(self, T::KIND, now)?;
                self.store.note_repair(self.name.as_str(), &note);
                notes.push(note);
                (atomic::read_json::<T>(&path)?, Origin::RebuiltFromJournal)
            }
            Ok(Some(doc)) => (Some(doc), Origin::File),
            Ok(None) => (None, Origin::Default),
            Err(e) => return Err(e),
        };
        Ok((doc.unwrap_or_else(|| T::fresh(self.name.as_str())), origin))
    }

    /// Replace a state document (atomically, durably).
    pub fn save<T: StateDoc>(&self, _lock: &AgentLock, doc: &T) -> Result<()> {
        atomic::write_json(&self.store, &self.file(T::KIND.file_name()), doc)
    }

    /// Read-modify-write one document under the agent's lock: `f` changes
    /// it, and it is written only if that changed anything. Returns whether
    /// it was written. (Repair notes of a corrupt file are not returned.)
    pub fn update<T: StateDoc>(&self, now: Timestamp, f: impl FnOnce(&mut T)) -> Result<bool> {
        let lock = self.lock()?;
        let mut notes = Vec::new();
        let mut doc: T = self.load(&lock, now, &mut notes)?;
        let before = serde_json::to_value(&doc).ok();
        f(&mut doc);
        if serde_json::to_value(&doc).ok() == before {
            return Ok(false);
        }
        self.save(&lock, &doc)?;
        Ok(true)
    }

    /// Write a state document's replacement (fsynced) without renaming it
    /// in yet: stage, append the journal line, then commit, so a failure to
    /// write the file (a full disk) leaves no journal event behind it.
    pub fn stage<T: StateDoc>(&self, _lock: &AgentLock, doc: &T) -> Result<atomic::Staged> {
        atomic::stage_json(&self.store, &self.file(T::KIND.file_name()), doc)
    }

    /// Take this agent's lock, waiting at most its `lock_wait`.
    pub fn lock(&self) -> Result<AgentLock> {
        self.lock_within(self.lock_wait)
    }

    /// Take this agent's lock, waiting at most `bound`.
    pub fn lock_within(&self, bound: Duration) -> Result<AgentLock> {
        self.require()?;
        lock::lock_within(self, bound)
    }

    /// Rotate this agent's journal if it holds more than `max` bytes
    /// ([`rotation`]). The new live file's marker carries the highest task
    /// number handed out so far (the highest of tasks.json's, the previous
    /// marker's and the rotated part's `task_added` events), so a
    /// tasks.json rebuilt after retention removed the oldest segments never
    /// hands out an id again.
    pub fn rotate_journal(
        &self,
        _lock: &AgentLock,
        max: u64,
        now: Timestamp,
    ) -> Result<Option<rotation::Rotated>> {
        let journal = self.journal();
        rotation::rotate_carrying(&self.store, &journal, max, now, |head| {
            // A tasks.json that cannot be read now counts as none: the
            // previous marker's number and the journal's are still carried.
            let tasks =
                atomic::read_json::<tasks::TaskFile>(&self.file(StateFileKind::Tasks.file_name()))
                    .ok()
                    .flatten()
                    .map_or(0, |t| t.highest_number());
            let before = head
                .and_then(|m| m.carried.get(tasks::LAST_TASK_NUMBER))
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0);
            let highest = before
                .max(tasks)
                .max(journal::highest_task_added(&journal)?);
            // Only the number: whatever else a marker line holds (a hand
            // edit) is not copied into every later marker.
            let mut carried = serde_json::Map::new();
            if highest > 0 {
                carried.insert(tasks::LAST_TASK_NUMBER.into(), highest.into());
            }
            Ok(carried)
        })
    }

    /// Append to this agent's journal.
    pub fn journal_append(
        &self,
        _lock: &AgentLock,
        now: Timestamp,
        event: journal::Event,
    ) -> Result<journal::Entry> {
        let entry = journal::Entry::new(now, event);
        journal::append(&self.store, &self.journal(), &entry)?;
        Ok(entry)
    }

    /// Append `events` to this agent's journal in one write (none: nothing):
    /// a crash keeps all of them or none but a torn last line.
    pub fn journal_append_all(
        &self,
        _lock: &AgentLock,
        now: Timestamp,
        events: &[journal::Event],
    ) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        let mut lines = Vec::new();
        for e in events {
            lines.extend_from_slice(&journal::Entry::new(now, e.clone()).to_line());
        }
        journal::append_lines(&self.store, &self.journal(), &lines)
    }
}

#[cfg(test)]
mod rotate_journal_tests {
    use super::*;
    use journal::{Event, TaskAdded};
    use tasks::TaskFile;

    fn agent(dir: &tempfile::TempDir) -> AgentDir {
        let a = StateRoot::new(dir.path()).agent(&AgentName::parse("rio").unwrap());
        for d in a.directories() {
            std::fs::create_dir_all(d).unwrap();
        }
        a
    }

    /// What the live journal's marker carries as the last task number.
    fn carried(a: &AgentDir) -> Option<u64> {
        let file = std::fs::File::open(a.journal()).unwrap();
        rotation::head_marker(&file).unwrap()?.carried[tasks::LAST_TASK_NUMBER].as_u64()
    }

    /// Each rotation carries the highest task number of tasks.json or of
    /// the previous marker, whichever is higher (tasks.json gone, damaged
    /// or compacted included); a rebuild from the live file alone starts
    /// past it.
    #[test]
    fn each_rotation_carries_the_highest_task_number_forward() {
        let dir = tempfile::tempdir().unwrap();
        let a = agent(&dir);
        let now = Timestamp::parse("2026-11-28T10:00:00Z").unwrap();
        let lock = a.lock().unwrap();
        let add = |n: u64| {
            let mut tasks: TaskFile = a.load(&lock, now, &mut Vec::new()).unwrap();
            let id = tasks.next_id();
            assert_eq!(id, format!("task-{n:03}"));
            tasks.tasks.push(tasks::Task {
                id: id.clone(),
                ..Default::default()
            });
            a.save(&lock, &tasks).unwrap();
            let event = Event::TaskAdded(TaskAdded {
                task_id: id,
                kind: Default::default(),
                description: "d".into(),
                priority: Default::default(),
                context: None,
                follow_up_from: None,
                source_message: None,
            });
            a.journal_append(&lock, now, event).unwrap();
        };
        let tasks_path = a.file("tasks.json");
        // (tasks added before, what happens to tasks.json, carried after)
        let table: &[(u64, &str, Option<u64>)] = &[
            (3, "kept", Some(3)),
            (2, "removed", Some(5)),
            (0, "removed", Some(5)),
            (0, "damaged", Some(5)),
        ];
        let mut added = 0;
        for &(n, then, want) in table {
            for _ in 0..n {
                added += 1;
                add(added);
            }
            match then {
                "removed" => {
                    let _ = std::fs::remove_file(&tasks_path);
                }
                "damaged" => std::fs::write(&tasks_path, "{").unwrap(),
                _ => {}
            }
            assert!(a.rotate_journal(&lock, 1, now).unwrap().is_some());
            assert_eq!(carried(&a), want, "after {n} added, tasks.json {then}");
        }
        // tasks.json damaged, the segments gone: the rebuild starts past 5.
        for segment in rotation::segments(&a.journal(), u64::MAX).unwrap() {
            std::fs::remove_file(segment.path).unwrap();
        }
        let rebuilt: TaskFile = a.load(&lock, now, &mut Vec::new()).unwrap();
        assert_eq!(rebuilt.next_id(), "task-006");
    }
}
