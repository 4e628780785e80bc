//! `[[flow]]`: a Planner → Actor → Judge loop between three agents (seed
//! 004, issue 13). Read here; run by `crate::flow` (the store and the
//! decisions) and the daemon (the router).

use std::time::Duration;

use serde::Deserialize;

use super::{AgentConfig, AgentKind, Validator};
use crate::agent_name::AgentName;

/// What a Judge's PASS at a risk level leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Approved at once (seed 004: low risk).
    Auto,
    /// Waits for a human's `flow approve` (medium).
    Approve,
    /// Blocked and escalated to the human (high).
    Block,
}

impl Gate {
    pub fn as_str(self) -> &'static str {
        match self {
            Gate::Auto => "auto",
            Gate::Approve => "approve",
            Gate::Block => "block",
        }
    }
}

/// One flow.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowSettings {
    /// A name like an agent's: `[a-z0-9-_]`, used in paths.
    pub name: AgentName,
    pub planner: AgentName,
    pub actor: AgentName,
    pub judge: AgentName,
    /// The human mailbox told about approvals, pauses, blocks and stops.
    pub human: AgentName,
    /// Consecutive INSUFFICIENT results that pause the cycle.
    pub max_insufficient: u32,
    /// The Actor's scope per step: changed lines and files against the
    /// worktree's base (more than either is over).
    pub max_lines: u32,
    pub max_files: u32,
    /// The gate for a PASS at low, medium and high risk.
    pub low: Gate,
    pub medium: Gate,
    pub high: Gate,
    /// Run in the Actor's worktree when a cycle is approved (`{flow}`,
    /// `{cycle}`, `{branch}`, `{worktree}`); empty: nothing is run.
    pub on_approve: Vec<String>,
    pub on_approve_timeout: Duration,
    /// Unix users whose reply to the flow's question is carried out, and
    /// who may run `flow approve|reject|stop` (besides root and the service
    /// user). Empty: a reply is never carried out (`crate::flow::authority`).
    pub approvers: Vec<String>,
    /// agent-state lands an approved cycle's branch on a remote's branch
    /// itself (`publish = { into = "main", remote = "origin" }`), before
    /// `on_approve`.
    pub publish: Option<PublishSettings>,
}

