//! One session, two enders: a session script's own `session end|fail` and
//! the daemon's end are two events into the same session, and whichever
//! comes first, the session gets one record (issue 21).
//!
//! A daemon session whose agent has `verify` commands is *held*: the daemon
//! notes in session.json ([`HELD`]) that it ends the session itself, after
//! verification. While it is held, the script's own end (each iteration's
//! run calls it) is *kept* ([`SAID`]): what it said (outcome, handoff,
//! sources, branch, PR, usage) waits in session.json, and the session goes
//! on running, so the next iteration's `session begin` joins it. The
//! daemon's end then records it once, the script's word merged in
//! ([`settle`]). Unheld sessions (no `verify`, a script run by cron or by
//! hand) end at the first end, exactly as before.
//!
//! The decision is pure ([`on`]): the session's phase and the event in,
//! what to do out, the clock passed in. The daemon's general session
//! machine is meant to absorb it.

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::state::session::SessionStatus;

/// The session.json key under which the daemon notes that it holds the
/// running session's end ([`Held`]).
pub const HELD: &str = "end_held_by_daemon";
/// The session.json key under which a held session keeps what its script's
/// ends said ([`Said`]).
pub const SAID: &str = "script_end";

/// The daemon's note that it ends the session itself, after verification.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Held {
    /// The daemon's pid: its own end settles the session; the session's
    /// script (a process it started) has its ends kept.
    pub by_pid: u32,
    pub since: Timestamp,
}

/// What a session script's `session end` or `session fail` said: one run's
/// word, or several runs' added up ([`Said::then`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Said {
    /// `completed`, `error` or `timeout`.
    pub outcome: SessionStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sources_archived: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pr_number: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_priority: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff_notes: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_used: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// How many ends of the script this is (one per run).
    pub runs: u32,
    /// When the script last said it.
    pub at: Timestamp,
}

impl Said {
    /// A completion with nothing in it (the daemon's own end: a clean exit).
    pub fn completed(at: Timestamp) -> Said {
        Said {
            outcome: SessionStatus::Completed,
            reason: None,
            sources_archived: None,
            branch: None,
            pr_number: None,
            summary: None,
            next_priority: None,
            handoff_notes: None,
            tokens_used: None,
            cost_usd: None,
            runs: 1,
            at,
        }
    }

    /// A failure with its reason.
    pub fn failed(outcome: SessionStatus, reason: &str, at: Timestamp) -> Said {
        Said {
            outcome,
            reason: Some(reason.to_string()),
            ..Said::completed(at)
        }
    }

    pub fn is_failure(&self) -> bool {
        self.outcome != SessionStatus::Completed
    }

    /// This word, then `next` (the next run's): the latest run says how it
    /// went and what to hand off; what each run archived and used adds up,
    /// once per run.
    pub fn then(&self, next: Said) -> Said {
        let add = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
        };
        let cost = match (self.cost_usd, next.cost_usd) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
        };
        Said {
            outcome: next.outcome,
            reason: next.reason,
            sources_archived: add(self.sources_archived, next.sources_archived),
            branch: next.branch.or_else(|| self.branch.clone()),
            pr_number: next.pr_number.or(self.pr_number),
            summary: next.summary.or_else(|| self.summary.clone()),
            next_priority: next.next_priority.or_else(|| self.next_priority.clone()),
            handoff_notes: next.handoff_notes.or_else(|| self.handoff_notes.clone()),
            tokens_used: add(self.tokens_used, next.tokens_used),
            cost_usd: cost,
            runs: self.runs.saturating_add(next.runs),
            at: next.at,
        }
    }
}

/// The session as the end hooks find it.
#[derive(Debug, Clone, PartialEq)]
pub enum Phase {
    /// No session running (or not the one named): an end is a repeat.
    NotRunning,
    /// Running, its end not held: the first end records it.
    Running,
    /// Running, its end held by the daemon; `kept` is what its script said
    /// so far.
    Held { kept: Option<Box<Said>> },
}

/// Who ends the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ender {
    /// The daemon that holds the session's end.
    Holder,
    /// A process the holder started: the session's script, one run of it.
    Child,
    /// Anyone else (a person's `session fail`, another program).
    Other,
}

