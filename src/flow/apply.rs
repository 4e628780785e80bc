//! Changing a flow's files, under its `.lock`: a cycle started, an answer
//! applied (the daemon), a human's approval, rejection or stop (the CLI),
//! and the delivery of the messages decided. The order of the writes is
//! the crash-safety argument of the module docs (`crate::flow`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use super::cycle::{self, Contribution};
use super::route::{self, Context, Decision, Next};
use super::{
    ActorWork, Answer, Closed, Cycle, CycleStatus, FlowDir, FlowState, Pending, archive_name, load,
    next_cycle_id,
};
use crate::agent_name::AgentName;
use crate::clock::Timestamp;
use crate::config::{Config, FlowSettings};
use crate::error::{Error, Result};
use crate::inbox::{MessageType, Outgoing, Priority};
use crate::protocol::summary::{self as blocks, Role};
use crate::state::{StateRoot, atomic, lock};

/// Directories of a flow: readable by everyone who may read the state root.
const DIR_MODE: u32 = 0o755;
/// The answers (raw session output): the service user and its group only.
const ANSWERS_MODE: u32 = 0o750;

/// What was done, in lines for the log or the terminal.
#[derive(Debug, Default)]
pub struct Applied {
    pub lines: Vec<String>,
    /// A reply refused (its lines say why): logged as a warning.
    pub refused: bool,
    /// Errors to raise (a publish that failed), and whether to escalate.
    pub errors: Vec<(crate::catalogue::ErrorRecord, bool)>,
}

struct Locked {
    root: StateRoot,
    dir: FlowDir,
    state: FlowState,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

fn open(root: &StateRoot, flow: &FlowSettings) -> Result<Locked> {
    let dir = FlowDir::new(root, &flow.name);
    atomic::create_dir(&dir.path, DIR_MODE)?;
    let path = dir.lock_path();
    let file = lock::open_private_lock(&path)?;
    let guard = lock::flock_within(file, &path, root.lock_wait)?;
    let state = load(&dir)?.unwrap_or_else(|| FlowState {
        flow: flow.name.to_string(),
        ..FlowState::default()
    });
    Ok(Locked {
        root: root.clone(),
        dir,
        state,
        _lock: guard,
    })
}

impl Locked {
    fn save(&self) -> Result<()> {
        atomic::write_json(&self.root.store, &self.dir.state(), &self.state)
    }

    fn journal(&self, now: Timestamp, event: &str, cycle: &str, detail: serde_json::Value) {
        let mut line = json!({"ts": now, "event": event, "flow": self.state.flow, "cycle": cycle});
        if let (Some(obj), Some(extra)) = (line.as_object_mut(), detail.as_object()) {
            obj.extend(extra.clone());
        }
        let _ = append(&self.dir.journal(), &format!("{line}\n"));
    }

    /// Deliver what the outbox holds (each once), then empty it.
    fn deliver(&mut self, root: &StateRoot, now: Timestamp, out: &mut Applied) -> Result<()> {
        if self.state.outbox.is_empty() {
            return Ok(());
        }
        for p in &self.state.outbox {
            match send(root, p, now) {
                Ok(true) => out
                    .lines
                    .push(format!("sent {} to {}: {}", p.kind, p.to, p.subject)),
                Ok(false) => {}
                Err(e) => {
                    // Kept in the outbox: delivered at the next pass.
                    return Err(e);
                }
            }
        }
        self.state.outbox.clear();
        self.save()
    }

