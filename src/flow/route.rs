//! The router's decisions, pure: what a role's answer means for its cycle
//! ([`decide`]) and what the cycle does next ([`plan`]): its new state and
//! the messages to send. Never a guess: a block that is missing, malformed,
//! from the wrong role, for another cycle or handing over where the loop
//! does not go stops the cycle with the reason.

use super::{Awaiting, Cycle, CycleStatus, Pending, message_id, source_ref};
use crate::clock::Timestamp;
use crate::config::{FlowSettings, Gate};
use crate::protocol::summary::{BlockProblem, ContextSummary, RiskLevel, Role, SignalBlock};

/// The Actor's change as the daemon measured it in its worktree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope {
    pub lines: u64,
    pub files: u64,
}

/// What the daemon measured of a role's step besides the Actor's scope, for
/// the roles' limits (`limits`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoleWork {
    /// The Planner's plan: its lines ([`plan_lines`]).
    pub plan_lines: u64,
    /// The paths the Actor's step changed (relative to the repository).
    pub paths: Vec<String>,
    /// The Judge's change to its workspace (`None`: it has no workspace).
    pub judge: Option<Scope>,
}

/// The lines of a Planner's plan: its answer's non-blank lines before the
/// Context Summary, the SIGNAL BLOCK line left out. Pure.
pub fn plan_lines(answer: &str) -> u64 {
    answer
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("## Context Summary"))
        .filter(|l| !l.is_empty() && !is_signal_line(l))
        .count() as u64
}

fn is_signal_line(line: &str) -> bool {
    line.starts_with("Agent=") && line.contains("Next=")
}

/// One answer to judge.
pub struct Answered<'a> {
    pub flow: &'a FlowSettings,
    pub cycle: &'a Cycle,
    pub agent: &'a str,
    pub session_id: &'a str,
    pub block: Option<Result<SignalBlock, BlockProblem>>,
    pub summary: Option<ContextSummary>,
    /// The Actor's measured change (`Err`: why it could not be measured).
    pub scope: Option<Result<Scope, super::scope::ScopeError>>,
    /// What the roles' limits are checked against.
    pub work: RoleWork,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Planner → Actor, Actor → Judge.
    Handoff { to: Role },
    /// The Judge's INSUFFICIENT, or the daemon's scope check.
    Insufficient {
        diagnostics: String,
        by_daemon: bool,
    },
    /// The Judge's PASS at a risk.
    Pass { risk: RiskLevel },
    /// A role asked for the human (`Next=Human` before the Judge).
    AskHuman { why: String },
    /// The cycle cannot go on: the reason.
    Stop { reason: String },
}

