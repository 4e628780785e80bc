//! Sessions' git worktrees (issue 12, "Workspaces"), on the daemon's side:
//! where a session's worktree goes and on which branch ([`plan`], pure),
//! creating it before the command runs and judging it after ([`create`],
//! [`finish`]: git, so they run off the loop, in the session's task), what
//! session.json records ([`Outcome`]), and the monitor's pruning
//! ([`prune`]). The git work itself is `crate::workspace`.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::Serialize;

use crate::catalogue::Code;
use crate::clock::Timestamp;
use crate::config::{AgentConfig, WorkspaceSettings};
use crate::state::AgentDir;
use crate::workspace::{self, Workspace, WorkspaceError, WorkspaceSpec};

/// Where an agent's worktrees go: `{root}/{agent}/` with a configured root,
/// else `{agent dir}/workspaces/`.
pub fn root_of(settings: &WorkspaceSettings, agent: &AgentConfig, dir: &AgentDir) -> PathBuf {
    workspace::agent_root(settings.root.as_deref(), agent.name.as_str(), &dir.path)
}

/// The worktree of one session: `{root}/{session_id}` on the branch the
/// template makes (`rio/research-2026-11-24`); for a session that claimed
/// a flow's hand-off as its Actor (or as its Judge, in the Actor's
/// repository), the cycle's worktree on the cycle's one branch
/// (`crate::flow::cycle_worktree`). Pure.
pub fn plan(
    settings: &WorkspaceSettings,
    agent: &AgentConfig,
    dir: &AgentDir,
    session_id: &str,
    instance: &str,
    now: Timestamp,
) -> WorkspaceSpec {
    let number = instance
        .rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let date = now.0.format("%Y-%m-%d").to_string();
    WorkspaceSpec {
        repo: settings.repo.clone(),
        base: settings.base.clone(),
        path: root_of(settings, agent, dir).join(session_id),
        branch: workspace::branch_name(
            &settings.branch,
            agent.name.as_str(),
            number,
            agent.session.session_type.as_str(),
            &date,
        ),
    }
}

/// The catalogue code of a workspace failure.
pub fn code_of(e: &WorkspaceError) -> Code {
    match e {
        WorkspaceError::NotARepo { .. } => Code::WorkspaceNotARepo,
        WorkspaceError::Locked { .. } => Code::WorkspaceLocked,
        WorkspaceError::Failed { .. } => Code::WorkspaceFailed,
    }
}

/// Create the worktree (blocking: git, lock waits up to 5 s); a flow
/// cycle's is opened again where its last step left it.
pub fn create(spec: &WorkspaceSpec) -> Result<Workspace, WorkspaceError> {
    if workspace::is_cycle_branch(&spec.branch) {
        workspace::open_cycle(spec)
    } else {
        workspace::create(spec)
    }
}

/// What became of a session's worktree: session.json's `workspace`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Outcome {
    pub path: PathBuf,
    pub branch: String,
    pub base_commit: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head_commit: Option<String>,
    /// Uncommitted changes at the end.
    pub dirty: bool,
    /// Commits not on the base.
    pub commits_ahead: u32,
    /// `kept` (it holds work), `removed` (clean), `reset` (invalid
    /// commits: removed, what it held set aside), or `error`.
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why its commits were invalid (`workspace::invalid_commits`), and
    /// the branches what it held was set aside on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invalid: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub set_aside: Vec<String>,
}

/// After the session (blocking: git): its head and state; removed when it
/// holds nothing (no change, no commit beyond the base), kept otherwise.
pub fn finish(repo: &Path, ws: &Workspace) -> Outcome {
    let mut out = Outcome {
        path: ws.path.clone(),
        branch: ws.branch.clone(),
        base_commit: ws.base_commit.clone(),
        head_commit: None,
        dirty: false,
        commits_ahead: 0,
        state: "error",
        error: None,
        invalid: None,
        set_aside: Vec::new(),
    };
    // Seed 002's `invalid_commits`: a broken git state is reset to the base.
    match workspace::git_state(ws) {
        Ok(state) => {
            if let Some(why) = workspace::invalid_commits(&state, &ws.branch) {
                out.head_commit = state.head;
                let mut why = why;
                match workspace::reset_invalid(repo, ws) {
                    Ok(kept) => {
                        out.state = "reset";
                        if !kept.is_empty() {
                            why.push_str(&format!(
                                "; set aside on the branch {}",
                                kept.join(" and ")
                            ));
                        }
                        out.set_aside = kept;
                    }
                    Err(e) => out.error = Some(e.to_string()),
                }
                out.invalid = Some(why);
                return out;
            }
        }
        Err(e) => {
            out.error = Some(e.to_string());
            return out;
        }
    }
    match workspace::finish(ws, &ws.base_commit) {
        Ok(f) => {
            out.head_commit = Some(f.head_commit);
            out.dirty = f.dirty;
            out.commits_ahead = f.commits_ahead;
            // A flow cycle's worktree stays for its next step: the flow
            // removes it when the cycle closes.
            if f.dirty || f.commits_ahead > 0 || workspace::is_cycle_branch(&ws.branch) {
                out.state = "kept";
            } else {
                match workspace::remove(repo, ws) {
                    Ok(()) => out.state = "removed",
                    Err(e) => out.error = Some(e.to_string()),
                }
            }
        }
        Err(e) => out.error = Some(e.to_string()),
    }
    out
}

/// One agent's worktrees for the monitor to prune.
#[derive(Debug, Clone)]
pub struct PruneJob {
    pub agent: String,
    pub repo: PathBuf,
    pub root: PathBuf,
    pub base: String,
    pub retention: std::time::Duration,
    pub prune_unpushed: bool,
}

/// The jobs of every agent with a workspace (one per agent).
pub fn prune_jobs<'a>(
    agents: impl Iterator<Item = &'a AgentConfig>,
    dir: impl Fn(&AgentConfig) -> AgentDir,
) -> Vec<PruneJob> {
    agents
        .filter_map(|a| {
            let w = a.session.workspace.as_ref()?;
            Some(PruneJob {
                agent: a.name.to_string(),
                repo: w.repo.clone(),
                root: root_of(w, a, &dir(a)),
                base: w.base.clone(),
                retention: w.retention,
                prune_unpushed: w.prune_unpushed,
            })
        })
        .collect()
}

/// Prune (blocking: git): worktrees under each job's root whose session is
/// not running (`live`), clean ones at once, kept ones past retention
/// (never one with unpushed commits unless configured). One line per
/// worktree removed or kept, and the errors. `now` is the daemon's clock.
pub fn prune(jobs: &[PruneJob], live: &[PathBuf], now: SystemTime) -> (Vec<String>, Vec<String>) {
    let mut lines = Vec::new();
    let mut errors = Vec::new();
    for job in jobs {
        if !job.root.is_dir() {
            continue;
        }
        match workspace::prune(
            &job.repo,
            &job.root,
            &job.base,
            live,
            job.retention,
            now,
            job.prune_unpushed,
        ) {
            Ok(report) => {
                for (path, why) in report.removed {
                    lines.push(format!("{}: removed {} ({why})", job.agent, path.display()));
                }
            }
            Err(e) => errors.push(format!("{}: {e}", job.agent)),
        }
    }
    (lines, errors)
}
