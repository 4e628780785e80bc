//! Flows (seed 004, issue 13): a human's goal worked in cycles by three
//! agents, Planner → Actor → Judge, the daemon routing between them on the
//! SIGNAL BLOCK each ends its answer with. The agents stay ordinary agents:
//! a hand-off is a high-priority `task` message.
//!
//! Files, below `{state_root}/.flows/FLOW/` (each written like every other
//! state file: temp, fsync, rename, directory fsync; changed only under
//! `.lock`):
//!
//! - `state.json`: the open cycle (its step, the role and message awaited,
//!   the INSUFFICIENT streak, its status), the cycle counter, the cycles
//!   closed lately, and the outbox of messages decided but not yet delivered;
//! - `current_cycle.md`: the cycle file, appended to at each step (seed 004);
//!   `archive/YYYY-MM-DD_cycle-NNN.md` once the cycle is approved (or
//!   `…-stopped.md`);
//! - `answers/AGENT-SESSION.json`: what a role's session answered, written by
//!   the daemon before the session's end is recorded, removed once applied;
//! - `journal.jsonl`: what happened to each cycle.
//!
//! Crash safety: an answer is durable before the session's messages are
//! acknowledged; applying it appends to the cycle file only if its step's
//! marker is not there yet, then writes state.json (the next step, the
//! messages to send) in one rename, then delivers under fixed message ids
//! (a message already delivered is not delivered again). An answer whose
//! message is no longer awaited is dropped. So a crash anywhere neither
//! loses nor repeats a step.
//!
//! A cycle has one branch, `agent-state/flow/FLOW/CYCLE`, in one worktree
//! of the Actor's repository ([`cycle_worktree`]): the Actor's sessions
//! (and a Judge's in that repository) work there, each step from where the
//! previous one left it. Applying a step commits what the session left,
//! once (the step's ref, [`step_ref`], makes a re-application find the same
//! commit), then measures it, then moves the branch (an INSUFFICIENT back
//! to the last PASS, or not, `on_insufficient`), then writes state.json: a
//! crash before the write applies the same step to the same commits again.
//! The worktree goes when the cycle closes; the branch stays with its work.
//!
//! What this module must never do: reach into the daemon or the CLI, or
//! route on a guess (a missing or malformed block stops the cycle).

mod apply;
pub mod authority;
mod close;
pub mod cycle;
mod human;
mod locked;
pub mod publish;
pub mod route;
pub mod scope;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use apply::{apply_answers, record_answer, start};
pub use human::{
    ReplyCommand, approve, cycle_of_message, question_ids, reject, reply, reply_command, status_of,
    stop,
};
pub use locked::Applied;

use crate::agent_name::AgentName;
use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::protocol::summary::{RiskLevel, Role};
use crate::state::StateRoot;

/// Closed cycles kept in state.json (the archive keeps them all).
pub const CLOSED_KEPT: usize = 50;

/// The most of a role's answer copied into the cycle file.
pub const ANSWER_CHARS: usize = 20_000;

/// `{state_root}/.flows/FLOW/`.
#[derive(Debug, Clone)]
pub struct FlowDir {
    pub name: AgentName,
    pub path: PathBuf,
}

impl FlowDir {
    pub fn new(root: &StateRoot, name: &AgentName) -> FlowDir {
        FlowDir {
            name: name.clone(),
            path: flows_root(root).join(name.as_str()),
        }
    }
    pub fn state(&self) -> PathBuf {
        self.path.join("state.json")
    }
    pub fn cycle_file(&self) -> PathBuf {
        self.path.join("current_cycle.md")
    }
    pub fn archive(&self) -> PathBuf {
        self.path.join("archive")
    }
    pub fn answers(&self) -> PathBuf {
        self.path.join("answers")
    }
    pub fn journal(&self) -> PathBuf {
        self.path.join("journal.jsonl")
    }
    fn lock_path(&self) -> PathBuf {
        self.path.join(".lock")
    }
}

/// `{state_root}/.flows`.
pub fn flows_root(root: &StateRoot) -> PathBuf {
    root.path.join(".flows")
}

/// Where a cycle stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CycleStatus {
    /// A role is working on its step.
    Running,
    /// The Judge passed it at a risk that needs a human's approval.
    AwaitingApproval,
    /// Passed at a risk that blocks it: escalated to the human.
    Blocked,
    /// `max_insufficient` INSUFFICIENT results in a row, or a role asked
    /// for the human: waits for `flow reject --feedback` (or stop).
    Paused,
}

