//! Requests to release a credential's hold (`agent-state credential release
//! NAME`): one file per credential, `.daemon/credential-release.NAME`,
//! written by the CLI and carried out by the daemon — at start, when the
//! CLI sends it SIGUSR1, and on the reconcile scan as a backstop — which
//! removes it once the release is saved. A file survives a daemon that is
//! down or restarting, and asking twice is asking once.
//!
//! `.daemon/` is the service user's (`0750`): only it and root can ask. The
//! daemon reads names only, never a request's content, and never follows
//! a link (`fsx`).

use std::path::PathBuf;

use super::economy::{Hold, Holds};
use crate::config::{Config, DEFAULT_CREDENTIAL, valid_group};
use crate::error::Result;
use crate::state::{StateRoot, atomic};

const PREFIX: &str = "credential-release.";

/// The request file for `credential`.
pub fn request_path(root: &StateRoot, credential: &str) -> PathBuf {
    root.daemon_dir().join(format!("{PREFIX}{credential}"))
}

/// Leave a request to release `credential` (a valid name: see [`known`]).
pub fn request(root: &StateRoot, credential: &str, note: &str) -> Result<PathBuf> {
    let path = request_path(root, credential);
    atomic::write_file(&root.store, &path, format!("{note}\n").as_bytes(), 0o640)?;
    Ok(path)
}

/// The credentials a request waits for, by the files' names (anything else
/// in `.daemon/` is not ours to judge).
pub fn pending(root: &StateRoot) -> Result<Vec<String>> {
    Ok(crate::fsx::list(&root.daemon_dir())?
        .into_iter()
        .filter_map(|n| n.into_string().ok())
        .filter_map(|n| n.strip_prefix(PREFIX).map(str::to_string))
        .filter(|c| valid_group(c))
        .collect())
}

/// The request for `credential` is carried out.
pub fn done(root: &StateRoot, credential: &str) -> Result<()> {
    crate::fsx::remove_file(&request_path(root, credential)).map(|_| ())
}

/// `credential`'s hold as the daemon last saved it (`None`: not held).
pub fn saved_hold(root: &StateRoot, credential: &str) -> Result<Option<Hold>> {
    #[derive(serde::Deserialize)]
    struct Saved {
        #[serde(default)]
        holds: Holds,
    }
    let saved: Option<Saved> = atomic::read_json(&super::files::economy_path(root))?;
    Ok(saved.and_then(|mut s| s.holds.groups.remove(credential)))
}

/// The credentials the config knows: `default` and each `[credential.NAME]`.
pub fn known(config: &Config) -> Vec<String> {
    let mut names: Vec<String> = config.credentials.keys().cloned().collect();
    if !names.iter().any(|n| n == DEFAULT_CREDENTIAL) {
        names.insert(0, DEFAULT_CREDENTIAL.to_string());
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_request_files_with_a_valid_credential_name_are_pending() {
        let dir = tempfile::tempdir().unwrap();
        let root = StateRoot::new(dir.path());
        std::fs::create_dir(root.daemon_dir()).unwrap();
        for name in [
            "credential-release.default",
            "credential-release.-x",
            "credential-release.",
            "economy.json",
            ".credential-release.team",
        ] {
            std::fs::write(root.daemon_dir().join(name), "").unwrap();
        }
        request(&root, "team-b", "asked").unwrap();
        let mut got = pending(&root).unwrap();
        got.sort();
        assert_eq!(got, ["default", "team-b"]);
        done(&root, "team-b").unwrap();
        done(&root, "team-b").unwrap();
        assert_eq!(pending(&root).unwrap(), ["default"]);
    }
}
