//! Changing a flow's files, under its `.lock`: a cycle started, an answer
//! applied (the daemon), a human's approval, rejection or stop (the CLI),
//! and the delivery of the messages decided. The order of the writes is
//! the crash-safety argument of the module docs (`crate::flow`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use super::close::{
    auto_approved_reason, close, finish_interrupted_approvals, remove_closed_worktree,
};
use super::cycle::{self, Contribution};
use super::locked::{ANSWERS_MODE, Applied, DIR_MODE, Locked, context, open, short};
use super::route::{self, Decision, Next};
use super::{ActorWork, Answer, Cycle, CycleStatus, FlowDir, next_cycle_id};
use crate::agent_name::AgentName;
use crate::clock::Timestamp;
use crate::config::{Config, FlowSettings};
use crate::error::{Error, Result};
use crate::protocol::summary::{self as blocks, Role};
use crate::state::{StateRoot, atomic};

/// `flow start FLOW --goal TEXT`: a new cycle, its file, and the Planner's
/// task. Refused while the flow has an open cycle.
pub fn start(
    root: &StateRoot,
    flow: &FlowSettings,
    goal: &str,
    by: &str,
    now: Timestamp,
) -> Result<(Cycle, Applied)> {
    let goal = goal.trim();
    if goal.is_empty() {
        return Err(Error::Usage(
            "--goal is empty: say what the cycle is for".into(),
        ));
    }
    // Every role's directory first: nothing is opened that cannot be sent.
    for agent in [&flow.planner, &flow.actor, &flow.judge, &flow.human] {
        root.agent(agent).require()?;
    }
    let mut l = open(root, flow)?;
    if let Some(c) = &l.state.current {
        return Err(Error::Usage(format!(
            "flow {} has an open cycle, {} ({}); finish it first (`agent-state flow approve|reject|stop {}`)",
            flow.name,
            c.id,
            c.status.as_str(),
            c.id
        )));
    }
    let mut out = Applied::default();
    let (id, numbers) = next_cycle_id(&l.state.numbers, &now.date());
    let mut c = Cycle {
        id: id.clone(),
        goal: goal.to_string(),
        started_at: now,
        started_by: by.to_string(),
        status: CycleStatus::Running,
        step: 0,
        awaiting: None,
        insufficient: 0,
        risk: None,
        reason: None,
        actor_work: None,
        branch: None,
        updated_at: now,
        question_key: uuid::Uuid::new_v4().simple().to_string(),
    };
    atomic::write_file(
        &l.root.store,
        &l.dir.cycle_file(),
        cycle::opening(flow.name.as_str(), &c).as_bytes(),
        crate::state::STATE_FILE_MODE,
    )?;
    let file = l.dir.cycle_file().display().to_string();
    let note = format!("The human ({by}) opened this cycle with the goal above.");
    let plan = route::hand_to(
        &mut c,
        Role::Planner,
        by,
        &note,
        &context(flow, &file, None, now),
    );
    l.state.current = Some(c.clone());
    l.state.numbers = numbers;
    l.state.outbox.extend(plan.messages);
    l.save()?;
    l.journal(now, "cycle_started", &id, json!({"goal": goal, "by": by}));
    out.lines
        .push(format!("cycle {id} started: {}", plan.verdict));
    l.deliver(root, now, &mut out)?;
    Ok((c, out))
}

/// Keep what a role's session answered, durably, before its end is
/// recorded (the daemon calls this, then [`apply_answers`]).
pub fn record_answer(root: &StateRoot, answer: &Answer) -> Result<PathBuf> {
    let name = AgentName::parse(&answer.flow)?;
    let dir = FlowDir::new(root, &name);
    atomic::create_dir(&dir.path, DIR_MODE)?;
    atomic::create_dir(&dir.answers(), ANSWERS_MODE)?;
    let path = dir
        .answers()
        .join(format!("{}-{}.json", answer.agent, answer.session_id));
    atomic::write_json(&root.store, &path, answer)?;
    Ok(path)
}