impl CycleStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CycleStatus::Running => "running",
            CycleStatus::AwaitingApproval => "awaiting_approval",
            CycleStatus::Blocked => "blocked",
            CycleStatus::Paused => "paused",
        }
    }
}

/// The role and message a cycle waits for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Awaiting {
    pub role: Role,
    pub agent: String,
    pub message_id: String,
    pub since: Timestamp,
}

/// What the daemon measured of the Actor's last step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActorWork {
    pub worktree: String,
    pub branch: String,
    pub base_commit: String,
    pub lines: u64,
    pub files: u64,
}

/// The cycle's one branch (issue 22): each Actor step continues from the
/// previous step's head; an INSUFFICIENT rolls it back to `last_pass` (or
/// keeps it, `on_insufficient`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CycleBranch {
    /// The Actor's repository.
    pub repo: String,
    pub worktree: String,
    /// `agent-state/flow/FLOW/CYCLE`.
    pub branch: String,
    /// Where the cycle started: the flow's base when its first step began.
    pub base_commit: String,
    /// The branch's head after the last step applied: where the next step
    /// starts.
    pub head: String,
    /// The head at the Judge's last PASS in this cycle, else the base.
    pub last_pass: String,
}

/// The open cycle of a flow.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Cycle {
    pub id: String,
    pub goal: String,
    pub started_at: Timestamp,
    pub started_by: String,
    pub status: CycleStatus,
    /// The last step handed over (0: the goal, 1: the first Planner step).
    pub step: u32,
    #[serde(default)]
    pub awaiting: Option<Awaiting>,
    /// Consecutive INSUFFICIENT results.
    #[serde(default)]
    pub insufficient: u32,
    #[serde(default)]
    pub risk: Option<RiskLevel>,
    /// Why it is paused, blocked or waiting.
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub actor_work: Option<ActorWork>,
    /// The cycle's branch, once its Actor took a step on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<CycleBranch>,
    pub updated_at: Timestamp,
    /// A random part of the ids of the questions sent to the human (a uuid
    /// v4), so a reply cannot name a question it was not shown. Empty in a
    /// cycle started before it existed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub question_key: String,
}

/// A cycle that ended.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Closed {
    pub id: String,
    /// `approved` or `stopped`.
    pub outcome: String,
    pub closed_at: Timestamp,
    pub archive: String,
    #[serde(default)]
    pub reason: Option<String>,
}

/// A message decided and not yet delivered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pending {
    pub id: String,
    pub to: String,
    pub from: String,
    /// `task`, `flag` or `question`.
    pub kind: String,
    pub high: bool,
    pub subject: String,
    pub body: String,
    pub source_ref: String,
}

/// The cycle counter: `YYYY-MM-DD-NNN` restarts at 001 each day.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Numbers {
    pub date: String,
    pub last: u32,
}

/// `state.json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FlowState {
    pub flow: String,
    #[serde(default)]
    pub current: Option<Cycle>,
    #[serde(default)]
    pub numbers: Numbers,
    #[serde(default)]
    pub closed: Vec<Closed>,
    #[serde(default)]
    pub outbox: Vec<Pending>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// What a role's session answered: kept in `answers/` until applied.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Answer {
    pub flow: String,
    pub cycle: String,
    pub step: u32,
    pub message_id: String,
    pub agent: String,
    pub session_id: String,
    /// The answer: Claude Code's result text, else the end of stdout.
    pub text: String,
    /// The session's worktree, when it had one.
    #[serde(default)]
    pub workspace: Option<AnswerWorkspace>,
    pub ended_at: Timestamp,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AnswerWorkspace {
    pub path: String,
    pub branch: String,
    pub base_commit: String,
}

/// The `source_ref` of a flow's hand-off: `agent-state/flow/FLOW/CYCLE/STEP`.
pub fn source_ref(flow: &str, cycle: &str, step: u32) -> String {
    format!("agent-state/flow/{flow}/{cycle}/{step}")
}

/// The flow, cycle and step a message's `source_ref` names, if it is a
/// flow's hand-off.
pub fn parse_source_ref(text: &str) -> Option<(String, String, u32)> {
    let rest = text.strip_prefix("agent-state/flow/")?;
    let mut parts = rest.split('/');
    let (flow, cycle, step) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || flow.is_empty() || cycle.is_empty() {
        return None;
    }
    Some((flow.to_string(), cycle.to_string(), step.parse().ok()?))
}

/// Whether `cycle` has the shape of a cycle id (`2026-11-24-001`): digits
/// and dashes, at most 32 characters. A hand-off's `source_ref` is a
/// message's word, not the daemon's: nothing else names a worktree.
fn is_cycle_id(cycle: &str) -> bool {
    !cycle.is_empty()
        && cycle.len() <= 32
        && cycle.bytes().all(|b| b.is_ascii_digit() || b == b'-')
        && !cycle.starts_with('-')
}