/// What an answer means.
pub fn decide(a: &Answered) -> Decision {
    let Some(awaiting) = &a.cycle.awaiting else {
        return Decision::Stop {
            reason: "the cycle was not waiting for an answer".into(),
        };
    };
    let role = awaiting.role;
    let who = format!(
        "the {} ({}, session {})",
        role.as_str(),
        a.agent,
        a.session_id
    );
    let block = match &a.block {
        None => {
            return Decision::Stop {
                reason: format!(
                    "{who} ended without a SIGNAL BLOCK (a line such as `Agent={} | Cycle={} | Step={} | … | Next=…`)",
                    role.as_str(),
                    a.cycle.id,
                    a.cycle.step
                ),
            };
        }
        Some(Err(p)) => {
            return Decision::Stop {
                reason: format!("{who} ended with a malformed SIGNAL BLOCK: {}", p.message),
            };
        }
        Some(Ok(b)) => b,
    };
    // Agent= names the role, or the agent itself.
    let agent_ok = match (&block.agent, block.agent_role()) {
        (_, Some(r)) => r == role,
        (Some(name), None) => name.trim() == a.agent,
        (None, None) => false,
    };
    if !agent_ok {
        return Decision::Stop {
            reason: format!(
                "{who} signed its SIGNAL BLOCK `Agent={}`; it answers as the {}",
                block.agent.as_deref().unwrap_or(""),
                role.as_str()
            ),
        };
    }
    if block.cycle.as_deref().map(str::trim) != Some(a.cycle.id.as_str()) {
        return Decision::Stop {
            reason: format!(
                "{who} names cycle `{}` in its SIGNAL BLOCK; the open cycle is {}",
                block.cycle.as_deref().unwrap_or(""),
                a.cycle.id
            ),
        };
    }
    let next = match (&block.next, block.next_role()) {
        (_, Some(r)) => r,
        (Some(name), None) => match super::role_of(a.flow, name.trim()) {
            Some(r) => r,
            None => {
                return Decision::Stop {
                    reason: format!(
                        "{who} hands over to `Next={name}`, which is not a role or an agent of flow {}",
                        a.flow.name
                    ),
                };
            }
        },
        (None, None) => {
            return Decision::Stop {
                reason: format!("{who} names no `Next=` in its SIGNAL BLOCK"),
            };
        }
    };
    let step_word = block.step.as_deref().unwrap_or("").to_ascii_uppercase();
    let limits = &a.flow.limits;
    if role == Role::Judge
        && matches!(next, Role::Human | Role::Planner)
        && !limits.judge_writes_code
        && let Some(s) = a.work.judge
        && (s.lines > 0 || s.files > 0)
    {
        return Decision::Insufficient {
            diagnostics: format!(
                "the Judge changed {} line(s) in {} file(s) of its workspace; a Judge writes no code (limits.judge_writes_code = false): its verdict is set aside and its changes are not kept (checked by the daemon)",
                s.lines, s.files
            ),
            by_daemon: true,
        };
    }
    match (role, next) {
        (Role::Planner, Role::Actor) if a.work.plan_lines > limits.plan_lines as u64 => {
            Decision::Insufficient {
                diagnostics: format!(
                    "the Planner's plan is {} line(s); the limit is {} (limits.plan_lines, checked by the daemon, before the Actor)",
                    a.work.plan_lines, limits.plan_lines
                ),
                by_daemon: true,
            }
        }
        (Role::Planner, Role::Actor) => Decision::Handoff { to: Role::Actor },
        (Role::Actor, Role::Judge) => match &a.scope {
            Some(Ok(s))
                if s.lines > a.flow.max_lines as u64 || s.files > a.flow.max_files as u64 =>
            {
                Decision::Insufficient {
                    diagnostics: format!(
                        "the Actor's change is over the scope limit: {} changed line(s) in {} file(s) against where its step started; the limit is {} lines and {} files (checked by the daemon, before the Judge)",
                        s.lines, s.files, a.flow.max_lines, a.flow.max_files
                    ),
                    by_daemon: true,
                }
            }
            Some(Err(why)) => Decision::Stop {
                reason: format!("the Actor's change could not be measured: {why}"),
            },
            _ => match outside_paths(&limits.actor_paths, &a.work.paths) {
                outside if !outside.is_empty() => Decision::Insufficient {
                    diagnostics: format!(
                        "the Actor changed {} path(s) outside limits.actor_paths ({}): {} (checked by the daemon, before the Judge)",
                        outside.len(),
                        limits.actor_paths.join(", "),
                        one_line(&outside.join(", "), 400)
                    ),
                    by_daemon: true,
                },
                _ => Decision::Handoff { to: Role::Judge },
            },
        },
        (Role::Planner | Role::Actor, Role::Human) => Decision::AskHuman {
            why: format!(
                "{who} asks for a human: {}",
                a.summary
                    .as_ref()
                    .and_then(|s| s.blocked_by().or_else(|| s.summary_text()))
                    .unwrap_or_else(|| "(no Context Summary)".into())
            ),
        },
        (Role::Judge, Role::Human) => {
            if step_word.contains("INSUFFICIENT") {
                return Decision::Stop {
                    reason: format!(
                        "{who} says `Step={step_word}` but hands over to the Human, as for a PASS"
                    ),
                };
            }
            let risk = block
                .risk
                .or_else(|| a.summary.as_ref().and_then(|s| s.report_risk()));
            match risk {
                Some(risk) => Decision::Pass { risk },
                None => Decision::Stop {
                    reason: format!(
                        "{who} passed the step without a risk level (`Risk=low|medium|high`): the risk decides who approves"
                    ),
                },
            }
        }
        (Role::Judge, Role::Planner) => {
            if step_word.contains("PASS") {
                return Decision::Stop {
                    reason: format!(
                        "{who} says `Step={step_word}` but hands back to the Planner, as for INSUFFICIENT"
                    ),
                };
            }
            Decision::Insufficient {
                diagnostics: a
                    .summary
                    .as_ref()
                    .and_then(|s| {
                        let parts: Vec<String> = [s.blocked_by(), s.summary_text()]
                            .into_iter()
                            .flatten()
                            .collect();
                        (!parts.is_empty()).then(|| parts.join(" — "))
                    })
                    .unwrap_or_else(|| "(the Judge gave no Context Summary)".into()),
                by_daemon: false,
            }
        }
        (r, n) => Decision::Stop {
            reason: format!(
                "{who} hands over to the {}; in a flow the {} hands over to {}",
                n.as_str(),
                r.as_str(),
                match r {
                    Role::Planner => "the Actor (or the Human)",
                    Role::Actor => "the Judge (or the Human)",
                    Role::Judge => "the Human (PASS) or the Planner (INSUFFICIENT)",
                    Role::Human => "the Planner",
                }
            ),
        },
    }
}

