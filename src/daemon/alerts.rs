//! Raising errors: the one path every error of the daemon takes.
//!
//! [`Alerts::raise`] appends the record to `.daemon/errors.jsonl`, logs it
//! (to journald with `ERROR_CODE` and a priority that follows the severity,
//! else to stderr), runs the on-error hook for medium and higher severities,
//! and, when asked, escalates it to the human mailbox as an inbox message.
//! None of it can fail the caller: a record that cannot be written is still
//! logged, a hook that fails is itself logged as `HOOK_FAILED`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::sync::Semaphore;

use super::logging;
use crate::agent_name::AgentName;
use crate::catalogue::{self, Code, ErrorRecord, Severity};
use crate::config::Config;
use crate::inbox::{self, MessageType, Outgoing, Priority};
use crate::state::StateRoot;
use crate::state::error_log::{self, ErrorFormat};

/// Hooks running at once; more wait their turn.
const HOOKS_AT_ONCE: usize = 4;
/// Hooks waiting beyond this are dropped (and logged): an error storm must
/// not become a process storm.
const HOOKS_QUEUED_MAX: usize = 64;
/// What of a failing hook's output goes into the `HOOK_FAILED` record.
const HOOK_OUTPUT_KEPT: usize = 2048;

#[derive(Clone)]
pub struct Alerts {
    inner: Arc<Inner>,
}

struct Inner {
    root: StateRoot,
    log: PathBuf,
    hook: Option<PathBuf>,
    hook_timeout: Duration,
    format: ErrorFormat,
    escalate_to: Option<AgentName>,
    hooks_running: Semaphore,
    hooks_queued: AtomicUsize,
    /// Records that could not be appended (disk full, read-only): written
    /// first at the next chance, so an outage does not lose its own record.
    unwritten: std::sync::Mutex<std::collections::VecDeque<ErrorRecord>>,
}

/// Records kept while errors.jsonl cannot be written; older ones are dropped.
const UNWRITTEN_MAX: usize = 1000;

impl Alerts {
    /// The alerts of `config`, written through `store` (the daemon's).
    pub fn new(config: &Config, store: &crate::state::Store) -> Alerts {
        let root = StateRoot::new(&config.state_root)
            .with_lock_wait(crate::state::lock::DAEMON_WAIT)
            .with_store(store.clone());
        Alerts {
            inner: Arc::new(Inner {
                log: error_log::log_path(&root),
                root,
                hook: config.hooks.on_error.clone(),
                hook_timeout: config.hooks.timeout,
                format: config.hooks.format,
                escalate_to: config.hooks.escalate_to.clone(),
                hooks_running: Semaphore::new(HOOKS_AT_ONCE),
                hooks_queued: AtomicUsize::new(0),
                unwritten: Default::default(),
            }),
        }
    }

    /// The human mailbox escalations go to, if any.
    pub fn escalate_to(&self) -> Option<&AgentName> {
        self.inner.escalate_to.as_ref()
    }

    /// Record, log, hook; escalate if `escalate`. Must be called within the
    /// daemon's tokio runtime (the hook runs as a task).
    pub fn raise(&self, mut record: ErrorRecord, escalate: bool) {
        // Stamped by the loop (`Daemon::raise`) with its turn's time; a
        // failed hook's record by its task (the record's time plus how long
        // the hook ran: no wall clock below the loop).
        if escalate {
            record.escalated = self.escalate(&record);
        }
        self.write(&record);
        log(&record);
        let is_hook_failure = record.code == Code::HookFailed.as_str();
        if record.severity >= Severity::Medium && !is_hook_failure {
            self.run_hook(record);
        }
    }

