//! Remote sessions kept across a controller restart (issue 24).
//!
//! A session run on a worker does not die with the controller: in cluster
//! mode (`[cluster] local_sessions = false`) a daemon that stops — by
//! SIGTERM or killed outright — leaves its remote sessions running, and the
//! next daemon *adopts* them: it follows their output again from the
//! stream and records their end as if it had never gone.
//!
//! What makes that possible is one small file per agent,
//! `.daemon/remote.AGENT`, written before the order is published and
//! removed once the session's end is recorded: the order's id, the
//! session's id, and how far the session's signals were carried out. At
//! start, an agent whose session.json is still `running` with the session
//! this file names is adopted instead of being recorded "interrupted:
//! daemon restarted" ([`at_start`]).
//!
//! Signals: each signal in a session's output is carried out once. The
//! file's `signals_through` is the last output chunk whose signals were
//! handed to the loop, written before they are; a re-adopted session's
//! output is fed again from its first chunk (the session log is rewritten
//! from the stream, so it equals the worker's output), with the signals of
//! chunks up to `signals_through` left out. A signal printed an instant
//! before the controller died may be lost, never carried out twice.
//!
//! The order itself (what the workers run: argv, env, prompt) is kept
//! beside it, `.daemon/remote.AGENT.order` (`0600`: its env is the
//! session's), written before the record: a controller killed after it
//! recorded an order and before the servers stored it leaves the next one
//! what it needs to publish that order again ([`read_order`]) instead of
//! ending the session "not started".
//!
//! `.daemon/` is the service user's (`0750`). The files are read through
//! `fsx` (no link followed, at most [`MAX_RECORD_BYTES`] and
//! [`MAX_ORDER_BYTES`]); a file that is not a record (or not the record's
//! order) is reported and the session recovered as before (or, for the
//! order, not published again).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::agent_name::AgentName;
use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::state::session::Session;
use crate::state::{StateRoot, atomic};

const PREFIX: &str = "remote.";
/// After `remote.AGENT` (agent names have no dot).
const ORDER_SUFFIX: &str = ".order";

/// A record is a few hundred bytes; anything longer is not one.
pub const MAX_RECORD_BYTES: u64 = 16 * 1024;

/// An order is at most a NATS message (1 MiB by default); a server
/// configured for more still stays under this.
pub const MAX_ORDER_BYTES: u64 = 8 * 1024 * 1024;

/// A remote session of this agent, as the controller keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteRecord {
    /// The agent's session (session.json's `session_id`), checked as a
    /// path component when read.
    #[serde(deserialize_with = "crate::session_id::de")]
    pub session_id: String,
    /// The order's id on the cluster (`AGENT_SESSION`, `-itN` for later
    /// iterations): its output, end and lease are keyed by it.
    pub order_id: String,
    /// The credential group the order was published for.
    pub group: String,
    /// The run of the session the order is (1 for the first).
    pub iteration: u32,
    pub published_at: Timestamp,
    /// The last output chunk whose signals were handed to the loop.
    #[serde(default)]
    pub signals_through: u64,
}

/// The record file for `agent`.
pub fn path(root: &StateRoot, agent: &AgentName) -> PathBuf {
    root.daemon_dir().join(format!("{PREFIX}{agent}"))
}

/// Write (or replace) `agent`'s record, durably.
pub fn write(root: &StateRoot, agent: &AgentName, record: &RemoteRecord) -> Result<()> {
    let mut text = serde_json::to_vec(record).map_err(|e| Error::Data(e.to_string()))?;
    text.push(b'\n');
    atomic::write_file(&root.store, &path(root, agent), &text, 0o640)
}

/// `agent`'s record: `Ok(None)` if there is none; an error naming the file
/// and what to do if it is not one.
pub fn read(root: &StateRoot, agent: &AgentName) -> Result<Option<RemoteRecord>> {
    let path = path(root, agent);
    let Some((bytes, more)) = crate::fsx::read_limited(&path, MAX_RECORD_BYTES)? else {
        return Ok(None);
    };
    if more {
        return Err(Error::Data(format!(
            "{} is over {MAX_RECORD_BYTES} bytes: not a remote session record; remove it (its session, if any, is recorded interrupted)",
            path.display()
        )));
    }
    let record = serde_json::from_slice::<RemoteRecord>(&bytes).map_err(|e| {
        Error::Data(format!(
            "{} is not a remote session record ({e}); remove it (its session, if any, is recorded interrupted)",
            path.display()
        ))
    })?;
    match record.problem(agent) {
        None => Ok(Some(record)),
        Some(why) => Err(Error::Data(format!(
            "{} is not a remote session record: {why}; remove it (its session, if any, is recorded interrupted)",
            path.display()
        ))),
    }
}