/// The worktree of a flow's cycle, on its one branch: in the Actor's
/// workspaces root, `flow-FLOW-CYCLE` (`None` without an Actor workspace or
/// for a cycle id of the wrong shape).
pub fn cycle_worktree(
    root: &StateRoot,
    flow: &crate::config::FlowSettings,
    cycle: &str,
) -> Option<crate::workspace::WorkspaceSpec> {
    let w = flow.actor_workspace.as_ref()?;
    if !is_cycle_id(cycle) {
        return None;
    }
    let dir = root.agent(&flow.actor);
    Some(crate::workspace::WorkspaceSpec {
        repo: w.repo.clone(),
        base: w.base.clone(),
        path: crate::workspace::agent_root(w.root.as_deref(), flow.actor.as_str(), &dir.path)
            .join(format!("flow-{}-{cycle}", flow.name)),
        branch: crate::workspace::cycle_branch(flow.name.as_str(), cycle),
    })
}

/// The worktree a session of `agent` works in when it claimed a flow's
/// hand-off: the cycle's, for the flow's Actor, and for its Judge when the
/// Judge's workspace is in the Actor's repository (it tests the Actor's
/// change where it is), and only for the flow's open cycle. `None`: the
/// agent's own worktree, as for any session.
pub fn session_worktree(
    root: &StateRoot,
    config: &crate::config::Config,
    agent: &crate::config::AgentConfig,
    claimed: &[crate::inbox::Message],
) -> Option<crate::workspace::WorkspaceSpec> {
    let own = agent.session.workspace.as_ref()?;
    claimed
        .iter()
        .filter_map(|m| m.source_ref.as_deref().and_then(parse_source_ref))
        .find_map(|(flow, cycle, _)| {
            let f = config.flows.iter().find(|f| f.name.as_str() == flow)?;
            let same_repo = f
                .actor_workspace
                .as_ref()
                .is_some_and(|w| w.repo == own.repo);
            let plays = f.actor == agent.name || (f.judge == agent.name && same_repo);
            // Only the flow's open cycle: a hand-off is a message, and a
            // forged one must not make a worktree for a cycle that is not.
            let open = load(&FlowDir::new(root, &f.name))
                .ok()
                .flatten()
                .and_then(|s| s.current)
                .is_some_and(|c| c.id == cycle);
            if plays && open {
                cycle_worktree(root, f, &cycle)
            } else {
                None
            }
        })
}

/// The ref that keeps one step of a cycle as the daemon found it (rolled
/// back or not): `refs/agent-state/flow/FLOW/CYCLE/step-N`.
pub fn step_ref(flow: &str, cycle: &str, step: u32) -> String {
    format!("{}step-{step}", steps_refs(flow, cycle))
}

/// Where a cycle's steps are kept: `refs/agent-state/flow/FLOW/CYCLE/`.
pub fn steps_refs(flow: &str, cycle: &str) -> String {
    format!("refs/agent-state/flow/{flow}/{cycle}/")
}

/// The fixed id of a flow's message, so a redelivery after a crash is
/// recognised: `flow-FLOW-CYCLE-STEP-WHAT`.
pub fn message_id(flow: &str, cycle: &str, step: u32, what: &str) -> String {
    format!("flow-{flow}-{cycle}-{step}-{what}")
}

/// The next cycle id for `today` (`2026-11-24-001`), and the counter after it.
pub fn next_cycle_id(numbers: &Numbers, today: &str) -> (String, Numbers) {
    let n = if numbers.date == today {
        numbers.last + 1
    } else {
        1
    };
    (
        format!("{today}-{n:03}"),
        Numbers {
            date: today.to_string(),
            last: n,
        },
    )
}

/// The archive's name of a cycle: `2026-11-24_cycle-001.md`.
pub fn archive_name(cycle_id: &str, stopped: bool) -> String {
    let (date, n) = cycle_id.rsplit_once('-').unwrap_or((cycle_id, "000"));
    if stopped {
        format!("{date}_cycle-{n}-stopped.md")
    } else {
        format!("{date}_cycle-{n}.md")
    }
}