    /// Append `record` after any that are waiting; keep it if that fails.
    fn write(&self, record: &ErrorRecord) {
        let Ok(mut waiting) = self.inner.unwritten.lock() else {
            return;
        };
        waiting.push_back(record.clone());
        while let Some(first) = waiting.front() {
            match error_log::append_as(
                &self.inner.root.store,
                &self.inner.log,
                first,
                self.inner.format,
            ) {
                Ok(()) => {
                    waiting.pop_front();
                }
                Err(e) => {
                    if waiting.len() == 1 {
                        tracing::error!(
                            error_code = e.code().as_str(),
                            "cannot append to {} (kept in memory, written when possible): {e}",
                            self.inner.log.display()
                        );
                    }
                    while waiting.len() > UNWRITTEN_MAX {
                        waiting.pop_front();
                    }
                    return;
                }
            }
        }
    }

    /// Take over the records `old` could not write yet (a reload replaces
    /// the Alerts with the new config's).
    pub fn adopt(&self, old: &Alerts) {
        let taken = old
            .inner
            .unwritten
            .lock()
            .map(|mut w| std::mem::take(&mut *w))
            .unwrap_or_default();
        if let Ok(mut mine) = self.inner.unwritten.lock() {
            mine.extend(taken);
        }
    }

    /// Write records kept while errors.jsonl could not be written.
    pub fn flush(&self) {
        let Ok(mut waiting) = self.inner.unwritten.lock() else {
            return;
        };
        while let Some(first) = waiting.front() {
            if error_log::append_as(
                &self.inner.root.store,
                &self.inner.log,
                first,
                self.inner.format,
            )
            .is_err()
            {
                return;
            }
            waiting.pop_front();
        }
    }

    /// Deliver the error to the human mailbox. Returns whether it arrived.
    fn escalate(&self, record: &ErrorRecord) -> bool {
        let Some(to) = &self.inner.escalate_to else {
            return false;
        };
        let from = record
            .context
            .agent
            .as_deref()
            .and_then(|a| AgentName::parse(a).ok())
            .or_else(|| AgentName::parse("agent-state").ok());
        let Some(from) = from else { return false };
        let subject = format!("[{}] {}", record.code, record.message);
        let mut body = format!(
            "agent-state escalates an error ({} severity).\n\n{}\n",
            record.severity, record.message
        );
        if let Some(details) = &record.details {
            body.push_str(&format!("\nDetails: {details}\n"));
        }
        if let Some(agent) = &record.context.agent {
            body.push_str(&format!("\nAgent: {agent}"));
            if let Some(s) = &record.context.session {
                body.push_str(&format!(", session {s}"));
            }
            if let Some(a) = record.context.attempt {
                body.push_str(&format!(", attempt {a}"));
            }
            body.push('\n');
        }
        if !record.suggestions.is_empty() {
            body.push_str("\nWhat to do:\n");
            for s in &record.suggestions {
                body.push_str(&format!("- {s}\n"));
            }
        }
        if let Some(agent) = &record.context.agent {
            match &record.context.session {
                Some(s) => body.push_str(&format!(
                    "\nAnswer with `agent-state send --from {to} --to {agent} --source-ref {} ...` (a reply to this session: with `resume`, the session it wakes continues this one's conversation); `agent-state wake {agent}` runs a session now.\n",
                    reply_ref(s)
                )),
                None => body.push_str(&format!(
                    "\nAnswer with `agent-state send --from {to} --to {agent} ...`; `agent-state wake {agent}` runs a session now.\n"
                )),
            }
        }
        let out = Outgoing {
            from,
            kind: MessageType::Flag,
            priority: Priority::High,
            subject,
            body,
            source_ref: Some(match &record.context.session {
                Some(s) => reply_ref(s),
                None => format!("agent-state/errors/{}", record.code),
            }),
            expires_at: None,
        };
        let dir = self.inner.root.agent(to);
        match inbox::deliver(&dir, &out, record.ts) {
            Ok(_) => true,
            Err(e) => {
                let failed = ErrorRecord::new(
                    Code::EscalationFailed,
                    format!("cannot escalate {} to {to}'s inbox", record.code),
                )
                .at(record.ts)
                .details(format!("{e}; the escalation said: {}", record.message));
                self.write(&failed);
                log(&failed);
                false
            }
        }
    }