/// Apply every answer waiting in the flow's `answers/` (and deliver what a
/// crash left in the outbox): the daemon, after a role's session ended and
/// at start-up.
pub fn apply_answers(
    root: &StateRoot,
    config: &Config,
    flow: &FlowSettings,
    now: Timestamp,
) -> Result<Applied> {
    let mut out = Applied::default();
    let dir = FlowDir::new(root, &flow.name);
    let pending = !crate::fsx::list(&dir.answers())?.is_empty();
    if !pending && !crate::fsx::exists(&dir.state()) {
        return Ok(out);
    }
    let mut l = open(root, flow)?;
    l.deliver(root, now, &mut out)?;
    finish_interrupted_approvals(&mut l, now, &mut out)?;
    remove_stale_temps(&l.dir.answers());
    let mut names: Vec<String> = crate::fsx::list(&l.dir.answers())?
        .into_iter()
        .filter_map(|n| n.into_string().ok())
        .filter(|n| n.ends_with(".json") && !crate::fsx::is_temp_name(n))
        .collect();
    names.sort();
    for name in names {
        let path = l.dir.answers().join(&name);
        let answer: Option<Answer> = match atomic::read_json(&path) {
            Ok(a) => a,
            Err(e) => {
                out.lines.push(format!(
                    "{}: unreadable answer set aside: {e}",
                    path.display()
                ));
                let _ = atomic::rename(&path, &path.with_extension("corrupt"));
                continue;
            }
        };
        if let Some(answer) = answer {
            apply_one(config, flow, &mut l, &answer, now, &mut out)?;
            // The hand-off became a task in the role's tasks.json: done.
            if let Err(e) = complete_task(root, &answer, now) {
                out.lines.push(format!(
                    "{}: cannot mark the hand-off's task completed: {e}",
                    answer.agent
                ));
            }
        }
        crate::fsx::remove_file(&path)?;
        atomic::sync_dir(&l.dir.answers())?;
        l.deliver(root, now, &mut out)?;
    }
    Ok(out)
}

/// Temp files of answers whose writer died (a kill mid-write): removed once
/// they are a minute old (a younger one may be a write in progress: the
/// daemon keeps answers without the flow's lock).
fn remove_stale_temps(dir: &Path) {
    let Ok(names) = crate::fsx::list(dir) else {
        return;
    };
    for name in names.into_iter().filter_map(|n| n.into_string().ok()) {
        if !crate::fsx::is_temp_name(&name) {
            continue;
        }
        let path = dir.join(&name);
        let old = crate::fsx::metadata(&path)
            .ok()
            .flatten()
            .map(|st| crate::fsx::modified(&st))
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age > Duration::from_secs(60));
        if old {
            let _ = crate::fsx::remove_file(&path);
        }
    }
}

