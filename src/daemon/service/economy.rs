//! The economy in the loop: before a wake, the credential's hold (a usage
//! limit, an admin's cap, a failed login check), the budgets of the day and
//! `wake_if`; after a session, the usage limit its output shows. The
//! decisions are `daemon::economy`'s and `usage`'s; this is the IO around
//! them: reading today's use, the journal lines, the notices, and
//! `.daemon/economy.json`, which keeps the holds across a restart.

use super::*;

use crate::config::{BudgetAction, DEFAULT_CREDENTIAL, WakeIf};
use crate::daemon::economy::{self as decide, Cause, Gate, Holds};
use crate::protocol::limits::{self, Limit, LimitKind};
use crate::state::journal::{SkipCause, UsageLimitHit};
use crate::usage::{self, DayUse};

/// What the economy keeps between events.
#[derive(Default)]
pub(super) struct Economy {
    pub(super) holds: Holds,
    /// Budgets already reported today (`scope@date`): once a day each.
    told: std::collections::BTreeSet<String>,
    /// Today's use per agent, with the journal's size and mtime it was read at.
    today: BTreeMap<AgentName, Today>,
    /// Wakes already said to be held (agent, hold reason): said once, and
    /// once more for each later manual wake (see `manual_refusals`).
    said_held: std::collections::BTreeSet<(AgentName, String)>,
    /// Manual wakes refused and journaled since the agent's last session:
    /// a new manual wake is answered again while these are few
    /// ([`MANUAL_REFUSALS_SAID`]), so a flood of wake requests cannot
    /// flood the journal.
    pub(super) manual_refusals: BTreeMap<AgentName, u32>,
    /// Credential checks: when each is next due, which are running, and
    /// when each last passed.
    next_check: BTreeMap<String, DateTime<Utc>>,
    checking: std::collections::BTreeSet<String>,
    checked_ok: BTreeMap<String, DateTime<Utc>>,
    /// `wake_if` commands running, and their answers (taken by the wake).
    pub(super) conditions_running: std::collections::BTreeSet<AgentName>,
    pub(super) condition_result: BTreeMap<AgentName, Answer>,
}

/// A `wake_if` command's answer, and when it came.
type Answer = (
    DateTime<Utc>,
    std::result::Result<(), crate::daemon::credential::CheckError>,
);

/// Refused manual wakes journaled per agent between two of its sessions.
pub(super) const MANUAL_REFUSALS_SAID: u32 = 10;

/// A `wake_if` command's answer counts for this long.
const CONDITION_FRESH: Duration = Duration::from_secs(60);

/// A check older than this is run again before a scheduled wake.
const CHECK_FRESH: Duration = Duration::from_secs(600);
/// A failing credential is checked again at least this often.
const CHECK_WHILE_FAILING: Duration = Duration::from_secs(300);

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
    files::economy_path(root)
}