/// An end of the session: who, and what they said.
#[derive(Debug, Clone, PartialEq)]
pub struct End {
    pub from: Ender,
    pub said: Said,
}

/// What to do about an end.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Record the session's end now, as this says.
    Record(Said),
    /// Keep this (what the script said so far) in session.json; the
    /// session goes on running until its holder ends it.
    Keep(Said),
    /// The session has ended already: nothing changes.
    Repeat,
}

/// What an end of the session does, in its phase (pure). Held, the
/// script's ends are kept (stamped `now`, each run's added to the last's)
/// and the holder's end records the session with them ([`settle`]); so does
/// an outsider's, which is not kept waiting for a daemon it does not know.
pub fn on(phase: &Phase, end: End, now: Timestamp) -> Action {
    match (phase, end.from) {
        (Phase::NotRunning, _) => Action::Repeat,
        (Phase::Running, _) => Action::Record(end.said),
        (Phase::Held { kept }, Ender::Child) => {
            let said = Said {
                at: now,
                ..end.said
            };
            Action::Keep(match kept {
                Some(k) => k.then(said),
                None => said,
            })
        }
        (Phase::Held { kept }, Ender::Holder | Ender::Other) => {
            Action::Record(settle(kept.as_deref(), end.said))
        }
    }
}

/// The record of a held session: the daemon's end (`daemon`: how it judged
/// the whole session, verification included) with what its script kept.
/// A failure the script recorded stands in its own words (the daemon may
/// put its reason in front afterwards, as when the script ended first); the
/// daemon's failure stands over the script's completion (verification
/// failed); two completions are the script's, which knows what it
/// archived, on what branch, for which PR.
pub fn settle(kept: Option<&Said>, daemon: Said) -> Said {
    let Some(kept) = kept else { return daemon };
    if kept.is_failure() {
        return kept.clone();
    }
    if daemon.is_failure() {
        return Said {
            tokens_used: kept.tokens_used,
            cost_usd: kept.cost_usd,
            ..daemon
        };
    }
    Said {
        sources_archived: kept.sources_archived.or(daemon.sources_archived),
        branch: kept.branch.clone().or(daemon.branch),
        pr_number: kept.pr_number.or(daemon.pr_number),
        summary: kept.summary.clone().or(daemon.summary),
        next_priority: kept.next_priority.clone().or(daemon.next_priority),
        handoff_notes: kept.handoff_notes.clone().or(daemon.handoff_notes),
        tokens_used: kept.tokens_used.or(daemon.tokens_used),
        cost_usd: kept.cost_usd.or(daemon.cost_usd),
        runs: kept.runs,
        ..daemon
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        Timestamp::parse(s).unwrap()
    }

    fn run(n: u64, at: &str) -> Said {
        Said {
            sources_archived: Some(n),
            branch: Some("rio/research-2026-11-26".into()),
            handoff_notes: Some(format!("run {n}")),
            tokens_used: Some(1000 * n),
            cost_usd: Some(0.25),
            ..Said::completed(t(at))
        }
    }

    fn held(kept: Option<Said>) -> Phase {
        Phase::Held {
            kept: kept.map(Box::new),
        }
    }

    #[test]
    fn each_end_in_each_phase() {
        let now = t("2026-11-26T10:00:05Z");
        let said = run(1, "2026-11-26T10:00:00Z");
        let stamped = Said {
            at: now,
            ..said.clone()
        };
        let daemon = Said::completed(now);
        let failed = Said::failed(SessionStatus::Error, "verification failed", now);
        let stop = Said::failed(SessionStatus::Error, "stopped by hand", now);
        use Ender::*;
        #[rustfmt::skip]
        let table: Vec<(&str, Phase, Ender, Said, Action)> = vec![
            ("no session: a repeat", Phase::NotRunning, Child, said.clone(), Action::Repeat),
            ("the daemon's repeat", Phase::NotRunning, Holder, daemon.clone(), Action::Repeat),
            ("unheld: the script's end records it (cron, no verify)",
                Phase::Running, Child, said.clone(), Action::Record(said.clone())),
            ("unheld: a script of its own (no daemon) records it",
                Phase::Running, Other, said.clone(), Action::Record(said.clone())),
            ("unheld: the daemon's end records it", Phase::Running, Holder, daemon.clone(),
                Action::Record(daemon.clone())),
            ("held: the script's first end is kept, stamped now",
                held(None), Child, said.clone(), Action::Keep(stamped.clone())),
            ("held: the daemon's end with nothing kept is its own",
                held(None), Holder, failed.clone(), Action::Record(failed.clone())),
            ("held: the daemon's clean end takes the script's word",
                held(Some(stamped.clone())), Holder, daemon.clone(),
                Action::Record(Said { at: now, ..stamped.clone() })),
            ("held: the daemon's failure (verification) over the script's completion",
                held(Some(stamped.clone())), Holder, failed.clone(),
                Action::Record(Said { tokens_used: Some(1000), cost_usd: Some(0.25), ..failed.clone() })),
            ("held: an outsider's fail is not kept waiting",
                held(None), Other, stop.clone(), Action::Record(stop.clone())),
        ];
        for (what, phase, from, said, want) in table {
            assert_eq!(on(&phase, End { from, said }, now), want, "{what}");
        }
    }

    #[test]
    fn a_second_run_adds_its_usage_and_says_how_it_went() {
        let first = run(1, "2026-11-26T10:00:00Z");
        let now = t("2026-11-26T10:05:00Z");
        let second = Said {
            handoff_notes: Some("run 2".into()),
            tokens_used: Some(2000),
            sources_archived: Some(2),
            branch: None,
            ..Said::completed(t("2026-11-26T10:04:00Z"))
        };
        let Action::Keep(kept) = on(
            &held(Some(first)),
            End {
                from: Ender::Child,
                said: second,
            },
            now,
        ) else {
            panic!("kept")
        };
        assert_eq!(kept.runs, 2);
        assert_eq!(kept.tokens_used, Some(3000), "each run once");
        assert_eq!(kept.cost_usd, Some(0.25), "the second said no cost");
        assert_eq!(kept.sources_archived, Some(3));
        assert_eq!(kept.handoff_notes.as_deref(), Some("run 2"), "the latest");
        assert_eq!(
            kept.branch.as_deref(),
            Some("rio/research-2026-11-26"),
            "an earlier run's, when the latest said none"
        );
        assert_eq!(kept.at, now);
    }

    #[test]
    fn settling_a_held_session() {
        let now = t("2026-11-26T10:10:00Z");
        let kept = run(2, "2026-11-26T10:05:00Z");
        let script_failed = Said::failed(SessionStatus::Timeout, "timed out; the script said", now);
        let verify_failed = Said::failed(SessionStatus::Error, "verification still failed", now);
        // Both completed: the script's word, the daemon's time.
        let both = settle(Some(&kept), Said::completed(now));
        assert_eq!(
            both,
            Said {
                at: now,
                ..kept.clone()
            }
        );
        // The daemon judged a failure (verification): its failure, the
        // script's usage.
        let failed = settle(Some(&kept), verify_failed.clone());
        assert_eq!(failed.outcome, SessionStatus::Error);
        assert_eq!(failed.reason, verify_failed.reason);
        assert_eq!(failed.tokens_used, Some(2000));
        assert_eq!(failed.handoff_notes, None);
        // The script recorded a failure: it stands, whatever the daemon says.
        assert_eq!(
            settle(Some(&script_failed), Said::completed(now)),
            script_failed
        );
        assert_eq!(settle(Some(&script_failed), verify_failed), script_failed);
        // Nothing kept: the daemon's own end.
        assert_eq!(settle(None, Said::completed(now)), Said::completed(now));
    }

    #[test]
    fn said_round_trips_through_session_json() {
        let said = run(3, "2026-11-26T10:00:00Z");
        let value = serde_json::to_value(&said).unwrap();
        assert_eq!(value["outcome"], "completed");
        assert!(value.get("reason").is_none());
        assert_eq!(serde_json::from_value::<Said>(value).unwrap(), said);
    }
}
