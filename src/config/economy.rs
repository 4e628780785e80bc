//! The economy's settings: daily budgets per agent (`budget`, in
//! `[defaults]` or an `[[agent]]`) and for the fleet (`[budget]`), the
//! per-session budget enforced while a session streams (`session_budget`,
//! `budget_action`), the credential groups usage limits and login checks
//! hold together (`credential`, `[credential.NAME]`, `[usage_limits]`), and
//! whether a scheduled wake needs work waiting (`wake_if`). Read here,
//! checked by `usage` (what was used) and the daemon (before each wake, and
//! as usage streams).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::zone::Zone;
use serde::Deserialize;

use super::Validator;

/// Daily limits (of one agent, or of the fleet). `None`: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Budget {
    pub max_sessions: Option<u64>,
    pub max_runtime: Option<Duration>,
    pub max_cost_usd: Option<f64>,
    pub max_tokens: Option<u64>,
}

/// Limits on one session, checked against the usage it reports as it
/// streams (`--output-format stream-json`). Its runtime is `timeout`'s.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SessionBudget {
    pub max_cost_usd: Option<f64>,
    pub max_tokens: Option<u64>,
}

/// What happens when a session goes over its `session_budget`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BudgetAction {
    /// End it now (like a timeout, but not retried): the default.
    #[default]
    Stop,
    /// Let it finish; no new session until the budget allows one.
    Finish,
}

/// `[budget]`: the whole fleet's daily limits, and the time zone every
/// daily budget (and `agent-state usage`) counts days in.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetBudget {
    pub timezone: Zone,
    pub limits: Budget,
}

impl Default for FleetBudget {
    fn default() -> Self {
        FleetBudget {
            timezone: Zone::UTC,
            limits: Budget::default(),
        }
    }
}

#[derive(Deserialize, Default, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBudget {
    max_sessions: Option<i64>,
    max_runtime: Option<String>,
    max_cost_usd: Option<f64>,
    max_tokens: Option<i64>,
}

#[derive(Deserialize, Default, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSessionBudget {
    max_cost_usd: Option<f64>,
    max_tokens: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFleetBudget {
    timezone: Option<String>,
    max_sessions: Option<i64>,
    max_runtime: Option<String>,
    max_cost_usd: Option<f64>,
    max_tokens: Option<i64>,
}

impl Validator {
    fn positive_count(&mut self, field: String, value: Option<i64>) -> Option<u64> {
        match value {
            None => None,
            Some(n) if n >= 0 => Some(n as u64),
            Some(n) => {
                self.problem(
                    field,
                    format!(
                        "{n} is negative; write a count such as 10 (or leave it out for no limit)"
                    ),
                );
                None
            }
        }
    }

    fn money(&mut self, field: String, value: Option<f64>) -> Option<f64> {
        match value {
            None => None,
            Some(x) if x.is_finite() && x >= 0.0 => Some(x),
            Some(x) => {
                self.problem(
                    field,
                    format!("{x} is not an amount of US dollars such as 5.0"),
                );
                None
            }
        }
    }

    /// A daily budget: `raw` over `base`, field by field.
    pub(super) fn budget(
        &mut self,
        field: &str,
        raw: Option<&RawBudget>,
        base: Option<Budget>,
    ) -> Budget {
        let base = base.unwrap_or_default();
        let Some(raw) = raw else {
            return base;
        };
        let f = |name: &str| format!("{field}.{name}");
        Budget {
            max_sessions: self
                .positive_count(f("max_sessions"), raw.max_sessions)
                .or(base.max_sessions),
            max_runtime: match &raw.max_runtime {
                Some(text) => Some(self.duration(&f("max_runtime"), Some(text), "0s")),
                None => base.max_runtime,
            },
            max_cost_usd: self
                .money(f("max_cost_usd"), raw.max_cost_usd)
                .or(base.max_cost_usd),
            max_tokens: self
                .positive_count(f("max_tokens"), raw.max_tokens)
                .or(base.max_tokens),
        }
    }

    pub(super) fn session_budget(
        &mut self,
        field: &str,
        raw: Option<&RawSessionBudget>,
        base: Option<SessionBudget>,
    ) -> SessionBudget {
        let base = base.unwrap_or_default();
        let Some(raw) = raw else {
            return base;
        };
        let f = |name: &str| format!("{field}.{name}");
        SessionBudget {
            max_cost_usd: self
                .money(f("max_cost_usd"), raw.max_cost_usd)
                .or(base.max_cost_usd),
            max_tokens: self
                .positive_count(f("max_tokens"), raw.max_tokens)
                .or(base.max_tokens),
        }
    }

    pub(super) fn budget_action(
        &mut self,
        field: &str,
        raw: Option<&str>,
        base: Option<BudgetAction>,
    ) -> BudgetAction {
        match raw {
            None => base.unwrap_or_default(),
            Some("stop") => BudgetAction::Stop,
            Some("finish") => BudgetAction::Finish,
            Some(other) => {
                self.problem(
                    field.to_string(),
                    format!("{other:?} is not an action; use \"stop\" or \"finish\""),
                );
                BudgetAction::Stop
            }
        }
    }

    pub(super) fn fleet_budget(&mut self, raw: &RawFleetBudget) -> FleetBudget {
        let timezone = match raw.timezone.as_deref() {
            None => Zone::UTC,
            Some(tz) => tz.parse::<Zone>().unwrap_or_else(|e| {
                self.problem(
                    "budget.timezone",
                    e.describe(tz, || {
                        format!(
                            "{tz:?} is not an IANA time zone name such as \"UTC\" or \"Europe/Lisbon\""
                        )
                    }),
                );
                Zone::UTC
            }),
        };
        let limits = self.budget(
            "budget",
            Some(&RawBudget {
                max_sessions: raw.max_sessions,
                max_runtime: raw.max_runtime.clone(),
                max_cost_usd: raw.max_cost_usd,
                max_tokens: raw.max_tokens,
            }),
            None,
        );
        FleetBudget { timezone, limits }
    }
}