    fn run_hook(&self, record: ErrorRecord) {
        let Some(hook) = self.inner.hook.clone() else {
            return;
        };
        if self.inner.hooks_queued.fetch_add(1, Ordering::SeqCst) >= HOOKS_QUEUED_MAX {
            self.inner.hooks_queued.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(
                error_code = "HOOK_FAILED",
                "{HOOKS_QUEUED_MAX} on-error hooks already waiting; not running it for {}",
                record.code
            );
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let permit = this.inner.hooks_running.acquire().await;
            this.inner.hooks_queued.fetch_sub(1, Ordering::SeqCst);
            let env = hook_env(&record, this.inner.format, &this.inner.root);
            let outcome = run_hook(&hook, &env, this.inner.hook_timeout).await;
            drop(permit);
            if let Err(why) = outcome {
                let mut failed = ErrorRecord::new(
                    Code::HookFailed,
                    format!(
                        "the on-error hook {} failed for {}",
                        hook.display(),
                        record.code
                    ),
                )
                .details(why.to_string());
                failed.context = record.context.clone();
                failed.stamp(record.ts.plus(started.elapsed()));
                this.raise(failed, false);
            }
        });
    }
}

/// The on-error hook's environment for `record`: `AGENT_STATE_ERROR_*`
/// always (a hook written for them keeps working when the format changes),
/// and in the seed's format seed 002's `AXIOM_ERROR_*` as well (the task is
/// the session).
pub fn hook_env(
    record: &ErrorRecord,
    format: ErrorFormat,
    root: &StateRoot,
) -> Vec<(&'static str, String)> {
    let opt = |v: &Option<String>| v.clone().unwrap_or_default();
    let attempt = record
        .context
        .attempt
        .map(|a| a.to_string())
        .unwrap_or_default();
    let mut env = vec![
        ("AGENT_STATE_ERROR_CODE", record.code.clone()),
        ("AGENT_STATE_ERROR_MESSAGE", record.message.clone()),
        ("AGENT_STATE_ERROR_DETAILS", opt(&record.details)),
        (
            "AGENT_STATE_ERROR_SEVERITY",
            record.severity.as_str().into(),
        ),
        ("AGENT_STATE_ERROR_AGENT", opt(&record.context.agent)),
        ("AGENT_STATE_ERROR_SESSION", opt(&record.context.session)),
        ("AGENT_STATE_ERROR_ATTEMPT", attempt.clone()),
        ("AGENT_STATE_ERROR_TS", record.ts.to_string()),
        (
            "AGENT_STATE_ERROR_ESCALATED",
            if record.escalated { "1" } else { "0" }.into(),
        ),
        ("AGENT_STATE_ROOT", root.path.display().to_string()),
    ];
    if format == ErrorFormat::Seed {
        env.extend([
            ("AXIOM_ERROR_CODE", record.code.clone()),
            ("AXIOM_ERROR_MESSAGE", record.message.clone()),
            ("AXIOM_ERROR_AGENT", opt(&record.context.agent)),
            ("AXIOM_ERROR_TASK", opt(&record.context.session)),
            ("AXIOM_ERROR_SEVERITY", record.severity.as_str().into()),
            ("AXIOM_ERROR_DETAILS", opt(&record.details)),
            (
                "AXIOM_ERROR_RECOVERABLE",
                if record.recoverable { "true" } else { "false" }.into(),
            ),
            ("AXIOM_ERROR_ATTEMPT", attempt),
        ]);
    }
    env
}

