//! What the agent, flows and mailbox pages show, as JSON: the CLI's own
//! `--json` outputs (`status`, `task list`, `inbox`, `flow status`,
//! `usage`) put together, read through the CLI's readers; what no command
//! prints (recent sessions with their reasons, memory.md, the running
//! session's log tail and iterations) read with the library's readers
//! (`usage::sessions`, the journal, `fsx`: no link followed out of the root).

use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};

use crate::agent_name::AgentName;
use crate::cli::Context;
use crate::clock::Timestamp;
use crate::config::AgentKind;
use crate::error::{Error, Result};
use crate::state::journal::{self, Entry, Event};
use crate::state::session::Session;
use crate::state::tasks::TaskFile;

/// Sessions listed on an agent's page, newest first.
pub const RECENT_SESSIONS: usize = 20;
/// How far back the sessions are looked for.
const SESSIONS_WINDOW: Duration = Duration::from_secs(30 * 86_400);
/// The most of memory.md shown.
pub const MEMORY_LIMIT: u64 = 256 * 1024;
/// The most of a session's log shown.
pub const LOG_TAIL: u64 = 16 * 1024;

/// The message fields shown without `[web] show_bodies`: no body, and none
/// of the unknown fields a sender may have added.
const HEAD_FIELDS: &[&str] = &[
    "id",
    "from",
    "to",
    "created_at",
    "type",
    "priority",
    "subject",
    "source_ref",
    "expires_at",
    "attempts",
];

/// A configured agent by the name in a URL: a valid [`AgentName`] first
/// (nothing else becomes a path), then one in the config.
pub fn agent_name(ctx: &Context, text: &str) -> Result<AgentName> {
    let name = AgentName::parse(text)?;
    ctx.config.agent(&name)?;
    Ok(name)
}

/// One session of an agent's page: what `usage` counts, and why it ended.
#[derive(Serialize)]
struct SessionRow {
    #[serde(flatten)]
    usage: crate::usage::SessionUse,
    /// The reason of an `error` or `timeout` line.
    reason: Option<String>,
    /// The catalogue code the daemon judged the failure by.
    code: Option<String>,
}

/// Recent sessions from the journal's entries, newest first (pure).
fn recent_sessions(entries: &[Entry]) -> Vec<SessionRow> {
    let mut rows: Vec<SessionRow> = crate::usage::sessions(entries)
        .into_iter()
        .map(|usage| SessionRow {
            usage,
            reason: None,
            code: None,
        })
        .collect();
    for e in entries {
        if let Event::Error(f) | Event::Timeout(f) = &e.event
            && let Some(r) = rows.iter_mut().find(|r| r.usage.session_id == f.session_id)
        {
            r.reason = Some(f.reason.clone());
            r.code = f.code.clone();
        }
    }
    rows.reverse();
    rows.truncate(RECENT_SESSIONS);
    rows
}

/// The verify loop's iterations of `session` (pure): each `{n, of,
/// verify, failure}` as the journal has them.
fn iterations(entries: &[Entry], session: &str) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for e in entries {
        match &e.event {
            Event::IterationStart(i) if i.session_id == session => {
                out.push(json!({"n": i.n, "of": i.of, "started_at": e.ts}));
            }
            Event::IterationEnd(i) if i.session_id == session => {
                let row = json!({"n": i.n, "of": i.of, "verify": i.verify, "failure": i.failure, "ended_at": e.ts});
                match out.iter_mut().find(|r| r["n"] == i.n) {
                    Some(r) => {
                        for (k, v) in row.as_object().into_iter().flatten() {
                            r[k] = v.clone();
                        }
                    }
                    None => out.push(row),
                }
            }
            _ => {}
        }
    }
    out
}