fn apply_one(
    _config: &Config,
    flow: &FlowSettings,
    l: &mut Locked,
    a: &Answer,
    now: Timestamp,
    out: &mut Applied,
) -> Result<()> {
    let Some(c) = l.state.current.clone() else {
        out.lines.push(format!(
            "answer of {} (session {}) for cycle {} ignored: the flow has no open cycle",
            a.agent, a.session_id, a.cycle
        ));
        remove_closed_worktree(l, flow, a, out);
        return Ok(());
    };
    if c.id != a.cycle {
        remove_closed_worktree(l, flow, a, out);
    }
    let awaited = c
        .awaiting
        .as_ref()
        .is_some_and(|w| w.message_id == a.message_id && c.status == CycleStatus::Running);
    if !awaited {
        out.lines.push(format!(
            "answer of {} (session {}) to step {} of cycle {} ignored: that step is not awaited (already answered)",
            a.agent, a.session_id, a.step, a.cycle
        ));
        return Ok(());
    }
    let role = c.awaiting.as_ref().map(|w| w.role).unwrap_or(Role::Planner);
    let block = blocks::parse_signal_block(&a.text);
    let summary = blocks::parse_context_summary(&a.text).and_then(|r| r.ok());
    // A session in the cycle's worktree: its step is committed once on the
    // cycle's branch (a ref keeps it) and measured between commits.
    let on_branch = a
        .workspace
        .as_ref()
        .filter(|w| crate::workspace::is_cycle_branch(&w.branch));
    let mut branch = c.branch.clone();
    let mut total: Option<super::scope::Measured> = None;
    let measured = match (role, &a.workspace, on_branch) {
        (Role::Actor, Some(_), Some(ws)) => {
            Some(actor_step(flow, &c, a, ws).map(|(step, whole, b)| {
                total = Some(whole);
                branch = Some(b);
                step
            }))
        }
        (Role::Actor, Some(ws), None) => {
            Some(super::scope::measure(Path::new(&ws.path), &ws.base_commit))
        }
        (Role::Actor, None, _) => Some(Err(super::scope::ScopeError::NoWorktree)),
        _ => None,
    };
    // The Judge's own change to its workspace (it writes no code).
    let judged = match (role, &a.workspace, on_branch) {
        (Role::Judge, Some(_), Some(ws)) => Some(judge_step(flow, &c, a, ws).map(|(m, snap)| {
            if flow.limits.judge_writes_code
                && let Some(b) = branch.as_mut()
            {
                b.head = snap;
            }
            m.scope
        })),
        (Role::Judge, Some(ws), None) => {
            Some(super::scope::measure(Path::new(&ws.path), &ws.base_commit).map(|m| m.scope))
        }
        _ => None,
    };
    let work = route::RoleWork {
        plan_lines: if role == Role::Planner {
            route::plan_lines(&a.text)
        } else {
            0
        },
        paths: measured
            .as_ref()
            .and_then(|m| m.as_ref().ok())
            .map(|m| m.paths.clone())
            .unwrap_or_default(),
        judge: judged.as_ref().and_then(|j| j.as_ref().ok()).copied(),
    };
    let decision = match &judged {
        Some(Err(why)) => Decision::Stop {
            reason: format!("the Judge's workspace could not be measured: {why}"),
        },
        _ => route::decide(&route::Answered {
            flow,
            cycle: &c,
            agent: &a.agent,
            session_id: &a.session_id,
            block: block.clone(),
            summary: summary.clone(),
            scope: measured
                .as_ref()
                .map(|m| m.as_ref().map(|m| m.scope).map_err(Clone::clone)),
            work,
        }),
    };
    // The branch after the step: an INSUFFICIENT rolled back to the last
    // PASS (or kept), a PASS its new last PASS; the Judge's changes only
    // where it may write code.
    let branch_note = match branch.as_mut() {
        Some(b) => {
            let before = b.head.clone();
            let (target, last_pass) = route::branch_target(
                role,
                &decision,
                flow.on_insufficient,
                on_branch.is_some(),
                &b.head,
                &b.last_pass,
            );
            b.last_pass = last_pass;
            let moved = target.clone().unwrap_or_else(|| b.head.clone());
            // Where the next step starts (a retry of a session that
            // answered nothing too: `workspace::open_cycle`).
            crate::workspace::set_ref(
                Path::new(&b.repo),
                &crate::workspace::cycle_head_ref(&b.branch),
                &moved,
            )
            .map_err(|e| {
                Error::Unavailable(format!(
                    "flow {} cycle {}: the cycle's head cannot be noted: {e}",
                    flow.name, c.id
                ))
            })?;
            // A worktree gone (removed by hand) is opened again at the
            // head by the next step.
            let target = target.filter(|_| Path::new(&b.worktree).is_dir());
            match target {
                Some(t) => {
                    crate::workspace::reset_to(Path::new(&b.worktree), &t).map_err(|e| {
                        Error::Unavailable(format!(
                            "flow {} cycle {}: the cycle's worktree {} cannot be moved to {t}: {e}",
                            flow.name, c.id, b.worktree
                        ))
                    })?;
                    b.head = t.clone();
                    Some(match &decision {
                        Decision::Insufficient { .. } if t != before => format!(
                            "{} rolled back to the last PASS ({}) (on_insufficient = \"rollback\"); the step's commit {} is kept under {}",
                            b.branch,
                            short(&t),
                            short(&before),
                            super::steps_refs(flow.name.as_str(), &c.id)
                        ),
                        Decision::Insufficient { .. } => format!(
                            "{} kept at {} (on_insufficient = \"{}\"): the next Actor step continues it",
                            b.branch,
                            short(&t),
                            flow.on_insufficient.as_str()
                        ),
                        _ => format!("{} at {}", b.branch, short(&t)),
                    })
                }
                None => {
                    (role == Role::Actor).then(|| format!("{} at {}", b.branch, short(&b.head)))
                }
            }
        }
        None => None,
    };
    let file = l.dir.cycle_file().display().to_string();
    let summary_text = summary.as_ref().and_then(|s| s.summary_text());
    let mut cx = context(flow, &file, summary_text, now);
    cx.earlier_blockers = cycle::insufficient_verdicts(&l.cycle_file_text());
    let plan = route::plan(&c, &decision, &cx);
    let signal_line = block
        .as_ref()
        .and_then(|b| b.as_ref().ok())
        .map(|b| b.raw.clone());
    let diff = match (&measured, &a.workspace) {
        (Some(Ok(m)), Some(ws)) => Some((
            m.scope.lines,
            m.scope.files,
            ws.base_commit.as_str(),
            m.diff.as_str(),
        )),
        _ => None,
    };
    let total = total.as_ref().map(|t| (t.scope.lines, t.scope.files));
    l.add_section(
        &format!("step {} {}", c.step, a.session_id),
        &cycle::contribution(&Contribution {
            step: c.step,
            role,
            agent: &a.agent,
            session_id: &a.session_id,
            at: a.ended_at,
            summary: summary.as_ref(),
            signal_line: signal_line.as_deref(),
            answer: &a.text,
            diff,
            total,
            branch: branch_note.as_deref(),
            verdict: &plan.verdict,
        }),
    )?;
    let event = match &decision {
        Decision::Handoff { .. } => "step_handed_over",
        Decision::Insufficient { .. } => "insufficient",
        Decision::Pass { .. } => "passed",
        Decision::AskHuman { .. } => "asked_human",
        Decision::Stop { .. } => "stopped",
    };
    l.journal(
        now,
        event,
        &c.id,
        json!({"step": c.step, "role": role.as_str(), "agent": a.agent, "session_id": a.session_id, "verdict": plan.verdict}),
    );
    out.lines.push(format!(
        "flow {} cycle {} step {}: {}",
        flow.name, c.id, c.step, plan.verdict
    ));
    l.state.outbox.extend(plan.messages.clone());
    match plan.next {
        Next::Open(mut next) => {
            if let (Some(Ok(m)), Some(ws)) = (&measured, &a.workspace) {
                next.actor_work = Some(ActorWork {
                    worktree: ws.path.clone(),
                    branch: ws.branch.clone(),
                    base_commit: ws.base_commit.clone(),
                    lines: m.scope.lines,
                    files: m.scope.files,
                });
            }
            next.branch = branch;
            l.state.current = Some(*next);
            l.save()?;
        }
        Next::Approve => close(
            l,
            flow,
            "approved",
            Some(auto_approved_reason(match &decision {
                Decision::Pass { risk } => Some(*risk),
                _ => c.risk,
            })),
            "the Judge's PASS at low risk (auto)",
            now,
            out,
        )?,
        Next::Stop(reason) => close(l, flow, "stopped", Some(reason), "the daemon", now, out)?,
    }
    Ok(())
}

