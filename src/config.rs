//! The configuration file: TOML, read once into typed, validated values.
//!
//! Validation reports *every* problem it finds, each with the path of the
//! field (`agent[2].schedule`) and what to write instead, so one run of
//! `agent-state check` is enough to fix a file. Durations, sizes, cron lines
//! and time zones are parsed here and nowhere else.
//!
//! This root owns the `Config` type and its lookups, reading a file
//! (`Config::load`, `parse`, and the daemon's accepted copy when the file is
//! not valid), the top level of the file and the `Validator` that gathers
//! problems and warnings. Each section is read by an `impl Validator` block
//! in its own module: `agent` (`[[agent]]`), `session` (`[defaults]` and an
//! agent's overrides), `sections` (`[daemon]`, `[health]`, `[hooks]`,
//! `[metrics]`), `economy`, `workspace`, `iteration`, `flow`, `logs`, `web` and
//! `cluster` (checked by `agent-state-cluster`);
//! `values` parses durations, sizes and counts.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use crate::agent_name::AgentName;
use crate::error::Error;

mod agent;
mod cluster;
mod economy;
mod sections;
mod session;
mod values;
pub use agent::{AgentConfig, AgentKind};
pub use cluster::ClusterSettings;
pub use economy::{
    Budget, BudgetAction, CredentialSettings, DEFAULT_CREDENTIAL, FleetBudget, SessionBudget,
    UsageLimitSettings, WakeIf,
};
use economy::{RawFleetBudget, RawUsageLimits};
pub mod crontab;
pub mod flow;
pub mod iteration;
pub mod logs;
pub mod web;
pub mod workspace;
pub use flow::{FlowSettings, Gate, OnInsufficient, PublishSettings, RoleLimits};
pub use iteration::IterationSettings;
pub use logs::LogSettings;
pub use sections::{DaemonSettings, HealthSettings, HookSettings, MetricsSettings};
use sections::{RawDaemon, RawHealth, RawHooks, RawMetrics};
use session::RawSession;
pub use session::{
    COMMAND_PLACEHOLDERS, DEFAULT_BIRTH_PROMPT, RetrySettings, RunsOn, SessionSettings,
    StallAction, WakeOnInbox,
};
pub(crate) use values::valid_group;
pub use values::{SizeError, check_user_name, parse_size, placeholders};
pub use workspace::{CYCLE_BRANCH_PREFIX, WorkspaceSettings};

pub const DEFAULT_PATH: &str = "/etc/agent-state/config.toml";
pub const DEFAULT_STATE_ROOT: &str = "/opt/teleo-eval/agent-state";

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
    /// `[web]`: the read-only web view.
    pub web: web::WebSettings,
    /// `[cluster]`: the NATS JetStream cluster of issue 24, checked; not
    /// used by the daemon yet (it says so at its start).
    pub cluster: Option<ClusterSettings>,
    /// Settings that were missing or unusable and took their default: the
    /// daemon logs them as `CONFIG_DEFAULTED`, `check` prints them.
    pub warnings: Vec<Problem>,
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
    "web",
    "cluster",
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

/// Reads the file section by section, gathering every problem (the file is
/// refused) and warning (a default stands in) with its field's path.
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

    /// The whole file, its sections in a fixed order: the order problems
    /// are reported in.
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
        let daemon = self.daemon(&raw_daemon);

        let raw_defaults: RawSession = self.section(table, "defaults");
        let defaults =
            self.session_settings("defaults", &RawSession::default(), &raw_defaults, None);

        let agents = self.agents(table, &raw_defaults, &defaults);

        let raw_health: RawHealth = self.section(table, "health");
        let health = self.health(&raw_health);

        let raw_hooks: RawHooks = self.section(table, "hooks");
        let hooks = self.hooks(raw_hooks, &agents);

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
        let raw_web: web::RawWeb = self.section(table, "web");
        let web = self.web(&raw_web);
        let cluster = self.cluster(table);
        if cluster.as_ref().is_some_and(|c| !c.local_sessions) {
            // What a worker refuses, said by `check` before a session is.
            for a in agents
                .iter()
                .filter(|a| a.session.runs_on == RunsOn::Workers)
            {
                if !a.session.iteration.verify.is_empty() {
                    self.warn(
                        format!("agent ({}).verify", a.name),
                        format!("{} has [agent.session.iteration] verify, which cannot run on a worker yet: each of its sessions is refused; set runs_on = \"controller\" for this agent (its sessions run on the controller's host), local_sessions = true in [cluster], or remove its verify", a.name),
                    );
                }
                if let Some(f) = flows.iter().find(|f| f.actor == a.name) {
                    self.warn(
                        format!("agent ({}).runs_on", a.name),
                        format!("{} is the Actor of flow {}, whose cycle steps cannot run on a worker yet: each is refused; set runs_on = \"controller\" for this agent", a.name, f.name),
                    );
                }
            }
        } else {
            for a in agents
                .iter()
                .filter(|a| a.session.runs_on == RunsOn::Controller)
            {
                self.warn(
                    format!("agent ({}).runs_on", a.name),
                    "\"controller\" has no effect: without [cluster] and local_sessions = false every session runs on this host already",
                );
            }
        }

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
            web,
            cluster,
            warnings: std::mem::take(&mut self.warnings),
        })
    }
}

#[cfg(test)]
mod duration_tests;
#[cfg(test)]
mod tests;