/// A message listing (`inbox --json`) with the bodies taken out unless
/// they are to be shown (pure).
pub fn without_bodies(mut listing: Value, show_bodies: bool) -> Value {
    if show_bodies {
        return listing;
    }
    let strip = |m: &mut Value| {
        if let Some(o) = m.as_object_mut() {
            o.retain(|k, _| HEAD_FIELDS.contains(&k.as_str()));
        }
    };
    for list in ["waiting", "claimed"] {
        for item in listing
            .get_mut(list)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            if let Some(m) = item.get_mut("message") {
                strip(m);
            }
        }
    }
    listing
}

/// Text from a file below the root, lossily decoded: `(text, truncated)`,
/// or null when missing; a link or a special file is an error (shown).
fn text_of(bytes: Option<(Vec<u8>, bool)>) -> Value {
    match bytes {
        None => Value::Null,
        Some((b, more)) => json!({"text": String::from_utf8_lossy(&b), "truncated": more}),
    }
}

/// Everything an agent's page shows (`/api/agent/NAME`).
pub fn agent(ctx: &Context, name: &AgentName, show_bodies: bool) -> Result<Value> {
    let (config, dir) = ctx.agent(name.as_str())?;
    let status = crate::cli::status::fleet_json(ctx, Some(name.as_str()))?
        .as_array()
        .and_then(|a| a.first().cloned())
        .unwrap_or(Value::Null);
    let inbox = match crate::cli::inbox::listing_json(ctx, name.as_str()) {
        Ok(l) => without_bodies(l, show_bodies),
        Err(e) => json!({"error": e.to_string()}),
    };
    let mut out = json!({
        "agent": name.as_str(),
        "kind": if config.kind == AgentKind::Human { "human" } else { "agent" },
        "status": status,
        "inbox": inbox,
    });
    if config.kind == AgentKind::Human {
        return Ok(out);
    }
    let tasks = match dir.read::<TaskFile>() {
        Ok(f) => serde_json::to_value(f.map(|f| f.tasks).unwrap_or_default()).unwrap_or_default(),
        Err(e) => json!({"error": e.to_string()}),
    };
    let entries = journal::read_since(&dir.store, &dir.journal(), ctx.now.minus(SESSIONS_WINDOW));
    let sessions = match &entries {
        Ok(e) => serde_json::to_value(recent_sessions(e)).unwrap_or_default(),
        Err(e) => json!({"error": e.to_string()}),
    };
    let memory = match crate::fsx::read_limited(&dir.memory(), MEMORY_LIMIT) {
        Ok(b) => text_of(b),
        Err(e) => json!({"error": e.to_string()}),
    };
    let running = match dir.read::<Session>() {
        Ok(Some(s)) if s.is_running() => {
            let its = entries
                .as_ref()
                .map(|e| iterations(e, &s.session_id))
                .unwrap_or_default();
            let log = log_file(&s.session_id, &its);
            let tail = match log_tail(&dir.sessions_dir().join(&log), LOG_TAIL) {
                Ok(Some((b, offset))) => {
                    let mut t = text_of(Some((b, false)));
                    t["offset"] = json!(offset);
                    t
                }
                Ok(None) => Value::Null,
                Err(e) => json!({"error": e.to_string()}),
            };
            let workspace = config.session.workspace.as_ref().map(|w| {
                json!({
                    "repo": w.repo.display().to_string(),
                    "path": crate::daemon::workspaces::root_of(w, config, &dir)
                        .join(&s.session_id)
                        .display()
                        .to_string(),
                    "branch": s.branch,
                })
            });
            json!({
                "session_id": s.session_id,
                "started_at": s.started_at,
                "model": s.model,
                "branch": s.branch,
                "workspace": workspace,
                "iterations": its,
                "log": {"file": format!("sessions/{log}"), "tail": tail},
            })
        }
        Ok(_) => Value::Null,
        Err(e) => json!({"error": e.to_string()}),
    };
    out["tasks"] = tasks;
    out["sessions"] = sessions;
    out["memory"] = memory;
    out["running"] = running;
    Ok(out)
}

