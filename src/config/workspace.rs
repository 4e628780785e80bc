//! `workspace = { repo = "/srv/teleo", base = "main", ... }` (in `[defaults]`
//! or an `[[agent]]`): each daemon session of the agent runs in its own git
//! worktree of `repo` (issue 12). Read here; created, kept, removed and
//! pruned by the daemon through `crate::workspace`.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::Validator;

/// The default branch name of a session: `rio/research-2026-11-24`.
pub const DEFAULT_BRANCH: &str = "{agent}/{type}-{date}";

/// The start of flows' cycle branches (`agent-state/flow/FLOW/CYCLE`,
/// `crate::workspace::cycle_branch`): no session's template may make one.
pub const CYCLE_BRANCH_PREFIX: &str = "agent-state/flow/";

/// The default: worktrees are kept this long after their session when they
/// hold work (uncommitted changes, commits not on the base).
pub const DEFAULT_RETENTION: &str = "7d";

/// An agent's workspace settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceSettings {
    /// The repository (absolute): its worktrees are the sessions' workspaces.
    pub repo: PathBuf,
    /// What a session's branch starts from (a branch, tag or commit).
    pub base: String,
    /// The branch name: `{agent}`, `{instance}`, `{type}`, `{date}`.
    pub branch: String,
    /// Where worktrees go (absolute); `None`: `{agent dir}/workspaces/`.
    pub root: Option<PathBuf>,
    /// Kept worktrees (with work) are pruned after this, by the monitor.
    pub retention: Duration,
    /// Prune kept worktrees past retention even with commits no remote has.
    pub prune_unpushed: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWorkspace {
    repo: Option<String>,
    base: Option<String>,
    branch: Option<String>,
    root: Option<String>,
    retention: Option<String>,
    prune_unpushed: Option<bool>,
}

impl Validator {
    /// `workspace` of an agent over the one of `[defaults]` (field by field).
    pub(super) fn workspace(
        &mut self,
        field: &str,
        raw: Option<&RawWorkspace>,
        base: Option<&WorkspaceSettings>,
    ) -> Option<WorkspaceSettings> {
        let Some(raw) = raw else {
            return base.cloned();
        };
        let f = |name: &str| format!("{field}.{name}");
        let absolute = |v: &mut Validator, name: &str, text: &str| -> Option<PathBuf> {
            let p = PathBuf::from(text);
            if p.is_absolute() {
                Some(p)
            } else {
                v.problem(
                    f(name),
                    format!("{text:?} is not an absolute path; write the full path, e.g. \"/srv/teleo/repo\""),
                );
                None
            }
        };
        // Every field is checked before a bad one ends this (each problem
        // is reported).
        let repo = match (&raw.repo, base) {
            (Some(r), _) => absolute(self, "repo", r),
            (None, Some(b)) => Some(b.repo.clone()),
            (None, None) => {
                self.problem(
                    f("repo"),
                    "is missing: name the git repository whose worktrees the sessions use, e.g. repo = \"/srv/teleo/repo\"",
                );
                None
            }
        };
        let text = |v: Option<&String>, b: Option<&String>, default: &str| {
            v.or(b).cloned().unwrap_or_else(|| default.to_string())
        };
        let base_ref = text(raw.base.as_ref(), base.map(|b| &b.base), "main");
        if base_ref.trim().is_empty() || base_ref.starts_with('-') {
            self.problem(
                f("base"),
                format!("{base_ref:?} is not a branch, tag or commit"),
            );
        }
        let branch = text(raw.branch.as_ref(), base.map(|b| &b.branch), DEFAULT_BRANCH);
        if branch.starts_with(CYCLE_BRANCH_PREFIX) {
            self.problem(
                f("branch"),
                format!("{branch:?} starts with {:?}, which names flows' cycle branches; choose another template, e.g. \"{{agent}}/{{type}}-{{date}}\"", CYCLE_BRANCH_PREFIX),
            );
        } else if !branch_template_ok(&branch) {
            self.problem(
                f("branch"),
                format!("{branch:?} does not make a git branch name; use {{agent}}, {{instance}}, {{type}}, {{date}} and letters, digits, / - _ . (not starting with / - or ., no \"..\" or \"//\")"),
            );
        }
        let root = match &raw.root {
            Some(r) => absolute(self, "root", r),
            None => base.and_then(|b| b.root.clone()),
        };
        let retention = match &raw.retention {
            Some(r) => self.duration(&f("retention"), Some(r), DEFAULT_RETENTION),
            None => base.map(|b| b.retention).unwrap_or_else(|| {
                crate::clock::parse_duration(DEFAULT_RETENTION).unwrap_or_default()
            }),
        };
        let prune_unpushed = raw
            .prune_unpushed
            .or(base.map(|b| b.prune_unpushed))
            .unwrap_or(false);
        Some(WorkspaceSettings {
            repo: repo?,
            base: base_ref,
            branch,
            root,
            retention,
            prune_unpushed,
        })
    }
}

/// A branch template that makes names git accepts whatever the placeholders
/// hold (agent names are `[a-z0-9_-]`): checked again, fully, when a
/// worktree is created.
fn branch_template_ok(t: &str) -> bool {
    let filled = t
        .replace("{agent}", "rio")
        .replace("{instance}", "1")
        .replace("{type}", "research")
        .replace("{date}", "2026-11-24");
    !filled.is_empty()
        && filled
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/-_.".contains(c))
        && !filled.starts_with(['/', '-', '.'])
        && !filled.ends_with(['/', '.'])
        && !filled.ends_with(".lock")
        && !filled.contains("..")
        && !filled.contains("//")
        && !filled.contains("/.")
}

#[cfg(test)]
mod tests {
    #[test]
    fn branch_templates() {
        for ok in ["{agent}/{type}-{date}", "agents/{agent}-{instance}", "x"] {
            assert!(super::branch_template_ok(ok), "{ok}");
        }
        for bad in [
            "",
            "-x",
            "/x",
            "a..b",
            "a b",
            "a//b",
            "x.lock",
            "a/.b",
            "{agent}~1",
        ] {
            assert!(!super::branch_template_ok(bad), "{bad}");
        }
    }
}
