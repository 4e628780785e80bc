//! The configuration file: TOML, read once into typed, validated values.
//!
//! Validation reports *every* problem it finds, each with the path of the
//! field (`agent[2].schedule`) and what to write instead, so one run of
//! `agent-state check` is enough to fix a file. Durations, sizes, cron lines
//! and time zones are parsed here and nowhere else.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono_tz::Tz;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::agent_name::{self, AgentName};
use crate::error::Error;
use crate::schedule::Schedule;
use crate::state::session::SessionType;

mod economy;
pub use economy::{
    Budget, BudgetAction, CredentialSettings, DEFAULT_CREDENTIAL, FleetBudget, SessionBudget,
    UsageLimitSettings, WakeIf,
};
use economy::{RawBudget, RawFleetBudget, RawSessionBudget, RawUsageLimits, RawWakeIf};
pub mod crontab;
pub mod flow;
pub mod iteration;
pub mod logs;
pub mod workspace;
pub use flow::{FlowSettings, Gate};
pub use iteration::IterationSettings;
pub use logs::LogSettings;
use workspace::RawWorkspace;
pub use workspace::WorkspaceSettings;

pub const DEFAULT_PATH: &str = "/etc/agent-state/config.toml";
pub const DEFAULT_STATE_ROOT: &str = "/opt/teleo-eval/agent-state";

/// Placeholders a session command may use.
pub const COMMAND_PLACEHOLDERS: &[&str] = &[
    "agent",
    "session_id",
    "model",
    "prompt_file",
    "instance",
    "max_turns",
    "max_budget_usd",
    "workspace",
    "claude_session",
    "claude_session_id",
];

/// The config's errors live with the crate's error type (the base layer),
/// which every layer may use; see ARCHITECTURE.md, "Layers".
pub use crate::error::{ConfigError, Problem};

#[derive(Debug, Clone)]
pub struct Config {
    /// The file this was read from (named in error messages).
    pub source: PathBuf,
    pub state_root: PathBuf,
    pub group: Option<String>,
    pub daemon: DaemonSettings,
    pub agents: Vec<AgentConfig>,
    pub health: HealthSettings,
    pub hooks: HookSettings,
    pub metrics: MetricsSettings,
    /// `[budget]`: the fleet's daily limits and the time zone of days.
    pub budget: FleetBudget,
    /// `[credential.NAME]`: logins agents share (see `AgentConfig::credential`).
    pub credentials: std::collections::BTreeMap<String, CredentialSettings>,
    pub usage_limits: UsageLimitSettings,
    /// `[[flow]]`: Planner → Actor → Judge loops between agents.
    pub flows: Vec<FlowSettings>,
    /// `[logs]`: rotation of the append-only logs.
    pub logs: LogSettings,
    /// Settings that were missing or unusable and took their default: the
    /// daemon logs them as `CONFIG_DEFAULTED`, `check` prints them.
    pub warnings: Vec<Problem>,
}

#[derive(Debug, Clone)]
pub struct DaemonSettings {
    pub max_concurrent_sessions: usize,
    pub catch_up_window: Duration,
    pub shutdown_grace: Duration,
}

/// An agent's `kind`: defined in the store, which creates a directory
/// according to it.
pub use crate::state::bootstrap::AgentKind;

impl From<&AgentConfig> for AgentKind {
    fn from(agent: &AgentConfig) -> AgentKind {
        agent.kind
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeOnInbox {
    High,
    Any,
    Never,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SessionSettings {
    pub command: Vec<String>,
    pub timeout: Duration,
    pub kill_grace: Duration,
    pub model: String,
    pub session_type: SessionType,
    pub wake_on_inbox: WakeOnInbox,
    pub inbox_debounce: Duration,
    /// How long a message file that does not parse yet (or still has a
    /// second link) may still be being written before it is judged.
    pub inbox_settle: Duration,
    pub max_output: u64,
    pub jitter: Duration,
    pub retries: RetrySettings,
    /// No output for this long is a stall (`None`: never).
    pub stall_timeout: Option<Duration>,
    pub stall_action: StallAction,
    /// The prompt is kept under this many bytes (what is cut is said).
    pub prompt_budget: u64,
    /// What a hatching agent's first session gets instead of its identity.
    pub birth_prompt: String,
    /// Daily limits of this agent (`budget = { ... }`).
    pub budget: Budget,
    /// Limits of one session, as its usage streams.
    pub session_budget: SessionBudget,
    pub budget_action: BudgetAction,
    /// The credential group (`[credential.NAME]`) this agent's sessions use.
    pub credential: String,
    /// Whether a scheduled wake starts a session.
    pub wake_if: WakeIf,
    /// An exit 0 without a COMPLETE signal is a failure (SESSION_INCOMPLETE).
    pub require_complete: bool,
    /// `{max_turns}` in the command.
    pub max_turns: u32,
    /// Each daemon session in its own git worktree (`workspace = {...}`).
    pub workspace: Option<WorkspaceSettings>,
    /// The iteration loop: `verify`, `max_iterations`, ...
    pub iteration: IterationSettings,
}

/// The default birth prompt: the first session of an agent without an
/// identity asks it to write one.
pub const DEFAULT_BIRTH_PROMPT: &str = "You are a new agent on this team and have no identity yet. \
Before anything else, decide who you are: your domain, what you are for, how you work and \
what you will not do. Write it to identity.md in your state directory (the directory in the \
AGENT_STATE_DIR environment variable) in a few short sections; every later session starts \
from it. Then begin your work.";

/// How failed sessions are retried (the error matrix, docs/errors.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetrySettings {
    /// Retries after a timeout (or a stall stopped), before escalation.
    pub timeout: u32,
    /// Retries after a session that printed nothing.
    pub empty_output: u32,
    /// Retries after an API error (overload, 5xx; a usage limit is waited out).
    pub api: u32,
    /// Retries after a spawn failure other than not-found / permission.
    pub spawn: u32,
    /// Failures in a row before a plain failure is escalated.
    pub escalate_after: u32,
    /// The first delay before a retry (timeout, stall, empty output, API
    /// error) and the first step of the backoff after failures; each doubles.
    pub retry_delay: Duration,
    /// The first delay before retrying a failed spawn; doubles.
    pub spawn_retry_delay: Duration,
    /// The longest the backoff after failures gets.
    pub max_backoff: Duration,
}

impl Default for RetrySettings {
    fn default() -> Self {
        RetrySettings {
            timeout: 2,
            empty_output: 3,
            api: 5,
            spawn: 3,
            escalate_after: 3,
            retry_delay: Duration::from_secs(30),
            spawn_retry_delay: Duration::from_secs(2),
            max_backoff: Duration::from_secs(3600),
        }
    }
}

/// What happens when a session stalls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StallAction {
    /// A `SESSION_STALLED` warning; the session goes on.
    #[default]
    Warn,
    /// The warning, then the session is ended like a timeout and retried.
    Stop,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    pub name: AgentName,
    pub kind: AgentKind,
    pub domain: Option<String>,
    pub schedule: Option<Schedule>,
    pub timezone: Tz,
    pub session: SessionSettings,
}

#[derive(Debug, Clone)]
pub struct HealthSettings {
    pub interval: Duration,
    pub disk_warn: u64,
    pub disk_pause: u64,
    pub disk_stop: u64,
    /// Processed messages older than this are pruned.
    pub processed_retention: Duration,
    /// Session logs and prompt files older than this are pruned...
    pub session_log_retention: Duration,
    /// ...except those of each agent's newest sessions.
    pub keep_sessions: usize,
    /// `agent-state health` warns about a scheduled agent without a
    /// successful session for this long (`None`: never).
    pub success_within: Option<Duration>,
}

#[derive(Debug, Clone)]
pub struct HookSettings {
    pub on_error: Option<PathBuf>,
    pub timeout: Duration,
    /// The human mailbox escalations go to (default: the first
    /// `kind = "human"` agent).
    pub escalate_to: Option<AgentName>,
}

/// `[metrics]`: where the daemon publishes its Prometheus metrics. Both
/// are off unless configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsSettings {
    /// A plain-HTTP listener answering `GET /metrics`.
    pub listen: Option<std::net::SocketAddr>,
    /// A node_exporter textfile (`*.prom`), replaced atomically.
    pub textfile: Option<PathBuf>,
    /// How often the metrics are rendered (and the textfile written).
    pub interval: Duration,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        MetricsSettings {
            listen: None,
            textfile: None,
            interval: Duration::from_secs(15),
        }
    }
}