/// The Actor's step on the cycle's branch: committed once (its step's
/// ref), measured against the step's start (the previous step's head) and,
/// for the cycle so far, against the cycle's base; and the branch after it.
fn actor_step(
    flow: &FlowSettings,
    c: &Cycle,
    a: &Answer,
    ws: &super::AnswerWorkspace,
) -> std::result::Result<
    (
        super::scope::Measured,
        super::scope::Measured,
        super::CycleBranch,
    ),
    super::scope::ScopeError,
> {
    let dir = Path::new(&ws.path);
    if !dir.is_dir() {
        return Err(super::scope::ScopeError::NoWorktree);
    }
    let snap = commit_step(flow, c, a, dir)?;
    let base = c
        .branch
        .as_ref()
        .map(|b| b.base_commit.clone())
        .unwrap_or_else(|| ws.base_commit.clone());
    let step = super::scope::measure_commits(dir, &ws.base_commit, &snap)?;
    let whole = super::scope::measure_commits(dir, &base, &snap)?;
    let branch = super::CycleBranch {
        repo: flow
            .actor_workspace
            .as_ref()
            .map(|w| w.repo.display().to_string())
            .unwrap_or_default(),
        worktree: ws.path.clone(),
        branch: ws.branch.clone(),
        base_commit: base.clone(),
        head: snap,
        last_pass: c
            .branch
            .as_ref()
            .map(|b| b.last_pass.clone())
            .unwrap_or(base),
    };
    Ok((step, whole, branch))
}

