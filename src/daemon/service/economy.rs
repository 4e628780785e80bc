//! The economy in the loop: before a wake, the credential's hold (a usage
//! limit, an admin's cap, a failed login check), the budgets of the day and
//! `wake_if`; after a session, the usage limit its output shows. The
//! decisions are `daemon::economy`'s and `usage`'s; this is the IO around
//! them: reading today's use, the journal lines, the notices, and
//! `.daemon/economy.json`, which keeps the holds across a restart.

use super::*;

use crate::config::{DEFAULT_CREDENTIAL, WakeIf};
use crate::daemon::economy::{self as decide, Cause, Gate, Holds};
use crate::protocol::limits::{self, Limit, LimitKind};
use crate::state::journal::UsageLimitHit;
use crate::usage::{self, DayUse};

/// What the economy keeps between events.
#[derive(Default)]
pub(super) struct Economy {
    pub(super) holds: Holds,
    /// Budgets already reported today (`scope@date`): once a day each.
    told: std::collections::BTreeSet<String>,
    /// Today's use per agent, with the journal's size and mtime it was read at.
    today: BTreeMap<AgentName, Today>,
    /// Wakes already said to be held (agent, hold reason): said once.
    said_held: std::collections::BTreeSet<(AgentName, String)>,
}

/// One agent's use on one day, and the journal's (size, mtime) it was read at.
type Today = (chrono::NaiveDate, (i64, i64, i64), DayUse);

/// The file that keeps the holds and the day's notices across restarts.
#[derive(Default, Serialize, Deserialize)]
struct Saved {
    #[serde(default)]
    holds: Holds,
    #[serde(default)]
    told: std::collections::BTreeSet<String>,
}

use serde::{Deserialize, Serialize};

fn saved_path(root: &crate::state::StateRoot) -> PathBuf {
    root.daemon_dir().join("economy.json")
}

