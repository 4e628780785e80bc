//! Closing a flow's cycle, under its lock: archived as approved,
//! rejected or stopped ([`close`]); approved, its branch published and
//! `on_approve` run; its worktree removed (the branch stays with its
//! work).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use super::cycle;
use super::locked::{Applied, DIR_MODE, Locked, append, short};
use super::{ActorWork, Answer, Closed, Cycle, archive_name};
use crate::clock::Timestamp;
use crate::config::FlowSettings;
use crate::error::Result;
use crate::state::atomic;

/// An answer to a cycle that closed while its session ran (a stop): the
/// worktree the session left is removed as the close would have.
pub(super) fn remove_closed_worktree(
    l: &Locked,
    flow: &FlowSettings,
    a: &Answer,
    out: &mut Applied,
) {
    let closed = l.state.closed.iter().any(|x| x.id == a.cycle);
    if !closed || l.state.current.as_ref().is_some_and(|c| c.id == a.cycle) {
        return;
    }
    if let Some(ws) = &a.workspace
        && crate::workspace::is_cycle_branch(&ws.branch)
    {
        remove_worktree(l, flow, &a.cycle, None, a.ended_at, out);
    }
}

/// Archive the open cycle as `outcome` (approved: then run `on_approve`).
pub(super) fn close(
    l: &mut Locked,
    flow: &FlowSettings,
    outcome: &str,
    reason: Option<String>,
    by: &str,
    now: Timestamp,
    out: &mut Applied,
) -> Result<()> {
    let Some(c) = l.state.current.clone() else {
        return Ok(());
    };
    let stopped = outcome != "approved";
    let title = if stopped { "Stopped" } else { "Approved" };
    let text = match &reason {
        Some(r) => format!("{title} by {by}: {r}"),
        None => format!("{title} by {by}."),
    };
    l.add_section(outcome, &cycle::note(outcome, title, now, &text))?;
    atomic::create_dir(&l.dir.archive(), DIR_MODE)?;
    let archive = l.dir.archive().join(archive_name(&c.id, stopped));
    if crate::fsx::exists(&l.dir.cycle_file()) && !crate::fsx::exists(&archive) {
        atomic::rename(&l.dir.cycle_file(), &archive)?;
    }
    let run_approval = !stopped && (!flow.on_approve.is_empty() || flow.publish.is_some());
    l.state.current = None;
    l.state.closed.push(Closed {
        id: c.id.clone(),
        outcome: outcome.to_string(),
        closed_at: now,
        archive: archive.display().to_string(),
        reason: reason.clone(),
    });
    if run_approval {
        // Noted before it runs: a crash while it runs is never followed by
        // a second run (the next pass records it as interrupted).
        l.state
            .extra
            .insert("approving".into(), json!({"cycle": c.id, "since": now}));
    }
    let keep = l.state.closed.len().saturating_sub(super::CLOSED_KEPT);
    l.state.closed.drain(..keep);
    l.save()?;
    l.journal(
        now,
        outcome,
        &c.id,
        json!({"by": by, "reason": reason, "archive": archive.display().to_string()}),
    );
    out.lines.push(format!(
        "cycle {} {outcome}; archived as {}",
        c.id,
        archive.display()
    ));
    let published = if run_approval && let Some(settings) = &flow.publish {
        let (ok, result, journaled) = publish_cycle(flow, settings, &c, out);
        let _ = append(&archive, &cycle::note("publish", "publish", now, &result));
        l.journal(now, "published", &c.id, journaled);
        out.lines.push(format!("publish: {result}"));
        ok
    } else {
        true
    };
    if run_approval && !published {
        l.state.extra.remove("approving");
        l.save()?;
    }
    if run_approval && published && !flow.on_approve.is_empty() {
        let result = run_on_approve(flow, &c, now);
        let _ = append(
            &archive,
            &cycle::note("on_approve", "on_approve", now, &result),
        );
        l.journal(now, "on_approve", &c.id, json!({"result": result}));
        out.lines.push(format!("on_approve: {result}"));
    }
    if run_approval && published {
        l.state.extra.remove("approving");
        l.save()?;
    }
    let base = c.branch.as_ref().map(|b| b.base_commit.as_str());
    remove_worktree(l, flow, &c.id, base, now, out);
    Ok(())
}

