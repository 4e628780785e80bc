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

/// What becomes of an Actor's step judged INSUFFICIENT (`on_insufficient`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnInsufficient {
    /// The cycle's branch goes back to its last PASS (or its base): the
    /// next Actor step starts from work a Judge passed.
    Rollback,
    /// The step stays on the branch: the next Actor step continues it.
    Keep,
}

impl OnInsufficient {
    pub fn as_str(self) -> &'static str {
        match self {
            OnInsufficient::Rollback => "rollback",
            OnInsufficient::Keep => "keep",
        }
    }
}

/// The roles' limits the daemon checks (`limits = { ... }`, seed 004's
/// "Operational Constraints"): a step over one is INSUFFICIENT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleLimits {
    /// The Planner's plan: at most this many lines (seed 004: 50).
    pub plan_lines: u32,
    /// Whether the Judge may change its workspace (seed 004: no, "no code
    /// generation").
    pub judge_writes_code: bool,
    /// The paths the Actor may change (globs relative to the repository:
    /// `*`, `?`, `**`); empty: any path.
    pub actor_paths: Vec<String>,
}

impl Default for RoleLimits {
    fn default() -> Self {
        RoleLimits {
            plan_lines: 50,
            judge_writes_code: false,
            actor_paths: Vec::new(),
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
    /// The Actor's scope per step: changed lines and files against where
    /// the step started, the previous step's head (more than either is over).
    pub max_lines: u32,
    pub max_files: u32,
    /// The gate for a PASS at low, medium and high risk.
    pub low: Gate,
    pub medium: Gate,
    pub high: Gate,
    /// Run in the cycle's worktree when a cycle is approved (`{flow}`,
    /// `{cycle}`, `{branch}`: the cycle's one branch, `{worktree}`), before
    /// the worktree is removed; empty: nothing is run.
    pub on_approve: Vec<String>,
    pub on_approve_timeout: Duration,
    /// Unix users whose reply to the flow's question is carried out, and
    /// who may run `flow approve|reject|stop` (besides root and the service
    /// user). Empty: a reply is never carried out (`crate::flow::authority`).
    pub approvers: Vec<String>,
    /// What an INSUFFICIENT does to the Actor's step on the cycle's branch.
    pub on_insufficient: OnInsufficient,
    /// The roles' limits, checked by the daemon.
    pub limits: RoleLimits,
    /// The Actor's workspace (the cycle's branch and worktree are in its
    /// repository); `None` only in a config already refused.
    pub actor_workspace: Option<super::WorkspaceSettings>,
    /// agent-state lands an approved cycle's branch on a remote's branch
    /// itself (`publish = { into = "main", remote = "origin" }`), before
    /// `on_approve`.
    pub publish: Option<PublishSettings>,
}

/// Why `glob` is no path pattern of `limits.actor_paths`, if it is not:
/// empty, absolute, with a `..` component, or too long. Pure.
pub fn check_glob(glob: &str) -> Result<(), &'static str> {
    if glob.is_empty() {
        return Err("is empty");
    }
    if glob.starts_with('/') {
        return Err("is absolute");
    }
    if glob.split('/').any(|c| c == "..") {
        return Err("has a `..` component");
    }
    if glob.len() > 256 || glob.matches('*').count() > 8 {
        return Err("is longer than 256 characters or has more than 8 `*`");
    }
    Ok(())
}

/// Whether the repository path `path` matches `glob`: `*` and `?` within a
/// path component, `**` across components (`docs/**` is everything under
/// docs/, `**/*.md` every .md file). Pure.
pub fn glob_matches(glob: &str, path: &str) -> bool {
    fn go(p: &[u8], s: &[u8]) -> bool {
        match p {
            [] => s.is_empty(),
            [b'*', b'*', rest @ ..] => {
                if let [b'/', after @ ..] = rest
                    && go(after, s)
                {
                    return true;
                }
                (0..=s.len()).any(|i| go(rest, &s[i..]))
            }
            [b'*', rest @ ..] => {
                for i in 0..=s.len() {
                    if i > 0 && s[i - 1] == b'/' {
                        break;
                    }
                    if go(rest, &s[i..]) {
                        return true;
                    }
                }
                false
            }
            [b'?', rest @ ..] => matches!(s, [c, tail @ ..] if *c != b'/' && go(rest, tail)),
            [c, rest @ ..] => matches!(s, [d, tail @ ..] if d == c && go(rest, tail)),
        }
    }
    go(glob.as_bytes(), path.as_bytes())
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
    on_insufficient: Option<String>,
    limits: Option<RawLimits>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    plan_lines: Option<i64>,
    judge_writes_code: Option<bool>,
    actor_paths: Option<Vec<String>>,
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
        let on_insufficient = match raw.on_insufficient.as_deref() {
            None | Some("rollback") => OnInsufficient::Rollback,
            Some("keep") => OnInsufficient::Keep,
            Some(other) => {
                self.problem(
                    f("on_insufficient"),
                    format!("{other:?} is not a choice; write \"rollback\" (an INSUFFICIENT step's changes leave the cycle's branch, which goes back to its last PASS; the default) or \"keep\" (the next Actor step continues them)"),
                );
                OnInsufficient::Rollback
            }
        };
        let raw_limits = raw.limits.clone().unwrap_or_default();
        let plan_lines = self.count(
            &f("limits.plan_lines"),
            raw_limits.plan_lines,
            None,
            50,
            1..=1_000_000,
        );
        let actor_paths = raw_limits.actor_paths.clone().unwrap_or_default();
        for (i, glob) in actor_paths.iter().enumerate() {
            if let Err(why) = check_glob(glob) {
                self.problem(
                    f(&format!("limits.actor_paths[{i}]")),
                    format!("{glob:?} {why}; write a path relative to the repository, e.g. \"docs/**\" or \"*.md\""),
                );
            }
        }
        let limits = RoleLimits {
            plan_lines,
            judge_writes_code: raw_limits.judge_writes_code.unwrap_or(false),
            actor_paths,
        };
        let actor_workspace = actor.as_ref().and_then(|actor| {
            agents
                .iter()
                .find(|a| &a.name == actor)
                .and_then(|a| a.session.workspace.clone())
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
            on_insufficient,
            limits,
            actor_workspace,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actor_paths_match_as_globs_within_and_across_components() {
        let table = [
            ("docs/**", "docs/faq.md", true),
            ("docs/**", "docs/a/b/c.md", true),
            ("docs/**", "src/docs/x", false),
            ("docs/**", "docs", false),
            ("*.md", "README.md", true),
            ("*.md", "docs/faq.md", false),
            ("**/*.md", "README.md", true),
            ("**/*.md", "docs/a/faq.md", true),
            ("**/*.md", "docs/a/faq.rs", false),
            ("notes.md", "notes.md", true),
            ("notes.md", "notes.mdx", false),
            ("docs/?.md", "docs/a.md", true),
            ("docs/?.md", "docs/ab.md", false),
            ("docs/*", "docs/a/b", false),
        ];
        for (glob, path, want) in table {
            assert_eq!(glob_matches(glob, path), want, "{glob} {path}");
        }
        assert_eq!(check_glob("docs/**"), Ok(()));
        assert_eq!(check_glob(""), Err("is empty"));
        assert_eq!(check_glob("/etc/*"), Err("is absolute"));
        assert_eq!(check_glob("docs/../x"), Err("has a `..` component"));
    }
}