/// The paths no glob of `allowed` matches (none when `allowed` is empty:
/// no limit). Pure.
pub fn outside_paths(allowed: &[String], paths: &[String]) -> Vec<String> {
    if allowed.is_empty() {
        return Vec::new();
    }
    paths
        .iter()
        .filter(|p| {
            !allowed
                .iter()
                .any(|g| crate::config::flow::glob_matches(g, p))
        })
        .cloned()
        .collect()
}

/// Where a cycle's branch goes after a step, pure: `Some(commit)` to move
/// its worktree there (reset), `None` to leave it; and its last PASS after.
/// A judged step that is INSUFFICIENT (the Actor's, or the Judge's verdict
/// on it) goes back to the last PASS with `rollback`, stays with `keep`; a
/// PASS is the new last PASS; a Judge that worked in the worktree leaves
/// `head` (its own change is part of `head` only where it may write code).
/// A Planner's INSUFFICIENT changed nothing on the branch.
pub fn branch_target(
    role: Role,
    decision: &Decision,
    on_insufficient: crate::config::OnInsufficient,
    in_worktree: bool,
    head: &str,
    last_pass: &str,
) -> (Option<String>, String) {
    use crate::config::OnInsufficient;
    match decision {
        Decision::Insufficient { .. } if role == Role::Planner => (None, last_pass.into()),
        Decision::Insufficient { .. } if on_insufficient == OnInsufficient::Rollback => {
            (Some(last_pass.into()), last_pass.into())
        }
        Decision::Insufficient { .. } => (Some(head.into()), last_pass.into()),
        Decision::Pass { .. } => (Some(head.into()), head.into()),
        _ if role == Role::Judge && in_worktree => (Some(head.into()), last_pass.into()),
        _ => (None, last_pass.into()),
    }
}

/// What the cycle becomes.
#[derive(Debug, Clone)]
pub enum Next {
    /// It goes on (another role works, or it waits for the human).
    Open(Box<Cycle>),
    /// Approved at once (low risk): archive it.
    Approve,
    /// Stopped: archive it with the reason.
    Stop(String),
}

/// The cycle's next state and the messages to send.
#[derive(Debug, Clone)]
pub struct Plan {
    pub next: Next,
    pub messages: Vec<Pending>,
    /// For the journal and the cycle file: what was decided, in words.
    pub verdict: String,
}

/// What the texts of the messages need besides the cycle.
pub struct Context<'a> {
    pub flow: &'a FlowSettings,
    /// The cycle file, as the agents see it (absolute).
    pub cycle_file: &'a str,
    /// The answering role's summary (Context Summary's Current State…).
    pub summary: Option<String>,
    /// The diagnostics of the INSUFFICIENT results so far in this cycle, in
    /// order (from the cycle file), for the human when the cycle pauses.
    pub earlier_blockers: Vec<String>,
    pub now: Timestamp,
}

