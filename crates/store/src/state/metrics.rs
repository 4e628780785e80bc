//! `metrics.json`: lifetime counters and a rolling 30-day window, and the
//! pure computation of both from journal entries.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::journal::{Entry, Event};
use super::session::SessionVerdict;
use crate::clock::Timestamp;

pub const ROLLING_WINDOW: std::time::Duration = std::time::Duration::from_secs(30 * 86400);

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Metrics {
    pub agent: String,
    pub updated_at: Option<Timestamp>,
    pub lifetime: Lifetime,
    pub rolling_30d: Rolling,
    /// Addition: the last session whose end is counted in `lifetime`, so a
    /// recovery that replays an end (after a crash) never counts it twice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counted_session: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Lifetime {
    pub sessions_total: u64,
    pub sessions_completed: u64,
    pub sessions_timeout: u64,
    pub sessions_error: u64,
    pub sources_archived: u64,
    pub claims_proposed: u64,
    pub claims_accepted: u64,
    pub claims_challenged: u64,
    pub claims_rejected: u64,
    pub disconfirmation_attempts: u64,
    pub disconfirmation_hits: u64,
    pub cross_agent_flags_sent: u64,
    pub cross_agent_flags_received: u64,
    /// Addition: sessions a usage limit stopped (in `sessions_total`, not
    /// in `sessions_error`: the subscription's limit, not the agent's
    /// failure; see [`SessionVerdict::UsageLimit`]).
    pub sessions_usage_limited: u64,
    /// Addition: sessions an operator stopped (`agent-state stop`): in
    /// `sessions_total`, not in `sessions_error` (not the agent's failure).
    /// Absent until the first stop.
    #[serde(skip_serializing_if = "is_zero")]
    pub sessions_stopped: u64,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Rolling {
    pub sessions: u64,
    pub sources_archived: u64,
    pub claims_proposed: u64,
    pub acceptance_rate: f64,
    pub avg_sources_per_session: f64,
    /// Sessions that ended in a timeout or an error, as a share of
    /// `sessions` less `usage_limited` (an addition to seed 001: the
    /// pipeline and the daemon deprioritize agents with high error rates;
    /// a usage limit counts neither for nor against the agent).
    pub error_rate: f64,
    /// Addition: sessions a usage limit stopped (in `sessions`).
    pub usage_limited: u64,
    /// Addition: sessions an operator stopped, in `sessions` but neither
    /// for nor against the error rate. Absent while there are none.
    #[serde(skip_serializing_if = "is_zero")]
    pub stopped: u64,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Metrics {
    pub fn new(agent: &str) -> Metrics {
        Metrics {
            agent: agent.to_string(),
            ..Metrics::default()
        }
    }
}

impl Lifetime {
    /// Count one journal event into the lifetime counters. Both the hooks
    /// (one event at a time) and `metrics rebuild` (the whole journal) go
    /// through here, so they cannot disagree.
    pub fn count(&mut self, event: &Event) {
        match event {
            Event::SessionStart(s) if s.disconfirmation_target.is_some() => {
                self.disconfirmation_attempts = self.disconfirmation_attempts.saturating_add(1)
            }
            Event::SessionUpdated(s) if s.disconfirmation_target_added => {
                self.disconfirmation_attempts = self.disconfirmation_attempts.saturating_add(1)
            }
            Event::SessionEnd(e) => {
                self.sessions_total = self.sessions_total.saturating_add(1);
                self.sessions_completed = self.sessions_completed.saturating_add(1);
                self.sources_archived = self
                    .sources_archived
                    .saturating_add(e.sources_archived.unwrap_or(0));
                self.cross_agent_flags_received = self
                    .cross_agent_flags_received
                    .saturating_add(e.flags_received);
            }
            Event::Timeout(_) | Event::Error(_) => {
                self.sessions_total = self.sessions_total.saturating_add(1);
                let counter = match event.verdict() {
                    Some(SessionVerdict::UsageLimit) => &mut self.sessions_usage_limited,
                    Some(SessionVerdict::Stopped) => &mut self.sessions_stopped,
                    Some(SessionVerdict::Timeout) => &mut self.sessions_timeout,
                    _ => &mut self.sessions_error,
                };
                *counter = counter.saturating_add(1);
            }
            // An end counted as what its script recorded, moved to what
            // the daemon found.
            Event::SessionVerdict(v) => {
                let from = self.counter(v.was);
                *from = from.saturating_sub(1);
                let to = self.counter(v.verdict);
                *to = to.saturating_add(1);
            }
            Event::Record(r) => {
                self.claims_proposed = self.claims_proposed.saturating_add(r.claims_proposed);
                self.claims_accepted = self.claims_accepted.saturating_add(r.claims_accepted);
                self.claims_challenged = self.claims_challenged.saturating_add(r.claims_challenged);
                self.claims_rejected = self.claims_rejected.saturating_add(r.claims_rejected);
                self.disconfirmation_hits = self
                    .disconfirmation_hits
                    .saturating_add(r.disconfirmation_hits);
            }
            Event::MessageSent(m) if m.kind == super::journal::MessageType::Flag => {
                self.cross_agent_flags_sent = self.cross_agent_flags_sent.saturating_add(1)
            }
            _ => {}
        }
    }

    /// The counter of ends with `verdict`.
    fn counter(&mut self, verdict: SessionVerdict) -> &mut u64 {
        match verdict {
            SessionVerdict::Completed => &mut self.sessions_completed,
            SessionVerdict::Timeout => &mut self.sessions_timeout,
            SessionVerdict::Error => &mut self.sessions_error,
            SessionVerdict::UsageLimit => &mut self.sessions_usage_limited,
            SessionVerdict::Stopped => &mut self.sessions_stopped,
        }
    }

    /// Every counter, recomputed from the whole journal.
    pub fn from_journal(entries: &[Entry]) -> Lifetime {
        let mut l = Lifetime::default();
        for e in entries {
            l.count(&e.event);
        }
        l
    }
}

impl Rolling {
    /// The 30 days up to `now`, from the journal.
    pub fn from_journal(entries: &[Entry], now: Timestamp) -> Rolling {
        let since = now.minus(ROLLING_WINDOW);
        let mut r = Rolling::default();
        let mut accepted = 0u64;
        let mut ended = BTreeSet::new();
        let mut failed = BTreeSet::new();
        let mut limited = BTreeSet::new();
        let mut amended = Vec::new();
        let mut stopped = BTreeSet::new();
        for e in entries.iter().filter(|e| e.ts >= since && e.ts <= now) {
            match &e.event {
                Event::SessionEnd(end) => {
                    ended.insert(end.session_id.clone());
                    r.sources_archived = r
                        .sources_archived
                        .saturating_add(end.sources_archived.unwrap_or(0));
                }
                Event::Timeout(f) | Event::Error(f) => {
                    ended.insert(f.session_id.clone());
                    match e.event.verdict() {
                        Some(SessionVerdict::UsageLimit) => limited.insert(f.session_id.clone()),
                        Some(SessionVerdict::Stopped) => stopped.insert(f.session_id.clone()),
                        _ => failed.insert(f.session_id.clone()),
                    };
                }
                Event::Record(rec) => {
                    r.claims_proposed = r.claims_proposed.saturating_add(rec.claims_proposed);
                    accepted = accepted.saturating_add(rec.claims_accepted);
                }
                Event::SessionVerdict(v) => amended.push(v),
                _ => {}
            }
        }
        // The daemon's verdict on ends their scripts recorded first.
        for v in amended {
            if v.verdict == SessionVerdict::UsageLimit && failed.remove(&v.session_id) {
                limited.insert(v.session_id.clone());
            }
        }
        r.sessions = ended.len() as u64;
        r.acceptance_rate = ratio(accepted, r.claims_proposed);
        r.avg_sources_per_session = ratio(r.sources_archived, r.sessions);
        r.usage_limited = limited.len() as u64;
        r.stopped = stopped.len() as u64;
        r.error_rate = ratio(
            failed.len() as u64,
            r.sessions
                .saturating_sub(r.usage_limited)
                .saturating_sub(r.stopped),
        );
        r
    }
}

/// What of a journal line the rolling window looks at first: its time and
/// event name, borrowed, the rest of the line skipped unread.
#[derive(Deserialize)]
struct Head<'a> {
    #[serde(borrow)]
    ts: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    event: std::borrow::Cow<'a, str>,
}

/// `ts` against `than` (written by [`Timestamp`]'s `Display`): is it
/// earlier? The journal's own times (`2026-11-26T03:15:08Z`) compare as
/// text, in order; any other form is parsed. `None`: not a time.
fn earlier(ts: &str, than: &str) -> Option<bool> {
    let canonical = |t: &str| t.len() == 20 && t.ends_with('Z') && t.as_bytes()[10] == b'T';
    if canonical(ts) && canonical(than) {
        return Some(ts < than);
    }
    let ts = Timestamp::parse(ts).ok()?;
    Some(ts < Timestamp::parse(than).ok()?)
}

impl Rolling {
    /// [`Rolling::from_journal`] over the journal file's last 30 days (and
    /// its segments), as `journal::read_since` gives them, without parsing
    /// every line: a line's time is compared as text, and only a session's
    /// end, failure or record is read whole. A session's end runs this over
    /// 30 days of journal.
    pub fn from_journal_file(
        store: &super::Store,
        path: &std::path::Path,
        now: Timestamp,
    ) -> Result<Rolling> {
        // Where `read_since` stops; `from_journal` keeps only the window.
        let stop_before = now.minus(ROLLING_WINDOW).minus(journal::OUT_OF_ORDER_SLACK);
        let stop_text = stop_before.to_string();
        let mut entries = Vec::new();
        journal::scan_lines_backwards(store, path, |line| {
            let Ok(head) = serde_json::from_slice::<Head>(line) else {
                return std::ops::ControlFlow::Continue(());
            };
            // The counted events, parsed as their own struct (the whole
            // `Entry`, flattened and tagged, costs several times more).
            let counted = match &*head.event {
                "session_end" => serde_json::from_slice(line).map(Event::SessionEnd),
                "error" => serde_json::from_slice(line).map(Event::Error),
                "timeout" => serde_json::from_slice(line).map(Event::Timeout),
                "record" => serde_json::from_slice(line).map(Event::Record),
                "session_verdict" => serde_json::from_slice(line).map(Event::SessionVerdict),
                // Where a rotation happened: not an event.
                "log_rotated" if super::rotation::is_marker(line) => {
                    return std::ops::ControlFlow::Continue(());
                }
                _ => {
                    // Not counted: only its time may end the scan (if it
                    // is a line `read_since` would have read).
                    if earlier(&head.ts, &stop_text) == Some(true)
                        && serde_json::from_slice::<Entry>(line).is_ok()
                    {
                        return std::ops::ControlFlow::Break(());
                    }
                    return std::ops::ControlFlow::Continue(());
                }
            };
            let (Ok(event), Ok(ts)) = (counted, Timestamp::parse(&head.ts)) else {
                return std::ops::ControlFlow::Continue(());
            };
            if ts < stop_before {
                return std::ops::ControlFlow::Break(());
            }
            entries.push(Entry { ts, event });
            std::ops::ControlFlow::Continue(())
        })?;
        entries.reverse();
        Ok(Rolling::from_journal(&entries, now))
    }
}

/// `a / b` rounded to 4 places; 0 when there is nothing to divide by.
fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        ((a as f64 / b as f64) * 10_000.0).round() / 10_000.0
    }
}

