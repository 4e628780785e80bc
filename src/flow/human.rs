//! What people do to a flow (the CLI, and replies in an inbox): approve,
//! reject or stop its open cycle, answer its questions, read its status.
//! Each under the flow's lock, each said in the flow's journal.

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use super::close::close;
use super::cycle;
use super::locked::{Applied, Locked, context, open, send};
use super::route;
use super::{Cycle, CycleStatus, FlowDir, FlowState, Pending, load};
use crate::agent_name::AgentName;
use crate::clock::Timestamp;
use crate::config::{Config, FlowSettings};
use crate::error::{Error, Result};
use crate::protocol::summary::Role;
use crate::state::StateRoot;

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
}