/// Whether a scheduled wake starts a session (inbox and manual wakes always
/// do: they are work).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum WakeIf {
    #[default]
    Always,
    /// Messages waiting, or tasks pending or active.
    Work,
    /// This command exits 0 (run in the agent's directory with a short
    /// timeout, no prompt).
    Command(Vec<String>),
}

/// The credential every agent shares unless it names another.
pub const DEFAULT_CREDENTIAL: &str = "default";

/// `[credential.NAME]`: a login several agents share. A usage limit seen by
/// one holds them all; a failed check holds them all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialSettings {
    /// Checked on a timer and before scheduled wakes: exit 0 = usable
    /// (e.g. `["claude", "auth", "status", "--json"]`). `None`: no check.
    pub check: Option<Vec<String>>,
    pub check_every: Duration,
    /// An API key is billed by cost (`{max_budget_usd}` is filled);
    /// a subscription is not.
    pub api_key: bool,
}

impl Default for CredentialSettings {
    fn default() -> Self {
        CredentialSettings {
            check: None,
            check_every: Duration::from_secs(1800),
            api_key: false,
        }
    }
}

/// `[usage_limits]`, read here (`Validator::usage_limits`); the value is the
/// economy's own (crates/decide), which decides on it.
pub use crate::economy::UsageLimitSettings;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCredential {
    check: Option<Vec<String>>,
    check_every: Option<String>,
    kind: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUsageLimits {
    wait: Option<String>,
    max_wait: Option<String>,
    jitter: Option<String>,
}

/// `wake_if` as written: a word or a command.
#[derive(Deserialize, Clone, Debug)]
#[serde(untagged)]
pub(super) enum RawWakeIf {
    Word(String),
    Command(Vec<String>),
}

impl Validator {
    pub(super) fn wake_if(
        &mut self,
        field: &str,
        raw: Option<&RawWakeIf>,
        base: Option<&WakeIf>,
    ) -> WakeIf {
        match raw {
            None => base.cloned().unwrap_or_default(),
            Some(RawWakeIf::Word(w)) if w == "always" => WakeIf::Always,
            Some(RawWakeIf::Word(w)) if w == "work" => WakeIf::Work,
            Some(RawWakeIf::Command(cmd)) if !cmd.is_empty() && !cmd[0].is_empty() => {
                WakeIf::Command(cmd.clone())
            }
            Some(other) => {
                self.problem(
                    field.to_string(),
                    format!("{other:?} is not a condition; use \"always\", \"work\" or a command such as [\"/usr/local/bin/has-work\", \"{{agent}}\"]"),
                );
                WakeIf::Always
            }
        }
    }

    pub(super) fn credentials(
        &mut self,
        table: &toml::Table,
    ) -> BTreeMap<String, CredentialSettings> {
        let mut out = BTreeMap::new();
        let Some(value) = table.get("credential") else {
            return out;
        };
        let Some(groups) = value.as_table() else {
            self.problem(
                "credential",
                "must be tables: write [credential.NAME] (e.g. [credential.default])",
            );
            return out;
        };
        for (name, raw) in groups {
            let field = format!("credential.{name}");
            if !crate::config::valid_group(name) {
                self.problem(
                    field.clone(),
                    "a credential name is letters, digits, - and _ (e.g. \"default\", \"team-b\")",
                );
            }
            let raw: RawCredential = self.value(raw.clone(), &field);
            let check = match raw.check {
                Some(cmd) if cmd.is_empty() || cmd[0].is_empty() => {
                    self.problem(
                        format!("{field}.check"),
                        "must be a command, e.g. [\"claude\", \"auth\", \"status\", \"--json\"]",
                    );
                    None
                }
                other => other,
            };
            let check_every = self.duration(
                &format!("{field}.check_every"),
                raw.check_every.as_deref(),
                "30m",
            );
            if check_every < Duration::from_secs(10) {
                self.problem(
                    format!("{field}.check_every"),
                    "must be at least 10s, e.g. \"30m\"",
                );
            }
            let api_key = match raw.kind.as_deref() {
                None | Some("subscription") => false,
                Some("api_key") => true,
                Some(other) => {
                    self.problem(
                        format!("{field}.kind"),
                        format!("{other:?} is not a kind; use \"subscription\" or \"api_key\""),
                    );
                    false
                }
            };
            out.insert(
                name.clone(),
                CredentialSettings {
                    check,
                    check_every,
                    api_key,
                },
            );
        }
        out
    }

    pub(super) fn usage_limits(&mut self, raw: &RawUsageLimits) -> UsageLimitSettings {
        let wait = self.duration("usage_limits.wait", raw.wait.as_deref(), "30m");
        let max_wait = self.duration("usage_limits.max_wait", raw.max_wait.as_deref(), "4h");
        if wait < Duration::from_secs(10) {
            self.problem(
                "usage_limits.wait",
                "must be at least 10s (a probe session costs quota too; the default is 30m)",
            );
        }
        if max_wait < wait {
            self.problem(
                "usage_limits.max_wait",
                "must be at least usage_limits.wait",
            );
        }
        let jitter = self.duration("usage_limits.jitter", raw.jitter.as_deref(), "2m");
        if jitter > Duration::from_secs(3600) {
            self.problem("usage_limits.jitter", "must be at most 1h");
        }
        UsageLimitSettings {
            wait,
            max_wait,
            jitter,
        }
    }
}