/// Carry out a decision on `cycle`.
pub fn plan(cycle: &Cycle, decision: &Decision, cx: &Context) -> Plan {
    let from_role = cycle
        .awaiting
        .as_ref()
        .map(|w| w.role)
        .unwrap_or(Role::Human);
    let from = super::agent_of(cx.flow, from_role).to_string();
    let mut c = cycle.clone();
    c.updated_at = cx.now;
    c.reason = None;
    match decision {
        Decision::Handoff { to } => {
            let note = format!(
                "From the {} ({from}): {}",
                from_role.as_str(),
                cx.summary.as_deref().unwrap_or("(no summary)")
            );
            hand_to(&mut c, *to, &from, &note, cx)
        }
        Decision::Insufficient { diagnostics, .. } => {
            c.insufficient += 1;
            if c.insufficient >= cx.flow.max_insufficient {
                c.status = CycleStatus::Paused;
                c.awaiting = None;
                let why = format!(
                    "{} INSUFFICIENT result(s) in a row (max_insufficient = {})",
                    c.insufficient, cx.flow.max_insufficient
                );
                c.reason = Some(why.clone());
                let blockers: String = cx
                    .earlier_blockers
                    .iter()
                    .map(String::as_str)
                    .chain(std::iter::once(diagnostics.as_str()))
                    .enumerate()
                    .map(|(i, b)| format!("{}. {b}\n", i + 1))
                    .collect();
                let body = format!(
                    "Flow {flow}, cycle {id} is paused: {why}.\n\nGoal: {goal}\n\nThe blockers, from the cycle file:\n{blockers}\nThe cycle file: {file}\n\nAnswer with `agent-state flow reject {id} --feedback \"...\"` (back to the Planner with your feedback) or `agent-state flow stop {id}`.",
                    flow = cx.flow.name,
                    id = c.id,
                    goal = c.goal,
                    file = cx.cycle_file
                );
                let msg = human(
                    &c,
                    cx,
                    "paused",
                    true,
                    format!(
                        "Flow {}: cycle {} paused after {} INSUFFICIENT",
                        cx.flow.name, c.id, c.insufficient
                    ),
                    body,
                );
                Plan {
                    next: Next::Open(Box::new(c)),
                    messages: vec![msg],
                    verdict: format!("INSUFFICIENT ({diagnostics}); paused: {why}"),
                }
            } else {
                let note = format!(
                    "INSUFFICIENT ({} of {} in a row): {diagnostics}",
                    c.insufficient, cx.flow.max_insufficient
                );
                let mut p = hand_to(&mut c, Role::Planner, &from, &note, cx);
                p.verdict = format!("INSUFFICIENT: {diagnostics}");
                p
            }
        }
        Decision::Pass { risk } => {
            c.insufficient = 0;
            c.risk = Some(*risk);
            c.awaiting = None;
            match super::gate(cx.flow, *risk) {
                Gate::Auto => Plan {
                    next: Next::Approve,
                    messages: Vec::new(),
                    verdict: format!(
                        "PASS at {} risk: approved (risk.{} = \"auto\")",
                        risk.as_str(),
                        risk.as_str()
                    ),
                },
                Gate::Approve => {
                    c.status = CycleStatus::AwaitingApproval;
                    let why = format!(
                        "the Judge passed it at {} risk; a human approves it",
                        risk.as_str()
                    );
                    c.reason = Some(why.clone());
                    let body = format!(
                        "Flow {flow}, cycle {id}: the Judge passed the step at {risk} risk.\n\nGoal: {goal}\nThe Judge: {summary}\nThe cycle file (plan, the Actor's diff, the verdict): {file}\n\nApprove: `agent-state flow approve {id}`\nSend it back to the Planner: `agent-state flow reject {id} --feedback \"...\"`\nStop it: `agent-state flow stop {id}`",
                        flow = cx.flow.name,
                        id = c.id,
                        risk = risk.as_str(),
                        goal = c.goal,
                        summary = cx.summary.as_deref().unwrap_or("(no summary)"),
                        file = cx.cycle_file
                    );
                    let msg = human(
                        &c,
                        cx,
                        "approve",
                        false,
                        format!(
                            "Flow {}: approve cycle {}? ({} risk)",
                            cx.flow.name,
                            c.id,
                            risk.as_str()
                        ),
                        body,
                    );
                    Plan {
                        next: Next::Open(Box::new(c)),
                        messages: vec![msg],
                        verdict: format!("PASS at {} risk: {why}", risk.as_str()),
                    }
                }
                Gate::Block => {
                    c.status = CycleStatus::Blocked;
                    let why = format!(
                        "the Judge passed it at {} risk, which is blocked (risk.{} = \"block\")",
                        risk.as_str(),
                        risk.as_str()
                    );
                    c.reason = Some(why.clone());
                    let body = format!(
                        "Flow {flow}, cycle {id} is BLOCKED: {why}.\n\nGoal: {goal}\nThe Judge: {summary}\nThe cycle file: {file}\n\nOnly a human may let it through: `agent-state flow approve {id}`; or `agent-state flow reject {id} --feedback \"...\"`, or `agent-state flow stop {id}`.",
                        flow = cx.flow.name,
                        id = c.id,
                        goal = c.goal,
                        summary = cx.summary.as_deref().unwrap_or("(no summary)"),
                        file = cx.cycle_file
                    );
                    let msg = human(
                        &c,
                        cx,
                        "blocked",
                        true,
                        format!(
                            "Flow {}: cycle {} blocked at {} risk",
                            cx.flow.name,
                            c.id,
                            risk.as_str()
                        ),
                        body,
                    );
                    Plan {
                        next: Next::Open(Box::new(c)),
                        messages: vec![msg],
                        verdict: format!("PASS at {} risk: blocked and escalated", risk.as_str()),
                    }
                }
            }
        }
        Decision::AskHuman { why } => {
            c.status = CycleStatus::Paused;
            c.awaiting = None;
            c.reason = Some(why.clone());
            let body = format!(
                "Flow {flow}, cycle {id} waits for you: {why}\n\nGoal: {goal}\nThe cycle file: {file}\n\nAnswer with `agent-state flow reject {id} --feedback \"...\"` (your answer goes to the Planner) or `agent-state flow stop {id}`.",
                flow = cx.flow.name,
                id = c.id,
                goal = c.goal,
                file = cx.cycle_file
            );
            let msg = human(
                &c,
                cx,
                "asked",
                false,
                format!("Flow {}: cycle {} asks for a human", cx.flow.name, c.id),
                body,
            );
            Plan {
                next: Next::Open(Box::new(c)),
                messages: vec![msg],
                verdict: format!("paused: {why}"),
            }
        }
        Decision::Stop { reason } => Plan {
            next: Next::Stop(reason.clone()),
            messages: vec![human(
                &c,
                cx,
                "stopped",
                true,
                format!("Flow {}: cycle {} stopped", cx.flow.name, c.id),
                format!(
                    "Flow {flow}, cycle {id} was stopped by the daemon: {reason}\n\nGoal: {goal}\nThe cycle file is archived under {archive}.\nStart again with `agent-state flow start {flow} --goal \"...\"`.",
                    flow = cx.flow.name,
                    id = c.id,
                    goal = c.goal,
                    archive = super::archive_name(&c.id, true)
                ),
            )],
            verdict: format!("stopped: {reason}"),
        },
    }
}

