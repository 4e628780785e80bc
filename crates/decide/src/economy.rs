//! The economy's decisions, as values (pure: every function takes `now`):
//! which credential groups are held and until when (a usage limit, an
//! admin's cap, a failed login check), the one probe session after a limit
//! whose reset is unknown, and when a day's budgets start again.
//!
//! The daemon (`agent-state`'s `daemon::service::economy`, which still
//! reaches this module as `daemon::economy`) feeds it what sessions and
//! checks report, asks it before every wake, and persists it in
//! `.daemon/holds.json` so a restart does not walk into the same limit.
//! `[usage_limits]` is read by `config` into [`UsageLimitSettings`], the
//! value these decisions take.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::zone::Zone;
use chrono::{DateTime, TimeZone, Utc};
use serde::{Deserialize, Serialize};

use crate::agent_name::AgentName;
use crate::clock::Timestamp;
use crate::protocol::limits::{Limit, LimitKind, hold_until};

/// `[usage_limits]`: how long to wait on a usage limit whose reset time is
/// not known, before one probe session (doubling up to `max_wait`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageLimitSettings {
    pub wait: Duration,
    pub max_wait: Duration,
    /// The longest wait after a known reset (between a quarter of it and
    /// it, so the agents of a group do not all start at the reset).
    pub jitter: Duration,
}

impl Default for UsageLimitSettings {
    fn default() -> Self {
        UsageLimitSettings {
            wait: Duration::from_secs(1800),
            max_wait: Duration::from_secs(4 * 3600),
            jitter: Duration::from_secs(120),
        }
    }
}

/// Why a credential group is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// A usage or rate limit; ends at its reset (or after a capped wait and
    /// a probe).
    UsageLimit,
    /// An admin disabled or capped the usage: ends when a session succeeds.
    Disabled,
    /// The login check failed: ends when it passes.
    Credential,
}

/// One group's hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hold {
    pub cause: Cause,
    pub since: Timestamp,
    /// When it ends by itself; `None`: when something clears it.
    pub until: Option<Timestamp>,
    /// Whether `until` is the limit's own reset (else a guess: a probe follows).
    pub known_reset: bool,
    /// One sentence for status, report.json and the log.
    pub reason: String,
    /// After an unknown reset's wait: the agent running the probe session
    /// (the others wait for its result).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<AgentName>,
}

/// What [`Holds::gate`] says about a wake.
#[derive(Debug, Clone, PartialEq)]
pub enum Gate {
    Open,
    /// Wait; `until` is when to ask again (`None`: until cleared).
    Held {
        until: Option<DateTime<Utc>>,
        reason: String,
    },
    /// This wake is the probe after an unknown reset's wait: let it run.
    Probe,
}

/// Every group's hold, and how many unknown-reset waits came in a row.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Holds {
    #[serde(default)]
    pub groups: BTreeMap<String, Hold>,
    #[serde(default)]
    pub unknown_in_a_row: BTreeMap<String, u32>,
}

/// The time as status shows it: `13:00 UTC`, or with the date if not today.
pub fn when(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    if t.date_naive() == now.date_naive() {
        t.format("%H:%M UTC").to_string()
    } else {
        t.format("%Y-%m-%d %H:%M UTC").to_string()
    }
}

