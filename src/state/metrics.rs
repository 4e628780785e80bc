//! `metrics.json`: lifetime counters and a rolling 30-day window, and the
//! pure computation of both from journal entries.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::journal::{Entry, Event};
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
    #[serde(flatten)]
    pub extra: Map<String, Value>,
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
    /// `sessions` (an addition to seed 001: the pipeline and the daemon
    /// deprioritize agents with high error rates).
    pub error_rate: f64,
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
                self.disconfirmation_attempts += 1
            }
            Event::SessionUpdated(s) if s.disconfirmation_target_added => {
                self.disconfirmation_attempts += 1
            }
            Event::SessionEnd(e) => {
                self.sessions_total += 1;
                self.sessions_completed += 1;
                self.sources_archived += e.sources_archived.unwrap_or(0);
                self.cross_agent_flags_received += e.flags_received;
            }
            Event::Timeout(_) => {
                self.sessions_total += 1;
                self.sessions_timeout += 1;
            }
            Event::Error(_) => {
                self.sessions_total += 1;
                self.sessions_error += 1;
            }
            Event::Record(r) => {
                self.claims_proposed += r.claims_proposed;
                self.claims_accepted += r.claims_accepted;
                self.claims_challenged += r.claims_challenged;
                self.claims_rejected += r.claims_rejected;
                self.disconfirmation_hits += r.disconfirmation_hits;
            }
            Event::MessageSent(m) if m.kind == super::journal::MessageType::Flag => {
                self.cross_agent_flags_sent += 1
            }
            _ => {}
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
        for e in entries.iter().filter(|e| e.ts >= since && e.ts <= now) {
            match &e.event {
                Event::SessionEnd(end) => {
                    ended.insert(end.session_id.clone());
                    r.sources_archived += end.sources_archived.unwrap_or(0);
                }
                Event::Timeout(f) | Event::Error(f) => {
                    ended.insert(f.session_id.clone());
                    failed.insert(f.session_id.clone());
                }
                Event::Record(rec) => {
                    r.claims_proposed += rec.claims_proposed;
                    accepted += rec.claims_accepted;
                }
                _ => {}
            }
        }
        r.sessions = ended.len() as u64;
        r.acceptance_rate = ratio(accepted, r.claims_proposed);
        r.avg_sources_per_session = ratio(r.sources_archived, r.sessions);
        r.error_rate = ratio(failed.len() as u64, r.sessions);
        r
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
/// without the marker (written before it existed) only gets the marker.
pub fn catch_up(
    dir: &AgentDir,
    lock: &AgentLock,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Result<bool> {
    let mut last = None;
    journal::scan_backwards(&dir.journal(), |e| {
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
        Some(_) => {
            apply(dir, lock, &entry.event, now, notes)?;
            notes.push(format!(
                "metrics.json had not counted the end of session {id} (a crash); counted now"
            ));
            Ok(true)
        }
        None => {
            metrics.counted_session = Some(id);
            dir.save(lock, &metrics)?;
            Ok(false)
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
        Event::SessionEnd(_) | Event::Error(_) | Event::Timeout(_) | Event::Record(_)
    );
    if metrics.lifetime == before && !window_changes && origin == super::Origin::File {
        // Most events (a plain session start) change no counter: skip the write.
        return Ok((metrics, None));
    }
    if window_changes {
        let recent = journal::read_since(&dir.journal(), now.minus(ROLLING_WINDOW))?;
        let fresh = Rolling::from_journal(&recent, now);
        metrics.rolling_30d = Rolling {
            extra: std::mem::take(&mut metrics.rolling_30d.extra),
            ..fresh
        };
    }
    metrics.updated_at = Some(now);
    let staged = dir.stage(lock, &metrics)?;
    Ok((metrics, Some(staged)))
}