/// The cycle hands its next step to `to`.
pub fn hand_to(c: &mut Cycle, to: Role, from: &str, note: &str, cx: &Context) -> Plan {
    c.step += 1;
    c.status = CycleStatus::Running;
    let agent = super::agent_of(cx.flow, to).to_string();
    let id = message_id(cx.flow.name.as_str(), &c.id, c.step, "task");
    c.awaiting = Some(Awaiting {
        role: to,
        agent: agent.clone(),
        message_id: id.clone(),
        since: cx.now,
    });
    let message = Pending {
        id,
        to: agent.clone(),
        from: from.to_string(),
        kind: "task".into(),
        high: true,
        subject: format!(
            "Flow {} cycle {} step {}: {} — {}",
            cx.flow.name,
            c.id,
            c.step,
            to.as_str(),
            one_line(&c.goal, 120)
        ),
        body: task_body(c, to, note, cx),
        source_ref: source_ref(cx.flow.name.as_str(), &c.id, c.step),
    };
    Plan {
        next: Next::Open(Box::new(c.clone())),
        messages: vec![message],
        verdict: format!("handed to the {} ({agent}) as step {}", to.as_str(), c.step),
    }
}

/// What a role is asked to do, and the SIGNAL BLOCK it must end with.
fn task_body(c: &Cycle, to: Role, note: &str, cx: &Context) -> String {
    let limits = &cx.flow.limits;
    let what = match to {
        Role::Planner => format!(
            "Design ONE small step toward the goal: at most {} changed lines in at most {} files, in a plan of at most {} lines (the daemon counts your answer's lines before the Context Summary and sends a longer plan back to you). Then hand it to the Actor (Next=Actor), or ask the human (Next=Human) if a human must decide first.",
            cx.flow.max_lines, cx.flow.max_files, limits.plan_lines
        ),
        Role::Actor => format!(
            "Carry out the Planner's last step in your workspace, the cycle's branch {branch} as the previous step left it, within {} changed lines and {} files against where your step starts{paths} (the daemon commits your step, measures it with git and sends a step over these limits back to the Planner). Then hand over to the Judge (Next=Judge).",
            cx.flow.max_lines,
            cx.flow.max_files,
            branch = crate::workspace::cycle_branch(cx.flow.name.as_str(), &c.id),
            paths = if limits.actor_paths.is_empty() {
                String::new()
            } else {
                format!(
                    ", changing only paths matching {}",
                    limits.actor_paths.join(", ")
                )
            },
        ),
        Role::Judge => format!(
            "Test and judge the Actor's change (its diff is in the cycle file). PASS: Step=PASS, Next=Human, and the risk (low: refactors, docs, tests; medium: API or schema changes; high: security, data deletion, auth). INSUFFICIENT: Step=INSUFFICIENT, Next=Planner, with actionable diagnostics under **Blockers** in your Context Summary.{}",
            if limits.judge_writes_code {
                ""
            } else {
                " Change no file in your workspace: a Judge writes no code, and the daemon sets a Judge's change aside and makes the step INSUFFICIENT."
            }
        ),
        Role::Human => String::new(),
    };
    let next = match to {
        Role::Planner => "Actor",
        Role::Actor => "Judge",
        Role::Judge => "Human|Planner",
        Role::Human => "Planner",
    };
    format!(
        "You are the {role} of flow {flow}, cycle {id}, step {step}.\n\nGoal: {goal}\n\nThe cycle file (read it first; the daemon appends your answer to it): {file}\n\n{note}\n\n{what}\n\nEnd your answer with a Context Summary Block and then this SIGNAL BLOCK line, filled in:\n\nAgent={role} | Cycle={id} | Step={step_value} | Confidence=[1-5] | Risk=[low|medium|high] | Next={next}",
        role = to.as_str(),
        flow = cx.flow.name,
        id = c.id,
        step = c.step,
        goal = c.goal,
        file = cx.cycle_file,
        step_value = if to == Role::Judge {
            "PASS|INSUFFICIENT".to_string()
        } else {
            c.step.to_string()
        },
    )
}

/// A message to the flow's human.
fn human(
    c: &Cycle,
    cx: &Context,
    what: &str,
    high: bool,
    subject: String,
    body: String,
) -> Pending {
    let mut id = message_id(cx.flow.name.as_str(), &c.id, c.step, what);
    if !c.question_key.is_empty() {
        id = format!("{id}-{}", c.question_key);
    }
    Pending {
        id,
        to: cx.flow.human.to_string(),
        from: super::agent_of(
            cx.flow,
            c.awaiting.as_ref().map(|w| w.role).unwrap_or(Role::Judge),
        )
        .to_string(),
        kind: if what == "approve" || what == "asked" {
            "question".into()
        } else {
            "flag".into()
        },
        high,
        subject,
        body,
        source_ref: source_ref(cx.flow.name.as_str(), &c.id, c.step),
    }
}

/// The first line of `text`, at most `max` characters.
pub fn one_line(text: &str, max: usize) -> String {
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    match line.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None => line.to_string(),
    }
}

#[cfg(test)]
mod tests;