/// Where an approved cycle's branch is published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishSettings {
    /// The branch of the remote it lands on (fast-forward, after a rebase
    /// attempt if the two diverged).
    pub into: String,
    /// A remote of the Actor's repository, or a URL or path git takes.
    pub remote: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPublish {
    into: Option<String>,
    remote: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFlow {
    name: Option<String>,
    planner: Option<String>,
    actor: Option<String>,
    judge: Option<String>,
    human: Option<String>,
    max_insufficient: Option<i64>,
    scope: Option<RawScope>,
    risk: Option<RawRisk>,
    on_approve: Option<Vec<String>>,
    on_approve_timeout: Option<String>,
    approvers: Option<Vec<String>>,
    publish: Option<RawPublish>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScope {
    max_lines: Option<i64>,
    max_files: Option<i64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRisk {
    low: Option<String>,
    medium: Option<String>,
    high: Option<String>,
}

impl Validator {
    /// Every `[[flow]]`, checked against the agents.
    pub(super) fn flows(
        &mut self,
        table: &toml::Table,
        agents: &[AgentConfig],
        escalate_to: Option<&AgentName>,
    ) -> Vec<FlowSettings> {
        let items = match table.get("flow") {
            None => return Vec::new(),
            Some(toml::Value::Array(items)) => items,
            Some(_) => {
                self.problem(
                    "flow",
                    "must be an array of tables: write each flow as [[flow]]",
                );
                return Vec::new();
            }
        };
        let mut flows: Vec<FlowSettings> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let name = item.get("name").and_then(|n| n.as_str()).unwrap_or("?");
            let field = format!("flow[{i}] ({name})");
            match item.clone().try_into::<RawFlow>() {
                Ok(raw) => {
                    if let Some(flow) = self.flow(&field, &raw, agents, escalate_to) {
                        if flows.iter().any(|f| f.name == flow.name) {
                            self.problem(
                                format!("{field}.name"),
                                format!(
                                    "`{}` is configured twice; flow names must be unique",
                                    flow.name
                                ),
                            );
                        }
                        flows.push(flow);
                    }
                }
                Err(e) => self.problem(field, e.to_string().trim().to_string()),
            }
        }
        flows
    }

    fn flow(
        &mut self,
        field: &str,
        raw: &RawFlow,
        agents: &[AgentConfig],
        escalate_to: Option<&AgentName>,
    ) -> Option<FlowSettings> {
        let f = |name: &str| format!("{field}.{name}");
        let name = match raw.name.as_deref().map(AgentName::parse) {
            Some(Ok(n)) => Some(n),
            Some(Err(e)) => {
                self.problem(f("name"), e.to_string());
                None
            }
            None => {
                self.problem(
                    f("name"),
                    "is missing: give the flow a name, e.g. name = \"docs\"",
                );
                None
            }
        };
        let role = |v: &mut Validator, key: &str, value: Option<&str>, kind: AgentKind| {
            let Some(value) = value else {
                v.problem(
                    f(key),
                    format!(
                        "is missing: name the agent that plays the {key}, e.g. {key} = \"rio\""
                    ),
                );
                return None;
            };
            match agents.iter().find(|a| a.name.as_str() == value) {
                Some(a) if a.kind == kind => Some(a.name.clone()),
                Some(_) if kind == AgentKind::Human => {
                    v.problem(
                        f(key),
                        format!("{value:?} is not a human mailbox (kind = \"human\"); name one"),
                    );
                    None
                }
                Some(_) => {
                    v.problem(
                        f(key),
                        format!(
                            "{value:?} is a human mailbox; a {key} must be an agent with sessions"
                        ),
                    );
                    None
                }
                None => {
                    v.problem(
                        f(key),
                        format!("{value:?} is not a configured agent; add an [[agent]] named {value:?} or name one of the agents"),
                    );
                    None
                }
            }
        };
        let planner = role(self, "planner", raw.planner.as_deref(), AgentKind::Agent);
        let actor = role(self, "actor", raw.actor.as_deref(), AgentKind::Agent);
        let judge = role(self, "judge", raw.judge.as_deref(), AgentKind::Agent);
        let human = match raw.human.as_deref() {
            Some(h) => role(self, "human", Some(h), AgentKind::Human),
            None => match escalate_to {
                Some(h) => Some(h.clone()),
                None => {
                    self.problem(
                        f("human"),
                        "is missing and no human mailbox is configured: add an [[agent]] with kind = \"human\" and name it here",
                    );
                    None
                }
            },
        };
        if let Some(actor) = &actor
            && agents
                .iter()
                .find(|a| &a.name == actor)
                .is_some_and(|a| a.session.workspace.is_none())
        {
            self.problem(
                f("actor"),
                format!(
                    "{actor} has no workspace: the daemon checks the Actor's scope in its session's git worktree; add workspace = {{ repo = \"/path/to/repo\" }} to its [[agent]]"
                ),
            );
        }
        let max_insufficient = self.count(
            &f("max_insufficient"),
            raw.max_insufficient,
            None,
            5,
            1..=1000,
        );
        let scope = raw.scope.clone().unwrap_or_default();
        let max_lines = self.count(
            &f("scope.max_lines"),
            scope.max_lines,
            None,
            150,
            1..=10_000_000,
        );
        let max_files = self.count(
            &f("scope.max_files"),
            scope.max_files,
            None,
            2,
            1..=1_000_000,
        );
        let risk = raw.risk.clone().unwrap_or_default();
        let gate = |v: &mut Validator, key: &str, value: Option<&str>, default: Gate| match value {
            None => default,
            Some("auto") => Gate::Auto,
            Some("approve") => Gate::Approve,
            Some("block") => Gate::Block,
            Some(other) => {
                v.problem(
                    f(&format!("risk.{key}")),
                    format!("{other:?} is not a gate; write \"auto\" (approved after the Judge's PASS), \"approve\" (a human approves) or \"block\" (blocked and escalated)"),
                );
                default
            }
        };
        let low = gate(self, "low", risk.low.as_deref(), Gate::Auto);
        let medium = gate(self, "medium", risk.medium.as_deref(), Gate::Approve);
        let high = gate(self, "high", risk.high.as_deref(), Gate::Block);
        let on_approve = raw.on_approve.clone().unwrap_or_default();
        if let Some(program) = on_approve.first()
            && !std::path::Path::new(program).is_absolute()
            && program.contains('/')
        {
            self.problem(
                f("on_approve"),
                format!(
                    "{program:?} is a relative path; give an absolute path or a program on PATH"
                ),
            );
        }
        let on_approve_timeout = self.duration(
            &f("on_approve_timeout"),
            raw.on_approve_timeout.as_deref(),
            "10m",
        );
        let approvers = raw.approvers.clone().unwrap_or_default();
        for (i, user) in approvers.iter().enumerate() {
            if let Err(why) = super::check_user_name(user) {
                self.problem(
                    f(&format!("approvers[{i}]")),
                    format!("{user:?} {why}; write the unix user name of a person who approves, e.g. approvers = [\"marcus\"]"),
                );
            } else if approvers[..i].contains(user) {
                self.problem(
                    f(&format!("approvers[{i}]")),
                    format!("{user:?} is listed twice; list each user once"),
                );
            }
        }
        let publish = raw.publish.as_ref().and_then(|p| {
            let into = p.into.clone().unwrap_or_default();
            let remote = p.remote.clone().unwrap_or_default();
            let bad_branch = into.is_empty()
                || into.starts_with(['-', '/', '.'])
                || into.ends_with(['/', '.'])
                || into.ends_with(".lock")
                || into.contains("..")
                || into.contains("@{")
                || into.contains("//")
                || into
                    .chars()
                    .any(|c| c.is_control() || c.is_whitespace() || "~^:?*[\\\u{7f}".contains(c));
            if bad_branch {
                self.problem(
                    f("publish.into"),
                    format!("{into:?} is not a branch name git takes; name the remote's branch, e.g. into = \"main\""),
                );
                return None;
            }
            if remote.trim().is_empty() || remote.starts_with('-') {
                self.problem(
                    f("publish.remote"),
                    format!("{remote:?} is not a remote; name one of the repository's remotes, a URL or a path, e.g. remote = \"origin\""),
                );
                return None;
            }
            Some(PublishSettings { into, remote })
        });
        Some(FlowSettings {
            publish,
            name: name?,
            planner: planner?,
            actor: actor?,
            judge: judge?,
            human: human?,
            max_insufficient,
            max_lines,
            max_files,
            low,
            medium,
            high,
            on_approve,
            on_approve_timeout,
            approvers,
        })
    }
}
