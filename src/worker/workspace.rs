//! An order's worktree on the worker (issue 24): checked, made before the
//! session runs (its cwd), judged after it ends, with the daemon's own
//! code (`crate::daemon::workspaces`: `create`, `finish`).
//!
//! The order is someone else's input, and making a worktree removes what
//! stands at its path, so the worker makes one only where its own config
//! says ([`Allowed`]): for an agent whose `[agent.session.workspace]` it
//! has, of that repository (at that path on this host: a clone), directly
//! under that agent's workspace root, on a branch and from a base git
//! takes as names, not options ([`check`], pure); and no component of the
//! path may be a symbolic link ([`no_links`]). A flow cycle's branch is
//! refused (cycles do not run on workers yet).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use agent_state_cluster::{SessionSpec, WorkspaceEnd, WorkspaceJudged, WorkspaceOrder};

use crate::catalogue::Code;
use crate::daemon::workspaces::{self, Outcome};
use crate::workspace::{Workspace, WorkspaceSpec, is_cycle_branch, validate_branch};

/// Where this worker's config lets an agent's worktrees be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    /// `[agent.session.workspace] repo`.
    pub repo: PathBuf,
    /// The agent's workspace root (`root`/AGENT, or its directory's
    /// `workspaces/`), as `crate::daemon::workspaces::root_of` says.
    pub root: PathBuf,
}

/// By agent name.
pub type Allowances = BTreeMap<String, Allowed>;

/// Why an order's worktree is not made: its catalogue code, and a
/// sentence naming the field and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Refused {
    pub code: Code,
    pub reason: String,
}

impl Refused {
    fn field(code: Code, field: &str, why: String) -> Refused {
        Refused {
            code,
            reason: format!("the order's spec: `workspace.{field}` {why}"),
        }
    }

    /// The end's `workspace`.
    pub fn end(&self) -> WorkspaceEnd {
        WorkspaceEnd::NotMade {
            code: self.code.as_str().to_string(),
            reason: self.reason.clone(),
        }
    }
}

/// An absolute path as written: no `.`, `..` or empty component (which
/// `Path::components` would hide; one trailing `/` is fine).
fn plain_absolute(text: &str) -> bool {
    let text = text
        .strip_suffix('/')
        .filter(|t| !t.is_empty())
        .unwrap_or(text);
    text.strip_prefix('/').is_some_and(|rest| {
        rest.split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
    })
}

/// The worktree of `spec` for `agent` (`None`: the order has none), or why
/// it is refused. `config` names this worker's config in the reasons.
pub fn check(
    agent: &str,
    spec: &SessionSpec,
    allowed: &Allowances,
    config: &Path,
) -> Result<Option<WorkspaceSpec>, Refused> {
    let Some(order) = &spec.workspace else {
        return Ok(None);
    };
    check_order(agent, order, spec.cwd.as_deref(), allowed, config).map(Some)
}

fn check_order(
    agent: &str,
    order: &WorkspaceOrder,
    cwd: Option<&str>,
    allowed: &Allowances,
    config: &Path,
) -> Result<WorkspaceSpec, Refused> {
    use Code::{WorkspaceFailed as Failed, WorkspaceNotARepo as NotARepo};
    let repo = PathBuf::from(&order.repo);
    if !plain_absolute(&order.repo) {
        return Err(Refused::field(
            NotARepo,
            "repo",
            format!(
                "{:?} is not an absolute path without `.` or `..`",
                order.repo
            ),
        ));
    }
    let Some(mine) = allowed.get(agent) else {
        return Err(Refused::field(
            NotARepo,
            "repo",
            format!(
                "{}: this worker's config ({}) has no [agent.session.workspace] for agent {agent}, and a worker makes worktrees only of the repositories its own config names; give it the controller's section for {agent} and a clone of the repository at {}",
                order.repo,
                config.display(),
                order.repo
            ),
        ));
    };
    if repo != mine.repo {
        return Err(Refused::field(
            NotARepo,
            "repo",
            format!(
                "{} is not the repository this worker's config ({}) names for agent {agent} ({}); give both hosts the same workspace.repo, with a clone at that path on this worker",
                order.repo,
                config.display(),
                mine.repo.display()
            ),
        ));
    }
    let path = PathBuf::from(&order.path);
    if !plain_absolute(&order.path) {
        return Err(Refused::field(
            Failed,
            "path",
            format!(
                "{:?} is not an absolute path without `.` or `..`",
                order.path
            ),
        ));
    }
    let name_ok = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
        !n.starts_with('.')
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    });
    if path.parent() != Some(mine.root.as_path()) || !name_ok {
        return Err(Refused::field(
            Failed,
            "path",
            format!(
                "{} is not a session's directory directly under agent {agent}'s workspace root on this worker ({}, from its config {}); give both hosts the same state_root and workspace.root",
                order.path,
                mine.root.display(),
                config.display()
            ),
        ));
    }
    if let Some(cwd) = cwd
        && Path::new(cwd) != path
    {
        return Err(Refused {
            code: Failed,
            reason: format!(
                "the order's spec: `cwd` {cwd} is not its worktree {}: a session with a workspace runs in it",
                order.path
            ),
        });
    }
    if let Err(e) = validate_branch(&order.branch) {
        return Err(Refused::field(Failed, "branch", e.to_string()));
    }
    if is_cycle_branch(&order.branch) {
        return Err(Refused::field(
            Failed,
            "branch",
            format!(
                "{:?} is a flow cycle's branch: cycles do not run on workers yet",
                order.branch
            ),
        ));
    }
    let base_ok = !order.base.is_empty()
        && !order.base.starts_with('-')
        && !order
            .base
            .chars()
            .any(|c| c.is_whitespace() || c.is_control());
    if !base_ok {
        return Err(Refused::field(
            Failed,
            "base",
            format!("{:?} is not a branch, tag or commit", order.base),
        ));
    }
    Ok(WorkspaceSpec {
        repo,
        base: order.base.clone(),
        path,
        branch: order.branch.clone(),
    })
}

