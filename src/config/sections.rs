//! The daemon's own sections: `[daemon]` (how many sessions at once, the
//! catch-up window, the shutdown grace), `[health]` (the monitor's interval,
//! disk thresholds and pruning), `[hooks]` (the on-error hook, the human
//! mailbox escalations go to) and `[metrics]` (the Prometheus outputs).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::{AgentConfig, AgentKind, Validator};
use crate::agent_name::AgentName;

#[derive(Debug, Clone)]
pub struct DaemonSettings {
    pub max_concurrent_sessions: usize,
    pub catch_up_window: Duration,
    pub shutdown_grace: Duration,
    /// How long a session's OOM kill lowers `max_concurrent_sessions` by
    /// one (`0s`: never lowered).
    pub oom_lower_for: Duration,
}

#[derive(Debug, Clone)]
pub struct HealthSettings {
    pub interval: Duration,
    pub disk_warn: u64,
    pub disk_pause: u64,
    pub disk_stop: u64,
    /// The most `restore` may unpack (on disk).
    pub restore_limit: u64,
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
    /// The shape of errors.jsonl's records and of the hook's environment.
    pub format: crate::state::error_log::ErrorFormat,
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

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDaemon {
    max_concurrent_sessions: Option<i64>,
    catch_up_window: Option<String>,
    shutdown_grace: Option<String>,
    oom_lower_for: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHealth {
    interval: Option<String>,
    disk_warn: Option<String>,
    disk_pause: Option<String>,
    disk_stop: Option<String>,
    restore_limit: Option<String>,
    processed_retention: Option<String>,
    session_log_retention: Option<String>,
    keep_sessions: Option<i64>,
    success_within: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHooks {
    on_error: Option<String>,
    timeout: Option<String>,
    escalate_to: Option<String>,
    format: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMetrics {
    listen: Option<String>,
    textfile: Option<String>,
    interval: Option<String>,
}

impl Validator {
    /// `[daemon]`.
    pub(super) fn daemon(&mut self, raw: &RawDaemon) -> DaemonSettings {
        DaemonSettings {
            max_concurrent_sessions: match raw.max_concurrent_sessions {
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
                raw.catch_up_window.as_deref(),
                "2h",
            ),
            shutdown_grace: self.duration(
                "daemon.shutdown_grace",
                raw.shutdown_grace.as_deref(),
                "60s",
            ),
            oom_lower_for: {
                let d = self.duration("daemon.oom_lower_for", raw.oom_lower_for.as_deref(), "1h");
                if d > Duration::from_secs(7 * 86_400) {
                    self.problem(
                        "daemon.oom_lower_for",
                        "is longer than 7d; write e.g. \"1h\", or \"0s\" to never lower the limit",
                    );
                }
                d
            },
        }
    }

    /// `[health]`; its disk thresholds must descend.
    pub(super) fn health(&mut self, raw: &RawHealth) -> HealthSettings {
        let health = HealthSettings {
            interval: self.duration("health.interval", raw.interval.as_deref(), "60s"),
            disk_warn: self.size("health.disk_warn", raw.disk_warn.as_deref(), "1GiB"),
            disk_pause: self.size("health.disk_pause", raw.disk_pause.as_deref(), "500MiB"),
            disk_stop: self.size("health.disk_stop", raw.disk_stop.as_deref(), "100MiB"),
            restore_limit: self.size(
                "health.restore_limit",
                raw.restore_limit.as_deref(),
                "16GiB",
            ),
            processed_retention: self.duration(
                "health.processed_retention",
                raw.processed_retention.as_deref(),
                "30d",
            ),
            session_log_retention: self.duration(
                "health.session_log_retention",
                raw.session_log_retention.as_deref(),
                "30d",
            ),
            keep_sessions: self.count(
                "health.keep_sessions",
                raw.keep_sessions,
                None,
                20,
                0..=1_000_000,
            ) as usize,
            success_within: match raw.success_within.as_deref() {
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
        health
    }

    /// `[hooks]`; the human mailbox is looked for among `agents`.
    pub(super) fn hooks(&mut self, raw: RawHooks, agents: &[AgentConfig]) -> HookSettings {
        let hooks = HookSettings {
            on_error: match raw.on_error {
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
            timeout: self.duration("hooks.timeout", raw.timeout.as_deref(), "30s"),
            escalate_to: None,
            format: match raw.format.as_deref().map(str::parse) {
                None => Default::default(),
                Some(Ok(f)) => f,
                Some(Err(e)) => {
                    self.problem(
                        "hooks.format",
                        format!(
                            "{e} (\"seed\": seed 002's `{{\"error\": {{...}}}}` records and AXIOM_ERROR_* variables; \"agent-state\": the default)"
                        ),
                    );
                    Default::default()
                }
            },
        };
        let humans: Vec<&AgentConfig> = agents
            .iter()
            .filter(|a| a.kind == AgentKind::Human)
            .collect();
        let mut hooks = hooks;
        hooks.escalate_to = match raw.escalate_to.as_deref() {
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
        hooks
    }

    /// `[metrics]`; an address others can reach is a warning.
    pub(super) fn metrics(&mut self, raw: &RawMetrics) -> MetricsSettings {
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
}