impl MetricsSettings {
    pub fn enabled(&self) -> bool {
        self.listen.is_some() || self.textfile.is_some()
    }
}

// ---- raw shapes, as written in the file ------------------------------------

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawDaemon {
    max_concurrent_sessions: Option<i64>,
    catch_up_window: Option<String>,
    shutdown_grace: Option<String>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct RawSession {
    command: Option<Vec<String>>,
    timeout: Option<String>,
    kill_grace: Option<String>,
    model: Option<String>,
    session_type: Option<String>,
    wake_on_inbox: Option<String>,
    inbox_debounce: Option<String>,
    inbox_settle: Option<String>,
    max_output: Option<String>,
    jitter: Option<String>,
    timeout_retries: Option<i64>,
    empty_output_retries: Option<i64>,
    api_retries: Option<i64>,
    spawn_retries: Option<i64>,
    escalate_after: Option<i64>,
    max_backoff: Option<String>,
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
    max_output: Option<String>,
    jitter: Option<String>,
    timeout_retries: Option<i64>,
    empty_output_retries: Option<i64>,
    api_retries: Option<i64>,
    spawn_retries: Option<i64>,
    escalate_after: Option<i64>,
    max_backoff: Option<String>,
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
            max_output: self.max_output.clone(),
            jitter: self.jitter.clone(),
            timeout_retries: self.timeout_retries,
            empty_output_retries: self.empty_output_retries,
            api_retries: self.api_retries,
            spawn_retries: self.spawn_retries,
            escalate_after: self.escalate_after,
            max_backoff: self.max_backoff.clone(),
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
            workspace: self.workspace.clone(),
            verify: self.verify.clone(),
            verify_timeout: self.verify_timeout.clone(),
            max_iterations: self.max_iterations,
            stuck_threshold: self.stuck_threshold,
            resume: self.resume,
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    interval: Option<String>,
    disk_warn: Option<String>,
    disk_pause: Option<String>,
    disk_stop: Option<String>,
    processed_retention: Option<String>,
    session_log_retention: Option<String>,
    keep_sessions: Option<i64>,
    success_within: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawHooks {
    on_error: Option<String>,
    timeout: Option<String>,
    escalate_to: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    listen: Option<String>,
    textfile: Option<String>,
    interval: Option<String>,
}

const TOP_LEVEL: &[&str] = &[
    "state_root",
    "group",
    "daemon",
    "defaults",
    "agent",
    "health",
    "hooks",
    "metrics",
    "budget",
    "credential",
    "usage_limits",
    "flow",
    "logs",
];

impl Config {
    /// Read and validate the file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::load_with_text(path).map(|(config, _)| config)
    }

    /// [`Config::load`], and the text it was read from (the daemon keeps a
    /// copy of the text it accepted: see [`accepted_copy`]).
    pub fn load_with_text(path: &Path) -> Result<(Config, String), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(&text, path).map(|config| (config, text))
    }

    /// [`Config::load`]; if the file is not valid (a typo while the daemon
    /// runs), the last configuration the daemon accepted instead, with why.
    /// The daemon's copy is found under the state root that the file names,
    /// read leniently (see [`lenient_state_root`]). The original error if
    /// there is no usable copy, or if the file cannot be read at all.
    pub fn load_or_accepted(path: &Path) -> Result<(Config, Option<Fallback>), ConfigError> {
        let error = match Config::load(path) {
            Ok(config) => return Ok((config, None)),
            Err(e @ ConfigError::Read { .. }) => return Err(e),
            Err(e) => e,
        };
        let copy = accepted_copy(&lenient_state_root(path));
        // Below the state root: never through a link, never a FIFO.
        let Ok(Some(file)) = crate::fsx::open_read(&copy) else {
            return Err(error);
        };
        let mut text = String::new();
        if std::io::Read::read_to_string(&mut std::io::Read::take(&file, 4 << 20), &mut text)
            .is_err()
        {
            return Err(error);
        }
        let Ok(config) = Config::parse(&text, path) else {
            return Err(error);
        };
        let accepted_at = file
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .map(chrono::DateTime::<chrono::Utc>::from);
        Ok((
            config,
            Some(Fallback {
                error,
                copy,
                accepted_at,
            }),
        ))
    }

    /// Validate `text` as if read from `path` (relative paths in it resolve
    /// against the file's directory).
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        // Relative paths in the file (state_root, a command) resolve against
        // the file's directory, whatever the working directory of whoever
        // reads it; sessions run in the agent's directory.
        let path = &std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let table: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            path: path.to_path_buf(),
            message: e.to_string().trim().replace('\n', "\n    "),
        })?;
        let mut v = Validator::default();
        let config = v.config(&table, path);
        if v.problems.is_empty() {
            Ok(config.expect("a config without problems"))
        } else {
            Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                problems: v.problems,
            })
        }
    }

    pub fn agent(&self, name: &AgentName) -> Result<&AgentConfig, Error> {
        self.agents
            .iter()
            .find(|a| &a.name == name)
            .ok_or_else(|| Error::UnknownAgent {
                agent: name.to_string(),
                config: self.source.clone(),
            })
    }

    /// Parse `name` and look it up: the path every CLI agent argument takes.
    pub fn agent_named(&self, name: &str) -> Result<&AgentConfig, Error> {
        self.agent(&AgentName::parse(name)?)
    }

    /// Agents that have sessions (not human mailboxes).
    pub fn working_agents(&self) -> impl Iterator<Item = &AgentConfig> {
        self.agents.iter().filter(|a| a.kind == AgentKind::Agent)
    }
}

