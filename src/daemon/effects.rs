//! What an agent's signals do (seed 000's `<axiom>…</axiom>`, parsed by
//! `crate::signals` as the output streams). Every effect goes through the
//! same state code as everything else: the agent's lock, the journal first,
//! atomic file writes, `inbox::deliver` for messages.
//!
//! | signal | effect |
//! |---|---|
//! | `PROGRESS:n` | report.json `progress`, journal |
//! | `COMPLETE` | journal; the session counts as completed even if its exit status is lost |
//! | `BLOCKED:reason` | report.json `blocked_by`, journal, a message to the human mailbox |
//! | `PENDING:reason` | the same, the message marked as needing a human decision (`question`), report.json `pending` |
//! | `DISCOVERY_LOCAL:text` | memory.md under "Discoveries" |
//! | `DISCOVERY_GLOBAL:text` | a `flag` message to every other working agent (counted as flags sent; received when claimed) |
//! | `RESOLVED` | journal; clears `blocked_by` and `pending` |
//!
//! An invalid signal goes to `.daemon/signals.jsonl` and never stops a session.

use std::path::PathBuf;

use crate::agent_name::AgentName;
use crate::clock::Timestamp;
use crate::config::{AgentKind, Config};
use crate::error::Result;
use crate::inbox::{self, MessageType, Outgoing, Priority};
use crate::protocol::signals::{DiscoveryScope, Signal, SignalError, SignalRecord, SignalType};
use crate::state::journal::{Event, MessageSent, SignalSeen};
use crate::state::report::Report;
use crate::state::{StateRoot, memory, metrics};

/// memory.md's section for local discoveries.
pub const DISCOVERIES_SECTION: &str = "Discoveries";

/// Where a signal came from.
pub struct Origin<'a> {
    pub agent: &'a AgentName,
    pub session_id: &'a str,
    pub instance: &'a str,
    /// Whether a `DISCOVERY_GLOBAL` may still go to every agent: a session
    /// shares at most [`GLOBAL_DISCOVERIES_PER_SESSION`]; the rest are kept
    /// in its own memory.md, so an agent printing them in a loop cannot
    /// flood every inbox (and the daemon's loop with the writes).
    pub may_fan_out: bool,
}

/// How many `DISCOVERY_GLOBAL` signals of one session go to every agent.
pub const GLOBAL_DISCOVERIES_PER_SESSION: u32 = 10;

/// `.daemon/signals.jsonl`.
pub fn signals_log(root: &StateRoot) -> PathBuf {
    root.daemon_dir().join("signals.jsonl")
}

/// Append one record to `.daemon/signals.jsonl` as one whole line
/// (`state::journal::append_lines`: `O_APPEND`, fsynced, never glued to a
/// torn last line).
pub fn append_signal(root: &StateRoot, rec: &SignalRecord) -> crate::error::Result<()> {
    let mut line = serde_json::to_vec(rec).unwrap_or_default();
    line.push(b'\n');
    let _rotation = crate::state::rotation::daemon_logs();
    crate::state::journal::append_lines(&root.store, &signals_log(root), &line)
}

/// Record an invalid signal (never an error of the session).
pub fn record_invalid(root: &StateRoot, origin: &Origin<'_>, error: &SignalError, now: Timestamp) {
    let record = SignalRecord::new(now, origin.agent.as_str(), error)
        .with_session(origin.session_id.to_string());
    tracing::warn!(
        agent = %origin.agent,
        session_id = origin.session_id,
        "invalid signal {}: {} ({})",
        error.code.as_str(),
        error.message,
        error.raw
    );
    if let Err(e) = append_signal(root, &record) {
        tracing::warn!("cannot append to {}: {e}", signals_log(root).display());
    }
}

/// Carry out a valid signal. Returns what it did, for the log.
pub fn apply(
    root: &StateRoot,
    config: &Config,
    origin: &Origin<'_>,
    signal: &Signal,
    now: Timestamp,
) -> Result<String> {
    let dir = root.agent(origin.agent);
    let payload = signal.payload().map(str::to_string);
    let effect = match signal.kind() {
        SignalType::Progress => {
            let n = signal.progress().unwrap_or(0);
            update_report(&dir, now, |r| {
                set_extra(r, "progress", serde_json::json!(n));
            })?;
            format!("report.json progress = {n}")
        }
        SignalType::Complete => "the session counts as completed".to_string(),
        SignalType::Blocked | SignalType::Pending => {
            let reason = signal.reason().unwrap_or_default().to_string();
            let pending = signal.kind() == SignalType::Pending;
            update_report(&dir, now, |r| {
                r.blocked_by = Some(reason.clone());
                if pending {
                    set_extra(r, "pending", serde_json::json!(reason));
                }
            })?;
            let told = tell_human(root, config, origin, signal.kind(), &reason, now);
            match told {
                Some(human) => format!("report.json blocked_by set; {human} told"),
                None => "report.json blocked_by set (no human mailbox configured)".to_string(),
            }
        }
        SignalType::DiscoveryLocal | SignalType::DiscoveryGlobal => {
            let (scope, text) = signal.discovery().unwrap_or((DiscoveryScope::Local, ""));
            let over = scope == DiscoveryScope::Global && !origin.may_fan_out;
            if scope == DiscoveryScope::Global && !over {
                let n = share_discovery(root, config, origin, text, now)?;
                format!("flag sent to {n} agent(s)")
            } else {
                {
                    let lock = dir.lock()?;
                    let words = text.replace(['\n', '\r'], " ");
                    let line = format!("- {} ({}): {}", now.date(), origin.instance, words.trim());
                    // The same discovery again (another day, another
                    // session) is not written twice.
                    let added = memory::append_new_entry(
                        &dir.store,
                        &dir.memory(),
                        DISCOVERIES_SECTION,
                        &line,
                        &words,
                    )?;
                    drop(lock);
                    if !added {
                        "memory.md: already under Discoveries (not written twice)".to_string()
                    } else if over {
                        format!(
                            "memory.md: added under Discoveries, not shared: this session already shared {GLOBAL_DISCOVERIES_PER_SESSION} discoveries with every agent"
                        )
                    } else {
                        "memory.md: added under Discoveries".to_string()
                    }
                }
            }
        }
        SignalType::Resolved => {
            update_report(&dir, now, |r| {
                r.blocked_by = None;
                r.extra.remove("pending");
            })?;
            "blocked_by cleared".to_string()
        }
    };
    let lock = dir.lock()?;
    dir.journal_append(
        &lock,
        now,
        Event::Signal(SignalSeen {
            session_id: origin.session_id.to_string(),
            kind: signal.kind().as_str().to_string(),
            payload,
            instance: Some(origin.instance.to_string()),
            effect: Some(effect.clone()),
        }),
    )?;
    Ok(effect)
}