/// The Judge's session in the cycle's worktree: what it changed there
/// (committed once under its step's ref, to be measured and set aside),
/// and that commit.
fn judge_step(
    flow: &FlowSettings,
    c: &Cycle,
    a: &Answer,
    ws: &super::AnswerWorkspace,
) -> std::result::Result<(super::scope::Measured, String), super::scope::ScopeError> {
    let dir = Path::new(&ws.path);
    if !dir.is_dir() {
        return Ok((
            super::scope::Measured {
                scope: route::Scope { lines: 0, files: 0 },
                diff: String::new(),
                paths: Vec::new(),
            },
            ws.base_commit.clone(),
        ));
    }
    let snap = commit_step(flow, c, a, dir)?;
    Ok((
        super::scope::measure_commits(dir, &ws.base_commit, &snap)?,
        snap,
    ))
}

/// Commit what a role's session left in the cycle's worktree, once.
fn commit_step(
    flow: &FlowSettings,
    c: &Cycle,
    a: &Answer,
    dir: &Path,
) -> std::result::Result<String, super::scope::ScopeError> {
    crate::workspace::snapshot(
        dir,
        &super::step_ref(flow.name.as_str(), &c.id, c.step),
        &format!(
            "flow {} cycle {} step {} ({}, session {})",
            flow.name, c.id, c.step, a.agent, a.session_id
        ),
    )
    .map_err(|e| super::scope::ScopeError::Branch(e.to_string()))
}

/// Mark the task that a hand-off added to the role's tasks.json completed.
fn complete_task(root: &StateRoot, a: &Answer, now: Timestamp) -> Result<()> {
    use crate::state::tasks::{self, TaskFile, TaskStatus};
    let dir = root.agent(&AgentName::parse(&a.agent)?);
    let lock = dir.lock()?;
    let mut notes = Vec::new();
    let file: TaskFile = dir.load(&lock, now, &mut notes)?;
    let Some(task) = file.tasks.iter().find(|t| {
        t.source_message.as_deref() == Some(a.message_id.as_str())
            && matches!(t.status, TaskStatus::Pending | TaskStatus::Active)
    }) else {
        return Ok(());
    };
    let outcome = format!(
        "answered in session {} (flow {}, cycle {})",
        a.session_id, a.flow, a.cycle
    );
    tasks::update(
        &dir,
        &lock,
        &task.id.clone(),
        TaskStatus::Completed,
        Some(outcome),
        now,
        &mut notes,
    )?;
    Ok(())
}