/// The configuration in force is the daemon's last accepted one, because the
/// file on disk is not valid.
#[derive(Debug)]
pub struct Fallback {
    /// What is wrong with the file.
    pub error: ConfigError,
    /// The daemon's copy used instead.
    pub copy: PathBuf,
    /// When the daemon accepted it (the copy's mtime).
    pub accepted_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl fmt::Display for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = match &self.error {
            ConfigError::Read { path, .. }
            | ConfigError::Syntax { path, .. }
            | ConfigError::Invalid { path, .. }
            | ConfigError::Refused { path, .. } => path,
        };
        write!(
            f,
            "{} is invalid ({}); using the last configuration the daemon accepted ({}, from {}); run `agent-state check` for every problem",
            path.display(),
            self.error.brief(),
            self.copy.display(),
            self.accepted_at
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                .unwrap_or_else(|| "an unknown time".into())
        )
    }
}

/// Where the daemon keeps the text of the configuration it last accepted
/// (at start and at every accepted reload): `.daemon/config.accepted.toml`.
pub fn accepted_copy(state_root: &Path) -> PathBuf {
    // The root resolved as StateRoot resolves it: only it may be behind a link.
    crate::fsx::trusted(state_root)
        .join(".daemon")
        .join("config.accepted.toml")
}

/// The state root a config file names, read even when the rest of the file
/// is not valid: the `state_root` key of the TOML table, or (if the file is
/// not valid TOML) of the first line `state_root = "..."`, resolved against
/// the file's directory; [`DEFAULT_STATE_ROOT`] when there is none.
pub fn lenient_state_root(path: &Path) -> PathBuf {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let named = match toml::from_str::<toml::Table>(&text) {
        Ok(table) => table
            .get("state_root")
            .and_then(|v| v.as_str())
            .map(str::to_owned),
        Err(_) => text.lines().find_map(|line| {
            let (key, value) = line.split_once('=')?;
            if key.trim() != "state_root" {
                return None;
            }
            let value = value.trim();
            let quoted = value
                .strip_prefix('"')
                .and_then(|v| v.split_once('"'))
                .or_else(|| value.strip_prefix('\'').and_then(|v| v.split_once('\'')));
            quoted.map(|(inner, _)| inner.to_string())
        }),
    };
    let root = PathBuf::from(named.unwrap_or_else(|| DEFAULT_STATE_ROOT.to_string()));
    if root.is_relative() {
        let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        absolute.parent().unwrap_or(Path::new("/")).join(root)
    } else {
        root
    }
}

#[derive(Default)]
struct Validator {
    problems: Vec<Problem>,
    warnings: Vec<Problem>,
}