/// The cycle's worktree removed as it closes (journaled
/// `worktree_removed`); its branch stays when it holds work (the approved
/// change, or a stopped cycle's, for a human). A failure is told and
/// journaled, never fatal: the cycle is closed either way.
fn remove_worktree(
    l: &Locked,
    flow: &FlowSettings,
    cycle: &str,
    base: Option<&str>,
    now: Timestamp,
    out: &mut Applied,
) {
    let Some(spec) = super::cycle_worktree(&l.root, flow, cycle) else {
        return;
    };
    if std::fs::symlink_metadata(&spec.path).is_err() {
        return;
    }
    let ws = crate::workspace::Workspace {
        path: spec.path.clone(),
        branch: spec.branch.clone(),
        base_commit: base.unwrap_or(&spec.base).to_string(),
    };
    let path = spec.path.display().to_string();
    match crate::workspace::remove(&spec.repo, &ws) {
        Ok(()) => {
            out.lines.push(format!(
                "cycle {cycle}: worktree {path} removed (branch {})",
                spec.branch
            ));
            l.journal(
                now,
                "worktree_removed",
                cycle,
                json!({"worktree": path, "branch": spec.branch}),
            );
        }
        Err(e) => {
            out.lines
                .push(format!("cycle {cycle}: worktree {path} not removed: {e}"));
            l.journal(
                now,
                "worktree_not_removed",
                cycle,
                json!({"worktree": path, "error": e.to_string()}),
            );
        }
    }
}

/// Publish the approved cycle's branch (`[[flow]] publish`): a line for
/// the archive, whether `on_approve` may run (published, or nothing to
/// merge), and the error record of a failure in `out`. Journaled as
/// `published` with the code and the conflict's classification.
fn publish_cycle(
    flow: &FlowSettings,
    settings: &crate::config::PublishSettings,
    c: &Cycle,
    out: &mut Applied,
) -> (bool, String, serde_json::Value) {
    use super::publish::{self, Published};
    use crate::catalogue::{Code, ErrorRecord};
    let Some(work) = &cycle_work(c) else {
        let record = ErrorRecord::new(
            Code::PublishFailed,
            format!(
                "flow {} cycle {}: not published: the cycle has no Actor worktree",
                flow.name, c.id
            ),
        )
        .agent(&flow.actor);
        out.errors.push((record, true));
        let line = "not published: the cycle has no Actor worktree".to_string();
        return (
            false,
            line.clone(),
            json!({"ok": false, "code": Code::PublishFailed.as_str(), "result": line}),
        );
    };
    let message = format!("flow {} cycle {}", flow.name, c.id);
    let result = publish::publish(Path::new(&work.worktree), &work.branch, settings, &message);
    let target = format!("{} {}", settings.remote, settings.into);
    let (ok, line, code, conflict) = match &result {
        Ok(Published::Pushed {
            commit,
            rebased,
            resolved,
        }) => {
            let how = match (rebased, resolved) {
                (_, Some(_)) => ", rebased (a whitespace-only conflict resolved automatically)",
                (true, None) => ", rebased onto it",
                _ => "",
            };
            (
                true,
                format!(
                    "{} published to {target} at {}{how}",
                    work.branch,
                    short(commit)
                ),
                resolved.as_ref().map(|_| Code::MergeConflict),
                resolved.clone(),
            )
        }
        Ok(Published::NothingToMerge) => (
            true,
            format!(
                "nothing to merge: {} is already in {target}; marked done",
                work.branch
            ),
            Some(Code::MergeNothingToMerge),
            None,
        ),
        Err(e) => (
            false,
            format!("not published ({}): {}", e.code, e.message),
            Some(e.code),
            e.conflict.clone(),
        ),
    };
    let level = conflict.as_ref().map(publish::classify);
    if let Some(code) = code {
        let details = match (&conflict, level) {
            (Some(k), Some(level)) => format!(
                "conflict level {}: {} file(s) ({}), {} conflicting line(s){}{}",
                level.as_str(),
                k.files.len(),
                k.files.join(", "),
                k.lines,
                if k.renamed_or_deleted {
                    ", a file renamed or deleted"
                } else {
                    ""
                },
                if k.whitespace_only {
                    ", whitespace only: resolved automatically"
                } else {
                    ""
                },
            ),
            _ => format!("branch {} of {}; {target}", work.branch, work.worktree),
        };
        let escalate = match code {
            Code::MergeNothingToMerge => false,
            Code::MergeConflict => level != Some(publish::Level::Simple),
            _ => true,
        };
        let record = ErrorRecord::new(code, format!("flow {} cycle {}: {line}", flow.name, c.id))
            .agent(&flow.actor)
            .details(details);
        out.errors.push((record, escalate));
    }
    let journaled = json!({
        "ok": ok,
        "code": code.map(|c| c.as_str()),
        "level": level.map(|l| l.as_str()),
        "files": conflict.as_ref().map(|k| k.files.clone()),
        "lines": conflict.as_ref().map(|k| k.lines),
        "result": line,
    });
    (ok, line, journaled)
}