    fn cycle_file_text(&self) -> String {
        crate::fsx::read_limited(&self.dir.cycle_file(), 64 << 20)
            .ok()
            .flatten()
            .map(|(b, _)| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Append `section` (marked `key`) to the cycle file, unless it is there.
    fn add_section(&self, key: &str, section: &str) -> Result<()> {
        if cycle::has(&self.cycle_file_text(), key) {
            return Ok(());
        }
        append(&self.dir.cycle_file(), section)
    }
}

fn append(path: &Path, text: &str) -> Result<()> {
    let mut f = crate::fsx::open_append(path, 0o644)?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_data())
        .map_err(|e| Error::io("appending to", path, e))
}

fn send(root: &StateRoot, p: &Pending, now: Timestamp) -> Result<bool> {
    let to = root.agent(&AgentName::parse(&p.to)?);
    let out = Outgoing {
        from: AgentName::parse(&p.from)?,
        kind: match p.kind.as_str() {
            "flag" => MessageType::Flag,
            "question" => MessageType::Question,
            _ => MessageType::Task,
        },
        priority: if p.high {
            Priority::High
        } else {
            Priority::Normal
        },
        subject: p.subject.clone(),
        body: p.body.clone(),
        source_ref: Some(p.source_ref.clone()),
        expires_at: None,
    };
    crate::inbox::deliver_once(&to, &out, &p.id, now).map(|m| m.is_some())
}

fn context<'a>(
    flow: &'a FlowSettings,
    file: &'a str,
    summary: Option<String>,
    now: Timestamp,
) -> Context<'a> {
    Context {
        flow,
        cycle_file: file,
        summary,
        earlier_blockers: Vec::new(),
        now,
    }
}

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

