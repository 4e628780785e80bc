//! Requests to stop a running session (`agent-state stop AGENT`): one file
//! per agent, `.daemon/stop.AGENT`, written by the CLI and carried out by
//! the daemon when the CLI sends it SIGUSR1 (and on the reconcile scan as a
//! backstop), which removes it. The request names the session the CLI saw
//! running: a request that arrives late never stops the next session.
//!
//! `.daemon/` is the service user's (`0750`): only it and root can ask.
//! The daemon reads a request through `fsx` (no link followed, at most
//! [`MAX_REQUEST_BYTES`]) and trusts none of it but as a label: the session
//! id must be the one it runs, and the reason and the asker are text for
//! the record, capped.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::agent_name::AgentName;
use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::state::caps::{self, Field};
use crate::state::{StateRoot, atomic};

const PREFIX: &str = "stop.";

/// A request is a few lines of JSON; anything longer is not one.
pub const MAX_REQUEST_BYTES: u64 = 64 * 1024;

/// The longest `by` kept (a user name and a uid, a sudo user).
const MAX_BY_CHARS: usize = 200;

/// What `agent-state stop` asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopRequest {
    /// The session the CLI saw running.
    pub session_id: String,
    /// The operator's words (`--reason`).
    pub reason: String,
    /// Who asked, as the CLI's process saw itself: `root (uid 0)`,
    /// `agent-state (uid 998, sudo from alice)`. A label.
    pub by: String,
    pub asked_at: Timestamp,
}

impl StopRequest {
    /// How the stop reads in session.json's `reason`, the journal line and
    /// the log: who stopped it, and why.
    pub fn describe(&self) -> String {
        format!(
            "stopped by {} with `agent-state stop`: {}",
            self.by, self.reason
        )
    }

    /// Its texts within their caps (a request is not trusted).
    fn capped(self) -> StopRequest {
        StopRequest {
            reason: caps::cap(Field::Reason, self.reason),
            by: self.by.chars().take(MAX_BY_CHARS).collect(),
            ..self
        }
    }
}

/// The request file for `agent`.
pub fn request_path(root: &StateRoot, agent: &AgentName) -> PathBuf {
    root.daemon_dir().join(format!("{PREFIX}{agent}"))
}

/// Leave a request to stop `agent`'s session (replacing any earlier one).
pub fn request(root: &StateRoot, agent: &AgentName, req: &StopRequest) -> Result<PathBuf> {
    let path = request_path(root, agent);
    let mut text = serde_json::to_vec(req).map_err(|e| Error::Data(e.to_string()))?;
    text.push(b'\n');
    atomic::write_file(&root.store, &path, &text, 0o640)?;
    Ok(path)
}

/// The agents a request waits for, by the files' names (anything else in
/// `.daemon/` is not ours to judge; a name that is no agent name is left).
pub fn pending(root: &StateRoot) -> Result<Vec<AgentName>> {
    Ok(crate::fsx::list(&root.daemon_dir())?
        .into_iter()
        .filter_map(|n| n.into_string().ok())
        .filter_map(|n| n.strip_prefix(PREFIX).map(str::to_string))
        .filter_map(|a| AgentName::parse(&a).ok())
        .collect())
}

/// Read `agent`'s request: `Ok(None)` if there is none; an error naming the
/// file if it is not one.
pub fn read(root: &StateRoot, agent: &AgentName) -> Result<Option<StopRequest>> {
    let path = request_path(root, agent);
    let Some((bytes, more)) = crate::fsx::read_limited(&path, MAX_REQUEST_BYTES)? else {
        return Ok(None);
    };
    if more {
        return Err(Error::Data(format!(
            "{} is over {MAX_REQUEST_BYTES} bytes: not a stop request; ask again with `agent-state stop {agent}`",
            path.display()
        )));
    }
    serde_json::from_slice::<StopRequest>(&bytes)
        .map(|r| Some(r.capped()))
        .map_err(|e| {
            Error::Data(format!(
                "{} is not a stop request ({e}); ask again with `agent-state stop {agent}`",
                path.display()
            ))
        })
}

/// The request for `agent` is carried out (or dropped).
pub fn done(root: &StateRoot, agent: &AgentName) -> Result<()> {
    crate::fsx::remove_file(&request_path(root, agent)).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(reason: &str) -> StopRequest {
        StopRequest {
            session_id: "20261126-170000".into(),
            reason: reason.into(),
            by: "root (uid 0)".into(),
            asked_at: Timestamp::parse("2026-11-26T17:00:00Z").unwrap(),
        }
    }

    #[test]
    fn a_request_reads_back_and_only_valid_agent_names_are_pending() {
        let dir = tempfile::tempdir().unwrap();
        let root = StateRoot::new(dir.path());
        std::fs::create_dir(root.daemon_dir()).unwrap();
        for name in [
            "stop.",
            "stop.-x",
            "stop.a/b",
            "credential-release.default",
            "economy.json",
        ] {
            let _ = std::fs::write(root.daemon_dir().join(name), "");
        }
        let rio = AgentName::parse("rio").unwrap();
        request(&root, &rio, &req("operator")).unwrap();
        assert_eq!(pending(&root).unwrap(), std::slice::from_ref(&rio));
        assert_eq!(read(&root, &rio).unwrap(), Some(req("operator")));
        done(&root, &rio).unwrap();
        done(&root, &rio).unwrap();
        assert_eq!(read(&root, &rio).unwrap(), None);
    }

    #[test]
    fn a_request_that_is_not_one_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let root = StateRoot::new(dir.path());
        std::fs::create_dir(root.daemon_dir()).unwrap();
        let rio = AgentName::parse("rio").unwrap();
        std::fs::write(request_path(&root, &rio), "{\"session_id\": 3}").unwrap();
        let e = read(&root, &rio).unwrap_err().to_string();
        assert!(
            e.contains("stop.rio") && e.contains("not a stop request"),
            "{e}"
        );
        let big = vec![b' '; MAX_REQUEST_BYTES as usize + 1];
        std::fs::write(request_path(&root, &rio), big).unwrap();
        let e = read(&root, &rio).unwrap_err().to_string();
        assert!(e.contains("over 65536 bytes"), "{e}");
    }

    #[test]
    fn texts_are_capped_and_the_description_names_who_and_why() {
        let mut r = req(&"x".repeat(100_000));
        r.by = "y".repeat(1000);
        let r = r.capped();
        assert!(r.reason.len() <= 16 * 1024 + 64, "{}", r.reason.len());
        assert_eq!(r.by.chars().count(), MAX_BY_CHARS);
        assert_eq!(
            req("operator").describe(),
            "stopped by root (uid 0) with `agent-state stop`: operator"
        );
    }
}