/// Why a cycle closed without a human: the risk gate let the Judge's PASS
/// through (`flow status` shows it). Pure.
pub fn auto_approved_reason(risk: Option<crate::protocol::summary::RiskLevel>) -> String {
    format!(
        "approved automatically: {} risk",
        risk.map(|r| r.as_str()).unwrap_or("low")
    )
}

/// An approval command that a crash interrupted: recorded, never rerun.
pub(super) fn finish_interrupted_approvals(
    l: &mut Locked,
    now: Timestamp,
    out: &mut Applied,
) -> Result<()> {
    if let Some(v) = l.state.extra.remove("approving") {
        let cycle = v["cycle"].as_str().unwrap_or("?").to_string();
        l.journal(now, "on_approve", &cycle, json!({"result": "interrupted (the daemon stopped while it ran); not run again: check the Actor's branch"}));
        out.lines.push(format!(
            "on_approve of cycle {cycle} was interrupted; not run again"
        ));
        l.save()?;
    }
    Ok(())
}

/// Where the cycle's work is: its worktree on its one branch, or the
/// Actor's last worktree for a cycle from before branches.
fn cycle_work(c: &Cycle) -> Option<ActorWork> {
    match (&c.branch, &c.actor_work) {
        (Some(b), _) => Some(ActorWork {
            worktree: b.worktree.clone(),
            branch: b.branch.clone(),
            base_commit: b.base_commit.clone(),
            lines: 0,
            files: 0,
        }),
        (None, Some(w)) => Some(w.clone()),
        (None, None) => None,
    }
}

/// Run `on_approve` in the cycle's worktree, on its one branch (in the
/// Actor's last worktree for a cycle from before branches), under its
/// timeout.
fn run_on_approve(flow: &FlowSettings, c: &Cycle, _now: Timestamp) -> String {
    let Some(work) = cycle_work(c) else {
        return "not run: the cycle has no Actor worktree".into();
    };
    let argv: Vec<String> = flow
        .on_approve
        .iter()
        .map(|a| {
            a.replace("{flow}", flow.name.as_str())
                .replace("{cycle}", &c.id)
                .replace("{branch}", &work.branch)
                .replace("{worktree}", &work.worktree)
        })
        .collect();
    let dir = if Path::new(&work.worktree).is_dir() {
        PathBuf::from(&work.worktree)
    } else {
        return format!("not run: the worktree {} is gone", work.worktree);
    };
    let mut child = match Command::new(&argv[0])
        .args(&argv[1..])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return format!("`{}` could not be started: {e}", argv.join(" ")),
    };
    let deadline = Instant::now() + flow.on_approve_timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return format!(
                    "`{}` killed after {}",
                    argv.join(" "),
                    humantime::format_duration(flow.on_approve_timeout)
                );
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return format!("waiting for `{}`: {e}", argv.join(" ")),
        }
    }
    match child.wait_with_output() {
        Ok(o) => {
            let mut text = String::from_utf8_lossy(&o.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&o.stderr));
            let tail: String = text
                .chars()
                .rev()
                .take(2000)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            format!(
                "`{}` exited with {}: {}",
                argv.join(" "),
                o.status,
                tail.trim()
            )
        }
        Err(e) => format!("`{}`: {e}", argv.join(" ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::summary::RiskLevel;

    #[test]
    fn an_automatic_approval_says_the_risk_that_let_it_through() {
        let table = [
            (Some(RiskLevel::Low), "approved automatically: low risk"),
            (
                Some(RiskLevel::Medium),
                "approved automatically: medium risk",
            ),
            (None, "approved automatically: low risk"),
        ];
        for (risk, want) in table {
            assert_eq!(auto_approved_reason(risk), want);
        }
    }
}
