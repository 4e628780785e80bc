//! The `[[agent]]` tables: each agent's name (unique), kind (an agent, or
//! a human mailbox that is never woken), schedule and time zone, and its
//! session settings: `[defaults]` with the agent's own on top
//! (`session.rs`).

use std::collections::BTreeSet;

use crate::zone::Zone;
use serde::Deserialize;

use super::Validator;
use super::economy::{RawBudget, RawSessionBudget, RawWakeIf};
use super::session::{RawSession, SessionSettings};
use super::workspace::RawWorkspace;
use crate::agent_name::{self, AgentName};
use crate::schedule::Schedule;

/// An agent's `kind`: defined in the store, which creates a directory
/// according to it.
pub use crate::state::bootstrap::AgentKind;

#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    pub name: AgentName,
    pub kind: AgentKind,
    pub domain: Option<String>,
    pub schedule: Option<Schedule>,
    pub timezone: Zone,
    pub session: SessionSettings,
}

impl From<&AgentConfig> for AgentKind {
    fn from(agent: &AgentConfig) -> AgentKind {
        agent.kind
    }
}

/// What the session machine (crates/decide, which cannot name the config)
/// reads of an agent's config: `machine::Settings::of(&cfg)`.
impl From<&AgentConfig> for crate::machine::Settings {
    fn from(cfg: &AgentConfig) -> crate::machine::Settings {
        let s = &cfg.session;
        crate::machine::Settings {
            timeout: s.timeout,
            stall_timeout: s.stall_timeout,
            stall_stops: s.stall_action == super::StallAction::Stop,
            kill_grace: s.kill_grace,
            require_complete: s.require_complete,
            verify: (!s.iteration.verify.is_empty()).then_some(crate::machine::IterationLimits {
                max_iterations: s.iteration.max_iterations,
                stuck_threshold: s.iteration.stuck_threshold,
            }),
            holds_end: !s.iteration.verify.is_empty(),
            retries: s.retries,
        }
    }
}

/// What the hooks (crates/store, which cannot name the config) read of an
/// agent's config: `hooks::begin(&cfg, …)` converts through this.
impl From<&AgentConfig> for crate::hooks::AgentSettings {
    fn from(cfg: &AgentConfig) -> crate::hooks::AgentSettings {
        let s = &cfg.session;
        crate::hooks::AgentSettings {
            name: cfg.name.clone(),
            kind: cfg.kind,
            domain: cfg.domain.clone(),
            session_type: s.session_type,
            timeout: s.timeout,
            inbox_settle: s.inbox_settle,
            model: s.model.clone(),
        }
    }
}

/// An `[[agent]]` table. serde cannot combine `flatten` with
/// `deny_unknown_fields`, so the overridable settings are spelled out again.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAgent {
    name: String,
    kind: Option<String>,
    domain: Option<String>,
    schedule: Option<String>,
    timezone: Option<String>,
    command: Option<Vec<String>>,
    timeout: Option<String>,
    kill_grace: Option<String>,
    model: Option<String>,
    session_type: Option<String>,
    wake_on_inbox: Option<String>,
    inbox_debounce: Option<String>,
    inbox_settle: Option<String>,
    wake_request_interval: Option<String>,
    max_output: Option<String>,
    jitter: Option<String>,
    timeout_retries: Option<i64>,
    empty_output_retries: Option<i64>,
    api_retries: Option<i64>,
    spawn_retries: Option<i64>,
    escalate_after: Option<i64>,
    max_backoff: Option<String>,
    network_retry_for: Option<String>,
    retry_delay: Option<String>,
    spawn_retry_delay: Option<String>,
    stall_timeout: Option<String>,
    stall_action: Option<String>,
    prompt_budget: Option<String>,
    birth_prompt: Option<String>,
    budget: Option<RawBudget>,
    session_budget: Option<RawSessionBudget>,
    budget_action: Option<String>,
    credential: Option<String>,
    wake_if: Option<RawWakeIf>,
    require_complete: Option<bool>,
    max_turns: Option<i64>,
    workspace: Option<RawWorkspace>,
    verify: Option<Vec<Vec<String>>>,
    verify_timeout: Option<String>,
    max_iterations: Option<i64>,
    stuck_threshold: Option<i64>,
    resume: Option<bool>,
    memory_max: Option<String>,
    runs_on: Option<String>,
}

