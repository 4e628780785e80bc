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

pub const DEFAULT_PATH: &str = "/etc/agent-state/config.toml";
pub const DEFAULT_STATE_ROOT: &str = "/opt/teleo-eval/agent-state";

/// Placeholders a session command may use.
pub const COMMAND_PLACEHOLDERS: &[&str] =
    &["agent", "session_id", "model", "prompt_file", "instance"];

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
    /// Retries after an API error (rate limit, overload, 5xx).
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
}

#[derive(Debug, Clone)]
pub struct HookSettings {
    pub on_error: Option<PathBuf>,
    pub timeout: Duration,
    /// The human mailbox escalations go to (default: the first
    /// `kind = "human"` agent).
    pub escalate_to: Option<AgentName>,
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
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawHooks {
    on_error: Option<String>,
    timeout: Option<String>,
    escalate_to: Option<String>,
}

const TOP_LEVEL: &[&str] = &[
    "state_root",
    "group",
    "daemon",
    "defaults",
    "agent",
    "health",
    "hooks",
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

        Some(Config {
            source: path.to_path_buf(),
            state_root,
            group,
            daemon,
            agents,
            health,
            hooks,
            warnings: std::mem::take(&mut self.warnings),
        })
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
        SessionSettings {
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

fn valid_group(g: &str) -> bool {
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