/// An answer to a cycle that closed while its session ran (a stop): the
/// worktree the session left is removed as the close would have.
fn remove_closed_worktree(l: &Locked, flow: &FlowSettings, a: &Answer, out: &mut Applied) {
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

/// The first 12 characters of a commit.
fn short(commit: &str) -> &str {
    &commit[..commit.len().min(12)]
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

/// Archive the open cycle as `outcome` (approved: then run `on_approve`).
fn close(
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
fn finish_interrupted_approvals(l: &mut Locked, now: Timestamp, out: &mut Applied) -> Result<()> {
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

fn open_cycle<'a>(l: &'a Locked, cycle_id: &str) -> Result<&'a Cycle> {
    l.state
        .current
        .as_ref()
        .filter(|c| c.id == cycle_id)
        .ok_or_else(|| {
            Error::Usage(format!(
                "no open cycle {cycle_id:?}; `agent-state flow status` lists them"
            ))
        })
}

/// `flow approve CYCLE`: a cycle waiting for approval (or blocked) is
/// approved by `by`, archived, and `on_approve` runs.
pub fn approve(
    root: &StateRoot,
    flow: &FlowSettings,
    cycle_id: &str,
    by: &str,
    now: Timestamp,
) -> Result<Applied> {
    let mut l = open(root, flow)?;
    let c = open_cycle(&l, cycle_id)?;
    if !matches!(
        c.status,
        CycleStatus::AwaitingApproval | CycleStatus::Blocked
    ) {
        return Err(Error::Usage(format!(
            "cycle {cycle_id} is {}: only a cycle the Judge passed (awaiting approval, or blocked) can be approved",
            c.status.as_str()
        )));
    }
    let c = c.clone();
    let mut out = Applied::default();
    close(&mut l, flow, "approved", None, by, now, &mut out)?;
    drop(l);
    clear_questions(root, flow, &c, now, &mut out);
    Ok(out)
}

/// The ids of the messages that asked the human to let cycle `c` through
/// (the approval question, the blocked flag), as [`route`] names them. Pure.
pub fn question_ids(flow: &str, cycle: &str, step: u32, key: &str) -> Vec<String> {
    ["approve", "blocked"]
        .iter()
        .map(|what| {
            let id = super::message_id(flow, cycle, step, what);
            if key.is_empty() {
                id
            } else {
                format!("{id}-{key}")
            }
        })
        .collect()
}

/// After `flow approve`: the question it answered leaves the human's
/// mailbox the way `inbox ack` takes it (moved to `processed/`, journaled
/// `message_acknowledged`). A failure is reported, never fatal: the cycle
/// is approved either way.
fn clear_questions(
    root: &StateRoot,
    flow: &FlowSettings,
    c: &Cycle,
    now: Timestamp,
    out: &mut Applied,
) {
    let human = root.agent(&flow.human);
    for id in question_ids(flow.name.as_str(), &c.id, c.step, &c.question_key) {
        if !crate::fsx::exists(&human.inbox().join(format!("{id}.json"))) {
            continue;
        }
        let done = human
            .lock_within(Duration::from_secs(2))
            .and_then(|_lock| crate::inbox::acknowledge_waiting(&human, &id, now));
        match done {
            Ok(_) => out.lines.push(format!(
                "{}: question {id} answered, acknowledged",
                flow.human
            )),
            Err(e) => out.lines.push(format!(
                "{}: question {id} not acknowledged ({e}); `agent-state inbox ack {} {id}`",
                flow.human, flow.human
            )),
        }
    }
}

/// `flow reject CYCLE --feedback TEXT`: back to the Planner with the
/// feedback (from a cycle awaiting approval, blocked or paused).
pub fn reject(
    root: &StateRoot,
    flow: &FlowSettings,
    cycle_id: &str,
    feedback: &str,
    by: &str,
    now: Timestamp,
) -> Result<Applied> {
    if feedback.trim().is_empty() {
        return Err(Error::Usage(
            "--feedback is empty: tell the Planner what to change".into(),
        ));
    }
    let mut l = open(root, flow)?;
    let c = open_cycle(&l, cycle_id)?.clone();
    if c.status == CycleStatus::Running {
        return Err(Error::Usage(format!(
            "cycle {cycle_id} is running (the {} works on step {}); reject it once it waits for you, or stop it",
            c.awaiting.as_ref().map(|w| w.role.as_str()).unwrap_or("?"),
            c.step
        )));
    }
    let mut out = Applied::default();
    let key = format!("rejected {} {}", c.step, now.compact());
    l.add_section(
        &key,
        &cycle::note(&key, &format!("Rejected by {by}"), now, feedback.trim()),
    )?;
    let mut next = c.clone();
    next.insufficient = 0;
    next.reason = None;
    let file = l.dir.cycle_file().display().to_string();
    let note = format!(
        "The human ({by}) sent the cycle back with this feedback: {}",
        feedback.trim()
    );
    let plan = route::hand_to(
        &mut next,
        Role::Planner,
        by,
        &note,
        &context(flow, &file, None, now),
    );
    l.state.current = Some(next);
    l.state.outbox.extend(plan.messages);
    l.save()?;
    l.journal(
        now,
        "rejected",
        cycle_id,
        json!({"by": by, "feedback": feedback.trim()}),
    );
    out.lines.push(format!(
        "cycle {cycle_id} sent back to the Planner: {}",
        plan.verdict
    ));
    l.deliver(root, now, &mut out)?;
    Ok(out)
}

/// `flow stop CYCLE`: archived as stopped, whatever its state.
pub fn stop(
    root: &StateRoot,
    flow: &FlowSettings,
    cycle_id: &str,
    by: &str,
    now: Timestamp,
) -> Result<Applied> {
    let mut l = open(root, flow)?;
    open_cycle(&l, cycle_id)?;
    let mut out = Applied::default();
    close(
        &mut l,
        flow,
        "stopped",
        Some(format!("stopped by {by}")),
        by,
        now,
        &mut out,
    )?;
    Ok(out)
}

/// Each configured flow and its state (`None` before its first cycle).
pub fn status_of(
    root: &StateRoot,
    config: &Config,
) -> Result<Vec<(FlowSettings, Option<FlowState>)>> {
    config
        .flows
        .iter()
        .map(|f| Ok((f.clone(), load(&FlowDir::new(root, &f.name))?)))
        .collect()
}

/// What a human's reply to one of the flow's messages asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyCommand {
    Approve,
    Reject(String),
    Stop,
}

/// Read a reply's words: its subject's first word (after `Re:`), else its
/// body's: `approve`, `reject` (the rest is the feedback) or `stop`.
pub fn reply_command(subject: &str, body: &str) -> Option<ReplyCommand> {
    let strip = |t: &str| -> String {
        let mut t = t.trim();
        while let Some(rest) = t
            .strip_prefix("Re:")
            .or_else(|| t.strip_prefix("RE:"))
            .or_else(|| t.strip_prefix("re:"))
        {
            t = rest.trim_start();
        }
        t.to_string()
    };
    for (i, text) in [strip(subject), strip(body)].iter().enumerate() {
        let mut words = text.splitn(2, char::is_whitespace);
        let first = words
            .next()
            .unwrap_or("")
            .trim_end_matches([':', '.', ',', '!'])
            .to_ascii_lowercase();
        let rest = words.next().unwrap_or("").trim();
        match first.as_str() {
            "approve" | "approved" => return Some(ReplyCommand::Approve),
            "stop" => return Some(ReplyCommand::Stop),
            "reject" | "rejected" => {
                // Said in the subject: the body is feedback too.
                let body = if i == 0 { body.trim() } else { "" };
                let feedback: Vec<&str> =
                    [rest, body].into_iter().filter(|t| !t.is_empty()).collect();
                return Some(ReplyCommand::Reject(feedback.join("\n")));
            }
            _ => {}
        }
    }
    None
}

/// The cycle a flow message id names: `flow-FLOW-CYCLE-STEP-WHAT`.
pub fn cycle_of_message(flow: &str, id: &str) -> Option<String> {
    let rest = id.strip_prefix(&format!("flow-{flow}-"))?;
    // A cycle id is `YYYY-MM-DD-NNN`: 14 characters.
    let cycle = rest.get(..14)?;
    rest[14..].starts_with('-').then(|| cycle.to_string())
}

/// A human's reply to one of the flow's messages (`source_ref` = its id),
/// found by the daemon in `agent`'s inbox: carried out as the command
/// would be, then moved to `processed/`. `Ok(None)` when it is not the
/// flow human's or says none of the words (left for the agent). A command
/// that cannot be carried out is told to the human.
pub fn reply(
    root: &StateRoot,
    flow: &FlowSettings,
    agent: &AgentName,
    name: &str,
    message: &crate::inbox::Message,
    now: Timestamp,
) -> Result<Option<Applied>> {
    let Some(reference) = message.source_ref.as_deref() else {
        return Ok(None);
    };
    let Some(cycle) = cycle_of_message(flow.name.as_str(), reference) else {
        return Ok(None);
    };
    if message.from != flow.human.as_str() {
        return Ok(None);
    }
    let Some(command) = reply_command(&message.subject, &message.body) else {
        return Ok(None);
    };
    let file = root.agent(agent).inbox().join(name);
    if let Some(why) = refusal(root, flow, &cycle, reference, &file) {
        return refuse(root, flow, agent, message, &cycle, &command, &why, now).map(Some);
    }
    // Who answered, as the kernel says (the file's owner) beside the name signed.
    let by = match super::authority::UnixUser::owner_of(&file) {
        Ok(owner) => format!(
            "{} (unix user {})",
            message.from,
            owner.name.unwrap_or_else(|| owner.uid.to_string())
        ),
        Err(_) => message.from.clone(),
    };
    let done = match &command {
        ReplyCommand::Approve => approve(root, flow, &cycle, &by, now),
        ReplyCommand::Reject(feedback) => reject(root, flow, &cycle, feedback, &by, now),
        ReplyCommand::Stop => stop(root, flow, &cycle, &by, now),
    };
    let dir = root.agent(agent);
    {
        let _lock = dir.lock()?;
        crate::inbox::process_waiting(&dir, name)?;
    }
    match done {
        Ok(mut applied) => {
            applied.lines.insert(
                0,
                format!(
                    "{by}'s reply {:?} to cycle {cycle}: {command:?}",
                    message.subject
                ),
            );
            Ok(Some(applied))
        }
        Err(e) => {
            let p = Pending {
                id: format!("flow-{}-{cycle}-reply-{}", flow.name, message.id),
                to: flow.human.to_string(),
                from: agent.to_string(),
                kind: "flag".into(),
                high: false,
                subject: format!(
                    "Flow {}: your reply to cycle {cycle} was not carried out",
                    flow.name
                ),
                body: format!(
                    "Your reply {:?} could not be carried out: {e}",
                    message.subject
                ),
                source_ref: reference.to_string(),
            };
            send(root, &p, now)?;
            Ok(Some(Applied {
                lines: vec![format!(
                    "{by}'s reply to cycle {cycle} not carried out: {e}"
                )],
                refused: false,
                errors: Vec::new(),
            }))
        }
    }
}

/// Why a reply to the flow's question is not a human's answer, if it is
/// not: its file's owner is no approver ([`super::authority`]), or it names
/// a question the cycle did not ask (its random key missing).
fn refusal(
    root: &StateRoot,
    flow: &FlowSettings,
    cycle: &str,
    reference: &str,
    file: &Path,
) -> Option<String> {
    let owner = match super::authority::UnixUser::owner_of(file) {
        Ok(o) => o,
        Err(e) => {
            return Some(format!(
                "its file {} cannot be examined: {e}",
                file.display()
            ));
        }
    };
    if !super::authority::may_reply(&owner, &flow.approvers) {
        return Some(format!(
            "its file is owned by {}, who is not an approver of flow {} (approvers = {:?}; root's replies are accepted too)",
            owner.describe(),
            flow.name,
            flow.approvers
        ));
    }
    let key = load(&FlowDir::new(root, &flow.name))
        .ok()
        .flatten()
        .and_then(|s| s.current)
        .filter(|c| c.id == cycle)
        .map(|c| c.question_key)
        .unwrap_or_default();
    if !key.is_empty() && !reference.ends_with(&format!("-{key}")) {
        return Some(format!(
            "its source_ref {reference:?} is not the id of a question of cycle {cycle} (reply to the question message itself)"
        ));
    }
    None
}

/// A reply that is no human's answer: journaled as refused, the human told,
/// the message left where it is (its addressee reads it as any message).
#[allow(clippy::too_many_arguments)]
fn refuse(
    root: &StateRoot,
    flow: &FlowSettings,
    agent: &AgentName,
    message: &crate::inbox::Message,
    cycle: &str,
    command: &ReplyCommand,
    why: &str,
    now: Timestamp,
) -> Result<Applied> {
    let l = open(root, flow)?;
    l.journal(
        now,
        "reply_refused",
        cycle,
        json!({"message": message.id, "inbox": agent.as_str(), "from": message.from, "asked": format!("{command:?}"), "why": why}),
    );
    drop(l);
    let p = Pending {
        id: format!("flow-{}-{cycle}-refused-{}", flow.name, message.id),
        to: flow.human.to_string(),
        from: agent.to_string(),
        kind: "flag".into(),
        high: true,
        subject: format!(
            "Flow {}: a reply to cycle {cycle} signed {:?} was refused",
            flow.name, message.from
        ),
        body: format!(
            "A reply {:?} ({command:?}) to cycle {cycle}, message {} in {agent}'s inbox, was not carried out: {why}. It is left in that inbox. Answer with `agent-state flow approve|reject|stop {cycle}` as root or the service user, or reply as a user listed in the flow's approvers.",
            message.subject, message.id
        ),
        source_ref: message.source_ref.clone().unwrap_or_default(),
    };
    send(root, &p, now)?;
    Ok(Applied {
        lines: vec![format!(
            "reply {} in {agent}'s inbox to cycle {cycle} refused: {why}",
            message.id
        )],
        refused: true,
        errors: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::summary::RiskLevel;

    #[test]
    fn the_questions_approve_answers_are_named_as_route_sends_them() {
        let table: &[(&str, &str, u32, &str, [&str; 2])] = &[
            (
                "notes",
                "2026-11-27-001",
                3,
                "",
                [
                    "flow-notes-2026-11-27-001-3-approve",
                    "flow-notes-2026-11-27-001-3-blocked",
                ],
            ),
            (
                "docs",
                "2026-11-27-002",
                9,
                "k1",
                [
                    "flow-docs-2026-11-27-002-9-approve-k1",
                    "flow-docs-2026-11-27-002-9-blocked-k1",
                ],
            ),
        ];
        for (flow, cycle, step, key, want) in table {
            assert_eq!(
                question_ids(flow, cycle, *step, key),
                *want,
                "{flow} {cycle}"
            );
        }
    }

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