/// A flow's settings by name, or an error naming the config's flows.
pub fn settings<'a>(
    config: &'a crate::config::Config,
    name: &str,
) -> Result<&'a crate::config::FlowSettings> {
    config
        .flows
        .iter()
        .find(|f| f.name.as_str() == name)
        .ok_or_else(|| {
            Error::Usage(format!(
                "no flow named {name:?} in {}; configured: {}",
                config.source.display(),
                if config.flows.is_empty() {
                    "none (add a [[flow]])".to_string()
                } else {
                    config
                        .flows
                        .iter()
                        .map(|f| f.name.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ))
        })
}

/// The flow whose open cycle is `cycle_id`.
pub fn flow_of_cycle<'a>(
    root: &StateRoot,
    config: &'a crate::config::Config,
    cycle_id: &str,
) -> Result<&'a crate::config::FlowSettings> {
    for flow in &config.flows {
        if let Some(state) = load(&FlowDir::new(root, &flow.name))?
            && state.current.as_ref().is_some_and(|c| c.id == cycle_id)
        {
            return Ok(flow);
        }
    }
    Err(Error::Usage(format!(
        "no open cycle {cycle_id:?}; `agent-state flow status` lists the open cycles"
    )))
}

/// Read a flow's state.json (`None` before its first cycle).
pub fn load(dir: &FlowDir) -> Result<Option<FlowState>> {
    crate::state::atomic::read_json(&dir.state())
}

/// The agent that plays `role` in `flow`.
pub fn agent_of(flow: &crate::config::FlowSettings, role: Role) -> &AgentName {
    match role {
        Role::Planner => &flow.planner,
        Role::Actor => &flow.actor,
        Role::Judge => &flow.judge,
        Role::Human => &flow.human,
    }
}

/// The gate of a PASS at `risk`.
pub fn gate(flow: &crate::config::FlowSettings, risk: RiskLevel) -> crate::config::Gate {
    match risk {
        RiskLevel::Low => flow.low,
        RiskLevel::Medium => flow.medium,
        RiskLevel::High => flow.high,
    }
}

/// The role `agent` plays in `flow`, if one (the first of several).
pub fn role_of(flow: &crate::config::FlowSettings, agent: &str) -> Option<Role> {
    [Role::Planner, Role::Actor, Role::Judge, Role::Human]
        .into_iter()
        .find(|r| agent_of(flow, *r).as_str() == agent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_say_approve_reject_or_stop() {
        assert_eq!(
            reply_command("Re: approve", ""),
            Some(ReplyCommand::Approve)
        );
        assert_eq!(
            reply_command("RE: Re: Approved.", ""),
            Some(ReplyCommand::Approve)
        );
        assert_eq!(reply_command("Stop", "no more"), Some(ReplyCommand::Stop));
        assert_eq!(
            reply_command("reject: use the FAQ format", ""),
            Some(ReplyCommand::Reject("use the FAQ format".into()))
        );
        assert_eq!(
            reply_command("Re: your question", "reject\nshorter please"),
            Some(ReplyCommand::Reject("shorter please".into()))
        );
        assert_eq!(
            reply_command("Reject", "two files at most"),
            Some(ReplyCommand::Reject("two files at most".into()))
        );
        assert_eq!(reply_command("thanks", "looks good"), None);
        assert_eq!(
            cycle_of_message("my-flow", "flow-my-flow-2026-11-24-003-7-approve"),
            Some("2026-11-24-003".into())
        );
        assert_eq!(
            cycle_of_message("my-flow", "flow-other-2026-11-24-003-7-approve"),
            None
        );
        assert_eq!(
            cycle_of_message("my", "flow-my-flow-2026-11-24-003-7-approve"),
            None
        );
    }

    #[test]
    fn ids_refs_and_archive_names() {
        let (id, n) = next_cycle_id(&Numbers::default(), "2026-11-24");
        assert_eq!(id, "2026-11-24-001");
        let (id, n) = next_cycle_id(&n, "2026-11-24");
        assert_eq!(id, "2026-11-24-002");
        let (id, _) = next_cycle_id(&n, "2026-11-25");
        assert_eq!(id, "2026-11-25-001");
        let r = source_ref("docs", "2026-11-24-002", 3);
        assert_eq!(
            parse_source_ref(&r),
            Some(("docs".into(), "2026-11-24-002".into(), 3))
        );
        assert_eq!(parse_source_ref("agent-state/session/x"), None);
        assert_eq!(parse_source_ref("agent-state/flow/docs/c/x"), None);
        assert_eq!(parse_source_ref("agent-state/flow/docs/c/1/2"), None);
        assert_eq!(
            archive_name("2026-11-24-002", false),
            "2026-11-24_cycle-002.md"
        );
        assert_eq!(
            archive_name("2026-11-24-002", true),
            "2026-11-24_cycle-002-stopped.md"
        );
    }
}