/// The last `n` bytes of a log up to its last complete character, and the
/// offset right after them: where the page's live stream goes on from
/// (`/events?log_from=`), so that nothing printed in between is missed.
fn log_tail(path: &std::path::Path, n: u64) -> Result<Option<(Vec<u8>, u64)>> {
    use std::io::{Read, Seek, SeekFrom};
    let Some(mut f) = crate::fsx::open_read(path)? else {
        return Ok(None);
    };
    let len = f
        .metadata()
        .map_err(|e| Error::io("inspecting", path, e))?
        .len();
    let start = len.saturating_sub(n);
    f.seek(SeekFrom::Start(start))
        .map_err(|e| Error::io("reading", path, e))?;
    let mut buf = Vec::new();
    f.take(n)
        .read_to_end(&mut buf)
        .map_err(|e| Error::io("reading", path, e))?;
    buf.truncate(buf.len() - super::page::incomplete_utf8(&buf));
    let offset = start + buf.len() as u64;
    Ok(Some((buf, offset)))
}

/// The log a running session writes now: its latest iteration's
/// (`ID.iter-N.log`, from the second on), else `ID.log` (pure).
pub fn log_file(session: &str, iterations: &[Value]) -> String {
    match iterations
        .iter()
        .filter_map(|i| i["n"].as_u64())
        .filter(|n| *n > 1)
        .max()
    {
        Some(n) => format!("{session}.iter-{n}.log"),
        None => format!("{session}.log"),
    }
}

/// The running session's log now: `(session, file name, length)`, to
/// follow it; none when no session runs.
pub fn running_log(ctx: &Context, name: &AgentName) -> Option<(String, std::path::PathBuf)> {
    let dir = ctx.root.agent(name);
    let session = dir.read::<Session>().ok().flatten()?;
    if !session.is_running() {
        return None;
    }
    let entries = journal::read_since(
        &dir.store,
        &dir.journal(),
        ctx.now.minus(Duration::from_secs(86_400)),
    )
    .unwrap_or_default();
    let log = log_file(
        &session.session_id,
        &iterations(&entries, &session.session_id),
    );
    Some((session.session_id, dir.sessions_dir().join(log)))
}

/// `/api/flows`: what `flow status --json` prints.
pub fn flows(ctx: &Context) -> Result<Value> {
    crate::cli::flow::status_json(ctx)
}

/// `/api/mailbox`: each human mailbox's listing (`inbox --json`) with only
/// the escalations waiting (the daemon's and the flows' messages, not yet
/// acknowledged), newest first.
pub fn mailbox(ctx: &Context, show_bodies: bool) -> Result<Value> {
    let mut out = Vec::new();
    for agent in ctx
        .config
        .agents
        .iter()
        .filter(|a| a.kind == AgentKind::Human)
    {
        let listing = match crate::cli::inbox::listing_json(ctx, agent.name.as_str()) {
            Ok(l) => l,
            Err(Error::NotBootstrapped { .. }) => continue,
            Err(e) => {
                out.push(json!({"agent": agent.name.as_str(), "error": e.to_string()}));
                continue;
            }
        };
        out.push(without_bodies(escalations(listing), show_bodies));
    }
    Ok(Value::Array(out))
}