impl Holds {
    /// A session of `group` hit `limit`. Returns whether the group was not
    /// held before (say so once) and the hold.
    pub fn limit_seen(
        &mut self,
        group: &str,
        limit: &Limit,
        now: DateTime<Utc>,
        settings: &UsageLimitSettings,
        seed: u64,
    ) -> (bool, Hold) {
        let hold = if limit.kind == LimitKind::AdminDisabled {
            Hold {
                cause: Cause::Disabled,
                since: Timestamp::from_datetime(now),
                until: None,
                known_reset: false,
                reason: format!(
                    "usage disabled by an admin ({}): held until a session succeeds (`agent-state wake` tries one) or `agent-state credential release {group}`",
                    limit.evidence
                ),
                probe: None,
            }
        } else if let Some(until) = hold_until(limit, now, seed, settings.jitter) {
            self.unknown_in_a_row.remove(group);
            Hold {
                cause: Cause::UsageLimit,
                since: Timestamp::from_datetime(now),
                until: Some(Timestamp::from_datetime(until)),
                known_reset: true,
                reason: format!(
                    "waiting for the usage limit to reset at {}",
                    when(until, now)
                ),
                probe: None,
            }
        } else {
            let n = self.unknown_in_a_row.entry(group.to_string()).or_default();
            let wait = settings
                .wait
                .saturating_mul(1u32 << (*n).min(16))
                .min(settings.max_wait);
            *n += 1;
            let until = crate::clock::later(now, wait);
            Hold {
                cause: Cause::UsageLimit,
                since: Timestamp::from_datetime(now),
                until: Some(Timestamp::from_datetime(until)),
                known_reset: false,
                reason: format!(
                    "waiting on a usage limit with no reset time: one probe session at {}",
                    when(until, now)
                ),
                probe: None,
            }
        };
        // Said once per hold of a cause: an admin's cap found while a usage
        // limit holds the group (a manual wake tried) is news, not more of
        // the same.
        let fresh = self
            .groups
            .get(group)
            .is_none_or(|old| old.probe.is_some() || old.cause != hold.cause);
        // A longer hold already in force stays (two sessions of the group
        // may report different windows).
        let keep_old = self.groups.get(group).is_some_and(|old| {
            old.cause == hold.cause
                && old.probe.is_none()
                && match (old.until, hold.until) {
                    (None, _) => true,
                    (Some(a), Some(b)) => a >= b,
                    (Some(_), None) => false,
                }
        });
        if !keep_old {
            self.groups.insert(group.to_string(), hold);
        }
        (fresh, self.groups[group].clone())
    }

    /// The group's login check failed (or a session found it logged out).
    /// Held until the check passes, or, for a group without a check, until
    /// `retry_at`, when one probe session tries. Returns whether it was not
    /// held for that before.
    pub fn credential_failed(
        &mut self,
        group: &str,
        why: &str,
        now: DateTime<Utc>,
        retry_at: Option<DateTime<Utc>>,
    ) -> bool {
        let fresh = self
            .groups
            .get(group)
            .is_none_or(|h| h.cause != Cause::Credential);
        if fresh {
            self.groups.insert(
                group.to_string(),
                Hold {
                    cause: Cause::Credential,
                    since: Timestamp::from_datetime(now),
                    until: retry_at.map(Timestamp::from_datetime),
                    known_reset: false,
                    reason: match retry_at {
                        None => format!(
                            "the credential is not usable ({why}): held until its check passes or a session succeeds (`agent-state credential release {group}` lifts it)"
                        ),
                        Some(t) => format!(
                            "the credential is not usable ({why}): held; one session tries again at {} (`agent-state credential release {group}` lifts it sooner)",
                            when(t, now)
                        ),
                    },
                    probe: None,
                },
            );
        }
        fresh
    }

    /// The group's login check passed: a credential hold ends.
    pub fn credential_ok(&mut self, group: &str) -> Option<Hold> {
        match self.groups.get(group) {
            Some(h) if h.cause == Cause::Credential => self.groups.remove(group),
            _ => None,
        }
    }

    /// The operator released `group` (`agent-state credential release`):
    /// its hold ends, whatever its cause, and so does the doubling of
    /// unknown-reset waits.
    pub fn release(&mut self, group: &str) -> Option<Hold> {
        self.unknown_in_a_row.remove(group);
        self.groups.remove(group)
    }

    /// A session of `group` ended without a limit: any success ends the
    /// group's hold, whatever its cause (the credential works: an admin's
    /// cap was lifted, the operator logged in again), and so does the
    /// probe's end (its verdict holds the group again if it must).
    pub fn session_ended(
        &mut self,
        group: &str,
        agent: &AgentName,
        succeeded: bool,
    ) -> Option<Hold> {
        let hold = self.groups.get(group)?;
        let was_probe = hold.probe.as_ref() == Some(agent);
        if succeeded || was_probe {
            self.unknown_in_a_row.remove(group);
            return self.groups.remove(group);
        }
        None
    }

    /// May `agent` of `group` start a session at `now`? A timed hold that
    /// has ended opens the group, except after an unknown reset, where the
    /// first wake becomes the probe and the others wait for it.
    pub fn gate(&mut self, group: &str, agent: &AgentName, now: DateTime<Utc>) -> Gate {
        let Some(hold) = self.groups.get_mut(group) else {
            return Gate::Open;
        };
        match (hold.until.map(|t| t.0), &hold.probe) {
            (Some(until), None) if until <= now => {
                if hold.known_reset {
                    self.groups.remove(group);
                    Gate::Open
                } else {
                    hold.probe = Some(agent.clone());
                    hold.until = None;
                    hold.reason = format!(
                        "a probe session ({agent}) checks whether the usage limit has reset"
                    );
                    Gate::Probe
                }
            }
            (_, Some(prober)) if prober == agent => Gate::Probe,
            _ => Gate::Held {
                until: hold.until.map(|t| t.0),
                reason: hold.reason.clone(),
            },
        }
    }