/// No component of `path` that exists (from `/` down) is a symbolic link.
pub fn no_links(path: &Path) -> Result<(), Refused> {
    let mut at = PathBuf::new();
    for c in path.components() {
        at.push(c);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(Refused::field(
                    Code::WorkspaceFailed,
                    "path",
                    format!(
                        "{}: {} is a symbolic link; a worktree is made only where no component of its path is one (give the real path in the config)",
                        path.display(),
                        at.display()
                    ),
                ));
            }
            Ok(_) => {}
            // Not there yet: made by git, under a checked parent.
            Err(_) => return Ok(()),
        }
    }
    Ok(())
}

/// Makes the worktree (git, off the runtime's threads); the reason and
/// the end's `workspace` if it cannot be.
pub async fn make(spec: WorkspaceSpec) -> Result<Workspace, (String, WorkspaceEnd)> {
    let made = tokio::task::spawn_blocking(move || workspaces::create(&spec)).await;
    let (code, e) = match made {
        Ok(Ok(ws)) => return Ok(ws),
        Ok(Err(e)) => (workspaces::code_of(&e), e.to_string()),
        Err(e) => (Code::WorkspaceFailed, e.to_string()),
    };
    // The local run's words.
    let reason = format!("the session's workspace could not be made: {e}");
    Err((
        reason.clone(),
        WorkspaceEnd::NotMade {
            code: code.as_str().to_string(),
            reason,
        },
    ))
}

/// Judges the worktree after its session, if one was made (removed when it
/// holds nothing).
pub async fn judge(made: Option<(PathBuf, Workspace)>) -> Option<WorkspaceEnd> {
    let (repo, ws) = made?;
    Some(judge_made(repo, ws).await)
}

async fn judge_made(repo: PathBuf, ws: Workspace) -> WorkspaceEnd {
    let path = ws.path.clone();
    let outcome = tokio::task::spawn_blocking(move || workspaces::finish(&repo, &ws)).await;
    match outcome {
        Ok(o) => WorkspaceEnd::Judged(judged_of(&o)),
        Err(e) => WorkspaceEnd::NotMade {
            code: Code::WorkspaceFailed.as_str().to_string(),
            reason: format!("cannot judge the worktree {}: {e}", path.display()),
        },
    }
}