fn set_extra(report: &mut Report, key: &str, value: serde_json::Value) {
    report.extra.insert(key.to_string(), value);
}

fn update_report(
    dir: &crate::state::AgentDir,
    now: Timestamp,
    f: impl FnOnce(&mut Report),
) -> Result<()> {
    dir.update(now, |report: &mut Report| {
        f(report);
        report.updated_at = Some(now);
    })
    .map(|_| ())
}

/// BLOCKED / PENDING to the human mailbox. Returns the human's name.
fn tell_human(
    root: &StateRoot,
    config: &Config,
    origin: &Origin<'_>,
    kind: SignalType,
    reason: &str,
    now: Timestamp,
) -> Option<String> {
    let human = config.hooks.escalate_to.as_ref()?;
    let (message_kind, what) = match kind {
        SignalType::Pending => (MessageType::Question, "needs a human decision"),
        _ => (MessageType::Flag, "is blocked"),
    };
    let out = Outgoing {
        from: origin.agent.clone(),
        kind: message_kind,
        priority: Priority::High,
        subject: format!("[{}] {} {what}: {reason}", kind.as_str(), origin.agent),
        body: format!(
            "{agent} ({instance}, session {session}) signalled {kind}: {reason}\n\n\
             Answer with `agent-state send --from {human} --to {agent} --subject ...`; \
             the answer wakes it. It clears the blocker itself with <axiom>RESOLVED</axiom>.\n",
            agent = origin.agent,
            instance = origin.instance,
            session = origin.session_id,
            kind = kind.as_str(),
        ),
        source_ref: Some(format!("{}/{}", origin.agent, origin.session_id)),
        expires_at: None,
    };
    match inbox::deliver(&root.agent(human), &out, now) {
        Ok(_) => Some(human.to_string()),
        Err(e) => {
            tracing::warn!(agent = %origin.agent, "cannot tell {human} about the {} signal: {e}", kind.as_str());
            None
        }
    }
}

/// DISCOVERY_GLOBAL: a flag to every other working agent, counted as sent.
fn share_discovery(
    root: &StateRoot,
    config: &Config,
    origin: &Origin<'_>,
    text: &str,
    now: Timestamp,
) -> Result<usize> {
    let subject: String = text
        .replace(['\n', '\r'], " ")
        .trim()
        .chars()
        .take(120)
        .collect();
    let out = Outgoing {
        from: origin.agent.clone(),
        kind: MessageType::Flag,
        priority: Priority::Normal,
        subject,
        body: format!(
            "A discovery shared by {} ({}, session {}):\n\n{text}\n",
            origin.agent, origin.instance, origin.session_id
        ),
        source_ref: Some(format!("{}/{}", origin.agent, origin.session_id)),
        expires_at: None,
    };
    let mut sent = Vec::new();
    for other in config
        .agents
        .iter()
        .filter(|a| a.kind == AgentKind::Agent && &a.name != origin.agent)
    {
        match inbox::deliver(&root.agent(&other.name), &out, now) {
            Ok(m) => sent.push(m),
            Err(e) => {
                tracing::warn!(agent = %origin.agent, "cannot share a discovery with {}: {e}", other.name)
            }
        }
    }
    let dir = root.agent(origin.agent);
    let lock = dir.lock()?;
    let mut notes = Vec::new();
    for m in &sent {
        let event = Event::MessageSent(MessageSent {
            message_id: m.id.clone(),
            to: m.to.clone(),
            kind: m.kind,
            subject: m.subject.clone(),
        });
        dir.journal_append(&lock, now, event.clone())?;
        metrics::apply(&dir, &lock, &event, now, &mut notes)?;
    }
    Ok(sent.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::signals::parse_one;

    #[test]
    fn append_signal_writes_one_line_per_record() {
        let dir = tempfile::tempdir().unwrap();
        let root = StateRoot::new(dir.path());
        std::fs::create_dir_all(root.daemon_dir()).unwrap();
        let ts = Timestamp::parse("2026-03-31T22:00:00Z").unwrap();
        let inputs = ["<axiom>COMPLET</axiom>", "<axiom>BLOCKED:a\nb</axiom>"];
        for raw in inputs {
            let record = SignalRecord::new(ts, "rio", &parse_one(raw).unwrap_err());
            append_signal(&root, &record).unwrap();
        }
        let text = std::fs::read_to_string(signals_log(&root)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(text.ends_with('\n'));
        for (line, raw) in lines.iter().zip(inputs) {
            let record: SignalRecord = serde_json::from_str(line).unwrap();
            assert_eq!(record.raw, raw);
        }
    }
}