    /// The earliest time a hold ends by itself (to wake the loop).
    pub fn next_deadline(&self) -> Option<DateTime<Utc>> {
        self.groups
            .values()
            .filter_map(|h| h.until.map(|t| t.0))
            .min()
    }
}

/// When the day after `now`'s day starts in `tz` (daily budgets reset).
pub fn next_day_start(now: DateTime<Utc>, tz: Zone) -> DateTime<Utc> {
    let local = now.with_timezone(&tz).date_naive();
    let mut day = local;
    // A zone may skip midnight (DST at 00:00): take the first instant of
    // the next day that exists.
    for _ in 0..3 {
        day = day.succ_opt().unwrap_or(day);
        for minutes in [0u32, 60, 120] {
            let t = day.and_hms_opt(minutes / 60, 0, 0).expect("a valid time");
            if let Some(start) = tz.from_local_datetime(&t).earliest() {
                return start.with_timezone(&Utc);
            }
        }
    }
    now + chrono::Duration::hours(24)
}

/// Does a scheduled wake with `wake_if = "work"` have work?
pub fn has_work(waiting_messages: usize, open_tasks: usize) -> bool {
    waiting_messages > 0 || open_tasks > 0
}

/// How long until `t`, at least zero.
pub fn until(t: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    (t - now).to_std().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn limit(kind: LimitKind, resets_at: Option<&str>) -> Limit {
        Limit {
            kind,
            resets_at: resets_at.map(at),
            window: None,
            evidence: "You've hit your limit".into(),
            note: None,
        }
    }

    fn name(s: &str) -> AgentName {
        AgentName::parse(s).unwrap()
    }

    const SETTINGS: UsageLimitSettings = UsageLimitSettings {
        wait: Duration::from_secs(1800),
        max_wait: Duration::from_secs(4 * 3600),
        jitter: Duration::from_secs(120),
    };

    #[test]
    fn a_known_reset_holds_the_group_until_it_then_opens() {
        let now = at("2026-11-24T10:00:00Z");
        let mut h = Holds::default();
        let (fresh, hold) = h.limit_seen(
            "default",
            &limit(LimitKind::UsageLimit, Some("2026-11-24T13:00:00Z")),
            now,
            &SETTINGS,
            7,
        );
        assert!(fresh);
        let until = hold.until.unwrap().0;
        assert!(
            until >= at("2026-11-24T13:00:30Z") && until <= at("2026-11-24T13:02:00Z"),
            "{until}"
        );
        assert!(
            hold.reason
                .starts_with("waiting for the usage limit to reset at 13:0"),
            "{}",
            hold.reason
        );
        // A second agent of the group sees it again: not fresh, same hold.
        let (fresh, _) = h.limit_seen(
            "default",
            &limit(LimitKind::UsageLimit, Some("2026-11-24T13:00:00Z")),
            now,
            &SETTINGS,
            9,
        );
        assert!(!fresh);
        assert!(matches!(
            h.gate("default", &name("rio"), now),
            Gate::Held { .. }
        ));
        assert_eq!(h.gate("other", &name("rio"), now), Gate::Open);
        assert_eq!(h.next_deadline(), Some(until));
        assert_eq!(h.gate("default", &name("rio"), until), Gate::Open);
        assert!(h.groups.is_empty());
    }

    #[test]
    fn an_unknown_reset_waits_then_lets_one_probe_run_and_doubles_if_it_fails() {
        let now = at("2026-11-24T10:00:00Z");
        let mut h = Holds::default();
        let (_, hold) = h.limit_seen(
            "default",
            &limit(LimitKind::ApiRateLimit, None),
            now,
            &SETTINGS,
            1,
        );
        assert_eq!(hold.until.map(|t| t.0), Some(at("2026-11-24T10:30:00Z")));
        let later = at("2026-11-24T10:31:00Z");
        assert_eq!(h.gate("default", &name("rio"), later), Gate::Probe);
        assert!(matches!(
            h.gate("default", &name("leo"), later),
            Gate::Held { until: None, .. }
        ));
        assert_eq!(
            h.gate("default", &name("rio"), later),
            Gate::Probe,
            "the prober may run"
        );
        // The probe hits the limit again: a doubled wait, fresh notice.
        let (fresh, hold) = h.limit_seen(
            "default",
            &limit(LimitKind::ApiRateLimit, None),
            later,
            &SETTINGS,
            1,
        );
        assert!(fresh);
        assert_eq!(
            hold.until.map(|t| t.0),
            Some(later + chrono::Duration::minutes(60))
        );
        // Capped at max_wait.
        for _ in 0..6 {
            h.limit_seen(
                "default",
                &limit(LimitKind::ApiRateLimit, None),
                later,
                &SETTINGS,
                1,
            );
        }
        assert_eq!(
            h.groups["default"].until.map(|t| t.0),
            Some(later + chrono::Duration::hours(4))
        );
        // A successful session ends it and the doubling.
        assert!(h.session_ended("default", &name("leo"), true).is_some());
        assert!(h.unknown_in_a_row.is_empty());
    }

    #[test]
    fn an_admin_cap_holds_until_a_session_succeeds_and_a_failed_check_until_it_passes() {
        let now = at("2026-11-24T10:00:00Z");
        let mut h = Holds::default();
        let (_, hold) = h.limit_seen(
            "default",
            &limit(LimitKind::AdminDisabled, None),
            now,
            &SETTINGS,
            1,
        );
        assert_eq!((hold.cause, hold.until), (Cause::Disabled, None));
        assert!(matches!(
            h.gate("default", &name("rio"), now + chrono::Duration::days(3)),
            Gate::Held { until: None, .. }
        ));
        assert!(h.session_ended("default", &name("rio"), false).is_none());
        assert!(h.session_ended("default", &name("rio"), true).is_some());

        assert!(h.credential_failed("team", "not logged in", now, None));
        assert!(
            !h.credential_failed("team", "not logged in", now, None),
            "said once"
        );
        assert!(h.credential_ok("team").is_some());
        assert_eq!(h.gate("team", &name("rio"), now), Gate::Open);
        // A session that succeeds proves the login works again.
        h.credential_failed("team", "not logged in", now, None);
        assert!(h.session_ended("team", &name("rio"), false).is_none());
        assert!(h.session_ended("team", &name("rio"), true).is_some());
        assert_eq!(h.gate("team", &name("rio"), now), Gate::Open);
    }

    #[test]
    fn an_admin_cap_found_during_a_usage_limit_hold_is_news() {
        let now = at("2026-11-24T10:00:00Z");
        let mut h = Holds::default();
        let reset = limit(LimitKind::UsageLimit, Some("2026-11-24T13:00:00Z"));
        assert!(h.limit_seen("default", &reset, now, &SETTINGS, 1).0);
        assert!(!h.limit_seen("default", &reset, now, &SETTINGS, 2).0);
        // A manual wake during the hold finds the account capped.
        let (fresh, hold) = h.limit_seen(
            "default",
            &limit(LimitKind::AdminDisabled, None),
            now,
            &SETTINGS,
            3,
        );
        assert!(fresh, "said (and escalated), not swallowed");
        assert!(h.release("default").is_some());
        assert!(h.release("default").is_none());
        h.limit_seen(
            "default",
            &limit(LimitKind::AdminDisabled, None),
            now,
            &SETTINGS,
            3,
        );
        assert_eq!((hold.cause, hold.until), (Cause::Disabled, None));
        let (fresh, _) = h.limit_seen(
            "default",
            &limit(LimitKind::AdminDisabled, None),
            now,
            &SETTINGS,
            4,
        );
        assert!(!fresh, "once per hold");
    }

    #[test]
    fn a_day_starts_at_midnight_in_the_zone_even_when_midnight_is_skipped() {
        assert_eq!(
            next_day_start(at("2026-11-24T10:00:00Z"), crate::zone::Zone::UTC),
            at("2026-11-25T00:00:00Z")
        );
        assert_eq!(
            next_day_start(
                at("2026-11-24T10:00:00Z"),
                crate::zone::Zone::get("America/Los_Angeles").unwrap()
            ),
            at("2026-11-25T08:00:00Z")
        );
        // Chile (America/Santiago) springs forward at 00:00 on 2026-09-06.
        let t = next_day_start(
            at("2026-09-05T12:00:00Z"),
            crate::zone::Zone::get("America/Santiago").unwrap(),
        );
        assert_eq!(
            t,
            at("2026-09-06T04:00:00Z"),
            "01:00 local, the first instant of the day"
        );
        assert!(has_work(1, 0) && has_work(0, 2) && !has_work(0, 0));
    }
}