impl RawAgent {
    fn overrides(&self) -> RawSession {
        RawSession {
            command: self.command.clone(),
            timeout: self.timeout.clone(),
            kill_grace: self.kill_grace.clone(),
            model: self.model.clone(),
            session_type: self.session_type.clone(),
            wake_on_inbox: self.wake_on_inbox.clone(),
            inbox_debounce: self.inbox_debounce.clone(),
            inbox_settle: self.inbox_settle.clone(),
            wake_request_interval: self.wake_request_interval.clone(),
            max_output: self.max_output.clone(),
            jitter: self.jitter.clone(),
            timeout_retries: self.timeout_retries,
            empty_output_retries: self.empty_output_retries,
            api_retries: self.api_retries,
            spawn_retries: self.spawn_retries,
            escalate_after: self.escalate_after,
            max_backoff: self.max_backoff.clone(),
            network_retry_for: self.network_retry_for.clone(),
            retry_delay: self.retry_delay.clone(),
            spawn_retry_delay: self.spawn_retry_delay.clone(),
            stall_timeout: self.stall_timeout.clone(),
            stall_action: self.stall_action.clone(),
            prompt_budget: self.prompt_budget.clone(),
            birth_prompt: self.birth_prompt.clone(),
            budget: self.budget.clone(),
            session_budget: self.session_budget.clone(),
            budget_action: self.budget_action.clone(),
            credential: self.credential.clone(),
            wake_if: self.wake_if.clone(),
            require_complete: self.require_complete,
            max_turns: self.max_turns,
            memory_max: self.memory_max.clone(),
            runs_on: self.runs_on.clone(),
            workspace: self.workspace.clone(),
            verify: self.verify.clone(),
            verify_timeout: self.verify_timeout.clone(),
            max_iterations: self.max_iterations,
            stuck_threshold: self.stuck_threshold,
            resume: self.resume,
        }
    }
}

impl Validator {
    /// The `[[agent]]` array, each over `[defaults]`.
    pub(super) fn agents(
        &mut self,
        table: &toml::Table,
        raw_defaults: &RawSession,
        defaults: &SessionSettings,
    ) -> Vec<AgentConfig> {
        let mut agents = Vec::new();
        let mut seen = BTreeSet::new();
        match table.get("agent") {
            None => {}
            Some(toml::Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    let field = format!("agent[{i}]");
                    let raw: Option<RawAgent> = match item.clone().try_into::<RawAgent>() {
                        Ok(raw) => Some(raw),
                        Err(e) => {
                            let name = item.get("name").and_then(|n| n.as_str()).unwrap_or("?");
                            self.problem(
                                format!("{field} ({name})"),
                                e.to_string().trim().to_string(),
                            );
                            None
                        }
                    };
                    if let Some(raw) = raw
                        && let Some(agent) = self.agent(&field, &raw, raw_defaults, defaults)
                    {
                        if !seen.insert(agent.name.clone()) {
                            self.problem(
                                format!("{field}.name"),
                                format!(
                                    "`{}` is configured twice; agent names must be unique",
                                    agent.name
                                ),
                            );
                        }
                        agents.push(agent);
                    }
                }
            }
            Some(_) => self.problem(
                "agent",
                "must be an array of tables: write each agent as [[agent]]",
            ),
        }
        agents
    }

    fn agent(
        &mut self,
        field: &str,
        raw: &RawAgent,
        raw_defaults: &RawSession,
        defaults: &SessionSettings,
    ) -> Option<AgentConfig> {
        let name = match agent_name::problem(&raw.name) {
            None => AgentName::parse(&raw.name).ok(),
            Some(reason) => {
                self.problem(format!("{field}.name"), format!("{:?}: {reason}", raw.name));
                None
            }
        };
        let label = format!("{field} ({})", raw.name);
        let kind = match raw.kind.as_deref() {
            None | Some("agent") => AgentKind::Agent,
            Some("human") => AgentKind::Human,
            Some(other) => {
                self.problem(
                    format!("{label}.kind"),
                    format!("{other:?} is not a kind; use \"agent\" or \"human\""),
                );
                AgentKind::Agent
            }
        };
        let schedule = match (&raw.schedule, kind) {
            (Some(_), AgentKind::Human) => {
                self.problem(
                    format!("{label}.schedule"),
                    "a human mailbox is never woken; remove `schedule` or drop kind = \"human\"",
                );
                None
            }
            (Some(line), AgentKind::Agent) => match Schedule::parse(line) {
                Ok(s) => Some(s),
                Err(e) => {
                    self.problem(format!("{label}.schedule"), e.to_string());
                    None
                }
            },
            (None, _) => None,
        };
        let timezone = match raw.timezone.as_deref() {
            None => Zone::UTC,
            Some(tz) => match tz.parse::<Zone>() {
                Ok(tz) => tz,
                Err(e) => {
                    self.problem(
                        format!("{label}.timezone"),
                        e.describe(tz, || format!("{tz:?} is not an IANA time zone name such as \"UTC\" or \"Europe/Berlin\"")),
                    );
                    Zone::UTC
                }
            },
        };
        let session = self.session_settings(&label, raw_defaults, &raw.overrides(), Some(defaults));
        Some(AgentConfig {
            name: name?,
            kind,
            domain: raw.domain.clone(),
            schedule,
            timezone,
            session,
        })
    }
}