impl RemoteRecord {
    /// What makes it no record of `agent`'s (its ids become NATS subjects:
    /// a wildcard or a dot would read another session's output). Pure.
    pub fn problem(&self, agent: &AgentName) -> Option<String> {
        let safe = |s: &str| {
            !s.is_empty()
                && s.len() <= 200
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        };
        if !safe(&self.session_id) || self.session_id.contains('_') {
            return Some(format!(
                "session_id {:?} is not a session id",
                self.session_id
            ));
        }
        let own =
            agent_state_cluster::order_of_session(&self.order_id, agent.as_str(), &self.session_id);
        if !safe(&self.order_id) || !own {
            return Some(format!(
                "order_id {:?} is not an order of {agent}'s session {}",
                self.order_id, self.session_id
            ));
        }
        if !safe(&self.group) {
            return Some(format!("group {:?} is not a credential group", self.group));
        }
        None
    }
}

/// `agent`'s record is done with (its session's end is recorded): the
/// record, then its order.
pub fn remove(root: &StateRoot, agent: &AgentName) -> Result<()> {
    crate::fsx::remove_file(&path(root, agent))?;
    crate::fsx::remove_file(&order_path(root, agent)).map(|_| ())
}

/// The file keeping `agent`'s last order, as published.
pub fn order_path(root: &StateRoot, agent: &AgentName) -> PathBuf {
    root.daemon_dir()
        .join(format!("{PREFIX}{agent}{ORDER_SUFFIX}"))
}

/// Keep `order` (of `agent`), durably, before its record is written and it
/// is published.
pub fn write_order(
    root: &StateRoot,
    agent: &AgentName,
    order: &agent_state_cluster::SessionOrder,
) -> Result<()> {
    let mut text = serde_json::to_vec(order).map_err(|e| Error::Data(e.to_string()))?;
    text.push(b'\n');
    atomic::write_file(&root.store, &order_path(root, agent), &text, 0o600)
}

/// The order `record` names, as kept by [`write_order`]: `Ok(None)` if
/// there is none (a controller of before, or one killed before it wrote
/// it); an error naming the file if it is not that order.
pub fn read_order(
    root: &StateRoot,
    agent: &AgentName,
    record: &RemoteRecord,
) -> Result<Option<agent_state_cluster::SessionOrder>> {
    let path = order_path(root, agent);
    let Some((bytes, more)) = crate::fsx::read_limited(&path, MAX_ORDER_BYTES)? else {
        return Ok(None);
    };
    let not = |why: String| {
        Error::Data(format!(
            "{} is not the order of session {} ({why}): it is not published again; remove it",
            path.display(),
            record.session_id
        ))
    };
    if more {
        return Err(not(format!("over {MAX_ORDER_BYTES} bytes")));
    }
    let order = serde_json::from_slice::<agent_state_cluster::SessionOrder>(&bytes)
        .map_err(|e| not(e.to_string()))?;
    for (field, got, want) in [
        ("session_id", &order.session_id, &record.order_id),
        ("agent", &order.agent, &agent.to_string()),
        ("credential_group", &order.credential_group, &record.group),
    ] {
        if got != want {
            return Err(not(format!("its {field} is {got:?}, not {want:?}")));
        }
    }
    if !order.spec.is_object() {
        return Err(not("its spec is not an object".into()));
    }
    Ok(Some(order))
}

/// What the start does with an agent's session left running, given its
/// remote record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AtStart {
    /// Nothing of ours (no record, or one of a session that is over): the
    /// record, if any, is removed; recovery as before.
    Recover { forget: bool },
    /// A remote session that may still run: followed again.
    Adopt(RemoteRecord),
    /// A remote session this daemon cannot follow: recovered as before
    /// (interrupted), for the reason said.
    Cannot { why: String, forget: bool },
}

/// How this daemon runs sessions, for [`at_start`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    /// `[cluster]` with `local_sessions = false`.
    pub remote: bool,
    /// The agent has `[agent.session.iteration] verify`: its later runs
    /// start from the first one's spec, which is not kept.
    pub verify: bool,
    /// The running session's end is in its journal already (a controller
    /// killed while it recorded that end): completed from the journal by
    /// recovery, never followed and recorded again.
    pub end_journaled: bool,
}

