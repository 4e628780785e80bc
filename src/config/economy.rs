//! The economy's settings: daily budgets per agent (`budget`, in
//! `[defaults]` or an `[[agent]]`) and for the fleet (`[budget]`), the
//! per-session budget enforced while a session streams (`session_budget`,
//! `budget_action`). Read here, checked by `usage` (what was used) and the
//! daemon (before each wake, and as usage streams).

use std::time::Duration;

use chrono_tz::Tz;
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
    pub timezone: Tz,
    pub limits: Budget,
}

impl Default for FleetBudget {
    fn default() -> Self {
        FleetBudget {
            timezone: chrono_tz::UTC,
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
            None => chrono_tz::UTC,
            Some(tz) => tz.parse::<Tz>().unwrap_or_else(|_| {
                self.problem(
                    "budget.timezone",
                    format!(
                        "{tz:?} is not an IANA time zone name such as \"UTC\" or \"Europe/Lisbon\""
                    ),
                );
                chrono_tz::UTC
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