/// The end's form of session.json's `workspace`.
pub fn judged_of(o: &Outcome) -> WorkspaceJudged {
    WorkspaceJudged {
        path: o.path.display().to_string(),
        branch: o.branch.clone(),
        base_commit: o.base_commit.clone(),
        head_commit: o.head_commit.clone(),
        dirty: o.dirty,
        commits_ahead: o.commits_ahead,
        state: o.state.to_string(),
        error: o.error.clone(),
        invalid: o.invalid.clone(),
        set_aside: o.set_aside.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed() -> Allowances {
        Allowances::from([(
            "rio".to_string(),
            Allowed {
                repo: "/srv/repo".into(),
                root: "/srv/state/rio/workspaces".into(),
            },
        )])
    }

    fn order(repo: &str, path: &str, branch: &str, base: &str) -> WorkspaceOrder {
        WorkspaceOrder {
            repo: repo.into(),
            base: base.into(),
            path: path.into(),
            branch: branch.into(),
        }
    }

    const WS: &str = "/srv/state/rio/workspaces/20261127-101500";

    /// (agent, repo, path, cwd, branch, base, the code refused with and a
    /// word of its reason; `None`: made)
    type Row<'a> = (
        &'a str,
        &'a str,
        &'a str,
        Option<&'a str>,
        &'a str,
        &'a str,
        Option<(Code, &'a str)>,
    );

    #[test]
    fn an_order_is_checked_against_the_workers_config() {
        use Code::{WorkspaceFailed as F, WorkspaceNotARepo as N};
        #[rustfmt::skip]
        let table: &[Row] = &[
            ("rio", "/srv/repo", WS, Some(WS), "rio/r-1", "main", None),
            ("rio", "/srv/repo", WS, None, "rio/r-1", "origin/main", None),
            ("rio", "/srv/repo/", WS, None, "rio/r-1", "main", None),
            ("clay", "/srv/repo", WS, None, "rio/r-1", "main", Some((N, "no [agent.session.workspace] for agent clay"))),
            ("rio", "/srv/other", WS, None, "rio/r-1", "main", Some((N, "`workspace.repo` /srv/other is not the repository"))),
            ("rio", "srv/repo", WS, None, "rio/r-1", "main", Some((N, "`workspace.repo`"))),
            ("rio", "/", WS, None, "rio/r-1", "main", Some((N, "`workspace.repo`"))),
            ("rio", "/srv/repo/../etc", WS, None, "rio/r-1", "main", Some((N, "`workspace.repo`"))),
            ("rio", "/srv/repo", "../../etc", None, "rio/r-1", "main", Some((F, "`workspace.path` \"../../etc\""))),
            ("rio", "/srv/repo", "/srv/state/rio/workspaces/../../../etc", None, "rio/r-1", "main", Some((F, "`workspace.path`"))),
            ("rio", "/srv/repo", "/srv/state/rio/workspaces/./x", None, "rio/r-1", "main", Some((F, "`workspace.path`"))),
            ("rio", "/srv/repo", "/srv/state/rio//workspaces/x", None, "rio/r-1", "main", Some((F, "`workspace.path`"))),
            ("rio", "/srv/repo", "/etc", None, "rio/r-1", "main", Some((F, "directly under agent rio's workspace root"))),
            ("rio", "/srv/repo", "/srv/state/rio/workspaces", None, "rio/r-1", "main", Some((F, "`workspace.path`"))),
            ("rio", "/srv/repo", "/srv/state/rio/workspaces/a/b", None, "rio/r-1", "main", Some((F, "`workspace.path`"))),
            ("rio", "/srv/repo", "/srv/state/rio/workspaces/.git", None, "rio/r-1", "main", Some((F, "`workspace.path`"))),
            ("rio", "/srv/repo", WS, Some("/tmp"), "rio/r-1", "main", Some((F, "`cwd` /tmp"))),
            ("rio", "/srv/repo", WS, None, "-rio", "main", Some((F, "`workspace.branch`"))),
            ("rio", "/srv/repo", WS, None, "a..b", "main", Some((F, "`workspace.branch`"))),
            ("rio", "/srv/repo", WS, None, "agent-state/flow/docs/2026-11-27-001", "main", Some((F, "flow cycle"))),
            ("rio", "/srv/repo", WS, None, "rio/r-1", "--output=/x", Some((F, "`workspace.base`"))),
            ("rio", "/srv/repo", WS, None, "rio/r-1", "", Some((F, "`workspace.base`"))),
            ("rio", "/srv/repo", WS, None, "rio/r-1", "main two", Some((F, "`workspace.base`"))),
        ];
        for &(agent, repo, path, cwd, branch, base, want) in table {
            let got = check_order(
                agent,
                &order(repo, path, branch, base),
                cwd,
                &allowed(),
                Path::new("/etc/agent-state/config.toml"),
            );
            match (want, got) {
                (None, Ok(spec)) => {
                    assert_eq!(spec.path, PathBuf::from(path));
                    assert_eq!(spec.repo, PathBuf::from(repo));
                    assert_eq!(spec.branch, branch);
                }
                (Some((code, word)), Err(e)) => {
                    assert_eq!(e.code, code, "{path} {branch} {base}: {e}");
                    assert!(e.reason.contains(word), "{word:?} not in: {e}");
                }
                (want, got) => {
                    panic!("{agent} {repo} {path} {branch} {base}: want {want:?}, got {got:?}")
                }
            }
        }
    }

    #[test]
    fn a_symlinked_component_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join("link")).unwrap();
        std::os::unix::fs::symlink("/etc", real.join("last")).unwrap();
        let table: &[(PathBuf, Option<&str>)] = &[
            (real.join("s1"), None),
            (real.join("not/yet/there"), None),
            (dir.path().join("link/s1"), Some("link is a symbolic link")),
            (real.join("last"), Some("last is a symbolic link")),
        ];
        for (path, want) in table {
            match (want, no_links(path)) {
                (None, Ok(())) => {}
                (Some(word), Err(e)) => {
                    assert!(e.reason.contains(word), "{e}");
                    assert!(e.reason.contains("`workspace.path`"), "{e}");
                }
                (want, got) => panic!("{}: want {want:?}, got {got:?}", path.display()),
            }
        }
    }
}