impl Validator {
    fn problem(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            field: field.into(),
            message: message.into(),
        });
    }

    fn warn(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.warnings.push(Problem {
            field: field.into(),
            message: message.into(),
        });
    }

    /// A whole number in `range`: the value, else the inherited one, else
    /// the default.
    fn count(
        &mut self,
        field: &str,
        value: Option<i64>,
        inherited: Option<u32>,
        default: u32,
        range: std::ops::RangeInclusive<i64>,
    ) -> u32 {
        match (value, inherited) {
            (None, Some(n)) => n,
            (None, None) => default,
            (Some(n), _) if range.contains(&n) => n as u32,
            (Some(n), _) => {
                self.problem(
                    field,
                    format!("{n} is not between {} and {}", range.start(), range.end()),
                );
                default
            }
        }
    }

    /// Deserialize one section on its own, so an error in `[daemon]` does not
    /// hide another in `[health]`.
    fn section<T: DeserializeOwned + Default>(&mut self, table: &toml::Table, key: &str) -> T {
        match table.get(key) {
            None => T::default(),
            Some(value) => self.value(value.clone(), &format!("[{key}]")),
        }
    }

    fn value<T: DeserializeOwned + Default>(&mut self, value: toml::Value, field: &str) -> T {
        match value.try_into::<T>() {
            Ok(t) => t,
            Err(e) => {
                self.problem(field, e.to_string().trim().to_string());
                T::default()
            }
        }
    }

    fn config(&mut self, table: &toml::Table, path: &Path) -> Option<Config> {
        for key in table.keys() {
            if !TOP_LEVEL.contains(&key.as_str()) {
                self.problem(
                    key.clone(),
                    format!("unknown field; the top level has {}", TOP_LEVEL.join(", ")),
                );
            }
        }
        let base = path.parent().unwrap_or(Path::new("."));
        let state_root = match table.get("state_root") {
            None => PathBuf::from(DEFAULT_STATE_ROOT),
            Some(toml::Value::String(s)) if !s.trim().is_empty() => base.join(s),
            Some(_) => {
                self.problem(
                    "state_root",
                    "must be a non-empty path string, e.g. \"/opt/teleo-eval/agent-state\"",
                );
                PathBuf::new()
            }
        };
        let group = match table.get("group") {
            None => None,
            Some(toml::Value::String(g)) if valid_group(g) => Some(g.clone()),
            Some(_) => {
                self.problem("group", "must be a Unix group name such as \"teleo\"");
                None
            }
        };

        let raw_daemon: RawDaemon = self.section(table, "daemon");
        let daemon = DaemonSettings {
            max_concurrent_sessions: match raw_daemon.max_concurrent_sessions {
                None => 2,
                Some(n) if (1..=10_000).contains(&n) => n as usize,
                Some(n) => {
                    self.problem(
                        "daemon.max_concurrent_sessions",
                        format!("{n} is not between 1 and 10000"),
                    );
                    1
                }
            },
            catch_up_window: self.duration(
                "daemon.catch_up_window",
                raw_daemon.catch_up_window.as_deref(),
                "2h",
            ),
            shutdown_grace: self.duration(
                "daemon.shutdown_grace",
                raw_daemon.shutdown_grace.as_deref(),
                "60s",
            ),
        };

        let raw_defaults: RawSession = self.section(table, "defaults");
        let defaults =
            self.session_settings("defaults", &RawSession::default(), &raw_defaults, None);

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
                        && let Some(agent) = self.agent(&field, &raw, &raw_defaults, &defaults)
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

        let raw_health: RawHealth = self.section(table, "health");
        let health = HealthSettings {
            interval: self.duration("health.interval", raw_health.interval.as_deref(), "60s"),
            disk_warn: self.size("health.disk_warn", raw_health.disk_warn.as_deref(), "1GiB"),
            disk_pause: self.size(
                "health.disk_pause",
                raw_health.disk_pause.as_deref(),
                "500MiB",
            ),
            disk_stop: self.size(
                "health.disk_stop",
                raw_health.disk_stop.as_deref(),
                "100MiB",
            ),
            processed_retention: self.duration(
                "health.processed_retention",
                raw_health.processed_retention.as_deref(),
                "30d",
            ),
            session_log_retention: self.duration(
                "health.session_log_retention",
                raw_health.session_log_retention.as_deref(),
                "30d",
            ),
            keep_sessions: self.count(
                "health.keep_sessions",
                raw_health.keep_sessions,
                None,
                20,
                0..=1_000_000,
            ) as usize,
            success_within: match raw_health.success_within.as_deref() {
                Some("off" | "none") => None,
                other => Some(self.duration("health.success_within", other, "2d")),
            },
        };
        if health.interval.is_zero() {
            self.problem("health.interval", "must be longer than 0s, e.g. \"60s\"");
        }
        if !(health.disk_warn >= health.disk_pause && health.disk_pause >= health.disk_stop) {
            self.problem(
                "health",
                "thresholds must satisfy disk_warn >= disk_pause >= disk_stop (e.g. 1GiB, 500MiB, 100MiB)",
            );
        }

        let raw_hooks: RawHooks = self.section(table, "hooks");
        let hooks = HookSettings {
            on_error: match raw_hooks.on_error {
                None => None,
                Some(p) if Path::new(&p).is_absolute() => Some(PathBuf::from(p)),
                Some(p) => {
                    self.problem(
                        "hooks.on_error",
                        format!("{p:?} must be an absolute path to an executable"),
                    );
                    None
                }
            },
            timeout: self.duration("hooks.timeout", raw_hooks.timeout.as_deref(), "30s"),
            escalate_to: None,
        };
        let humans: Vec<&AgentConfig> = agents
            .iter()
            .filter(|a| a.kind == AgentKind::Human)
            .collect();
        let mut hooks = hooks;
        hooks.escalate_to = match raw_hooks.escalate_to.as_deref() {
            Some(name) => match humans.iter().find(|a| a.name.as_str() == name) {
                Some(a) => Some(a.name.clone()),
                None => {
                    self.problem(
                        "hooks.escalate_to",
                        format!(
                            "{name:?} is not a configured human mailbox; add [[agent]] name = {name:?} with kind = \"human\", or name one of: {}",
                            if humans.is_empty() {
                                "(none configured)".to_string()
                            } else {
                                humans.iter().map(|a| a.name.to_string()).collect::<Vec<_>>().join(", ")
                            }
                        ),
                    );
                    None
                }
            },
            None => match humans.first() {
                Some(a) => Some(a.name.clone()),
                None => {
                    self.warn(
                        "hooks.escalate_to",
                        "no human mailbox is configured (an [[agent]] with kind = \"human\"): escalations go only to the journal, errors.jsonl and the on-error hook",
                    );
                    None
                }
            },
        };

        let raw_metrics: RawMetrics = self.section(table, "metrics");
        let metrics = self.metrics(&raw_metrics);
        let raw_budget: RawFleetBudget = self.section(table, "budget");
        let budget = self.fleet_budget(&raw_budget);
        let credentials = self.credentials(table);
        let raw_usage_limits: RawUsageLimits = self.section(table, "usage_limits");
        let usage_limits = self.usage_limits(&raw_usage_limits);
        for a in &agents {
            if a.session.credential != DEFAULT_CREDENTIAL
                && !credentials.contains_key(&a.session.credential)
            {
                self.problem(
                    format!("agent ({}).credential", a.name),
                    format!(
                        "{:?} is not configured; add [credential.{}] (it may be empty) or use the default",
                        a.session.credential, a.session.credential
                    ),
                );
            }
        }

        let flows = self.flows(table, &agents, hooks.escalate_to.as_ref());
        let raw_logs: logs::RawLogs = self.section(table, "logs");
        let logs = self.logs(&raw_logs);

        Some(Config {
            source: path.to_path_buf(),
            state_root,
            group,
            daemon,
            agents,
            health,
            hooks,
            metrics,
            budget,
            credentials,
            usage_limits,
            flows,
            logs,
            warnings: std::mem::take(&mut self.warnings),
        })
    }

    fn metrics(&mut self, raw: &RawMetrics) -> MetricsSettings {
        let listen = raw.listen.as_deref().and_then(|text| {
            match text.parse::<std::net::SocketAddr>() {
                Ok(addr) => {
                    if !addr.ip().is_loopback() {
                        self.warn(
                            "metrics.listen",
                            format!(
                                "{text:?} is reachable from other machines and the listener has no authentication; prefer \"127.0.0.1:9464\" behind a proxy or a firewall"
                            ),
                        );
                    }
                    Some(addr)
                }
                Err(_) => {
                    self.problem(
                        "metrics.listen",
                        format!(
                            "{text:?} is not an address and port; write e.g. \"127.0.0.1:9464\" (or \"[::1]:9464\")"
                        ),
                    );
                    None
                }
            }
        });
        let textfile = raw.textfile.as_deref().and_then(|text| {
            let path = PathBuf::from(text);
            if !path.is_absolute() || path.file_name().is_none() {
                self.problem(
                    "metrics.textfile",
                    format!(
                        "{text:?} must be an absolute file path, e.g. \"/var/lib/prometheus/node-exporter/agent-state.prom\""
                    ),
                );
                return None;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("prom") {
                self.warn(
                    "metrics.textfile",
                    format!("{text:?} does not end in .prom: node_exporter's textfile collector reads only *.prom files"),
                );
            }
            Some(path)
        });
        let interval = self.duration("metrics.interval", raw.interval.as_deref(), "15s");
        if interval < Duration::from_secs(1) {
            self.problem("metrics.interval", "must be at least 1s, e.g. \"15s\"");
        }
        MetricsSettings {
            listen,
            textfile,
            interval: interval.max(Duration::from_secs(1)),
        }
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
                    self.problem(format!("{label}.schedule"), e);
                    None
                }
            },
            (None, _) => None,
        };
        let timezone = match raw.timezone.as_deref() {
            None => chrono_tz::UTC,
            Some(tz) => match tz.parse::<Tz>() {
                Ok(tz) => tz,
                Err(_) => {
                    self.problem(
                        format!("{label}.timezone"),
                        format!("{tz:?} is not an IANA time zone name such as \"UTC\" or \"Europe/Berlin\""),
                    );
                    chrono_tz::UTC
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

    /// Resolve `overrides` over `base`. Values inherited from `[defaults]`
    /// were already checked there, so only overridden ones are reported here.
    fn session_settings(
        &mut self,
        field: &str,
        _raw_base: &RawSession,
        raw: &RawSession,
        base: Option<&SessionSettings>,
    ) -> SessionSettings {
        let f = |name: &str| format!("{field}.{name}");
        let command = match &raw.command {
            Some(cmd) => {
                self.check_command(&f("command"), cmd);
                cmd.clone()
            }
            None => base.map(|b| b.command.clone()).unwrap_or_else(|| {
                vec![
                    "/opt/teleo-eval/research-session.sh".to_string(),
                    "{agent}".to_string(),
                ]
            }),
        };
        let dur = |v: &mut Self,
                   name: &str,
                   value: &Option<String>,
                   inherited: Option<Duration>,
                   default: &str| match (value, inherited) {
            (None, Some(d)) => d,
            (value, _) => v.duration(&f(name), value.as_deref(), default),
        };
        let timeout = dur(
            self,
            "timeout",
            &raw.timeout,
            base.map(|b| b.timeout),
            "90m",
        );
        if timeout.is_zero() {
            self.problem(f("timeout"), "must be longer than 0s");
        }
        let kill_grace = dur(
            self,
            "kill_grace",
            &raw.kill_grace,
            base.map(|b| b.kill_grace),
            "30s",
        );
        let inbox_debounce = dur(
            self,
            "inbox_debounce",
            &raw.inbox_debounce,
            base.map(|b| b.inbox_debounce),
            "30s",
        );
        let inbox_settle = dur(
            self,
            "inbox_settle",
            &raw.inbox_settle,
            base.map(|b| b.inbox_settle),
            "60s",
        );
        let jitter = dur(self, "jitter", &raw.jitter, base.map(|b| b.jitter), "0s");
        let model = match &raw.model {
            Some(m) if !m.trim().is_empty() => m.clone(),
            Some(_) => {
                self.warn(
                    f("model"),
                    "is empty; using the default, \"sonnet\" (set e.g. model = \"opus\")",
                );
                "sonnet".into()
            }
            None => base
                .map(|b| b.model.clone())
                .unwrap_or_else(|| "sonnet".into()),
        };
        let session_type = match &raw.session_type {
            Some(t) => t.parse::<SessionType>().unwrap_or_else(|e| {
                self.problem(f("session_type"), e);
                SessionType::Research
            }),
            None => base
                .map(|b| b.session_type)
                .unwrap_or(SessionType::Research),
        };
        let wake_on_inbox = match raw.wake_on_inbox.as_deref() {
            Some("high") => WakeOnInbox::High,
            Some("any") => WakeOnInbox::Any,
            Some("never") => WakeOnInbox::Never,
            Some(other) => {
                self.problem(
                    f("wake_on_inbox"),
                    format!("{other:?} is not a policy; use \"high\", \"any\" or \"never\""),
                );
                WakeOnInbox::High
            }
            None => base.map(|b| b.wake_on_inbox).unwrap_or(WakeOnInbox::High),
        };
        let max_output = match (&raw.max_output, base) {
            (None, Some(b)) => b.max_output,
            (value, _) => self.size(&f("max_output"), value.as_deref(), "10MiB"),
        };
        let d = RetrySettings::default();
        let b = base.map(|b| b.retries);
        let retries = RetrySettings {
            timeout: self.count(
                &f("timeout_retries"),
                raw.timeout_retries,
                b.map(|b| b.timeout),
                d.timeout,
                0..=100,
            ),
            empty_output: self.count(
                &f("empty_output_retries"),
                raw.empty_output_retries,
                b.map(|b| b.empty_output),
                d.empty_output,
                0..=100,
            ),
            api: self.count(
                &f("api_retries"),
                raw.api_retries,
                b.map(|b| b.api),
                d.api,
                0..=100,
            ),
            spawn: self.count(
                &f("spawn_retries"),
                raw.spawn_retries,
                b.map(|b| b.spawn),
                d.spawn,
                0..=100,
            ),
            escalate_after: self.count(
                &f("escalate_after"),
                raw.escalate_after,
                b.map(|b| b.escalate_after),
                d.escalate_after,
                1..=1000,
            ),
            retry_delay: dur(
                self,
                "retry_delay",
                &raw.retry_delay,
                b.map(|b| b.retry_delay),
                "30s",
            ),
            spawn_retry_delay: dur(
                self,
                "spawn_retry_delay",
                &raw.spawn_retry_delay,
                b.map(|b| b.spawn_retry_delay),
                "2s",
            ),
            max_backoff: dur(
                self,
                "max_backoff",
                &raw.max_backoff,
                b.map(|b| b.max_backoff),
                "1h",
            ),
        };
        if retries.retry_delay.is_zero() || retries.spawn_retry_delay.is_zero() {
            self.problem(
                f("retry_delay"),
                "retry_delay and spawn_retry_delay must be longer than 0s (a retry storm otherwise)",
            );
        }
        if retries.max_backoff < retries.retry_delay {
            self.problem(
                f("max_backoff"),
                "must be at least retry_delay (the first backoff step)",
            );
        }
        let stall_timeout = match raw.stall_timeout.as_deref() {
            None => base.and_then(|b| b.stall_timeout),
            Some("off" | "none" | "0" | "0s") => None,
            Some(text) => Some(self.duration(&f("stall_timeout"), Some(text), "0s")),
        };
        let stall_action = match raw.stall_action.as_deref() {
            None => base.map(|b| b.stall_action).unwrap_or_default(),
            Some("warn") => StallAction::Warn,
            Some("stop") => StallAction::Stop,
            Some(other) => {
                self.problem(
                    f("stall_action"),
                    format!("{other:?} is not an action; use \"warn\" or \"stop\""),
                );
                StallAction::Warn
            }
        };
        let prompt_budget = match (&raw.prompt_budget, base) {
            (None, Some(b)) => b.prompt_budget,
            (value, _) => self.size(&f("prompt_budget"), value.as_deref(), "200KiB"),
        };
        if prompt_budget < 4096 {
            self.problem(
                f("prompt_budget"),
                "must be at least 4KiB (rules and identity are never cut)",
            );
        }
        let birth_prompt = match (&raw.birth_prompt, base) {
            (Some(t), _) if !t.trim().is_empty() => t.clone(),
            (Some(_), _) => {
                self.warn(
                    f("birth_prompt"),
                    "is empty; using the built-in birth prompt",
                );
                DEFAULT_BIRTH_PROMPT.to_string()
            }
            (None, Some(b)) => b.birth_prompt.clone(),
            (None, None) => DEFAULT_BIRTH_PROMPT.to_string(),
        };
        let budget = self.budget(&f("budget"), raw.budget.as_ref(), base.map(|b| b.budget));
        let session_budget = self.session_budget(
            &f("session_budget"),
            raw.session_budget.as_ref(),
            base.map(|b| b.session_budget),
        );
        let budget_action = self.budget_action(
            &f("budget_action"),
            raw.budget_action.as_deref(),
            base.map(|b| b.budget_action),
        );
        let credential = match &raw.credential {
            Some(c) if valid_group(c) => c.clone(),
            Some(c) => {
                self.problem(
                    f("credential"),
                    format!("{c:?} is not a credential name (letters, digits, - and _)"),
                );
                DEFAULT_CREDENTIAL.to_string()
            }
            None => base
                .map(|b| b.credential.clone())
                .unwrap_or_else(|| DEFAULT_CREDENTIAL.to_string()),
        };
        let wake_if = self.wake_if(
            &f("wake_if"),
            raw.wake_if.as_ref(),
            base.map(|b| &b.wake_if),
        );
        let require_complete = raw
            .require_complete
            .or(base.map(|b| b.require_complete))
            .unwrap_or(false);
        let max_turns = self.count(
            &f("max_turns"),
            raw.max_turns,
            base.map(|b| b.max_turns),
            100,
            1..=100_000,
        );
        let workspace = self.workspace(
            &f("workspace"),
            raw.workspace.as_ref(),
            base.and_then(|b| b.workspace.as_ref()),
        );
        let iteration = self.iteration(
            &f,
            iteration::RawIteration {
                verify: raw.verify.as_ref(),
                verify_timeout: raw.verify_timeout.as_deref(),
                max_iterations: raw.max_iterations,
                stuck_threshold: raw.stuck_threshold,
                resume: raw.resume,
            },
            base.map(|b| &b.iteration),
        );
        SessionSettings {
            iteration,
            workspace,
            max_turns,
            credential,
            wake_if,
            require_complete,
            budget,
            session_budget,
            budget_action,
            prompt_budget,
            birth_prompt,
            command,
            timeout,
            kill_grace,
            model,
            session_type,
            wake_on_inbox,
            inbox_debounce,
            inbox_settle,
            max_output,
            jitter,
            retries,
            stall_timeout,
            stall_action,
        }
    }

    fn check_command(&mut self, field: &str, cmd: &[String]) {
        if cmd.is_empty() || cmd[0].trim().is_empty() {
            self.problem(
                field,
                "must name a program: [\"/opt/teleo-eval/research-session.sh\", \"{agent}\"]",
            );
            return;
        }
        for arg in cmd {
            for placeholder in placeholders(arg) {
                if !COMMAND_PLACEHOLDERS.contains(&placeholder.as_str()) {
                    self.problem(
                        field,
                        format!(
                            "unknown placeholder {{{placeholder}}} in {arg:?}; known: {}",
                            COMMAND_PLACEHOLDERS
                                .iter()
                                .map(|p| format!("{{{p}}}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    );
                }
            }
        }
    }

    fn duration(&mut self, field: &str, value: Option<&str>, default: &str) -> Duration {
        let text = value.unwrap_or(default);
        match humantime::parse_duration(text) {
            Ok(d) => d,
            Err(e) => {
                self.problem(
                    field,
                    format!(
                        "{text:?} is not a duration ({e}); write e.g. \"90m\", \"30s\", \"2h\""
                    ),
                );
                humantime::parse_duration(default).unwrap_or_default()
            }
        }
    }

    fn size(&mut self, field: &str, value: Option<&str>, default: &str) -> u64 {
        let text = value.unwrap_or(default);
        match parse_size(text) {
            Ok(n) => n,
            Err(e) => {
                self.problem(field, e);
                parse_size(default).unwrap_or(0)
            }
        }
    }
}

pub(crate) fn valid_group(g: &str) -> bool {
    !g.is_empty()
        && g.len() <= 32
        && g.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !g.starts_with('-')
}

/// `{name}` placeholders in a command argument.
pub fn placeholders(arg: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = arg;
    while let Some(start) = rest.find('{') {
        match rest[start..].find('}') {
            Some(end) => {
                out.push(rest[start + 1..start + end].to_string());
                rest = &rest[start + end + 1..];
            }
            None => break,
        }
    }
    out
}

/// Parse a byte size: `10MiB`, `500 MiB`, `1GiB`, `4096`, `1MB` (SI).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim();
    let multiplier: u64 = match unit {
        "" | "B" => 1,
        "K" | "KiB" | "k" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        _ => {
            return Err(format!(
                "{text:?} has an unknown unit {unit:?}; write e.g. \"10MiB\", \"1GiB\", \"500MiB\""
            ));
        }
    };
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{text:?} is not a size; write e.g. \"10MiB\", \"1GiB\""))?;
    Ok((value * multiplier as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
state_root = "/opt/teleo-eval/agent-state"
group = "teleo"

[daemon]
max_concurrent_sessions = 2
catch_up_window = "2h"
shutdown_grace = "60s"

[defaults]
command = ["/opt/teleo-eval/research-session.sh", "{agent}"]
timeout = "90m"
kill_grace = "30s"
model = "sonnet"
session_type = "research"
wake_on_inbox = "high"
inbox_debounce = "30s"
max_output = "10MiB"

[[agent]]
name = "rio"
domain = "internet-finance"
schedule = "0 22 * * *"
timezone = "UTC"

[[agent]]
name = "marcus"
kind = "human"

[health]
disk_warn = "1GiB"
disk_pause = "500MiB"
disk_stop = "100MiB"

[hooks]
on_error = "/etc/agent-state/on-error.sh"
"#;

    fn problems(text: &str) -> Vec<String> {
        match Config::parse(text, Path::new("/etc/agent-state/config.toml")) {
            Ok(_) => vec![],
            Err(ConfigError::Invalid { problems, .. }) => {
                problems.iter().map(|p| p.to_string()).collect()
            }
            Err(e) => vec![e.to_string()],
        }
    }

    #[test]
    fn the_issue_example_is_valid() {
        let c = Config::parse(FULL, Path::new("/etc/agent-state/config.toml")).unwrap();
        assert_eq!(c.state_root, Path::new("/opt/teleo-eval/agent-state"));
        assert_eq!(c.agents.len(), 2);
        let rio = &c.agents[0];
        assert_eq!(rio.session.timeout, Duration::from_secs(5400));
        assert_eq!(rio.session.max_output, 10 << 20);
        assert_eq!(c.agents[1].kind, AgentKind::Human);
        assert_eq!(c.health.disk_pause, 500 << 20);
    }

    #[test]
    fn metrics_are_off_by_default_and_checked_when_configured() {
        let c = Config::parse("", Path::new("/x/c.toml")).unwrap();
        assert!(!c.metrics.enabled());
        assert_eq!(c.metrics.interval, Duration::from_secs(15));
        let c = Config::parse(
            "[metrics]\nlisten = \"127.0.0.1:9464\"\ntextfile = \"/var/lib/prometheus/node-exporter/agent-state.prom\"\ninterval = \"5s\"\n",
            Path::new("/x/c.toml"),
        )
        .unwrap();
        assert_eq!(c.metrics.listen, Some("127.0.0.1:9464".parse().unwrap()));
        assert!(c.warnings.iter().all(|w| !w.field.starts_with("metrics")));
        assert_eq!(c.metrics.interval, Duration::from_secs(5));
        let c = Config::parse(
            "[metrics]\nlisten = \"0.0.0.0:9464\"\ntextfile = \"/tmp/x.txt\"\n",
            Path::new("/x/c.toml"),
        )
        .unwrap();
        let warned: Vec<_> = c.warnings.iter().map(|w| w.to_string()).collect();
        assert!(
            warned
                .iter()
                .any(|w| w.contains("metrics.listen") && w.contains("no authentication")),
            "{warned:?}"
        );
        assert!(
            warned
                .iter()
                .any(|w| w.contains("metrics.textfile") && w.contains(".prom")),
            "{warned:?}"
        );
        let p = problems(
            "[metrics]\nlisten = \"localhost\"\ntextfile = \"rel.prom\"\ninterval = \"0s\"\n",
        );
        assert!(
            p.iter()
                .any(|p| p.contains("metrics.listen") && p.contains("127.0.0.1:9464")),
            "{p:?}"
        );
        assert!(
            p.iter()
                .any(|p| p.contains("metrics.textfile") && p.contains("absolute")),
            "{p:?}"
        );
        assert!(p.iter().any(|p| p.contains("metrics.interval")), "{p:?}");
        let p = problems("[metrics]\nport = 9464\n");
        assert!(
            p.iter()
                .any(|p| p.contains("[metrics]") && p.contains("port")),
            "{p:?}"
        );
    }

    #[test]
    fn budgets_merge_field_by_field_and_name_the_field_that_is_wrong() {
        let text = r#"
[budget]
timezone = "Europe/Lisbon"
max_sessions = 40
max_cost_usd = 50.0

[defaults]
budget = { max_sessions = 10, max_runtime = "6h" }
session_budget = { max_tokens = 2000000 }

[[agent]]
name = "rio"
budget = { max_sessions = 4 }
budget_action = "finish"

[[agent]]
name = "leo"
"#;
        let c = Config::parse(text, Path::new("/x/c.toml")).unwrap();
        assert_eq!(c.budget.timezone, chrono_tz::Europe::Lisbon);
        assert_eq!(c.budget.limits.max_sessions, Some(40));
        assert_eq!(c.budget.limits.max_cost_usd, Some(50.0));
        let rio = &c.agents[0].session;
        assert_eq!(rio.budget.max_sessions, Some(4));
        assert_eq!(rio.budget.max_runtime, Some(Duration::from_secs(6 * 3600)));
        assert_eq!(rio.session_budget.max_tokens, Some(2_000_000));
        assert_eq!(rio.budget_action, BudgetAction::Finish);
        let leo = &c.agents[1].session;
        assert_eq!(leo.budget.max_sessions, Some(10));
        assert_eq!(leo.budget_action, BudgetAction::Stop);
        assert!(
            Config::parse("", Path::new("/x/c.toml"))
                .unwrap()
                .agents
                .is_empty()
        );

        let p = problems(
            "[budget]\ntimezone = \"Mars/Olympus\"\nmax_tokens = -1\n[[agent]]\nname = \"rio\"\nbudget = { max_cost_usd = -3.0 }\nbudget_action = \"explode\"\n",
        );
        assert!(p.iter().any(|p| p.contains("budget.timezone")), "{p:?}");
        assert!(
            p.iter()
                .any(|p| p.contains("budget.max_tokens") && p.contains("negative")),
            "{p:?}"
        );
        assert!(
            p.iter()
                .any(|p| p.contains("agent[0] (rio).budget.max_cost_usd")),
            "{p:?}"
        );
        assert!(
            p.iter()
                .any(|p| p.contains("agent[0] (rio).budget_action") && p.contains("\"finish\"")),
            "{p:?}"
        );
        let p = problems("[defaults]\nbudget = { max_session = 3 }\n");
        assert!(p.iter().any(|p| p.contains("max_session")), "{p:?}");
    }

    #[test]
    fn flows_are_read_with_their_defaults_and_checked_against_the_agents() {
        let text = r#"
[[agent]]
name = "theseus"
[[agent]]
name = "rio"
workspace = { repo = "/srv/repo" }
[[agent]]
name = "leo"
[[agent]]
name = "marcus"
kind = "human"
[[flow]]
name = "docs"
planner = "theseus"
actor = "rio"
judge = "leo"
[[flow]]
name = "strict"
planner = "theseus"
actor = "rio"
judge = "leo"
human = "marcus"
max_insufficient = 2
scope = { max_lines = 40, max_files = 1 }
risk = { low = "approve", high = "block" }
on_approve = ["gh", "pr", "create", "--head", "{branch}"]
"#;
        let c = Config::parse(text, Path::new("/x/c.toml")).unwrap();
        let docs = &c.flows[0];
        assert_eq!(docs.human.as_str(), "marcus", "the first human by default");
        assert_eq!(
            (docs.max_insufficient, docs.max_lines, docs.max_files),
            (5, 150, 2)
        );
        assert_eq!(
            (docs.low, docs.medium, docs.high),
            (Gate::Auto, Gate::Approve, Gate::Block)
        );
        assert!(docs.on_approve.is_empty());
        let strict = &c.flows[1];
        assert_eq!(
            (strict.max_insufficient, strict.max_lines, strict.max_files),
            (2, 40, 1)
        );
        assert_eq!(strict.low, Gate::Approve);
        assert_eq!(strict.on_approve[0], "gh");

        let p = problems(
            r#"
[[agent]]
name = "rio"
[[agent]]
name = "marcus"
kind = "human"
[[flow]]
name = "Bad Name"
planner = "nobody"
actor = "rio"
judge = "marcus"
risk = { medium = "maybe" }
max_insufficient = 0
[[flow]]
name = "twice"
planner = "rio"
actor = "rio"
judge = "rio"
[[flow]]
name = "twice"
planner = "rio"
actor = "rio"
judge = "rio"
colour = "red"
"#,
        );
        let has = |a: &str, b: &str| p.iter().any(|p| p.contains(a) && p.contains(b));
        assert!(has("flow[0] (Bad Name).name", ""), "{p:?}");
        assert!(
            has(
                "flow[0] (Bad Name).planner",
                "\"nobody\" is not a configured agent"
            ),
            "{p:?}"
        );
        assert!(has("flow[0] (Bad Name).judge", "human mailbox"), "{p:?}");
        assert!(has("flow[0] (Bad Name).actor", "no workspace"), "{p:?}");
        assert!(has("flow[0] (Bad Name).risk.medium", "\"maybe\""), "{p:?}");
        assert!(
            has("flow[0] (Bad Name).max_insufficient", "between 1 and"),
            "{p:?}"
        );
        assert!(has("flow[2] (twice)", "colour"), "{p:?}");
        let p = problems(
            "[[agent]]\nname = \"rio\"\nworkspace = { repo = \"/r\" }\n[[flow]]\nname = \"a\"\nplanner = \"rio\"\nactor = \"rio\"\njudge = \"rio\"\n[[flow]]\nname = \"a\"\nplanner = \"rio\"\nactor = \"rio\"\njudge = \"rio\"\nhuman = \"rio\"\n",
        );
        assert!(
            p.iter()
                .any(|p| p.contains("flow[0] (a).human") && p.contains("no human mailbox")),
            "{p:?}"
        );
        assert!(
            p.iter()
                .any(|p| p.contains("flow[1] (a).human") && p.contains("not a human mailbox")),
            "{p:?}"
        );
    }

    #[test]
    fn log_rotation_settings_are_read_and_checked() {
        let c = Config::parse(FULL, Path::new("/c.toml")).unwrap();
        assert_eq!(c.logs, LogSettings::default());
        assert_eq!(c.logs.rotate_size, 16 << 20);
        assert_eq!(c.logs.journal_retention, None, "journals kept for good");
        let text = "[logs]\nrotate_size = \"1MiB\"\njournal_retention = \"365d\"\ndaemon_log_retention = \"forever\"\n";
        let c = Config::parse(text, Path::new("/c.toml")).unwrap();
        assert_eq!(c.logs.rotate_size, 1 << 20);
        assert_eq!(
            c.logs.journal_retention,
            Some(Duration::from_secs(365 * 86_400))
        );
        assert_eq!(c.logs.daemon_log_retention, None);
        let p = problems(
            "[logs]\nrotate_size = \"10\"\njournal_retention = \"5m\"\ndaemon_log_retention = \"never\"\nkeep = 3\n",
        );
        let has = |field: &str, text: &str| p.iter().any(|p| p.contains(field) && p.contains(text));
        assert!(has("[logs]", "keep"), "{p:?}");
        let p = problems(
            "[logs]\nrotate_size = \"10\"\njournal_retention = \"5m\"\ndaemon_log_retention = \"never\"\n",
        );
        let has = |field: &str, text: &str| p.iter().any(|p| p.contains(field) && p.contains(text));
        assert!(has("logs.rotate_size", "between 1KiB and 256MiB"), "{p:?}");
        assert!(has("logs.journal_retention", "at least 1h"), "{p:?}");
        assert!(has("logs.daemon_log_retention", "not a duration"), "{p:?}");
    }

    #[test]
    fn credentials_wake_conditions_and_usage_limits_are_read_and_checked() {
        let text = r#"
[credential.default]
check = ["claude", "auth", "status", "--json"]
[credential.team-b]
kind = "api_key"
check_every = "5m"
[usage_limits]
wait = "10m"
[defaults]
wake_if = "work"
[[agent]]
name = "rio"
[[agent]]
name = "leo"
credential = "team-b"
wake_if = ["/usr/local/bin/has-work", "{agent}"]
require_complete = true
"#;
        let c = Config::parse(text, Path::new("/x/c.toml")).unwrap();
        let rio = &c.agents[0].session;
        assert_eq!(rio.credential, "default");
        assert_eq!(rio.wake_if, WakeIf::Work);
        assert!(!rio.require_complete);
        let leo = &c.agents[1].session;
        assert_eq!(leo.credential, "team-b");
        assert_eq!(
            leo.wake_if,
            WakeIf::Command(vec!["/usr/local/bin/has-work".into(), "{agent}".into()])
        );
        assert!(leo.require_complete);
        assert!(c.credentials["team-b"].api_key);
        assert_eq!(
            c.credentials["team-b"].check_every,
            Duration::from_secs(300)
        );
        assert_eq!(
            c.credentials["default"].check.as_ref().unwrap()[0],
            "claude"
        );
        assert_eq!(c.usage_limits.wait, Duration::from_secs(600));
        assert_eq!(c.usage_limits.max_wait, Duration::from_secs(4 * 3600));

        let p = problems(
            "[credential.x]\nkind = \"card\"\n[usage_limits]\nwait = \"5s\"\n[[agent]]\nname = \"rio\"\ncredential = \"nope\"\nwake_if = \"sometimes\"\n",
        );
        assert!(p.iter().any(|p| p.contains("credential.x.kind")), "{p:?}");
        assert!(p.iter().any(|p| p.contains("usage_limits.wait")), "{p:?}");
        assert!(
            p.iter()
                .any(|p| p.contains("(rio).credential") && p.contains("[credential.nope]")),
            "{p:?}"
        );
        assert!(
            p.iter()
                .any(|p| p.contains("(rio).wake_if") && p.contains("\"work\"")),
            "{p:?}"
        );
    }

    #[test]
    fn agents_override_defaults() {
        let text = r#"
[defaults]
timeout = "10m"
[[agent]]
name = "rio"
timeout = "5m"
[[agent]]
name = "leo"
"#;
        let c = Config::parse(text, Path::new("/x/c.toml")).unwrap();
        assert_eq!(c.agents[0].session.timeout, Duration::from_secs(300));
        assert_eq!(c.agents[1].session.timeout, Duration::from_secs(600));
    }

    #[test]
    fn relative_state_root_is_relative_to_the_file() {
        let c = Config::parse(
            "state_root = \"../var/state\"",
            Path::new("/repo/config/dev.toml"),
        )
        .unwrap();
        assert_eq!(c.state_root, Path::new("/repo/config/../var/state"));
    }

    #[test]
    fn every_problem_is_reported_with_its_path() {
        let text = r#"
stat_root = "/x"
[daemon]
max_concurrent_sessions = 0
[defaults]
timeout = "ninety minutes"
wake_on_inbox = "sometimes"
command = ["/bin/x", "{agnt}"]
[[agent]]
name = "Rio"
[[agent]]
name = "leo"
schedule = "0 25 * * *"
timezone = "Mars/Olympus"
[[agent]]
name = "leo"
[[agent]]
name = "marcus"
kind = "human"
schedule = "@daily"
[[agent]]
name = "vida"
timout = "5m"
[health]
disk_warn = "1 lightyear"
"#;
        let got = problems(text);
        let want = [
            "stat_root: unknown field",
            "daemon.max_concurrent_sessions: 0 is not between",
            "defaults.timeout: \"ninety minutes\" is not a duration",
            "defaults.wake_on_inbox: \"sometimes\"",
            "defaults.command: unknown placeholder {agnt}",
            "agent[0].name: \"Rio\": uppercase",
            "agent[1] (leo).schedule: hour field",
            "agent[1] (leo).timezone: \"Mars/Olympus\"",
            "agent[2].name: `leo` is configured twice",
            "agent[3] (marcus).schedule: a human mailbox is never woken",
            "agent[4] (vida): unknown field `timout`",
            "health.disk_warn: \"1 lightyear\" has an unknown unit",
        ];
        for w in want {
            assert!(
                got.iter().any(|g| g.contains(w)),
                "missing {w:?} in {got:#?}"
            );
        }
        assert_eq!(got.len(), want.len(), "{got:#?}");
    }

    #[test]
    fn syntax_errors_name_the_file() {
        let err = Config::parse("state_root = ", Path::new("/etc/x.toml")).unwrap_err();
        assert!(
            err.to_string().contains("/etc/x.toml is not valid TOML"),
            "{err}"
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("10MiB").unwrap(), 10 << 20);
        assert_eq!(parse_size("1 GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1MB").unwrap(), 1_000_000);
        assert!(parse_size("lots").is_err());
    }
}