/// Why the on-error hook failed: the details of its `HOOK_FAILED` record.
#[derive(Debug, thiserror::Error)]
enum HookFailure {
    #[error("cannot run {}: {error}", hook.display())]
    Spawn {
        hook: PathBuf,
        error: std::io::Error,
    },
    #[error("ran longer than hooks.timeout ({}); killed", humantime::format_duration(*.0))]
    Timeout(Duration),
    #[error("waiting for it: {0}")]
    Wait(std::io::Error),
    /// Its exit status, and what it printed (cut to `HOOK_OUTPUT_KEPT`).
    #[error("{status}{}", if printed.is_empty() { String::new() } else { format!("; it printed: {printed}") })]
    Exited {
        status: std::process::ExitStatus,
        printed: String,
    },
}

/// Run the hook once; `Err` says why it failed.
async fn run_hook(
    hook: &std::path::Path,
    env: &[(&'static str, String)],
    limit: Duration,
) -> Result<(), HookFailure> {
    let mut cmd = tokio::process::Command::new(hook);
    cmd.envs(env.iter().map(|(k, v)| (k, v)))
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|error| HookFailure::Spawn {
        hook: hook.to_path_buf(),
        error,
    })?;
    let pid = child.id();
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let collect = async {
        let mut out = Vec::new();
        let mut err = Vec::new();
        let read_out = async {
            if let Some(s) = &mut stdout {
                let _ = s.read_to_end(&mut out).await;
            }
        };
        let read_err = async {
            if let Some(s) = &mut stderr {
                let _ = s.read_to_end(&mut err).await;
            }
        };
        tokio::join!(read_out, read_err);
        let status = child.wait().await;
        out.extend_from_slice(&err);
        (status, out)
    };
    match tokio::time::timeout(limit, collect).await {
        Err(_) => {
            if let Some(pid) = pid {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            Err(HookFailure::Timeout(limit))
        }
        Ok((Err(e), _)) => Err(HookFailure::Wait(e)),
        Ok((Ok(status), output)) if !status.success() => {
            let mut text = String::from_utf8_lossy(&output).trim().to_string();
            catalogue::truncate_on_char(&mut text, HOOK_OUTPUT_KEPT);
            Err(HookFailure::Exited {
                status,
                printed: text,
            })
        }
        Ok(_) => Ok(()),
    }
}

/// Log a record: to journald with its own priority, else through tracing at
/// the level closest to its severity.
pub fn log(record: &ErrorRecord) {
    let mut message = format!("{}: {}", record.code, record.message);
    if let Some(d) = &record.details {
        message.push_str(&format!(" ({d})"));
    }
    let priority = record.severity.journal_priority().to_string();
    let attempt = record
        .context
        .attempt
        .map(|a| a.to_string())
        .unwrap_or_default();
    let mut fields: Vec<(&str, &str)> = vec![
        ("MESSAGE", &message),
        ("PRIORITY", &priority),
        ("ERROR_CODE", &record.code),
        ("SEVERITY", record.severity.as_str()),
    ];
    if let Some(a) = &record.context.agent {
        fields.push(("AGENT", a));
    }
    if let Some(s) = &record.context.session {
        fields.push(("SESSION_ID", s));
    }
    if !attempt.is_empty() {
        fields.push(("ATTEMPT", &attempt));
    }
    if logging::journal_send(&fields) {
        return;
    }
    let agent = record.context.agent.as_deref().unwrap_or("-");
    match record.severity {
        Severity::Critical | Severity::High => {
            tracing::error!(error_code = %record.code, agent, "{message}")
        }
        Severity::Medium => tracing::warn!(error_code = %record.code, agent, "{message}"),
        Severity::Low => tracing::info!(error_code = %record.code, agent, "{message}"),
    }
}

/// Which (agent, code) pairs were escalated in the current failure streak:
/// the same problem is escalated once, not at every retry or wake. Kept in
/// `.daemon/escalated.json`, so a restart does not escalate it again.
#[derive(Debug, Default)]
pub struct EscalationMemory {
    sent: BTreeSet<(String, String)>,
    path: Option<PathBuf>,
    store: crate::state::Store,
}

impl EscalationMemory {
    /// The memory kept in `.daemon/escalated.json` (empty if missing or
    /// unreadable: at worst a problem is escalated once more).
    pub fn load(root: &StateRoot) -> EscalationMemory {
        let path = root.daemon_dir().join("escalated.json");
        let sent = crate::fsx::read(&path)
            .ok()
            .flatten()
            .and_then(|b| serde_json::from_slice::<Vec<(String, String)>>(&b).ok())
            .unwrap_or_default()
            .into_iter()
            .collect();
        EscalationMemory {
            sent,
            path: Some(path),
            store: root.store.clone(),
        }
    }

    /// True the first time for this pair (until [`clear`](Self::clear)).
    pub fn first(&mut self, agent: Option<&AgentName>, code: Code) -> bool {
        let key = (
            agent.map(|a| a.to_string()).unwrap_or_default(),
            code.as_str().to_string(),
        );
        let first = self.sent.insert(key);
        if first {
            self.save();
        }
        first
    }

    /// The agent succeeded (or the condition cleared): escalate anew next time.
    pub fn clear(&mut self, agent: Option<&AgentName>) {
        let name = agent.map(|a| a.to_string()).unwrap_or_default();
        let before = self.sent.len();
        self.sent.retain(|(a, _)| *a != name);
        if self.sent.len() != before {
            self.save();
        }
    }

    pub fn clear_code(&mut self, code: Code) {
        let before = self.sent.len();
        self.sent.retain(|(_, c)| c != code.as_str());
        if self.sent.len() != before {
            self.save();
        }
    }

    fn save(&self) {
        let Some(path) = &self.path else { return };
        let list: Vec<&(String, String)> = self.sent.iter().collect();
        // A snapshot: losing it to a crash means one more escalation.
        if let Err(e) = crate::state::atomic::write_json_unsynced(&self.store, path, &list) {
            tracing::warn!("cannot write {}: {e}", path.display());
        }
    }
}

/// The `source_ref` of an escalation about session `sid`, and of a reply
/// to it (`agent-state send --source-ref ...`).
pub fn reply_ref(sid: &str) -> String {
    format!("agent-state/session/{sid}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hook_environment_follows_the_format() {
        let r = ErrorRecord::new(Code::AgentSpawnFailed, "cannot spawn rio")
            .at(crate::clock::Timestamp::parse("2026-01-25T10:00:00Z").unwrap())
            .agent("rio")
            .session("S1")
            .attempt(2);
        let root = StateRoot::new("/srv/state");
        let get = |format, key: &str| {
            hook_env(&r, format, &root)
                .into_iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v)
        };
        let some = |v: &str| Some(v.to_string());
        use ErrorFormat::*;
        // (format, variable, value)
        let table = [
            (
                AgentState,
                "AGENT_STATE_ERROR_CODE",
                some("AGENT_SPAWN_FAILED"),
            ),
            (AgentState, "AGENT_STATE_ERROR_SESSION", some("S1")),
            (AgentState, "AGENT_STATE_ROOT", some("/srv/state")),
            (AgentState, "AXIOM_ERROR_CODE", None),
            (Seed, "AGENT_STATE_ERROR_CODE", some("AGENT_SPAWN_FAILED")),
            (Seed, "AXIOM_ERROR_CODE", some("AGENT_SPAWN_FAILED")),
            (Seed, "AXIOM_ERROR_MESSAGE", some("cannot spawn rio")),
            (Seed, "AXIOM_ERROR_AGENT", some("rio")),
            (Seed, "AXIOM_ERROR_TASK", some("S1")),
            (Seed, "AXIOM_ERROR_SEVERITY", some(r.severity.as_str())),
            (Seed, "AXIOM_ERROR_ATTEMPT", some("2")),
        ];
        for (format, key, want) in table {
            assert_eq!(get(format, key), want, "{format} {key}");
        }
    }
}
