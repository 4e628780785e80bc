//! A remote session's worktree, on the controller's side (issue 24): the
//! worktree planned as for a local session ([`crate::daemon::workspaces::plan`])
//! goes into the order ([`order_of`]); the worker makes it, runs the
//! session in it and judges it (`crate::worker::workspace`); its end's
//! [`WorkspaceEnd`] becomes what a local run records: session.json's
//! `workspace` ([`outcome_of`]) or the failure's catalogue code
//! ([`code_of`]). Pure.
//!
//! Not on workers yet, refused with the setting to change ([`refusal`]):
//! a flow cycle's worktree (the flow opens, publishes and removes it on
//! the controller). `verify` commands, with a workspace or without, are
//! refused before (`Unfit::Verify`).

use agent_state_cluster::{WorkspaceJudged, WorkspaceOrder};

use super::Unfit;
use crate::catalogue::Code;
use crate::daemon::workspaces::Outcome;
use crate::workspace::{WorkspaceSpec, is_cycle_branch};

/// Why `planned` cannot run on a worker yet (`None`: it can).
pub fn refusal(planned: &WorkspaceSpec) -> Option<Unfit> {
    if is_cycle_branch(&planned.branch) {
        return Some(Unfit::FlowCycle {
            branch: planned.branch.clone(),
        });
    }
    None
}

/// The order's `workspace`: the plan's paths as they are here, which a
/// worker must have too (a clone of the repository at the same path).
pub fn order_of(plan: &WorkspaceSpec) -> WorkspaceOrder {
    WorkspaceOrder {
        repo: plan.repo.display().to_string(),
        base: plan.base.clone(),
        path: plan.path.display().to_string(),
        branch: plan.branch.clone(),
    }
}

/// session.json's `workspace` from the worker's judgement; a state this
/// controller does not know is an `error`, said so.
pub fn outcome_of(judged: &WorkspaceJudged) -> Outcome {
    let (state, unknown) = match judged.state.as_str() {
        "kept" => ("kept", None),
        "removed" => ("removed", None),
        "reset" => ("reset", None),
        "error" => ("error", None),
        other => (
            "error",
            Some(format!(
                "the worker judged the worktree {other:?}, which this controller does not know"
            )),
        ),
    };
    Outcome {
        path: judged.path.clone().into(),
        branch: judged.branch.clone(),
        base_commit: judged.base_commit.clone(),
        head_commit: judged.head_commit.clone(),
        dirty: judged.dirty,
        commits_ahead: judged.commits_ahead,
        state,
        error: unknown.or_else(|| judged.error.clone()),
        invalid: judged.invalid.clone(),
        set_aside: judged.set_aside.clone(),
    }
}

/// The catalogue code of a worktree a worker could not make; one it does
/// not name is `WORKSPACE_FAILED`.
pub fn code_of(code: &str) -> Code {
    match code {
        "WORKSPACE_NOT_A_REPO" => Code::WorkspaceNotARepo,
        "WORKSPACE_LOCKED" => Code::WorkspaceLocked,
        _ => Code::WorkspaceFailed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn plan(branch: &str) -> WorkspaceSpec {
        WorkspaceSpec {
            repo: PathBuf::from("/srv/repo"),
            base: "main".into(),
            path: PathBuf::from("/srv/ws/rio/20261127-101500"),
            branch: branch.into(),
        }
    }

    #[test]
    fn flow_cycles_are_refused_naming_the_setting() {
        let table: &[(&str, Option<&str>)] = &[
            ("rio/research-2026-11-27", None),
            (
                "agent-state/flow/docs/2026-11-27-001",
                Some("local_sessions = true"),
            ),
        ];
        for &(branch, want) in table {
            let got = refusal(&plan(branch)).map(|u| u.to_string());
            match want {
                None => assert_eq!(got, None, "{branch}"),
                Some(w) => {
                    let got = got.unwrap_or_default();
                    assert!(got.contains(w), "{branch}: {got}");
                    assert!(got.contains("[cluster]"), "{got}");
                }
            }
        }
    }

    #[test]
    fn the_order_carries_the_plan() {
        assert_eq!(
            order_of(&plan("rio/x")),
            WorkspaceOrder {
                repo: "/srv/repo".into(),
                base: "main".into(),
                path: "/srv/ws/rio/20261127-101500".into(),
                branch: "rio/x".into(),
            }
        );
    }

    #[test]
    fn the_judgement_becomes_the_local_outcome() {
        let judged = |state: &str| WorkspaceJudged {
            path: "/srv/ws/rio/s".into(),
            branch: "rio/x".into(),
            base_commit: "a".repeat(40),
            head_commit: Some("b".repeat(40)),
            dirty: false,
            commits_ahead: 1,
            state: state.into(),
            error: None,
            invalid: None,
            set_aside: vec![],
        };
        for (state, want, error) in [
            ("kept", "kept", false),
            ("removed", "removed", false),
            ("reset", "reset", false),
            ("error", "error", false),
            ("exploded", "error", true),
        ] {
            let o = outcome_of(&judged(state));
            assert_eq!(o.state, want, "{state}");
            assert_eq!(o.error.is_some(), error, "{state}");
            assert_eq!(o.path, PathBuf::from("/srv/ws/rio/s"));
            assert_eq!(o.commits_ahead, 1);
        }
        for (code, want) in [
            ("WORKSPACE_NOT_A_REPO", Code::WorkspaceNotARepo),
            ("WORKSPACE_LOCKED", Code::WorkspaceLocked),
            ("WORKSPACE_FAILED", Code::WorkspaceFailed),
            ("SOMETHING_ELSE", Code::WorkspaceFailed),
        ] {
            assert_eq!(code_of(code), want, "{code}");
        }
    }
}