/// A listing with only its waiting escalations, newest first (pure).
fn escalations(mut listing: Value) -> Value {
    let mut waiting: Vec<Value> = listing["waiting"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|w| {
            w["message"]["source_ref"]
                .as_str()
                .is_some_and(|r| r.starts_with("agent-state/"))
        })
        .collect();
    let at = |w: &Value| {
        w["message"]["created_at"]
            .as_str()
            .and_then(|t| Timestamp::parse(t).ok())
    };
    waiting.sort_by_key(|w| std::cmp::Reverse(at(w)));
    listing["waiting"] = Value::Array(waiting);
    listing
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(line: Value) -> Entry {
        serde_json::from_value(line).unwrap()
    }

    #[test]
    fn sessions_newest_first_with_their_reasons() {
        let entries = [
            entry(
                json!({"ts":"2026-11-20T10:00:00Z","event":"session_start","session_id":"s1","type":"research"}),
            ),
            entry(
                json!({"ts":"2026-11-20T10:05:00Z","event":"session_end","session_id":"s1","outcome":"completed","duration_seconds":300,"cost_usd":0.5}),
            ),
            entry(
                json!({"ts":"2026-11-21T10:00:00Z","event":"session_start","session_id":"s2","type":"research"}),
            ),
            entry(
                json!({"ts":"2026-11-21T10:01:00Z","event":"error","session_id":"s2","reason":"exit 3","code":"SESSION_FAILED","duration_seconds":60}),
            ),
        ];
        let rows = serde_json::to_value(recent_sessions(&entries)).unwrap();
        assert_eq!(rows[0]["session_id"], "s2");
        assert_eq!(rows[0]["outcome"], "error");
        assert_eq!(rows[0]["reason"], "exit 3");
        assert_eq!(rows[0]["code"], "SESSION_FAILED");
        assert_eq!(rows[0]["runtime_seconds"], 60);
        assert_eq!(rows[1]["session_id"], "s1");
        assert_eq!(rows[1]["cost_usd"], 0.5);
        assert_eq!(rows[1]["reason"], Value::Null);
    }

    #[test]
    fn iterations_pair_starts_and_ends_and_name_the_log() {
        let entries = [
            entry(
                json!({"ts":"2026-11-20T10:01:00Z","event":"iteration_end","session_id":"s1","n":1,"of":3,"verify":"failed","failure":"cargo test: exit 101"}),
            ),
            entry(
                json!({"ts":"2026-11-20T10:01:01Z","event":"iteration_start","session_id":"s1","n":2,"of":3}),
            ),
            entry(
                json!({"ts":"2026-11-20T10:01:02Z","event":"iteration_start","session_id":"other","n":2,"of":3}),
            ),
        ];
        let its = iterations(&entries, "s1");
        assert_eq!(its.len(), 2, "{its:?}");
        assert_eq!(its[0]["verify"], "failed");
        assert_eq!(its[1]["n"], 2);
        assert_eq!(log_file("s1", &its), "s1.iter-2.log");
        assert_eq!(log_file("s1", &its[..1]), "s1.log");
        assert_eq!(log_file("s1", &[]), "s1.log");
    }

    #[test]
    fn bodies_and_unknown_fields_are_left_out_unless_shown() {
        let listing = json!({
            "agent": "rio",
            "waiting": [{"file": "a.json", "state": "valid", "message": {
                "id": "m1", "subject": "hi", "body": "secret", "x_note": "also secret"}}],
            "claimed": [{"session_id": "s", "message": {"id": "m2", "body": "secret"}}],
            "rejected": [],
            "processed": 0
        });
        let hidden = without_bodies(listing.clone(), false).to_string();
        assert!(!hidden.contains("secret"), "{hidden}");
        assert!(hidden.contains("\"subject\":\"hi\""), "{hidden}");
        assert_eq!(without_bodies(listing.clone(), true), listing);
    }

    #[test]
    fn escalations_only_newest_first() {
        let m = |id: &str, at: &str, r: Option<&str>| json!({"file": id, "state": "valid", "message": {"id": id, "created_at": at, "source_ref": r}});
        let listing = json!({"agent": "ops", "waiting": [
            m("old", "2026-11-20T10:00:00Z", Some("agent-state/alert/x")),
            m("mine", "2026-11-22T10:00:00Z", None),
            m("new", "2026-11-21T10:00:00Z", Some("agent-state/flow/y")),
        ]});
        let ids: Vec<Value> = escalations(listing)["waiting"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["file"].clone())
            .collect();
        assert_eq!(ids, vec![json!("new"), json!("old")]);
    }
}