use super::AgentDir;
use super::journal;
use super::lock::AgentLock;
use crate::error::Result;

/// After a crash between a session's journaled end and the metrics update:
/// count the journal's last session end if metrics.json has not. A file
/// without the marker that has counted sessions (written before the
/// marker existed) only gets the marker; one that has counted none (the
/// bootstrap's, before the agent's first end) counts it.
pub fn catch_up(
    dir: &AgentDir,
    lock: &AgentLock,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Result<bool> {
    let mut last = None;
    journal::scan_backwards(&dir.store, &dir.journal(), |e| {
        if e.event.ended_session().is_some() {
            last = Some(e);
            return std::ops::ControlFlow::Break(());
        }
        std::ops::ControlFlow::Continue(())
    })?;
    let Some((entry, id)) = last.and_then(|e| {
        let id = e.event.ended_session()?.to_string();
        Some((e, id))
    }) else {
        return Ok(false);
    };
    let mut metrics: Metrics = dir.load(lock, now, notes)?;
    match &metrics.counted_session {
        Some(counted) if *counted == id => Ok(false),
        None if metrics.lifetime.sessions_total > 0 => {
            metrics.counted_session = Some(id);
            dir.save(lock, &metrics)?;
            Ok(false)
        }
        _ => {
            apply(dir, lock, &entry.event, now, notes)?;
            notes.push(format!(
                "metrics.json had not counted the end of session {id} (a crash); counted now"
            ));
            Ok(true)
        }
    }
}

/// Count a just-journaled event into metrics.json: lifetime counters are
/// incremented (so counts that predate the journal are kept), and the rolling
/// window is recomputed from the journal when the event can change it.
pub fn apply(
    dir: &AgentDir,
    lock: &AgentLock,
    event: &Event,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Result<Metrics> {
    let (metrics, staged) = stage(dir, lock, event, now, notes)?;
    if let Some(s) = staged {
        s.commit()?;
    }
    Ok(metrics)
}

/// [`apply`], with the new metrics.json staged (written and fsynced, not
/// yet renamed in; `None` when nothing changed) for the caller to commit
/// with the other files of its change (`atomic::commit_all`).
pub fn stage(
    dir: &AgentDir,
    lock: &AgentLock,
    event: &Event,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Result<(Metrics, Option<super::atomic::Staged>)> {
    let (mut metrics, origin): (Metrics, _) = dir.load_with_origin(lock, now, notes)?;
    let before = metrics.lifetime.clone();
    metrics.agent = dir.name.to_string();
    let ended = event.ended_session();
    let counted_already = ended.is_some() && ended == metrics.counted_session.as_deref();
    // A file rebuilt from the journal already counts this (journaled) event.
    if origin != super::Origin::RebuiltFromJournal && !counted_already {
        metrics.lifetime.count(event);
    }
    if let Some(id) = ended {
        metrics.counted_session = Some(id.to_string());
    }
    let window_changes = matches!(
        event,
        Event::SessionEnd(_)
            | Event::Error(_)
            | Event::Timeout(_)
            | Event::Record(_)
            | Event::SessionVerdict(_)
    );
    if metrics.lifetime == before && !window_changes && origin == super::Origin::File {
        // Most events (a plain session start) change no counter: skip the write.
        return Ok((metrics, None));
    }
    if window_changes {
        let fresh = Rolling::from_journal_file(&dir.store, &dir.journal(), now)?;
        metrics.rolling_30d = Rolling {
            extra: std::mem::take(&mut metrics.rolling_30d.extra),
            ..fresh
        };
    }
    metrics.updated_at = Some(now);
    let staged = dir.stage(lock, &metrics)?;
    Ok((metrics, Some(staged)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::journal::{Record, SessionEnd, SessionFailed, SessionStart};

    /// What each kind of end counts as: the lifetime counters and the
    /// window's error rate, from the same journal events.
    #[test]
    fn each_end_counts_as_its_verdict_and_a_usage_limit_is_no_error() {
        let failed = |code: Option<&str>, verdict: Option<SessionVerdict>| SessionFailed {
            session_id: "s".into(),
            reason: "r".into(),
            code: code.map(str::to_string),
            verdict,
            ..Default::default()
        };
        let ended = Event::SessionEnd(SessionEnd {
            session_id: "s".into(),
            ..Default::default()
        });
        // (event, completed, timeout, error, usage limited)
        let table: Vec<(Event, [u64; 4])> = vec![
            (ended, [1, 0, 0, 0]),
            (
                Event::Timeout(failed(Some("SESSION_TIMEOUT"), None)),
                [0, 1, 0, 0],
            ),
            (Event::Error(failed(None, None)), [0, 0, 1, 0]),
            (
                Event::Error(failed(Some("SESSION_FAILED"), None)),
                [0, 0, 1, 0],
            ),
            (
                Event::Error(failed(
                    Some("USAGE_LIMIT"),
                    Some(SessionVerdict::UsageLimit),
                )),
                [0, 0, 0, 1],
            ),
            // Written before the field: judged by its catalogue code.
            (
                Event::Error(failed(Some("USAGE_LIMIT"), None)),
                [0, 0, 0, 1],
            ),
            (
                Event::Error(failed(Some("USAGE_DISABLED"), None)),
                [0, 0, 0, 1],
            ),
            // A verdict the status already says is not a usage limit.
            (
                Event::Error(failed(None, Some(SessionVerdict::Error))),
                [0, 0, 1, 0],
            ),
        ];
        let now = Timestamp::parse("2026-11-26T12:00:00Z").unwrap();
        for (event, [completed, timeout, error, limited]) in table {
            let mut l = Lifetime::default();
            l.count(&event);
            let got = [
                l.sessions_completed,
                l.sessions_timeout,
                l.sessions_error,
                l.sessions_usage_limited,
            ];
            assert_eq!(got, [completed, timeout, error, limited], "{event:?}");
            assert_eq!(l.sessions_total, 1, "{event:?}");
            let r = Rolling::from_journal(&[Entry::new(now, event.clone())], now);
            assert_eq!(r.sessions, 1, "{event:?}");
            assert_eq!(r.usage_limited, limited, "{event:?}");
            let rate = if timeout + error > 0 { 1.0 } else { 0.0 };
            assert_eq!(r.error_rate, rate, "{event:?}");
        }
        // One error among three sessions, one of them a usage limit: the
        // rate is over the two the agent answers for.
        let ids = ["a", "b", "c"];
        let events = [
            Event::SessionEnd(SessionEnd {
                session_id: ids[0].into(),
                ..Default::default()
            }),
            Event::Error(SessionFailed {
                session_id: ids[1].into(),
                ..Default::default()
            }),
            Event::Error(SessionFailed {
                session_id: ids[2].into(),
                verdict: Some(SessionVerdict::UsageLimit),
                ..Default::default()
            }),
        ];
        let entries: Vec<Entry> = events.into_iter().map(|e| Entry::new(now, e)).collect();
        let r = Rolling::from_journal(&entries, now);
        assert_eq!((r.sessions, r.usage_limited, r.error_rate), (3, 1, 0.5));

        // The daemon's verdict on the error its script recorded first
        // moves it, in the counters and in the window.
        let amended = [
            Event::Error(SessionFailed {
                session_id: "d".into(),
                ..Default::default()
            }),
            Event::SessionVerdict(crate::state::journal::VerdictAmended {
                session_id: "d".into(),
                was: SessionVerdict::Error,
                verdict: SessionVerdict::UsageLimit,
            }),
        ];
        let l = Lifetime::from_journal(
            &amended
                .iter()
                .map(|e| Entry::new(now, e.clone()))
                .collect::<Vec<_>>(),
        );
        assert_eq!(
            (l.sessions_total, l.sessions_error, l.sessions_usage_limited),
            (1, 0, 1)
        );
        let entries: Vec<Entry> = entries
            .into_iter()
            .chain(amended.into_iter().map(|e| Entry::new(now, e)))
            .collect();
        let r = Rolling::from_journal(&entries, now);
        assert_eq!((r.sessions, r.usage_limited, r.error_rate), (4, 2, 0.5));
    }

    /// An operator's stop (an `error` line with `SESSION_STOPPED`) counts
    /// as a session, never as a failure: table of journals and what the
    /// counters and the error rate make of them.
    #[test]
    fn a_stopped_session_is_no_failure() {
        let now = Timestamp::parse("2026-11-26T12:00:00Z").unwrap();
        let failed = |id: &str, code: Option<&str>| SessionFailed {
            session_id: id.into(),
            code: code.map(str::to_string),
            ..Default::default()
        };
        let end = |id: &str| {
            Event::SessionEnd(SessionEnd {
                session_id: id.into(),
                ..Default::default()
            })
        };
        // A journal; lifetime [total, completed, timeout, error, stopped];
        // rolling sessions, stopped, error rate.
        type Row = (Vec<Event>, [u64; 5], u64, u64, f64);
        let table: Vec<Row> = vec![
            (
                vec![Event::Error(failed("a", Some("SESSION_STOPPED")))],
                [1, 0, 0, 0, 1],
                1,
                1,
                0.0,
            ),
            (
                vec![
                    end("a"),
                    Event::Error(failed("b", Some("SESSION_STOPPED"))),
                    Event::Error(failed("c", None)),
                ],
                [3, 1, 0, 1, 1],
                3,
                1,
                0.5,
            ),
            (
                vec![
                    Event::Timeout(failed("a", Some("SESSION_TIMEOUT"))),
                    Event::Error(failed("b", Some("SESSION_FAILED"))),
                ],
                [2, 0, 1, 1, 0],
                2,
                0,
                1.0,
            ),
        ];
        for (events, lifetime, sessions, stopped, rate) in table {
            let entries: Vec<Entry> = events.into_iter().map(|e| Entry::new(now, e)).collect();
            let l = Lifetime::from_journal(&entries);
            assert_eq!(
                [
                    l.sessions_total,
                    l.sessions_completed,
                    l.sessions_timeout,
                    l.sessions_error,
                    l.sessions_stopped
                ],
                lifetime,
                "{entries:?}"
            );
            let r = Rolling::from_journal(&entries, now);
            assert_eq!(
                (r.sessions, r.stopped, r.error_rate),
                (sessions, stopped, rate)
            );
        }
        // Absent from metrics.json until there is one.
        let v = serde_json::to_value(Metrics::new("rio")).unwrap();
        assert!(v["lifetime"].get("sessions_stopped").is_none(), "{v}");
        assert!(v["rolling_30d"].get("stopped").is_none(), "{v}");
    }

    /// The fast window reads what the whole parse reads: every kind of line,
    /// old and new, torn, foreign, a rotation marker, across a segment.
    #[test]
    fn the_window_from_the_file_is_the_window_from_every_entry() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.jsonl");
        let now = Timestamp::parse("2026-11-26T12:00:00Z").unwrap();
        let mut lines: Vec<u8> = Vec::new();
        for day in (0..45u64).rev() {
            let ts = now.minus(std::time::Duration::from_secs(day * 86_400 + 3600));
            let id = format!("s{day}");
            let events = [
                Event::SessionStart(SessionStart {
                    session_id: id.clone(),
                    ..Default::default()
                }),
                match day % 3 {
                    0 => Event::SessionEnd(SessionEnd {
                        session_id: id.clone(),
                        sources_archived: Some(day),
                        ..Default::default()
                    }),
                    1 => Event::Error(SessionFailed {
                        session_id: id.clone(),
                        ..Default::default()
                    }),
                    _ => Event::Timeout(SessionFailed {
                        session_id: id.clone(),
                        ..Default::default()
                    }),
                },
                Event::Record(Record {
                    claims_proposed: day + 1,
                    claims_accepted: day / 2,
                    ..Default::default()
                }),
            ];
            for e in events {
                lines.extend(Entry::new(ts, e).to_line());
            }
            lines.extend(
                format!("{{\"ts\":\"{ts}\",\"event\":\"orient_complete\",\"files\":[1,2]}}\n")
                    .as_bytes(),
            );
            if day == 20 {
                lines.extend(b"{\"ts\":\"2026-11-0\n");
            }
            // Malformed for its kind (never counted), a time in another
            // form (parsed, counted), a time that is none.
            let odd = ts.plus(std::time::Duration::from_secs(60));
            let fractional = odd.0.to_rfc3339_opts(chrono::SecondsFormat::Millis, false);
            lines.extend(
                format!(
                    "{{\"ts\":\"{odd}\",\"event\":\"session_end\",\"session_id\":5}}\n\
                     {{\"ts\":\"{fractional}\",\"event\":\"record\",\"claims_proposed\":7}}\n\
                     {{\"ts\":\"yesterday\",\"event\":\"error\",\"session_id\":\"x\",\"reason\":\"r\"}}\n"
                )
                .as_bytes(),
            );
        }
        // The oldest half rotated into a segment, the live file after it.
        let half = lines.len() / 2;
        let cut = half + lines[half..].iter().position(|b| *b == b'\n').unwrap() + 1;
        std::fs::write(&path, &lines[..cut]).unwrap();
        assert!(
            crate::state::rotation::rotate_if_over(&crate::state::Store::default(), &path, 1, now)
                .unwrap()
                .is_some()
        );
        use std::io::Write;
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(&lines[cut..])
            .unwrap();
        let all = journal::read_since(
            &crate::state::Store::default(),
            &path,
            now.minus(ROLLING_WINDOW),
        )
        .unwrap();
        let expected = Rolling::from_journal(&all, now);
        assert!(expected.sessions >= 29, "{expected:?}");
        assert!(expected.error_rate > 0.0 && expected.claims_proposed > 0);
        assert_eq!(
            Rolling::from_journal_file(&crate::state::Store::default(), &path, now).unwrap(),
            expected
        );
        // Later: the window moved, still the same as the whole parse.
        let later = now.plus(std::time::Duration::from_secs(10 * 86_400));
        let all = journal::read_since(
            &crate::state::Store::default(),
            &path,
            later.minus(ROLLING_WINDOW),
        )
        .unwrap();
        assert_eq!(
            Rolling::from_journal_file(&crate::state::Store::default(), &path, later).unwrap(),
            Rolling::from_journal(&all, later)
        );
        assert_ne!(
            Rolling::from_journal_file(&crate::state::Store::default(), &path, later).unwrap(),
            expected
        );
    }
}