/// A stable seed for an agent's jitter (std's hasher is randomly seeded).
fn seed(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl Daemon {
    /// Read `.daemon/economy.json` (at start): holds survive a restart.
    pub(super) fn load_economy(&mut self) {
        let path = saved_path(&self.root);
        match crate::state::atomic::read_json::<Saved>(&path) {
            Ok(Some(saved)) => {
                for (group, hold) in &saved.holds.groups {
                    tracing::info!(
                        "credential {group}: {} (kept across the restart)",
                        hold.reason
                    );
                }
                self.economy.holds = saved.holds;
                self.economy.told = saved.told;
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(
                "cannot read {}: {e}; starting with no holds",
                path.display()
            ),
        }
    }

    fn save_economy(&self) {
        let saved = Saved {
            holds: self.economy.holds.clone(),
            told: self.economy.told.clone(),
        };
        if let Err(e) = crate::state::atomic::write_json(&saved_path(&self.root), &saved) {
            tracing::warn!("cannot save the usage-limit holds: {e}");
        }
    }

    /// Today's use of `agent`, in the budget's time zone: read from its
    /// journal again only when the journal changed.
    fn used_today(&mut self, agent: &AgentName) -> DayUse {
        let tz = self.config.budget.timezone;
        let now = Timestamp::from_datetime(self.clock.now());
        let day = usage::day_of(now, tz);
        let journal = self.dir(agent).journal();
        let stamp = match crate::fsx::metadata(&journal) {
            Ok(Some(st)) => (st.st_size, st.st_mtime, st.st_mtime_nsec),
            _ => (0, 0, 0),
        };
        if let Some((d, s, used)) = self.economy.today.get(agent)
            && *d == day
            && *s == stamp
        {
            return *used;
        }
        let since = now.minus(Duration::from_secs(2 * 86_400));
        let used = usage::read(&journal, since)
            .map(|sessions| {
                usage::by_day(&sessions, tz)
                    .get(&day)
                    .copied()
                    .unwrap_or_default()
            })
            .unwrap_or_default();
        self.economy.today.insert(agent.clone(), (day, stamp, used));
        used
    }

    /// May `agent` start a session for `reason` now? If not, the wake is
    /// deferred (a hold, an exhausted budget for mail) or skipped (a
    /// scheduled wake over budget or with no work), journaled, and said.
    pub(super) fn economy_allows(
        &mut self,
        agent: &AgentName,
        cfg: &AgentConfig,
        reason: WakeReason,
    ) -> bool {
        let now = self.clock.now();
        let group = cfg.session.credential.clone();
        match self.economy.holds.gate(&group, agent, now) {
            Gate::Open => {}
            Gate::Probe => {
                self.save_economy();
                tracing::info!(agent = %agent, "credential {group}: this session is the probe of whether the usage limit has reset");
            }
            Gate::Held { until, reason: why } => {
                if self.economy.said_held.insert((agent.clone(), why.clone())) {
                    self.publish_held(agent, cfg);
                    tracing::info!(agent = %agent, "{} wake held: {why}", reason.as_str());
                    self.journal(
                        agent,
                        Event::WakeSkipped(WakeSkipped {
                            reason: reason.as_str().to_string(),
                            cause: Some("usage_limit".into()),
                            detail: Some(why),
                            ..Default::default()
                        }),
                    );
                }
                let delay = until
                    .map(|t| decide::until(t, now))
                    .unwrap_or(self.config.health.interval)
                    .max(Duration::from_secs(1));
                self.defer_wake(agent, reason, delay);
                return false;
            }
        }
        let scheduled = matches!(reason, WakeReason::Schedule | WakeReason::CatchUp);
        if scheduled && cfg.session.wake_if == WakeIf::Work {
            let dir = self.dir(agent);
            let waiting = self.tally.waiting.get(agent).copied().unwrap_or(0);
            let open = dir
                .read::<crate::state::tasks::TaskFile>()
                .ok()
                .flatten()
                .map_or(0, |t| t.open_tasks().count());
            if !decide::has_work(waiting, open) {
                self.skip_wake(
                    agent,
                    reason,
                    "no_work",
                    "wake_if = \"work\": no message waiting and no task open".into(),
                );
                return false;
            }
        }
        if let Some((scope, exceeded)) = self.over_budget(agent, cfg) {
            let detail = format!("{scope}'s daily budget: {exceeded}");
            let day = usage::day_of(Timestamp::from_datetime(now), self.config.budget.timezone);
            if self.economy.told.insert(format!("{scope}@{day}")) {
                self.save_economy();
                let record = ErrorRecord::new(
                    Code::BudgetExhausted,
                    format!(
                        "{agent}: wake skipped: {detail}; no session until the budget's day ends"
                    ),
                )
                .agent(agent);
                // Once a day per scope, to the human mailbox too.
                *self
                    .tally
                    .errors
                    .entry((record.code.clone(), record.severity.to_string()))
                    .or_default() += 1;
                self.alerts.raise(record, true);
            }
            if scheduled {
                self.skip_wake(agent, reason, "budget", detail);
            } else {
                // Mail and manual wakes wait for the next day.
                let next = decide::next_day_start(now, self.config.budget.timezone);
                if self
                    .economy
                    .said_held
                    .insert((agent.clone(), detail.clone()))
                {
                    tracing::info!(agent = %agent, "{} wake waits for the next budget day: {detail}", reason.as_str());
                    self.journal(
                        agent,
                        Event::WakeSkipped(WakeSkipped {
                            reason: reason.as_str().to_string(),
                            cause: Some("budget".into()),
                            detail: Some(detail),
                            ..Default::default()
                        }),
                    );
                }
                self.defer_wake(
                    agent,
                    reason,
                    decide::until(next, now).max(Duration::from_secs(1)),
                );
            }
            return false;
        }
        true
    }

    /// A wake not started, journaled with its cause.
    fn skip_wake(&mut self, agent: &AgentName, reason: WakeReason, cause: &str, detail: String) {
        tracing::info!(agent = %agent, "{} wake skipped: {detail}", reason.as_str());
        *self
            .tally
            .skips
            .entry((agent.clone(), cause.to_string()))
            .or_default() += 1;
        self.journal(
            agent,
            Event::WakeSkipped(WakeSkipped {
                reason: reason.as_str().to_string(),
                cause: Some(cause.to_string()),
                detail: Some(detail),
                ..Default::default()
            }),
        );
        self.core
            .session_ended(agent, InboxSummary::default(), self.clock.now());
    }

    /// The first budget `agent`'s wake would go over: its own, else the
    /// fleet's (`"fleet"`).
    fn over_budget(
        &mut self,
        agent: &AgentName,
        cfg: &AgentConfig,
    ) -> Option<(String, usage::Exceeded)> {
        let own = cfg.session.budget;
        if !own.is_unlimited() {
            let used = self.used_today(agent);
            if let Some(e) = own.first_exceeded(&used) {
                return Some((agent.to_string(), e));
            }
        }
        let fleet = self.config.budget.limits;
        if !fleet.is_unlimited() {
            let agents: Vec<AgentName> = self
                .config
                .working_agents()
                .map(|a| a.name.clone())
                .collect();
            let mut total = DayUse::default();
            for a in &agents {
                total.add(&self.used_today(a));
            }
            if let Some(e) = fleet.first_exceeded(&total) {
                return Some(("fleet".to_string(), e));
            }
        }
        None
    }

    /// The usage limit an ended session's output shows, if it did not
    /// succeed (a successful session may quote one in its answer).
    pub(super) fn limit_in(
        &self,
        report: &RunReport,
        output: &OutputSummary,
        failed: bool,
    ) -> Option<Limit> {
        if report.ending.is_success() && !failed {
            return None;
        }
        limits::scan_output(
            output.tail.as_bytes(),
            &output.stderr_tail,
            self.clock.now(),
        )
    }

    /// A session hit `limit`: hold its credential group, journal it, say it
    /// once per hold, and run the session again when the hold ends. Returns
    /// the verdict for the session's record (not a failure: no streak).
    pub(super) fn usage_limit_hit(
        &mut self,
        agent: &AgentName,
        cfg: Option<&AgentConfig>,
        session_id: &str,
        limit: &Limit,
    ) -> failure::Verdict {
        let now = self.clock.now();
        let group = cfg.map_or(DEFAULT_CREDENTIAL.to_string(), |c| {
            c.session.credential.clone()
        });
        let (fresh, hold) = self.economy.holds.limit_seen(
            &group,
            limit,
            now,
            &self.config.usage_limits,
            seed(&format!("{group}/{agent}")),
        );
        self.save_economy();
        let kind = match limit.kind {
            LimitKind::UsageLimit => "usage_limit",
            LimitKind::ExtraUsageExhausted => "extra_usage_exhausted",
            LimitKind::ApiRateLimit => "api_rate_limit",
            LimitKind::AdminDisabled => "admin_disabled",
        };
        self.journal(
            agent,
            Event::UsageLimit(UsageLimitHit {
                session_id: session_id.to_string(),
                kind: kind.to_string(),
                credential: group.clone(),
                window: limit.window.clone(),
                resets_at: limit.resets_at.map(Timestamp::from_datetime),
                hold_until: hold.until,
                evidence: limit.evidence.clone(),
                note: limit.note.clone(),
            }),
        );
        let code = if hold.cause == Cause::Disabled {
            Code::UsageDisabled
        } else {
            Code::UsageLimit
        };
        let message = format!(
            "credential {group}: {} ({kind}, seen by {agent})",
            hold.reason
        );
        if fresh {
            let mut record = ErrorRecord::new(code, message.clone())
                .agent(agent)
                .session(session_id.to_string())
                .details(limit.evidence.clone());
            if let Some(note) = &limit.note {
                record = record.details(format!("{}; {note}", limit.evidence));
            }
            self.raise(record, code == Code::UsageDisabled);
        } else {
            tracing::info!(agent = %agent, "{message}");
        }
        failure::Verdict {
            code: Some(code),
            message: hold.reason.clone(),
            attempt: 1,
            next: Next::Nothing,
            escalate: false,
        }
    }

    /// After a usage limit: the session runs again when its group's hold
    /// ends (a timed hold), or when something clears it.
    pub(super) fn after_usage_limit(&mut self, agent: &AgentName, cfg: &AgentConfig) {
        let now = self.clock.now();
        let until = self
            .economy
            .holds
            .groups
            .get(&cfg.session.credential)
            .and_then(|h| h.until)
            .map(|t| decide::until(t.0, now))
            .unwrap_or(self.config.health.interval);
        self.defer_wake(agent, WakeReason::Retry, until.max(Duration::from_secs(1)));
        self.publish_held(agent, cfg);
    }

    /// A session ended without a limit: a success (or the probe's end)
    /// lifts its group's hold.
    pub(super) fn economy_session_ended(
        &mut self,
        agent: &AgentName,
        cfg: Option<&AgentConfig>,
        succeeded: bool,
    ) {
        let Some(cfg) = cfg else { return };
        if let Some(hold) =
            self.economy
                .holds
                .session_ended(&cfg.session.credential, agent, succeeded)
        {
            tracing::info!(agent = %agent, "credential {}: the hold is over ({}: {})", cfg.session.credential, if succeeded { "a session succeeded" } else { "the probe ended" }, hold.reason);
            self.economy.said_held.clear();
            self.save_economy();
        }
        self.economy.today.remove(agent);
    }

    /// report.json `error` of a held agent (status shows it): the hold's
    /// reason, `held`, and until when.
    fn publish_held(&mut self, agent: &AgentName, cfg: &AgentConfig) {
        let Some(hold) = self
            .economy
            .holds
            .groups
            .get(&cfg.session.credential)
            .cloned()
        else {
            return;
        };
        let code = if hold.cause == Cause::UsageLimit {
            Code::UsageLimit
        } else if hold.cause == Cause::Disabled {
            Code::UsageDisabled
        } else {
            Code::CredentialFailed
        };
        let error = ReportError {
            code: code.as_str().to_string(),
            message: hold.reason,
            failures: 0,
            state: "held".into(),
            until: hold.until,
            since: Some(hold.since),
        };
        self.publish_agent(agent, Some(error));
    }
}