/// A stable seed for an agent's jitter (std's hasher is randomly seeded).
fn seed(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl Economy {
    /// Run credential `group`'s login check off the loop:
    /// [`Event::CredentialChecked`] comes back on `tx`.
    pub(super) fn start_check(
        &mut self,
        config: &Config,
        root: &StateRoot,
        tx: &mpsc::UnboundedSender<Event>,
        group: &str,
    ) {
        let Some(command) = check_of(config, group) else {
            return;
        };
        self.checking.insert(group.to_string());
        let tx = tx.clone();
        let dir = root.path.clone();
        let group = group.to_string();
        tokio::spawn(async move {
            let result = crate::daemon::credential::check(
                &command,
                &dir,
                crate::daemon::credential::CHECK_TIMEOUT,
            )
            .await;
            let _ = tx.send(Event::CredentialChecked { group, result });
        });
    }
    /// A session hit `limit`: hold its credential group, journal it, say it
    /// once per hold, and run the session again when the hold ends. Returns
    /// the verdict for the session's record (not a failure: no streak).
    /// (Returns the verdict, and the record to raise with whether to
    /// escalate it: a fresh hold only.)
    pub(super) fn usage_limit_hit(
        &mut self,
        root: &StateRoot,
        config: &Config,
        now: DateTime<Utc>,
        hit: LimitHit,
    ) -> (failure::Verdict, Option<(ErrorRecord, bool)>) {
        let LimitHit {
            agent,
            group,
            session_id,
            limit,
        } = hit;
        let (fresh, hold) = self.holds.limit_seen(
            group,
            limit,
            now,
            &config.usage_limits,
            seed(&format!("{group}/{agent}")),
        );
        self.save(root);
        let kind = match limit.kind {
            LimitKind::UsageLimit => "usage_limit",
            LimitKind::ExtraUsageExhausted => "extra_usage_exhausted",
            LimitKind::ApiRateLimit => "api_rate_limit",
            LimitKind::AdminDisabled => "admin_disabled",
        };
        publish::journal(
            root,
            agent,
            journal::Event::UsageLimit(UsageLimitHit {
                session_id: session_id.to_string(),
                kind: kind.to_string(),
                credential: group.to_string(),
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
        let mut raise = None;
        if fresh {
            let mut record = ErrorRecord::new(code, message.clone())
                .agent(agent)
                .session(session_id.to_string())
                .details(limit.evidence.clone());
            if let Some(note) = &limit.note {
                record = record.details(format!("{}; {note}", limit.evidence));
            }
            raise = Some((record, code == Code::UsageDisabled));
        } else {
            tracing::info!(agent = %agent, "{message}");
        }
        let verdict = failure::Verdict {
            code: Some(code),
            message: hold.reason.clone(),
            attempt: 1,
            next: Next::Nothing,
            escalate: false,
        };
        (verdict, raise)
    }

    /// Read `.daemon/economy.json` (at start): holds survive a restart.
    pub(super) fn load(&mut self, root: &StateRoot) {
        let path = saved_path(root);
        match crate::state::atomic::read_json::<Saved>(&path) {
            Ok(Some(saved)) => {
                for (group, hold) in &saved.holds.groups {
                    tracing::info!(
                        "credential {group}: {} (kept across the restart)",
                        hold.reason
                    );
                }
                self.holds = saved.holds;
                self.told = saved.told;
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(
                "cannot read {}: {e}; starting with no holds",
                path.display()
            ),
        }
    }

    /// Write `.daemon/economy.json`: the holds and the day's notices.
    fn save(&self, root: &StateRoot) {
        let saved = Saved {
            holds: self.holds.clone(),
            told: self.told.clone(),
        };
        if let Err(e) = crate::state::atomic::write_json(&root.store, &saved_path(root), &saved) {
            tracing::warn!("cannot save the usage-limit holds: {e}");
        }
    }

    /// Today's use of the agent of `dir`, in the budget's time zone `tz`:
    /// read from its journal again only when the journal changed.
    pub(super) fn used_today(
        &mut self,
        dir: &AgentDir,
        tz: crate::zone::Zone,
        now: DateTime<Utc>,
    ) -> DayUse {
        let now = Timestamp::from_datetime(now);
        let day = usage::day_of(now, tz);
        let journal = dir.journal();
        let stamp = match crate::fsx::metadata(&journal) {
            Ok(Some(st)) => (st.st_size, st.st_mtime, st.st_mtime_nsec),
            _ => (0, 0, 0),
        };
        if let Some((d, s, used)) = self.today.get(&dir.name)
            && *d == day
            && *s == stamp
        {
            return *used;
        }
        let since = now.minus(Duration::from_secs(2 * 86_400));
        let used = usage::read(&dir.store, &journal, since)
            .map(|sessions| {
                usage::by_day(&sessions, tz)
                    .get(&day)
                    .copied()
                    .unwrap_or_default()
            })
            .unwrap_or_default();
        self.today.insert(dir.name.clone(), (day, stamp, used));
        used
    }

    /// The first budget `agent`'s wake would go over: its own, else the
    /// fleet's (`"fleet"`).
    fn over_budget(
        &mut self,
        root: &StateRoot,
        config: &Config,
        agent: &AgentName,
        cfg: &AgentConfig,
        now: DateTime<Utc>,
    ) -> Option<(String, usage::Exceeded)> {
        let tz = config.budget.timezone;
        let own = cfg.session.budget;
        if !own.is_unlimited() {
            let used = self.used_today(&root.agent(agent), tz, now);
            if let Some(e) = own.first_exceeded(&used) {
                return Some((agent.to_string(), e));
            }
        }
        let fleet = config.budget.limits;
        if !fleet.is_unlimited() {
            let mut total = DayUse::default();
            for a in config.working_agents() {
                total.add(&self.used_today(&root.agent(&a.name), tz, now));
            }
            if let Some(e) = fleet.first_exceeded(&total) {
                return Some(("fleet".to_string(), e));
            }
        }
        None
    }

    /// A new manual wake of `agent`: if it is refused again, say so again
    /// (`wake --wait` reads the journal line as its answer), a few times.
    pub(super) fn manual_wake_requested(&mut self, agent: &AgentName) {
        let said = self.manual_refusals.get(agent).copied().unwrap_or(0);
        if said < MANUAL_REFUSALS_SAID {
            self.said_held.retain(|(a, _)| a != agent);
        }
    }

    /// A session ended without a limit: a success (or the probe's end)
    /// lifts its group's hold. Returns the group released, if one was.
    pub(super) fn session_ended(
        &mut self,
        agent: &AgentName,
        cfg: &AgentConfig,
        succeeded: bool,
    ) -> Option<String> {
        let group = &cfg.session.credential;
        let released = self.holds.session_ended(group, agent, succeeded);
        self.today.remove(agent);
        let hold = released?;
        tracing::info!(agent = %agent, "credential {group}: the hold is over ({}: {})", if succeeded { "a session succeeded" } else { "the probe ended" }, hold.reason);
        Some(group.clone())
    }

    /// The requests of `agent-state credential release` waiting in
    /// `.daemon/`: each hold ends (saved), and the request is removed once
    /// the release is saved (a crash before that carries it out again:
    /// releasing twice is releasing once). Returns the groups released.
    pub(super) fn release_requests(&mut self, root: &StateRoot, config: &Config) -> Vec<String> {
        let pending = match crate::daemon::release::pending(root) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("cannot read the credential release requests: {e}");
                return Vec::new();
            }
        };
        let known = crate::daemon::release::known(config);
        let mut released = Vec::new();
        for group in pending {
            if !known.contains(&group) {
                tracing::warn!(
                    "credential {group}: a release was asked for a credential the config does not name (known: {}); request dropped",
                    known.join(", ")
                );
            } else if let Some(hold) = self.holds.release(&group) {
                tracing::info!(
                    "credential {group}: released by `agent-state credential release`; its agents' held wakes go now (was: {})",
                    hold.reason
                );
                // Saved before the request is removed.
                self.save(root);
                released.push(group.clone());
            } else {
                tracing::info!("credential {group}: a release was asked, but it is not held");
            }
            if let Err(e) = crate::daemon::release::done(root, &group) {
                tracing::warn!("credential {group}: cannot remove the release request: {e}");
            }
        }
        released
    }

    /// The credential checks due now (on the loop's credential timer).
    pub(super) fn checks_due(&self, config: &Config, now: DateTime<Utc>) -> Vec<String> {
        config
            .credentials
            .iter()
            .filter(|(g, c)| {
                c.check.is_some()
                    && !self.checking.contains(*g)
                    && self.next_check.get(*g).is_none_or(|t| *t <= now)
            })
            .map(|(g, _)| g.clone())
            .collect()
    }

    /// A check came back: a pass lifts a credential hold, a failure holds
    /// the group (escalated once, with the runbook) until one passes.
    pub(super) fn checked(
        &mut self,
        root: &StateRoot,
        config: &Config,
        group: &str,
        result: std::result::Result<(), crate::daemon::credential::CheckError>,
        now: DateTime<Utc>,
    ) -> Checked {
        self.checking.remove(group);
        let every = config
            .credentials
            .get(group)
            .map_or(CHECK_WHILE_FAILING, |c| c.check_every);
        match result {
            Ok(()) => {
                self.checked_ok.insert(group.to_string(), now);
                self.next_check
                    .insert(group.to_string(), crate::clock::later(now, every));
                match self.holds.credential_ok(group) {
                    Some(hold) => {
                        tracing::info!(
                            "credential {group}: its check passes again; its agents are released ({})",
                            hold.reason
                        );
                        Checked::Released
                    }
                    None => Checked::Nothing,
                }
            }
            Err(why) => {
                self.checked_ok.remove(group);
                let again = every.min(CHECK_WHILE_FAILING);
                self.next_check
                    .insert(group.to_string(), crate::clock::later(now, again));
                if self
                    .holds
                    .credential_failed(group, &why.to_string(), now, None)
                {
                    self.save(root);
                    let record = ErrorRecord::new(
                        why.code(),
                        format!("credential {group}: its check failed ({why}); its agents are held until it passes"),
                    )
                    .details(format!(
                        "checked again every {}",
                        humantime::format_duration(again)
                    ));
                    Checked::Held(Box::new(record))
                } else {
                    tracing::info!("credential {group}: the check still fails: {why}");
                    Checked::Nothing
                }
            }
        }
    }

    /// A session found its credential logged out: hold the group like a
    /// failed check, or, without a check, until one session tries again
    /// after `[usage_limits] wait`. Returns the group to check now, if it
    /// has a check not running yet.
    pub(super) fn login_failed(
        &mut self,
        root: &StateRoot,
        config: &Config,
        agent: &AgentName,
        cfg: &AgentConfig,
        now: DateTime<Utc>,
    ) -> Option<String> {
        let group = cfg.session.credential.clone();
        let has_check = check_of(config, &group).is_some();
        let retry_at = (!has_check).then(|| crate::clock::later(now, config.usage_limits.wait));
        let why = format!("a session of {agent} found Claude Code logged out");
        if self.holds.credential_failed(&group, &why, now, retry_at) {
            self.save(root);
            tracing::warn!(agent = %agent, "credential {group}: {why}; its agents are held");
        }
        if has_check && !self.checking.contains(&group) {
            self.checked_ok.remove(&group);
            return Some(group);
        }
        None
    }

    /// report.json `error` of an agent held by its credential (status
    /// shows it): the hold's reason, `held`, and until when.
    fn held_error(&self, cfg: &AgentConfig) -> Option<ReportError> {
        let hold = self.holds.groups.get(&cfg.session.credential)?.clone();
        let code = if hold.cause == Cause::UsageLimit {
            Code::UsageLimit
        } else if hold.cause == Cause::Disabled {
            Code::UsageDisabled
        } else {
            Code::CredentialFailed
        };
        Some(ReportError {
            code: code.as_str().to_string(),
            message: hold.reason,
            failures: 0,
            state: crate::state::report::ErrorState::Held,
            until: hold.until,
            since: Some(hold.since),
        })
    }
}

/// What a credential check's answer asks of the daemon.
pub(super) enum Checked {
    Nothing,
    /// The group's hold ended: its held wakes go now.
    Released,
    /// The group is held from now on: the record to raise (escalated).
    Held(Box<ErrorRecord>),
}

/// A session of `agent` (of credential `group`) hit `limit`.
pub(super) struct LimitHit<'a> {
    pub(super) agent: &'a AgentName,
    pub(super) group: &'a str,
    pub(super) session_id: &'a str,
    pub(super) limit: &'a Limit,
}

/// The credential group of an agent (the default one for an agent no
/// longer configured).
pub(super) fn group_of(cfg: Option<&AgentConfig>) -> String {
    cfg.map_or(DEFAULT_CREDENTIAL.to_string(), |c| {
        c.session.credential.clone()
    })
}

/// The login check of credential `group`, if it has one.
fn check_of(config: &Config, group: &str) -> Option<Vec<String>> {
    config.credentials.get(group).and_then(|c| c.check.clone())
}

/// Does any credential have a login check (the loop's credential timer)?
pub(super) fn has_credential_checks(config: &Config) -> bool {
    config.credentials.values().any(|c| c.check.is_some())
}

/// The usage limit an ended session's output shows, if it did not
/// succeed (a successful session may quote one in its answer).
pub(super) fn limit_in(
    report: &RunReport,
    output: &OutputSummary,
    failed: bool,
    now: DateTime<Utc>,
) -> Option<Limit> {
    if report.ending.is_success() && !failed {
        return None;
    }
    limits::scan_output(output.tail.as_bytes(), &output.stderr_tail, now)
}

/// A running session's streamed usage reached its session budget: stop it
/// (`budget_action = "stop"`, recorded as an error naming the budget) or
/// let it finish, said once.
pub(super) fn session_over_budget(
    running: Option<&mut Running>,
    agent: &AgentName,
    cfg: &AgentConfig,
    tokens: u64,
) {
    let limit = cfg.session.session_budget.max_tokens.unwrap_or(0);
    let why = format!("its session_budget is spent: max_tokens reached: {tokens} of {limit}");
    match cfg.session.budget_action {
        BudgetAction::Stop => {
            if let Some(r) = running {
                tracing::warn!(agent = %agent, session_id = %r.session_id, "stopping the session: {why}");
                r.stop_for(format!("the daemon stopped the session: {why}"));
            }
        }
        BudgetAction::Finish => {
            tracing::warn!(agent = %agent, "{why}; it may finish (budget_action = \"finish\")");
        }
    }
}

impl Daemon {
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
                self.economy.save(&self.root);
                tracing::info!(agent = %agent, "credential {group}: this session is the probe of whether the usage limit has reset");
            }
            Gate::Held { reason: why, .. } if reason == WakeReason::Manual => {
                tracing::info!(agent = %agent, "manual wake runs despite the hold: {why}");
            }
            Gate::Held { until, reason: why } => {
                if self.economy.said_held.insert((agent.clone(), why.clone())) {
                    if let Some(error) = self.economy.held_error(cfg) {
                        self.published.publish_agent(
                            &self.root,
                            &self.core,
                            self.clock.now(),
                            agent,
                            Some(error),
                        );
                    }
                    tracing::info!(agent = %agent, "{} wake held: {why}", reason.as_str());
                    let cause = match self.economy.holds.groups.get(&group).map(|h| h.cause) {
                        Some(Cause::Credential) => SkipCause::Credential,
                        _ => SkipCause::UsageLimit,
                    };
                    publish::journal(
                        &self.root,
                        agent,
                        journal::Event::WakeSkipped(WakeSkipped {
                            reason: reason.as_str().to_string(),
                            cause: Some(cause),
                            detail: Some(why),
                            until: until.map(Timestamp::from_datetime),
                            ..Default::default()
                        }),
                    );
                }
                let delay = until
                    .map(|t| decide::until(t, now))
                    .unwrap_or(self.config.health.interval)
                    .max(Duration::from_secs(1));
                self.core.defer(self.clock.now(), agent, reason, delay);
                return false;
            }
        }
        let scheduled = matches!(reason, WakeReason::Schedule | WakeReason::CatchUp);
        // A scheduled wake of a checked credential: the check first, if the
        // last one is not fresh (the wake is tried again in a moment).
        if scheduled
            && check_of(&self.config, &group).is_some()
            && self
                .economy
                .checked_ok
                .get(&group)
                .is_none_or(|t| decide::until(now, *t) > CHECK_FRESH)
        {
            if !self.economy.checking.contains(&group) {
                self.economy
                    .start_check(&self.config, &self.root, &self.tx, &group);
            }
            self.core
                .defer(self.clock.now(), agent, reason, Duration::from_secs(2));
            return false;
        }
        if scheduled && cfg.session.wake_if == WakeIf::Work {
            let dir = self.root.agent(agent);
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
                    SkipCause::NoWork,
                    "wake_if = \"work\": no message waiting and no task open".into(),
                );
                return false;
            }
        }
        if scheduled && let WakeIf::Command(command) = &cfg.session.wake_if {
            match self.economy.condition_result.remove(agent) {
                Some((at, answer)) if decide::until(now, at) <= CONDITION_FRESH => {
                    if let Err(why) = answer {
                        self.skip_wake(
                            agent,
                            reason,
                            SkipCause::NoWork,
                            format!("wake_if command: {why}"),
                        );
                        return false;
                    }
                }
                _ => {
                    if self.economy.conditions_running.insert(agent.clone()) {
                        let command: Vec<String> = command
                            .iter()
                            .map(|a| a.replace("{agent}", agent.as_str()))
                            .collect();
                        let tx = self.tx.clone();
                        let dir = self.root.agent(agent).path;
                        let name = agent.clone();
                        tokio::spawn(async move {
                            let result = crate::daemon::credential::condition(
                                &command,
                                &dir,
                                crate::daemon::credential::CHECK_TIMEOUT,
                            )
                            .await;
                            let _ = tx.send(Event::WakeCondition {
                                agent: name,
                                result,
                            });
                        });
                    }
                    self.core
                        .defer(self.clock.now(), agent, reason, Duration::from_secs(1));
                    return false;
                }
            }
        }
        let over = self
            .economy
            .over_budget(&self.root, &self.config, agent, cfg, now);
        if let Some((scope, exceeded)) = over {
            let detail = format!("{scope}'s daily budget: {exceeded}");
            let day = usage::day_of(Timestamp::from_datetime(now), self.config.budget.timezone);
            if self.economy.told.insert(format!("{scope}@{day}")) {
                self.economy.save(&self.root);
                let mut record = ErrorRecord::new(
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
                record.stamp(Timestamp::from_datetime(now));
                self.alerts.raise(record, true);
            }
            if scheduled {
                self.skip_wake(agent, reason, SkipCause::Budget, detail);
            } else {
                // Mail and manual wakes wait for the next day.
                let next = decide::next_day_start(now, self.config.budget.timezone);
                if self
                    .economy
                    .said_held
                    .insert((agent.clone(), detail.clone()))
                {
                    tracing::info!(agent = %agent, "{} wake waits for the next budget day: {detail}", reason.as_str());
                    if reason == WakeReason::Manual {
                        // `wake --wait` reads this line as its answer:
                        // said again for a later request (a few times).
                        *self
                            .economy
                            .manual_refusals
                            .entry(agent.clone())
                            .or_default() += 1;
                    }
                    publish::journal(
                        &self.root,
                        agent,
                        journal::Event::WakeSkipped(WakeSkipped {
                            reason: reason.as_str().to_string(),
                            cause: Some(SkipCause::Budget),
                            detail: Some(detail),
                            until: Some(Timestamp::from_datetime(next)),
                            ..Default::default()
                        }),
                    );
                }
                self.core.defer(
                    self.clock.now(),
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
    fn skip_wake(
        &mut self,
        agent: &AgentName,
        reason: WakeReason,
        cause: SkipCause,
        detail: String,
    ) {
        tracing::info!(agent = %agent, "{} wake skipped: {detail}", reason.as_str());
        *self
            .tally
            .skips
            .entry((agent.clone(), cause.as_str().to_string()))
            .or_default() += 1;
        publish::journal(
            &self.root,
            agent,
            journal::Event::WakeSkipped(WakeSkipped {
                reason: reason.as_str().to_string(),
                cause: Some(cause),
                detail: Some(detail),
                ..Default::default()
            }),
        );
        self.core
            .session_ended(agent, InboxSummary::default(), self.clock.now());
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
        self.core.defer(
            self.clock.now(),
            agent,
            WakeReason::Retry,
            until.max(Duration::from_secs(1)),
        );
        if let Some(error) = self.economy.held_error(cfg) {
            self.published.publish_agent(
                &self.root,
                &self.core,
                self.clock.now(),
                agent,
                Some(error),
            );
        }
    }

    /// `group`'s hold ended: its held wakes go now (not at their deferral's
    /// end), and report.json no longer says they are held.
    pub(super) fn released(&mut self, group: &str) {
        self.economy.save(&self.root);
        let now = self.clock.now();
        let held: Vec<AgentName> = self
            .economy
            .said_held
            .iter()
            .map(|(a, _)| a.clone())
            .filter(|a| {
                self.agent_config(a)
                    .is_some_and(|c| c.session.credential == group)
            })
            .collect();
        self.economy.said_held.retain(|(a, _)| !held.contains(a));
        for agent in held {
            if let Some(mut slot) = self.core.slot_mut(&agent) {
                slot.backoff_until = Some(now);
            }
            let still_held = self
                .root
                .agent(&agent)
                .read::<Report>()
                .ok()
                .flatten()
                .and_then(|r| r.error)
                .is_some_and(|e| e.state == crate::state::report::ErrorState::Held);
            if still_held {
                self.published.publish_agent(
                    &self.root,
                    &self.core,
                    self.clock.now(),
                    &agent,
                    None,
                );
            }
        }
    }

    /// Carry out the requests waiting in `.daemon/` (at start, SIGUSR1, the
    /// reconcile scan): `agent-state credential release` (each hold ends,
    /// its held wakes go now), then `agent-state stop` (see `stop.rs`).
    pub(super) fn daemon_requests(&mut self) {
        for group in self.economy.release_requests(&self.root, &self.config) {
            self.released(&group);
        }
        let now = self.clock.now();
        stop::stop_requests(&self.root, &mut self.core, &mut self.running, now);
    }
}