/// Pure: an agent's session.json as read at start, and its record.
pub fn at_start(session: Option<&Session>, record: Option<RemoteRecord>, mode: Mode) -> AtStart {
    let Some(record) = record else {
        return AtStart::Recover { forget: false };
    };
    let running = session.filter(|s| s.is_running());
    let Some(s) = running else {
        return AtStart::Recover { forget: true };
    };
    if s.session_id != record.session_id || mode.end_journaled {
        return AtStart::Recover { forget: true };
    }
    let cannot = |why: String| AtStart::Cannot { why, forget: true };
    if !mode.remote {
        return cannot(format!(
            "session {} ran on a worker (order {}), but this daemon runs sessions on this host ([cluster] local_sessions is not false): it cannot follow it",
            s.session_id, record.order_id
        ));
    }
    if mode.verify || record.iteration > 1 {
        return cannot(format!(
            "session {} has verification runs ([agent.session.iteration] verify): a restarted controller does not keep those",
            s.session_id
        ));
    }
    AtStart::Adopt(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StateDoc;
    use crate::state::session::SessionStatus;

    fn record(sid: &str) -> RemoteRecord {
        RemoteRecord {
            session_id: sid.into(),
            order_id: format!("rio_{sid}"),
            group: "default".into(),
            iteration: 1,
            published_at: Timestamp::parse("2026-11-27T10:00:00Z").unwrap(),
            signals_through: 0,
        }
    }

    fn session(sid: &str, status: SessionStatus) -> Session {
        let mut s = Session::fresh("rio");
        s.session_id = sid.into();
        s.status = Some(status);
        s
    }

    const REMOTE: Mode = Mode {
        remote: true,
        verify: false,
        end_journaled: false,
    };

    #[test]
    fn what_the_start_does_with_each_session_and_record() {
        use SessionStatus::*;
        let running = session("20261127-100000", Running);
        let ended = session("20261127-100000", Completed);
        let other = session("20261127-110000", Running);
        let later = RemoteRecord {
            iteration: 2,
            ..record("20261127-100000")
        };
        let local = Mode {
            remote: false,
            verify: false,
            end_journaled: false,
        };
        let verify = Mode {
            remote: true,
            verify: true,
            end_journaled: false,
        };
        let recording = Mode {
            end_journaled: true,
            ..REMOTE
        };
        let adopt = AtStart::Adopt(record("20261127-100000"));
        type Row<'a> = (
            &'a str,
            Option<&'a Session>,
            Option<RemoteRecord>,
            Mode,
            AtStart,
        );
        let table: Vec<Row> = vec![
            (
                "no record",
                Some(&running),
                None,
                REMOTE,
                AtStart::Recover { forget: false },
            ),
            (
                "running, its record",
                Some(&running),
                Some(record("20261127-100000")),
                REMOTE,
                adopt,
            ),
            (
                "running, its end journaled (killed recording it)",
                Some(&running),
                Some(record("20261127-100000")),
                recording,
                AtStart::Recover { forget: true },
            ),
            (
                "ended: the record is stale",
                Some(&ended),
                Some(record("20261127-100000")),
                REMOTE,
                AtStart::Recover { forget: true },
            ),
            (
                "no session.json",
                None,
                Some(record("20261127-100000")),
                REMOTE,
                AtStart::Recover { forget: true },
            ),
            (
                "another session runs",
                Some(&other),
                Some(record("20261127-100000")),
                REMOTE,
                AtStart::Recover { forget: true },
            ),
        ];
        for (what, s, r, mode, want) in table {
            assert_eq!(at_start(s, r, mode), want, "{what}");
        }
        for (what, r, mode) in [
            ("now local", record("20261127-100000"), local),
            ("verify", record("20261127-100000"), verify),
            ("a later iteration", later, REMOTE),
        ] {
            assert!(
                matches!(
                    at_start(Some(&running), Some(r), mode),
                    AtStart::Cannot { forget: true, .. }
                ),
                "{what}"
            );
        }
    }

    #[test]
    fn a_kept_order_reads_back_only_as_the_records_and_goes_with_it() {
        use agent_state_cluster::SessionOrder;
        let dir = tempfile::tempdir().unwrap();
        let root = StateRoot::new(dir.path());
        std::fs::create_dir(root.daemon_dir()).unwrap();
        let rio = AgentName::parse("rio").unwrap();
        let r = record("20261127-100000");
        let order = SessionOrder {
            session_id: r.order_id.clone(),
            agent: "rio".into(),
            credential_group: "default".into(),
            spec: serde_json::json!({"argv": ["agent.sh"], "env": {"K": "v"}}),
        };
        assert_eq!(read_order(&root, &rio, &r).unwrap(), None);
        write_order(&root, &rio, &order).unwrap();
        let file = order_path(&root, &rio);
        assert!(file.ends_with(".daemon/remote.rio.order"), "{file:?}");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(read_order(&root, &rio, &r).unwrap(), Some(order.clone()));
        // Not the record's order: refused naming the file and the field.
        let table: &[(&str, SessionOrder)] = &[
            (
                "session_id",
                SessionOrder {
                    session_id: "rio_20261127-110000".into(),
                    ..order.clone()
                },
            ),
            (
                "agent",
                SessionOrder {
                    agent: "clay".into(),
                    ..order.clone()
                },
            ),
            (
                "credential_group",
                SessionOrder {
                    credential_group: "other".into(),
                    ..order.clone()
                },
            ),
            (
                "spec",
                SessionOrder {
                    spec: serde_json::Value::Null,
                    ..order.clone()
                },
            ),
        ];
        for (field, bad) in table {
            write_order(&root, &rio, bad).unwrap();
            let e = read_order(&root, &rio, &r).unwrap_err().to_string();
            assert!(
                e.contains("remote.rio.order") && e.contains(field),
                "{field}: {e}"
            );
        }
        std::fs::write(&file, b"[1,2]").unwrap();
        assert!(read_order(&root, &rio, &r).is_err());
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", &file).unwrap();
        assert!(
            read_order(&root, &rio, &r).is_err(),
            "a link is not followed"
        );
        std::fs::remove_file(&file).unwrap();
        // Removed with its record.
        write(&root, &rio, &r).unwrap();
        write_order(&root, &rio, &order).unwrap();
        remove(&root, &rio).unwrap();
        assert!(!path(&root, &rio).exists() && !file.exists());
        remove(&root, &rio).unwrap();
    }

    #[test]
    fn a_record_reads_back_and_a_bad_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let root = StateRoot::new(dir.path());
        std::fs::create_dir(root.daemon_dir()).unwrap();
        let rio = AgentName::parse("rio").unwrap();
        assert_eq!(read(&root, &rio).unwrap(), None);
        let r = record("20261127-100000");
        write(&root, &rio, &r).unwrap();
        assert_eq!(read(&root, &rio).unwrap(), Some(r));
        std::fs::write(path(&root, &rio), b"{\"session_id\": 3}").unwrap();
        let e = read(&root, &rio).unwrap_err().to_string();
        assert!(
            e.contains("remote.rio") && e.contains("not a remote session record"),
            "{e}"
        );
        std::fs::write(
            path(&root, &rio),
            vec![b' '; MAX_RECORD_BYTES as usize + 10],
        )
        .unwrap();
        let e = read(&root, &rio).unwrap_err().to_string();
        assert!(e.contains("over"), "{e}");
        // Ids that are no subjects of rio's session are refused.
        for (field, bad) in [
            (
                "order_id",
                RemoteRecord {
                    order_id: "rio_20261127-100000.>".into(),
                    ..record("20261127-100000")
                },
            ),
            (
                "order_id",
                RemoteRecord {
                    order_id: "clay_20261127-100000".into(),
                    ..record("20261127-100000")
                },
            ),
            (
                "order_id",
                RemoteRecord {
                    order_id: "rio_20261127-100000-itx".into(),
                    ..record("20261127-100000")
                },
            ),
            (
                "session_id",
                RemoteRecord {
                    session_id: "*".into(),
                    ..record("20261127-100000")
                },
            ),
            (
                "group",
                RemoteRecord {
                    group: "a.b".into(),
                    ..record("20261127-100000")
                },
            ),
        ] {
            write(&root, &rio, &bad).unwrap();
            let e = read(&root, &rio).unwrap_err().to_string();
            assert!(e.contains(field), "{field}: {e}");
        }
        let later = RemoteRecord {
            order_id: "rio_20261127-100000-it2".into(),
            iteration: 2,
            ..record("20261127-100000")
        };
        write(&root, &rio, &later).unwrap();
        assert_eq!(read(&root, &rio).unwrap(), Some(later));
        // A link is not followed.
        std::fs::remove_file(path(&root, &rio)).unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::write(&elsewhere, serde_json::to_vec(&record("x")).unwrap()).unwrap();
        std::os::unix::fs::symlink(&elsewhere, path(&root, &rio)).unwrap();
        assert!(read(&root, &rio).is_err());
        remove(&root, &rio).unwrap();
        assert_eq!(read(&root, &rio).unwrap(), None);
    }
}
